"""Client CPU per request: vf_mm's ``KeepAliveTransport`` against httpx's own pool
(httpcore) and the floor, raw asyncio streams, side by side in one run.

A rollout worker posts one request a turn per rollout, with as many in flight as it has
rollouts, so the transport's cost per request, and how it grows with the requests in
flight, delays every turn. The server is a minimal HTTP/1.1 echo in a subprocess (its CPU
is not counted); each client posts ``--body-kb`` and reads the same back. Reported: CPU
(user + system of this process) and wall time per request at each concurrency.

    python bench/http_transport.py [--requests 2000] [--concurrency 1,8,32] [--body-kb 200]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from _machine import cpu_name

from vf_mm.inference import KeepAliveTransport

SERVER = r"""
import asyncio, sys
async def serve(reader, writer):
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            body = await reader.readexactly(length)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        writer.close()
async def main():
    server = await asyncio.start_server(serve, "127.0.0.1", 0, limit=1 << 20)
    print(server.sockets[0].getsockname()[1], flush=True)
    await server.serve_forever()
asyncio.run(main())
"""


async def with_httpx(url: str, body: bytes, n: int, c: int, transport: object) -> None:
    kwargs: dict = {"transport": transport} if transport is not None else {
        "limits": httpx.Limits(max_connections=4096, max_keepalive_connections=1024,
                               keepalive_expiry=60.0)}  # fmt: skip
    async with httpx.AsyncClient(trust_env=False, **kwargs) as client:
        gate = asyncio.Semaphore(c)

        async def one() -> None:
            async with gate:
                response = await client.post(url, content=body)
                assert len(response.content) == len(body)

        await asyncio.gather(*(one() for _ in range(c)))  # connections open, untimed
        await timed(n, asyncio.gather(*(one() for _ in range(n))))


async def with_streams(port: int, body: bytes, n: int, c: int) -> None:
    connections = [await asyncio.open_connection("127.0.0.1", port) for _ in range(c)]
    head = b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body)

    async def lane(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, k: int) -> None:
        for _ in range(k):
            writer.write(head + body)
            await writer.drain()
            answer = await reader.readuntil(b"\r\n\r\n")
            length = int(answer.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            await reader.readexactly(length)

    await timed(n, asyncio.gather(*(lane(r, w, n // c) for r, w in connections)))
    for _, writer in connections:
        writer.close()


RESULTS: list[tuple[float, float]] = []


async def timed(n: int, work: asyncio.Future) -> None:
    cpu, wall = time.process_time(), time.perf_counter()
    await work
    RESULTS.append(((time.process_time() - cpu) / n * 1e3, (time.perf_counter() - wall) / n * 1e3))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", default="1,8,32")
    parser.add_argument("--body-kb", type=int, default=200)
    args = parser.parse_args()
    print(f"{cpu_name()}, {os.cpu_count()} cores | Python {platform.python_version()}, httpx "
          f"{httpx.__version__}; {args.requests} POSTs of {args.body_kb} KB echoed back\n")  # fmt: skip
    server = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        url, body = f"http://127.0.0.1:{port}/echo", os.urandom(args.body_kb * 1024)
        print(
            f"{'in flight':>10}{'client':>28}{'CPU ms/request':>16}{'wall ms':>10}{'CPU ratio':>11}"
        )
        for c in (int(x) for x in args.concurrency.split(",")):
            n = args.requests - args.requests % c
            rows = []
            clients = {
                "httpx's pool (httpcore)": with_httpx(url, body, n, c, None),
                "KeepAliveTransport": with_httpx(url, body, n, c, KeepAliveTransport()),
                "raw asyncio streams": with_streams(port, body, n, c),
            }
            for name, run in clients.items():
                asyncio.run(run)
                rows.append((name, *RESULTS[-1]))
            floor = rows[-1][1]
            for name, cpu, wall in rows:
                print(f"{c:>10}{name:>28}{cpu:>16.2f}{wall:>10.2f}{cpu / floor:>10.1f}x")
    finally:
        server.kill()


if __name__ == "__main__":
    main()
