"""``vf_mm.load_environment`` (``vf_mm.adapters.load_environment``): vf_mm's environments
as before, and a verifiers environment found by id or path like any other, wrapped, so
``vf-mm eval``, ``vf-mm rollout`` and their worker processes run it.

The tests marked ``verifiers`` are the verifiers tier (``python3 dev.py verifiers``); the
others run in the default tier, where verifiers is not installed.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import vf_mm
import vf_mm.inference
from vf_mm.adapters import VerifiersEnv, adapt_verifiers
from vf_mm.cli import main
from vf_mm.errors import EnvironmentNotFoundError
from vf_mm.models import embedded_model
from vf_mm.renderers import load_renderer
from vf_mm.results import read_metadata, read_results
from vf_mm.testing import ScriptedBackend
from vf_mm.training import read_groups, unpack_group

ROOT = Path(__file__).resolve().parents[2]
SAMPLING = '{"max_tokens": 16}'


# -- the default tier -------------------------------------------------------------------


def test_vf_load_environment_is_the_one_that_wraps():
    assert vf_mm.load_environment is vf_mm.adapters.load_environment


def test_vf_mm_environments_load_as_before(monkeypatch):
    monkeypatch.chdir(ROOT)
    env = vf_mm.load_environment("shapes")
    assert (
        type(env) is type(vf_mm.envs._internal.load_environment("shapes"))
        and env.env_id == "shapes"
    )


def test_what_no_adapter_knows_is_refused_as_before(tmp_path):
    module = tmp_path / "not_env.py"
    module.write_text("def load_environment():\n    return {'rows': []}\n")
    with pytest.raises(EnvironmentNotFoundError, match="returned a dict, not a vf_mm Environment"):
        vf_mm.load_environment(str(module))
    assert adapt_verifiers({"rows": []}, "not_env") is None


# -- the verifiers tier ------------------------------------------------------------------


@pytest.mark.verifiers
def test_importing_vf_mm_never_imports_verifiers(vf):
    code = ("import sys, vf_mm, vf_mm.adapters, vf_mm.workers, vf_mm.cli; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'verifiers'))")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.verifiers
def test_a_verifiers_environment_loads_by_path_and_by_id(dots_env_path, tmp_path):
    by_file = vf_mm.load_environment(str(dots_env_path))
    assert isinstance(by_file, VerifiersEnv) and by_file.env_id == "dots_env"
    assert len(by_file.get_eval_dataset()) == 3

    folder = tmp_path / "envs" / "dots-env"
    folder.mkdir(parents=True)
    shutil.copy(dots_env_path, folder / "dots_env.py")
    by_folder = vf_mm.load_environment(str(folder), counts=[5])
    by_id = vf_mm.load_environment("dots-env", search_paths=[tmp_path / "envs"], counts=[5])
    for env in (by_folder, by_id):
        assert isinstance(env, VerifiersEnv) and env.env_id == "dots-env"
        assert [r["answer"] for r in env.get_eval_dataset()] == ["5"]  # env_args reach it


@pytest.mark.verifiers
def test_the_signal_handlers_verifiers_installs_are_put_back(dots_env, dots_env_path):
    def mine(signum, frame):  # a handler of the process's own
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, mine)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    dots_env.load_environment()  # verifiers' own constructor installs its handlers
    assert signal.getsignal(signal.SIGINT) is not mine
    signal.signal(signal.SIGINT, mine)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)

    vf_mm.load_environment(str(dots_env_path))
    assert signal.getsignal(signal.SIGINT) is mine  # a worker keeps ignoring Ctrl-C
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


@pytest.mark.verifiers
def test_vf_mm_eval_runs_it_on_the_tiny_model_and_vf_mm_view_shows_it(
    dots_env_path, tmp_path, capsys
):
    out = tmp_path / "run"
    argv = ["eval", str(dots_env_path), "-n", "2", "-r", "2", "-o", str(out), "--backend",
            "local", "-S", SAMPLING]  # fmt: skip
    assert main(argv) == 0
    rows = read_results(out)
    assert sorted((r["example_id"], r["rollout_index"]) for r in rows) == [
        (0, 0), (0, 1), (1, 0), (1, 1)
    ]  # fmt: skip
    for row in rows:
        assert row["error"] is None and row["reward"] in (0.0, 1.0)
        assert {"correct", "num_turns", "total_tool_calls", "draw_calls"} <= set(row["metrics"])
        assert row["num_turns"] >= 1 and row["prompt_tokens"] > 0 and row["completion_tokens"] > 0
        (image,) = [p for p in row["prompt"][1]["content"] if p["type"] == "image_url"]
        assert (out / image["image_url"]["url"]).is_file()  # stored once, as an asset
    assert "base64" not in (out / "results.jsonl").read_text()
    assert read_metadata(out)["config"]["env_id"] == str(dots_env_path)
    assert "correct" in capsys.readouterr().out  # the summary shows verifiers' metrics

    assert main(["view", str(out)]) == 0
    assert "4 rollouts" in capsys.readouterr().out and (out / "report.html").is_file()


@pytest.mark.verifiers
def test_vf_mm_rollout_streams_its_exact_tokens(dots_env_path, tmp_path):
    stream = tmp_path / "groups.vfmm"
    argv = ["rollout", str(dots_env_path), "-n", "2", "-r", "2", "--stream", str(stream), "-S",
            SAMPLING]  # fmt: skip
    assert main(argv) == 0
    groups = sorted(read_groups(stream), key=lambda g: g["example_id"])
    assert [g["example_id"] for g in groups] == [0, 1]
    env = vf_mm.load_environment(str(dots_env_path))
    renderer = load_renderer(embedded_model())
    for group, row in zip(groups, env.get_dataset(2), strict=True):
        full = renderer.render(env.format_prompt(row))  # the row's prompt, rendered whole
        for rollout in unpack_group(group):
            assert rollout.error is None and rollout.reward is not None
            first = rollout.trajectory[0].tokens
            assert first.prompt_ids == full.token_ids
            assert first.multi_modal_data.mm_hashes == full.multi_modal_data.mm_hashes
            assert len(first.completion_logprobs) == len(first.completion_ids) > 0


@pytest.mark.verifiers
def test_its_tool_images_land_in_the_results_and_the_report(
    dots_env, dots_env_path, tmp_path, monkeypatch, capsys
):
    class ScriptedLocal(ScriptedBackend):  # the tiny model's tokenizer, scripted replies
        def __init__(self, model, **options):
            super().__init__(load_renderer(model), dots_env.policy)

    monkeypatch.setattr(vf_mm.inference, "LocalBackend", ScriptedLocal)
    out = tmp_path / "run"
    argv = ["eval", str(dots_env_path), "-n", "2", "-r", "1", "-o", str(out), "--backend",
            "local", "-S", '{"max_tokens": 64}']  # fmt: skip
    assert main(argv) == 0
    rows = sorted(read_results(out), key=lambda r: r["example_id"])
    assert [r["reward"] for r in rows] == [1.0, 0.0]  # the script answers 2
    for row in rows:
        assert row["num_turns"] == 3 and row["metrics"]["draw_calls"] == 2.0
        tools = [m for m in row["completion"] if m["role"] == "tool"]
        for count, message in enumerate(tools, start=1):
            image, text = message["content"]
            assert text == {"type": "text", "text": f"{count} dots"}
            stored = np.asarray(Image.open(out / image["image_url"]["url"]).convert("RGB"))
            assert np.array_equal(stored, np.asarray(dots_env.dots(count)))
    capsys.readouterr()
    assert main(["view", str(out)]) == 0
    assert "3 distinct images" in " ".join(capsys.readouterr().out.split())


@pytest.mark.verifiers
def test_worker_processes_load_and_wrap_it_too(dots_env_path, tmp_path):
    out = tmp_path / "run"
    env = {**os.environ, "VF_MM_CACHE": os.environ.get("VF_MM_CACHE", str(tmp_path / "cache"))}
    done = subprocess.run(
        [sys.executable, "-m", "vf_mm.cli._main", "eval", str(dots_env_path), "-n", "2", "-r",
         "1", "--workers", "2", "-o", str(out), "-S", SAMPLING],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    rows = read_results(out)
    assert sorted(r["example_id"] for r in rows) == [0, 1]
    assert all(r["error"] is None and "num_turns" in r["metrics"] for r in rows)
    assert json.loads((out / "metadata.json").read_text())["results"]["count"] == 2
