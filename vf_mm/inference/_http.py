"""The HTTP/1.1 transport the vLLM backend sends its requests through.

``KeepAliveTransport`` is an ``httpx.AsyncBaseTransport``: ``httpx.AsyncClient`` keeps
its API (timeouts, headers, errors, ``MockTransport`` in tests) and this sends the bytes.
A rollout worker posts many requests a second to a few servers, with as many in flight as
it has rollouts. httpcore's pool checks every pooled connection (a ``select`` and a
``getpeername`` each) whenever a request starts or ends, so its cost per request grows
with the requests in flight: on a 2-core machine, 1.8 ms of CPU a request alone and
5.5 ms at 32 in flight, where the same exchange on asyncio streams costs 0.15 ms. Every
millisecond there delays the rollout's next turn while the GPU waits.

What it does:

- ``http://`` origins only; anything else (``https://``) goes to ``fallback`` (httpx's
  own transport), so TLS, proxies and certificates keep httpx's behaviour.
- One asyncio stream per request in flight, parsed by h11. A finished exchange returns
  its connection to the origin's idle list (at most ``max_idle`` per origin, each for
  ``keepalive_expiry_s``); a connection the server closed or said to close is dropped,
  and asyncio has already seen its end of file, so reuse costs no system call; each
  release also closes the oldest idle connections that expired or were closed.
- No cap on connections: one per request in flight (the caller bounds what it sends).
- Timeouts from the request's ``timeout`` extension (connect, read, write: httpx's
  ``Timeout``); none set means no limit.
- Errors are httpx's (``ConnectError``, ``ConnectTimeout``, ``ReadTimeout``,
  ``WriteTimeout``, ``ReadError``, ``WriteError``, ``RemoteProtocolError``), so callers
  handle them as they would httpcore's. A request is never sent twice: a reused
  connection the server closed under it fails like any dropped connection, and the
  caller's retry policy decides.
- The whole answer is read before ``handle_async_request`` returns (the backend reads
  every answer whole); a cancelled or failed exchange closes its connection.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Any

import h11
import httpx

__all__ = ["KeepAliveTransport"]

_READ_CHUNK = 1 << 16


@dataclass(eq=False)
class _Connection:
    """One open stream, idle or in use, with its h11 state machine."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    h11: h11.Connection = field(default_factory=lambda: h11.Connection(h11.CLIENT))
    idle_since: float = 0.0

    def reusable(self, now: float, expiry_s: float) -> bool:
        """Whether an idle connection may carry the next request: not expired, not closed
        by either side (the loop has already read an end of file the server sent)."""
        return (
            now - self.idle_since < expiry_s
            and not self.reader.at_eof()
            and not self.writer.is_closing()
        )

    def close(self) -> None:
        self.writer.close()


class KeepAliveTransport(httpx.AsyncBaseTransport):
    """Plain-HTTP/1.1 requests over pooled asyncio streams (the module docstring says why
    and how).

    Args:
        max_idle: Idle connections kept per origin (more in flight are opened as needed
            and closed when they finish).
        keepalive_expiry_s: An idle connection older than this is closed, not reused.
        fallback: The transport for origins that are not ``http://``; ``None`` builds
            ``httpx.AsyncHTTPTransport(trust_env=False)`` when one is first needed.
    """

    def __init__(
        self,
        *,
        max_idle: int = 1024,
        keepalive_expiry_s: float = 60.0,
        fallback: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        if max_idle < 0:
            raise ValueError(f"max_idle must be >= 0, got {max_idle}")
        if keepalive_expiry_s <= 0:
            raise ValueError(f"keepalive_expiry_s must be > 0, got {keepalive_expiry_s}")
        self.max_idle = max_idle
        self.keepalive_expiry_s = keepalive_expiry_s
        self._fallback = fallback
        self._idle: defaultdict[tuple[str, int], deque[_Connection]] = defaultdict(deque)
        self._busy: set[_Connection] = set()
        self.opened = 0  # connections opened so far (tests and benchmarks read it)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send ``request`` and read its whole answer.

        Args:
            request: What httpx's client built (its ``timeout`` extension is obeyed).

        Returns:
            The answer, its body already read.

        Raises:
            httpx.TransportError: httpx's own kinds: ``ConnectError``, ``ConnectTimeout``,
                ``WriteError``, ``WriteTimeout``, ``ReadError``, ``ReadTimeout``,
                ``RemoteProtocolError``.
        """
        url = request.url
        if url.scheme != "http":
            if self._fallback is None:
                self._fallback = httpx.AsyncHTTPTransport(trust_env=False)
            return await self._fallback.handle_async_request(request)
        timeouts: dict[str, Any] = request.extensions.get("timeout", {})
        origin = (url.host, url.port or 80)
        body = await request.aread()
        connection = self._idle_connection(origin) or await self._open(origin, request, timeouts)
        self._busy.add(connection)
        done = False
        try:
            response = await self._exchange(connection, request, body, timeouts)
            done = True
        finally:
            self._busy.discard(connection)
            if not done:
                connection.close()
        self._release(origin, connection)
        return response

    async def aclose(self) -> None:
        """Close every connection, idle or in use, and the fallback transport."""
        for connections in self._idle.values():
            for connection in connections:
                connection.close()
        self._idle.clear()
        for connection in self._busy:
            connection.close()
        self._busy.clear()
        if self._fallback is not None:
            await self._fallback.aclose()

    # -- connections ----------------------------------------------------------------------

    def _idle_connection(self, origin: tuple[str, int]) -> _Connection | None:
        idle = self._idle.get(origin)
        now = time.monotonic()
        while idle:
            connection = idle.pop()  # the most recent: least likely to have expired
            if connection.reusable(now, self.keepalive_expiry_s):
                return connection
            connection.close()
        return None

    async def _open(
        self, origin: tuple[str, int], request: httpx.Request, timeouts: dict[str, Any]
    ) -> _Connection:
        host, port = origin
        try:
            async with asyncio.timeout(timeouts.get("connect")):
                reader, writer = await asyncio.open_connection(host, port, limit=_READ_CHUNK)
        except TimeoutError as exc:
            raise httpx.ConnectTimeout(
                f"connecting to {host}:{port} timed out", request=request
            ) from exc
        except OSError as exc:
            raise httpx.ConnectError(f"{exc}", request=request) from exc
        self.opened += 1
        return _Connection(reader, writer)

    def _release(self, origin: tuple[str, int], connection: _Connection) -> None:
        state = connection.h11
        if state.our_state is h11.DONE and state.their_state is h11.DONE:
            state.start_next_cycle()
            idle = self._idle[origin]
            now = time.monotonic()
            while idle and not idle[0].reusable(now, self.keepalive_expiry_s):
                idle.popleft().close()  # the oldest first: expired, or closed by the server
            if len(idle) < self.max_idle:
                connection.idle_since = time.monotonic()
                idle.append(connection)
                return
        connection.close()

    # -- one exchange ---------------------------------------------------------------------

    async def _exchange(
        self,
        connection: _Connection,
        request: httpx.Request,
        body: bytes,
        timeouts: dict[str, Any],
    ) -> httpx.Response:
        state = connection.h11
        target = request.url.raw_path
        headers = list(request.headers.raw)
        try:  # the body is passed through, not copied
            events: list[h11.Event] = [
                h11.Request(method=request.method, target=target, headers=headers)
            ]
            if body:
                events.append(h11.Data(data=body))
            events.append(h11.EndOfMessage())
            data = [b for e in events for b in state.send_with_data_passthrough(e) or ()]
        except h11.LocalProtocolError as exc:
            raise httpx.LocalProtocolError(str(exc), request=request) from exc
        try:
            connection.writer.writelines(data)
            async with asyncio.timeout(timeouts.get("write")):
                await connection.writer.drain()
        except TimeoutError as exc:
            raise httpx.WriteTimeout("sending the request timed out", request=request) from exc
        except OSError as exc:
            raise httpx.WriteError(f"{exc}", request=request) from exc

        head: h11.Response | None = None
        chunks: list[bytes] = []
        read_timeout = timeouts.get("read")
        while True:
            try:
                event = state.next_event()
            except h11.RemoteProtocolError as exc:
                raise httpx.RemoteProtocolError(str(exc), request=request) from exc
            if event is h11.NEED_DATA:
                try:
                    async with asyncio.timeout(read_timeout):
                        received = await connection.reader.read(_READ_CHUNK)
                except TimeoutError as exc:
                    raise httpx.ReadTimeout(
                        "reading the answer timed out", request=request
                    ) from exc
                except OSError as exc:
                    raise httpx.ReadError(f"{exc}", request=request) from exc
                if not received and head is None:
                    raise httpx.RemoteProtocolError(
                        "the server closed the connection without sending an answer",
                        request=request,
                    )
                state.receive_data(received)  # b"" is the end of file
            elif isinstance(event, h11.Response):
                head = event
            elif isinstance(event, h11.InformationalResponse):
                continue  # 100 Continue and the like: the real answer follows
            elif isinstance(event, h11.Data):
                chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                break
            elif event is h11.PAUSED:  # a protocol switch (101, CONNECT): not ours to serve
                raise httpx.UnsupportedProtocol(
                    "the server switched protocols; this transport speaks HTTP/1.1 only",
                    request=request,
                )
            elif isinstance(event, h11.ConnectionClosed):
                raise httpx.RemoteProtocolError(
                    "the server closed the connection in the middle of its answer",
                    request=request,
                )
        assert head is not None
        return httpx.Response(
            head.status_code,
            headers=list(head.headers),
            stream=httpx.ByteStream(b"".join(chunks)),
            extensions={"http_version": b"HTTP/1.1", "reason_phrase": head.reason},
            request=request,
        )
