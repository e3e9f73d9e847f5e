"""``VLLMServers`` (vf_mm/inference/_spawn.py) with a stand-in for ``vllm serve``.

``_fake_vllm.py`` takes vLLM's place (the same ``command`` a real server gets): it logs
its arguments and GPUs, starts a child in its process group as vLLM starts its engine,
and answers ``/health``. The tests wait on conditions (a file, a pipe, a process state),
never on elapsed time.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from vf_mm.errors import BackendUnavailableError, MissingDependencyError
from vf_mm.inference import VLLMServers, server_flags, vllm_command
from vf_mm.inference._spawn import _devices, _ephemeral_start, _free_ports

HERE = Path(__file__).resolve().parent
FAKE = [sys.executable, str(HERE / "_fake_vllm.py")]
PARENT = HERE / "_spawn_parent.py"
#: the longest any test waits for a condition before it fails (never reached when all is well)
PATIENCE_S = 60.0


def alive(pid: int) -> bool:
    """A process that exists and is not a zombie (a zombie holds nothing)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except FileNotFoundError:
        return False
    return stat[stat.rfind(b")") + 2 :].split()[0] not in (b"Z", b"X")


def children(servers: VLLMServers) -> list[int]:
    return [
        int(line.split()[-1])
        for path in servers.log_paths
        for line in path.read_text().splitlines()
        if line.startswith("child pid")
    ]


def wait_for(condition, what: str) -> None:
    deadline = time.monotonic() + PATIENCE_S
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"still waiting for {what} after {PATIENCE_S:g} s")
        time.sleep(0.02)


def logged(servers: VLLMServers, i: int) -> dict[str, str]:
    lines = servers.log_paths[i].read_text().splitlines()
    fields = dict(line.split(" ", 1) for line in lines if not line.startswith("#"))
    return {**fields, "header": lines[0]}


def fake_servers(tmp_path: Path, n: int = 2, **kwargs) -> VLLMServers:
    kwargs.setdefault("gpus_per_server", 0)
    return VLLMServers("/models/tiny", n, command=FAKE, log_dir=tmp_path / "logs", **kwargs)


pytestmark = pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc (Linux)")


# -- the flags -------------------------------------------------------------------------------


def test_server_flags_add_what_vllm_backend_needs() -> None:
    assert server_flags() == ["--enable-scale-out", "--no-mm-device-do-normalize"]
    assert server_flags(mode="content_parts") == ["--enable-scale-out"]
    assert server_flags(limit_mm_per_prompt={"image": 8, "video": 0}, gpus_per_server=2) == [
        "--enable-scale-out",
        "--no-mm-device-do-normalize",
        "--limit-mm-per-prompt",
        '{"image":8,"video":0}',
        "--tensor-parallel-size",
        "2",
    ]


def test_server_flags_leave_what_the_caller_set() -> None:
    extra = ["--tokens-only", "--no-mm-device-do-normalize", "--tensor-parallel-size=4"]
    assert server_flags(gpus_per_server=4, extra_args=extra) == []


@pytest.mark.parametrize(
    ("extra", "kwargs", "match"),
    [
        (["--port", "8000"], {}, "--port"),
        (["--model=x"], {}, "--model"),
        (["--mm-device-do-normalize"], {}, "second time"),
        (["--limit-mm-per-prompt", "{}"], {"limit_mm_per_prompt": {"image": 1}}, "twice"),
        ([], {"mode": "pixels"}, "mode"),
    ],
)
def test_server_flags_refuse_what_would_break_the_backend(extra, kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        server_flags(extra_args=extra, **kwargs)


def test_each_server_gets_its_own_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert _devices(2, 2, None) == ["0,1", "2,3"]
    assert _devices(3, 0, None) == [None, None, None]
    assert _devices(2, 1, ["7", 5]) == ["7", "5"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    assert _devices(2, 2, None) == ["4,5", "6,7"]
    with pytest.raises(ValueError, match="need 6 GPUs, but only 4"):
        _devices(3, 2, None)


def test_the_command_comes_from_the_environment_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VF_MM_VLLM_COMMAND", "/opt/venv/bin/python -m 'vllm.entrypoints.x'")
    assert vllm_command() == ["/opt/venv/bin/python", "-m", "vllm.entrypoints.x"]
    monkeypatch.delenv("VF_MM_VLLM_COMMAND")
    monkeypatch.setenv("PATH", "")
    try:
        command = vllm_command()
    except MissingDependencyError as exc:
        assert "VF_MM_VLLM_COMMAND" in str(exc)
    else:  # this interpreter has vLLM
        assert command == [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]


# -- start, health, logs, stop ---------------------------------------------------------------


def test_servers_start_healthy_with_their_flags_gpus_and_logs(tmp_path: Path) -> None:
    import httpx

    servers = fake_servers(
        tmp_path, gpus_per_server=1, gpus=["3", "5"], extra_args=["--max-num-seqs", "8"]
    )
    with servers:
        assert len(set(servers.base_urls)) == 2
        for url in servers.base_urls:
            assert httpx.get(url + "/health", trust_env=False).status_code == 200
        for i, (port, gpu) in enumerate(zip(servers.ports, ["3", "5"], strict=True)):
            log = logged(servers, i)
            argv = json.loads(log["argv"])
            assert argv == [
                "--model", "/models/tiny", "--host", "127.0.0.1", "--port", str(port),
                "--enable-scale-out", "--no-mm-device-do-normalize", "--max-num-seqs", "8",
            ]  # fmt: skip
            assert log["CUDA_VISIBLE_DEVICES"] == gpu
            assert log["header"].startswith("# vf-mm: ") and "--max-num-seqs 8" in log["header"]
        assert servers.log_paths == [tmp_path / "logs" / f"server-{i}.log" for i in range(2)]
        pids = [*servers.pids, *children(servers)]
        assert len(pids) == 4 and all(alive(p) for p in pids)
    # the block is over: every server and its child are gone, and the watchdog with them
    assert not any(alive(p) for p in pids)
    assert servers.exit_codes() == [-signal.SIGTERM, -signal.SIGTERM]
    servers.stop()  # again: nothing to do


def test_progress_is_reported_until_every_server_is_healthy(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    seen: list[tuple[int, int]] = []

    def progress(done: int, total: int, elapsed_s: float) -> None:
        seen.append((done, total))
        ready.touch()  # the servers turn healthy once the first report is in

    with fake_servers(tmp_path, env={"FAKE_VLLM_READY_FILE": str(ready)}, on_progress=progress):
        pass
    assert seen[0] == (0, 2) and seen[-1] == (2, 2)
    assert all(total == 2 for _, total in seen)


def test_a_server_that_exits_first_fails_the_start_with_its_log(tmp_path: Path) -> None:
    servers = fake_servers(tmp_path, env={"FAKE_VLLM_EXIT_CODE": "3"})
    with pytest.raises(BackendUnavailableError, match="exited with code 3") as info, servers:
        pytest.fail("the block must not run")
    assert "failing to start, as asked" in str(info.value)  # the end of its log
    # both servers exit; the one the start saw first (either, on a busy machine) is named
    named = [str(p) for i, p in enumerate(servers.log_paths) if f"server {i} " in str(info.value)]
    assert len(named) == 1 and named[0] in str(info.value)
    assert not any(alive(p) for p in [*servers.pids, *children(servers)])


def test_a_start_that_takes_too_long_stops_every_server(tmp_path: Path) -> None:
    never = tmp_path / "never"
    servers = fake_servers(
        tmp_path, env={"FAKE_VLLM_READY_FILE": str(never)}, startup_timeout_s=0.2
    )
    with pytest.raises(BackendUnavailableError, match=r"not healthy after 0\.2 s"), servers:
        pass
    assert len(servers.pids) == 2
    assert not any(alive(p) for p in [*servers.pids, *children(servers)])


def test_a_server_that_ignores_sigterm_is_killed(tmp_path: Path) -> None:
    servers = fake_servers(tmp_path, n=1, env={"FAKE_VLLM_IGNORE_TERM": "1"}, stop_timeout_s=0.3)
    with servers:
        pids = [*servers.pids, *children(servers)]
    assert not any(alive(p) for p in pids)
    assert servers.exit_codes() == [-signal.SIGKILL]


# -- the parent ends from outside ----------------------------------------------------------


def _start_parent(tmp_path: Path) -> tuple[subprocess.Popen[str], dict[str, list[int] | int]]:
    parent = subprocess.Popen(
        [sys.executable, str(PARENT), str(tmp_path / "logs"), "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # Ctrl-C's default, whatever this process inherited (a pytest-xdist worker ignores
        # SIGINT, and an ignored signal stays ignored across exec)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    line = parent.stdout.readline()  # type: ignore[union-attr]
    if not line:
        parent.kill()
        pytest.fail(f"the parent ended before its servers were up: {parent.stderr.read()}")  # type: ignore[union-attr]
    return parent, json.loads(line)


def _caused(pids: dict[str, list[int] | int]) -> list[int]:
    return [*pids["servers"], *pids["children"], pids["watchdog"]]  # type: ignore[misc]


def test_ctrl_c_stops_the_servers_before_the_parent_exits(tmp_path: Path) -> None:
    parent, pids = _start_parent(tmp_path)
    assert all(alive(p) for p in _caused(pids))
    parent.send_signal(signal.SIGINT)
    parent.wait(timeout=PATIENCE_S)
    assert "KeyboardInterrupt" in parent.stderr.read()  # type: ignore[union-attr]
    # stopped by the `with` block's exit, before the parent was gone
    assert not any(alive(p) for p in _caused(pids))


def test_kill_9_of_the_parent_leaves_no_orphan(tmp_path: Path) -> None:
    parent, pids = _start_parent(tmp_path)
    assert all(alive(p) for p in _caused(pids))
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait(timeout=PATIENCE_S)
    wait_for(lambda: not any(alive(p) for p in _caused(pids)), "the watchdog to stop the servers")


# -- ports -------------------------------------------------------------------------------------


def test_free_ports_are_distinct_bindable_and_below_the_ephemeral_range() -> None:
    ports = _free_ports("127.0.0.1", 8)
    assert len(set(ports)) == 8
    assert all(20000 <= p < _ephemeral_start() for p in ports)  # never a bind(0) or client port
    for port in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_a_server_whose_port_another_program_answers_on_fails_the_start(tmp_path: Path) -> None:
    """The other program answers /health for it; the server itself exits (port in use)."""

    class Healthy(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    squatter = HTTPServer(("127.0.0.1", _free_ports("127.0.0.1", 1)[0]), Healthy)
    threading.Thread(target=squatter.serve_forever, daemon=True).start()
    try:
        servers = fake_servers(tmp_path, n=1, base_port=squatter.server_address[1])
        with pytest.raises(BackendUnavailableError, match="another program on its port"), servers:
            pytest.fail("the block must not run")
    finally:
        squatter.shutdown()
        squatter.server_close()
    assert not any(alive(p) for p in [*servers.pids, *children(servers)])
