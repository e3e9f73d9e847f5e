"""Local backend, turn by turn: what a turn costs as a conversation grows, with the prefix
cache on and off, side by side in one process.

A 12-turn conversation, one new 224x224 image a turn (a PNG in a ``data:`` URL inside
an OpenAI-style ``image_url`` part, as users send it), 4 tokens sampled a turn
(greedy), driven through ``RendererClient`` (turn 1 rendered, later turns bridged:
each prompt is the previous prompt, its completion and the new user turn) against a
``LocalBackend`` on a random Qwen2.5-VL of about 40M parameters built offline from a
config (the tiny checkpoint's tokenizer and processor; a 224x224 image is 64 tokens).

  cache on    ``LocalBackend(prefix_cache=True)``: each turn prefills only its new
              tokens and runs the vision tower on its new image only
  cache off   ``LocalBackend(prefix_cache=False)``: each turn re-encodes the whole
              prompt, every image through the vision tower again

Per turn: the wall time of ``RendererClient.generate`` (render/bridge + model), best of
``--repeat`` conversations. Baseline: cache off; the ratio turn 12 / turn 2 shows how
a turn's cost grows with history (target with the cache: at most 1.5x). Both runs must
sample the same tokens (greedy): the script checks it.

Then concurrency: ``--rollouts`` (8) such conversations at once against one backend,
cache on and off: total wall time, turns per second, and how many requests the
backend started together (``batches_run``) — rows still share forwards.

    python bench/local_turns.py [--turns 12] [--repeat 3] [--rollouts 8] [--threads N]
                                [--device cpu] [--dtype float32]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import transformers
from _machine import cpu_name
from PIL import Image

import vf_mm
from vf_mm.inference import LocalBackend, SamplingParams
from vf_mm.models import model_class
from vf_mm.renderers import load_renderer
from vf_mm.testing import build_tiny_vlm

SIDE = 224
# ~40M parameters: text 10 layers of 512 (GQA 8/2), vision 8 blocks of 256
TEXT = dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=10,
            num_attention_heads=8, num_key_value_heads=2)  # fmt: skip
VISION = dict(depth=8, hidden_size=256, intermediate_size=1024, num_heads=4,
              out_hidden_size=512, fullatt_block_indexes=[3, 7])  # fmt: skip


def build_model(path: Path) -> tuple[Path, int]:
    """A random Qwen2.5-VL of about 40M parameters (the tiny checkpoint's tokenizer and
    processor, a bigger config), and its parameter count."""
    build_tiny_vlm(path, "qwen2_5_vl")
    config_file = path / "config.json"
    config = json.loads(config_file.read_text())
    config["text_config"].update(TEXT)
    config["text_config"]["layer_types"] = ["full_attention"] * TEXT["num_hidden_layers"]
    rope = dict(config["text_config"]["rope_parameters"], mrope_section=[8, 12, 12])
    config["text_config"]["rope_parameters"] = rope  # sums to head_dim // 2 = 32
    config["vision_config"].update(VISION)
    config_file.write_text(json.dumps(config))
    cls = model_class("qwen2_5_vl")
    cfg = cls.config_class.from_pretrained(path)
    torch.manual_seed(0)
    model = cls(cfg)
    model.save_pretrained(path)
    return path, sum(p.numel() for p in model.parameters())


def data_url(seed: int) -> str:
    pixels = np.random.default_rng(seed).integers(0, 256, (SIDE, SIDE, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def user_turn(k: int, seed: int) -> dict[str, Any]:
    return {
        "role": "user",
        "content": [
            {"type": "image_url", "image_url": {"url": data_url(seed)}},
            {"type": "text", "text": f"Turn {k}: where is the circle now? Answer in a word."},
        ],
    }


async def conversation(
    client: vf_mm.RendererClient, turns: int, seed: int
) -> tuple[list[float], list[list[int]]]:
    """One conversation: each turn's wall time (ms) and sampled ids."""
    messages: list[dict[str, Any]] = [user_turn(1, seed)]
    trajectory: list[Any] = []
    times, sampled = [], []
    for k in range(1, turns + 1):
        start = time.perf_counter()
        turn = await client.generate(messages, trajectory=trajectory)
        times.append((time.perf_counter() - start) * 1e3)
        assert turn.tokens is not None
        sampled.append(turn.tokens.completion_ids)
        trajectory.append(turn.step(messages))
        messages = [*messages, turn.message, user_turn(k + 1, seed * 1000 + k)]
    return times, sampled


async def run_sequential(
    path: Path, cache: bool, args: argparse.Namespace
) -> tuple[list[float], list[list[int]], LocalBackend]:
    backend = LocalBackend(
        path, prefix_cache=cache, batch_window_ms=0, device=args.device, dtype=args.torch_dtype
    )
    client = vf_mm.RendererClient(
        backend, load_renderer(path), sampling=SamplingParams(max_tokens=4, temperature=0)
    )
    try:
        await conversation(client, 2, seed=99)  # warm-up
        best: list[float] | None = None
        ids: list[list[int]] = []
        for r in range(args.repeat):
            times, ids = await conversation(client, args.turns, seed=r + 1)
            best = times if best is None else [min(a, b) for a, b in zip(best, times, strict=True)]
        assert best is not None
        return best, ids, backend
    finally:
        await backend.aclose()


async def run_concurrent(path: Path, cache: bool, args: argparse.Namespace) -> dict[str, Any]:
    backend = LocalBackend(
        path, prefix_cache=cache, batch_window_ms=5, device=args.device, dtype=args.torch_dtype
    )
    client = vf_mm.RendererClient(
        backend, load_renderer(path), sampling=SamplingParams(max_tokens=4, temperature=0)
    )
    try:
        await conversation(client, 2, seed=99)  # warm-up
        runs = backend.batches_run
        start = time.perf_counter()
        await asyncio.gather(
            *(conversation(client, args.turns, seed=100 + i) for i in range(args.rollouts))
        )
        wall = time.perf_counter() - start
        return {
            "wall": wall,
            "admissions": backend.batches_run - runs,
            "hits": backend.prefix_cache_hits,
            "queries": backend.prefix_cache_queries,
        }
    finally:
        await backend.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--turns", type=int, default=12)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--rollouts", type=int, default=8)
    parser.add_argument("--threads", type=int, default=None, help="torch threads")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    args = parser.parse_args()
    args.torch_dtype = getattr(torch, args.dtype)
    if args.threads:
        torch.set_num_threads(args.threads)
    cpu = cpu_name()
    print(
        f"{cpu}, {os.cpu_count()} cores, torch threads {torch.get_num_threads()} | Python "
        f"{platform.python_version()}, vf_mm {vf_mm.__version__}, torch {torch.__version__}, "
        f"transformers {transformers.__version__}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        path, params = build_model(Path(tmp) / "m")
        print(
            f"random Qwen2.5-VL, {params / 1e6:.1f}M parameters, {args.dtype} on {args.device}; "
            f"{args.turns} turns, a new {SIDE}x{SIDE} image (data: URL) a turn, 4 tokens "
            f"sampled a turn (greedy); best of {args.repeat}\n"
        )
        on, ids_on, backend_on = asyncio.run(run_sequential(path, True, args))
        off, ids_off, _ = asyncio.run(run_sequential(path, False, args))
        if ids_on != ids_off:
            raise SystemExit("cache on and off sampled different tokens: the cache is not exact")
        print(f"{'turn':>4} {'cache on':>10} {'cache off':>10} {'off / on':>9}   (ms)")
        for k in range(args.turns):
            print(f"{k + 1:>4} {on[k]:>10.1f} {off[k]:>10.1f} {off[k] / on[k]:>9.2f}")
        last = args.turns - 1
        print(
            f"\nturn {args.turns} / turn 2: cache on {on[last] / on[1]:.2f}x (target <= 1.5x), "
            f"cache off {off[last] / off[1]:.2f}x; turn {args.turns} off / on: "
            f"{off[last] / on[last]:.1f}x; same tokens sampled: yes\n"
            f"prefix cache (last run): {backend_on.prefix_cache_hits} of "
            f"{backend_on.prefix_cache_queries} prompt tokens found cached; vision tower "
            f"outputs found {backend_on.vision_cache_hits} of {backend_on.vision_cache_queries}"
        )
        print(f"\n{args.rollouts} concurrent conversations of {args.turns} turns:")
        print(f"{'':>10} {'wall s':>8} {'turns/s':>8} {'admissions':>11} {'hit rate':>9}")
        for cache in (True, False):
            r = asyncio.run(run_concurrent(path, cache, args))
            turns = args.rollouts * args.turns
            rate = f"{r['hits'] / r['queries']:.0%}" if r["queries"] else "-"
            print(
                f"{'cache on' if cache else 'cache off':>10} {r['wall']:>8.2f} "
                f"{turns / r['wall']:>8.1f} {r['admissions']:>11} {rate:>9}"
            )


if __name__ == "__main__":
    main()
