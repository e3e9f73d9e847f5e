"""check_environment: what an environment author runs in their own tests."""

from __future__ import annotations

import random
from typing import Literal

import pytest

import vf_mm as vf
from tests.envs.conftest import picture
from vf_mm.envs._check import example_value, tool_policy
from vf_mm.errors import EnvironmentCheckError
from vf_mm.inference import GenerateRequest


def test_check_environment_passes_a_good_env(tiny):
    env = vf.SingleTurnEnv(
        dataset=[{"question": "hi", "answer": "1"}], rubric=vf.Rubric([lambda: 1.0])
    )
    report = vf.check_environment(env, model_dir=tiny)
    assert report["rows"] == 1 and report["rewards"] == [1.0, 1.0]


def test_check_environment_lists_every_problem(tiny):
    rows = [{"question": "hi", "image": b"garbage"}, {"nothing": 1}]
    env = vf.SingleTurnEnv(dataset=rows, rubric=vf.Rubric([lambda: 1.0]))
    with pytest.raises(EnvironmentCheckError) as info:
        vf.check_environment(env, model_dir=tiny)
    problems = info.value.problems
    assert any("row 1 has neither" in p for p in problems)
    assert any("row 0" in p and "image" in p for p in problems)
    assert any("rollout failed" in p for p in problems)


def test_check_environment_reports_columns_the_rubric_needs_and_rows_lack(tiny):
    def correct(completion, answer):
        return float(completion[-1]["content"] == answer)

    rows = [{"question": "a", "answer": "1"}, {"question": "b"}]
    env = vf.SingleTurnEnv(dataset=rows, rubric=vf.Rubric([correct]))
    with pytest.raises(EnvironmentCheckError) as info:
        vf.check_environment(env, model_dir=tiny)
    assert any(
        "row 1 has no 'answer'" in p and "correct" in p and "optional_columns" in p
        for p in info.value.problems
    )
    optional = vf.SingleTurnEnv(
        dataset=rows,
        rubric=vf.Rubric([lambda completion, answer: 0.0]),
        optional_columns=["answer"],
    )
    assert vf.check_environment(optional, model_dir=tiny)["rows"] == 2


# -- tools ---------------------------------------------------------------------------


def test_every_tool_is_called_with_arguments_its_schema_allows(tiny):
    seen = {}

    def pick(kind: Literal["red", "blue"], count: int, scale: float = 2.0):
        """Pick things."""
        seen["pick"] = (kind, count, scale)
        return f"picked {count} {kind}"

    def crop(state, x: int, y: int, note: str, exact: bool):
        """Crop the row's image."""
        seen["crop"] = (x, y, note, exact, "prompt" in state)
        return [picture(7), "the crop"]

    env = vf.ToolEnv(dataset=[{"question": "q", "answer": "a"}], tools=[pick, crop],
                     rubric=vf.Rubric([lambda completion: 1.0]), max_turns=4)  # fmt: skip
    report = vf.check_environment(env, model_dir=tiny)
    assert seen == {"pick": ("red", 1, 2.0), "crop": (1, 1, "a", True, True)}
    assert report["tool_calls"] == {"pick": 2, "crop": 2}  # two rollouts of one row
    assert report["tool_errors"] == {}
    # turn 1 sees the prompt (no image), turn 3 the crop the tool returned on turn 2
    assert report["images_per_turn"] == [[0, 0, 1], [0, 0, 1]]


def test_the_scripted_calls_speak_the_checkpoints_tool_format(tmp_path):
    """On a Qwen3.5 checkpoint the scripted policy writes XML calls (its format), and
    their arguments reach the tools with their types."""
    seen = {}

    def crop(x: int, note: str, exact: bool):
        """Crop."""
        seen["crop"] = (x, note, exact)
        return "cropped"

    env = vf.ToolEnv(dataset=[{"question": "q", "answer": "a"}], tools=[crop],
                     rubric=vf.Rubric([lambda completion: 1.0]), max_turns=3)  # fmt: skip
    model = vf.testing.build_tiny_vlm(tmp_path / "qwen3_5", "qwen3_5")
    report = vf.check_environment(env, model_dir=model)
    assert seen == {"crop": (1, "a", True)}
    assert report["tool_calls"] == {"crop": 2} and report["tool_errors"] == {}


def test_tool_args_reach_the_tool_and_an_error_answer_is_reported(tiny):
    def zoom(w: int):
        """Zoom."""
        if w < 4:
            raise ValueError(f"w must be >= 4, got {w}")
        return "zoomed"

    env = vf.ToolEnv(dataset=[{"question": "q"}], tools=[zoom],
                     rubric=vf.Rubric([lambda completion: 1.0]))  # fmt: skip
    report = vf.check_environment(env, model_dir=tiny)
    assert "w must be >= 4, got 1" in report["tool_errors"]["zoom"]  # told, not a failure
    report = vf.check_environment(env, model_dir=tiny, tool_args={"zoom": {"w": 8}})
    assert report["tool_errors"] == {} and report["tool_calls"] == {"zoom": 2}
    with pytest.raises(ValueError, match=r"tool_args names \['zoon'\]; the tools are \['zoom'\]"):
        vf.check_environment(env, model_dir=tiny, tool_args={"zoon": {}})
    with pytest.raises(ValueError, match="with replies= it is unused"):
        vf.check_environment(env, model_dir=tiny, tool_args={"zoom": {"w": 8}}, replies=["x"])


def test_a_tool_that_returns_what_a_message_cannot_hold_is_a_problem(tiny):
    def leak():
        """Returns a set."""
        return {1, 2}

    env = vf.ToolEnv(dataset=[{"question": "q"}], tools=[leak],
                     rubric=vf.Rubric([lambda completion: 1.0]))  # fmt: skip
    with pytest.raises(EnvironmentCheckError) as info:
        vf.check_environment(env, model_dir=tiny)
    assert len(info.value.problems) == 2  # one per rollout
    for problem in info.value.problems:
        assert "MessageError: tool 'leak' returned: set is not JSON" in problem
        assert "(turn 1: ToolEnv.env_response)" in problem


# -- multi-turn: env turns, images, determinism ----------------------------------------


class Pictures(vf.MultiTurnEnv):
    """Answers each turn with a new picture; a broken variant returns a bare string."""

    def __init__(self, *, broken=False, **kwargs):
        super().__init__(max_turns=3, **kwargs)
        self.broken = broken

    async def env_response(self, messages, state):
        if self.broken:
            return "look again"
        return [{"role": "user", "content": [{"type": "image", "image": picture(state["turn"])}]}]


def _lengths(completion):
    return float(sum(len(m["content"]) for m in completion if m["role"] == "assistant"))


def test_images_from_environment_turns_are_counted_per_turn(tiny):
    rows = [{"question": "q", "image": picture(1)}]
    env = Pictures(dataset=rows, rubric=vf.Rubric([lambda completion: 1.0]))
    report = vf.check_environment(env, model_dir=tiny)
    assert report["images"] == 1  # the dataset's
    assert report["images_per_turn"] == [[1, 1, 1], [1, 1, 1]]
    assert report["seconds"] > 0


def test_an_env_response_that_is_not_messages_is_a_problem_naming_the_method(tiny):
    env = Pictures(dataset=[{"question": "q"}], rubric=vf.Rubric([lambda completion: 1.0]),
                   broken=True, env_id="pics")  # fmt: skip
    with pytest.raises(EnvironmentCheckError) as info:
        vf.check_environment(env, model_dir=tiny)
    assert len(info.value.problems) == 2  # each rollout's own line
    assert all("pics.env_response returned (turn 1): a str" in p for p in info.value.problems)


def test_scripted_replies_on_a_multi_turn_env_are_not_mistaken_for_randomness(tiny):
    env = Pictures(dataset=[{"question": f"q{i}"} for i in range(3)],
                   rubric=vf.Rubric([_lengths]))  # fmt: skip
    report = vf.check_environment(env, model_dir=tiny, num_examples=3,
                                  replies=["a", "bb", "ccc", "dddd", "eeeee"])  # fmt: skip
    assert len(set(report["rewards"])) > 1  # rollouts got different replies, the same each run


def test_a_non_deterministic_rubric_is_reported(tiny):
    rng = random.Random(0)
    env = vf.SingleTurnEnv(dataset=[{"question": "q"}], rubric=vf.Rubric([lambda: rng.random()]))
    with pytest.raises(EnvironmentCheckError, match="not deterministic"):
        vf.check_environment(env, model_dir=tiny)


def test_a_callable_policy_sees_the_conversation_and_is_not_held_to_determinism(tiny):
    shown = []

    def policy(request: GenerateRequest) -> str:
        shown.append([m["role"] for m in request.messages])
        assert request.prompt_ids  # the tokens too
        return random.choice(["a", "bb"])

    env = Pictures(dataset=[{"question": "q"}], rubric=vf.Rubric([_lengths]))
    vf.check_environment(env, model_dir=tiny, replies=policy)
    assert shown[:3] == [["user"], ["user", "assistant", "user"],
                         ["user", "assistant", "user", "assistant", "user"]]  # fmt: skip


# -- the scripted pieces ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("schema", "value"),
    [
        ({"type": "string", "enum": ["b", "c"]}, "b"),
        ({"type": "integer", "minimum": 5}, 5),
        ({"type": "number", "maximum": 0.5}, 0.5),
        ({"type": ["null", "boolean"]}, True),
        ({"anyOf": [{"type": "integer"}, {"type": "string"}]}, 1),
        ({"type": "array", "items": {"type": "string"}, "minItems": 2}, ["a", "a"]),
        (
            {
                "type": "object",
                "properties": {"p": {"type": "integer"}, "q": {}},
                "required": ["p"],
            },
            {"p": 1},
        ),
        ({"type": "integer", "default": 9}, 9),
        ({}, "a"),
    ],
)
def test_example_values_satisfy_their_schema(schema, value):
    assert example_value(schema) == value


def test_the_tool_policy_calls_each_tool_once_then_answers(renderer):
    from vf_mm.envs import tool_schema

    def a(x: int):
        """A."""

    def b():
        """B."""

    policy = tool_policy([tool_schema(a), tool_schema(b)], answer="done")
    texts = []
    messages = [{"role": "user", "content": "go"}]
    for _ in range(3):
        text = policy(GenerateRequest([1], messages=messages))
        texts.append(text)
        parsed = renderer.parse_response(renderer.tokenizer.encode(text))
        messages = [*messages, parsed.message, {"role": "tool", "content": "ok"}]
    assert [c["function"]["name"] for c in messages[1]["tool_calls"]] == ["a"]
    assert [c["function"]["name"] for c in messages[3]["tool_calls"]] == ["b"]
    assert texts[2] == "done"


def test_an_image_kept_in_info_is_caught_before_eval_fails_to_store_it(tiny):
    rows = [{"question": "q", "answer": "a", "info": {"picture": picture(1)}}]
    env = vf.SingleTurnEnv(dataset=rows, rubric=vf.Rubric([lambda completion: 1.0]))
    with pytest.raises(EnvironmentCheckError) as info:
        vf.check_environment(env, model_dir=tiny)
    assert any(
        p.startswith("row 0: its 'info' column cannot be stored in results.jsonl")
        and "keep a path" in p
        for p in info.value.problems
    )


def test_what_a_tool_schema_leaves_the_model_to_guess_is_a_warning(tiny):
    def crop(state, cell: int, x):
        """Crop.
        Arguments:
            cel: which cell
        """
        return "cropped"

    env = vf.ToolEnv(dataset=[{"question": "q"}], tools=[crop],
                     rubric=vf.Rubric([lambda completion: 1.0]))  # fmt: skip
    assert env.tools[0]["function"]["description"] == "Crop."  # the section is not in it
    report = vf.check_environment(env, model_dir=tiny)  # warnings do not fail the check
    assert report["warnings"] == [
        "tool 'crop': parameter 'cell' is not described under Args:",
        "tool 'crop': parameter 'x' has no type hint",
        "tool 'crop': parameter 'x' is not described under Args:",
        "tool 'crop': Args: describes 'cel', which is not a parameter",
    ]


def test_the_json_check_is_the_results_writers_rule(tiny):
    import numpy as np

    fine = [{"question": "q", "answer": "a", "info": {"score": np.float32(0.5)}}]  # stored
    env = vf.SingleTurnEnv(dataset=fine, rubric=vf.Rubric([lambda completion: 1.0]))
    assert vf.check_environment(env, model_dir=tiny)["rows"] == 1
    bad = [{"question": "q", "answer": "a", "info": {1: "int key"}}]  # the writer refuses
    env = vf.SingleTurnEnv(dataset=bad, rubric=vf.Rubric([lambda completion: 1.0]))
    with pytest.raises(EnvironmentCheckError, match=r"dict key 1 \(int\) is not a str"):
        vf.check_environment(env, model_dir=tiny)


def test_an_args_section_ends_at_the_next_header_and_takes_continuation_lines(tiny):
    def zoom(x: int, scale: float = 2.0):
        """Zoom in.

        Args:
            x: where to zoom,
                in pixels from the left
            scale: how much
        Returns:
            image: the crop
        """
        return "zoomed"

    schema = vf.envs.tool_schema(zoom)["function"]
    assert schema["parameters"]["properties"]["x"]["description"] == (
        "where to zoom, in pixels from the left"
    )
    env = vf.ToolEnv(dataset=[{"question": "q"}], tools=[zoom],
                     rubric=vf.Rubric([lambda completion: 1.0]))  # fmt: skip
    assert vf.check_environment(env, model_dir=tiny)["warnings"] == []  # 'image' is no arg


# -- the family the environment targets -------------------------------------------------


def test_the_check_renders_with_the_family_it_is_given():
    """A literal ``<image>`` in a question is text to Qwen2.5-VL (the default) and a
    placeholder to LLaVA-OneVision, which has one image for two placeholders: the check
    on that family finds it, and a tool environment on Gemma 3 (no tool role) too."""
    rows = [{"question": "What is in <image>?", "image": picture(1), "answer": "a"}]
    env = vf.SingleTurnEnv(dataset=rows, rubric=vf.Rubric([lambda completion: 1.0]))
    assert vf.check_environment(env)["family"] == "qwen2_5_vl"
    with pytest.raises(EnvironmentCheckError) as info:
        vf.check_environment(env, family="llava_onevision")
    problem = info.value.problems[0]
    assert (
        "ReservedTokenError: message 0 (user)" in problem and "holds <image> literally" in problem
    )

    def look(corner: str):
        """Look at a corner.

        Args:
            corner: which corner
        """
        return "a corner"

    tools = vf.ToolEnv(dataset=[{"question": "q"}], tools=[look],
                       rubric=vf.Rubric([lambda completion: 1.0]), max_turns=3)  # fmt: skip
    assert vf.check_environment(tools, family="qwen3_5")["tool_calls"] == {"look": 2}  # xml calls
    with pytest.raises(EnvironmentCheckError, match="roles must alternate"):
        vf.check_environment(tools, family="gemma3")


def test_an_unknown_family_or_two_models_are_refused_before_anything_runs(tiny):
    env = vf.SingleTurnEnv(dataset=[{"question": "q"}], rubric=vf.Rubric([lambda: 1.0]))
    with pytest.raises(ValueError, match=r"'llava' .*\(did you mean 'llava_onevision'\?"):
        vf.check_environment(env, family="llava")
    with pytest.raises(ValueError, match="family= or model_dir=, not both"):
        vf.check_environment(env, family="gemma3", model_dir=tiny)


def test_a_null_image_a_stray_image_column_and_a_typo_column_are_warnings(tiny):
    rows = [
        {"question": "hi", "image": None, "answer": "1"},
        {"question": "hi", "reference": picture(), "anwser": "1", "answer": "1",
         "task": "t", "info": {}, "example_id": 7, "id": "a"},
    ]  # fmt: skip
    env = vf.SingleTurnEnv(dataset=rows, rubric=vf.Rubric([lambda: 1.0]))
    report = vf.check_environment(env, model_dir=tiny)
    warnings = report["warnings"]
    assert any("row 0: its 'image' column is null" in w for w in warnings)
    assert any("row 1: column 'reference' holds an image that is not in the prompt" in w
               for w in warnings)  # fmt: skip
    assert any("'anwser'" in w and "did you mean 'answer'?" in w for w in warnings)
    assert not any(f"'{c}'" in w for w in warnings for c in ("task", "info", "id", "example_id"))


def test_an_environment_without_reward_functions_is_warned_about(tiny):
    env = vf.SingleTurnEnv(dataset=[{"question": "hi"}])
    report = vf.check_environment(env, model_dir=tiny)
    assert report["rewards"] == [0.0, 0.0]
    assert any("no reward functions: every reward is 0.0, so every advantage is 0" in w
               for w in report["warnings"])  # fmt: skip
    metric_only = vf.Rubric()
    metric_only.add_metric(lambda: 1.0)
    env = vf.SingleTurnEnv(dataset=[{"question": "hi"}], rubric=metric_only)
    assert any(
        "no reward functions" in w for w in vf.check_environment(env, model_dir=tiny)["warnings"]
    )
    env = vf.SingleTurnEnv(dataset=[{"question": "hi"}], rubric=vf.Rubric([lambda: 1.0]))
    assert not any("no reward" in w for w in vf.check_environment(env, model_dir=tiny)["warnings"])
