"""Rubric and parsers: reward functions get what they name; weights; metrics; groups."""

from __future__ import annotations

import asyncio
import functools

import numpy as np
import pytest
import torch

import vf_mm as vf
from vf_mm.envs._rubric import RewardFunc
from vf_mm.errors import RewardFunctionError


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


@pytest.mark.parametrize("bad", [None, "x", "1.0", b"1", float("nan"), float("inf")])
def test_a_reward_that_is_not_a_finite_number_is_that_rollouts_error(bad):
    rubric = vf.Rubric([lambda completion: bad])
    st = state("x")
    assert asyncio.run(rubric.score_rollout(st)) == (None, {})
    assert st["error"].type in ("TypeError", "ValueError")
    assert "<lambda>" in st["error"].message + st["error"].where


@pytest.mark.parametrize("good", [True, 1, np.float32(0.5), np.int64(1), torch.tensor(0.5)])
def test_numbers_of_every_kind_are_rewards(good):
    assert asyncio.run(vf.Rubric([lambda: good]).score_rollout(state("x")))[0] == float(good)


def test_a_typo_in_an_argument_name_is_refused_when_the_rubric_is_built():
    def correct(completion, answr):
        return 1.0

    with pytest.raises(RewardFunctionError) as info:
        vf.SingleTurnEnv(dataset=[{"question": "q", "answer": "1"}], rubric=vf.Rubric([correct]))
    message = str(info.value)
    assert message.startswith("reward function correct asks for ['answr']; it can ask for [")
    assert "(did you mean 'answr' -> 'answer'?)" in message
    assert isinstance(info.value, TypeError)  # as it was: code catching TypeError still does
    with pytest.raises(RewardFunctionError, match=r"asks for \['foo'\]"):
        vf.Rubric().add_metric(lambda foo: 1.0)
    # a group reward function receives the plurals: the singular is the typo
    with pytest.raises(RewardFunctionError, match=r"'completion' -> 'completions'"):
        vf.Rubric().add_group_reward_func(lambda completion: [1.0])


def test_the_check_at_build_is_the_check_at_scoring():
    """One message for one mistake: a function slipped into ``funcs`` past the constructor
    fails its rollout with the words the constructor would have used."""

    def needs_foo(foo):
        return 1.0

    with pytest.raises(RewardFunctionError) as built:
        vf.Rubric([needs_foo])
    rubric = vf.Rubric()
    rubric.funcs.append(RewardFunc(needs_foo, "needs_foo"))
    st = state("x")
    assert asyncio.run(rubric.score_rollout(st)) == (None, {})
    assert st["error"].type == "RewardFunctionError" and st["error"].message == str(built.value)


class Scorer:
    def __init__(self, bonus):
        self.bonus = bonus

    def __call__(self, completion, answer):
        return float(completion[-1]["content"] == answer) + self.bonus

    def method(self, parser, completion):
        return float(parser.parse_answer(completion) == "3")


def test_reward_functions_of_every_shape_are_accepted_and_called():
    def weighted(threshold, completion, answer, scale=2.0):  # threshold bound by partial
        return scale * float(completion[-1]["content"] == answer) - threshold

    async def asynchronous(answer):
        return float(answer == "3")

    funcs = [
        lambda **kwargs: float(kwargs["answer"] == "3"),  # everything, by **kwargs
        lambda completion, answer, *args: float(completion[-1]["content"] == answer),
        lambda answer, tolerance=0.1: tolerance,  # a default the rubric does not supply
        functools.partial(weighted, 0.5),
        functools.partial(weighted, threshold=0.25, scale=4.0),
        Scorer(0.5),  # a callable object: __call__'s arguments
        Scorer(0).method,  # a bound method: no self
        asynchronous,
    ]
    _, metrics = asyncio.run(vf.Rubric(funcs).score_rollout(state("3")))
    assert list(metrics.values()) == [1.0, 1.0, 0.1, 1.5, 3.75, 1.5, 1.0, 1.0]
    group = vf.Rubric()
    group.add_group_reward_func(lambda completions, parser, **rest: [len(rest["answers"])])
    assert asyncio.run(group.score_rollout(state("3")))[0] == 1.0


def test_arguments_the_rubric_cannot_pass_by_name_are_refused_when_built():
    def by_position(completion, /):
        return 1.0

    with pytest.raises(RewardFunctionError, match=r"takes \['completion'\] only by position"):
        vf.Rubric([by_position])
    with pytest.raises(
        RewardFunctionError, match="reward function max: its arguments cannot be read"
    ):
        vf.Rubric([max])  # a builtin without a signature


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
    with pytest.raises(RewardFunctionError, match="pass the function itself, not its name"):
        vf.Rubric(["correct"])


def test_a_single_function_is_a_rubric_of_one():
    def correct(completion) -> float:
        return 1.0

    rubric = vf.Rubric(correct)
    assert [rf.name for rf in rubric.funcs] == ["correct"]
    assert asyncio.run(rubric.score_rollout(state("x")))[0] == 1.0


def test_lambdas_are_named_by_their_position_and_source_line():
    rubric = vf.Rubric([lambda: 1.0, lambda: 0.0])
    rubric.add_group_reward_func(lambda completions: [1.0] * len(completions))
    line = test_lambdas_are_named_by_their_position_and_source_line.__code__.co_firstlineno
    assert [rf.name for rf in rubric.funcs] == [
        f"<lambda> #1 (line {line + 1})",
        f"<lambda> #2 (line {line + 1})",
        f"<lambda> #3 (line {line + 2})",
    ]
