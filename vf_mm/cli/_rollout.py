"""``vf-mm rollout``: run an environment's train split and stream each scored group to a trainer.

    vf-mm rollout ENV --stream PATH|tcp://HOST:PORT|ipc://PATH [-m MODEL]
                  [--backend local|vllm] [-b BASE_URL] [-n N] [-r R] [-c CONC]
                  [-a ENV_ARGS_JSON] [-S SAMPLING_ARGS_JSON] [-s SEED]
                  [--hwm N] [--send-timeout S] [--bind]
                  [--spawn N [--gpus-per-server K] [-- VLLM_ARGS...]]

A terminal over ``vf_mm.training.stream_rollouts``: ``R`` rollouts of each of the first
``N`` rows of the environment's *train* split (``-n -1``, the default, is all of it), each
scored group packed as one ``vf_mm.group/1`` message and sent through a
``vf_mm.training.GroupSender``: to a stream file, or to a ZeroMQ endpoint where the
trainer's ``GroupReceiver`` listens (the trainer binds, workers connect; ``--bind`` turns
that round). When the trainer is slow the send blocks (``--hwm`` groups queued at most).

With no ``-m`` it runs the embedded tiny model (as ``vf-mm eval`` does).
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import TextColumn

import vf_mm
from vf_mm.cli._common import (
    add_run_arguments,
    make_client,
    progress_bar,
    resolve_model,
    reward_text,
    spawned_servers,
    summary_table,
)

_ABORT_LINGER_S = 5.0


def register(sub: Any) -> None:
    p = sub.add_parser(
        "rollout",
        help="run an environment's train split and stream scored groups to a trainer",
        description="Run R rollouts (a group) of each of the first N rows of an "
        "environment's train split and send each scored group, as one frame with each "
        "distinct image's tensors once, to a stream file or a ZeroMQ endpoint where a "
        "trainer listens. A slow trainer blocks the sender (bounded memory).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_run_arguments(
        p,
        backends=("local", "vllm"),
        num_examples=(-1, "train rows (-1: all)"),
        rollouts_per_example=(4, "group size"),
    )
    p.add_argument(
        "--stream",
        required=True,
        help="where groups go: a stream file path, tcp://HOST:PORT or ipc://PATH",
    )
    p.add_argument("--hwm", type=int, default=8, help="groups queued at most (ZeroMQ)")
    p.add_argument(
        "--send-timeout",
        type=float,
        default=None,
        help="give up when the trainer takes no group for this many seconds (default: wait)",
    )
    p.add_argument(
        "--bind", action="store_true", help="bind the ZeroMQ endpoint (the trainer connects)"
    )
    p.set_defaults(run=run_rollout)


def run_rollout(args: argparse.Namespace) -> int:
    with spawned_servers(args):  # --spawn: this run's vLLM servers, stopped when it ends
        return asyncio.run(_rollout(args))


async def _rollout(args: argparse.Namespace) -> int:
    from vf_mm.training import GroupSender, RolloutProgress, is_endpoint, stream_rollouts

    console = Console()
    is_endpoint(args.stream)  # an unsupported target fails before anything loads
    if args.rollouts_per_example < 1:
        console.print("[red]-r must be at least 1[/]")
        return 2
    env = vf_mm.load_environment(args.env, search_paths=args.env_dir, **args.env_args)
    model = resolve_model(args)
    if model is None:
        console.print(f"[red]--backend {args.backend} needs -m MODEL[/]")
        return 2
    # a finished run waits for the trainer to take its last groups (--send-timeout bounds it)
    sender = GroupSender(
        args.stream,
        hwm=args.hwm,
        timeout_s=args.send_timeout,
        linger_s=args.send_timeout,
        bind=args.bind,
    )
    client = make_client(args, model)
    try:
        with progress_bar(console, "groups", [TextColumn("{task.fields[mb]:.1f} MB sent")]) as bar:
            task = bar.add_task(env.env_id, total=None, rate=0.0, reward="-", errors=0, mb=0.0)

            def show(p: RolloutProgress) -> None:
                bar.update(
                    task,
                    total=p.total_groups,
                    completed=p.groups,
                    rate=p.rate,
                    reward=reward_text(p.mean_reward),
                    errors=p.errors,
                    mb=p.bytes_sent / 1e6,
                )

            progress = await stream_rollouts(
                env,
                client,
                sender,
                num_examples=args.num_examples,
                rollouts_per_example=args.rollouts_per_example,
                concurrency=args.max_concurrent,
                sampling_args=args.sampling_args,
                seed=args.seed,
                on_progress=show,
            )
    except BaseException as exc:  # tell the trainer why the stream ends early; wait briefly
        sender.linger_s = min(sender.linger_s or _ABORT_LINGER_S, _ABORT_LINGER_S)
        await sender.aclose(f"{type(exc).__name__}: {exc}")
        raise
    finally:
        await client.backend.aclose()
    if sender.pending:
        console.print(f"waiting for the trainer to take the last {sender.pending} groups...")
    await sender.aclose()
    rows: list[tuple[str, Any]] = [
        ("model", Path(model).name),
        ("sent to", str(args.stream)),
        ("groups sent", f"{progress.groups} / {progress.total_groups}"),
        ("rollouts", progress.rollouts),
        ("errors", progress.errors),
    ]
    if progress.repacked:
        rows.append(("groups sent stripped", progress.repacked))
    rows += [
        ("mean reward", progress.mean_reward),
        ("sent", f"{progress.bytes_sent / 1e6:.2f} MB"),
        ("rollouts/s", f"{progress.rate:.2f}"),
        ("time", f"{progress.elapsed:.1f} s"),
    ]
    if sender.endpoint is not None:
        took = "yes" if sender.delivered else "NO (gone, or still busy)"
        rows.append(("trainer took all", took))
    console.print(summary_table(f"vf-mm rollout {env.env_id}", rows))
    return 0
