"""What the served route costs on the CPU, turn by turn: ``vf-mm eval --backend vllm``
against ``vf-mm serve``, for one ``gridnav`` rollout.

A ``gridnav`` rollout (medium: 8 turns, a new rendered image each turn) runs through a
``RendererClient`` (bridging, the Qwen2.5-VL renderer at the real checkpoint's pixel
limits) over an instant scripted engine that keeps each request. Its requests are then
sent, in order, by a ``VLLMBackend`` (features mode, the default ``send_kwargs_data=True``:
every image of the prompt with its tensors) to ``vf-mm serve``'s app in this process
(``create_app`` over the same instant engine, through httpx's ASGI transport), each
request's time split into the server's (the app: reading, parsing and validating the
body, decoding its items, the instant engine, the answer) and the client's (the rest:
encoding the body, reading the answer). Twice, side by side: with the server's item
cache off (``mm_cache_items=0``: every item a request carries is decoded, what the server
did before it kept a digest of each string it decoded) and with its default cache (an
item sent again is found by its string's digest and not decoded again).

Baseline, side by side: the tensor bytes of the one image a turn adds. A request at turn
t carries t images, so a rollout of T turns sends T(T+1)/2 image tensors; the sum row is
what one rollout costs the server's one process (under its GIL, beside the engine's own
thread).

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
        start = time.perf_counter()
        response = await self.inner.handle_async_request(request)
        await response.aread()
        self.log.append((size, time.perf_counter() - start))
        return response


async def send_all(requests: list[Any], app: Any) -> tuple[list[float], list[tuple[int, float]]]:
    """Each request through a ``VLLMBackend`` to ``app``, in order: the whole call's time
    per request, and the transport's (body bytes, the app's time)."""
    transport = Timed(app)
    backend = VLLMBackend("http://served", model="m", max_model_len=32768, transport=transport)
    calls = []
    try:
        for request in requests:
            start = time.perf_counter()
            await backend.generate(request)
            calls.append(time.perf_counter() - start)
    finally:
        await backend.aclose()
    return calls, transport.log


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
                calls, log = asyncio.run(send_all(requests, app))
                if best is None or sum(calls) < sum(best[0]):
                    best = (calls, log)
            runs[label] = best
        print(
            f"{'turn':>5}{'images':>8}{'body MB':>9}{'new image MB':>14}{'client ms':>11}"
            f"{'server ms, cache off':>22}{'server ms, cache on':>21}"
        )
        sums = [0.0] * 4
        for turn, request in enumerate(requests):
            mmd = request.multi_modal_data
            items = mmd.mm_items.get("image", []) if mmd is not None else []
            new = sum(int(getattr(v, "nbytes", 0)) for v in (items[-1].values() if items else []))
            size, off = runs["off"][1][turn]
            _, on = runs["on"][1][turn]
            own = runs["on"][0][turn] - on  # the client's part of the call
            for i, v in enumerate((size, own, off, on)):
                sums[i] += v
            print(
                f"{turn + 1:>5}{len(items):>8}{size / 1e6:>9.2f}{new / 1e6:>14.2f}"
                f"{own * 1e3:>11.1f}{off * 1e3:>22.1f}{on * 1e3:>21.1f}"
            )
        print(
            f"{'sum':>5}{'':>8}{sums[0] / 1e6:>9.2f}{'':>14}{sums[1] * 1e3:>11.1f}"
            f"{sums[2] * 1e3:>22.1f}{sums[3] * 1e3:>21.1f}"
        )
        print(
            f"\nthe server's one process per rollout: {sums[2] * 1e3:.0f} ms with every item "
            f"decoded (at most {1 / sums[2]:.1f} rollouts/s), {sums[3] * 1e3:.0f} ms with the "
            f"item cache (at most {1 / sums[3]:.1f} rollouts/s), before the engine's own work"
        )


if __name__ == "__main__":
    main()
