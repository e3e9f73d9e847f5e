"""Evaluation throughput: rollouts per second of a ``vf-mm eval`` run on the multi-turn
``gridnav`` environment with the local backend (the embedded tiny model), at concurrency
1 and 32, and the share of wall time spent outside the model.

It runs what ``vf-mm eval`` runs (``evaluate_to_dir``: the environment, the
``RendererClient`` with bridging, the ``LocalBackend``'s batching, the results store
with its image assets), minus the terminal. "Model time" is the wall time the local
backend's worker spent generating (``LocalBackend.busy_s``); everything else —
rendering and image processing, environment code (drawing each new state image),
scoring, writing results — is "outside the model". With more concurrency the backend
batches requests, so model time per rollout falls and the outside share shows what
the framework costs.

    python bench/eval_throughput.py [--examples 16] [--rollouts 2] [--max-tokens 8]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import tempfile
import time
from pathlib import Path

import torch

import vf_mm
from vf_mm.inference import LocalBackend
from vf_mm.renderers import RendererPool, load_renderer
from vf_mm.results import evaluate_to_dir
from vf_mm.testing import build_tiny_vlm


async def run(model: Path, outdir: Path, concurrency: int, args: argparse.Namespace) -> dict:
    env = vf_mm.load_environment("gridnav", seed=0)
    backend = LocalBackend(model, max_batch=64)
    pool = RendererPool(lambda: load_renderer(model), size=os.cpu_count() or 2)
    client = vf_mm.RendererClient(backend, pool)
    start = time.perf_counter()
    try:
        agg = await evaluate_to_dir(
            env,
            client,
            outdir,
            metadata={"config": {"bench": "eval_throughput", "concurrency": concurrency}},
            num_examples=args.examples,
            rollouts_per_example=args.rollouts,
            concurrency=concurrency,
            sampling_args={"max_tokens": args.max_tokens},
            seed=0,
        )
    finally:
        await backend.aclose()
    wall = time.perf_counter() - start
    return {
        "wall": wall,
        "rollouts": agg["count"],
        "turns": client.stats.turns,
        "model": backend.busy_s,
        "batches": backend.batches_run,
        "errors": agg["errors"],
        "bridges": client.stats.bridges,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--examples", type=int, default=16)
    parser.add_argument("--rollouts", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=8)
    args = parser.parse_args()
    print(
        f"{platform.machine()}, {os.cpu_count()} cores, torch threads {torch.get_num_threads()} | "
        f"Python {platform.python_version()}, vf_mm {vf_mm.__version__}, torch {torch.__version__}"
    )
    print(
        f"gridnav: {args.examples} examples x {args.rollouts} rollouts, max_tokens {args.max_tokens}\n"
    )
    with tempfile.TemporaryDirectory() as tmp:
        model = build_tiny_vlm(Path(tmp) / "m", "qwen2_5_vl")
        header = f"{'concurrency':>11}{'rollouts/s':>12}{'turns/s':>9}{'model s':>9}{'wall s':>8}{'outside model':>15}{'batches':>9}"
        print(header)
        print("-" * len(header))
        for concurrency in (1, 32):
            r = asyncio.run(run(model, Path(tmp) / f"out{concurrency}", concurrency, args))
            outside = 1 - r["model"] / r["wall"]
            print(
                f"{concurrency:>11}{r['rollouts'] / r['wall']:>12.2f}{r['turns'] / r['wall']:>9.1f}"
                f"{r['model']:>9.2f}{r['wall']:>8.2f}{outside:>15.1%}{r['batches']:>9}"
            )
            assert r["errors"] == 0, r


if __name__ == "__main__":
    main()
