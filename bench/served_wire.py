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
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
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
from client_cpu import build_checkpoint


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


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--turns", type=int, default=8)
    args = parser.parse_args()
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
