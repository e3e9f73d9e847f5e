"""``ServerGuard``: what ``vf-mm serve`` checks before a request reaches a route.

An ASGI middleware around the app, so every route gets the same checks and none can
forget one:

- **API keys** (``api_keys``, vLLM's ``--api-key`` semantics): every route but
  ``/health`` needs ``Authorization: Bearer KEY``; a missing or wrong key is 401 in the
  OpenAI error format. The key is compared with every configured key by
  ``hmac.compare_digest`` (constant time, and every key is compared whichever matches),
  never logged and never echoed. The matching key's *tag* (a short hash of it, not the
  key) goes into ``scope["state"]["api_key_tag"]``: the recording keeps each key's
  sessions apart by it.
- **Body size** (``max_body_bytes``): a ``Content-Length`` over the limit is 413 before
  a byte of the body is read; a body without one (chunked) is counted as it arrives and
  refused the moment it passes the limit, so it is never held whole.
- **A slow body** (``body_timeout_s``): each chunk of the body must arrive within this
  many seconds of the previous one, else 408: a client that trickles a body cannot hold
  a request open for ever.
- **Connections per client** (``max_requests_per_client``): requests in flight from one
  client address; one more is 429 at once, and other clients go on undisturbed.

Each refusal is the OpenAI / vLLM error body (``_server_errors``) with the limit named,
and a typed ``type``: ``AuthenticationError``, ``RequestTooLargeError``,
``RequestTimeoutError``, ``TooManyRequestsError``.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

#: routes that answer without a key (a load balancer's health check holds none)
OPEN_PATHS = frozenset({"/health"})


@dataclass(frozen=True, slots=True)
class ServerLimits:
    """What one request may cost ``vf-mm serve`` (each refusal names the limit).

    Attributes:
        max_body_bytes: A request body's size.
        max_images: Images and clips in one request.
        max_request_tokens: A prompt's tokens (None: the model's context).
        body_timeout_s: The longest wait for the next chunk of a body.
        max_requests_per_client: Requests in flight from one client address.
    """

    max_body_bytes: int = 256 << 20
    max_images: int = 64
    max_request_tokens: int | None = None
    body_timeout_s: float = 60.0
    max_requests_per_client: int = 256

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_images", "max_requests_per_client"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if self.max_request_tokens is not None and self.max_request_tokens < 1:
            raise ValueError(
                f"max_request_tokens must be >= 1 or None, got {self.max_request_tokens!r}"
            )
        if not self.body_timeout_s > 0:
            raise ValueError(f"body_timeout_s must be > 0, got {self.body_timeout_s!r}")


def key_tag(key: str) -> str:
    """A short name for an API key that does not reveal it (sessions are kept apart by it)."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:12]


class ServerGuard:
    """The checks of the module docstring, around ``app``."""

    def __init__(
        self, app: Any, *, api_keys: Sequence[str] = (), limits: ServerLimits | None = None
    ) -> None:
        keys = [k for k in api_keys if k]
        if len(keys) != len(api_keys):
            raise ValueError("an API key must not be empty")
        self.app = app
        self.limits = limits or ServerLimits()
        self._keys = [(k.encode("utf-8"), key_tag(k)) for k in keys]
        self._in_flight: Counter[str] = Counter()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        scope.setdefault("state", {})
        if self._keys and scope["path"] not in OPEN_PATHS:
            tag = self._authorized(scope)
            if tag is None:
                await _refuse(send, HTTPStatus.UNAUTHORIZED, "AuthenticationError",
                              "Unauthorized: send Authorization: Bearer <API key>")  # fmt: skip
                return
            scope["state"]["api_key_tag"] = tag
        limits = self.limits
        length = _content_length(scope)
        if length is not None and length > limits.max_body_bytes:
            await _refuse(send, HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "RequestTooLargeError",
                          f"the body is {length} bytes; this server takes at most "
                          f"{limits.max_body_bytes} (--max-body-mb)")  # fmt: skip
            return
        client = (scope.get("client") or ("?", 0))[0]
        if self._in_flight[client] >= limits.max_requests_per_client:
            await _refuse(send, HTTPStatus.TOO_MANY_REQUESTS, "TooManyRequestsError",
                          f"{limits.max_requests_per_client} requests of this client are in "
                          "flight already (--max-requests-per-client)")  # fmt: skip
            return
        self._in_flight[client] += 1
        try:
            body = await self._read_body(receive, send)
            if body is None:
                return  # refused, or the client went away
            replayed = False

            async def replay() -> Any:
                nonlocal replayed
                if not replayed:
                    replayed = True
                    return {"type": "http.request", "body": body, "more_body": False}
                return await receive()  # what comes after the body (a disconnect)

            await self.app(scope, replay, send)
        finally:
            self._in_flight[client] -= 1
            if not self._in_flight[client]:
                del self._in_flight[client]

    async def _read_body(self, receive: Any, send: Any) -> bytes | None:
        """The whole body, read here under the limits (then handed to the app), or None
        once a refusal is sent: a body over the limit is never held whole, and a body that
        trickles in is cut off."""
        limits = self.limits
        chunks: list[bytes] = []
        size = 0
        while True:
            try:
                # a timer per chunk; asyncio.wait_for would start a task per chunk (a
                # megabyte body comes in ~16 of them)
                async with asyncio.timeout(limits.body_timeout_s):
                    message = await receive()
            except TimeoutError:
                await _refuse(send, HTTPStatus.REQUEST_TIMEOUT, "RequestTimeoutError",
                              f"no part of the body arrived for {limits.body_timeout_s:g} s "
                              "(--body-timeout-s)")  # fmt: skip
                return None
            if message["type"] != "http.request":  # http.disconnect
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limits.max_body_bytes:
                await _refuse(send, HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "RequestTooLargeError",
                              f"the body passed {limits.max_body_bytes} bytes, the most this "
                              "server takes (--max-body-mb)")  # fmt: skip
                return None
            if chunk:
                chunks.append(chunk)
            if not message.get("more_body", False):
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def _authorized(self, scope: dict[str, Any]) -> str | None:
        """The tag of the key the request carries, or None (compared with every key)."""
        token = b""
        for name, value in scope.get("headers", ()):
            if name.lower() == b"authorization":
                scheme, _, rest = value.partition(b" ")
                token = rest.strip() if scheme.lower() == b"bearer" else b""
                break
        found = None
        for key, tag in self._keys:
            if hmac.compare_digest(token, key) and found is None:
                found = tag
        return found


def _content_length(scope: dict[str, Any]) -> int | None:
    for name, value in scope.get("headers", ()):
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _refuse(send: Any, status: HTTPStatus, err_type: str, message: str) -> None:
    body = json.dumps(
        {"error": {"message": message, "type": err_type, "param": None, "code": status.value}}
    ).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == HTTPStatus.UNAUTHORIZED:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": status.value, "headers": headers})
    await send({"type": "http.response.body", "body": body})
