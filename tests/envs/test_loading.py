"""load_environment and check_environment."""

from __future__ import annotations

import textwrap

import pytest

import vf_mm as vf
from vf_mm.errors import EnvironmentCheckError, EnvironmentNotFoundError

ENV_SOURCE = """
import vf_mm as vf

def load_environment(n=3, **kwargs):
    rows = [{"question": f"say {i}", "answer": str(i)} for i in range(n)]
    return vf.SingleTurnEnv(dataset=rows, rubric=vf.Rubric([lambda completion, answer: 1.0]))
"""


def test_finds_environments_folder(tmp_path):
    folder = tmp_path / "environments" / "my-env"
    folder.mkdir(parents=True)
    (folder / "my_env.py").write_text(textwrap.dedent(ENV_SOURCE))
    env = vf.load_environment("my-env", search_paths=[tmp_path / "environments"], n=2)
    assert isinstance(env, vf.SingleTurnEnv) and len(env.get_eval_dataset()) == 2
    assert env.env_id == "my-env"


def test_unknown_environment_says_where_it_looked(tmp_path):
    with pytest.raises(EnvironmentNotFoundError, match="no environment 'nope'"):
        vf.load_environment("nope", search_paths=[tmp_path])


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
