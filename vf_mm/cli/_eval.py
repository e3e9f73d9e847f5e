"""``vf-mm eval``: run an environment against a model, write results, show progress.

    vf-mm eval ENV [-m MODEL] [--backend local|vllm|openai] [-b BASE_URL] [-n N] [-r R]
                   [-c CONC] [-a ENV_ARGS_JSON] [-S SAMPLING_ARGS_JSON] [-o OUTDIR] [--resume]
                   [-k KEY] [--workers W] [--ray [ADDRESS]] [--shard i/N]
                   [--spawn N [--gpus-per-server K] [-- VLLM_ARGS...]]

Exit status: 0 when every rollout ran (failed ones are recorded with their error), 1
when vf_mm refused the run (an environment that does not load, an OUTDIR in use, a
model that cannot take the environment's images or clips) or when every rollout failed
(nothing was measured: a server that cannot be reached, say; the rows still hold each
error), 2 for bad arguments (every one checked before anything is written), 3 when
``--max-errors`` stopped it, 130 when Ctrl-C did (one line says how many rollouts were
saved; ``--resume`` continues).

A terminal over ``vf_mm.results.evaluate_to_dir``: with no ``-m`` it runs the embedded
tiny model, so the whole path works on a fresh machine. Each rollout is appended to
``OUTDIR/results.jsonl`` as soon as its example's group is scored; ``--resume``
continues an interrupted run without repeating or losing a rollout.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from rich.markup import escape

import vf_mm
from vf_mm._text import shorten
from vf_mm.cli._common import (
    EXIT_STOPPED,
    HelpFormatter,
    RunCount,
    add_run_arguments,
    check_run_arguments,
    image_backend_record,
    load_environment,
    make_client,
    progress_bar,
    resolve_model,
    reward_text,
    run_interruptibly,
    summary_table,
    worker_pool,
    workers_tokenizer,
)
from vf_mm.cli._console import cli_console
from vf_mm.errors import MissingDependencyError, WorkerError


def register(sub: Any) -> None:
    p = sub.add_parser(
        "eval",
        help="evaluate a model on an environment",
        description="Run R rollouts of the first N rows of an environment's eval split, "
        "score them, and write OUTDIR/results.jsonl, metadata.json and assets/ (images and "
        "clips by content hash). A rollout that fails is recorded with its error; the run goes on. "
        "Exit status: 0 done, 1 refused (an environment that cannot be found or loaded, an "
        "OUTDIR in use, a resume with other settings, a model that cannot take the "
        "environment's images or clips) or every rollout failed (nothing measured: "
        "each row keeps its error), 2 bad arguments (checked before anything is written: "
        "a directory that holds no rollout is reused, with or without --resume), 3 stopped "
        "by --max-errors, 130 interrupted (Ctrl-C: the rollouts saved so far are whole, "
        "and --resume continues). Memory does not grow with the run's length: rows are read as "
        "rollout slots free up (-c), each rollout is written and released, the summary is "
        "read back from results.jsonl, and every cache that lives for the whole run is "
        "bounded in bytes: --image-cache-mb, --kv-cache-mb, and 8 MiB of asset hashes "
        "remembered (docs/long-runs.md).",
        formatter_class=HelpFormatter,
    )
    add_run_arguments(
        p,
        backends=("local", "vllm", "openai"),
        num_examples=(5, "eval rows (-1: all)"),
        rollouts_per_example=(2, "rollouts per row"),
        output="results",
    )
    p.add_argument(
        "-o",
        "--outdir",
        type=Path,
        default=None,
        help="run directory (default: outputs/ENV--MODEL--TIME)",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in OUTDIR; rollouts that failed run again",
    )
    p.add_argument(
        "--keep-errors",
        action="store_true",
        help="with --resume: keep failed rollouts as they are instead of running them again",
    )
    p.set_defaults(run=run_eval)


def run_eval(args: argparse.Namespace) -> int:
    check_run_arguments(args)  # exit 2 before anything is loaded or written
    # --spawn: this run's vLLM servers, stopped when it ends; Ctrl-C: one line, exit 130
    return run_interruptibly(args, lambda count: _eval(args, count), _interrupted)


def _interrupted(count: RunCount) -> str:
    """The line an interrupted eval ends with: the rollouts saved, and how to go on
    (``--resume`` runs only what is missing; a directory with none is reused as well)."""
    if count.where is None:
        return "interrupted before the run started; nothing was written"
    return (
        f"interrupted: {count.of_total()} rollouts saved in {count.where}; continue with --resume"
    )


async def _eval(args: argparse.Namespace, count: RunCount) -> int:
    from vf_mm.results import EvalProgress, evaluate_to_dir

    console = cli_console()
    env = load_environment(args)
    model = resolve_model(args)
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
            # the renderer's pixels differ by backend: a resume must not mix them
            "image_backend": (
                image_backend_record(args.image_backend, model)
                if args.backend != "openai"
                else None
            ),
            # so do the local model's logprobs and samples by weight dtype
            "dtype": (args.dtype or "float32") if args.backend == "local" else None,
            **({"shard": str(args.shard)} if args.shard is not None else {}),
        },
        "server": {"backend": args.backend, "base_url": args.base_url},
        "vf_mm_version": vf_mm.__version__,
    }
    scaled = args.workers is not None or args.ray is not None
    # with workers, each builds its own client; this process only checks the renderer,
    # with the tokenizer it loads once for them all
    client = None if scaled else make_client(args, model)
    tokenizer = workers_tokenizer(args, model) if scaled else None
    problem = _media_refused(env, client, args, model, tokenizer)
    if problem is not None:  # every rollout would fail the same way: say it once, up front
        if client is not None:
            await client.backend.aclose()
        console.print(f"[red]{escape(problem)}[/]")
        return 1
    try:
        async with worker_pool(args, model, tokenizer=tokenizer) as workers:
            with progress_bar(console, "") as bar:
                task = bar.add_task(env.env_id, total=None, rate=0.0, reward="-", errors=0)

                def show(p: EvalProgress) -> None:
                    # first called once the results store is open: now it holds the run
                    count.where, count.done, count.total = (
                        str(outdir),
                        p.done_before + p.done,
                        p.total,
                    )
                    bar.update(
                        task,
                        total=p.total,
                        completed=p.done_before + p.done,
                        rate=p.rate,
                        reward=reward_text(p.mean_reward),
                        errors=p.errors,
                    )

                aggregates = await evaluate_to_dir(
                    env,
                    client,
                    outdir,
                    workers=workers,
                    shard=args.shard,
                    metadata=metadata,
                    num_examples=args.num_examples,
                    rollouts_per_example=args.rollouts_per_example,
                    concurrency=args.max_concurrent,
                    sampling_args=args.sampling_args,
                    seed=args.seed,
                    resume=args.resume,
                    retry_errors=not args.keep_errors,
                    max_errors=args.max_errors,
                    on_progress=show,
                    # runs written before these keys existed: PIL pixels, float32 local weights
                    config_defaults={
                        "image_backend": "pil",
                        "dtype": "float32" if args.backend == "local" else None,
                    },
                )
    except (WorkerError, MissingDependencyError) as exc:  # workers that cannot start
        console.print(f"[red]{escape(str(exc))}[/]")
        return 1
    finally:
        if client is not None:
            await client.backend.aclose()
    console.print(_summary(env.env_id, model, aggregates))
    console.print(f"results: {outdir}/results.jsonl  (view: vf-mm view {outdir})")
    if aggregates.get("stopped"):
        console.print(f"[red]{aggregates['stopped']}[/]; --resume continues the run")
        return EXIT_STOPPED
    rollouts, errors = aggregates.get("count") or 0, aggregates.get("errors") or 0
    if rollouts and errors == rollouts:  # a script must not take a run that measured nothing
        kinds = aggregates.get("error_kinds") or {}
        first = next(iter(kinds.items()), None)
        why = f" (first: {first[0]}: {first[1].get('first', '')})" if first else ""
        console.print(f"[red]every rollout failed ({errors} of {rollouts}){escape(why)}[/]")
        return 1
    return 0


def _media_refused(
    env: Any, client: Any, args: argparse.Namespace, model: str, tokenizer: Any
) -> str | None:
    """Why the model cannot take the environment's first eval prompt (images for a text
    model, clips for a model without video), or None. ``client`` None (workers build
    their own): the renderer is loaded here to check (with ``tokenizer``'s copy, the
    model's ``TokenizerSnapshot``, when there is one)."""
    from vf_mm.types import image_parts, video_parts

    if args.backend == "openai":
        return None  # a chat API: the server decides
    rows = env.get_eval_dataset(1)
    if not rows:
        return None
    try:
        prompt = env.format_prompt(rows[0])
    except Exception:  # a bad row fails its own rollouts, with its own error
        return None
    if client is not None:
        vision = client.vision
    else:
        from vf_mm.renderers import load_renderer

        loaded = None if tokenizer is None else tokenizer.copy()
        renderer = load_renderer(model, image_backend=args.image_backend, tokenizer=loaded)
        vision = getattr(renderer, "vision", None)
    if image_parts(prompt) and vision is None:
        return f"{model} is a text model, but {env.env_id}'s prompts hold images"
    if video_parts(prompt) and getattr(vision, "video", None) is None:
        from vf_mm.models import VIDEO_FAMILIES

        return (
            f"{model} renders no video, but {env.env_id}'s prompts hold clips (video is "
            f"rendered for {', '.join(VIDEO_FAMILIES)} checkpoints)"
        )
    return None


def _summary(env_id: str, model: str, agg: dict[str, Any]) -> Any:
    reward = agg.get("reward") or {}
    rows: list[tuple[Any, ...]] = [("reward", reward.get("mean"), reward.get("std"))]
    rows += [
        (f"  {name}", stats.get("mean"), stats.get("std"))
        for name, stats in (agg.get("metrics") or {}).items()
    ]
    rows += [(f"pass@{k}", value) for k, value in (agg.get("pass_at_k") or {}).items()]
    rows += [("rollouts", agg.get("count", 0)), ("errors", agg.get("errors", 0))]
    if agg.get("truncated"):  # ran out of context, scored on what they had
        rows.append(("truncated (out of context)", agg["truncated"]))
    rows += [
        (f"  {kind['count']} × {name}", shorten(kind["first"], 60))  # noqa: RUF001
        for name, kind in (agg.get("error_kinds") or {}).items()
    ]
    rows += [
        (f"tokens: {name}", value)
        for name, value in (agg.get("tokens") or {}).items()
        if not (name == "rows_without_tokens" and value == 0)
    ]
    rows.append(("time", f"{agg.get('time_s', 0):.1f} s"))
    return summary_table(f"{env_id} on {Path(model).name}", rows)
