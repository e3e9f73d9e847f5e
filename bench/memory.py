"""Memory of an eval run against its length: peak RSS for N = 200, 2000, ... rollouts of
distinct images, side by side, streamed (what ``vf-mm eval`` does now) and kept (every
output held to the end and a 2 GiB image cache: what it did before runs streamed).

Each run is ``evaluate_to_dir`` of the ``shapes`` environment with ``num_eval_examples =
N`` and one rollout per example, so every rollout has its own 224x224 image, in a fresh
subprocess (its own peak). The engine is the scripted backend by default (the renderer
still processes every image, which is where the memory goes; the model is not the
point), or the embedded tiny model (``--engine local``). Printed per run: RSS once the
environment and client are loaded ("base": the dataset and the model), the peak during
the run, the peak beyond the base, RSS at a quarter, half and the end of the run, and
rollouts per second.

    python bench/memory.py [--sizes 200,2000,10000] [--modes streamed,kept]
                           [--engine scripted|local] [-c 32]

The target (issue 17): beyond the base, under 300 MB more at 2000 rollouts than at 200,
and flat after that.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[1]
_PAGE = os.sysconf("SC_PAGE_SIZE")
IMAGE_CACHE_MB = 256  # vf-mm eval's default --image-cache-mb


def rss_mb() -> float:
    """This process's resident set now, in MB (``/proc/self/statm``)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE / 1e6


class PeakSampler:
    """The highest RSS seen, sampled every ``every_s`` in a thread (the peak of the run
    itself, not of the imports before it, as ``ru_maxrss`` would give)."""

    def __init__(self, every_s: float = 0.05) -> None:
        self.peak = rss_mb()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(every_s,), daemon=True)

    def _run(self, every_s: float) -> None:
        while not self._stop.wait(every_s):
            self.peak = max(self.peak, rss_mb())

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_mb())


def make_client(engine: str, cache_bytes: int):
    import vf_mm
    from vf_mm.models import embedded_model
    from vf_mm.renderers import RendererPool, load_renderer

    model = embedded_model()
    pool = RendererPool(lambda: load_renderer(model, cache_bytes=cache_bytes), size=2)
    if engine == "local":
        from vf_mm.inference import LocalBackend

        return vf_mm.RendererClient(LocalBackend(model), pool)
    from vf_mm.testing import ScriptedBackend

    backend = ScriptedBackend(pool.renderers[0], ["<answer>3</answer>"], record=False)
    return vf_mm.RendererClient(backend, pool)


class Keeping:
    """The environment, but every output is also kept until the run ends (what
    ``Environment.evaluate`` did before ``keep_outputs``)."""

    def __init__(self, env) -> None:
        self._env = env
        self.kept: list = []

    def __getattr__(self, name):
        return getattr(self._env, name)

    async def evaluate(self, client, *, on_result, **options):
        async def both(output, index):
            self.kept.append(output)
            await on_result(output, index)

        return await self._env.evaluate(client, on_result=both, **options)


async def child(n: int, mode: str, engine: str, concurrency: int, outdir: Path) -> dict:
    import vf_mm
    from vf_mm.results import evaluate_to_dir

    env = vf_mm.load_environment(
        "shapes", search_paths=[str(_ROOT / "environments")], num_eval_examples=n
    )
    cache = (2 << 30) if mode == "kept" else IMAGE_CACHE_MB << 20
    client = make_client(engine, cache)
    runner = Keeping(env) if mode == "kept" else env
    base = rss_mb()
    marks: dict[str, float] = {}

    def progress(p) -> None:
        for label, share in (("25%", 0.25), ("50%", 0.5)):
            if label not in marks and p.done >= share * n:
                marks[label] = rss_mb()

    start = time.perf_counter()
    with PeakSampler() as sampler:
        aggregates = await evaluate_to_dir(
            runner,
            client,
            outdir,
            metadata={"config": {"bench": "memory", "n": n, "mode": mode}},
            num_examples=n,
            rollouts_per_example=1,
            concurrency=concurrency,
            sampling_args={"max_tokens": 8},
            seed=0,
            on_progress=progress,
        )
        marks["end"] = rss_mb()
    wall = time.perf_counter() - start
    await client.backend.aclose()
    return {
        "n": n,
        "mode": mode,
        "count": aggregates["count"],
        "base": base,
        "peak": sampler.peak,
        "marks": marks,
        "rate": aggregates["count"] / wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="200,2000,5000")
    parser.add_argument("--modes", default="streamed,kept")
    parser.add_argument("--engine", choices=["scripted", "local"], default="scripted")
    parser.add_argument("-c", "--concurrency", type=int, default=32)
    parser.add_argument("--child", nargs=2, metavar=("N", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        with tempfile.TemporaryDirectory(prefix="vfmm-bench-memory-") as tmp:
            n, mode = int(args.child[0]), args.child[1]
            result = asyncio.run(child(n, mode, args.engine, args.concurrency, Path(tmp) / "run"))
        print(json.dumps(result))
        return

    sys.path.insert(0, str(_ROOT / "bench"))
    from _machine import cpu_name

    print(f"# {cpu_name()}, {os.cpu_count()} cores; engine {args.engine}, -c {args.concurrency}")
    print(f"{'mode':<9}{'rollouts':>9}{'base MB':>9}{'peak MB':>9}{'beyond':>8}"
          f"{'@25%':>8}{'@50%':>8}{'@end':>8}{'/s':>7}")  # fmt: skip
    results: dict[tuple[str, int], dict] = {}
    for mode in args.modes.split(","):
        for n in (int(x) for x in args.sizes.split(",")):
            out = subprocess.run(
                [sys.executable, __file__, "--child", str(n), mode, "--engine", args.engine,
                 "-c", str(args.concurrency)],
                capture_output=True, text=True, check=True, cwd=_ROOT,
            )  # fmt: skip
            r = json.loads(out.stdout.strip().splitlines()[-1])
            results[(mode, n)] = r
            m = r["marks"]
            print(
                f"{mode:<9}{r['count']:>9}{r['base']:>9.0f}{r['peak']:>9.0f}"
                f"{r['peak'] - r['base']:>8.0f}{m.get('25%', 0):>8.0f}{m.get('50%', 0):>8.0f}"
                f"{m['end']:>8.0f}{r['rate']:>7.1f}",
                flush=True,
            )
    print_growth(results, args.modes.split(","))


def print_growth(results: dict, modes: list[str]) -> None:
    """For each mode measured at several sizes: how its peak beyond the base grows from
    the smallest run to each larger one (flat is the goal)."""
    for mode in modes:
        sizes = sorted(n for m, n in results if m == mode)
        if len(sizes) > 1:
            first = results[(mode, sizes[0])]
            growth = ", ".join(
                f"{n}: {(results[(mode, n)]['peak'] - results[(mode, n)]['base']) - (first['peak'] - first['base']):+.0f} MB"
                for n in sizes[1:]
            )
            print(f"{mode}: peak beyond base, against {sizes[0]} rollouts: {growth}")


if __name__ == "__main__":
    main()
