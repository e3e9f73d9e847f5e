"""The child process of the soak test: ``evaluate_to_dir`` of ``shapes`` (one distinct image
per example) into OUTDIR, printing this process's RSS every ``--every`` stored rollouts as
JSON lines on stdout; ``--kill-at N`` sends itself SIGKILL once N rollouts are stored (a
machine lost mid-run), ``--resume`` continues a run.

    python -m tests.results._soak OUTDIR --examples N --rollouts R [--engine scripted|local]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
from pathlib import Path

import vf_mm
from vf_mm.models import embedded_model
from vf_mm.renderers import RendererPool, load_renderer
from vf_mm.results import evaluate_to_dir

ENVIRONMENTS = Path(__file__).resolve().parents[2] / "environments"
_PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE / 1e6


async def main(args: argparse.Namespace) -> None:
    env = vf_mm.load_environment(
        "shapes", search_paths=[str(ENVIRONMENTS)], num_eval_examples=args.examples
    )
    model = embedded_model()
    pool = RendererPool(lambda: load_renderer(model, cache_bytes=args.cache_mb << 20), size=2)
    if args.engine == "local":
        from vf_mm.inference import LocalBackend

        backend = LocalBackend(model, prefix_cache_bytes=args.cache_mb << 20)
    else:
        from vf_mm.testing import ScriptedBackend

        backend = ScriptedBackend(pool.renderers[0], ["<answer>3</answer>"], record=False)
    client = vf_mm.RendererClient(backend, pool)
    print(json.dumps({"done": 0, "rss": rss_mb()}), flush=True)

    def progress(p) -> None:
        if p.done and p.done % args.every == 0:
            print(json.dumps({"done": p.done_before + p.done, "rss": rss_mb()}), flush=True)
        if args.kill_at is not None and p.done_before + p.done >= args.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    aggregates = await evaluate_to_dir(
        env, client, args.outdir, metadata={"config": {"soak": args.examples}},
        num_examples=args.examples, rollouts_per_example=args.rollouts, concurrency=32,
        sampling_args={"max_tokens": 8}, seed=0, resume=args.resume, on_progress=progress,
    )  # fmt: skip
    await backend.aclose()
    print(json.dumps({"end": aggregates["count"], "rss": rss_mb()}), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--examples", type=int, required=True)
    parser.add_argument("--rollouts", type=int, default=2)
    parser.add_argument("--engine", choices=["scripted", "local"], default="scripted")
    parser.add_argument("--cache-mb", type=int, default=256)
    parser.add_argument("--every", type=int, default=250)
    parser.add_argument("--kill-at", type=int, default=None)
    parser.add_argument("--resume", action="store_true")
    asyncio.run(main(parser.parse_args()))
    sys.exit(0)
