"""A scripted, fault-injecting fake of vLLM's ``/inference/v1/generate`` for tests.

A real HTTP/1.1 server (raw asyncio, keep-alive) on 127.0.0.1 and a free port, running
its own event loop in a background thread, so a test's client loop never shares it.
Each ``POST /inference/v1/generate`` takes the next action from ``script`` (or
``default`` when the script is empty):

- ``ok()``: a fake generation: the completion is the (expanded) prompt's last 3 tokens
  (cut to ``max_tokens``), logprobs ``-0.1 * (j + 1)`` in vLLM 0.32's shape, ``usage``;
  with ``return_token_ids`` every image pad of the prompt is expanded to ``expand`` pads
  and ``prompt_token_ids`` / ``mm_placeholders`` come back.
- ``status(code, body, headers)``: an error status with a JSON (dict) or text body.
- ``sleep(seconds, then)``: wait, then do ``then``; gives up early (and records a
  disconnect) when the client closes the connection.
- ``cut()``: a 200 with its headers and half the body, then the connection is closed.
- ``drop()``: close the connection without answering.
- ``malformed()``: a 200 whose body is not JSON.
- ``json_body(obj)``: a 200 with any JSON (missing fields, wrong types).

``GET /v1/models`` answers ``{"data": [{"id", "max_model_len"}]}`` (or
``models_status``). Every request is recorded (``requests``; ``generate_bodies``).
``down_url()`` is a URL where nothing listens.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

GENERATE = "/inference/v1/generate"
IMAGE_PAD = 151655

_REASONS = {
    200: "OK",
    400: "Bad Request",
    403: "Forbidden",
    404: "Not Found",
    408: "Request Timeout",
    429: "Too Many Requests",
    500: "Internal Server Error",
    501: "Not Implemented",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}


# -- actions ----------------------------------------------------------------------------


def ok() -> dict[str, Any]:
    return {"kind": "ok"}


def status(code: int, body: Any = None, headers: dict[str, str] | None = None) -> dict[str, Any]:
    if body is None:
        body = {"error": {"message": f"fake error {code}", "type": "Error", "code": code}}
    return {"kind": "status", "code": code, "body": body, "headers": headers or {}}


def sleep(seconds: float, then: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"kind": "sleep", "seconds": seconds, "then": then or ok()}


def cut() -> dict[str, Any]:
    return {"kind": "cut"}


def drop() -> dict[str, Any]:
    return {"kind": "drop"}


def malformed() -> dict[str, Any]:
    return {"kind": "malformed"}


def json_body(obj: Any) -> dict[str, Any]:
    return {"kind": "json", "obj": obj}


def down_url() -> str:
    """http://127.0.0.1:PORT where nothing listens (the port was free a moment ago)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


# -- the fake generation ------------------------------------------------------------------


def fake_generate(body: dict[str, Any], *, expand: int) -> dict[str, Any]:
    token_ids = list(body["token_ids"])
    sampling = body.get("sampling_params", {})
    placeholders: list[dict[str, int]] = []
    if body.get("content_parts"):
        expanded: list[int] = []
        for token in token_ids:
            if token == IMAGE_PAD:
                placeholders.append({"offset": len(expanded), "length": expand})
                expanded.extend([IMAGE_PAD] * expand)
            else:
                expanded.append(token)
        token_ids = expanded
    max_tokens = int(sampling.get("max_tokens", 16))
    completion = token_ids[-3:][:max_tokens]
    finish = "length" if len(completion) >= max_tokens else "stop"
    choice: dict[str, Any] = {
        "index": 0,
        "token_ids": completion,
        "finish_reason": finish,
        "stop_reason": None,
        "logprobs": None,
        "routed_experts": None,
    }
    if sampling.get("logprobs") is not None:
        choice["logprobs"] = {
            "content": [
                {
                    "token_id": t,
                    "logprob": -0.1 * (j + 1),
                    "rank": 1,
                    "top_logprobs": [{"token_id": t, "logprob": -0.1 * (j + 1), "rank": 1}],
                }
                for j, t in enumerate(completion)
            ]
        }
    out: dict[str, Any] = {
        "request_id": f"generate-tokens-{body.get('request_id', 'x')}",
        "model": body.get("model") or "fake",
        "created": 0,
        "output_mode": "tokens",
        "choices": [choice],
        "usage": {
            "prompt_tokens": len(token_ids),
            "completion_tokens": len(completion),
            "total_tokens": len(token_ids) + len(completion),
        },
        "prompt_logprobs": None,
        "prompt_token_ids": None,
        "mm_placeholders": None,
    }
    if body.get("return_token_ids"):
        out["prompt_token_ids"] = token_ids
        out["mm_placeholders"] = {"image": placeholders} if placeholders else None
    return out


# -- the server -----------------------------------------------------------------------------


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    raw: bytes
    body: Any = None  # parsed JSON, when it was JSON


@dataclass
class FaultyServer:
    max_model_len: int | None = 64
    model: str = "fake-model"
    models_status: int = 200
    expand: int = 4
    default: dict[str, Any] = field(default_factory=ok)
    script: deque[dict[str, Any]] = field(default_factory=deque)
    requests: list[Recorded] = field(default_factory=list)
    active: int = 0
    max_active: int = 0
    answered: int = 0
    disconnects: int = 0

    def __post_init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._lock = threading.Lock()
        self.port = 0

    # -- control from the test ------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def push(self, *actions: dict[str, Any]) -> FaultyServer:
        with self._lock:
            self.script.extend(actions)
        return self

    @property
    def generate_bodies(self) -> list[Any]:
        return [r.body for r in self.requests if r.method == "POST" and r.path == GENERATE]

    @property
    def generate_count(self) -> int:
        return len(self.generate_bodies)

    def start(self) -> FaultyServer:
        ready = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)

            async def boot() -> None:
                self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
                self.port = self._server.sockets[0].getsockname()[1]

            loop.run_until_complete(boot())
            ready.set()
            loop.run_forever()
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

        self._thread = threading.Thread(target=run, name="faulty-server", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("the fake server did not start")
        return self

    def stop(self) -> None:
        loop = self._loop
        if loop is None or self._thread is None:
            return

        async def shutdown() -> None:
            assert self._server is not None
            self._server.close()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            await self._server.wait_closed()

        asyncio.run_coroutine_threadsafe(shutdown(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        self._thread.join(10)
        self._loop = None

    def __enter__(self) -> FaultyServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- serving ----------------------------------------------------------------------------

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            while True:
                request = await self._read_request(reader)
                if request is None:
                    return
                keep_open = await self._respond(request, reader, writer)
                if not keep_open:
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        except asyncio.CancelledError:
            # stop() cancels handlers; ending quietly keeps asyncio's connection_made
            # callback (Python 3.11) from logging the cancelled task as an error
            return
        finally:
            self._tasks.discard(task)
            with contextlib.suppress(Exception):
                writer.close()

    async def _read_request(self, reader: asyncio.StreamReader) -> Recorded | None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            return None
        lines = head.decode("latin-1").split("\r\n")
        method, path, _ = lines[0].split(" ", 2)
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0"))
        raw = await reader.readexactly(length) if length else b""
        body: Any = None
        if raw:
            with contextlib.suppress(ValueError):
                body = json.loads(raw)
        recorded = Recorded(method, path, headers, raw, body)
        self.requests.append(recorded)
        return recorded

    async def _write(
        self,
        writer: asyncio.StreamWriter,
        code: int,
        payload: bytes,
        headers: dict[str, str] | None = None,
        content_type: str = "application/json",
    ) -> None:
        head = [f"HTTP/1.1 {code} {_REASONS.get(code, 'Status')}"]
        head.append(f"Content-Type: {content_type}")
        head.append(f"Content-Length: {len(payload)}")
        for name, value in (headers or {}).items():
            head.append(f"{name}: {value}")
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + payload)
        await writer.drain()

    async def _respond(
        self, request: Recorded, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        if request.method == "GET" and request.path == "/v1/models":
            if self.models_status != 200:
                await self._write(writer, self.models_status, b'{"detail": "Not Found"}')
                return True
            entry: dict[str, Any] = {"id": self.model, "object": "model"}
            if self.max_model_len is not None:
                entry["max_model_len"] = self.max_model_len
            await self._write(writer, 200, json.dumps({"object": "list", "data": [entry]}).encode())
            return True
        if request.method != "POST" or request.path != GENERATE:
            await self._write(writer, 404, b'{"detail": "Not Found"}')
            return True
        with self._lock:
            action = self.script.popleft() if self.script else self.default
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        try:
            return await self._act(action, request, reader, writer)
        finally:
            self.active -= 1

    async def _act(
        self,
        action: dict[str, Any],
        request: Recorded,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> bool:
        kind = action["kind"]
        if kind == "sleep":
            watcher = asyncio.ensure_future(reader.read(1))
            done, _ = await asyncio.wait({watcher}, timeout=action["seconds"])
            if done:  # the client hung up (HTTP/1.1: it sends nothing while it waits)
                self.disconnects += 1
                return False
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            return await self._act(action["then"], request, reader, writer)
        if kind == "ok":
            payload = json.dumps(fake_generate(request.body, expand=self.expand)).encode()
            await self._write(writer, 200, payload)
            self.answered += 1
            return True
        if kind == "status":
            body = action["body"]
            if isinstance(body, (dict, list)):
                await self._write(
                    writer, action["code"], json.dumps(body).encode(), action["headers"]
                )
            else:
                await self._write(
                    writer, action["code"], str(body).encode(), action["headers"], "text/plain"
                )
            return True
        if kind == "json":
            await self._write(writer, 200, json.dumps(action["obj"]).encode())
            return True
        if kind == "malformed":
            await self._write(writer, 200, b'{"choices": [{"token_ids": [1, 2')
            return True
        if kind == "cut":
            payload = json.dumps(fake_generate(request.body, expand=self.expand)).encode()
            head = (
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(payload)}\r\n\r\n"
            )
            writer.write(head.encode("latin-1") + payload[: len(payload) // 2])
            await writer.drain()
            return False
        if kind == "drop":
            return False
        raise ValueError(f"unknown action {kind!r}")
