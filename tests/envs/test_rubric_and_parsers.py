"""Rubric and parsers: reward functions get what they name; weights; metrics; groups."""

from __future__ import annotations

import asyncio

import pytest

import vf_mm as vf


def completion(text):
    return [{"role": "assistant", "content": text}]


def state(text, answer="3", **extra):
    return {"prompt": [], "completion": completion(text), "answer": answer, "info": {"k": 1},
            "example_id": 0, "task": "t", "error": None, **extra}  # fmt: skip


def test_reward_functions_receive_what_they_name():
    seen = {}

    def exact(completion, answer, parser):
        seen["args"] = (completion, answer, type(parser))
        return parser.parse_answer(completion) == answer

    async def info_bonus(info, state):
        return info["k"] * 0.5 + (state["task"] == "t")

    rubric = vf.Rubric([exact, info_bonus], [1.0, 2.0])
    reward, metrics = asyncio.run(rubric.score_rollout(state("3")))
    assert metrics == {"exact": 1.0, "info_bonus": 1.5}
    assert reward == 1.0 + 2.0 * 1.5
    assert seen["args"][1] == "3" and seen["args"][2] is vf.Parser


def test_zero_weight_is_a_metric_not_a_reward():
    rubric = vf.Rubric([lambda completion: 1.0])
    rubric.add_metric(lambda completion: 7.0)
    reward, metrics = asyncio.run(rubric.score_rollout(state("x")))
    assert reward == 1.0 and 7.0 in metrics.values()


def test_group_rewards_see_the_whole_group():
    def rank(completions, answers):
        lengths = [len(c[-1]["content"]) for c in completions]
        return [1.0 if n == min(lengths) else 0.0 for n in lengths]

    rubric = vf.Rubric()
    rubric.add_group_reward_func(rank)
    scores = asyncio.run(rubric.score_group([state("long answer"), state("ok")]))
    assert [r for r, _ in scores] == [0.0, 1.0]


def test_failed_rollouts_are_not_scored_and_skip_reward_functions():
    calls = []
    rubric = vf.Rubric([lambda completion: calls.append(1) or 1.0])
    scores = asyncio.run(rubric.score_group([state("x", error="boom"), state("y")]))
    assert scores[0] == (None, {}) and scores[1][0] == 1.0 and len(calls) == 1


@pytest.mark.parametrize("bad", [None, "x", float("nan"), float("inf")])
def test_a_reward_that_is_not_a_finite_number_is_that_rollouts_error(bad):
    rubric = vf.Rubric([lambda completion: bad])
    st = state("x")
    assert asyncio.run(rubric.score_rollout(st)) == (None, {})
    assert st["error"].type in ("TypeError", "ValueError")
    assert "<lambda>" in st["error"].message + st["error"].where


def test_asking_for_an_unknown_argument_names_the_choices():
    def needs_foo(foo):
        return 1.0

    st = state("x")
    assert asyncio.run(vf.Rubric([needs_foo]).score_rollout(st)) == (None, {})
    assert st["error"].type == "TypeError" and "asks for ['foo']" in st["error"].message


def test_xml_parser_takes_the_last_answer_and_scores_format():
    parser = vf.XMLParser(["think", "answer"])
    text = "<think>hmm</think><answer>2</answer> wait <answer> 3 </answer>"
    assert parser.parse(text) == {"think": "hmm", "answer": "3"}
    assert parser.parse_answer(completion(text)) == "3"
    assert parser.parse_answer(completion("no tags")) is None
    assert parser.format_reward(completion("<think>a</think><answer>b</answer>")) == 1.0
    assert parser.format_reward(completion("<answer>b</answer>")) == 0.0


def test_think_parser_drops_reasoning():
    parser = vf.ThinkParser(vf.XMLParser())
    assert parser.parse_answer(
        completion("<think><answer>1</answer></think><answer>2</answer>")
    ) == {"answer": "2"}
    assert vf.ThinkParser().parse_answer(completion("<think>x</think>\n final ")) == "final"


def test_format_reward_does_not_count_turns_that_only_call_tools():
    parser = vf.XMLParser(["answer"])
    call = {"id": "c", "type": "function", "function": {"name": "crop", "arguments": "{}"}}
    block = '<tool_call>\n{"name": "crop", "arguments": {}}\n</tool_call>'
    completion = [
        # a template that does not render tool_calls keeps the block in the content
        {"role": "assistant", "content": block, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c", "content": "cropped"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c", "content": "cropped"},
        {"role": "assistant", "content": "<answer>3</answer>"},
    ]
    assert parser.format_reward(completion) == 1.0
    talking = {"role": "assistant", "content": f"let me look\n{block}", "tool_calls": [call]}
    assert parser.format_reward([talking, completion[-1]]) == 0.5  # text besides the call counts


def test_a_reward_function_given_by_name_is_refused_at_construction():
    with pytest.raises(TypeError, match="pass the function itself, not its name"):
        vf.Rubric(["correct"])
