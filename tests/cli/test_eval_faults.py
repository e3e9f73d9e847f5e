"""`vf-mm eval` with faulty environments: each fault stays in its rollout, is recorded with
its error, the other rollouts are scored normally, and the run exits 0."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest

from vf_mm.cli import main
from vf_mm.results import read_metadata, read_results

ENV = """
import asyncio

import vf_mm as vf
from PIL import Image


class Faulty(vf.MultiTurnEnv):
    async def env_response(self, messages, state):
        fault = state["row"]["fault"]
        if fault == "dict":
            return {{"role": "user", "content": "a dict, not a list"}}
        if fault == "unknown-part":
            return [{{"role": "user", "content": [{{"type": "img", "image": Image.new("RGB", (8, 8))}}]}}]
        if fault == "bare-image":
            return [{{"role": "user", "content": Image.new("RGB", (8, 8), "red")}}]
        if fault == "no-role":
            return [{{"content": "who am I"}}]
        if fault == "raises":
            raise RuntimeError("env code blew up")
        if fault == "slow":
            await asyncio.sleep(30)
        if fault == "unsafe-url":
            return [{{"role": "user", "content": [{{"type": "image_url",
                      "image_url": {{"url": "http://169.254.169.254/latest/meta-data"}}}}]}}]
        return [{{"role": "user", "content": "go on"}}]


def reward(completion, state):
    if state["row"]["fault"] == "reward":
        raise ZeroDivisionError("the rubric divided by zero")
    return 1.0


def load_environment(**kwargs):
    rows = [
        {{"question": "fine", "answer": "a", "fault": "none"}},
        {{"question": "q", "answer": "a", "fault": "{fault}"}},
        {{"question": "fine too", "answer": "a", "fault": "none"}},
    ]
    if "{fault}" == "missing-image":
        rows[1]["image"] = "/no/such/image.png"
    return Faulty(dataset=rows, max_turns=2, rubric=vf.Rubric([reward]), timeout_s=5, **kwargs)
"""


def run(tmp_path, monkeypatch, fault, *extra):
    env_dir = tmp_path / "environments" / "faulty"
    env_dir.mkdir(parents=True)
    (env_dir / "faulty.py").write_text(textwrap.dedent(ENV.format(fault=fault)))
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    code = main(["eval", "faulty", "-n", "-1", "-r", "1", "-o", str(out), "-S",
                 '{"max_tokens": 4}', *extra])  # fmt: skip
    return code, {r["example_id"]: r for r in read_results(out)}, read_metadata(out)


def assert_only_row_1_failed(rows, meta, kind, text):
    assert set(rows) == {0, 1, 2}
    assert rows[1]["reward"] is None and rows[1]["error"]["type"] == kind
    assert text in rows[1]["error"]["message"] + rows[1]["error"]["where"]
    for ok in (0, 2):
        assert rows[ok]["error"] is None and rows[ok]["reward"] == 1.0
    assert meta["results"]["errors"] == 1
    assert meta["results"]["error_kinds"][kind]["count"] == 1


@pytest.mark.parametrize(
    ("fault", "kind", "text"),
    [
        (
            "unknown-part",
            "MessageError",
            "'img' is not a content part type (did you mean 'image'?)",
        ),
        ("no-role", "MessageError", "faulty.env_response returned (turn 1), message 0: no 'role'"),
        ("raises", "RuntimeError", "env code blew up"),
        ("missing-image", "ImageFetchError", "/no/such/image.png"),
        ("slow", "TimeoutError", "turn 1: faulty.env_response"),
        ("unsafe-url", "UnsafeImageSourceError", "169.254.169.254"),
        ("reward", "ZeroDivisionError", "reward function reward"),
    ],
)
def test_a_fault_fails_its_rollout_only_and_the_run_exits_0(
    tmp_path, monkeypatch, capsys, fault, kind, text
):
    code, rows, meta = run(tmp_path, monkeypatch, fault)
    assert code == 0
    assert_only_row_1_failed(rows, meta, kind, text)
    assert f"1 × {kind}" in capsys.readouterr().out  # noqa: RUF001 - the summary's sign


@pytest.mark.parametrize("fault", ["dict", "bare-image"])
def test_forms_a_user_would_write_are_normalised_not_stringified(tmp_path, monkeypatch, fault):
    code, rows, _ = run(tmp_path, monkeypatch, fault)
    assert code == 0 and all(r["error"] is None for r in rows.values())
    reply = rows[1]["completion"][1]
    assert reply["role"] == "user"
    if fault == "bare-image":  # one image part, stored as an asset: the model saw it
        (part,) = reply["content"]
        assert part["type"] == "image_url" and part["image_url"]["url"].startswith("assets/")
    else:
        assert reply["content"] == "a dict, not a list"


def test_a_missing_image_is_recorded_where_it_was(tmp_path, monkeypatch):
    _, rows, _ = run(tmp_path, monkeypatch, "missing-image")
    part = rows[1]["prompt"][0]["content"][0]
    assert part["type"] == "unavailable" and part["source"] == "/no/such/image.png"
    assert "ImageFetchError" in part["error"]


def test_max_errors_stops_the_run_with_exit_status_3_and_resume_finishes_it(
    tmp_path, monkeypatch, capsys
):
    code, _, meta = run(tmp_path, monkeypatch, "raises", "--max-errors", "1", "-c", "1")
    assert code == 3
    assert "--max-errors 1" in meta["results"]["stopped"]
    assert "stopped after 1 failed rollouts" in capsys.readouterr().out
    assert main(["eval", "faulty", "-n", "-1", "-r", "1", "-o", str(tmp_path / "out"), "-S",
                 '{"max_tokens": 4}', "--resume"]) == 0  # fmt: skip
    assert len(read_results(tmp_path / "out")) == 3


def test_without_a_terminal_progress_is_plain_lines(tmp_path, monkeypatch, capsys):
    code, _, _ = run(tmp_path, monkeypatch, "none")
    out = capsys.readouterr().out
    assert code == 0
    assert "faulty: 3/3 done" in out and "rollouts/s" in out and "errors 0" in out
    assert "…" not in out.split("\n", 1)[0]  # nothing cut off by a missing terminal width
    assert (
        json.loads((tmp_path / "out" / "metadata.json").read_text())["results"]["stopped"] is None
    )


def test_resume_runs_failed_rollouts_again_unless_told_to_keep_them(tmp_path, monkeypatch):
    code, rows, _ = run(tmp_path, monkeypatch, "missing-image")
    assert code == 0 and rows[1]["error"]
    (tmp_path / "environments" / "faulty" / "faulty.py").write_text(
        textwrap.dedent(ENV.format(fault="none"))
    )  # the environment is fixed; the config (env id, args) is the same
    for name in [m for m in sys.modules if m.endswith("faulty")]:
        monkeypatch.delitem(sys.modules, name)  # a new process would import the fixed file
    args = ["eval", "faulty", "-n", "-1", "-r", "1", "-o", str(tmp_path / "out"), "-S",
            '{"max_tokens": 4}', "--resume"]  # fmt: skip
    assert main([*args, "--keep-errors"]) == 0
    kept = {r["example_id"]: r for r in read_results(tmp_path / "out")}
    assert kept[1]["error"]  # kept
    assert main(args) == 0
    rows = {r["example_id"]: r for r in read_results(tmp_path / "out")}
    assert rows[1]["error"] is None and rows[1]["reward"] == 1.0  # retried, last record counts
    assert len((tmp_path / "out" / "results.jsonl").read_text().splitlines()) == 4  # appended
    assert read_metadata(tmp_path / "out")["results"]["errors"] == 0


def test_a_run_whose_every_rollout_failed_exits_1_keeping_each_error(tmp_path, capsys):
    """A server nobody can reach fails every rollout: each row keeps its error (the run
    is not lost), and the exit status says nothing was measured, so a script does not take
    the run for a success."""
    from vf_mm.models import embedded_model

    out = tmp_path / "out"
    code = main(["eval", "shapes", "-n", "2", "-r", "1", "-o", str(out), "--backend", "vllm",
                 "-m", str(embedded_model()), "-b", "http://127.0.0.1:9", "-S",
                 '{"max_tokens": 4}'])  # fmt: skip
    assert code == 1
    rows = list(read_results(out))
    assert len(rows) == 2 and all(r["error"] is not None for r in rows)
    assert "every rollout failed (2 of 2)" in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("command", ["eval", "rollout"])
def test_a_server_url_without_its_scheme_is_a_usage_error(tmp_path, capsys, command):
    """``-b 127.0.0.1:8000`` is a mistake to name, exit 2, not a backend's traceback."""
    where = (
        ["-o", str(tmp_path / "out")] if command == "eval" else ["--stream", str(tmp_path / "g")]
    )
    with pytest.raises(SystemExit) as exit_info:
        main([command, "shapes", "-n", "1", "--backend", "vllm", "-b", "127.0.0.1:9", *where])
    assert exit_info.value.code == 2
    assert "'127.0.0.1:9' is not a server URL: write http://HOST:PORT" in capsys.readouterr().err
