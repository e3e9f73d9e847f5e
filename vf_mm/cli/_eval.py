"""``vf-mm eval``: run an environment against a model, write results, show progress.

    vf-mm eval ENV [-m MODEL] [--backend local|vllm|openai] [-b BASE_URL] [-n N] [-r R]
                   [-c CONC] [-a ENV_ARGS_JSON] [-S SAMPLING_ARGS_JSON] [-o OUTDIR] [--resume]

With no ``-m`` it runs the embedded tiny model (a random-weight Qwen2.5-VL built offline
once and cached), so the whole path works on a fresh machine. Each rollout is appended
to ``OUTDIR/results.jsonl`` as soon as its example's group is scored; ``--resume``
continues an interrupted run without repeating or losing a rollout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

import vf_mm


def register(sub: Any) -> None:
    p = sub.add_parser("eval", help="evaluate a model on an environment")
    p.add_argument("env", help="environment id (installed, or environments/<id>)")
    p.add_argument("-m", "--model", help="checkpoint dir (local), served model name (vllm/openai)")
    p.add_argument("--backend", choices=("local", "vllm", "openai"), default="local")
    p.add_argument(
        "-b", "--base-url", action="append", help="server URL (repeat for several vLLM servers)"
    )
    p.add_argument(
        "-k", "--api-key", default=None, help="API key (openai; default $OPENAI_API_KEY)"
    )
    p.add_argument("-n", "--num-examples", type=int, default=5)
    p.add_argument("-r", "--rollouts-per-example", type=int, default=2)
    p.add_argument("-c", "--max-concurrent", type=int, default=32)
    p.add_argument("-a", "--env-args", type=json.loads, default={}, help="JSON object")
    p.add_argument("-S", "--sampling-args", type=json.loads, default={}, help="JSON object")
    p.add_argument("-s", "--seed", type=int, default=0)
    p.add_argument("-o", "--outdir", type=Path, default=None)
    p.add_argument("--resume", action="store_true", help="continue the run in OUTDIR")
    p.set_defaults(run=run_eval)


def default_model() -> Path:
    """The embedded tiny model: built offline on first use, then reused."""
    from vf_mm.testing import build_tiny_vlm

    cache = Path(os.environ.get("VF_MM_CACHE", Path.home() / ".cache" / "vf_mm"))
    path = cache / "tiny-qwen2_5_vl-v1"
    if not (path / "config.json").exists():
        tmp = path.with_name(path.name + f".tmp{os.getpid()}")
        build_tiny_vlm(tmp, "qwen2_5_vl")
        try:
            tmp.replace(path)
        except OSError:  # another process built it first: use theirs
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
    return path


def run_eval(args: argparse.Namespace) -> int:
    return asyncio.run(_eval(args))


async def _eval(args: argparse.Namespace) -> int:
    from vf_mm.rollouts import EvalProgress, evaluate_to_dir

    console = Console()
    env = vf_mm.load_environment(args.env, **args.env_args)
    model = args.model or (str(default_model()) if args.backend == "local" else None)
    if model is None:
        console.print(f"[red]--backend {args.backend} needs -m MODEL[/]")
        return 2
    outdir = args.outdir or (
        Path("outputs") / f"{env.env_id}--{Path(model).name}--{time.strftime('%Y%m%d-%H%M%S')}"
    )
    metadata = {
        # "config" must match on --resume; where it runs ("server") may change between attempts
        "config": {
            "env_id": args.env,
            "env_args": args.env_args,
            "model": model,
            "num_examples": args.num_examples,
            "rollouts_per_example": args.rollouts_per_example,
            "sampling_args": {**env.sampling_args, **args.sampling_args},
            "seed": args.seed,
        },
        "server": {"backend": args.backend, "base_url": args.base_url},
        "vf_mm_version": vf_mm.__version__,
    }
    backend, renderer = _backend(args, model)
    client = vf_mm.RendererClient(backend, renderer)
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]:.2f} rollouts/s"),
        TextColumn("reward {task.fields[reward]}"),
        TextColumn("errors {task.fields[errors]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )
    try:
        with Progress(*columns, console=console) as bar:
            task = bar.add_task(env.env_id, total=None, rate=0.0, reward="-", errors=0)

            def show(p: EvalProgress) -> None:
                mean = p.mean_reward
                bar.update(
                    task,
                    total=p.total,
                    completed=p.done_before + p.done,
                    rate=p.rate,
                    reward="-" if mean is None else f"{mean:.3f}",
                    errors=p.errors,
                )

            aggregates = await evaluate_to_dir(
                env,
                client,
                outdir,
                metadata=metadata,
                num_examples=args.num_examples,
                rollouts_per_example=args.rollouts_per_example,
                concurrency=args.max_concurrent,
                sampling_args=args.sampling_args,
                seed=args.seed,
                resume=args.resume,
                on_progress=show,
            )
    finally:
        await backend.aclose()
    console.print(_summary_table(env.env_id, model, aggregates))
    console.print(f"results: {outdir}/results.jsonl  (view: vf-mm view {outdir})")
    return 0


def _backend(args: argparse.Namespace, model: str) -> tuple[Any, Any]:
    from vf_mm.renderers import RendererPool, load_renderer

    if args.backend == "openai":
        from vf_mm.inference import OpenAIChatBackend

        base = args.base_url[0] if args.base_url else None
        return OpenAIChatBackend(model, base_url=base, api_key=args.api_key), None
    pool = RendererPool(lambda: load_renderer(model), size=max(2, min(8, os.cpu_count() or 2)))
    if args.backend == "vllm":
        from vf_mm.inference import VLLMBackend

        if not args.base_url:
            raise SystemExit("--backend vllm needs -b BASE_URL")
        return VLLMBackend(args.base_url, model=model), pool
    from vf_mm.inference import LocalBackend

    return LocalBackend(model), pool


def _summary_table(env_id: str, model: str, agg: dict[str, Any]) -> Table:
    table = Table(title=f"{env_id} on {Path(model).name}")
    table.add_column("")
    table.add_column("mean", justify="right")
    table.add_column("std", justify="right")
    reward = agg.get("reward") or {}
    table.add_row("reward", _fmt(reward.get("mean")), _fmt(reward.get("std")))
    for name, stats in (agg.get("metrics") or {}).items():
        table.add_row(f"  {name}", _fmt(stats.get("mean")), _fmt(stats.get("std")))
    for k, value in (agg.get("pass_at_k") or {}).items():
        table.add_row(f"pass@{k}", _fmt(value), "")
    table.add_row("rollouts", str(agg.get("count", 0)), "")
    table.add_row("errors", str(agg.get("errors", 0)), "")
    tokens = agg.get("tokens") or {}
    for name, value in tokens.items():
        table.add_row(f"tokens: {name}", str(value), "")
    table.add_row("time", f"{agg.get('time_s', 0):.1f} s", "")
    return table


def _fmt(value: Any) -> str:
    return "-" if value is None else f"{value:.4f}" if isinstance(value, float) else str(value)
