"""Client CPU per image turn: what vf_mm's client side costs a GPU node, per worker count.

The engine answers instantly (``ScriptedBackend``: one scripted reply, tokenized), so
everything measured is the client side a ``vf-mm eval --workers W`` run puts on the
node's CPUs: the environment's step (drawing and encoding its next frame), image
intake (decoding the ``data:`` URL under the image policy), rendering and bridging
(the Qwen2.5-VL image processor at the real checkpoint's pixel limits, the template,
the tokenizer), scoring, and, in the parent, writing results and image assets. The
environment (``bench/_frames_env.py``) brings one new image every model turn, as

  png448    448x448 PNG ``data:`` URLs
  jpeg720   1280x720 JPEG ``data:`` URLs

and runs ``--turns`` model turns a rollout. What runs is what ``vf-mm eval --workers
W`` runs: ``evaluate_to_dir`` with a started ``WorkerPool`` of W process workers, each
building its client as ``vf_mm.make_client`` does (the renderer pool, the image cache)
around the scripted engine; ``--concurrency`` rollouts in flight in all. Worker start
is not timed (it happens once per run); a warm-up of W groups runs first.

Reported per image kind and W: rollouts/s; image turns/s; CPU seconds per image turn
(the workers' and the parent's, from /proc: user + system time of every thread);
scaling efficiency, rate(W) / (W x rate(1)), and the same against the cores there are
(rate(W) / (min(W, cores) x rate(1))). Baselines, side by side in the same process:
the "in-process" row (no workers: ``vf-mm eval`` without ``--workers``), and
per image the three costs an image turn cannot avoid, timed alone: the environment's
frame (draw + encode), decoding it (``vf_mm.images.load_image``) and the transformers
image processor on it. "vf_mm ms" = CPU per image turn minus those three.

    python bench/client_cpu.py [--workers 1,2,4,8] [--kinds png448,jpeg720] [--turns 8]
                               [--examples 16] [--rollouts-per-example 4] [--concurrency 32]
                               [--out FILE.json]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import transformers

import vf_mm
from vf_mm.renderers import load_renderer
from vf_mm.results import evaluate_to_dir
from vf_mm.testing import ScriptedBackend, build_tiny_vlm
from vf_mm.workers import WorkerPool, WorkerSpec

sys.path.insert(0, str(Path(__file__).parent))
import _frames_env
from _machine import cpu_name

ENV = str(Path(__file__).parent / "_frames_env.py")
# Qwen/Qwen2.5-VL-3B-Instruct's preprocessor: min_pixels, max_pixels (1280x720 is kept whole)
QWEN25_VL_PIXELS = {"shortest_edge": 3136, "longest_edge": 12845056}
TICK = os.sysconf("SC_CLK_TCK")


def build_checkpoint(path: Path) -> Path:
    """A Qwen2.5-VL renderer's files as the real checkpoint has them (the real vocabulary,
    template and pixel limits); the weights are tiny and never run."""
    build_tiny_vlm(path, "qwen2_5_vl", vocab="qwen")
    config = json.loads((path / "preprocessor_config.json").read_text())
    config["size"] = QWEN25_VL_PIXELS
    (path / "preprocessor_config.json").write_text(json.dumps(config))
    return path


def scripted_client(path: str) -> vf_mm.RendererClient:
    """What a worker runs: ``vf_mm.make_client``'s client over an instant engine."""
    engine = ScriptedBackend(load_renderer(path), ["Next."], record=False)
    return vf_mm.make_client(path, backend=engine)


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid``, every thread (``/proc/PID/stat``)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def baselines(path: Path, kind: str, n: int = 12) -> dict[str, float]:
    """Median seconds per image of the frame, its decoding and its image processing, by the
    wall clock (process CPU time would also count torch's idle threads spinning after the
    processor's call: on 16 cores that tripled the frame's figure)."""
    from vf_mm.images import load_image

    processor = load_renderer(path).vision.image_processor
    out: dict[str, list[float]] = {"env": [], "decode": [], "process": []}
    for i in range(n):
        t0 = time.perf_counter()
        url = _frames_env.frame(kind, 10_000 + i, i)
        t1 = time.perf_counter()
        image = load_image(url)
        t2 = time.perf_counter()
        processor(images=[image], return_tensors="np")
        t3 = time.perf_counter()
        out["env"].append(t1 - t0), out["decode"].append(t2 - t1), out["process"].append(t3 - t2)
    return {k: statistics.median(v) for k, v in out.items()}


async def run(path: Path, kind: str, workers: int, args: Any) -> dict[str, float]:
    """One measured run; ``workers`` 0: in-process (no pool), as ``vf-mm eval`` alone."""
    env_args = {"kind": kind, "max_turns": args.turns}
    env = vf_mm.load_environment(ENV, **env_args)
    make = functools.partial(scripted_client, str(path))
    with tempfile.TemporaryDirectory() as tmp:
        common = dict(
            metadata={}, rollouts_per_example=args.rollouts_per_example,
            concurrency=args.concurrency, sampling_args={"max_tokens": 8}, seed=0,
        )  # fmt: skip
        if workers == 0:
            client = make()
            try:
                await evaluate_to_dir(env, client, Path(tmp) / "warm", num_examples=2, **common)
                turns0, parent0 = client.stats.turns, time.process_time()
                start = time.perf_counter()
                agg = await evaluate_to_dir(
                    env, client, Path(tmp) / "run", num_examples=args.examples, **common
                )
                wall = time.perf_counter() - start
                turns = client.stats.turns - turns0
            finally:
                await client.aclose()
            return _row(agg, wall, [], time.process_time() - parent0, turns, args)
        spec = WorkerSpec(ENV, make, env_args=env_args)
        async with WorkerPool(spec, workers) as pool:
            await evaluate_to_dir(
                env, None, Path(tmp) / "warm", workers=pool, num_examples=workers, **common
            )
            turns0 = pool.stats.turns
            pids = [w.pid for w in pool.workers]
            before, parent0 = [cpu_s(p) for p in pids], time.process_time()
            start = time.perf_counter()
            agg = await evaluate_to_dir(
                env, None, Path(tmp) / "run", workers=pool, num_examples=args.examples, **common
            )
            wall = time.perf_counter() - start
            spent = [cpu_s(p) - b for p, b in zip(pids, before, strict=True)]
            parent = time.process_time() - parent0
            turns = pool.stats.turns - turns0
        return _row(agg, wall, spent, parent, turns, args)


def _row(
    agg: dict, wall: float, workers: list[float], parent: float, turns: int, args: Any
) -> dict[str, float]:
    assert agg["errors"] == 0 and agg["count"] == args.examples * args.rollouts_per_example, agg
    cpu = sum(workers) + parent
    return {
        "rollouts_s": agg["count"] / wall,
        "turns_s": turns / wall,
        "cpu_ms_turn": cpu / turns * 1e3,
        "workers_ms_turn": sum(workers) / turns * 1e3,
        "parent_ms_turn": parent / turns * 1e3,
        "cores_busy": cpu / wall,
        "wall": wall,
        "turns": turns,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workers", default="1,2,4,8")
    parser.add_argument("--kinds", default=",".join(_frames_env.KINDS))
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--examples", type=int, default=16)
    parser.add_argument("--rollouts-per-example", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--out", type=Path, default=None, help="also write the numbers as JSON")
    args = parser.parse_args()
    counts = [int(w) for w in args.workers.split(",")]
    cores = os.cpu_count() or 1
    print(
        f"{cpu_name()}, {cores} cores | Python {platform.python_version()}, vf_mm "
        f"{vf_mm.__version__}, transformers {transformers.__version__}"
    )
    n = args.examples * args.rollouts_per_example
    print(
        f"{n} rollouts of {args.turns} image turns, {args.concurrency} in flight; instant "
        "scripted engine; Qwen2.5-VL renderer, real vocabulary and pixel limits\n"
    )
    results: dict[str, Any] = {"cores": cores}
    with tempfile.TemporaryDirectory() as tmp:
        path = build_checkpoint(Path(tmp) / "qwen2_5_vl")
        for kind in args.kinds.split(","):
            base = baselines(path, kind)
            floor = sum(base.values())
            print(
                f"{kind}: one image alone (wall ms, median): environment frame "
                f"{base['env'] * 1e3:.1f}, decode {base['decode'] * 1e3:.1f}, image processor "
                f"{base['process'] * 1e3:.1f}; together {floor * 1e3:.1f}"
            )
            header = (
                f"{'workers':>9}{'rollouts/s':>12}{'img turns/s':>13}{'CPU ms/turn':>13}"
                f"{'workers ms':>12}{'parent ms':>11}{'vf_mm ms':>10}{'cores busy':>12}"
                f"{'eff.':>7}{'eff. (cores)':>14}"
            )
            print(header)
            rows: dict[str, Any] = {}
            for w in [0, *counts]:
                r = asyncio.run(run(path, kind, w, args))
                rows[str(w)] = r
                one = rows.get("1", r)["rollouts_s"]
                eff = r["rollouts_s"] / (max(1, w) * one)
                eff_cores = r["rollouts_s"] / (min(max(1, w), cores) * one)
                r["efficiency"], r["efficiency_cores"] = eff, eff_cores
                own = r["cpu_ms_turn"] - floor * 1e3
                label = "in-proc" if w == 0 else str(w)
                effs = f"{'-':>7}{'-':>14}" if w == 0 else f"{eff:>7.0%}{eff_cores:>14.0%}"
                print(
                    f"{label:>9}{r['rollouts_s']:>12.2f}{r['turns_s']:>13.1f}"
                    f"{r['cpu_ms_turn']:>13.1f}{r['workers_ms_turn']:>12.1f}"
                    f"{r['parent_ms_turn']:>11.1f}{own:>10.1f}{r['cores_busy']:>12.2f}{effs}",
                    flush=True,
                )
            results[kind] = {"baselines": base, "runs": rows}
            print()
    print(
        "CPU ms/turn: the workers' and the parent's CPU time over the image turns run; vf_mm "
        "ms: that minus the frame, its decoding and its processing timed alone; eff.: "
        "rollouts/s over W x the 1-worker rate; eff. (cores): over min(W, cores) x it."
    )
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
