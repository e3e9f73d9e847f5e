"""``vf-mm rollout``: run an environment's train split and stream each scored group to a trainer.

    vf-mm rollout ENV --stream PATH|tcp://HOST:PORT|ipc://PATH [-m MODEL]
                  [--backend local|vllm] [-b BASE_URL] [-n N] [-r R] [-c CONC]
                  [-a ENV_ARGS_JSON] [-S SAMPLING_ARGS_JSON] [-s SEED]
                  [--hwm N] [--send-timeout S] [--bind]

Runs ``R`` rollouts of each of the first ``N`` rows of the environment's *train* split
(``env.get_dataset``; ``-n -1``, the default, is all of it), and as soon as an example's
group is scored packs it with ``vf_mm.rollouts.pack_group`` (one ``vf_mm.group/1``
message, each distinct image's tensors once) and sends it through
``vf_mm.trainer.GroupSender``: to a stream file, or to a ZeroMQ endpoint where the
trainer's ``GroupReceiver`` listens (the trainer binds, workers connect; ``--bind`` turns
that round). When the trainer is slow the send blocks (``--hwm`` groups queued at most),
which holds back the rollouts behind it: memory stays bounded. A rollout that failed is
sent too, with its ``error`` set; a group that cannot be packed is sent stripped to its
scores, with the reason as each rollout's error. Nothing is dropped.

With no ``-m`` it runs the embedded tiny model (as ``vf-mm eval`` does).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import time
from collections.abc import Callable, Mapping
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
from vf_mm.errors import TransportError

_ABORT_LINGER_S = 5.0


def register(sub: Any) -> None:
    p = sub.add_parser(
        "rollout", help="run an environment's train split and stream scored groups to a trainer"
    )
    p.add_argument("env", help="environment id (installed, or environments/<id>)")
    p.add_argument(
        "--stream",
        required=True,
        help="where groups go: a stream file path, tcp://HOST:PORT or ipc://PATH",
    )
    p.add_argument("-m", "--model", help="checkpoint dir (local), served model name (vllm)")
    p.add_argument("--backend", choices=("local", "vllm"), default="local")
    p.add_argument(
        "-b", "--base-url", action="append", help="server URL (repeat for several vLLM servers)"
    )
    p.add_argument("-n", "--num-examples", type=int, default=-1, help="train rows (-1: all)")
    p.add_argument("-r", "--rollouts-per-example", type=int, default=4, help="group size")
    p.add_argument("-c", "--max-concurrent", type=int, default=32)
    p.add_argument("-a", "--env-args", type=json.loads, default={}, help="JSON object")
    p.add_argument("-S", "--sampling-args", type=json.loads, default={}, help="JSON object")
    p.add_argument("-s", "--seed", type=int, default=0, help="seeds sampling per rollout")
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


@dataclasses.dataclass(slots=True)
class RolloutProgress:
    """Counts so far, handed to the progress callback after each sent group."""

    total_groups: int
    groups: int = 0
    rollouts: int = 0
    errors: int = 0  # rollouts sent with an error
    repacked: int = 0  # groups sent stripped because packing or encoding them failed
    bytes_sent: int = 0
    rewards: list[float] = dataclasses.field(default_factory=list)
    started: float = dataclasses.field(default_factory=time.perf_counter)

    @property
    def mean_reward(self) -> float | None:
        return sum(self.rewards) / len(self.rewards) if self.rewards else None

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    @property
    def rate(self) -> float:
        elapsed = self.elapsed
        return self.rollouts / elapsed if elapsed > 0 else 0.0


async def stream_rollouts(
    env: Any,
    client: Any,
    sender: Any,
    *,
    num_examples: int = -1,
    rollouts_per_example: int = 1,
    concurrency: int = 32,
    sampling_args: Mapping[str, Any] | None = None,
    seed: int | None = None,
    on_progress: Callable[[RolloutProgress], None] | None = None,
) -> RolloutProgress:
    """Run the train split's groups and send each through ``sender`` once it is scored."""
    from vf_mm.rollouts import pack_group

    rows = env.get_dataset(num_examples)
    progress = RolloutProgress(total_groups=len(rows))
    pending: dict[Any, list[tuple[int, Any]]] = {}
    if on_progress is not None:
        on_progress(progress)

    async def deliver(example_id: Any, done: list[tuple[int, Any]]) -> None:
        done.sort(key=lambda pair: pair[0])
        indices = [index for index, _ in done]
        outputs = [output for _, output in done]
        try:
            group = await asyncio.to_thread(
                pack_group, outputs, rollout_indices=indices, example_id=example_id
            )
            nbytes = await sender.asend(group)
        except TransportError:
            raise
        except Exception as exc:  # keep the scores and say why the rest is missing
            reason = f"group not packed: {type(exc).__name__}: {exc}"
            outputs = [
                dataclasses.replace(
                    o,
                    prompt=[],
                    completion=[],
                    trajectory=[],
                    info={},
                    answer=None,
                    error=f"{o.error}; {reason}" if o.error else reason,
                )
                for o in outputs
            ]
            group = pack_group(outputs, rollout_indices=indices, example_id=example_id)
            nbytes = await sender.asend(group)
            progress.repacked += 1
        progress.groups += 1
        progress.bytes_sent += nbytes
        for output in outputs:
            progress.rollouts += 1
            if output.error:
                progress.errors += 1
            elif output.reward is not None:
                progress.rewards.append(output.reward)
        if on_progress is not None:
            on_progress(progress)

    async def collect(output: Any, rollout_index: int) -> None:
        # evaluate hands over a group's rollouts one after another once it is scored
        done = pending.setdefault(output.example_id, [])
        done.append((rollout_index, output))
        if len(done) == rollouts_per_example:
            del pending[output.example_id]
            await deliver(output.example_id, done)

    await env.evaluate(
        client,
        rows=rows,
        rollouts_per_example=rollouts_per_example,
        concurrency=concurrency,
        sampling_args=sampling_args,
        seed=seed,
        on_result=collect,
    )
    for example_id, done in list(pending.items()):  # never expected; never dropped either
        del pending[example_id]
        await deliver(example_id, done)
    return progress


def run_rollout(args: argparse.Namespace) -> int:
    return asyncio.run(_rollout(args))


async def _rollout(args: argparse.Namespace) -> int:
    from vf_mm.cli._eval import _backend, default_model
    from vf_mm.trainer import GroupSender, is_endpoint

    console = Console()
    is_endpoint(args.stream)  # an unsupported target fails before anything loads
    if args.rollouts_per_example < 1:
        console.print("[red]-r must be at least 1[/]")
        return 2
    env = vf_mm.load_environment(args.env, **args.env_args)
    model = args.model or (str(default_model()) if args.backend == "local" else None)
    if model is None:
        console.print(f"[red]--backend {args.backend} needs -m MODEL[/]")
        return 2
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("groups  {task.fields[rate]:.2f} rollouts/s"),
        TextColumn("reward {task.fields[reward]}"),
        TextColumn("errors {task.fields[errors]}"),
        TextColumn("{task.fields[mb]:.1f} MB sent"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )
    # a finished run waits for the trainer to take its last groups (--send-timeout bounds it)
    sender = GroupSender(
        args.stream,
        hwm=args.hwm,
        timeout_s=args.send_timeout,
        linger_s=args.send_timeout,
        bind=args.bind,
    )
    backend, renderer = _backend(args, model)
    client = vf_mm.RendererClient(backend, renderer)
    try:
        with Progress(*columns, console=console) as bar:
            task = bar.add_task(env.env_id, total=None, rate=0.0, reward="-", errors=0, mb=0.0)

            def show(p: RolloutProgress) -> None:
                mean = p.mean_reward
                bar.update(
                    task,
                    total=p.total_groups,
                    completed=p.groups,
                    rate=p.rate,
                    reward="-" if mean is None else f"{mean:.3f}",
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
        await backend.aclose()
    if sender.pending:
        console.print(f"waiting for the trainer to take the last {sender.pending} groups...")
    await sender.aclose()
    console.print(_summary_table(env.env_id, model, args.stream, progress, sender))
    return 0


def _summary_table(env_id: str, model: str, target: str, p: RolloutProgress, sender: Any) -> Table:
    from pathlib import Path

    table = Table(title=f"vf-mm rollout {env_id}")
    table.add_column("")
    table.add_column("", justify="right")
    mean = p.mean_reward
    table.add_row("model", Path(model).name)
    table.add_row("sent to", str(target))
    table.add_row("groups sent", f"{p.groups} / {p.total_groups}")
    table.add_row("rollouts", str(p.rollouts))
    table.add_row("errors", str(p.errors))
    if p.repacked:
        table.add_row("groups sent stripped", str(p.repacked))
    table.add_row("mean reward", "-" if mean is None else f"{mean:.4f}")
    table.add_row("sent", f"{p.bytes_sent / 1e6:.2f} MB")
    table.add_row("rollouts/s", f"{p.rate:.2f}")
    table.add_row("time", f"{p.elapsed:.1f} s")
    if sender.endpoint is not None:
        table.add_row("trainer took all", "yes" if sender.delivered else "NO (gone, or still busy)")
    return table
