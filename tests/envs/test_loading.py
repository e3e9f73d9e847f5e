"""load_environment: environments by id, path, --env-dir and VF_MM_ENV_PATH."""

from __future__ import annotations

import textwrap

import pytest

import vf_mm as vf
from vf_mm.cli import main
from vf_mm.errors import EnvironmentArgsError, EnvironmentLoadError, EnvironmentNotFoundError

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


def _write_env(folder, module="my_env"):
    folder.mkdir(parents=True)
    (folder / f"{module}.py").write_text(textwrap.dedent(ENV_SOURCE))
    return folder


def test_a_path_to_an_environment_folder_or_module_file_loads(tmp_path, monkeypatch):
    folder = _write_env(tmp_path / "somewhere" / "my-env")
    monkeypatch.chdir(tmp_path)
    for given in (
        str(folder),
        "somewhere/my-env",
        "./somewhere/my-env/",
        str(folder / "my_env.py"),
    ):
        env = vf.load_environment(given, n=1)
        assert len(env.get_eval_dataset()) == 1
        assert env.env_id in ("my-env", "my_env")  # named after the folder or the module


def test_a_folder_that_holds_no_environment_says_what_it_holds(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(EnvironmentNotFoundError, match=r"holds: notes\.txt") as info:
        vf.load_environment(str(tmp_path))
    assert f"{tmp_path.name.replace('-', '_')}.py" in str(info.value)


def test_search_folders_come_from_arguments_and_vf_mm_env_path(tmp_path, monkeypatch):
    _write_env(tmp_path / "a" / "alpha", "alpha")
    _write_env(tmp_path / "b" / "beta", "beta")
    monkeypatch.setenv("VF_MM_ENV_PATH", str(tmp_path / "b"))
    assert vf.load_environment("alpha", search_paths=[tmp_path / "a"]).env_id == "alpha"
    assert vf.load_environment("beta").env_id == "beta"  # from the environment variable


def test_not_found_lists_every_place_and_what_is_there(tmp_path, monkeypatch):
    _write_env(tmp_path / "here" / "gamma", "gamma")
    monkeypatch.setenv("VF_MM_ENV_PATH", str(tmp_path / "missing"))
    with pytest.raises(EnvironmentNotFoundError) as info:
        vf.load_environment("nope", search_paths=[tmp_path / "here"])
    text = str(info.value)
    assert f"{tmp_path / 'here'}/: gamma" in text
    assert f"{tmp_path / 'missing'}/: no such folder" in text
    assert "entry points in group 'vf_mm.environments'" in text and "--env-dir" in text


def test_the_cli_takes_env_dir_and_paths(tmp_path, monkeypatch):
    _write_env(tmp_path / "envs" / "delta", "delta")
    monkeypatch.chdir(tmp_path)
    common = ["-n", "1", "-r", "1", "-S", '{"max_tokens": 2}']
    assert main(["eval", "delta", "--env-dir", "envs", "-o", "o1", *common]) == 0
    assert main(["eval", "envs/delta", "-o", "o2", *common]) == 0
    assert main(["eval", "delta", "-o", "o3", *common]) == 1  # not found without --env-dir


def test_a_module_that_fails_to_import_says_so_and_loads_once_fixed(tmp_path):
    folder = tmp_path / "broken"
    folder.mkdir()
    (folder / "broken.py").write_text("def load_environment(:\n")
    with pytest.raises(EnvironmentLoadError, match=r"importing .*broken\.py failed: SyntaxError"):
        vf.load_environment(str(folder))
    (folder / "broken.py").write_text(textwrap.dedent(ENV_SOURCE))  # the author fixes it
    assert len(vf.load_environment(str(folder), n=2).get_eval_dataset()) == 2


def test_load_environment_raising_names_the_arguments_and_the_line(tmp_path, monkeypatch, capsys):
    folder = tmp_path / "environments" / "picky"
    folder.mkdir(parents=True)
    (folder / "picky.py").write_text(
        "def load_environment(difficulty='easy'):\n"
        "    raise ValueError(f'no difficulty {difficulty!r}')\n"
    )
    with pytest.raises(EnvironmentLoadError) as info:
        vf.load_environment("picky", search_paths=[folder.parent], difficulty="nightmare")
    message = str(info.value)
    assert message.startswith("picky: load_environment(difficulty='nightmare') raised ValueError")
    assert "no difficulty 'nightmare'" in message and "picky.py:2 in load_environment" in message
    assert isinstance(info.value.__cause__, ValueError)
    monkeypatch.chdir(tmp_path)
    assert main(["eval", "picky", "-a", '{"difficulty": "nightmare"}']) == 1
    err = capsys.readouterr().err
    assert "EnvironmentLoadError" in err and "Traceback" not in err


STRICT_SOURCE = """
import vf_mm as vf

def load_environment(path, num_examples=3):
    return vf.SingleTurnEnv(dataset=[{"question": path}] * num_examples)
"""

FORWARDING_SOURCE = """
import vf_mm as vf

def load_environment(num_examples=3, **kwargs):
    return vf.SingleTurnEnv(dataset=[{"question": "q"}] * num_examples, **kwargs)
"""


def test_arguments_load_environment_does_not_take_are_named_with_the_nearest(tmp_path):
    """A typo in env_args fails at load, naming the keyword, the nearest one it takes
    and all of them: for a load_environment without **kwargs before it runs, for one
    that passes its **kwargs on when what it passed them to refuses the keyword."""
    for name, source in (("strict", STRICT_SOURCE), ("forwarding", FORWARDING_SOURCE)):
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    strict, forwarding = str(tmp_path / "strict.py"), str(tmp_path / "forwarding.py")
    with pytest.raises(EnvironmentArgsError) as info:
        vf.load_environment(strict, path="x", num_example=2)
    error = info.value
    assert (error.name, error.kind, error.suggestion) == ("num_example", "unknown", "num_examples")
    assert error.accepted == ["path", "num_examples"] and error.__cause__ is None
    assert str(error) == (
        f"{strict}: load_environment takes no argument 'num_example' (did you mean "
        "'num_examples'?); it takes: path, num_examples"
    )
    assert isinstance(error, TypeError) and isinstance(error, EnvironmentLoadError)
    with pytest.raises(EnvironmentArgsError, match="needs the argument 'path'") as info:
        vf.load_environment(strict, num_examples=2)
    assert (info.value.name, info.value.kind) == ("path", "missing")
    assert len(vf.load_environment(forwarding, timeout_s=5).get_eval_dataset()) == 3
    with pytest.raises(EnvironmentArgsError) as info:
        vf.load_environment(forwarding, num_example=2)
    assert info.value.suggestion == "num_examples"
    assert "passes on to Environment.__init__(), which does not take 'num_example'" in str(
        info.value
    )
    assert isinstance(info.value.__cause__, TypeError)


def test_an_importable_module_that_fails_to_import_is_a_load_error_not_not_found(
    tmp_path, monkeypatch
):
    (tmp_path / "brokenmod.py").write_text("import no_such_dependency_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(EnvironmentLoadError, match="importing module 'brokenmod' failed: "
                       "ModuleNotFoundError: No module named 'no_such_dependency_xyz'"):  # fmt: skip
        vf.load_environment("brokenmod", search_paths=[])
    with pytest.raises(EnvironmentNotFoundError):  # no such module at all: not found
        vf.load_environment("no_such_env_module_xyz", search_paths=[])


def test_load_environment_with_adapters_wraps_what_one_knows(tmp_path):
    module = tmp_path / "other.py"
    module.write_text("def load_environment(n):\n    return ['row'] * n\n")
    wrapped = vf.SingleTurnEnv(dataset=[{"question": "q"}])
    seen = []

    def adapt(obj, env_id):  # given the object and the id the run names it by
        seen.append((obj, env_id))
        return wrapped if obj == ["row", "row"] else None

    from vf_mm.envs._internal import load_environment_with as load

    assert load(str(module), adapters=[adapt], env_args={"n": 2}) is wrapped
    assert seen == [(["row", "row"], "other")]
    with pytest.raises(EnvironmentNotFoundError, match="returned a list, not a vf_mm Environment"):
        load(str(module), adapters=[adapt], env_args={"n": 1})


def test_a_mistyped_environment_name_gets_a_suggestion(tmp_path):
    folder = tmp_path / "shapehunt"
    folder.mkdir()
    (folder / "shapehunt.py").write_text("def load_environment():\n    return None\n")
    with pytest.raises(
        EnvironmentNotFoundError, match=r"no environment 'shapehnt' \(did you mean 'shapehunt'\?\)"
    ):
        vf.load_environment("shapehnt", search_paths=[tmp_path])
