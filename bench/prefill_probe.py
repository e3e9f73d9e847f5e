"""Where a prefill's time goes on the pool engine: its fixed part and its part per row.

Model: random weights in Qwen2.5-VL-3B's shape (``bench/local_gpu.py`` builds it). For N
in ``--rows``, N requests at once, each a new gridnav-sized image (160x160, 36 image
tokens) and a line of text, one greedy token each, so each admission is one prefill of
N rows (the pool engine). Timed, best of ``--repeat``, with the device synchronised:

  prefill    the engine's ``_prefill`` call (vision tower, text stack, first token)
  vision     inside it, the vision tower on the new images (``VisionCache.inputs``)
  text       the rest of it: the packed text forward and the first token's sampling

A linear fit over N gives each part's fixed cost and cost per row. The sweep runs three
times in one process: the vision tower with its own attention (transformers' per-window
``scaled_dot_product_attention``, the baseline) and with the pool engine's varlen call
(``varlen_vision_attention``, the default on CUDA), both with the text stack eager; then
varlen with the text stack replayed as a CUDA graph (``PrefillStep``, the default on
CUDA).

``--check``: the varlen tower against its own attention on images of several sizes
(largest absolute difference of the features, in units of their largest magnitude),
and 8 greedy tokens of the backend (each of the three modes) against one full forward
of the model with its own attention (largest logprob difference; bfloat16 keeps 8 bits
of mantissa).

Then one prefill of ``--profile-rows`` rows under ``torch.profiler``: how many kernel
launches and host synchronisations it made.

    python bench/prefill_probe.py [--device cuda] [--dtype bfloat16] [--rows 1,2,4,8,16,32]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from local_gpu import build_checkpoint
from PIL import Image

from vf_mm.inference import GenerateRequest, LocalBackend, SamplingParams
from vf_mm.renderers import load_renderer

SIDE = 160  # gridnav medium: 5 cells of 32 pixels


class Timer:
    """Wraps ``obj.name`` to time each call (device synchronised at both ends)."""

    def __init__(self, obj: Any, name: str) -> None:
        self.times: list[float] = []
        inner = getattr(obj, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            torch.cuda.synchronize() if torch.cuda.is_available() else None
            start = time.perf_counter()
            out = inner(*args, **kwargs)
            torch.cuda.synchronize() if torch.cuda.is_available() else None
            self.times.append(time.perf_counter() - start)
            return out

        setattr(obj, name, timed)


def requests(path: Path, n: int, seed: int) -> list[GenerateRequest]:
    renderer = load_renderer(path)
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        picture = Image.fromarray(rng.integers(0, 256, (SIDE, SIDE, 3), np.uint8))
        content = [{"type": "image", "image": picture},
                   {"type": "text", "text": "You are the blue square. Which way to the goal?"}]  # fmt: skip
        rendered = renderer.render([{"role": "user", "content": content}])
        out.append(
            GenerateRequest(
                prompt_ids=list(rendered.token_ids),
                multi_modal_data=rendered.multi_modal_data,
                sampling=SamplingParams(max_tokens=1, temperature=0),
            )
        )
    return out


async def check(backend: LocalBackend, path: Path) -> None:
    """The varlen tower and the backend's logprobs against the model's own attention."""
    from vf_mm.models import model_inputs

    engine = backend._scheduler._engine
    model = backend._model.model
    renderer = load_renderer(path)
    rng = np.random.default_rng(1)
    sizes = [(160, 160), (448, 448), (720, 1280), (61, 150)]
    content: list[dict[str, Any]] = [
        {"type": "image", "image": Image.fromarray(rng.integers(0, 256, (h, w, 3), np.uint8))}
        for h, w in sizes
    ]
    content.append({"type": "text", "text": "Describe each picture."})
    rendered = renderer.render([{"role": "user", "content": content}])
    items = rendered.multi_modal_data.mm_items["image"]
    device = backend._model.device
    pixels = torch.cat([torch.tensor(np.asarray(i["pixel_values"])) for i in items]).to(device)
    grid = torch.cat([torch.tensor(np.asarray(i["image_grid_thw"])).reshape(-1, 3) for i in items])
    grid = grid.to(device)
    with torch.inference_mode():
        own = model.model.get_image_features(
            pixel_values=pixels.to(model.dtype), image_grid_thw=grid
        )
        with engine.packed.vision():
            varlen = model.model.get_image_features(
                pixel_values=pixels.to(model.dtype), image_grid_thw=grid
            )
    own_t = torch.cat(list(getattr(own, "pooler_output", own))).float()
    var_t = torch.cat(list(getattr(varlen, "pooler_output", varlen))).float()
    scale = own_t.abs().max().item()
    print(f"vision features, varlen vs own attention ({len(sizes)} images {sizes}): largest "
          f"difference {(own_t - var_t).abs().max().item() / scale:.2e} of the largest "
          f"magnitude {scale:.3g}; mean {(own_t - var_t).abs().mean().item() / scale:.2e}",
          flush=True)  # fmt: skip
    request = GenerateRequest(
        prompt_ids=list(rendered.token_ids), multi_modal_data=rendered.multi_modal_data,
        sampling=SamplingParams(max_tokens=8, temperature=0),
    )  # fmt: skip
    varlen_configs = engine.packed.vision_configs
    graphs = engine.prefiller
    for label, configs, prefiller in (
        ("own attention, eager text stack", [], None),
        ("varlen, eager text stack", varlen_configs, None),
        ("varlen, text stack as a CUDA graph", varlen_configs, graphs),
    ):
        engine.packed.vision_configs = configs
        engine.prefiller = prefiller
        backend.clear_cache()  # the tower runs again
        result = await backend.generate(request)
        ids = torch.tensor([list(rendered.token_ids) + list(result.completion_ids)])
        inputs = model_inputs(
            "qwen2_5_vl", ids, items, image_token_ids=[model.config.image_token_id],
            dtype=model.dtype,
        )  # fmt: skip
        inputs = {k: v.to(device) for k, v in {"input_ids": ids, **inputs}.items()}
        with torch.inference_mode():
            logits = model(**inputs).logits[0].float()
        n = len(rendered.token_ids)
        full = torch.log_softmax(logits[n - 1 : -1], dim=-1)
        chosen = full.gather(1, ids[0, n:, None].to(device))[:, 0].tolist()
        greedy = full.argmax(-1).tolist() == list(result.completion_ids)
        diff = max(abs(a - b) for a, b in zip(chosen, result.logprobs or [], strict=True))
        print(f"the backend's tower with {label}: 8 greedy tokens against one full forward "
              f"(own attention): same ids {greedy}, largest logprob difference {diff:.2e}",
              flush=True)  # fmt: skip
    engine.packed.vision_configs = varlen_configs
    engine.prefiller = graphs


async def sweep(
    backend: LocalBackend, path: Path, args: argparse.Namespace, prefill: Timer,
    vision: Timer, seed: int,
) -> int:  # fmt: skip
    """Prefills of N rows for N in ``args.rows``: the table and the linear fits."""
    print(f"{'rows':>5}{'prefill ms':>12}{'vision ms':>11}{'text ms':>9}", flush=True)
    fits: dict[str, list[tuple[int, float]]] = {"prefill": [], "vision": [], "text": []}
    for n in args.rows:
        best: tuple[float, float] | None = None
        for i in range(args.repeat + 2):  # two warm-ups
            seed += 1
            batch = requests(path, n, seed)
            prefill.times.clear()
            vision.times.clear()
            await asyncio.gather(*(backend.generate(r) for r in batch))
            if len(prefill.times) != 1:
                print(f"  N={n}: {len(prefill.times)} prefills (not one): skipped", flush=True)
                continue
            if i >= 2:
                pair = (prefill.times[0], sum(vision.times))
                best = pair if best is None or pair[0] < best[0] else best
        if best is None:
            continue
        text = best[0] - best[1]
        print(f"{n:>5}{1e3 * best[0]:>12.1f}{1e3 * best[1]:>11.1f}{1e3 * text:>9.1f}", flush=True)
        for key, value in zip(fits, (best[0], best[1], text), strict=True):
            fits[key].append((n, value))
    for key, points in fits.items():
        if len(points) >= 2:
            slope, intercept = statistics.linear_regression(*zip(*points, strict=True))
            print(f"{key}: fixed {1e3 * intercept:.1f} ms + {1e3 * slope:.2f} ms a row")
    return seed


async def probe(path: Path, args: argparse.Namespace) -> None:
    backend = LocalBackend(
        path, device=args.device, dtype=getattr(torch, args.dtype), max_batch=64,
        batch_window_ms=50, kv_pool=True,
    )  # fmt: skip
    engine = backend._scheduler._engine
    prefill = Timer(engine, "_prefill")
    vision = Timer(engine._parts.vision, "inputs")
    seed = 0
    varlen = engine.packed.vision_configs
    try:
        if args.check:
            await check(backend, path)
        graphs = engine.prefiller
        for label, configs, prefiller in (
            ("own attention; text stack eager", [], None),
            ("varlen; text stack eager", varlen, None),
            ("varlen; text stack as a CUDA graph (the default on CUDA)", varlen, graphs),
        ):
            engine.packed.vision_configs = configs
            engine.prefiller = prefiller
            print(f"\nthe vision tower's attention: {label}", flush=True)
            seed = await sweep(backend, path, args, prefill, vision, seed)
        engine.packed.vision_configs = varlen
        engine.prefiller = graphs
        if graphs is not None:
            print(f"prefill graphs: {graphs.describe()}", flush=True)
        if args.profile_rows and torch.cuda.is_available():
            from torch.profiler import ProfilerActivity, profile

            batch = requests(path, args.profile_rows, 10_000)
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                await asyncio.gather(*(backend.generate(r) for r in batch))
            table = prof.key_averages()
            print(table.table(sort_by="self_cpu_time_total", row_limit=30), flush=True)
            counts: dict[str, int] = {}
            for event in table:
                for name in ("cudaLaunchKernel", "cudaStreamSynchronize", "cudaMemcpyAsync",
                             "aten::item", "aten::_local_scalar_dense", "cudaDeviceSynchronize",
                             "aten::nonzero", "cudaGraphLaunch"):  # fmt: skip
                    if event.key == name:
                        counts[name] = event.count
            print("counts:", counts, flush=True)
            if args.trace:
                prof.export_chrome_trace(str(args.trace))
    finally:
        await backend.aclose()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--shape", default="3b", choices=("3b", "tiny"))
    parser.add_argument("--rows", default="1,2,4,8,16,32")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--profile-rows", type=int, default=16)
    parser.add_argument("--trace", type=Path, default=None)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    args.rows = [int(x) for x in args.rows.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "ckpt"
        build_checkpoint(path, args.shape, getattr(torch, args.dtype), args.device)
        asyncio.run(probe(path, args))


if __name__ == "__main__":
    main()
