"""``KeepAliveTransport``: httpx's API over pooled asyncio streams, with httpx's errors.

A small asyncio server answers by path, so each test states what the server does and what
the client must see."""

from __future__ import annotations

import asyncio
import gzip
import socket
from collections.abc import Awaitable, Callable

import httpx
import pytest

from vf_mm.inference import KeepAliveTransport

#: fixed answers by path, and whether the server closes the connection after each
CANNED = {
    "/close": (b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok", True),
    "/half": (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", True),  # 3 of 10 bytes
    "/chunked": (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
        False,
    ),
    "/upgrade": (
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: upgrade\r\n\r\n",
        False,
    ),
}


class Server:
    """Answers ``/echo`` (the body back), ``/close`` (answers, then closes), ``/chunked``,
    ``/gzip``, ``/hangup`` (closes without answering), ``/slow`` (never answers) and
    ``/half`` (half an answer, then closes). Counts the connections it accepted."""

    def __init__(self) -> None:
        self.accepted = 0
        self.port = 0
        self.writers: list[asyncio.StreamWriter] = []
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    def drop_connections(self) -> None:
        """Close every connection from this side, as a server ending idle keep-alives."""
        for writer in self.writers:
            writer.close()

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        self.writers.append(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode().split("\r\n")
                path = lines[0].split()[1]
                length = next(
                    (int(h.split(":")[1]) for h in lines if h.lower().startswith("content-length")),
                    0,
                )
                body = await reader.readexactly(length)
                if path == "/echo":
                    writer.write(
                        b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body
                    )
                elif path in CANNED:
                    answer, then_close = CANNED[path]
                    writer.write(answer)
                    if then_close:
                        await writer.drain()
                        writer.close()
                        return
                elif path == "/gzip":
                    packed = gzip.compress(b"unpacked")
                    writer.write(
                        b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n"
                        % len(packed)
                        + packed
                    )
                elif path == "/hangup":
                    writer.close()
                    return
                elif path == "/slow":
                    await asyncio.sleep(30)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()


def with_server(test: Callable[[Server], Awaitable[None]]) -> None:
    """Run ``test`` on a fresh loop against a started ``Server`` (no pytest plugin needed)."""

    async def main() -> None:
        served = Server()
        await served.start()
        try:
            await test(served)
        finally:
            await served.stop()

    asyncio.run(main())


def client(transport: KeepAliveTransport, **kwargs) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=transport, trust_env=False, **kwargs)


def test_requests_reuse_one_connection_and_bodies_arrive_whole():
    async def test(server: Server) -> None:
        transport = KeepAliveTransport()
        async with client(transport) as http:
            for size in (0, 10, 3 << 20):  # up to a few MiB, as an image request carries
                body = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
                response = await http.post(f"http://127.0.0.1:{server.port}/echo", content=body)
                assert response.status_code == 200
                assert response.content == body
        assert transport.opened == server.accepted == 1

    with_server(test)


def test_requests_in_flight_at_once_each_get_a_connection_then_share_them():
    async def test(server: Server) -> None:
        transport = KeepAliveTransport()
        url = f"http://127.0.0.1:{server.port}/echo"
        async with client(transport) as http:
            answers = await asyncio.gather(*(http.post(url, content=b"%d" % i) for i in range(8)))
            assert [a.content for a in answers] == [b"%d" % i for i in range(8)]
            assert transport.opened == 8
            await asyncio.gather(*(http.post(url, content=b"again") for _ in range(8)))
        assert transport.opened == server.accepted == 8  # the second wave reused them

    with_server(test)


def test_a_connection_the_server_closed_is_not_reused():
    async def test(server: Server) -> None:
        transport = KeepAliveTransport()
        async with client(transport) as http:
            first = await http.get(f"http://127.0.0.1:{server.port}/close")
            assert first.content == b"ok"
            second = await http.post(f"http://127.0.0.1:{server.port}/echo", content=b"next")
            assert second.content == b"next"
        assert transport.opened == 2

    with_server(test)


def test_an_idle_connection_closed_by_the_server_is_dropped_before_reuse():
    async def test(server: Server) -> None:
        transport = KeepAliveTransport()
        async with client(transport) as http:
            await http.post(f"http://127.0.0.1:{server.port}/echo", content=b"a")
            server.drop_connections()
            await asyncio.sleep(0.1)  # the server's end of file reaches the client's loop
            answer = await http.post(f"http://127.0.0.1:{server.port}/echo", content=b"b")
            assert answer.content == b"b"
        assert transport.opened == server.accepted == 2

    with_server(test)


def test_idle_connections_expire():
    async def test(server: Server) -> None:
        transport = KeepAliveTransport(keepalive_expiry_s=0.01)
        async with client(transport) as http:
            await http.post(f"http://127.0.0.1:{server.port}/echo", content=b"a")
            await asyncio.sleep(0.05)
            await http.post(f"http://127.0.0.1:{server.port}/echo", content=b"b")
        assert transport.opened == 2

    with_server(test)


def test_chunked_and_compressed_answers_read_as_httpx_reads_them():
    async def test(server: Server) -> None:
        async with client(KeepAliveTransport()) as http:
            chunked = await http.get(f"http://127.0.0.1:{server.port}/chunked")
            assert chunked.content == b"abcde"
            packed = await http.get(f"http://127.0.0.1:{server.port}/gzip")
            assert packed.content == b"unpacked"  # decoded by httpx from Content-Encoding

    with_server(test)


def test_a_server_that_hangs_up_is_httpxs_remote_protocol_error():
    async def test(server: Server) -> None:
        transport = KeepAliveTransport()
        async with client(transport) as http:
            with pytest.raises(httpx.RemoteProtocolError, match="without sending an answer"):
                await http.get(f"http://127.0.0.1:{server.port}/hangup")
            with pytest.raises(httpx.RemoteProtocolError):
                await http.get(f"http://127.0.0.1:{server.port}/half")
            assert not transport._idle.get(("127.0.0.1", server.port))  # neither kept

    with_server(test)


def test_a_protocol_switch_is_refused_not_spun_on():
    async def test(server: Server) -> None:
        transport = KeepAliveTransport()
        async with client(transport, timeout=httpx.Timeout(5)) as http:
            with pytest.raises(httpx.UnsupportedProtocol, match="switched protocols"):
                await http.get(
                    f"http://127.0.0.1:{server.port}/upgrade",
                    headers={"Upgrade": "x", "Connection": "upgrade"},
                )
            assert not transport._idle.get(("127.0.0.1", server.port))

    with_server(test)


def test_releasing_a_connection_closes_the_expired_idle_ones():
    async def test(server: Server) -> None:
        transport = KeepAliveTransport(keepalive_expiry_s=1.0)
        url = f"http://127.0.0.1:{server.port}/echo"
        idle = transport._idle[("127.0.0.1", server.port)]
        async with client(transport) as http:
            await asyncio.gather(*(http.post(url, content=b"x") for _ in range(4)))
            assert len(idle) == 4
            await asyncio.sleep(0.6)
            await http.post(url, content=b"y")  # reuses the newest: it is fresh again
            await asyncio.sleep(0.6)  # the other three are now past their expiry
            await http.post(url, content=b"z")  # reuses the newest; its release prunes
            assert len(idle) == 1
        assert transport.opened == 4

    with_server(test)


def test_timeouts_are_httpxs():
    async def test(server: Server) -> None:
        transport = KeepAliveTransport()
        async with client(transport, timeout=httpx.Timeout(0.2)) as http:
            with pytest.raises(httpx.ReadTimeout):
                await http.get(f"http://127.0.0.1:{server.port}/slow")
            assert not transport._busy and not transport._idle.get(("127.0.0.1", server.port))

    with_server(test)


def test_a_refused_connection_is_httpxs_connect_error():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # nothing listens once it closes

    async def main() -> None:
        async with client(KeepAliveTransport()) as http:
            with pytest.raises(httpx.ConnectError):
                await http.get(f"http://127.0.0.1:{port}/echo")

    asyncio.run(main())


def test_a_cancelled_request_closes_its_connection():
    async def test(server: Server) -> None:
        transport = KeepAliveTransport()
        async with client(transport) as http:
            task = asyncio.create_task(http.get(f"http://127.0.0.1:{server.port}/slow"))
            await asyncio.sleep(0.1)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert not transport._busy and not transport._idle.get(("127.0.0.1", server.port))
            answer = await http.post(f"http://127.0.0.1:{server.port}/echo", content=b"fresh")
            assert answer.content == b"fresh"
        assert transport.opened == 2

    with_server(test)


def test_other_schemes_go_to_the_fallback_transport():
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(str(request.url))
        return httpx.Response(200, content=b"tls")

    transport = KeepAliveTransport(fallback=httpx.MockTransport(handler))

    async def main() -> httpx.Response:
        async with client(transport) as http:
            return await http.get("https://example.invalid/v1/models")

    answer = asyncio.run(main())
    assert answer.content == b"tls" and seen == ["https://example.invalid/v1/models"]
    assert transport.opened == 0


@pytest.mark.parametrize("kwargs", [{"max_idle": -1}, {"keepalive_expiry_s": 0}])
def test_bad_pool_settings_are_refused(kwargs):
    with pytest.raises(ValueError):
        KeepAliveTransport(**kwargs)
