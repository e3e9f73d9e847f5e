"""The rollout loop: turns, stop conditions, env responses with images, tools, and
failures recorded per rollout while the run goes on."""

from __future__ import annotations

import asyncio

import pytest

import vf_mm as vf
from tests.envs.conftest import picture
from vf_mm.errors import BackendUnavailableError
from vf_mm.testing import ScriptedBackend


def rows(n=2):
    return [{"question": f"q{i}", "answer": "yes", "image": picture(i)} for i in range(n)]


def client(renderer, replies):
    return vf.RendererClient(ScriptedBackend(renderer, replies), renderer)


class Echo(vf.MultiTurnEnv):
    """Answers each move with a new picture; stops when the model says 'yes'."""

    async def env_response(self, messages, state):
        state["moves"] = state.get("moves", 0) + 1
        return [{"role": "user", "content": [{"type": "image", "image": picture(100 + state["turn"])},
                                             {"type": "text", "text": "again"}]}]  # fmt: skip

    @vf.stop
    def said_yes(self, state):
        return state["completion"][-1]["content"] == "yes"


def test_single_turn_prompt_and_scoring(renderer):
    env = vf.SingleTurnEnv(dataset=rows(), system_prompt="Be brief.",
                           rubric=vf.Rubric([lambda completion, answer: completion[-1]["content"] == answer]))  # fmt: skip
    outs = asyncio.run(env.evaluate(client(renderer, ["yes"]), rollouts_per_example=2))
    assert len(outs) == 4 and all(o.reward == 1.0 and o.error is None for o in outs)
    prompt = outs[0].prompt
    assert prompt[0] == {"role": "system", "content": "Be brief."}
    assert prompt[1]["content"][0]["type"] == "image" and prompt[1]["content"][1][
        "text"
    ].startswith("q")


def test_multi_turn_images_accumulate_and_later_turns_bridge(renderer):
    env = Echo(dataset=rows(1), max_turns=5)
    c = client(renderer, ["left", "up", "yes"])
    state = asyncio.run(env.rollout(c, rows(1)[0]))
    assert state["error"] is None and state["turn"] == 3 and state["moves"] == 2
    counts = [s.tokens.multi_modal_data.num_items("image") for s in state["trajectory"]]
    assert counts == [1, 2, 3]
    assert c.stats.bridges == 2


def test_max_turns_ends_the_rollout(renderer):
    state = asyncio.run(
        Echo(dataset=rows(1), max_turns=2).rollout(client(renderer, ["no"]), rows(1)[0])
    )
    assert state["turn"] == 2 and state["error"] is None


def test_tool_env_puts_tool_images_in_tool_messages(renderer):
    def crop(x: int, y: int):
        """Crop the picture."""
        return [picture(0).crop((x, y, x + 8, y + 8)), "cropped"]

    env = vf.ToolEnv(dataset=rows(1), tools=[crop], max_turns=4)
    calls = iter(
        ['<tool_call>\n{"name": "crop", "arguments": {"x": 1, "y": 2}}\n</tool_call>', "done"]
    )
    c = client(renderer, lambda request: next(calls))
    state = asyncio.run(env.rollout(c, rows(1)[0]))
    roles = [m["role"] for m in state["completion"]]
    assert roles == ["assistant", "tool", "assistant"] and state["error"] is None
    tool = state["completion"][1]
    assert tool["content"][0]["type"] == "image" and tool["content"][1]["text"] == "cropped"
    assert state["trajectory"][1].tokens.multi_modal_data.num_items("image") == 2


def test_tool_errors_are_told_to_the_model(renderer):
    def boom(x: int):
        """Fails."""
        raise RuntimeError("no such region")

    env = vf.ToolEnv(dataset=rows(1), tools=[boom], max_turns=2)
    calls = iter(['<tool_call>\n{"name": "boom", "arguments": {"x": 1}}\n</tool_call>',
                  '<tool_call>\n{"name": "nope", "arguments": {}}\n</tool_call>'])  # fmt: skip
    state = asyncio.run(env.rollout(client(renderer, lambda r: next(calls)), rows(1)[0]))
    assert "RuntimeError: no such region" in state["completion"][1]["content"]
    assert state["error"] is None


def _one_call(name, arguments="{}"):
    calls = iter(
        [f'<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>', "done"]
    )
    return lambda request: next(calls)


def test_a_tool_returning_content_parts_gives_the_model_those_parts(renderer):
    def look():
        """Look again."""
        return [{"type": "image", "image": picture(5)}, {"type": "text", "text": "a closer look"}]

    env = vf.ToolEnv(dataset=rows(1), tools=[look], max_turns=3)
    state = asyncio.run(env.rollout(client(renderer, _one_call("look")), rows(1)[0]))
    assert state["error"] is None
    tool = state["completion"][1]
    assert [p["type"] for p in tool["content"]] == ["image", "text"]  # parts, not their repr
    assert state["trajectory"][1].tokens.multi_modal_data.num_items("image") == 2


def test_a_tool_returning_what_json_cannot_hold_fails_the_rollout_not_stringified(renderer):
    class Opaque:
        pass

    def weird():
        """Returns an object."""
        return {"value": Opaque()}

    env = vf.ToolEnv(dataset=rows(1), tools=[weird], max_turns=3)
    state = asyncio.run(env.rollout(client(renderer, _one_call("weird")), rows(1)[0]))
    error = state["error"]
    assert error.type == "MessageError"
    assert "tool 'weird' returned, field 'value': " in error.message and "Opaque" in error.message
    assert error.where == "turn 1: ToolEnv.env_response"
    assert "Opaque" not in str(state["completion"][-1].get("content"))  # never sent as text


def test_json_tool_results_are_json_text(renderer):
    import numpy as np

    def stats():
        """Numbers."""
        return {"mean": np.float32(0.5), "n": np.int64(3), "ok": True}  # numpy scalars too

    env = vf.ToolEnv(dataset=rows(1), tools=[stats], max_turns=3)
    state = asyncio.run(env.rollout(client(renderer, _one_call("stats")), rows(1)[0]))
    assert state["completion"][1]["content"] == '{"mean": 0.5, "n": 3, "ok": true}'


def test_a_record_with_a_type_key_is_data_not_a_content_part(renderer):
    def search():
        """Search."""
        return [{"type": "text", "title": "Dots", "id": 3}, {"type": "image", "caption": "x"}]

    env = vf.ToolEnv(dataset=rows(1), tools=[search], max_turns=3)
    state = asyncio.run(env.rollout(client(renderer, _one_call("search")), rows(1)[0]))
    assert state["error"] is None
    assert state["completion"][1]["content"] == (
        '[{"type": "text", "title": "Dots", "id": 3}, {"type": "image", "caption": "x"}]'
    )


def test_setup_and_finish_state_failures_name_their_stage(renderer):
    class BadSetup(vf.MultiTurnEnv):
        def setup_state(self, state):
            raise ValueError("no board")

    class BadFinish(vf.SingleTurnEnv):
        async def finish_state(self, state):
            raise ValueError("no tally")

    first = asyncio.run(BadSetup(dataset=rows(1)).rollout(client(renderer, ["x"]), rows(1)[0]))
    assert first["error"].where.startswith("BadSetup.setup_state, at test_rollouts.py:")
    assert first["trajectory"] == []  # no model turn was spent on a broken rollout
    last = asyncio.run(BadFinish(dataset=rows(1)).rollout(client(renderer, ["x"]), rows(1)[0]))
    assert last["error"].where.startswith("BadFinish.finish_state")
    assert len(last["trajectory"]) == 1  # what it produced is kept


def test_a_corrupt_image_fails_that_rollout_only(renderer):
    data = rows(2)
    data[0]["image"] = b"not an image at all"
    env = vf.SingleTurnEnv(dataset=data, rubric=vf.Rubric([lambda completion: 1.0]))
    outs = asyncio.run(env.evaluate(client(renderer, ["yes"])))
    by_id = {o.example_id: o for o in outs}
    error = by_id[0].error
    assert error.type == "ImageDecodeError" and by_id[0].reward is None
    assert error.where == "turn 1: model"  # images load when the first turn renders
    assert by_id[1].error is None and by_id[1].reward == 1.0


def test_backend_errors_and_env_exceptions_are_recorded(renderer):
    class Down:
        name = "down"
        max_model_len = None

        async def generate(self, request):
            raise BackendUnavailableError("server gone", backend="down")

        async def aclose(self):
            pass

    outs = asyncio.run(
        vf.SingleTurnEnv(dataset=rows(1)).evaluate(vf.RendererClient(Down(), renderer))
    )
    assert (outs[0].error.type, outs[0].error.where) == ("BackendUnavailableError", "turn 1: model")
    assert "server gone" in outs[0].error.message

    class Raises(vf.MultiTurnEnv):
        async def env_response(self, messages, state):
            raise KeyError("oops")

    state = asyncio.run(Raises(dataset=rows(1)).rollout(client(renderer, ["x"]), rows(1)[0]))
    error = state["error"]
    assert (error.type, error.message) == ("KeyError", "'oops'")
    # the stage, then the line of environment code that raised it
    assert error.where.startswith("turn 1: Raises.env_response, at test_rollouts.py:")
    assert str(error).startswith("KeyError: 'oops' (turn 1: Raises.env_response, at ")


def test_timeout_is_recorded(renderer):
    class Slow(vf.MultiTurnEnv):
        async def env_response(self, messages, state):
            await asyncio.sleep(5)
            return []

    state = asyncio.run(
        Slow(dataset=rows(1), timeout_s=0.2).rollout(client(renderer, ["x"]), rows(1)[0])
    )
    error = state["error"]
    assert error.type == "TimeoutError" and "0.2 s" in error.message
    assert error.where == "turn 1: Slow.env_response"  # where it was when time ran out


def test_evaluate_skips_done_pairs_and_reports_each_result(renderer):
    seen = []
    env = vf.SingleTurnEnv(dataset=rows(2), rubric=vf.Rubric([lambda completion: 1.0]))
    asyncio.run(env.evaluate(client(renderer, ["x"]), rollouts_per_example=2, skip={(0, 1), (1, 0)},
                             on_result=lambda out, index: seen.append((out.example_id, index))))  # fmt: skip
    assert sorted(seen) == [(0, 0), (1, 1)]


def test_seeded_evaluation_is_repeatable(renderer):
    from vf_mm.inference import LocalBackend

    env = vf.SingleTurnEnv(dataset=rows(2), sampling_args={"max_tokens": 4})

    async def run():
        backend = LocalBackend(renderer.tokenizer.name_or_path)
        try:
            outs = await env.evaluate(
                vf.RendererClient(backend, renderer), seed=7, rollouts_per_example=2
            )
        finally:
            await backend.aclose()
        return sorted((o.example_id, o.trajectory[0].tokens.completion_ids) for o in outs)

    assert asyncio.run(run()) == asyncio.run(run())


def test_finish_state_sees_the_last_turn_and_state_keeps_the_row(renderer):
    class Counting(vf.MultiTurnEnv):
        async def env_response(self, messages, state):
            return [{"role": "user", "content": "go on"}]

        def finish_state(self, state):
            state["final"] = (
                state["turn"],
                state["completion"][-1]["content"],
                state["row"]["extra"],
            )

    row = {"question": "q", "extra": 42}
    state = asyncio.run(
        Counting(dataset=[row], max_turns=2).rollout(client(renderer, ["a", "b"]), row)
    )
    assert state["final"] == (2, "b", 42)


def test_tools_can_ask_for_the_rollout_state(renderer):
    def where(x: int, state):
        """Report the example."""
        return f"{x} in example {state['example_id']}"

    env = vf.ToolEnv(dataset=rows(1), tools=[where], max_turns=2)
    assert "state" not in env.tools[0]["function"]["parameters"]["properties"]
    call = '<tool_call>\n{"name": "where", "arguments": {"x": 5, "state": "forged"}}\n</tool_call>'
    state = asyncio.run(env.rollout(client(renderer, [call, "done"]), rows(1)[0], example_id=7))
    assert state["completion"][1]["content"] == "5 in example 7"


def _parse_nothing(completion, answer, parser):
    return float(parser.parse_answer(completion) == answer)  # None == None would be a "match"


def test_a_row_without_an_answer_is_never_scored_as_a_match(renderer):
    data = [
        {"question": "q0"},
        {"question": "q1", "answer": None},
        {"question": "q2", "answer": "x"},
    ]
    env = vf.SingleTurnEnv(dataset=data, parser=vf.XMLParser(["answer"]),
                           rubric=vf.Rubric([_parse_nothing], parser=vf.XMLParser(["answer"])))  # fmt: skip
    outs = asyncio.run(env.evaluate(client(renderer, ["no tags at all"])))
    by_id = {o.example_id: o for o in outs}
    for missing in (0, 1):
        assert by_id[missing].reward is None
        error = by_id[missing].error
        assert error.type == "MissingColumnError" and "'answer'" in error.message
        assert "optional_columns" in error.message  # the hint says how to opt out
        assert error.where == "reward function _parse_nothing"
    assert by_id[2].error is None and by_id[2].reward == 0.0  # rows that have one still score


def test_group_reward_functions_are_checked_too(renderer):
    def agree(completions, answers):
        return [1.0 for _ in completions]

    rubric = vf.Rubric()
    rubric.add_group_reward_func(agree)
    env = vf.SingleTurnEnv(dataset=[{"question": "q"}], rubric=rubric)
    (out,) = asyncio.run(env.evaluate(client(renderer, ["hi"])))
    assert out.reward is None and out.error.type == "MissingColumnError"


def test_a_column_declared_optional_reaches_the_reward_function_as_none(renderer):
    seen = []

    def lenient(completion, answer, info):
        seen.append((answer, info))
        return 0.5

    env = vf.SingleTurnEnv(dataset=[{"question": "q"}], rubric=vf.Rubric([lenient]),
                           optional_columns=["answer", "info"])  # fmt: skip
    (out,) = asyncio.run(env.evaluate(client(renderer, ["hi"])))
    assert out.error is None and out.reward == 0.5 and seen == [(None, {})]


def test_functions_that_do_not_ask_for_a_missing_column_are_unaffected(renderer):
    env = vf.SingleTurnEnv(dataset=[{"question": "q"}], rubric=vf.Rubric([lambda completion: 1.0]))
    (out,) = asyncio.run(env.evaluate(client(renderer, ["hi"])))
    assert out.error is None and out.reward == 1.0


def test_optional_columns_names_only_scored_columns():
    import pytest

    with pytest.raises(ValueError, match="optional_columns"):
        vf.SingleTurnEnv(dataset=[{"question": "q"}], optional_columns=["answr"])


def test_a_kwargs_reward_function_is_called_without_the_missing_column(renderer):
    seen = []

    def anything(completion, **kwargs):
        seen.append(sorted(kwargs))
        return 1.0

    env = vf.SingleTurnEnv(dataset=[{"question": "q"}], rubric=vf.Rubric([anything]))
    (out,) = asyncio.run(env.evaluate(client(renderer, ["hi"])))
    assert out.error is None and "answer" not in seen[0] and "info" not in seen[0]


def test_a_reward_function_that_fails_on_one_rollout_fails_that_rollout_only(renderer):
    calls = []

    def flaky(completion):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("reward blew up")
        return 1.0

    env = vf.SingleTurnEnv(dataset=[{"question": "q"}], rubric=vf.Rubric([flaky]))
    outs = asyncio.run(env.evaluate(client(renderer, ["hi"]), rollouts_per_example=2))
    failed = [o for o in outs if o.error]
    scored = [o for o in outs if not o.error]
    assert len(failed) == 1 and len(scored) == 1
    assert failed[0].reward is None
    error = failed[0].error
    assert (error.type, error.message) == ("RuntimeError", "reward blew up")
    assert error.where.startswith("reward function flaky, at test_rollouts.py:")
    assert scored[0].reward == 1.0  # the sibling keeps its own score


@pytest.mark.parametrize(
    ("set_to", "expected"),
    [
        ("the board broke", ("Error", "the board broke")),
        ("ValueError: no cell", ("ValueError", "no cell")),
        (KeyError("cell"), ("KeyError", "'cell'")),
    ],
)
def test_an_error_environment_code_sets_itself_becomes_a_record(renderer, set_to, expected):
    class SelfReporting(vf.SingleTurnEnv):
        def finish_state(self, state):
            state["error"] = set_to  # what an author may write instead of raising

    (out,) = asyncio.run(SelfReporting(dataset=rows(1)).evaluate(client(renderer, ["x"])))
    assert (out.error.type, out.error.message) == expected and out.reward is None


def test_tools_the_model_could_not_call_are_refused_when_the_env_is_made():
    def look(x: int):
        """Look."""

    def other():
        def look(y: int):
            """Another look."""

        return look

    with pytest.raises(ValueError, match="two tools are named 'look'"):
        vf.ToolEnv(dataset=rows(1), tools=[look, other()])
    with pytest.raises(ValueError, match="named '<lambda>', which the model cannot call"):
        vf.ToolEnv(dataset=rows(1), tools=[lambda x: x])
    with pytest.raises(TypeError, match=r"tools\[0\] is a str, not a function"):
        vf.ToolEnv(dataset=rows(1), tools=["look"])


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"dataset": "my_dataset"}, TypeError, r"datasets.load_dataset\('my_dataset'"),
        ({"dataset": {"question": ["a", "b"]}}, TypeError, "Dataset.from_dict"),
        ({"dataset": ["a", "b"]}, TypeError, "not a list holding other values"),
        ({"dataset": [{"question": "q"}], "timeout_s": 0}, ValueError, "timeout_s must be > 0"),
        (
            {"dataset": [{"question": "q"}], "max_turns": None},
            ValueError,
            "max_turns must be an int",
        ),
    ],
)
def test_an_environment_made_wrong_says_what_to_pass(kwargs, error, match):
    with pytest.raises(error, match=match):
        vf.MultiTurnEnv(**kwargs)


def test_a_tool_returning_a_clip_gives_the_model_a_video_and_a_bare_array_says_how(renderer):
    import numpy as np

    from vf_mm.videos import Video

    frames = np.random.default_rng(0).integers(0, 256, (4, 28, 28, 3), dtype=np.uint8)

    def replay():
        """Replay the clip."""
        return [Video(frames, fps=4.0), "slower"]

    env = vf.ToolEnv(dataset=rows(1), tools=[replay], max_turns=3)
    state = asyncio.run(env.rollout(client(renderer, _one_call("replay")), rows(1)[0]))
    assert state["error"] is None
    assert [p["type"] for p in state["completion"][1]["content"]] == ["video", "text"]
    assert state["trajectory"][1].tokens.multi_modal_data.num_items("video") == 1

    def bare():
        """Returns frames as they are."""
        return frames

    env = vf.ToolEnv(dataset=rows(1), tools=[bare], max_turns=3)
    state = asyncio.run(env.rollout(client(renderer, _one_call("bare")), rows(1)[0]))
    assert state["error"].type == "MessageError"
    assert "vf_mm.videos.Video(frames, fps)" in state["error"].message


def test_a_tool_returning_an_array_gives_an_image_and_a_float_array_says_how(renderer):
    """A uint8 (H, W, 3) array is a picture, as in a content part; a float one is refused
    with the content-part path's own fix (never PIL.Image.fromarray, which fails on
    floats), naming the tool; a 2-D array is data or a grey image: the tool must say."""
    import numpy as np

    pixels = np.random.default_rng(3).integers(0, 256, (24, 32, 3), dtype=np.uint8)

    def look():
        """Look closer."""
        return [pixels, "closer"]

    env = vf.ToolEnv(dataset=rows(1), tools=[look], max_turns=3)
    state = asyncio.run(env.rollout(client(renderer, _one_call("look")), rows(1)[0]))
    assert state["error"] is None
    tool = state["completion"][1]
    assert [p["type"] for p in tool["content"]] == ["image", "text"]
    assert np.array_equal(np.asarray(tool["content"][0]["image"]), pixels)
    assert state["trajectory"][1].tokens.multi_modal_data.num_items("image") == 2

    for array, fix in (
        (pixels / 255.0, "(array * 255).round().astype(np.uint8)"),
        (pixels.transpose(2, 0, 1).copy(), "channels first? transpose it to (H, W, C)"),
        (pixels[..., 0], "array[..., None]"),
    ):

        def heatmap(array=array):
            """A heat map."""
            return array

        env = vf.ToolEnv(dataset=rows(1), tools=[heatmap], max_turns=3)
        state = asyncio.run(env.rollout(client(renderer, _one_call("heatmap")), rows(1)[0]))
        assert state["error"].type == "MessageError", state["error"]
        assert "tool 'heatmap' returned" in state["error"].message
        assert fix in state["error"].message and "fromarray" not in state["error"].message


def test_a_tool_returning_text_that_is_not_text_fails_the_rollout(renderer):
    def read():
        """Read a file name."""
        return "caf\udce9.png"

    env = vf.ToolEnv(dataset=rows(1), tools=[read], max_turns=3)
    state = asyncio.run(env.rollout(client(renderer, _one_call("read")), rows(1)[0]))
    assert state["error"].type == "MessageError"
    assert state["error"].message.startswith("tool 'read' returned: the text holds a lone")


def test_a_reply_holding_a_video_pad_fails_that_turn_not_a_later_one(renderer):
    """A Qwen3-VL GRPO run died at step 44 when the policy sampled <|video_pad|>: the
    next turn's render failed with an error naming neither the message nor the cause.
    Now the turn that holds it fails its rollout, naming the token, the turn and why;
    the step is not kept (nothing trains on it) and no later turn runs."""
    backend = ScriptedBackend(renderer, ["left", "I pick <|video_pad|> now", "yes"])
    env = Echo(dataset=rows(1), max_turns=5)
    state = asyncio.run(env.rollout(vf.RendererClient(backend, renderer), rows(1)[0]))
    error = state["error"]
    assert error.type == "ReservedTokenError" and error.where == "turn 2: model"
    assert error.message.startswith("turn 2: the model sampled <|video_pad|> (id ")
    assert "Qwen2.5-VL reserves for images and videos" in error.message
    assert len(state["trajectory"]) == 1 and len(backend.requests) == 2


def test_each_rollout_is_one_session_ended_when_it_ends(renderer):
    """Every model turn of a rollout names the rollout's session (a backend with several
    servers keeps them on one); the session ends with the rollout, failed or not."""

    class Sessions(ScriptedBackend):
        def __init__(self, *args):
            super().__init__(*args)
            self.turns, self.ended = [], []

        async def generate(self, request):
            self.turns.append(request.session_id)
            return await super().generate(request)

        def end_session(self, session_id):
            self.ended.append(session_id)

    def third_says_yes(request):  # every rollout takes three turns
        answered = sum(m["role"] == "assistant" for m in request.messages)
        return "yes" if answered == 2 else "left"

    backend = Sessions(renderer, third_says_yes)
    env = Echo(dataset=rows(2), max_turns=5)
    outs = asyncio.run(env.evaluate(vf.RendererClient(backend, renderer), rollouts_per_example=2))
    assert len(outs) == 4 and all(o.error is None for o in outs)
    sessions = set(backend.turns)
    assert len(sessions) == 4 and None not in sessions  # one per rollout
    assert all(backend.turns.count(s) == 3 for s in sessions)  # every turn of it
    assert sorted(backend.ended) == sorted(sessions)  # each ended once


class Long(Echo):
    """Echo that records whether finish_state ran (it must not after a truncation)."""

    def finish_state(self, state):
        state["finished"] = state["turn"]


def turns_taken(state) -> float:
    return float(state["turn"])


def out_of_context(renderer, overflow_turn: int):
    """Echo rollouts (never 'yes') on a backend whose context ends at ``overflow_turn``'s
    prompt: measured on a run without a limit, so the limit falls between two turns."""
    env = Long(dataset=rows(1), max_turns=6, rubric=vf.Rubric([turns_taken]),
               sampling_args={"max_tokens": 4})  # fmt: skip
    free = ScriptedBackend(renderer, ["left"])
    asyncio.run(env.rollout(vf.RendererClient(free, renderer), rows(1)[0]))
    lengths = [len(r.prompt_ids) for r in free.requests]
    limit = lengths[overflow_turn - 1] + 4 - 1  # that turn's prompt + max_tokens: one too many
    backend = ScriptedBackend(renderer, ["left"], max_model_len=limit)
    return env, vf.RendererClient(backend, renderer)


def test_a_rollout_that_runs_out_of_context_is_scored_on_its_turns_and_marked_truncated(renderer):
    """It once ended with PromptTooLongError, reward None: every turn's work was lost."""
    env, c = out_of_context(renderer, overflow_turn=3)
    (out,) = asyncio.run(env.evaluate(c, rollouts_per_example=1))
    assert out.error is None and out.truncated
    assert out.reward == 2.0  # scored on the two turns it has
    assert len(out.trajectory) == 2
    assert [m["role"] for m in out.completion] == ["assistant", "user", "assistant", "user"]
    state = asyncio.run(env.rollout(c, rows(1)[0]))
    assert state["truncated"] and "finished" not in state  # turn 2 had its env_response


def test_a_rollout_within_its_context_is_not_truncated_and_a_first_prompt_too_long_fails(renderer):
    env, c = out_of_context(renderer, overflow_turn=1)
    (out,) = asyncio.run(env.evaluate(c, rollouts_per_example=1))
    assert out.error.type == "PromptTooLongError" and out.reward is None and not out.truncated
    ok = asyncio.run(env.evaluate(client(renderer, ["left"]), rollouts_per_example=1))
    assert ok[0].error is None and not ok[0].truncated and ok[0].reward == 6.0


def test_a_tool_that_forgets_to_return_fails_the_rollout_unless_it_declares_none(renderer):
    def mark(x: int):
        """Marks x."""
        x += 1  # no return: the model would read "null"

    def note(x: int) -> None:
        """Notes x; says nothing on purpose."""

    env = vf.ToolEnv(dataset=rows(1), tools=[mark], max_turns=3)
    state = asyncio.run(env.rollout(client(renderer, _one_call("mark", '{"x": 1}')), rows(1)[0]))
    assert state["error"].type == "MessageError"
    assert "tool 'mark' returned None (turn 1): a missing return?" in state["error"].message
    env = vf.ToolEnv(dataset=rows(1), tools=[note], max_turns=3)
    state = asyncio.run(env.rollout(client(renderer, _one_call("note", '{"x": 1}')), rows(1)[0]))
    assert state["error"] is None and state["completion"][1]["content"] == "null"


class MakesUpATurn(vf.MultiTurnEnv):
    async def env_response(self, messages, state):
        return [{"role": "user", "content": "hint"}, {"role": "assistant", "content": "yes"}]


def test_an_env_response_speaking_as_the_model_fails_the_rollout_naming_the_turn(renderer):
    env = MakesUpATurn(dataset=rows(1), max_turns=3, env_id="made")
    state = asyncio.run(env.rollout(client(renderer, ["no", "no"]), rows(1)[0]))
    error = state["error"]
    assert error.type == "MessageError"
    assert "made.env_response returned (turn 1), message 1: role 'assistant'" in error.message
