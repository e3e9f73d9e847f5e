"""Prefix-cache hit rate of multi-turn rollouts over several vLLM servers, per routing policy.

A multi-turn rollout sends its whole history again every turn; only the server that
served its earlier turns can take that history from its prefix cache. This runs the
multi-turn ``gridnav`` environment (a new image every turn) through ``VLLMBackend`` over
N real vLLM servers that ``VLLMServers`` starts, once per routing policy, side by side in
one process against the same servers and the same seeded rollouts:

- ``sticky``: each rollout (session) stays on one server, new ones go to the least
  loaded (vf_mm's default);
- ``least_outstanding``: every request to the server with the fewest in flight;
- ``round_robin``: every request to the next server in turn.

Then the rollout workers: the same sticky run with its rollouts in W worker processes
(``vf_mm.workers.WorkerPool``, ``--workers 1,2``), each worker with its own
``VLLMBackend`` to the same servers; "rollouts/s" is over the run itself (the workers
are started before the clock starts, as a long run amortises their start).

The hit rate is read from each server's ``/metrics``: the growth of
``vllm:prefix_cache_hits_total`` over ``vllm:prefix_cache_queries_total`` (tokens) during
the run; each run starts from empty caches (``POST /reset_prefix_cache``, which vLLM
serves with ``VLLM_SERVER_DEV_MODE=1``). "prefill" is the prompt tokens the servers
computed (queries minus hits), and its column's ratio is to ``round_robin``'s.

``--engine vf-mm`` runs the same against N ``vf-mm serve`` servers (the in-process
transformers engine, which publishes the same two counters at ``/metrics``): routing
measured without vLLM. Those servers are started afresh for every run (empty caches).

    python bench/routing.py [--engine vllm|vf-mm] [--servers 2] [--concurrency 16]
                            [--examples 16] [--rollouts 2] [--max-tokens 8] [--workers 1,2]
                            [--vllm-python .venv-vllm/bin/python]

The model is a tiny random-weight Qwen2-VL built offline (``build_tiny_vlm``): its
replies are rarely valid moves, so most rollouts run all their turns.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import http.client
import json
import os
import platform
import re
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import vf_mm
from vf_mm.inference import VLLMBackend, VLLMServers
from vf_mm.renderers import RendererPool, load_renderer
from vf_mm.testing import build_tiny_vlm
from vf_mm.workers import WorkerPool, WorkerSpec

ROOT = Path(__file__).resolve().parents[1]
POLICIES = ("sticky", "least_outstanding", "round_robin")
BASELINE = "round_robin"
#: the vllm test tier's server recipe (tests/vllm/conftest.py), with a longer context and
#: 32-token cache blocks (CPU's default is 128, GPU's 16: a turn adds ~100 tokens, and only
#: whole blocks are cached, so 128 would hide most of what routing changes)
RECIPE = ["--dtype", "float32", "--max-model-len", "4096", "--enforce-eager", "--block-size", "32"]
#: VLLM_SERVER_DEV_MODE: for POST /reset_prefix_cache between policies
SERVER_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_SERVER_DEV_MODE": "1", "VLLM_NO_USAGE_STATS": "1",
              "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}  # fmt: skip
_METRIC = re.compile(r"^vllm:prefix_cache_(queries|hits)_total(?:\{[^}]*\})?\s+(\S+)$")


def vllm_python(given: str | None) -> str:
    if given:
        return given
    if os.environ.get("VF_MM_VLLM_PYTHON"):
        return os.environ["VF_MM_VLLM_PYTHON"]
    candidate = ROOT / ".venv-vllm" / "bin" / "python"
    if candidate.exists():
        return str(candidate)
    return sys.executable


def request(url: str, method: str = "GET", path: str = "/") -> tuple[int, str]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        connection.request(method, path)
        response = connection.getresponse()
        return response.status, response.read().decode()
    finally:
        connection.close()


def prefix_counters(url: str) -> dict[str, float]:
    """This server's prefix-cache ``queries`` and ``hits`` (tokens), summed over engines."""
    status, text = request(url, path="/metrics")
    assert status == 200, (status, text[:200])
    counts = {"queries": 0.0, "hits": 0.0}
    for line in text.splitlines():
        match = _METRIC.match(line.strip())
        if match:
            counts[match.group(1)] += float(match.group(2))
    return counts


ENVIRONMENTS = [str(ROOT / "environments")]


def bench_client(urls: list[str], model: str, policy: str) -> vf_mm.RendererClient:
    """The client of a run: VLLMBackend over the servers (module-level: a worker builds
    its own from a pickled ``functools.partial`` of this)."""
    backend = VLLMBackend(urls, model=model, routing=policy)
    return vf_mm.RendererClient(backend, RendererPool(lambda: load_renderer(model), size=2))


async def run_workers(workers: int, urls: list[str], model: Path, args: argparse.Namespace) -> dict:
    """The sticky run with its rollouts in ``workers`` worker processes."""
    env = vf_mm.load_environment("gridnav", search_paths=ENVIRONMENTS, seed=0)
    spec = WorkerSpec("gridnav", functools.partial(bench_client, urls, str(model), "sticky"),
                      env_args={"seed": 0}, env_dirs=ENVIRONMENTS)  # fmt: skip
    outputs: list[Any] = []
    async with WorkerPool(spec, workers) as pool:
        start = time.perf_counter()
        await pool.evaluate(
            env,
            rows=env.get_eval_dataset(args.examples),
            rollouts_per_example=args.rollouts,
            concurrency=args.concurrency,
            sampling_args={"max_tokens": args.max_tokens, "temperature": 1.0},
            seed=0,
            on_result=lambda output, index: outputs.append(output),
        )
        wall = time.perf_counter() - start
        stats = pool.stats
    return {
        "wall": wall,
        "rollouts": len(outputs),
        "errors": sum(o.error is not None for o in outputs),
        "error_kinds": sorted(
            {f"{o.error.type}: {o.error.message[:120]}" for o in outputs if o.error}
        ),
        "turns": stats.turns,
        "stats": None,
        "routing": None,
    }


async def run_policy(policy: str, urls: list[str], model: Path, args: argparse.Namespace) -> dict:
    env = vf_mm.load_environment("gridnav", search_paths=ENVIRONMENTS, seed=0)
    client = bench_client(urls, str(model), policy)
    backend = client.backend
    start = time.perf_counter()
    try:
        outputs = await env.evaluate(
            client,
            num_examples=args.examples,
            rollouts_per_example=args.rollouts,
            concurrency=args.concurrency,
            sampling_args={"max_tokens": args.max_tokens, "temperature": 1.0},
            seed=0,
        )
    finally:
        await backend.aclose()
    return {
        "wall": time.perf_counter() - start,
        "rollouts": len(outputs),
        "errors": sum(o.error is not None for o in outputs),
        "error_kinds": sorted(
            {f"{o.error.type}: {o.error.message[:120]}" for o in outputs if o.error}
        ),
        "turns": client.stats.turns,
        "stats": backend.stats,
        "routing": backend.routing_stats,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--examples", type=int, default=16)
    parser.add_argument("--rollouts", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--vllm-python", default=None, help="the Python that has vLLM")
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument(
        "--workers", default="1,2", help="worker counts to run sticky with ('': none)"
    )
    parser.add_argument("--engine", choices=("vllm", "vf-mm"), default="vllm")
    args = parser.parse_args()
    runs: list[tuple[str, Any]] = [
        (p, functools.partial(run_policy, p)) for p in args.policies.split(",") if p
    ]
    runs += [(f"sticky, {w} worker{'s' if int(w) > 1 else ''}", functools.partial(run_workers, int(w)))
             for w in args.workers.split(",") if w]  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        model = build_tiny_vlm(Path(tmp) / "qwen2_vl", "qwen2_vl")
        start = vllm_servers if args.engine == "vllm" else vfmm_servers
        results: dict[str, dict[str, Any]] = {}
        version = "?"
        with start(model, args, Path(tmp)) as fresh:
            for name, run in runs:
                urls = fresh()  # the servers, with empty caches
                if args.engine == "vllm":
                    version = json.loads(request(urls[0], path="/version")[1]).get("version", "?")
                before = [prefix_counters(u) for u in urls]
                result = asyncio.run(run(urls, model, args))
                after = [prefix_counters(u) for u in urls]
                result["per_server"] = [
                    {k: a[k] - b[k] for k in ("queries", "hits")}
                    for a, b in zip(after, before, strict=True)
                ]
                results[name] = result
                print(f"{name}: done in {result['wall']:.1f} s", file=sys.stderr)
    report(results, args, version)


@contextlib.contextmanager
def vllm_servers(model: Path, args: argparse.Namespace, tmp: Path) -> Iterator[Any]:
    """N vllm-cpu servers for the whole benchmark; each run resets their caches."""
    env = vf_mm.load_environment("gridnav", search_paths=ENVIRONMENTS, seed=0)
    servers = VLLMServers(
        model,
        args.servers,
        gpus_per_server=0,
        command=[vllm_python(args.vllm_python), "-m", "vllm.entrypoints.openai.api_server"],
        limit_mm_per_prompt={"image": env.max_turns + 1, "video": 0},
        extra_args=[*RECIPE, "--max-num-seqs", str(args.concurrency)],
        env=SERVER_ENV,
        log_dir=tmp / "logs",
        on_progress=lambda ready, total, s: print(
            f"\rwaiting for {total} vLLM servers: {ready}/{total} healthy, {s:.0f} s",
            end="" if ready < total else "\n",
            file=sys.stderr,
            flush=True,
        ),
    )

    def fresh() -> list[str]:
        for url in servers.base_urls:
            status, text = request(url, "POST", "/reset_prefix_cache")
            assert status == 200, (status, text[:200])
        return servers.base_urls

    with servers:
        yield fresh


@contextlib.contextmanager
def vfmm_servers(model: Path, args: argparse.Namespace, tmp: Path) -> Iterator[Any]:
    """N ``vf-mm serve`` servers, started afresh for each run (empty caches)."""
    running: list[subprocess.Popen[bytes]] = []

    def stop() -> None:
        for proc in running:
            proc.terminate()
        for proc in running:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        running.clear()

    def fresh() -> list[str]:
        stop()
        urls = []
        for i in range(args.servers):
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                port = probe.getsockname()[1]
            log = open(tmp / f"serve-{i}-{port}.log", "wb")  # noqa: SIM115 (the process keeps it)
            running.append(subprocess.Popen(
                [sys.executable, "-m", "vf_mm.cli._main", "serve", "--model", str(model),
                 "--port", str(port), "--max-batch", str(args.concurrency), "--log-level", "warning"],
                stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"},
            ))  # fmt: skip
            urls.append(f"http://127.0.0.1:{port}")
        deadline = time.monotonic() + 300
        for url, proc in zip(urls, running, strict=True):
            while True:
                if proc.poll() is not None:
                    raise SystemExit(f"vf-mm serve exited with {proc.returncode}: see {tmp}")
                with contextlib.suppress(OSError):
                    if request(url, path="/health")[0] == 200:
                        break
                if time.monotonic() > deadline:
                    raise SystemExit(f"vf-mm serve at {url} not healthy within 300 s")
                time.sleep(0.2)
        return urls

    try:
        yield fresh
    finally:
        stop()


def report(results: dict[str, dict[str, Any]], args: argparse.Namespace, version: str) -> None:
    import torch

    engine = f"vLLM {version} (CPU)" if args.engine == "vllm" else "vf-mm serve (local engine)"
    print(
        f"\n{platform.machine()}, {os.cpu_count()} cores | Python {platform.python_version()}, "
        f"vf_mm {vf_mm.__version__}, {engine}, client torch {torch.__version__}"
    )
    print(
        f"gridnav (medium: up to 8 turns, one new image each), tiny Qwen2-VL, {args.servers} "
        f"servers, {args.examples} examples x {args.rollouts} rollouts, {args.concurrency} "
        f"concurrent, max_tokens {args.max_tokens}\n"
    )
    base = results.get(BASELINE)
    base_prefill = None
    if base is not None:
        base_prefill = sum(s["queries"] - s["hits"] for s in base["per_server"])
    header = (
        f"{'run':<22}{'hit rate':>9}{'per server':>18}{'requests':>14}{'turns':>7}"
        f"{'errors':>7}{'prefill tok':>12}{'vs ' + BASELINE:>16}{'wall s':>8}{'rollouts/s':>11}"
    )
    print(header)
    print("-" * len(header))
    for policy, r in results.items():
        queries = sum(s["queries"] for s in r["per_server"])
        hits = sum(s["hits"] for s in r["per_server"])
        rate = hits / queries if queries else float("nan")
        per = "/".join(
            f"{s['hits'] / s['queries']:.0%}" if s["queries"] else "-" for s in r["per_server"]
        )
        requests = "/".join(str(s["requests"]) for s in r["stats"].values()) if r["stats"] else "-"
        prefill = queries - hits
        ratio = f"{prefill / base_prefill:.2f}x" if base_prefill else "-"
        print(
            f"{policy:<22}{rate:>9.1%}{per:>18}{requests:>14}{r['turns']:>7}{r['errors']:>7}"
            f"{prefill:>12.0f}{ratio:>16}{r['wall']:>8.1f}{r['rollouts'] / r['wall']:>11.2f}"
        )
    sticky = results.get("sticky")
    if sticky is not None:
        print(f"\nsticky routing: {sticky['routing']}")
    for policy, r in results.items():
        for kind in r["error_kinds"]:
            print(f"{policy} rollout error: {kind}")


if __name__ == "__main__":
    main()
