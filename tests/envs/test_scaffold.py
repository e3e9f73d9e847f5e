"""scaffold_environment and `vf-mm init`: a new environment that works before it is edited."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from vf_mm.cli import main
from vf_mm.envs import scaffold_environment
from vf_mm.results import read_metadata, read_results

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("flags", "kind", "family", "fresh"),
    [
        # the default scaffold's own tests in a fresh process: in the default tier that is
        # docs/environments.md's `vf-mm init my-env` then `pytest -q environments/my-env`
        # (tests/test_docs_environments.py, which requires them all to pass, none skipped)
        ([], "single-turn", "qwen2_5_vl", False),
        pytest.param([], "single-turn", "qwen2_5_vl", True, marks=pytest.mark.slow),
        # the other kinds' own tests build other families (slow tier); the test below
        # evals both kinds in the default tier
        pytest.param(["--multi-turn", "--family", "smolvlm"], "multi-turn", "smolvlm", True,
                     marks=pytest.mark.slow),
        pytest.param(["--tools", "--family", "qwen3_5"], "tools", "qwen3_5", True,  # XML tools
                     marks=pytest.mark.slow),
    ],
)  # fmt: skip
def test_init_writes_an_environment_that_evals_and_passes_its_own_tests(
    tmp_path, monkeypatch, capsys, flags, kind, family, fresh
):
    monkeypatch.chdir(tmp_path)
    assert main(["init", "my-env", *flags]) == 0
    folder = tmp_path / "environments" / "my-env"
    module = "my_env"
    assert sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()) == [
        "README.md", f"{module}.py", "pyproject.toml", f"tests/test_{module}.py"
    ]  # fmt: skip
    out = capsys.readouterr().out
    assert f"({kind}, checked on {family})" in out
    assert "vf-mm eval my-env" in out and "pytest environments" in out
    test = (folder / "tests" / f"test_{module}.py").read_text()
    assert f'FAMILY = "{family}"' in test and test.count("family=FAMILY") == 2
    pyproject = (folder / "pyproject.toml").read_text()
    assert '[project.entry-points."vf_mm.environments"]' in pyproject
    assert 'my-env = "my_env:load_environment"' in pyproject

    # vf-mm eval NAME: found under ./environments, every rollout scored, no error
    assert main(["eval", "my-env", "-n", "2", "-r", "2", "-o", "out", "-S",
                 '{"max_tokens": 8}']) == 0  # fmt: skip
    rows = read_results(tmp_path / "out")
    assert len(rows) == 4 and all(r["error"] is None and r["reward"] is not None for r in rows)
    assert read_metadata(tmp_path / "out")["config"]["env_id"] == "my-env"

    if not fresh:
        return
    # pytest environments/NAME, in a fresh process, as the author would run it
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(folder)],
        cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 passed" in done.stdout


@pytest.mark.parametrize("kind", ["multi-turn", "tools"])
def test_every_kind_of_scaffold_evals_with_every_rollout_scored(tmp_path, monkeypatch, kind):
    monkeypatch.chdir(tmp_path)
    assert main(["init", "my-env", f"--{kind}"]) == 0
    assert main(["eval", "my-env", "-n", "2", "-r", "1", "-o", "out", "-S",
                 '{"max_tokens": 8}']) == 0  # fmt: skip
    rows = read_results(tmp_path / "out")
    assert len(rows) == 2 and all(r["error"] is None and r["reward"] is not None for r in rows)


def test_the_written_code_is_lint_clean(tmp_path):
    for kind in ("single-turn", "multi-turn", "tools"):
        scaffold_environment(f"env-{kind}", kind=kind, directory=tmp_path)
    # as in the author's own project, where vf_mm is an installed (third-party) package
    ruff = [sys.executable, "-m", "ruff"]
    lint = subprocess.run([*ruff, "check", "--isolated", "--select", "F,E,W,I,B,UP", str(tmp_path)],
                          capture_output=True, text=True, cwd=tmp_path)  # fmt: skip
    assert lint.returncode == 0, lint.stdout
    fmt = subprocess.run([*ruff, "format", "--isolated", "--check", str(tmp_path)],
                         capture_output=True, text=True, cwd=tmp_path)  # fmt: skip
    assert fmt.returncode == 0, fmt.stdout


@pytest.mark.parametrize(
    ("name", "match"),
    [
        ("1st", "not an environment name"),
        ("my env", "not an environment name"),
        ("../escape", "not an environment name"),
        ("class", "Python keyword"),
        ("json", "already importable"),  # environments/json/json.py would shadow the stdlib
        ("vf_mm", "already importable"),
    ],
)
def test_names_that_cannot_be_a_module_are_refused_and_nothing_is_written(tmp_path, name, match):
    with pytest.raises(ValueError, match=match):
        scaffold_environment(name, directory=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_an_existing_folder_is_never_overwritten(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "environments" / "mine").mkdir(parents=True)
    (tmp_path / "environments" / "mine" / "mine.py").write_text("# my work\n")
    assert main(["init", "mine", "--tools"]) == 1
    assert "already exists: nothing was written" in capsys.readouterr().out
    assert (tmp_path / "environments" / "mine" / "mine.py").read_text() == "# my work\n"


def test_dir_puts_it_elsewhere_and_the_next_step_says_how_to_find_it(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["init", "elsewhere", "--dir", "envs"]) == 0
    assert (tmp_path / "envs" / "elsewhere" / "elsewhere.py").is_file()
    assert "vf-mm eval elsewhere --env-dir envs" in capsys.readouterr().out
    readme = (tmp_path / "envs" / "elsewhere" / "README.md").read_text()
    assert "vf-mm eval elsewhere --env-dir envs" in readme and "pytest envs/elsewhere" in readme


def test_multi_turn_and_tools_are_one_choice(capsys):
    with pytest.raises(SystemExit):
        main(["init", "x", "--multi-turn", "--tools"])
    assert "not allowed with argument" in capsys.readouterr().err


def test_an_unknown_family_is_a_usage_error_naming_the_nearest(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        main(["init", "x", "--family", "gema3"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("vf-mm init: error: argument --family: model type 'gema3'")
    assert "(did you mean 'gemma3'? supported: qwen2_vl, " in err
    assert list(tmp_path.iterdir()) == []


def test_tools_for_a_family_without_a_tool_role_are_refused_and_nothing_is_written(tmp_path):
    with pytest.raises(ValueError, match="Gemma 3's chat template has no tool role"):
        scaffold_environment("x", kind="tools", directory=tmp_path, family="gemma3")
    assert list(tmp_path.iterdir()) == []
