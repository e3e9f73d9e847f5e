"""`vf-mm serve --record DIR`: a real server process, the OpenAI SDK over HTTP, and what
lands in DIR when a session ends and when the server stops."""

from __future__ import annotations

import itertools
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from PIL import Image

from vf_mm.images import png_data_url
from vf_mm.results import read_results
from vf_mm.training import read_groups, unpack_group

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from vf_mm.testing import build_tiny_vlm

    return build_tiny_vlm(tmp_path_factory.mktemp("serve-record") / "qwen", "qwen2_5_vl")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def user(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    url = png_data_url(Image.fromarray(rng.integers(0, 256, (40, 60, 3), dtype=np.uint8)))
    return {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                        {"type": "text", "text": f"step {seed}"}]}  # fmt: skip


def start_recording(checkpoint: Path, record: Path) -> tuple[subprocess.Popen, str]:
    """``vf-mm serve --record`` in its own process, once /health answers."""
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "vf_mm.cli._main", "serve", "--model", str(checkpoint),
         "--port", str(port), "--record", str(record), "--log-level", "warning"],
        cwd=ROOT, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 240  # a bound on the wait for the model to load
    while True:
        assert server.poll() is None, server.stderr.read()
        try:
            if httpx.get(f"{base}/health").status_code == 200:
                return server, base
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "the server did not come up"
        time.sleep(0.2)


@pytest.mark.timeout(300)
def test_a_recorded_session_lands_in_dir_as_a_row_and_a_group(checkpoint, tmp_path):
    import openai

    record = tmp_path / "rec"
    server, base = start_recording(checkpoint, record)
    try:
        oai = openai.OpenAI(base_url=f"{base}/v1", api_key="x",
                            default_headers={"X-Session-ID": "agent-1"})  # fmt: skip
        messages = []
        for turn in range(3):
            messages.append(user(turn))
            reply = oai.chat.completions.create(model=str(checkpoint), messages=messages,
                                                max_tokens=6, seed=turn)  # fmt: skip
            messages.append(reply.choices[0].message)
        assert httpx.get(f"{base}/v1/sessions").json()["data"] == [
            {"id": "agent-1", "turns": 3, "index": 0}
        ]
        assert httpx.post(f"{base}/v1/sessions/agent-1/end").json()["turns"] == 3
        assert httpx.post(f"{base}/v1/sessions/agent-1/end").status_code == 404
        # a call refused with 400 (a corrupt image) records nothing: no session, no row,
        # no group (it used to land as an empty one)
        corrupt = {"role": "user", "content": [{"type": "image_url", "image_url": {
            "url": "data:image/png;base64,iVBORw0KGgoAAAAA"}}]}  # fmt: skip
        refused = httpx.post(f"{base}/v1/chat/completions", headers={"X-Session-ID": "agent-3"},
                             json={"model": str(checkpoint), "messages": [corrupt]})  # fmt: skip
        assert refused.status_code == 400, refused.text
        # a second session, still open when the server stops: it lands too
        oai.chat.completions.create(model=str(checkpoint), messages=[user(9)], max_tokens=4,
                                    extra_headers={"X-Session-ID": "agent-2"})  # fmt: skip
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(60)
    assert server.returncode == 0, server.stderr.read()
    rows = {r["example_id"]: r for r in read_results(record)}
    assert set(rows) == {"agent-1", "agent-2"}
    assert rows["agent-1"]["num_turns"] == 3 and rows["agent-1"]["error"] is None
    rollouts = [r for g in read_groups(record / "groups.vfmm") for r in unpack_group(g)]
    assert sorted(r.example_id for r in rollouts) == ["agent-1", "agent-2"]
    # each group has the id a trainer deduplicates by, unique in the recording
    assert sorted(r.group_id for r in rollouts) == ["agent-1/0", "agent-2/0"]
    (agent_1,) = [r for r in rollouts if r.example_id == "agent-1"]
    steps = agent_1.trajectory
    assert len(steps) == 3
    for before, after in itertools.pairwise(steps):
        previous = [*before.tokens.prompt_ids, *before.tokens.completion_ids]
        assert after.tokens.prompt_ids[: len(previous)] == previous
    assert len(steps[-1].tokens.multi_modal_data.mm_hashes["image"]) == 3
    from vf_mm.cli import main

    assert main(["view", str(record), "-o", str(tmp_path / "view.html")]) == 0
    assert "agent-1" in (tmp_path / "view.html").read_text()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--backend", "vllm", "--record", "rec"], "--backend vllm needs -b URL and --record DIR"),
        (
            ["--backend", "vllm", "-b", "http://127.0.0.1:9"],
            "--backend vllm needs -b URL and --record DIR",
        ),
        (["-b", "http://127.0.0.1:9"], "-b is for --backend vllm"),
    ],
)
def test_serve_arguments_that_do_not_go_together_exit_2(extra, message, checkpoint, capsys):
    from vf_mm.cli import main

    assert main(["serve", "--model", str(checkpoint), *extra]) == 2
    assert message in capsys.readouterr().err


def test_model_embedded_serves_the_embedded_tiny_model_under_that_name(monkeypatch):
    """``--model embedded``: the embedded tiny model, which clients name ``embedded``."""
    import asyncio

    import uvicorn

    from vf_mm.cli import main

    answers = []

    def serve(app, **options):  # uvicorn.run, in process: ask the app, then stop
        async def ask():
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
                models = (await http.get("/v1/models")).json()
                body = {"model": "embedded", "max_tokens": 2,
                        "messages": [{"role": "user", "content": "hi"}]}  # fmt: skip
                chat = await http.post("/v1/chat/completions", json=body)
                return models, chat.status_code

        answers.append(asyncio.run(ask()))

    monkeypatch.setattr(uvicorn, "run", serve)
    assert main(["serve", "--model", "embedded", "--log-level", "warning"]) == 0
    ((models, status),) = answers
    assert [m["id"] for m in models["data"]] == ["embedded"] and status == 200


def test_model_embedded_next_to_a_folder_of_that_name_is_refused(tmp_path, monkeypatch, capsys):
    from vf_mm.cli import main

    (tmp_path / "embedded").mkdir()
    monkeypatch.chdir(tmp_path)
    assert main(["serve", "--model", "embedded"]) == 2
    assert "write ./embedded to serve that folder" in capsys.readouterr().err


def serve_in_process(monkeypatch: pytest.MonkeyPatch, bodies: list[dict]) -> None:
    """``vf-mm serve --record`` runs in this process, its HTTP server replaced by one that
    sends ``bodies`` (session "a") through the app and then stops, as SIGINT would."""
    import vf_mm.cli._serve as serve_command

    class Server:
        def __init__(self, config) -> None:
            self.app = config.app

        async def serve(self) -> None:
            transport = httpx.ASGITransport(app=self.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://serve") as http:
                for body in bodies:
                    done = await http.post("/v1/chat/completions", json=body,
                                           headers={"X-Session-ID": "a"})  # fmt: skip
                    assert done.status_code == 200, done.text

    monkeypatch.setattr(serve_command, "_stoppable_server_class", lambda: Server)


def test_a_recording_resumed_in_its_dir_goes_on_counting_and_appends(
    checkpoint, tmp_path, monkeypatch
):
    """A second run on the same DIR goes on counting the session's index and appends its
    group: the first run's groups are not overwritten, and every id stays unique."""
    from vf_mm.cli import main

    record = tmp_path / "rec"
    body = {"model": str(checkpoint), "messages": [user(0)], "max_tokens": 2}
    for _ in range(2):
        serve_in_process(monkeypatch, [body])
        assert main(["serve", "--model", str(checkpoint), "--record", str(record)]) == 0
    groups = list(read_groups(record / "groups.vfmm"))
    assert [g["group_id"] for g in groups] == ["a/0", "a/1"]
    assert sorted(r["rollout_index"] for r in read_results(record)) == [0, 1]


@pytest.mark.slow  # two server processes; the test above makes the claim in one process
@pytest.mark.timeout(300)
def test_a_recording_resumed_in_its_dir_keeps_the_groups_it_sent_before(checkpoint, tmp_path):
    """A second server on the same DIR goes on counting the session's index and appends
    its group: the first run's groups are not overwritten, and every id stays unique."""
    record = tmp_path / "rec"
    for _ in range(2):
        server, base = start_recording(checkpoint, record)
        try:
            done = httpx.post(f"{base}/v1/chat/completions", headers={"X-Session-ID": "a"},
                              json={"model": str(checkpoint), "messages": [user(0)],
                                    "max_tokens": 2}, timeout=60)  # fmt: skip
            assert done.status_code == 200, done.text
        finally:
            server.send_signal(signal.SIGINT)
            server.wait(60)
    groups = list(read_groups(record / "groups.vfmm"))
    assert [g["group_id"] for g in groups] == ["a/0", "a/1"]
    assert sorted(r["rollout_index"] for r in read_results(record)) == [0, 1]
