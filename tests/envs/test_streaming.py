"""Runs of any length: ``Environment.evaluate`` pulls rows as rollout slots free up, holds
only what is in flight, keeps outputs only when asked; datasets may be lazy, streamed or
generated, and nothing needs their length."""

from __future__ import annotations

import asyncio

import pytest

import vf_mm as vf
from tests.envs.conftest import picture
from vf_mm.testing import ScriptedBackend


def client(renderer, replies=("yes",)):
    return vf.RendererClient(ScriptedBackend(renderer, list(replies)), renderer)


def row(i):
    return {"question": f"q{i}", "answer": "yes", "image": picture(i)}


def test_rows_are_pulled_as_slots_free_up_never_all_up_front(renderer):
    pulled: list[int] = []
    finished = [0]
    ahead: list[int] = []  # rows read and not yet finished, seen at each rollout's start

    def generate():
        for i in range(20):
            pulled.append(i)
            yield row(i)

    class Watched(vf.SingleTurnEnv):
        async def rollout(self, client, row, **kwargs):
            ahead.append(len(pulled) - finished[0])
            try:
                return await super().rollout(client, row, **kwargs)
            finally:
                finished[0] += 1

    env = Watched(dataset=[row(0)])
    asyncio.run(env.evaluate(client(renderer), rows=generate(), concurrency=3))
    assert len(pulled) == 20 and max(ahead) <= 3  # never more rows read than slots


def test_outputs_are_kept_only_when_the_caller_asks_for_them(renderer):
    env = vf.SingleTurnEnv(dataset=[row(i) for i in range(3)])
    handed = []
    kept = asyncio.run(env.evaluate(client(renderer), on_result=lambda o, i: handed.append(o)))
    assert kept == [] and len(handed) == 3  # on_result saw them: nothing kept
    both = asyncio.run(
        env.evaluate(client(renderer), on_result=lambda o, i: None, keep_outputs=True)
    )
    assert len(both) == 3
    assert len(asyncio.run(env.evaluate(client(renderer)))) == 3  # no on_result: returned
    assert asyncio.run(env.evaluate(client(renderer), keep_outputs=False)) == []


def test_a_group_is_scored_together_when_rollouts_outnumber_the_slots(renderer):
    sizes = []

    def group_size(prompt, completion, answer, state):
        return 1.0

    class Grouped(vf.SingleTurnEnv):
        async def score(self, states):
            sizes.append(len(states))
            return await super().score(states)

    env = Grouped(dataset=[row(i) for i in range(3)], rubric=vf.Rubric([group_size]))
    outs = asyncio.run(env.evaluate(client(renderer), rollouts_per_example=4, concurrency=2))
    assert sizes == [4, 4, 4] and len(outs) == 12


def test_a_failure_outside_any_rollout_stops_the_run_and_raises_it(renderer):
    env = vf.SingleTurnEnv(dataset=[row(i) for i in range(6)])

    def broken(output, index):
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        asyncio.run(env.evaluate(client(renderer), on_result=broken, concurrency=2))


def test_example_ids_go_in_step_with_streamed_rows(renderer):
    env = vf.SingleTurnEnv(dataset=[row(0)])
    outs = asyncio.run(
        env.evaluate(client(renderer), rows=(row(i) for i in range(3)), example_ids=iter("abc"))
    )
    assert sorted(o.example_id for o in outs) == ["a", "b", "c"]
    with pytest.raises(ValueError, match="fewer example_ids than rows"):
        asyncio.run(env.evaluate(client(renderer), rows=(row(i) for i in range(3)),
                                 example_ids=iter("ab")))  # fmt: skip


def test_a_dataset_may_be_lazy_streamed_or_a_generator_function(renderer):
    built: list[int] = []

    def make(i):
        built.append(i)
        return row(i)

    lazy = vf.LazyRows(1_000_000, make)
    env = vf.SingleTurnEnv(dataset=lazy)
    assert built == [] and len(lazy) == 1_000_000  # a million examples cost nothing
    assert env.eval_dataset_size(2) == 2
    outs = asyncio.run(env.evaluate(client(renderer), num_examples=2))
    assert sorted(built) == [0, 1] and len(outs) == 2

    def rows():
        for i in range(3):
            yield row(i)

    streamed = vf.SingleTurnEnv(dataset=rows)  # a generator function: called for each pass
    assert streamed.eval_dataset_size() is None  # unknown until read
    for _ in range(2):
        assert len(asyncio.run(streamed.evaluate(client(renderer)))) == 3
    assert [r["question"] for r in streamed.iter_eval_dataset(2)] == ["q0", "q1"]
    with pytest.raises(ValueError, match="shuffle it at the source"):
        streamed.get_eval_dataset(seed=1)


def test_a_hugging_face_iterable_dataset_streams(renderer):
    datasets = pytest.importorskip("datasets")

    source = datasets.Dataset.from_list([{"question": f"q{i}", "answer": "yes"} for i in range(4)])
    env = vf.SingleTurnEnv(dataset=source.to_iterable_dataset())
    assert env.eval_dataset_size() is None
    outs = asyncio.run(env.evaluate(client(renderer), num_examples=3))
    assert sorted(o.example_id for o in outs) == [0, 1, 2]


def test_a_streamed_row_that_is_not_a_dict_is_refused_where_it_is_read():
    env = vf.SingleTurnEnv(dataset=lambda: iter([{"question": "q"}, "oops"]))
    with pytest.raises(TypeError, match="row 1 is a str, not a row dict"):
        env.get_eval_dataset()


def test_lazy_rows_read_like_a_list():
    rows = vf.LazyRows(5, lambda i: {"question": f"q{i}"})
    assert rows[-1] == {"question": "q4"} and [r["question"] for r in rows[1:3]] == ["q1", "q2"]
    with pytest.raises(IndexError):
        rows[5]
    with pytest.raises(TypeError, match="not a row dict"):
        vf.LazyRows(1, lambda i: "q")[0]
    with pytest.raises(ValueError, match="length >= 0"):
        vf.LazyRows(-1, lambda i: {})


def test_the_size_of_a_shard_is_counted_without_reading_rows():
    built: list[int] = []

    def make(i):
        built.append(i)
        return {"question": "q"}

    env = vf.SingleTurnEnv(dataset=vf.LazyRows(10, make))
    assert env.eval_dataset_size(holds=lambda example_id: example_id % 2 == 0) == 5
    assert built == [0]  # the first row only: does it name its own id?
    named = vf.SingleTurnEnv(dataset=[{"question": "q", "example_id": f"e{i}"} for i in range(4)])
    assert named.eval_dataset_size(holds=lambda example_id: example_id in ("e1", "e2")) == 2
