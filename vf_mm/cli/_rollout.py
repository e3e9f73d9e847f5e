"""``vf-mm rollout``: run an environment's train split and stream each scored group to a trainer.

    vf-mm rollout ENV --stream PATH|tcp://HOST:PORT|ipc://PATH [-m MODEL]
                  [--backend local|vllm] [-b BASE_URL] [-n N] [-r R] [-c CONC]
                  [-a ENV_ARGS_JSON] [-S SAMPLING_ARGS_JSON] [-s SEED] [--max-errors N]
                  [--hwm N] [--send-timeout S] [--bind] [--run-id ID] [-k KEY]
                  [--secret-key PATH --trainer-key PATH | --insecure]
                  [--workers W] [--ray [ADDRESS]] [--shard i/N]
                  [--images tensors|encoded|ref [--image-store DIR|URL]]
                  [--spawn N [--gpus-per-server K] [-- VLLM_ARGS...]]

A terminal over ``vf_mm.training.stream_rollouts``: ``R`` rollouts of each of the first
``N`` rows of the environment's *train* split (``-n -1``, the default, is all of it), each
scored group packed as one ``vf_mm.group/1`` message and sent through a
``vf_mm.training.GroupSender``: to a stream file, or to a ZeroMQ endpoint where the
trainer's ``GroupReceiver`` listens (the trainer binds, workers connect; ``--bind`` turns
that round). When the trainer is slow the send blocks (``--hwm`` groups queued at most).
``--images`` picks how a group carries its images: ``tensors`` (the renderer's model
inputs), ``encoded`` (each image's encoded bytes; the trainer rebuilds the inputs with a
``vf_mm.training.ImageRebuilder`` and checks them bit for bit) or ``ref`` (the bytes
written once to ``--image-store``, a directory the trainer shares or an object store's
URL such as ``s3://bucket/images``, and a reference with their sha256 in the group).

With no ``-m`` it runs the embedded tiny model (as ``vf-mm eval`` does). Ctrl-C ends it
with one line (the groups sent so far, each whole) and exit status 130; ``--max-errors N``
ends it once N rollouts have failed, with exit status 3. Either way the stream's end
marker says why it ended early (``docs/formats/transport.md``). There is no resume: the
same command sends every group again under the same ids, which a trainer with a ledger
takes once.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import TextColumn

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
)
from vf_mm.cli._console import cli_console
from vf_mm.errors import MissingDependencyError, WorkerError

_ABORT_LINGER_S = 5.0


def register(sub: Any) -> None:
    p = sub.add_parser(
        "rollout",
        help="run an environment's train split and stream scored groups to a trainer",
        description="Run R rollouts (a group) of each of the first N rows of an "
        "environment's train split and send each scored group, as one frame with each "
        "distinct image's tensors once, to a stream file or a ZeroMQ endpoint where a "
        "trainer listens. A slow trainer blocks the sender (bounded memory). There is no "
        "resume: the same command sends every group again, under the same group ids, and a "
        "trainer with a ledger takes each once. Exit status: 0 every group sent (and, to "
        "an endpoint, taken by the trainer), 1 refused (an environment that cannot be "
        "found or loaded, a stream target that cannot be one) or a trainer that did not "
        "take every group, 2 bad arguments (checked before anything is written), 3 stopped "
        "by --max-errors, 130 interrupted (Ctrl-C: the groups written so far are whole). "
        "A run that stops early says why in the stream's end marker.",
        formatter_class=HelpFormatter,
    )
    add_run_arguments(
        p,
        backends=("local", "vllm"),
        num_examples=(-1, "train rows (-1: all)"),
        rollouts_per_example=(4, "group size"),
        output="groups",
    )
    p.add_argument(
        "--stream",
        required=True,
        metavar="PATH|URL",
        help="where groups go: a stream file path (written anew), tcp://HOST:PORT or "
        "ipc://PATH (a trainer's vf_mm.training.GroupReceiver)",
    )
    p.add_argument(
        "--hwm",
        type=int,
        default=8,
        metavar="N",
        help="ZeroMQ: groups sent and not yet acknowledged by the trainer at most; the next "
        "send waits",
    )
    p.add_argument(
        "--send-timeout",
        type=float,
        default=None,
        metavar="S",
        help="ZeroMQ: give up when the trainer takes no group for this many seconds, and wait "
        "at most this long for it to take the last ones (default: wait)",
    )
    p.add_argument(
        "--bind",
        action="store_true",
        help="ZeroMQ: bind the endpoint, and the trainer connects (default: the trainer binds)",
    )
    p.add_argument(
        "--secret-key",
        type=Path,
        default=None,
        metavar="PATH",
        help="this worker's CURVE secret key file (vf-mm keys NAME): with --trainer-key, the "
        "stream is authenticated and encrypted, and goes only to that trainer",
    )
    p.add_argument(
        "--trainer-key",
        type=Path,
        default=None,
        metavar="PATH",
        help="the trainer's CURVE public key file (its NAME.key)",
    )
    p.add_argument(
        "--insecure",
        action="store_true",
        help="send over plain TCP to an address other than 127.0.0.1 (anyone on the path can "
        "read the groups, and anyone who reaches the trainer can send some)",
    )
    p.add_argument(
        "--run-id",
        default=None,
        metavar="ID",
        help="names the run in every group's id (RUN_ID/EXAMPLE_ID): a trainer with a ledger "
        "takes each id once, so a worker restarted with the same arguments resends nothing "
        "twice; default: a hash of this command's whole configuration (model, environment "
        "and its arguments, rows, group size, sampling, seed, image backend, dtype)",
    )
    p.add_argument(
        "--images",
        choices=("tensors", "encoded", "ref"),
        default="tensors",
        help="how each group carries its images: tensors (model inputs), encoded (each "
        "image's encoded bytes, rebuilt and checked on the trainer: ~20-100x fewer bytes "
        "for photos) or ref (a reference under --image-store and its sha256)",
    )
    p.add_argument(
        "--image-store",
        default=None,
        metavar="DIR|URL",
        help="--images ref: where image bytes are written, each once: a directory the "
        "trainer shares (it reads it with ImageRebuilder(..., roots=[DIR])) or an fsspec URL "
        "such as s3://bucket/images (ImageRebuilder(..., stores=[URL]); its fsspec driver "
        "installed, credentials from the environment)",
    )
    p.add_argument(
        "--advantages",
        choices=("grpo", "none"),
        default="grpo",
        help="grpo: each group's rollouts carry group-normalised advantages (a failed "
        "rollout's is none); none: the trainer computes them from the rewards",
    )
    p.set_defaults(run=run_rollout)


def run_rollout(args: argparse.Namespace) -> int:
    check_run_arguments(args)  # exit 2 before anything is loaded or written
    # --spawn: this run's vLLM servers, stopped when it ends; Ctrl-C: one line, exit 130
    return run_interruptibly(args, lambda count: _rollout(args, count), _interrupted)


def _interrupted(count: RunCount) -> str:
    """The line an interrupted rollout ends with: the groups sent, and what running the
    same command again does (there is no resume: it sends every group again, under the
    same group ids, so a trainer with a ledger takes each once; a file is written anew)."""
    if count.where is None:
        return "interrupted before the first group; nothing was sent"
    from vf_mm.training._internal import is_endpoint

    if is_endpoint(count.where):
        return (
            f"interrupted: {count.of_total()} groups sent to {count.where}; the same command "
            "sends every group again, under the same group ids (a trainer with a ledger "
            "takes each once)"
        )
    return (
        f"interrupted: {count.of_total()} groups written to {count.where}, each whole; the "
        "same command writes the file anew, every group under the same group id"
    )


async def _rollout(args: argparse.Namespace, count: RunCount) -> int:
    from vf_mm.training import GroupSender
    from vf_mm.training._internal import is_endpoint

    console = cli_console()
    is_endpoint(args.stream)  # an unsupported target fails before anything loads
    env = load_environment(args)
    model = resolve_model(args)
    if model is None:
        console.print(f"[red]--backend {args.backend} needs -m MODEL[/]")
        return 2
    # a finished run waits for the trainer to take its last groups (--send-timeout bounds it)
    if (args.secret_key is None) != (args.trainer_key is None):
        console.print("[red]--secret-key and --trainer-key go together[/]")
        return 2
    image_modes = _image_modes(args, model, console)
    if image_modes is None:
        return 2
    sender = GroupSender(
        args.stream,
        hwm=args.hwm,
        timeout_s=args.send_timeout,
        linger_s=args.send_timeout,
        bind=args.bind,
        secret_key=args.secret_key,
        trainer_key=args.trainer_key,
        insecure=args.insecure,
    )
    count.where = str(args.stream)  # the sender is open: groups go there from now on
    scaled = args.workers is not None or args.ray is not None
    client = None if scaled else make_client(args, model)
    run_id = args.run_id or _run_id(args, env, model)
    try:
        async with worker_pool(args, model) as workers:
            progress = await _stream(
                args, env, client, sender, console, run_id, workers, image_modes, count
            )
    except BaseException as exc:  # tell the trainer why the stream ends early; wait briefly
        sender.linger_s = min(sender.linger_s or _ABORT_LINGER_S, _ABORT_LINGER_S)
        cancelled = isinstance(exc, asyncio.CancelledError)  # Ctrl-C cancels the run
        await sender.aclose("interrupted" if cancelled else f"{type(exc).__name__}: {exc}")
        if isinstance(exc, (WorkerError, MissingDependencyError)):
            console.print(f"[red]{escape(str(exc))}[/]")
            return 1
        raise
    finally:
        if client is not None:
            await client.backend.aclose()
    if sender.pending:
        console.print(f"waiting for the trainer to take the last {sender.pending} groups...")
    await sender.aclose(progress.stopped)  # the end marker says why a stopped run ended
    rows: list[tuple[str, Any]] = [
        ("model", Path(model).name),
        ("sent to", str(args.stream)),
        ("run id", progress.run_id),
        (
            "groups sent",
            f"{progress.groups} / {'?' if progress.total_groups is None else progress.total_groups}",
        ),
        ("rollouts", progress.rollouts),
        ("errors", progress.errors),
        ("images", args.images),
        ("advantages", args.advantages),
    ]
    if progress.truncated:
        rows.append(("truncated (out of context)", progress.truncated))
    if progress.repacked:
        rows.append(("groups sent stripped", progress.repacked))
    if progress.flat_groups:
        rows.append(("groups with all-equal rewards (advantage 0)", progress.flat_groups))
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
    if sender.endpoint is not None and not sender.delivered:
        # sent is not delivered: a script must not take this run for a success
        console.print(
            f"[red]the trainer at {sender.endpoint} did not take every group "
            f"({sender.pending} not acknowledged): it is gone, or still busy[/]"
        )
        return 1
    if progress.stopped is not None:
        console.print(f"[red]{escape(progress.stopped)}[/]")
        return EXIT_STOPPED
    return 0


def _image_modes(args: argparse.Namespace, model: str, console: Console) -> dict[str, Any] | None:
    """``stream_rollouts``' image-mode arguments from ``--images`` / ``--image-store``
    (the processing loaded as the renderer loads it: same checkpoint, same
    ``--image-backend``); None after printing why they do not go together."""
    if args.images == "tensors":
        if args.image_store is not None:
            console.print("[red]--image-store goes with --images ref[/]")
            return None
        return {}
    if args.images == "ref" and args.image_store is None:
        console.print(
            "[red]--images ref needs --image-store DIR (a directory the trainer shares)[/]"
        )
        return None
    if args.images == "encoded" and args.image_store is not None:
        console.print("[red]--image-store goes with --images ref[/]")
        return None
    from vf_mm.errors import UnsupportedModelError
    from vf_mm.training import ImageProcessing, ImageStore

    try:  # a checkpoint without vision fails here, before anything starts; the frames
        # record the processing of the renderers that made the tensors (the client's, or
        # the one each worker reports), not this one
        ImageProcessing.from_checkpoint(model, image_backend=args.image_backend)
    except UnsupportedModelError as exc:
        console.print(
            f"[red]--images {args.images} needs a vision checkpoint: {escape(str(exc))}[/]"
        )
        return None
    if args.images == "ref" and str(args.image_store).startswith("memory:"):
        console.print(
            f"[red]--image-store {escape(str(args.image_store))}: a memory:// store lives in "
            "this process only, and the trainer reads the references from another: name a "
            "shared directory or an object store[/]"
        )
        return None
    try:
        store = ImageStore(args.image_store) if args.images == "ref" else None
    except (ValueError, ImportError, OSError) as exc:  # a bad URL, no driver, no directory
        console.print(f"[red]--image-store {escape(str(args.image_store))}: {escape(str(exc))}[/]")
        return None
    return {"images": args.images, "image_store": store}


def _run_id(args: argparse.Namespace, env: Any, model: str) -> str:
    """The run's id from this command's whole configuration (what decides its groups),
    so the same command run again, on any machine, names its groups the same."""
    config = {
        "env": args.env,
        "env_args": args.env_args,
        "model": model,
        "num_examples": args.num_examples,
        "rollouts_per_example": args.rollouts_per_example,
        "sampling_args": {**env.sampling_args, **args.sampling_args},
        "seed": args.seed,
        "image_backend": image_backend_record(args.image_backend, model),
        "dtype": args.dtype if args.backend == "local" else None,
    }
    digest = hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()
    return f"{env.env_id}-{digest[:12]}"


async def _stream(
    args: argparse.Namespace,
    env: Any,
    client: Any,
    sender: Any,
    console: Console,
    run_id: str,
    workers: Any,
    image_modes: dict[str, Any],
    count: RunCount,
) -> Any:
    from vf_mm.training import RolloutProgress, stream_rollouts

    with progress_bar(console, "groups", [TextColumn("{task.fields[mb]:.1f} MB sent")]) as bar:
        task = bar.add_task(env.env_id, total=None, rate=0.0, reward="-", errors=0, mb=0.0)

        def show(p: RolloutProgress) -> None:
            count.done, count.total = p.groups, p.total_groups
            bar.update(
                task,
                total=p.total_groups,
                completed=p.groups,
                rate=p.rate,
                reward=reward_text(p.mean_reward),
                errors=p.errors,
                mb=p.bytes_sent / 1e6,
            )

        return await stream_rollouts(
            env,
            client,
            sender,
            num_examples=args.num_examples,
            rollouts_per_example=args.rollouts_per_example,
            concurrency=args.max_concurrent,
            sampling_args=args.sampling_args,
            seed=args.seed,
            on_progress=show,
            run_id=run_id,
            workers=workers,
            shard=args.shard,
            advantages=args.advantages,
            max_errors=args.max_errors,
            **image_modes,
        )
