"""What ``vf-mm eval`` and ``vf-mm rollout`` share: their arguments, the model and backend
they run, and the progress bar and summary table they draw.

The commands stay thin: each parses its own few options, builds the environment and a
``RendererClient`` here, and hands them to a library function (``evaluate_to_dir``,
``stream_rollouts``) whose progress callback drives the bar.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import difflib
import json
import math
import re
import sys
import time
from collections.abc import Callable, Coroutine, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

import vf_mm
from vf_mm.cli._console import cli_console

if TYPE_CHECKING:
    from vf_mm.models import TokenizerSnapshot


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object, not {type(value).__name__}")
    return value


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """argparse's help with each option's default, but only where it tells something:
    not for a help line that already says its default, nor a default of None, False or
    an empty list or object (an option left out)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        left_out = default is None or default is False or default == [] or default == {}
        if "default" in text or left_out or default is argparse.SUPPRESS:
            return text
        return super()._get_help_string(action)


def add_run_arguments(
    p: argparse.ArgumentParser,
    *,
    backends: tuple[str, ...],
    num_examples: tuple[int, str],
    rollouts_per_example: tuple[int, str],
    output: str,
) -> None:
    """The arguments every command that runs an environment takes: which environment,
    which model on which backend, how many rollouts, the environment's and sampler's
    settings, and how many failed rollouts stop the run (``--max-errors``). ``num_examples`` / ``rollouts_per_example`` are (default, help);
    each help line names only the ``backends`` this command has. ``output`` is what the
    command writes ("results" or "groups"), for ``--workers`` and ``--shard``."""
    p.add_argument(
        "env",
        help="environment id (installed, or a folder <id>/ under --env-dir, $VF_MM_ENV_PATH or "
        "./environments), or a path to an environment folder or module file",
    )
    p.add_argument(
        "--env-dir",
        action="append",
        default=[],
        metavar="DIR",
        help="a folder of environment folders to look in first (repeatable)",
    )
    api = "openai" in backends
    p.add_argument(
        "-m",
        "--model",
        help="checkpoint directory (local, and vllm: the renderer needs its tokenizer and "
        "processor)"
        + (", or the API's model name (openai)" if api else "")
        + "; default: the embedded tiny model",
    )
    kinds = {
        "local": "in-process transformers",
        "vllm": "vLLM servers (-b)",
        "openai": "an OpenAI-compatible API",
    }
    p.add_argument(
        "--backend",
        choices=backends,
        default="local",
        help="; ".join(f"{name}: {kinds[name]}" for name in backends),
    )
    p.add_argument(
        "-b",
        "--base-url",
        action="append",
        type=server_url,
        help="server URL (repeat for several vLLM servers)",
    )
    p.add_argument(
        "-k",
        "--api-key",
        action="append",
        default=None,
        help="the servers' API key, sent as Authorization: Bearer (vllm: once for every "
        "server, or once per -b in order"
        + ("; openai: default $OPENAI_API_KEY" if api else "")
        + "). Never logged",
    )
    if "vllm" in backends:
        p.add_argument(
            "--spawn",
            type=int,
            default=None,
            metavar="N",
            help="--backend vllm: start N vLLM servers of -m for this run (instead of -b), "
            "stopped when it ends; arguments after -- go to each server",
        )
        p.add_argument(
            "--gpus-per-server",
            type=int,
            default=None,
            metavar="K",
            help="with --spawn: GPUs per server, from CUDA_VISIBLE_DEVICES in order (K > 1 adds "
            "--tensor-parallel-size K; 0: CPU servers; default 1)",
        )
    p.add_argument("-n", "--num-examples", type=int, default=num_examples[0], help=num_examples[1])
    p.add_argument(
        "-r",
        "--rollouts-per-example",
        type=int,
        default=rollouts_per_example[0],
        help=rollouts_per_example[1],
    )
    p.add_argument("-c", "--max-concurrent", type=int, default=32, help="rollouts at once")
    p.add_argument(
        "-a",
        "--env-args",
        type=_json_object,
        default={},
        metavar="JSON",
        help="JSON object of the keyword arguments for the environment's load_environment",
    )
    p.add_argument(
        "-S",
        "--sampling-args",
        type=_json_object,
        default={},
        metavar="JSON",
        help="JSON object of sampling args, vLLM's names, e.g. '{\"max_tokens\": 64, "
        "\"temperature\": 0.7}' (over the environment's own)",
    )
    p.add_argument("-s", "--seed", type=int, default=0, help="seeds sampling per rollout")
    p.add_argument(
        "--max-errors",
        type=int,
        default=None,
        metavar="N",
        help="stop the run once N rollouts have failed (exit status 3); default: never",
    )
    add_image_backend_argument(p)
    add_engine_arguments(p)
    add_memory_arguments(p)
    add_scale_arguments(p, output=output)


#: the numbers a run takes: (attribute, flag, what it must be, the check); an attribute a
#: command lacks, or left unset (None), is not checked
_NUMBERS: tuple[tuple[str, str, str, Any], ...] = (
    ("num_examples", "-n/--num-examples", "a number of rows >= 1, or -1 for all of them",
     lambda v: v == -1 or v >= 1),
    ("rollouts_per_example", "-r/--rollouts-per-example", ">= 1", lambda v: v >= 1),
    ("max_concurrent", "-c/--max-concurrent", ">= 1", lambda v: v >= 1),
    ("workers", "--workers", ">= 1", lambda v: v >= 1),
    ("gpus_per_server", "--gpus-per-server", ">= 0", lambda v: v >= 0),
    ("max_errors", "--max-errors", ">= 1", lambda v: v >= 1),
    ("hwm", "--hwm", ">= 1", lambda v: v >= 1),
    ("send_timeout", "--send-timeout", "a number of seconds > 0",
     lambda v: math.isfinite(v) and v > 0),
)  # fmt: skip


def check_run_arguments(args: argparse.Namespace) -> None:
    """Every number and the sampling arguments of ``vf-mm eval`` / ``vf-mm rollout``,
    checked before anything is loaded or written: a bad one exits 2 with one line naming
    the flag (and, for an unknown sampling arg, the nearest known one). A run refused
    here leaves no directory, stream file or metadata behind to block the next try."""
    for name, flag, rule, ok in _NUMBERS:
        value = getattr(args, name, None)
        if value is not None and not ok(value):
            _refuse(args, f"{flag} must be {rule}, not {value}")
    outdir = getattr(args, "outdir", None)  # vf-mm eval's run directory
    for path in (outdir, *outdir.parents) if outdir is not None else ():
        if path.exists():  # the nearest that exists must be a directory to write under
            if not path.is_dir():
                _refuse(args, f"-o/--outdir: {path} is a file, not a directory")
            break
    from vf_mm.inference import SamplingParams

    known = sorted(SamplingParams.__dataclass_fields__)
    for key in args.sampling_args:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            _refuse(
                args,
                f"-S/--sampling-args: unknown sampling arg {key!r}{hint}; known: "
                + ", ".join(known),
            )
    for key, value in args.sampling_args.items():  # one at a time: the message names it
        if key == "stop_token_ids" and not isinstance(value, list):
            _refuse(
                args, f"-S/--sampling-args: stop_token_ids must be a list of ids, not {value!r}"
            )
        try:
            SamplingParams.from_dict({key: value})
        except (TypeError, ValueError) as exc:  # a value of the wrong type or out of range
            _refuse(args, f"-S/--sampling-args: {key}: {exc}")


def load_environment(args: argparse.Namespace) -> Any:
    """The environment ``args`` name, loaded with ``-a``'s arguments. Arguments its
    ``load_environment`` does not take exit 2 naming them (a mistake in the command, not
    in the environment); its own sampling args must make valid ``SamplingParams`` with
    ``-S`` over them (else ``EnvironmentLoadError``: the environment's mistake)."""
    from vf_mm.errors import EnvironmentArgsError, EnvironmentLoadError

    try:
        env = vf_mm.load_environment(args.env, search_paths=args.env_dir, **args.env_args)
    except EnvironmentArgsError as exc:
        _refuse(args, f"-a/--env-args: {exc}")
    try:
        env.sampling(args.sampling_args)
    except (TypeError, ValueError) as exc:
        raise EnvironmentLoadError(
            f"{env.env_id}: its sampling_args {env.sampling_args!r} (with -S over them) are "
            f"not valid: {exc}"
        ) from exc
    return env


#: --kv-cache-mb's default on CPU, where the KV cache is in RAM (on a GPU the local
#: backend's own default: its KV pool, 60% of the GPU memory free after loading)
KV_CACHE_MB_CPU = 128
#: --image-cache-mb's default: processed images kept by the renderer (a run pulls rows as
#: it goes, so only what is in flight and repeated images need it)
IMAGE_CACHE_MB = 256


def add_memory_arguments(p: argparse.ArgumentParser) -> None:
    """``--image-cache-mb`` and ``--kv-cache-mb``: the bounds, in bytes, of the caches that
    live for the whole run, so a run of any length reaches a steady state."""
    p.add_argument(
        "--image-cache-mb",
        type=_megabytes,
        default=IMAGE_CACHE_MB,
        metavar="MB",
        help="bound of the renderer's cache of processed images and clips (pixel values, "
        f"by content and source; least recently used go first; default {IMAGE_CACHE_MB})",
    )
    p.add_argument(
        "--kv-cache-mb",
        type=_megabytes,
        default=None,
        metavar="MB",
        help="local backend: bound of its KV memory: on a GPU the KV pool that running "
        "requests and the prefix cache share (unset: 60%% of the GPU memory free after "
        f"loading), on CPU the prefix cache of KV tensors (default {KV_CACHE_MB_CPU}); the "
        "vision tower's outputs get an eighth more",
    )


def _megabytes(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of MB") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0 MB, got {value}")
    return value


def add_scale_arguments(p: argparse.ArgumentParser, *, output: str) -> None:
    """``--workers``, ``--ray`` and ``--shard``: where the rollouts run. ``output``:
    what the command writes, "results" (an eval directory) or "groups" (a stream)."""
    landing = (
        "results still land here, once each"
        if output == "results"
        else "every group is still packed and sent from here, once"
    )
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        metavar="W",
        help="run the rollouts in W worker processes, each with its own client (its own "
        "local model, or its own connection to the vLLM servers), so rendering is not "
        f"bound to one process; {landing} (default: in this process)",
    )
    p.add_argument(
        "--ray",
        nargs="?",
        const="",
        default=None,
        metavar="ADDRESS",
        help="place the workers (--workers W, default 1) on a Ray cluster: ADDRESS as "
        "ray.init takes it; alone, the cluster $RAY_ADDRESS names, else a local one "
        "(needs pip install 'vf-mm[ray]')",
    )
    p.add_argument(
        "--shard",
        type=shard_argument,
        default=None,
        metavar="i/N",
        help="run only the examples in shard i of N, split by example id (the same split "
        "on every machine); "
        + (
            "vf-mm merge joins the shards' output directories"
            if output == "results"
            else "the shards share the run id, so their group ids (RUN_ID/EXAMPLE_ID) never "
            "collide: one trainer may take them all"
        ),
    )


def shard_argument(text: str) -> Any:
    from vf_mm.workers import parse_shard

    try:
        return parse_shard(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


@contextlib.asynccontextmanager
async def worker_pool(
    args: argparse.Namespace, model: str, *, tokenizer: TokenizerSnapshot | None = None
) -> Any:
    """``--workers W`` / ``--ray``: a started ``WorkerPool`` whose workers build their
    client as this process would (``make_client``) and load the environment as it did;
    None without them. Stopped when the block ends.

    The model's tokenizer is loaded here once (or ``tokenizer``, loaded already) and sent
    to every worker: a large vocabulary takes seconds to load, once per renderer of every
    worker otherwise, all at once on the node's cores."""
    if args.workers is None and args.ray is None:
        yield None
        return
    if args.workers is not None and args.workers < 1:
        _refuse(args, f"--workers must be >= 1, not {args.workers}")
    import functools

    from vf_mm.workers import WorkerPool, WorkerSpec

    if tokenizer is None:
        tokenizer = workers_tokenizer(args, model)
    spec = WorkerSpec(
        args.env,
        functools.partial(make_client, args, model, tokenizer=tokenizer),
        env_args=dict(args.env_args),
        env_dirs=[str(d) for d in args.env_dir],
    )
    pool = WorkerPool(
        spec,
        args.workers or 1,
        transport="ray" if args.ray is not None else "process",
        ray_address=args.ray or None,
    )
    async with pool:
        yield pool


#: --dtype's choices: the local backend's weight dtypes
DTYPES = ("float32", "bfloat16", "float16")


def add_engine_arguments(p: argparse.ArgumentParser) -> None:
    """``--device`` and ``--dtype``: where the local backend runs its model, and in what."""
    p.add_argument(
        "--device",
        type=device_argument,
        default=None,
        help="local backend: where the model runs: cpu, cuda or cuda:N (default cpu)",
    )
    p.add_argument(
        "--dtype",
        choices=DTYPES,
        default=None,
        help="local backend: the weights' dtype (default float32)",
    )


def device_argument(text: str) -> str:
    """``--device``'s value, checked: ``cpu``, ``cuda`` or ``cuda:N``, and for CUDA a
    device this machine has (a clear argument error otherwise, never a traceback)."""
    match = re.fullmatch(r"(cpu|cuda)(?::(\d+))?", text.strip())
    if match is None or (match.group(1) == "cpu" and match.group(2) is not None):
        raise argparse.ArgumentTypeError(f"{text!r} is not a device: use cpu, cuda or cuda:N")
    if match.group(1) == "cuda":
        import torch

        if not torch.cuda.is_available():
            built = (
                "without CUDA" if torch.version.cuda is None else f"for CUDA {torch.version.cuda}"
            )
            raise argparse.ArgumentTypeError(
                f"{text}: no CUDA device is available here (torch {torch.__version__}, built "
                f"{built}); use cpu"
            )
        index, count = int(match.group(2) or 0), torch.cuda.device_count()
        if index >= count:
            raise argparse.ArgumentTypeError(
                f"{text}: this machine has {count} CUDA device{'s' if count != 1 else ''} "
                f"(cuda:0 to cuda:{count - 1})"
            )
    return text.strip()


def local_backend_options(args: argparse.Namespace) -> dict[str, Any]:
    """``LocalBackend``'s ``device`` and ``dtype`` from ``--device`` / ``--dtype``, and its
    KV memory from ``--kv-cache-mb`` (on a GPU also the KV pool's size)."""
    import torch

    kv_mb = getattr(args, "kv_cache_mb", None)
    on_cpu = (args.device or "cpu") == "cpu"
    if kv_mb is None and on_cpu and hasattr(args, "kv_cache_mb"):
        kv_mb = KV_CACHE_MB_CPU  # in RAM: bounded like the image cache (GPU: the backend's)
    options: dict[str, Any] = {
        "device": args.device or "cpu",
        "dtype": getattr(torch, args.dtype) if args.dtype else None,
    }
    if kv_mb is not None:
        options["prefix_cache_bytes"] = kv_mb << 20
        if not on_cpu:
            options["kv_pool_bytes"] = kv_mb << 20
    return options


def image_backend_record(choice: str, model: str | Path | None) -> str:
    """Whose numbers ``model``'s images get under ``--image-backend choice``, as a run's
    configuration records it (pixels differ by backend: a resume must not mix them).
    A checkpoint whose type cannot be read is taken as a family with a PIL backend."""
    from vf_mm.errors import UnsupportedModelError
    from vf_mm.models import model_type, resolve_image_backend

    family = None
    if model is not None:
        try:
            family = model_type(model)
        except UnsupportedModelError:
            family = None
    return resolve_image_backend(choice, family=family)


def add_image_backend_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--image-backend",
        choices=["auto", "pil", "torchvision", "torch"],
        default="auto",
        help="image processing for the renderer: auto picks what transformers' AutoProcessor "
        "and vLLM use on this machine (torchvision where it imports, else pil); the two give "
        "different pixels for resized images, so match the engine and the trainer. torch is "
        "vf_mm's torch-only port of the torchvision-only processors (LFM2-VL, Kimi-K2.5), "
        "torchvision's pixels without torchvision (auto uses it there)",
    )


def resolve_model(args: argparse.Namespace) -> str | None:
    """``-m`` as given, else the embedded tiny model for the local backend, else None.
    ``--device`` / ``--dtype`` with another backend are refused here (exit 2): they would
    change nothing."""
    check_engine_flags(args)
    if args.model:
        return str(args.model)
    if args.backend != "local":
        return None
    from vf_mm.models import embedded_model  # built offline on first use, then reused

    return str(embedded_model())


def check_engine_flags(args: argparse.Namespace) -> None:
    """``--device`` / ``--dtype`` only with the local backend (exit 2 otherwise: with
    another backend, ``--spawn``'s servers included, they would silently change nothing)."""
    keys = getattr(args, "api_key", None) or []
    servers = len(args.base_url or []) or (getattr(args, "spawn", None) or 0)
    if len(keys) > 1 and args.backend == "openai":
        _refuse(args, "--backend openai takes one -k")
    if len(keys) > 1 and len(keys) != servers:
        _refuse(args, f"{len(keys)} -k for {servers} -b: give one key, or one per -b")
    if args.backend != "local" and (args.device is not None or args.dtype is not None):
        flag = "--device" if args.device is not None else "--dtype"
        _refuse(
            args,
            f"{flag} is for the local backend; --backend {args.backend} runs the model "
            "elsewhere (give a vLLM server's own flags after --)",
        )


@contextlib.contextmanager
def spawned_servers(args: argparse.Namespace) -> Iterator[None]:
    """``--spawn N``: N vLLM servers of ``-m`` for the length of the block, their URLs in
    ``args.base_url``; a progress line on stderr while they start. Without it, nothing.
    Arguments that do not go with it are refused (exit 2) before anything starts."""
    extra = list(getattr(args, "server_args", None) or [])
    check_engine_flags(args)
    if getattr(args, "spawn", None) is None:
        if extra:
            _refuse(args, f"arguments after -- ({' '.join(extra)}) go to --spawn's servers")
        if getattr(args, "gpus_per_server", None) is not None:
            _refuse(args, "--gpus-per-server is for --spawn's servers")
        yield
        return
    if args.backend != "vllm" or not args.model or args.base_url or args.spawn < 1:
        _refuse(args, "--spawn N needs --backend vllm, -m MODEL, N >= 1 and no -b")
    from vf_mm.inference import VLLMServers

    err = cli_console(stderr=True)
    shown: list[Any] = [None, 0.0]

    def progress(ready: int, total: int, elapsed_s: float) -> None:
        if not err.is_terminal and (ready, total) == shown[0] and elapsed_s - shown[1] < 30:
            return  # plain lines: when the count changes, else every 30 s
        shown[:] = [(ready, total), elapsed_s]
        line = (
            f"waiting for {total} vLLM server{'s' if total > 1 else ''}: {ready}/{total} "
            f"healthy, {elapsed_s:.0f} s (logs: {servers.log_dir})"
        )
        err.print(line, end="\r" if err.is_terminal and ready < total else "\n", highlight=False)

    try:
        servers = VLLMServers(
            args.model,
            args.spawn,
            gpus_per_server=1 if args.gpus_per_server is None else args.gpus_per_server,
            extra_args=extra,
            on_progress=progress,
        )
    except ValueError as exc:  # the arguments themselves (a reserved flag after --, ...)
        _refuse(args, str(exc))
    with servers:
        args.base_url = servers.base_urls
        yield


def _refuse(args: argparse.Namespace, message: str) -> NoReturn:
    """Arguments that do not go together: say why, exit 2 (as argparse does)."""
    print(f"vf-mm {args.command}: {message}", file=sys.stderr)
    raise SystemExit(2)


def workers_tokenizer(args: argparse.Namespace, model: str) -> TokenizerSnapshot | None:
    """The model's tokenizer, loaded once for every worker to copy; None where the workers
    render nothing (``--backend openai``) or ``model`` is no checkpoint directory whose
    tokenizer loads (each worker then loads what it can, and says why not)."""
    if args.backend == "openai":
        return None
    from vf_mm.models import TokenizerSnapshot

    return TokenizerSnapshot.of_checkpoint(model)


def make_client(
    args: argparse.Namespace, model: str, *, tokenizer: TokenizerSnapshot | None = None
) -> vf_mm.RendererClient:
    """``vf_mm.make_client`` with what the flags say (close it with ``aclose``);
    ``tokenizer``: the model's, loaded already (a worker's, sent by its parent)."""
    keys = args.api_key or []  # their count was checked with the other flags
    if args.backend == "vllm" and not args.base_url:
        raise SystemExit("--backend vllm needs -b BASE_URL")
    return vf_mm.make_client(
        model,
        backend=args.backend,
        base_url=args.base_url or None,
        api_key=keys if len(keys) > 1 else (keys[0] if keys else None),
        image_backend=args.image_backend,
        image_cache_bytes=getattr(args, "image_cache_mb", IMAGE_CACHE_MB) << 20,
        backend_options=local_backend_options(args) if args.backend == "local" else None,
        tokenizer=tokenizer,
    )


#: exit status of a run that ``--max-errors`` stopped
EXIT_STOPPED = 3
#: exit status of a run that Ctrl-C (SIGINT) stopped, as a shell reports one
EXIT_INTERRUPTED = 130


@dataclass(slots=True)
class RunCount:
    """How far a run got, for the line it ends with when interrupted: ``where`` it
    writes (None until its output is open), ``done`` of ``total`` (None: not known)."""

    where: str | None = None
    done: int = 0
    total: int | None = None

    def of_total(self) -> str:
        return f"{self.done}/{'?' if self.total is None else self.total}"


def run_interruptibly(
    args: argparse.Namespace,
    command: Callable[[RunCount], Coroutine[Any, Any, int]],
    interrupted: Callable[[RunCount], str],
) -> int:
    """``command(count)`` run to its end in an event loop, inside ``--spawn``'s servers.
    Ctrl-C (SIGINT) ends it with one line on stderr, ``interrupted(count)`` (what was
    saved and how to go on), and exit status 130, never a traceback: asyncio cancels the
    run, and each writer and sender closes on its way out, so what it wrote is whole."""
    count = RunCount()
    try:
        with spawned_servers(args):
            return asyncio.run(command(count))
    except KeyboardInterrupt:
        print(f"vf-mm {args.command}: {interrupted(count)}", file=sys.stderr)
        return EXIT_INTERRUPTED


class PlainProgress:
    """Progress as plain lines, for logs and pipes (no terminal to redraw a bar on): one
    line every ``every_s`` seconds and one at the end, each with done/total, rate, mean
    reward and errors. Speaks the subset of ``rich.progress.Progress`` the commands use."""

    def __init__(self, console: Console, unit: str, *, every_s: float = 10.0) -> None:
        self.console, self.unit, self.every_s = console, unit, every_s
        self._fields: dict[str, Any] = {}
        self._last = 0.0
        self._shown: tuple[Any, ...] = ()

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self._print()

    def add_task(self, description: str, **fields: Any) -> TaskID:
        self._fields = {"description": description, "completed": 0, **fields}
        return TaskID(0)

    def update(self, task: TaskID, **fields: Any) -> None:
        self._fields.update(fields)
        now = time.monotonic()
        if now - self._last >= self.every_s or self._done():
            self._print()

    def _done(self) -> bool:
        total = self._fields.get("total")
        return total is not None and self._fields.get("completed", 0) >= total

    def _print(self) -> None:
        f = self._fields
        state = (f.get("completed"), f.get("total"), f.get("errors"))
        if not f or state == self._shown:
            return
        self._last, self._shown = time.monotonic(), state
        total = "?" if f.get("total") is None else f["total"]
        unit = f" {self.unit}" if self.unit else ""
        extra = f", {f['mb']:.1f} MB sent" if "mb" in f else ""
        self.console.print(
            f"{f['description']}: {f.get('completed', 0)}/{total}{unit} done, "
            f"{f.get('rate', 0.0):.2f} rollouts/s, reward {f.get('reward', '-')}, "
            f"errors {f.get('errors', 0)}{extra}",
            highlight=False,
            soft_wrap=True,
        )


def progress_bar(
    console: Console, unit: str, extra: Iterable[ProgressColumn] = ()
) -> Progress | PlainProgress:
    """The bar both commands draw: done/total, rate, mean reward, errors (``extra`` after);
    plain periodic lines instead when the output is not a terminal."""
    if not console.is_terminal:
        return PlainProgress(console, unit)
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn((f"{unit}  " if unit else "") + "{task.fields[rate]:.2f} rollouts/s"),
        TextColumn("reward {task.fields[reward]}"),
        TextColumn("errors {task.fields[errors]}"),
        *extra,
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
    )


def reward_text(mean: float | None) -> str:
    return "-" if mean is None else f"{mean:.3f}"


def summary_table(title: str, rows: Iterable[tuple[str, Any] | tuple[str, Any, Any]]) -> Table:
    """A two- or three-column table (name, value[, std]) with numbers formatted alike."""
    rows = list(rows)
    table = Table(title=title)
    table.add_column("")
    table.add_column("mean" if any(len(r) == 3 for r in rows) else "", justify="right")
    if any(len(r) == 3 for r in rows):
        table.add_column("std", justify="right")
    width = max((len(r) for r in rows), default=2)
    for row in rows:
        cells = [row[0], *(fmt(v) for v in row[1:])]
        table.add_row(*cells, *[""] * (width - len(cells)))
    return table


def fmt(value: Any) -> str:
    """``-`` for a missing value, 4 decimals for a float, ``str`` for anything else."""
    return "-" if value is None else f"{value:.4f}" if isinstance(value, float) else str(value)


def server_url(value: str) -> str:
    """An argparse type: a server URL as ``http(s)://HOST[:PORT]`` (a bare ``host:port``
    is a usage mistake, exit 2, not a traceback from the backend)."""
    if not re.match(r"^https?://[^/\s]", value, re.IGNORECASE):
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a server URL: write http://HOST:PORT (or https://)"
        )
    return value
