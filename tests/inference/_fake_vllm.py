"""A stand-in for ``vllm serve``, started by ``VLLMServers`` in tests (``command``).

    python _fake_vllm.py --model M --host H --port P [any other flags]

It prints its arguments and ``CUDA_VISIBLE_DEVICES`` (into the server's log), starts one
child process in its own process group (as vLLM starts its engine process) and prints
``child pid N``, then serves ``GET /health``, ``GET /v1/models`` and ``POST
/inference/v1/generate`` (``_faulty_server.fake_generate``: the completion is the
prompt's last 3 tokens), printing ``generate`` for each. Environment variables:

- ``FAKE_VLLM_EXIT_CODE``: exit with that code at once (a server that fails to start);
- ``FAKE_VLLM_READY_FILE``: ``/health`` answers 503 until that file exists;
- ``FAKE_VLLM_IGNORE_TERM``: ignore SIGTERM (only SIGKILL stops it).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.inference._faulty_server import fake_generate  # noqa: E402

#: the child: sleeps until stopped (ignoring SIGTERM too when its parent does)
CHILD = """
import os, signal, time
if os.environ.get("FAKE_VLLM_IGNORE_TERM"):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
time.sleep(1e6)
"""


_SAY = threading.Lock()


def say(line: str) -> None:
    """One whole line in the log: the handler threads' lines never interleave (``print``
    writes the text and its newline apart, so two threads could log "generategenerate")."""
    with _SAY:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def _arg(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


class Handler(BaseHTTPRequestHandler):
    model = "fake"

    def log_message(self, *args: object) -> None:  # quiet: the log holds what tests read
        pass

    def _send(self, status: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/health":
            ready = os.environ.get("FAKE_VLLM_READY_FILE")
            self._send(200 if not ready or os.path.exists(ready) else 503, {})
        elif self.path == "/v1/models":
            self._send(200, {"data": [{"id": self.model, "max_model_len": 8192}]})
        else:
            self._send(404, {"error": {"message": "not found"}})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path != "/inference/v1/generate":
            self._send(404, {"error": {"message": "not found"}})
            return
        say("generate")
        self._send(200, fake_generate(body, expand=4))


def main() -> None:
    argv = sys.argv[1:]
    print("pid", os.getpid(), flush=True)
    print("argv", json.dumps(argv), flush=True)
    print("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES", "(unset)"), flush=True)
    code = os.environ.get("FAKE_VLLM_EXIT_CODE")
    if code:
        print("failing to start, as asked", flush=True)
        sys.exit(int(code))
    if os.environ.get("FAKE_VLLM_IGNORE_TERM"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child = subprocess.Popen([sys.executable, "-c", CHILD])  # vLLM's engine process, in our group
    print("child pid", child.pid, flush=True)
    Handler.model = _arg(argv, "--model")
    server = ThreadingHTTPServer((_arg(argv, "--host"), int(_arg(argv, "--port"))), Handler)
    server.serve_forever()


if __name__ == "__main__":
    main()
