"""`vf-mm eval`: results, metadata and assets on disk; resume after a killed process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vf_mm.cli import main
from vf_mm.results import read_metadata, read_results

ROOT = Path(__file__).resolve().parents[2]


def keys(outdir):
    return sorted((r["example_id"], r["rollout_index"]) for r in read_results(outdir))


def test_eval_writes_results_metadata_and_assets(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    out = tmp_path / "run"
    assert (
        main(["eval", "shapes", "-n", "2", "-r", "2", "-o", str(out), "-S", '{"max_tokens": 8}'])
        == 0
    )
    rows = read_results(out)
    assert len(rows) == 4 and keys(out) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["finished_at"] and meta["results"]["count"] == 4
    assert meta["config"]["sampling_args"]["max_tokens"] == 8
    urls = [p["image_url"]["url"] for r in rows for m in r["prompt"] if isinstance(m["content"], list)
            for p in m["content"] if p["type"] == "image_url"]  # fmt: skip
    assert urls and all((out / u).is_file() for u in urls)
    assert "base64" not in (out / "results.jsonl").read_text()
    assert "reward" in capsys.readouterr().out


def test_resume_after_kill_9_yields_each_rollout_once(tmp_path, monkeypatch):
    """The run killed is a real process (kill -9 is the claim); the resume runs in this
    one: what it reads is only the files the killed run left."""
    out = tmp_path / "run"
    env = dict(os.environ)  # the session's cache: the embedded model is built once
    cmd = [sys.executable, "-m", "vf_mm.cli._main", "eval", "shapes", "-n", "6", "-r", "2", "-c", "2",
           "-o", str(out), "-S", '{"max_tokens": 16}']  # fmt: skip
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    deadline = time.time() + 120
    results = out / "results.jsonl"
    while time.time() < deadline and proc.poll() is None:
        if results.exists() and results.read_text().count("\n") >= 3:
            break
        time.sleep(0.05)
    if proc.poll() is not None:
        pytest.fail(
            f"the run ended before it could be killed: {proc.stderr.read().decode()[-2000:]}"
        )
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    partial = keys(out)
    assert 3 <= len(partial) < 12
    monkeypatch.chdir(ROOT)
    assert main([*cmd[3:], "--resume"]) == 0
    assert keys(out) == [(e, r) for e in range(6) for r in range(2)]
    assert json.loads((out / "metadata.json").read_text())["results"]["count"] == 12


def test_resume_with_other_settings_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    out = tmp_path / "run"
    assert (
        main(["eval", "shapes", "-n", "1", "-r", "1", "-o", str(out), "-S", '{"max_tokens": 4}'])
        == 0
    )
    assert main(["eval", "shapes", "-n", "2", "-r", "1", "-o", str(out), "--resume"]) == 1
    assert "num_examples" in capsys.readouterr().err


def test_client_stats_count_the_whole_run_across_resumes(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    out = tmp_path / "run"
    args = ["eval", "shapes", "-n", "2", "-r", "1", "-o", str(out), "-S", '{"max_tokens": 4}']
    assert main(args) == 0
    first = read_metadata(out)["results"]["client"]
    assert first["turns"] == 2
    from vf_mm.models import resolve_image_backend

    # the renderer's image processing is part of the run's configuration (pixels differ)
    assert read_metadata(out)["config"]["image_backend"] == resolve_image_backend("auto")
    assert main([*args, "--resume"]) == 0  # nothing left to do: no turns this time
    assert read_metadata(out)["results"]["client"] == first  # not reset to zero


def test_a_run_written_before_image_backend_existed_still_resumes(tmp_path, monkeypatch):
    from vf_mm.models import resolve_image_backend

    monkeypatch.chdir(ROOT)
    out = tmp_path / "run"
    args = ["eval", "shapes", "-n", "2", "-r", "1", "-o", str(out), "-S", '{"max_tokens": 4}']
    assert main(args) == 0
    meta = json.loads((out / "metadata.json").read_text())
    del meta["config"]["image_backend"]  # as an older vf_mm wrote it (always PIL pixels)
    (out / "metadata.json").write_text(json.dumps(meta))
    code = main([*args, "--resume"])
    assert code == (0 if resolve_image_backend("auto") == "pil" else 1)  # other pixels: refused


def test_a_resume_with_another_local_dtype_is_refused(tmp_path, capsys, monkeypatch):
    """bfloat16 and float32 weights sample different tokens and logprobs: one run never
    mixes them (a run written before the key existed was float32)."""
    monkeypatch.chdir(ROOT)
    out = tmp_path / "run"
    args = ["eval", "shapes", "-n", "1", "-r", "1", "-o", str(out), "-S", '{"max_tokens": 4}']
    assert main([*args, "--dtype", "bfloat16"]) == 0
    assert read_metadata(out)["config"]["dtype"] == "bfloat16"
    assert main([*args, "--resume"]) == 1
    err = capsys.readouterr().err
    assert "dtype" in err and "num_examples" not in err
    meta = json.loads((out / "metadata.json").read_text())
    del meta["config"]["dtype"]  # as an older vf_mm wrote it: float32
    (out / "metadata.json").write_text(json.dumps(meta))
    assert main([*args, "--resume"]) == 0


def test_unknown_environment_is_a_clear_error(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["eval", "no-such-env", "-o", str(tmp_path / "x")]) == 1
    assert "EnvironmentNotFoundError" in capsys.readouterr().err


def test_a_model_that_cannot_take_the_environments_media_is_refused_up_front(
    tmp_path, capsys, monkeypatch
):
    """Every rollout would fail the same way: one clear line instead of a run of errors."""
    from vf_mm.testing import build_tiny_lm, build_tiny_vlm

    monkeypatch.chdir(ROOT)
    gemma = build_tiny_vlm(tmp_path / "gemma", "gemma3")
    out = tmp_path / "run"
    assert main(["eval", "motion", "-n", "1", "-m", str(gemma), "-o", str(out)]) == 1
    said = " ".join(capsys.readouterr().out.split())  # the console wraps long lines
    assert "renders no video, but motion's prompts hold clips" in said
    text = build_tiny_lm(tmp_path / "lm")
    assert main(["eval", "shapes", "-n", "1", "-m", str(text), "-o", str(out)]) == 1
    said = " ".join(capsys.readouterr().out.split())
    assert "is a text model, but shapes's prompts hold images" in said
    assert not out.exists()


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["-S", '{"max_token": 8}'], "-S/--sampling-args: unknown sampling arg 'max_token' "
         "(did you mean 'max_tokens'?); known: logprobs, max_tokens"),
        (["-S", '{"max_tokens": "8"}'], "-S/--sampling-args: max_tokens: sampling arg "
         "max_tokens must be an int, not str ('8')"),
        (["-S", '{"top_p": 2}'], "-S/--sampling-args: top_p: top_p must be in (0, 1], got 2.0"),
        (["-S", '{"stop_token_ids": 5}'], "stop_token_ids must be a list of ids, not 5"),
        (["-n", "0"], "-n/--num-examples must be a number of rows >= 1, or -1 for all of them, "
         "not 0"),
        (["-n", "-3"], "-n/--num-examples must be a number of rows >= 1"),
        (["-r", "0"], "-r/--rollouts-per-example must be >= 1, not 0"),
        (["-c", "0"], "-c/--max-concurrent must be >= 1, not 0"),
        (["--workers", "0"], "--workers must be >= 1, not 0"),
        (["--max-errors", "0"], "--max-errors must be >= 1, not 0"),
        (["-a", '{"num_example": 2}'], "-a/--env-args: shapes: load_environment takes no "
         "argument 'num_example' (did you mean 'num_examples'?); it takes: num_examples,"),
        (["-o", "{file}/run"], "-o/--outdir: {file} is a file, not a directory"),
    ],
)  # fmt: skip
def test_a_bad_argument_exits_2_in_one_line_before_anything_is_written(
    tmp_path, capsys, args, said
):
    """-S used to be checked by the first rollout: a traceback, after metadata.json held
    the bad configuration, and the directory refused the next try."""
    out, file = tmp_path / "out", tmp_path / "a-file"
    file.write_text("not a run")
    args = [a.replace("{file}", str(file)) for a in args]
    with pytest.raises(SystemExit) as exit_info:
        main(["eval", "shapes", "-o", str(out), *args])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("vf-mm eval: ") and err.count("\n") == 1, err
    assert said.replace("{file}", str(file)) in err, err
    assert not out.exists() and file.read_text() == "not a run"


@pytest.mark.parametrize("resume", [[], ["--resume"]])
def test_a_run_directory_holding_no_results_is_reused(tmp_path, resume):
    """What a run that stopped before its first rollout leaves (metadata.json with its
    configuration, an empty results.jsonl) never blocks the next try, with or without
    --resume, whatever that configuration was."""
    from vf_mm.results import ResultsWriter

    out = tmp_path / "run"
    bad = {"env_id": "shapes", "sampling_args": {"max_token": 8}}
    ResultsWriter(out, metadata={"config": bad}).close()
    args = ["eval", "shapes", "-n", "1", "-r", "1", "-o", str(out), "-S", '{"max_tokens": 4}']
    assert main([*args, *resume]) == 0
    assert len(read_results(out)) == 1
    assert read_metadata(out)["config"]["sampling_args"]["max_tokens"] == 4


def test_ctrl_c_saves_what_is_done_says_so_in_one_line_and_resume_is_exact(tmp_path):
    """A real SIGINT once the first rollout is saved (the others wait on a gate): one
    line, exit 130, the results file intact; --resume then runs only what is missing,
    and gives what an uninterrupted run gives."""
    from tests._interrupt import gated_environment, interrupt_at

    module, gate = gated_environment(tmp_path)
    out = tmp_path / "run"
    args = ["eval", str(module), "-n", "3", "-r", "1", "-c", "1", "-a",
            json.dumps({"gate": str(gate)}), "-S", '{"max_tokens": 3}']  # fmt: skip
    done = interrupt_at([*args, "-o", str(out)], gate.with_suffix(".reached"))
    assert done.returncode == 130, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    line = f"vf-mm eval: interrupted: 1/3 rollouts saved in {out}; continue with --resume"
    assert line in done.stderr.splitlines()
    assert keys(out) == [(0, 0)]
    first = (out / "results.jsonl").read_text()
    gate.touch()
    assert main([*args, "-o", str(out), "--resume"]) == 0
    assert keys(out) == [(0, 0), (1, 0), (2, 0)]
    assert (out / "results.jsonl").read_text().startswith(first)  # appended, not rewritten
    assert main([*args, "-o", str(tmp_path / "whole")]) == 0  # never interrupted
    said = {(r["example_id"]): r["completion"] for r in read_results(out)}
    assert said == {(r["example_id"]): r["completion"] for r in read_results(tmp_path / "whole")}


@pytest.mark.parametrize("family", ["lfm2_vl", "kimi_k25"])
@pytest.mark.parametrize("choice", ["auto", "torch"])
def test_a_family_with_only_torchvision_numbers_records_them_on_every_machine(
    tmp_path, family, choice
):
    """LFM2.5-VL's and Kimi-K2.5's images get torchvision's numbers with torchvision or
    through vf_mm's port without it: the run records "torchvision" either way, so a run
    made without torchvision resumes where it imports (its pixels are equal)."""
    from vf_mm.cli._common import image_backend_record

    (tmp_path / "config.json").write_text(json.dumps({"model_type": family}))
    assert image_backend_record(choice, tmp_path) == "torchvision"


def test_a_family_with_a_pil_backend_records_this_machines_backend(tmp_path):
    from vf_mm.cli._common import image_backend_record
    from vf_mm.models import resolve_image_backend

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2_vl"}))
    assert image_backend_record("auto", tmp_path) == resolve_image_backend("auto")
    # a model that is no local checkpoint (an OpenAI-style name) is taken as such a family
    assert image_backend_record("auto", "gpt-4o") == resolve_image_backend("auto")
