"""A GPU node kept fed: ``vf-mm serve --device cuda`` driven by ``vf-mm eval --workers W``,
against the engine's own rate with no client at all, in the same run.

Model: random weights in Qwen2.5-VL-3B's shape (``bench/local_gpu.py`` builds it), bfloat16,
the pool engine. Workload: ``gridnav`` (medium: 8 turns, a new rendered image each turn),
``--examples`` x ``--rollouts-per-example`` rollouts, ``--concurrency`` in flight,
``--max-tokens`` sampled tokens a turn at temperature 1, seeded per rollout.

1. **Engine-bound rate** (the baseline). A ``LocalBackend`` built as ``vf-mm serve``
   builds it (``--max-batch 32``, 5 ms batch window) runs the workload in-process once
   through ``evaluate_to_dir`` (after a warm-up run of the same workload: kernels, the CUDA
   graphs), every ``GenerateRequest`` recorded by the rollout slot that sent it. Then the
   recorded requests are replayed straight into the engine, each slot's requests in order,
   every slot at once, with nothing else running: no environment, rendering, HTTP or
   results. Its rollouts/s is the engine-bound rate. (The replay's sampled tokens are
   compared with the recorded ones: seeded sampling repeats them, so the prompts that
   follow are the ones the engine would have seen.)
2. **Served.** ``vf-mm serve --model CKPT --device cuda --dtype bfloat16`` in a subprocess;
   a warm-up ``vf-mm eval`` of the whole workload; then ``vf-mm eval gridnav --backend
   vllm -b URL --workers W`` for each W, as a user runs it. Rollouts/s is the count over
   the run's own ``time_s`` (metadata.json: from the results store's opening to the last
   row; worker start is reported apart); the GPU's busy fraction is NVML's utilization
   (the share of time a kernel ran), sampled every 50 ms while the server's prefix-cache
   counter moved (the window in which requests arrived).

The replay runs twice; the faster sets the rate. Each is labelled by its prefills:
**aligned** when every turn's requests, arriving at once, made one prefill per turn of
the rollouts in flight (the engine's best case, which no client reproduces), **split**
when the cohort split early and stayed split (as a served run's does).

Reported: rollouts/s per W, its ratio to the engine-bound rate (goal at W = 8: >= 0.8),
scaling efficiency rate(W) / (W x rate(1)), GPU busy, and the in-process eval's rate.

    python bench/gpu_fed.py [--shape 3b|tiny] [--device cuda] [--dtype bfloat16]
                            [--workers 1,2,4,8] [--examples 32] [--rollouts-per-example 4]
                            [--concurrency 32] [--max-tokens 32] [--out FILE.json]
                            [--batch-windows 5[,20,...]] [--profile DIR] [--trace DIR]

``--trace DIR`` records the engine's timeline (``bench/_engine_trace.py``) in the replay
and in each server, and prints where each run's engine time went (decode, prefill,
admission, idle with nothing to run) and a request's mean wait in the engine's queue.

``--shape tiny --device cpu --dtype float32`` runs the same path on a CPU in a minute.
Needs what ``bench/local_gpu.py`` needs, and starlette, uvicorn and pydantic for the server.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import itertools
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import torch

import vf_mm
from vf_mm.inference import LocalBackend
from vf_mm.results import evaluate_to_dir

sys.path.insert(0, str(Path(__file__).parent))
import _engine_trace
from _phases import show as show_phases
from _phases import split as split_phases
from local_gpu import build_checkpoint

CLI = [sys.executable, "-m", "vf_mm.cli._main"]


class Sampler:
    """GPU utilization (NVML, percent of time a kernel ran) and an optional counter read
    every ``every_s`` on a thread; ``busy(window)`` averages the samples in a window."""

    def __init__(self, counter: Any = None, every_s: float = 0.05) -> None:
        self.samples: list[tuple[float, float | None, float | None]] = []
        self.counter, self.every_s = counter, every_s
        self._stop = threading.Event()
        self._handle: Any = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        except Exception:  # no NVML (a CPU run): no utilization
            self._nvml = None

    def _util(self) -> float | None:
        if self._handle is None:
            return None
        return float(self._nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu)

    def __enter__(self) -> Sampler:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            value = None
            if self.counter is not None:
                with contextlib.suppress(Exception):
                    value = self.counter()
            self.samples.append((time.perf_counter(), self._util(), value))
            self._stop.wait(self.every_s)

    def busy(self, start: float | None = None, end: float | None = None) -> float | None:
        """Mean utilization (0..1) of the samples in [start, end]; by default the window
        in which the counter moved."""
        if start is None:
            moved = [t for (t, _, v), (_, _, w) in zip(self.samples[1:], self.samples, strict=False)
                     if v is not None and w is not None and v != w]  # fmt: skip
            if not moved:
                return None
            start, end = moved[0] - self.every_s, moved[-1]
        values = [u for t, u, _ in self.samples if start <= t <= (end or t) and u is not None]
        return sum(values) / len(values) / 100 if values else None


class Recorder:
    """Wraps a backend's ``generate``: each request and its completion, by the asyncio
    task (a rollout slot of ``Environment.evaluate``) that sent it, and when it was sent
    and answered."""

    def __init__(self, backend: LocalBackend) -> None:
        self.by_slot: dict[int, list[tuple[Any, list[int]]]] = defaultdict(list)
        self.times: dict[int, list[tuple[float, float]]] = defaultdict(list)
        self.on = False
        inner = backend.generate

        async def generate(request: Any) -> Any:
            sent = time.perf_counter()
            result = await inner(request)
            if self.on:
                slot = id(asyncio.current_task())
                self.by_slot[slot].append((request, list(result.completion_ids)))
                self.times[slot].append((sent, time.perf_counter()))
            return result

        backend.generate = generate  # type: ignore[method-assign]
        self.inner = inner


async def engine_bound(path: Path, args: Any) -> dict[str, Any]:
    """The in-process eval (recorded), then the replay of its requests: rollouts/s each."""
    backend = LocalBackend(
        path, device=args.device, dtype=getattr(torch, args.dtype), max_batch=32,
        batch_window_ms=5.0,
    )  # fmt: skip
    recorder = Recorder(backend)
    client = vf_mm.make_client(path, backend=backend)
    env = vf_mm.load_environment("gridnav", seed=0)
    n = args.examples * args.rollouts_per_example
    sampling = {"max_tokens": args.max_tokens, "temperature": 1.0}

    evaluated: list[tuple[float, float]] = []  # each evaluate's perf_counter span

    async def evaluate(name: str) -> tuple[float, dict]:
        with tempfile.TemporaryDirectory() as tmp:
            start = time.perf_counter()
            agg = await evaluate_to_dir(
                env, client, Path(tmp) / name, metadata={}, num_examples=args.examples,
                rollouts_per_example=args.rollouts_per_example, concurrency=args.concurrency,
                sampling_args=sampling, seed=0,
            )  # fmt: skip
            evaluated.append((start, time.perf_counter()))
            return time.perf_counter() - start, agg

    try:
        await evaluate("warm")
        backend.clear_cache()
        recorder.on = True
        before = engine_work(backend)
        wall, agg = await evaluate("recorded")
        work = {k: v - before[k] for k, v in engine_work(backend).items()}
        recorder.on = False
        in_process = agg["count"] / wall
        slots = list(recorder.by_slot.values())
        turns = sum(len(s) for s in slots)
        waits = [end - sent for t in recorder.times.values() for sent, end in t]
        gaps = [  # a slot's time between an answer and its next request: the client's turn
            nxt[0] - prev[1]
            for t in recorder.times.values()
            for prev, nxt in itertools.pairwise(t)
            if nxt[0] - prev[1] < 1.0  # (a new rollout in the slot starts from its prompt)
        ]
        print(
            f"in-process eval (client and engine in one process): {agg['count']} rollouts, "
            f"{turns} requests in {wall:.1f} s = {in_process:.2f} rollouts/s "
            f"({agg['errors']} errors); a request waits {1e3 * sum(waits) / len(waits):.0f} ms "
            f"for its answer, the client's turn takes {1e3 * sum(gaps) / max(len(gaps), 1):.0f}"
            f" ms (median {1e3 * sorted(gaps)[len(gaps) // 2] if gaps else 0:.0f}); "
            f"{work['prefills']:.0f} prefills, {work['decode_steps']:.0f} decode steps",
            flush=True,
        )
        replays = []
        for _ in range(2):
            backend.clear_cache()
            same = [0, 0]

            waited: list[float] = []

            async def chain(
                slot: list[tuple[Any, list[int]]],
                same: list[int] = same,
                waited: list[float] = waited,
            ) -> None:
                for request, ids in slot:
                    sent = time.perf_counter()
                    result = await recorder.inner(request)
                    waited.append(time.perf_counter() - sent)
                    same[0] += list(result.completion_ids) == ids
                    same[1] += 1

            before = engine_work(backend)
            with Sampler() as sampler:
                start = time.perf_counter()
                await asyncio.gather(*(chain(s) for s in slots))
                end = time.perf_counter()
            work = {k: v - before[k] for k, v in engine_work(backend).items()}
            replays.append(
                {"t0": start, "t1": end, "wall": end - start, "busy": sampler.busy(start, end)}
                | {"same": same[0] / same[1]}
                | work
                | {"wait_ms": 1e3 * sum(waited) / len(waited)}
            )
        # a turn's requests all reach an engine with no client at once: each turn is one
        # prefill of every rollout in flight (aligned), unless the cohort split early and
        # stayed split, as a served run's always is; the ratio to the rate depends on it
        cohorts = turns / min(args.concurrency, n)
        for r in replays:
            r["kind"] = "aligned" if r["prefills"] <= 1.1 * cohorts else "split"
        best = min(replays, key=lambda r: r["wall"])
        rate = n / best["wall"]
        busy = "-" if best["busy"] is None else f"{best['busy']:.0%}"
        walls = ", ".join(
            f"{r['wall']:.1f} ({r['prefills']:.0f} prefills: {r['kind']})" for r in replays
        )
        print(
            f"engine-bound (replay, no client): {turns} requests in {best['wall']:.1f} s = "
            f"{rate:.2f} rollouts/s, GPU busy {busy}; sampled tokens equal to the recorded "
            f"run's in {best['same']:.0%} of requests; replays took {walls} s; "
            f"{best['prefills']:.0f} prefills, {best['decode_steps']:.0f} decode steps; a "
            f"request waits {best['wait_ms']:.0f} ms for its answer",
            flush=True,
        )
        return {
            "in_process": in_process,
            "in_process_span": evaluated[-1],
            "engine_bound": rate,
            "replays": replays,
        }
    finally:
        await backend.aclose()


def engine_work(backend: LocalBackend) -> dict[str, float]:
    """The engine's prefill and decode forwards so far."""
    return {"prefills": backend.prefills_run, "decode_steps": backend.steps_run}


def metrics(url: str, *, timeout: float = 5.0) -> dict[str, float]:
    """The server's ``/metrics`` samples by name (labels dropped; one engine, one model)."""
    text = httpx.get(f"{url}/metrics", timeout=timeout).text
    return {
        line.split("{", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }


def served_work(url: str) -> dict[str, float]:
    """The served engine's prefill and decode forwards so far (its ``vf_mm:`` counters)."""
    values = metrics(url)
    return {
        "prefills": values.get("vf_mm:prefills_total", 0.0),
        "decode_steps": values.get("vf_mm:decode_steps_total", 0.0),
        "requests": values.get("vf_mm:requests_total", 0.0),
        "request_s": values.get("vf_mm:request_seconds_total", 0.0),
    }


def turn_times(outdir: Path) -> dict[str, float]:
    """Per model turn, from the run's rows: the client's wait on ``generate`` (render,
    encode, HTTP, the server) and the environment's step, in ms."""
    rows = [json.loads(line) for line in (outdir / "results.jsonl").read_text().splitlines()]
    turns = sum(r.get("num_turns") or 0 for r in rows) or 1
    timing = [r.get("timing") or {} for r in rows]
    return {
        "generate_ms": 1e3 * sum(t.get("generation_s", 0.0) for t in timing) / turns,
        "env_ms": 1e3 * sum(t.get("env_s", 0.0) for t in timing) / turns,
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def server(
    path: Path, args: Any, log: Path, *, window_ms: float = 5.0, trace: Path | None = None
) -> Iterator[tuple[str, int]]:
    """``vf-mm serve`` in a subprocess (with ``trace``: the engine's timeline written
    there when it exits, ``_engine_trace.serve_main``)."""
    port = free_port()
    serve = [*CLI, "serve"]
    if trace is not None:
        serve = [sys.executable, _engine_trace.__file__, "serve", str(trace)]
    command = [*serve, "--model", str(path), "--device", args.device, "--dtype",
               args.dtype, "--port", str(port), "--log-level", "warning",
               "--batch-window-ms", str(window_ms)]  # fmt: skip
    with open(log, "w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"vf-mm serve exited {process.returncode}: {log.read_text()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            time.sleep(0.5)
        else:
            raise RuntimeError("vf-mm serve did not come up in 600 s")
        yield url, process.pid
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()


def queries(url: str) -> float:
    """The server's prefix-cache query counter (moves with every request it admits)."""
    return metrics(url, timeout=1.0).get("vllm:prefix_cache_queries_total", 0.0)


@contextlib.contextmanager
def profiled(pid: int | None, out: Path | None) -> Iterator[None]:
    """py-spy samples process ``pid`` (every thread, 100 Hz, collapsed stacks to ``out``)
    while the block runs; nothing happens unless both are given."""
    if pid is None or out is None:
        yield
        return
    command = ["py-spy", "record", "--pid", str(pid), "--rate", "100", "--threads",
               "--nonblocking", "--format", "raw", "-o", str(out)]  # fmt: skip
    spy = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        yield
    finally:
        spy.send_signal(signal.SIGINT)
        try:
            spy.wait(60)
        except subprocess.TimeoutExpired:
            spy.kill()


def served_eval(
    path: Path,
    url: str,
    workers: int,
    outdir: Path,
    args: Any,
    *,
    server_pid: int | None = None,
) -> dict[str, Any]:
    """One ``vf-mm eval ... --backend vllm -b URL --workers W`` run, as a user runs it
    (with ``--profile DIR``, py-spy samples the server and the eval's own processes)."""
    sampling = json.dumps({"max_tokens": args.max_tokens, "temperature": 1.0})
    command = [*CLI, "eval", "gridnav", "-m", str(path), "--backend", "vllm", "-b", url,
               "--workers", str(workers), "-n", str(args.examples), "-r",
               str(args.rollouts_per_example), "-c", str(args.concurrency), "-S", sampling,
               "-o", str(outdir)]  # fmt: skip
    profile = args.profile if server_pid is not None else None
    if profile is not None:
        profile.mkdir(parents=True, exist_ok=True)
        command = ["py-spy", "record", "--subprocesses", "--rate", "100", "--nonblocking",
                   "--format", "raw", "-o", str(profile / f"eval-w{workers}.txt"), "--",
                   *command]  # fmt: skip
    server_out = None if profile is None else profile / f"serve-w{workers}.txt"
    before = served_work(url)
    with Sampler(counter=lambda: queries(url)) as sampler, profiled(server_pid, server_out):
        start = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True)
        wall = time.perf_counter() - start
    work = {k: v - before[k] for k, v in served_work(url).items()}
    if done.returncode != 0:
        raise RuntimeError(f"vf-mm eval exited {done.returncode}: {done.stdout}\n{done.stderr}")
    results = json.loads((outdir / "metadata.json").read_text())["results"]
    engine_ms = 1e3 * work.pop("request_s") / max(work.pop("requests"), 1)
    return (
        {
            "t0": start,
            "t1": start + wall,
            "rollouts": results["count"],
            "errors": results["errors"],
            "time_s": results["time_s"],
            "rate": results["count"] / results["time_s"],
            "busy": sampler.busy(),
            "outside_s": wall - results["time_s"],
            "engine_ms": engine_ms,  # a request's time in the server's engine (queue + run)
        }
        | work
        | turn_times(outdir)
    )


def traced(name: str, events: list[Any], t0: float, t1: float) -> str:
    """Where the engine's time went in one run, from the first request it queued after
    ``t0`` to its last event before ``t1``."""
    inside = [e for e in events if t0 <= e[0] <= t1]
    starts = [e[0] for e in inside if e[1] == "submit"]
    if not starts:
        return f"{name}: no engine events in the run"
    return _engine_trace.show(name, _engine_trace.summary(inside, starts[0], inside[-1][0]))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--shape", choices=("3b", "tiny"), default="3b")
    parser.add_argument("--workers", default="1,2,4,8")
    parser.add_argument(
        "--batch-windows",
        default="5",
        help="the served engine's batch window(s) in ms (vf-mm serve --batch-window-ms), "
        "one server each",
    )
    parser.add_argument("--examples", type=int, default=32)
    parser.add_argument("--rollouts-per-example", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--out", type=Path, default=None, help="also write the numbers as JSON")
    parser.add_argument(
        "--profile",
        type=Path,
        default=None,
        help="after the table's runs, one more at the largest W with py-spy (on PATH) sampling the "
        "server and the eval's processes; collapsed stacks go to this folder",
    )
    parser.add_argument(
        "--trace",
        type=Path,
        default=None,
        help="record the engine's timeline (bench/_engine_trace.py) in the replay and in each "
        "server, print where its time went per run, and keep the raw traces in this folder",
    )
    args = parser.parse_args()
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    print(
        f"{gpu}, {os.cpu_count()} cores | Python {platform.python_version()}, vf_mm "
        f"{vf_mm.__version__}, torch {torch.__version__}"
    )
    n = args.examples * args.rollouts_per_example
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "ckpt"
        start = time.perf_counter()
        params = build_checkpoint(path, args.shape, getattr(torch, args.dtype), args.device)
        print(
            f"random Qwen2.5-VL ({args.shape}: {params / 1e9:.2f}B parameters, built in "
            f"{time.perf_counter() - start:.0f} s), {args.dtype} on {args.device}; gridnav "
            f"medium, {n} rollouts, {args.concurrency} in flight, max_tokens "
            f"{args.max_tokens}, temperature 1\n",
            flush=True,
        )
        trace = _engine_trace.install() if args.trace is not None else None
        bound = asyncio.run(engine_bound(path, args))
        if trace is not None:
            args.trace.mkdir(parents=True, exist_ok=True)
            (args.trace / "in-process.json").write_text(json.dumps(trace.events))
            print(traced("in-process eval", trace.events, *bound["in_process_span"]))
            for i, r in enumerate(bound["replays"]):
                print(traced(f"replay {i + 1}", trace.events, r["t0"], r["t1"]), flush=True)
            trace.on = False
        gc.collect()  # the in-process engine's GPU memory, before the server takes its own
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        rows: dict[tuple[float, int], dict[str, Any]] = {}
        counts = [int(w) for w in args.workers.split(",")]
        windows = [float(ms) for ms in args.batch_windows.split(",")]
        for window in windows:
            log = Path(tmp) / f"serve-{window:g}.log"
            served_trace = None if args.trace is None else args.trace / f"serve-{window:g}.json"
            with server(path, args, log, window_ms=window, trace=served_trace) as (url, pid):
                warm = served_eval(path, url, max(counts), Path(tmp) / f"warm{window:g}", args)
                print(
                    f"served ({window:g} ms window) warm-up at W={max(counts)}: "
                    f"{warm['rate']:.2f} rollouts/s",
                    flush=True,
                )
                for w in counts:
                    rows[window, w] = served_eval(
                        path, url, w, Path(tmp) / f"w{w}-{window:g}", args
                    )
                    print(f"{window:g} ms, W={w}: {rows[window, w]}", flush=True)
                if args.profile is not None and window == windows[0]:
                    w = max(counts)
                    try:
                        spied = served_eval(path, url, w, Path(tmp) / f"p{w}", args, server_pid=pid)
                    except RuntimeError as error:  # py-spy may lack ptrace here
                        print(f"W={w} under py-spy failed: {error}", flush=True)
                    else:
                        print(f"W={w} under py-spy: {spied['rate']:.2f} rollouts/s", flush=True)
                        spied_file = args.profile / f"serve-w{w}.txt"
                        if spied_file.is_file():  # the server's samples by phase
                            print(show_phases(split_phases(spied_file)), flush=True)
            if served_trace is not None and served_trace.is_file():
                events = json.loads(served_trace.read_text())
                for w in counts:
                    r = rows[window, w]
                    print(traced(f"served {window:g} ms W={w}", events, r["t0"], r["t1"]))
    rate = bound["engine_bound"]
    replay = min(bound["replays"], key=lambda r: r["wall"])
    print(
        f"\nengine-bound rate {rate:.2f} rollouts/s (in-process replay, no client, "
        f"{replay['kind']}; {replay['decode_steps']:.0f} decode steps); the in-process eval "
        f"{bound['in_process']:.2f} ({bound['in_process'] / rate:.0%})"
    )
    header = (
        f"{'window ms':>10}{'workers':>8}{'rollouts/s':>12}{'of engine-bound':>17}"
        f"{'scaling eff.':>14}{'GPU busy':>10}{'decode steps':>14}{'start + exit s':>16}"
        f"{'errors':>8}{'engine ms':>11}{'generate ms':>13}{'env ms':>8}"
    )
    print(header)
    for (window, w), r in rows.items():
        one = rows[window, counts[0]]["rate"] / counts[0]
        busy = "-" if r["busy"] is None else f"{r['busy']:.0%}"
        print(
            f"{window:>10g}{w:>8}{r['rate']:>12.2f}{r['rate'] / rate:>17.0%}"
            f"{r['rate'] / (w * one):>14.0%}{busy:>10}{r['decode_steps']:>14.0f}"
            f"{r['outside_s']:>16.1f}{r['errors']:>8}{r['engine_ms']:>11.0f}"
            f"{r['generate_ms']:>13.0f}{r['env_ms']:>8.0f}"
        )
    if args.out:
        served = [{"window_ms": window, "workers": w} | r for (window, w), r in rows.items()]
        args.out.write_text(json.dumps({"bound": bound, "served": served}, indent=2))


if __name__ == "__main__":
    main()
