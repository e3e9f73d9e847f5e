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

The hit rate is read from each server's ``/metrics``: the growth of
``vllm:prefix_cache_hits_total`` over ``vllm:prefix_cache_queries_total`` (tokens) during
the policy's run; each run starts from empty caches (``POST /reset_prefix_cache``, which
vLLM serves with ``VLLM_SERVER_DEV_MODE=1``). "prefill" is the prompt tokens the servers
computed (queries minus hits), and the last column its ratio to ``round_robin``'s.

    python bench/routing.py [--servers 2] [--concurrency 16] [--examples 16] [--rollouts 2]
                            [--max-tokens 8] [--vllm-python .venv-vllm/bin/python]

The model is a tiny random-weight Qwen2-VL built offline (``build_tiny_vlm``): its
replies are rarely valid moves, so most rollouts run all their turns.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import platform
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import vf_mm
from vf_mm.inference import VLLMBackend, VLLMServers
from vf_mm.renderers import RendererPool, load_renderer
from vf_mm.testing import build_tiny_vlm

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


async def run_policy(policy: str, urls: list[str], model: Path, args: argparse.Namespace) -> dict:
    env = vf_mm.load_environment("gridnav", seed=0)
    backend = VLLMBackend(urls, model=str(model), routing=policy)
    pool = RendererPool(lambda: load_renderer(model), size=2)
    client = vf_mm.RendererClient(backend, pool)
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
    args = parser.parse_args()
    policies = args.policies.split(",")
    env = vf_mm.load_environment("gridnav", seed=0)
    with tempfile.TemporaryDirectory() as tmp:
        model = build_tiny_vlm(Path(tmp) / "qwen2_vl", "qwen2_vl")
        servers = VLLMServers(
            model,
            args.servers,
            gpus_per_server=0,
            command=[vllm_python(args.vllm_python), "-m", "vllm.entrypoints.openai.api_server"],
            limit_mm_per_prompt={"image": env.max_turns + 1, "video": 0},
            extra_args=[*RECIPE, "--max-num-seqs", str(args.concurrency)],
            env=SERVER_ENV,
            log_dir=Path(tmp) / "logs",
            on_progress=lambda ready, total, s: print(
                f"\rwaiting for {total} vLLM servers: {ready}/{total} healthy, {s:.0f} s",
                end="" if ready < total else "\n",
                file=sys.stderr,
                flush=True,
            ),
        )
        results: dict[str, dict[str, Any]] = {}
        with servers:
            urls = servers.base_urls
            version = json.loads(request(urls[0], path="/version")[1]).get("version", "?")
            for policy in policies:
                for url in urls:  # every policy starts from empty caches
                    status, text = request(url, "POST", "/reset_prefix_cache")
                    assert status == 200, (status, text[:200])
                before = [prefix_counters(u) for u in urls]
                result = asyncio.run(run_policy(policy, urls, model, args))
                after = [prefix_counters(u) for u in urls]
                result["per_server"] = [
                    {k: a[k] - b[k] for k in ("queries", "hits")}
                    for a, b in zip(after, before, strict=True)
                ]
                results[policy] = result
                print(f"{policy}: done in {result['wall']:.1f} s", file=sys.stderr)
    report(results, args, version)


def report(results: dict[str, dict[str, Any]], args: argparse.Namespace, version: str) -> None:
    import torch

    print(
        f"\n{platform.machine()}, {os.cpu_count()} cores | Python {platform.python_version()}, "
        f"vf_mm {vf_mm.__version__}, vLLM {version} (CPU), client torch {torch.__version__}"
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
        f"{'routing':<18}{'hit rate':>9}{'per server':>18}{'requests':>14}{'turns':>7}"
        f"{'errors':>7}{'prefill tok':>12}{'vs ' + BASELINE:>16}{'wall s':>8}"
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
        requests = "/".join(str(s["requests"]) for s in r["stats"].values())
        prefill = queries - hits
        ratio = f"{prefill / base_prefill:.2f}x" if base_prefill else "-"
        print(
            f"{policy:<18}{rate:>9.1%}{per:>18}{requests:>14}{r['turns']:>7}{r['errors']:>7}"
            f"{prefill:>12.0f}{ratio:>16}{r['wall']:>8.1f}"
        )
    sticky = results.get("sticky")
    if sticky is not None:
        print(f"\nsticky routing: {sticky['routing']}")
    for policy, r in results.items():
        for kind in r["error_kinds"]:
            print(f"{policy} rollout error: {kind}")


if __name__ == "__main__":
    main()
