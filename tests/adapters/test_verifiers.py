"""A verifiers classic environment run as a vf_mm one (``VerifiersEnv``): its own rollout
through a recording client, so every call is an exact, bridged model turn; its own
rubric; and the faults a user would make failing only the rollout they are in.

The verifiers tier (``python3 dev.py verifiers``): verifiers is imported by the fixtures
(``conftest.py``), never at collection, so the default tier deselects these quietly.
"""

from __future__ import annotations

import asyncio
import itertools

import numpy as np
import pytest

import vf_mm
from vf_mm.adapters import VerifiersEnv, adapt_verifiers, is_verifiers_environment
from vf_mm.errors import UnsupportedEnvironmentError
from vf_mm.images import ImagePolicy
from vf_mm.renderers import load_renderer
from vf_mm.testing import ScriptedBackend, build_tiny_vlm

pytestmark = pytest.mark.verifiers


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("verifiers")
    return {f: build_tiny_vlm(root / f, f) for f in ("qwen2_5_vl", "qwen3_vl")}


@pytest.fixture
def renderer(checkpoints):
    return load_renderer(checkpoints["qwen2_5_vl"], image_policy=ImagePolicy.dataset(roots=()))


def evaluate(env, renderer, replies, **options):
    """``env`` evaluated with a scripted model: (outputs by example, then rollout index;
    client). Groups finish in any order; a group's rollouts come in index order."""
    backend = ScriptedBackend(renderer, replies)
    client = vf_mm.RendererClient(backend, renderer)
    options.setdefault("sampling_args", {"max_tokens": 64})
    outputs = asyncio.run(env.evaluate(client, **options))
    return sorted(outputs, key=lambda o: o.example_id), client


def tokens_of(step):
    t = step.tokens
    mm = t.multi_modal_data
    return (t.prompt_ids, t.completion_ids, t.completion_logprobs, mm.mm_hashes,
            mm.mm_placeholders)  # fmt: skip


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_a_verifiers_tool_env_returning_images_gives_the_tokens_of_its_native_twin(
    dots_env, checkpoints, family, vf
):
    renderer = load_renderer(checkpoints[family], image_policy=ImagePolicy.dataset(roots=()))
    wrapped = VerifiersEnv(dots_env.load_environment())
    # Qwen3-VL's template shows the tools: the twin shows the schema verifiers sends
    chat = vf.OpenAIChatCompletionsClient(None)
    schema = [asyncio.run(chat.to_native_tool(t)) for t in wrapped.verifiers_env.tool_defs]
    native = dots_env.native_twin(tools=schema)

    ours, our_client = evaluate(wrapped, renderer, dots_env.policy, rollouts_per_example=2)
    theirs, their_client = evaluate(native, renderer, dots_env.policy, rollouts_per_example=2)

    assert len(ours) == len(theirs) == 6
    for a, b in zip(ours, theirs, strict=True):
        assert a.error is None and b.error is None
        assert a.example_id == b.example_id and a.reward == b.reward
        assert len(a.trajectory) == len(b.trajectory) == 3  # draw, draw, answer
        for x, y in zip(a.trajectory, b.trajectory, strict=True):
            assert tokens_of(x) == tokens_of(y)
            images = zip(x.tokens.multi_modal_data.mm_items["image"],
                         y.tokens.multi_modal_data.mm_items["image"], strict=True)  # fmt: skip
            for p, q in images:
                assert p.keys() == q.keys()
                assert all(np.array_equal(np.asarray(p[k]), np.asarray(q[k])) for k in p)
    # the last step shows the row's picture and the two drawn ones
    assert [len(s.tokens.multi_modal_data.mm_hashes["image"]) for s in ours[0].trajectory] == [
        1,
        2,
        3,
    ]
    assert our_client.stats.bridges == their_client.stats.bridges == 12  # 2 per rollout


def test_each_call_is_a_recorded_turn_bridged_onto_the_last_and_exact(dots_env, renderer):
    (first, *_), client = evaluate(
        VerifiersEnv(dots_env.load_environment(counts=(2,))), renderer, dots_env.policy
    )
    steps = first.trajectory
    assert len(steps) == 3 and client.stats.renders == 1 and client.stats.bridges == 2
    for before, after in itertools.pairwise(steps):
        previous = [*before.tokens.prompt_ids, *before.tokens.completion_ids]
        assert after.tokens.prompt_ids[: len(previous)] == previous
    full = renderer.render(steps[-1].prompt)
    assert steps[-1].tokens.prompt_ids == full.token_ids
    assert steps[-1].tokens.multi_modal_data.mm_hashes == full.multi_modal_data.mm_hashes
    assert all(len(s.tokens.completion_logprobs) == len(s.tokens.completion_ids) for s in steps)


def test_the_rows_and_the_outputs_are_the_environments_own(dots_env, renderer):
    env = VerifiersEnv(dots_env.load_environment())
    rows = env.get_eval_dataset()
    assert [r["example_id"] for r in rows] == [0, 1, 2]
    assert [r["answer"] for r in rows] == ["2", "3", "4"]
    prompt = env.format_prompt(rows[0])
    # Arrow gives each content part every part's keys, as nulls: dropped (a template
    # would read a text part holding "image_url": null as an image)
    assert [sorted(p) for p in prompt[1]["content"]] == [["image_url", "type"], ["text", "type"]]

    outputs, _ = evaluate(env, renderer, dots_env.policy)
    out = outputs[0]
    assert out.prompt == prompt
    assert [m["role"] for m in out.completion] == ["assistant", "tool", "assistant", "tool",
                                                   "assistant"]  # fmt: skip
    tool = out.completion[1]
    assert tool["tool_call_id"] == out.completion[0]["tool_calls"][0]["id"]
    assert [p["type"] for p in tool["content"]] == ["image_url", "text"]
    assert [o.answer for o in outputs] == ["2", "3", "4"]


def test_check_environment_runs_it_offline(dots_env):
    env = VerifiersEnv(dots_env.load_environment())
    report = vf_mm.check_environment(env, num_examples=1, replies=dots_env.policy)
    assert report["tool_calls"] == {"draw": 4} and report["tool_errors"] == {}
    assert report["images_per_turn"] == [[1, 1, 1], [1, 1, 1]]  # one new picture per turn
    assert report["rewards"] == [1.0, 1.0]


def test_its_rubric_scores_with_its_metrics(dots_env, renderer):
    outputs, _ = evaluate(VerifiersEnv(dots_env.load_environment()), renderer, dots_env.policy)
    assert [o.reward for o in outputs] == [1.0, 0.0, 0.0]  # the policy always answers 2
    assert outputs[0].metrics == {
        "correct": 1.0, "num_turns": 3.0, "total_tool_calls": 2.0, "draw_calls": 2.0,
    }  # fmt: skip


def test_group_reward_functions_see_the_group(vf, dots_env, renderer):
    seen = []

    def first_of_group(completions) -> list[float]:
        seen.append(len(completions))
        return [1.0] + [0.0] * (len(completions) - 1)

    env = dots_env.load_environment(counts=(2,))
    env.rubric.rubrics[0].add_reward_func(first_of_group)
    outputs, _ = evaluate(VerifiersEnv(env), renderer, dots_env.policy, rollouts_per_example=3)
    assert seen == [3]
    assert sorted(o.metrics["first_of_group"] for o in outputs) == [0.0, 0.0, 1.0]


def test_the_sampling_args_are_the_environments_defaults_and_every_call_asks_for_logprobs(
    dots_env, renderer
):
    sampling_args = {
        "temperature": 0.5,
        "max_completion_tokens": 40,
        "extra_body": {"top_k": 5, "skip_special_tokens": False},
    }
    env = VerifiersEnv(dots_env.load_environment(counts=(2,), sampling_args=sampling_args))
    assert env.sampling_args == {"temperature": 0.5, "max_tokens": 40, "top_k": 5}
    backend = ScriptedBackend(renderer, dots_env.policy)
    client = vf_mm.RendererClient(backend, renderer)
    asyncio.run(env.evaluate(client, sampling_args={"max_tokens": 30}, seed=7))
    sent = [r.sampling for r in backend.requests]
    assert len(sent) == 3
    assert {(s.max_tokens, s.temperature, s.top_k, s.logprobs) for s in sent} == {
        (30, 0.5, 5, True)  # -S wins over the environment's max_tokens
    }
    assert len({s.seed for s in sent}) == 1 and sent[0].seed is not None


def test_a_rollout_that_raises_fails_alone_and_the_run_goes_on(vf, dots_env, renderer):
    class Flaky(vf.MultiTurnEnv):
        async def env_response(self, messages, state, **kwargs):
            if state["answer"] == "3":
                raise RuntimeError("the board fell over")
            return [{"role": "user", "content": "And again?"}]

    env = Flaky(dataset=dots_env.load_environment().dataset,
                rubric=vf.Rubric(funcs=[dots_env.correct]), max_turns=2)  # fmt: skip
    outputs, _ = evaluate(VerifiersEnv(env, env_id="flaky"), renderer, ["<answer>2</answer>"])
    failed = [o for o in outputs if o.error is not None]
    assert [o.example_id for o in failed] == [1]
    error = failed[0].error
    assert error.type == "RuntimeError" and error.message == "the board fell over"
    assert error.where.startswith("flaky: the verifiers rollout, after model turn 1")
    assert "test_verifiers.py" in error.where  # the line of the environment's code
    assert failed[0].reward is None and len(failed[0].trajectory) == 1  # what it recorded
    assert [o.reward for o in outputs if o.error is None] == [1.0, 0.0]


def test_a_rollout_past_its_time_limit_fails_with_a_timeout(vf, dots_env, renderer):
    class Stuck(vf.MultiTurnEnv):
        async def env_response(self, messages, state, **kwargs):
            await asyncio.Event().wait()  # never set: only the limit ends it

    env = Stuck(dataset=dots_env.load_environment(counts=(2,)).dataset, max_turns=2)
    outputs, _ = evaluate(VerifiersEnv(env, timeout_s=0.5), renderer, ["<answer>2</answer>"])
    (out,) = outputs
    assert str(out.error).startswith("TimeoutError: the rollout took longer than 0.5 s")
    assert len(out.trajectory) == 1 and out.reward is None


def test_a_rollout_verifiers_ended_with_an_error_is_failed_not_scored(dots_env, renderer):
    outputs, _ = evaluate(VerifiersEnv(dots_env.load_environment(counts=(2,))), renderer, [""])
    (out,) = outputs
    assert out.reward is None and out.metrics == {}
    assert out.error.type == "EmptyModelResponseError"  # verifiers' own check of the reply
    assert "after model turn 1" in out.error.where


def test_a_reward_function_that_raises_fails_only_the_rollout_it_raised_for(vf, dots_env, renderer):
    def brittle(answer) -> float:
        return 1.0 / (int(answer) - 3)  # row "3" divides by zero

    env = dots_env.load_environment()
    env.rubric.rubrics[0].add_reward_func(brittle)
    outputs, _ = evaluate(VerifiersEnv(env), renderer, dots_env.policy, rollouts_per_example=2)
    failed = {(o.example_id, str(o.error)) for o in outputs if o.error is not None}
    assert len(failed) == 1
    ((example_id, error),) = failed
    assert example_id == 1
    assert error.startswith(
        "ZeroDivisionError: float division by zero (reward function 'brittle', at "
    )
    # verifiers alone would have logged it and scored 0.0; the others are scored as usual
    scored = [o for o in outputs if o.error is None]
    assert len(scored) == 4 and all(o.metrics["brittle"] in (-1.0, 1.0) for o in scored)
    assert all(o.reward is None for o in outputs if o.error is not None)


def test_a_group_reward_function_that_raises_fails_its_group(vf, dots_env, renderer):
    def ranked(completions, answers) -> list[float]:
        if answers[0] == "4":
            raise ValueError("cannot rank")
        return [0.0] * len(completions)

    env = dots_env.load_environment()
    env.rubric.rubrics[0].add_reward_func(ranked)
    outputs, _ = evaluate(VerifiersEnv(env), renderer, dots_env.policy, rollouts_per_example=2)
    failed = sorted(o.example_id for o in outputs if o.error is not None)
    assert failed == [2, 2]
    assert {o.error.where.split(",")[0] for o in outputs if o.error} == {"reward function 'ranked'"}


def test_an_env_asking_for_the_completions_api_is_refused_when_wrapped(vf, dots_env):
    with pytest.warns(DeprecationWarning):
        env = vf.SingleTurnEnv(
            dataset=dots_env.load_environment().dataset, message_type="completion"
        )
    with pytest.raises(UnsupportedEnvironmentError, match=r"message_type='completion'.*chat"):
        VerifiersEnv(env)


def test_a_call_to_the_completions_route_fails_its_rollout_naming_the_route(vf, dots_env, renderer):
    class Legacy(vf.SingleTurnEnv):
        async def get_model_response(self, state, prompt, **kwargs):
            oai = state["client"].client  # the AsyncOpenAI verifiers was handed
            return await oai.completions.create(model=state["model"], prompt="2 + 2 =")

    env = Legacy(dataset=dots_env.load_environment().dataset)
    outputs, _ = evaluate(VerifiersEnv(env), renderer, ["4"])
    assert len(outputs) == 3
    for out in outputs:
        assert out.error.type == "UnsupportedEnvironmentError"
        assert out.error.message == (
            "the environment called POST /v1/completions: vf_mm records chat completions "
            "only (POST /v1/chat/completions)"
        )


def test_only_classic_verifiers_environments_are_wrapped(vf):
    assert adapt_verifiers({"not": "verifiers"}, "x") is None
    assert not is_verifiers_environment(vf_mm.ToolEnv(tools=[], dataset=[{"question": "q"}]))
    parser = vf.XMLParser(["answer"])
    assert is_verifiers_environment(parser)
    with pytest.raises(UnsupportedEnvironmentError, match="not a classic verifiers environment"):
        adapt_verifiers(parser, "x")
