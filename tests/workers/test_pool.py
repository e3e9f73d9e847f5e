"""``WorkerPool``: an environment's groups run in worker processes, and every
(example, rollout) comes back to the parent exactly once: equal to an in-process run,
through a worker killed mid-run, a group that kills every worker that runs it, a result
that does not pickle, and a worker that cannot start."""

from __future__ import annotations

import asyncio
import functools
from pathlib import Path

import pytest

import vf_mm as vf
from tests.workers import _clients
from vf_mm.errors import WorkerStartError
from vf_mm.testing import build_tiny_vlm
from vf_mm.workers import WorkerPool, WorkerSpec

ENV = str(Path(__file__).with_name("_env.py"))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> str:
    return str(build_tiny_vlm(tmp_path_factory.mktemp("workers") / "qwen", "qwen2_5_vl"))


def run(spec: WorkerSpec, workers: int, *, env_args=None, r: int = 2, skip=None):
    """The pool's results as {(example_id, index): output}, a list of every hand-over
    (to see repeats), and the pool (for its counts)."""
    env = vf.load_environment(ENV, **(env_args or {}))
    rows = env.get_eval_dataset()
    handed: list[tuple] = []

    async def main():
        async with WorkerPool(spec, workers, threads=1) as pool:
            await pool.evaluate(
                env, rows=rows, rollouts_per_example=r, concurrency=4, seed=3, skip=skip,
                on_result=lambda output, index: handed.append((output.example_id, index, output)),
            )  # fmt: skip
            return pool

    pool = asyncio.run(main())
    return {(e, i): o for e, i, o in handed}, handed, pool


def spec(checkpoint, *, env_args=None, **options) -> WorkerSpec:
    return WorkerSpec(ENV, functools.partial(_clients.scripted, checkpoint, **options),
                      env_args=env_args or {})  # fmt: skip


#: one pool run that three tests read: example 2's result does not pickle, and the
#: rollouts of SKIP are left out (each claim in its own test, one worker start for all)
UNPICKLABLE = {"unpicklable": (2,)}
SKIP = {(0, 0), (7, 0), (7, 1)}


@pytest.fixture(scope="module")
def shared_run(checkpoint):
    return run(spec(checkpoint, env_args=UNPICKLABLE), 2, env_args=UNPICKLABLE, skip=SKIP)


def test_two_workers_give_what_one_process_gives(checkpoint, shared_run):
    results, handed, pool = shared_run
    assert len(handed) == len(results) == 16 - len(SKIP)  # 8 examples x 2, each once
    env = vf.load_environment(ENV)
    local = asyncio.run(env.evaluate(_clients.scripted(checkpoint), rollouts_per_example=2, seed=3))
    assert len(local) == 16
    compared = 0
    for output in local:
        if output.example_id == 2:  # the one that does not pickle (the next test)
            continue
        index = next((i for i in range(2) if (output.example_id, i) in results), None)
        if index is None:
            continue  # both of its rollouts skipped
        theirs = results[(output.example_id, index)]
        assert theirs.error is None and theirs.reward == output.reward == 1.0
        assert theirs.completion == output.completion
        # the tokens, and the images' model inputs, came through the pipe whole
        mine_steps, their_steps = output.trajectory, theirs.trajectory
        assert [s.tokens.prompt_ids for s in their_steps] == [
            s.tokens.prompt_ids for s in mine_steps
        ]
        a = their_steps[-1].tokens.multi_modal_data.mm_items["image"][-1]
        b = mine_steps[-1].tokens.multi_modal_data.mm_items["image"][-1]
        assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)
        compared += 1
    assert compared == 12  # 8 examples x 2, less example 2's two, (7, *) and one of (0, *)
    # summed over the workers: 13 rollouts of two turns, one bridge each (the unpicklable
    # group's rollouts ran too; their result could not be sent)
    assert pool.stats.turns == 26 and pool.stats.bridges == 13


def test_a_worker_killed_mid_run_loses_nothing_and_repeats_nothing(checkpoint, tmp_path):
    marker = tmp_path / "died"
    results, handed, pool = run(spec(checkpoint, die_once_on="3", marker=str(marker)), 2)
    assert marker.exists()  # a worker did die, on example 3
    # its group ran again elsewhere (the slot's new worker may still be starting when the
    # run ends: the other worker can take every group that is left)
    assert pool.lost_groups >= 1 and pool.restarts <= 1
    assert len(handed) == len(results) == 16
    assert all(o.error is None and o.reward == 1.0 for o in results.values())


def test_a_group_that_kills_every_worker_fails_alone(checkpoint):
    results, handed, pool = run(spec(checkpoint, always_die_on="5"), 2)
    assert len(handed) == len(results) == 16
    failed = {k: o for k, o in results.items() if o.error is not None}
    assert set(failed) == {(5, 0), (5, 1)}
    for output in failed.values():
        assert output.error.type == "WorkerLostError"
        assert "two workers died running this group" in output.error.message
        assert output.answer == "yes" and output.reward is None
    assert pool.lost_groups == 2  # it ran on two workers, and on no third


def test_a_result_that_does_not_pickle_fails_its_group_with_the_reason(shared_run):
    results, _, _ = shared_run
    failed = {k: o for k, o in results.items() if o.error is not None}
    assert set(failed) == {(2, 0), (2, 1)}
    assert "sending the group to the parent" in failed[(2, 0)].error.where
    assert "generator" in failed[(2, 0)].error.message


def test_skipped_rollouts_are_not_run(shared_run):
    results, handed, _ = shared_run
    assert not SKIP & set(results) and len(handed) == 16 - len(SKIP)
    assert {(e, i) for e in range(8) for i in range(2)} - SKIP == set(results)


def test_a_worker_that_cannot_start_stops_the_run_with_its_own_error(checkpoint):
    with pytest.raises(WorkerStartError, match="this worker's client cannot be built"):
        run(spec(checkpoint, fail_start=True), 2)


def test_workers_that_would_process_images_differently_do_not_start(checkpoint, tmp_path):
    """Every group of a run is described by worker 0's image processing: a worker whose
    renderer processes otherwise (here another max_pixels) stops the run at the start."""
    with pytest.raises(WorkerStartError, match="worker 1 differs from worker 0: its image"):
        run(spec(checkpoint, vary_after=str(tmp_path / "first")), 2)


def test_bad_pool_arguments_are_refused_at_once(checkpoint):
    with pytest.raises(ValueError, match="workers must be >= 1"):
        WorkerPool(spec(checkpoint), 0)
    with pytest.raises(ValueError, match="transport must be one of"):
        WorkerPool(spec(checkpoint), 1, transport="threads")


def test_when_no_worker_is_left_the_rest_fail_and_the_run_ends(checkpoint):
    env = vf.load_environment(ENV, num_examples=4)
    handed = []

    async def main():
        pool = WorkerPool(spec(checkpoint, always_die_on="0"), 1, threads=1, max_restarts=0)
        async with pool:
            await pool.evaluate(env, rows=env.get_eval_dataset(), rollouts_per_example=1,
                                on_result=lambda o, i: handed.append(o))  # fmt: skip

    asyncio.run(main())
    assert len(handed) == 4 and all(o.error is not None for o in handed)
    assert {o.error.type for o in handed} == {"WorkerLostError"}
    assert any("no worker is left" in o.error.message for o in handed)


PARENT = """
import asyncio, functools, sys, time
from tests.workers import _clients
from vf_mm.workers import WorkerPool, WorkerSpec

async def main():
    spec = WorkerSpec(sys.argv[1], functools.partial(_clients.scripted, sys.argv[2]))
    async with WorkerPool(spec, 2, threads=1) as pool:
        print(" ".join(str(w.pid) for w in pool.workers), flush=True)
        await asyncio.sleep(3600)

asyncio.run(main())
"""


def test_workers_end_when_their_parent_is_killed(checkpoint):
    """kill -9 of the run's process (no cleanup runs there) ends its workers: each sees
    its pipe close and exits, so no worker outlives its run; nor does the forkserver
    they were forked from."""
    import os
    import signal
    import subprocess
    import sys
    import time

    root = Path(__file__).resolve().parents[2]
    parent = subprocess.Popen([sys.executable, "-c", PARENT, ENV, checkpoint], cwd=root,
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    pids = [int(p) for p in parent.stdout.readline().split()]
    assert len(pids) == 2, "the parent did not start its workers"
    with open(f"/proc/{pids[0]}/stat") as stat:  # the worker's parent: the forkserver
        server = int(stat.read().split(")")[-1].split()[1])
    assert server != parent.pid, "the worker was not forked from the forkserver"
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()

    def alive(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        # a zombie (exited, not yet reaped by init) is not running
        try:
            with open(f"/proc/{pid}/stat") as stat:
                return stat.read().split(")")[-1].split()[0] != "Z"
        except FileNotFoundError:  # gone between the two looks
            return False

    deadline = time.monotonic() + 120  # a generous bound on the wait, not a timing claim
    while any(alive(pid) for pid in [*pids, server]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(pid) for pid in pids), "a worker outlived its killed parent"
    assert not alive(server), "the forkserver outlived the run that started it"


def test_rows_are_read_as_workers_free_up_not_queued_up_front(checkpoint):
    env = vf.load_environment(ENV)
    source = env.get_eval_dataset()
    pulled: list[int] = []
    delivered: list[int] = []
    ahead: list[int] = []  # groups read and not yet handed back, at each hand-over

    def rows():  # a generator: the pool never needs its length
        for i, row in enumerate(source):
            pulled.append(i)
            yield row

    def handed(output, index):
        ahead.append(len(pulled) - len(delivered))
        if index == 1:
            delivered.append(output.example_id)

    async def main():
        async with WorkerPool(spec(checkpoint), 1, threads=1) as pool:
            await pool.evaluate(env, rows=rows(), rollouts_per_example=2, concurrency=2,
                                on_result=handed)  # fmt: skip

    asyncio.run(main())
    assert len(pulled) == 8 and sorted(delivered) == list(range(8))
    assert max(ahead) <= 1  # one driver (2 rollouts of 1 worker): one group at a time


def test_a_worker_stores_its_groups_images_as_the_parent_would(checkpoint, tmp_path):
    """``GroupTask.assets_dir``: the worker stores its rollouts' images in the run's
    assets itself and sends back messages naming them; the rows the parent then writes
    equal those written from the outputs as they were, with the same files, and the
    parent encodes none. (In-process: a ``GroupRunner`` is what a worker process runs.)"""
    import json

    from vf_mm.results import ResultsWriter
    from vf_mm.workers._task import GroupTask
    from vf_mm.workers._worker import GroupRunner

    env = vf.load_environment(ENV)
    row = dict(env.get_eval_dataset()[0])
    runner = GroupRunner(spec(checkpoint))
    rows = {}
    for name in ("parent", "worker"):
        outdir = tmp_path / name
        with ResultsWriter(outdir, metadata={}) as writer:
            task = GroupTask(0, row, 0, (0, 1), 2, None, 3,
                             assets_dir=str(outdir) if name == "worker" else None)  # fmt: skip
            result = asyncio.run(runner.run(task))
            for index, output in sorted(result.outputs, key=lambda pair: pair[0]):
                writer.write(output, rollout_index=index)
            encoded_here = writer.assets.written
        lines = (outdir / "results.jsonl").read_text().splitlines()
        rows[name] = [
            {k: v for k, v in json.loads(line).items() if k != "timing"} for line in lines
        ]
        files = sorted(p.name for p in (outdir / "assets").iterdir())
        rows[name].append(files)
        if name == "worker":
            assert encoded_here == 0
            parts = [p for o in result.outputs for m in o[1].prompt + o[1].completion
                     for p in (m["content"] if isinstance(m["content"], list) else [])]  # fmt: skip
            assert parts and all(not hasattr(p.get("image"), "save") for p in parts)
        else:
            assert encoded_here == len(files) >= 2
    assert rows["worker"] == rows["parent"]
    asyncio.run(runner.close())
