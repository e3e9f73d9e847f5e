"""What check_environment asks of a rubric: mistakes that score wrong without an error."""

from __future__ import annotations

import pytest

import vf_mm as vf
from vf_mm.errors import EnvironmentCheckError

PARSER = vf.XMLParser(["answer"])
ROWS = [{"question": "How many dots?", "answer": n} for n in (2, 3)]
REPLIES = ["<answer>2</answer>", "<answer>3</answer>"]  # row 0 right, then row 1 right


def correct(completion, answer, parser) -> float:
    return float(parser.parse_answer(completion) == answer)


def numeric(completion, answer, parser) -> float:
    try:
        return float(float(parser.parse_answer(completion)) == answer)
    except (TypeError, ValueError):
        return 0.0


def test_a_number_answer_against_a_text_comparison_is_a_problem(tiny):
    """The rollouts themselves run clean and score 0: only the check can say why."""
    env = vf.SingleTurnEnv(dataset=ROWS, rubric=vf.Rubric([correct], parser=PARSER))
    with pytest.raises(EnvironmentCheckError) as info:
        vf.check_environment(env, model_dir=tiny, replies=REPLIES)
    assert info.value.problems == [
        "rows 0, 1: the answer 2 (type int) is not a string, and reward function correct "
        "scores the reply '2' 0.0 against it but 1.0 against the string '2': parsers return "
        "text, so a right answer never scores. Store answers as strings (str(answer)), or "
        "convert the parsed text in correct"
    ]
    fixed = [{**row, "answer": str(row["answer"])} for row in ROWS]
    env = vf.SingleTurnEnv(dataset=fixed, rubric=vf.Rubric([correct], parser=PARSER))
    report = vf.check_environment(env, model_dir=tiny, replies=REPLIES)
    assert report["warnings"] == [] and sorted(report["rewards"]) == [0.0, 0.0, 1.0, 1.0]


def test_a_reward_that_converts_the_parsed_text_passes_without_a_word(tiny):
    env = vf.SingleTurnEnv(dataset=ROWS, rubric=vf.Rubric([numeric], parser=PARSER))
    report = vf.check_environment(env, model_dir=tiny, replies=REPLIES)
    assert report["warnings"] == [] and sorted(report["rewards"]) == [0.0, 0.0, 1.0, 1.0]


def test_the_probe_reads_a_parser_of_the_functions_own_and_group_functions(tiny):
    def own(completion, answer):  # parses with the module's parser, not the argument
        return float(PARSER.parse_answer(completion) == answer)

    def ranked(completions, answers, parser):
        return [
            float(parser.parse_answer(c) == a) for c, a in zip(completions, answers, strict=True)
        ]

    rubric = vf.Rubric([own], parser=PARSER)
    rubric.add_group_reward_func(ranked)
    env = vf.SingleTurnEnv(dataset=ROWS[:1], rubric=rubric)
    with pytest.raises(EnvironmentCheckError) as info:
        vf.check_environment(env, model_dir=tiny, num_examples=1)
    assert [p.split(", and reward function ")[1].split(" ")[0] for p in info.value.problems] == [
        "own",
        "ranked",
    ]


def test_what_the_probe_cannot_tell_is_a_warning(tiny):
    def judged(state, answer):  # reads what the environment keeps: the probe cannot run it
        return float(state["verdict"] == answer)

    class Judge(vf.SingleTurnEnv):
        def setup_state(self, state):
            state["verdict"] = 0

    env = Judge(dataset=[{"question": "q", "answer": 7.5}], rubric=vf.Rubric([judged]))
    report = vf.check_environment(env, model_dir=tiny, num_examples=1)
    assert report["warnings"] == [
        "row 0: the answer 7.5 (type float) is not a string, and reward function judged asks "
        "for it: parsers return text ('7.5' != 7.5), so unless judged converts the parsed "
        "text a right answer never scores (the check could not tell whether it does); store "
        "answers as strings"
    ]


def test_bytes_answers_are_a_problem_already(tiny):
    env = vf.SingleTurnEnv(dataset=[{"question": "q", "answer": b"2"}],
                           rubric=vf.Rubric([correct]))  # fmt: skip
    with pytest.raises(EnvironmentCheckError, match="'answer' column cannot be stored"):
        vf.check_environment(env, model_dir=tiny, num_examples=1)


def test_a_default_named_like_a_supplied_argument_is_a_warning(tiny):
    def lenient(completion, answr=None, threshold=0.5):  # answr: never supplied
        return threshold

    def grouped(completions, state=None):  # a group function receives states, not state
        return [1.0] * len(completions)

    rubric = vf.Rubric([lenient])
    rubric.add_group_reward_func(grouped)
    env = vf.SingleTurnEnv(dataset=[{"question": "q", "answer": "a"}], rubric=rubric)
    assert vf.check_environment(env, model_dir=tiny, num_examples=1)["warnings"] == [
        "reward function lenient: its parameter 'answr' is not an argument the rubric "
        "supplies, so it keeps its default None on every rollout (did you mean 'answer'?)",
        "reward function grouped: its parameter 'state' is not an argument the rubric "
        "supplies, so it keeps its default None on every rollout (did you mean 'states'?)",
    ]


def test_a_reward_that_cannot_tell_different_replies_apart_is_a_warning(tiny):
    rows = [{"question": "How many dots?", "answer": str(n)} for n in (2, 3)]
    env = vf.SingleTurnEnv(dataset=rows, rubric=vf.Rubric([lambda completion: 0.0]))
    report = vf.check_environment(env, model_dir=tiny, replies=REPLIES)
    assert report["warnings"] == [
        "every rollout scored 0.0, though their final replies differ (2 distinct): a reward "
        "that cannot tell replies apart teaches nothing; check it with replies= holding a "
        "right and a wrong answer"
    ]
    same = vf.check_environment(env, model_dir=tiny)  # one reply for all: nothing to tell
    assert same["warnings"] == []
