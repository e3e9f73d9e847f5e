"""What the served route costs on the CPU, turn by turn: ``vf-mm eval --backend vllm``
against ``vf-mm serve``, for one ``gridnav`` rollout.

A ``gridnav`` rollout (medium: 8 turns, a new rendered image each turn) runs through a
``RendererClient`` (bridging, the Qwen2.5-VL renderer at the real checkpoint's pixel
limits) over an instant scripted engine that keeps each request. Its requests are then
sent, in order, by a ``VLLMBackend`` (features mode, the default ``send_kwargs_data=True``)
to ``vf-mm serve``'s app in this process (``create_app`` over the same instant engine,
through httpx's ASGI transport), each request's CPU time (``time.process_time``: this
process, all threads; the requests run one at a time) split into the server's (the app:
reading, parsing and validating the body, decoding its items, the instant engine, the
answer) and the client's (the rest: encoding the body, reading the answer). Twice, side
by side: with the server's item cache off (``mm_cache_items=0``: the server keeps
nothing and says so, so every request carries every image of its prompt with its
tensors, and each is decoded: a real vLLM server is sent the same) and with its default
cache (the client sends each image's tensors once, the later turns name it by its hash
and the digest of what was sent; a string sent again would be found by its digest and
not decoded again).

Baseline, side by side: the tensor bytes of the one image a turn adds. A request at turn
t carries t images, so a rollout of T turns sent with every image carries T(T+1)/2 image
tensors, and with each sent once T; the sum row is what one rollout costs the server's
one process (under its GIL, beside the engine's own thread) and the client.

    python bench/served_wire.py [--turns 8]

``--load`` measures the server's process instead: ``vf-mm serve``'s app over an instant
scripted engine in its own process, run as ``vf-mm serve`` runs it (``uvicorn.run``, the
same options), and ``--clients`` concurrent clients replaying ``--rollouts`` recorded
``gridnav`` rollouts over HTTP, each rollout's requests in order, exactly the bodies a
``VLLMBackend`` sent (recorded once against the app in this process, each rollout by a
fresh client, so its first request of each image carries its tensors and the later ones
name it). A fresh server per client count, so nothing is cached from the last. Reported:
requests/s reached, the server process's CPU ms per request (``/proc``: every thread) and
the most requests/s one process could serve at that cost (1000 / ms); with ``--profile``
one more pass at the largest client count under py-spy (``--py-spy PATH``), its samples
split by phase (``bench/_phases.py``: HTTP, body parse, item decode, item check, the
engine, response encode, ...).

    python bench/served_wire.py --load [--rollouts 32] [--clients 1,8,32] [--profile]
                                [--py-spy PATH] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

import vf_mm
from vf_mm.inference import VLLMBackend, create_app
from vf_mm.renderers import load_renderer
from vf_mm.testing import ScriptedBackend

sys.path.insert(0, str(Path(__file__).parent))
from _machine import cpu_name
from client_cpu import build_checkpoint, cpu_s


class Timed(httpx.AsyncBaseTransport):
    """httpx's ASGI transport to the app, keeping each request's body size and the time
    the app took to answer it."""

    def __init__(self, app: Any) -> None:
        self.inner = httpx.ASGITransport(app=app)
        self.log: list[tuple[int, float]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        size = len(await request.aread())
        start = time.process_time()
        response = await self.inner.handle_async_request(request)
        await response.aread()
        self.log.append((size, time.process_time() - start))
        return response


async def send_all(
    requests: list[Any], app: Any
) -> tuple[list[float], list[tuple[int, float]], dict[str, int]]:
    """Each request through a ``VLLMBackend`` to ``app``, in order: the whole call's CPU
    time per request, the transport's (body bytes, the app's CPU time), and the
    backend's item counts (``item_stats``: sent, skipped)."""
    transport = Timed(app)
    backend = VLLMBackend("http://served", model="m", max_model_len=32768, transport=transport)
    calls = []
    try:
        for request in requests:
            start = time.process_time()
            await backend.generate(request)
            calls.append(time.process_time() - start)
    finally:
        await backend.aclose()
    stats = getattr(backend, "item_stats", {}).get("http://served", {})
    return calls, transport.log, stats


# -- --load: the server's own process under concurrent clients ---------------------------

REPLY = "The goal is above me, so I will go up one cell now. <move>up</move>"


class Recording(httpx.AsyncBaseTransport):
    """httpx's ASGI transport to the app, keeping each request's body and headers."""

    def __init__(self, app: Any) -> None:
        self.inner = httpx.ASGITransport(app=app)
        self.sent: list[tuple[bytes, dict[str, str]]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = await request.aread()
        keep = {
            k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")
        }
        self.sent.append((body, keep))
        return await self.inner.handle_async_request(request)


def record_rollouts(path: Path, rollouts: int, turns: int) -> list[list[tuple[bytes, dict]]]:
    """``rollouts`` gridnav rollouts (one at a time, so each one's requests are in a row),
    and the HTTP bodies a fresh ``VLLMBackend`` per rollout sends for them."""
    engine = ScriptedBackend(load_renderer(path), [REPLY])
    client = vf_mm.make_client(path, backend=engine)
    env = vf_mm.load_environment("gridnav", seed=0, max_turns=turns)
    asyncio.run(
        env.evaluate(client, num_examples=rollouts, concurrency=1,
                     sampling_args={"max_tokens": 32, "logprobs": True})
    )  # fmt: skip
    grouped: list[list[Any]] = []
    for request in engine.requests:  # a rollout starts where the image count drops
        mmd = request.multi_modal_data
        n = len(mmd.mm_items.get("image", [])) if mmd is not None else 0
        if not grouped or n <= grouped[-1][-1][0]:
            grouped.append([])
        grouped[-1].append((n, request))
    app = create_app(engine, renderer=client.renderer, model_name="m")

    async def send(requests: list[Any]) -> list[tuple[bytes, dict]]:
        transport = Recording(app)
        backend = VLLMBackend("http://served", model="m", max_model_len=32768, transport=transport)
        try:
            for request in requests:
                await backend.generate(request)
        finally:
            await backend.aclose()
        return transport.sent

    return [asyncio.run(send([r for _, r in group])) for group in grouped]


def serve_child(path: str, port: int) -> None:
    """What ``vf-mm serve`` runs (``run_serve``: ``create_app`` under ``uvicorn.run``, its
    default options), over an instant scripted engine."""
    import uvicorn

    renderer = load_renderer(path)
    engine = ScriptedBackend(renderer, [REPLY], record=False)
    app = create_app(engine, renderer=renderer, model_name="m")
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="info", timeout_keep_alive=5)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _replay(port: int, rollouts: list[list[tuple[bytes, dict]]], clients: int) -> float:
    """Every rollout's bodies POSTed in order by ``clients`` concurrent clients, each on
    its own keep-alive connection, over plain asyncio streams (the requests' bytes built
    beforehand, so the clients cost this 2-core machine little beside the server); wall s."""
    queue: asyncio.Queue[list[bytes]] = asyncio.Queue()
    for r in rollouts:
        queue.put_nowait([_http_request(port, body, headers) for body, headers in r])

    async def one() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            while not queue.empty():
                for raw in queue.get_nowait():
                    writer.write(raw)
                    head = await reader.readuntil(b"\r\n\r\n")
                    status = int(head.split(b" ", 2)[1])
                    length = next(
                        int(line.split(b":", 1)[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    )
                    body = await reader.readexactly(length)
                    assert status == 200, body[:500]
        finally:
            writer.close()

    start = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(clients)))
    return time.perf_counter() - start


def _http_request(port: int, body: bytes, headers: dict[str, str]) -> bytes:
    lines = [b"POST /inference/v1/generate HTTP/1.1", f"host: 127.0.0.1:{port}".encode(),
             f"content-length: {len(body)}".encode()]  # fmt: skip
    lines += [f"{k}: {v}".encode() for k, v in headers.items()]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def load_pass(
    path: Path, rollouts: list[list[tuple[bytes, dict]]], clients: int, spy: list[str] | None,
    log: Path,
) -> dict[str, Any]:  # fmt: skip
    """One fresh server, the rollouts replayed at ``clients``; with ``spy`` (py-spy's
    command up to ``--pid``), sampled."""
    port = _free_port()
    with open(log, "ab") as err:
        server = subprocess.Popen(
            [sys.executable, __file__, "--serve-child", str(path), str(port)],
            stdout=err, stderr=err,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    spying = None
    try:
        for _ in range(600):
            try:
                if httpx.get(url + "/health").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        else:
            raise RuntimeError(f"the server did not start (see {log})")
        # a warm-up on its own rollouts' first request, so imports are not counted
        asyncio.run(_replay(port, [[r[0]] for r in rollouts[:2]], 1))
        if spy is not None:
            spying = subprocess.Popen([*spy, str(server.pid)], stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL)  # fmt: skip
            time.sleep(1.0)
        before = cpu_s(server.pid)
        client0 = time.process_time()
        wall = asyncio.run(_replay(port, rollouts, clients))
        client = time.process_time() - client0
        spent = cpu_s(server.pid) - before
    finally:
        if spying is not None:
            spying.send_signal(signal.SIGINT)
            spying.wait(timeout=60)
        server.send_signal(signal.SIGINT)
        server.wait(timeout=60)
    n = sum(len(r) for r in rollouts)
    return {"requests": n, "wall_s": wall, "requests_s": n / wall,
            "server_ms_request": spent / n * 1e3, "server_cores": spent / wall,
            "max_requests_s": n / max(spent, 1e-9), "client_cores": client / wall}  # fmt: skip


def run_load(args: Any) -> None:
    import json

    from _phases import show, split

    print(f"{cpu_name()}, {os.cpu_count()} cores | Python {platform.python_version()}")
    with tempfile.TemporaryDirectory() as tmp:
        path = build_checkpoint(Path(tmp) / "qwen2_5_vl")
        rollouts = record_rollouts(path, args.rollouts, args.turns)
        n = sum(len(r) for r in rollouts)
        mb = sum(len(b) for r in rollouts for b, _ in r) / 1e6
        print(
            f"gridnav: {len(rollouts)} rollouts, {n} requests, {mb:.1f} MB of bodies "
            f"(VLLMBackend, each image's tensors sent once); instant scripted engine\n"
        )
        print(f"{'clients':>8}{'requests/s':>12}{'server ms/req':>15}{'server cores':>14}"
              f"{'max req/s':>11}{'rollouts/s max':>16}{'client cores':>14}")  # fmt: skip
        out: dict[str, Any] = {"requests": n, "rollouts": len(rollouts), "runs": {}}
        log = Path(tmp) / "serve.log"
        counts = [int(c) for c in args.clients.split(",")]
        for clients in counts:
            r = load_pass(path, rollouts, clients, None, log)
            out["runs"][clients] = r
            per_rollout = n / len(rollouts)
            print(f"{clients:>8}{r['requests_s']:>12.1f}{r['server_ms_request']:>15.2f}"
                  f"{r['server_cores']:>14.2f}{r['max_requests_s']:>11.0f}"
                  f"{r['max_requests_s'] / per_rollout:>16.1f}{r['client_cores']:>14.2f}", flush=True)  # fmt: skip
        if args.profile:
            raw = Path(tmp) / "serve.txt"
            spy = [args.py_spy, "record", "--rate", "200", "--format", "raw",
                   "-o", str(raw), "--pid"]  # fmt: skip
            r = load_pass(path, rollouts, counts[-1], spy, log)
            counts_by = split(raw)
            print(f"\nunder py-spy, {counts[-1]} clients: {r['requests_s']:.1f} requests/s, "
                  f"server {r['server_ms_request']:.2f} ms/req; its samples by phase:")  # fmt: skip
            print(show(counts_by, ms_per_request=r["server_ms_request"]))
            out["phases"] = dict(counts_by)
            if args.keep_profile:
                args.keep_profile.write_text(raw.read_text())
    if args.out:
        args.out.write_text(json.dumps(out, indent=2))


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--serve-child":
        serve_child(sys.argv[2], int(sys.argv[3]))
        return
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--load", action="store_true", help="the server process under load")
    parser.add_argument("--rollouts", type=int, default=32)
    parser.add_argument("--clients", default="1,8,32")
    parser.add_argument("--profile", action="store_true", help="one more pass under py-spy")
    parser.add_argument("--py-spy", default="py-spy", help="py-spy's executable")
    parser.add_argument("--keep-profile", type=Path, default=None, help="py-spy's raw stacks")
    parser.add_argument("--out", type=Path, default=None, help="--load's numbers as JSON")
    args = parser.parse_args()
    if args.load:
        run_load(args)
        return
    print(f"{cpu_name()}, {os.cpu_count()} cores | Python {platform.python_version()}")
    with tempfile.TemporaryDirectory() as tmp:
        path = build_checkpoint(Path(tmp) / "qwen2_5_vl")
        engine = ScriptedBackend(load_renderer(path), ["<move>up</move>"])
        client = vf_mm.make_client(path, backend=engine)
        env = vf_mm.load_environment("gridnav", seed=0, max_turns=args.turns)
        asyncio.run(env.evaluate(client, num_examples=1, sampling_args={"max_tokens": 32}))
        requests = list(engine.requests)
        print(f"gridnav: one rollout, {len(requests)} requests\n")
        runs = {}
        for label, items in (("off", 0), ("on", 512)):
            best: Any = None
            for _ in range(3):  # a fresh app each time: nothing cached from the last
                app = create_app(engine, renderer=client.renderer, model_name="m",
                                 mm_cache_items=items)  # fmt: skip
                run = asyncio.run(send_all(requests, app))
                if best is None or sum(run[0]) < sum(best[0]):
                    best = run
            runs[label] = best
        print("CPU ms (this process, all threads), the best of 3 runs each")
        head = f"{'body MB':>9}{'client ms':>11}{'server ms':>11}"
        print(f"{'':>27}{'cache off (every image)':^31}{'cache on':^31}")
        print(f"{'turn':>5}{'images':>8}{'new image MB':>14}{head}{head}")
        sums = {"off": [0.0] * 3, "on": [0.0] * 3}
        for turn, request in enumerate(requests):
            mmd = request.multi_modal_data
            items = mmd.mm_items.get("image", []) if mmd is not None else []
            new = sum(int(getattr(v, "nbytes", 0)) for v in (items[-1].values() if items else []))
            line = f"{turn + 1:>5}{len(items):>8}{new / 1e6:>14.2f}"
            for label in ("off", "on"):
                calls, log, _ = runs[label]
                size, server = log[turn]
                own = calls[turn] - server  # the client's part of the call
                for i, v in enumerate((size, own, server)):
                    sums[label][i] += v
                line += f"{size / 1e6:>9.2f}{own * 1e3:>11.1f}{server * 1e3:>11.1f}"
            print(line)
        line = f"{'sum':>5}{'':>8}{'':>14}"
        for label in ("off", "on"):
            size, own, server = sums[label]
            line += f"{size / 1e6:>9.2f}{own * 1e3:>11.1f}{server * 1e3:>11.1f}"
        print(line)
        for label, what in (("off", "cache off"), ("on", "cache on")):
            size, own, server = sums[label]
            stats = runs[label][2]
            counted = (
                f", images sent {stats['sent']}, named by hash {stats['skipped']}" if stats else ""
            )
            print(
                f"{what}: {size / 1e6:.1f} MB a rollout, client {own * 1e3:.0f} ms + server "
                f"{server * 1e3:.0f} ms of CPU (the server's process at most "
                f"{1 / max(server, 1e-9):.1f} rollouts/s before the engine's work){counted}"
            )


if __name__ == "__main__":
    main()
