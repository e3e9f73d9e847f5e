"""Client overhead: turns per second through ``RendererClient`` against a zero-latency backend.

Rollouts of ``--turns`` turns run concurrently (1, 16, 128 at a time) through one
``RendererClient`` (with a ``RendererPool``) over a ``ScriptedBackend`` that answers
instantly, so everything measured is vf_mm's own cost per turn: finding the step to
bridge from, bridging (or rendering), the thread hop, parsing the reply. Two workloads:

  text turns    each turn appends the reply and a short user message
  image turns   each turn also adds one new 448x448 image

Baseline, side by side: the transformers image processor on the turn's new 448x448
image, timed inside the same run (what an image turn cannot avoid). The framework's own
cost per turn is the turn's time minus that. Targets: under 1 ms per text turn; for
image turns the framework's cost is no more than the image processing itself;
throughput grows with concurrency.

    python bench/client_overhead.py [--turns 8] [--family qwen2_5_vl]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import tempfile
import time
from typing import Any

import numpy as np
import transformers
from PIL import Image

import vf_mm
from vf_mm import RendererClient
from vf_mm.inference import SamplingParams
from vf_mm.renderers import RendererPool, load_renderer
from vf_mm.testing import ScriptedBackend, build_tiny_vlm

IMAGES = [
    Image.fromarray(np.random.default_rng(i).integers(0, 256, (448, 448, 3), dtype=np.uint8))
    for i in range(64)
]
_fresh = iter(range(10**9))


def new_image() -> Image.Image:
    """A never-seen image (so the renderer's cache cannot help), cheap to make."""
    base = IMAGES[next(_fresh) % len(IMAGES)].copy()
    base.putpixel((0, 0), (next(_fresh) % 256, 0, 0))
    base.putpixel((1, 0), (next(_fresh) // 256 % 256, next(_fresh) % 256, 0))
    return base


async def one_rollout(client: RendererClient, turns: int, images: bool) -> None:
    def user(t: int) -> dict[str, Any]:
        if images:
            return {"role": "user", "content": [{"type": "image", "image": new_image()},
                                                {"type": "text", "text": f"state {t}"}]}  # fmt: skip
        return {"role": "user", "content": f"state {t}: where next?"}

    messages = [user(0)]
    trajectory = []
    for t in range(turns):
        turn = await client.generate(messages, trajectory=trajectory)
        trajectory.append(turn.step(messages))
        messages = [*messages, turn.message, user(t + 1)]


async def measure(
    client: RendererClient, concurrency: int, turns: int, images: bool
) -> tuple[float, int]:
    start = time.perf_counter()
    await asyncio.gather(*(one_rollout(client, turns, images) for _ in range(concurrency)))
    return time.perf_counter() - start, concurrency * turns


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--family", default="qwen2_5_vl")
    parser.add_argument("--pool", type=int, default=os.cpu_count() or 2)
    args = parser.parse_args()
    print(
        f"{platform.machine()}, {os.cpu_count()} cores | Python {platform.python_version()}, "
        f"vf_mm {vf_mm.__version__}, transformers {transformers.__version__}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        path = build_tiny_vlm(f"{tmp}/m", args.family)
        pool = RendererPool(lambda: load_renderer(path), size=args.pool)
        with pool.renderer() as r:
            processor = r.vision.image_processor
            backend = ScriptedBackend(r, ["I move left."])
        t_img = min(
            _timed(lambda: processor(images=[new_image()], return_tensors="np")) for _ in range(10)
        )
        print(f"transformers image processor alone, one 448x448 image: best {t_img * 1e3:.2f} ms\n")
        print(
            f"{'workload':<12}{'concurrency':>12}{'turns/s':>10}{'ms per turn':>13}"
            f"{'image proc ms':>15}{'framework ms':>14}{'framework / image proc':>24}"
        )
        for images in (False, True):
            for concurrency in (1, 16, 128):
                client = RendererClient(backend, pool, sampling=SamplingParams(max_tokens=16))
                asyncio.run(measure(client, min(concurrency, 4), 2, images))  # warm up
                client = RendererClient(backend, pool, sampling=SamplingParams(max_tokens=16))
                before = _processing_s(pool)
                wall, n = asyncio.run(measure(client, concurrency, args.turns, images))
                per_turn = wall / n
                # processing time is summed over threads; at most min(rollouts, renderers,
                # cores) of them process at once, so that is the overlap to divide by
                overlap = min(concurrency, args.pool, os.cpu_count() or 1)
                busy = (_processing_s(pool) - before) / overlap / n
                framework = per_turn - busy
                ratio = f"{framework / busy:24.2f}" if images else f"{'-':>24}"
                label = "image turns" if images else "text turns"
                print(
                    f"{label:<12}{concurrency:>12}{n / wall:>10.0f}{per_turn * 1e3:>13.3f}"
                    f"{busy * 1e3:>15.3f}{framework * 1e3:>14.3f}{ratio}"
                )
                assert client.stats.bridges == n - concurrency, client.stats
    print(
        "\nms per turn = wall time / turns (all rollouts together); framework ms = ms per turn - "
        "image processing ms (target: < 1 for text turns, <= image processing for image turns)."
    )


def _processing_s(pool: RendererPool) -> float:
    return sum(r.vision.processing_s for r in pool.renderers)


def _timed(fn: Any) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


if __name__ == "__main__":
    main()
