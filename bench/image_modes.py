"""Bytes per group in each image mode (tensors, encoded, ref), and what rebuilding the
images costs the trainer against what processing them cost the sampler.

Cases (every group rendered for real by the renderer, behind a scripted backend)
  shapes        the shapes environment, 8 rollouts of one example (one image, shared)
  gridnav       gridnav, 8 rollouts of one example: a new board image every move
  zoom          zoom, 8 rollouts: the overview, then a crop returned by the zoom tool
  photo 1280x720
                8 rollouts x 4 turns, one 1280x720 photo-like JPEG a turn (the first
                shared by the group, the next three each rollout's own: 25 distinct),
                processed with Qwen2.5-VL's real image config (max_pixels 12845056:
                4,784 patches x 1,176 float32 = 22.5 MB of pixel_values per image)

The environment cases use the embedded tiny Qwen2.5-VL, whose image config caps an image
at 448x448 (200,704 pixels), so their tensors are smaller than a real checkpoint's.

Columns: bytes per group (``len(packb(frame))``) in each mode; "non-image" is what the
group holds besides images (token ids, logprobs, messages: the same in every mode);
"distinct enc." the distinct images' encoded bytes; "img/distinct" the encoded frame's
image bytes (all but "non-image") over those (target <= 1.1); "tensors/enc." the
tensors frame over the encoded one (target >= 20 on the photo case). Rebuild: per distinct image,
the sampler's processing (``load_image`` + ``image_hash`` + the family's processor, what
the renderer does on a cache miss) against the trainer's rebuild from the encoded bytes
(decode + processor + ``inputs_hash`` check), on one long-lived rebuilder thread with
no cache (each round rebuilds every image), best of REPEATS each; target <= 1.2x. Every rebuilt tensor is compared bit for bit with the sampler's.

    python bench/image_modes.py
"""

from __future__ import annotations

import asyncio
import io
import json
import platform
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from _machine import cpu_name
from PIL import Image

import vf_mm
from vf_mm.images import image_hash, load_image
from vf_mm.models import (
    embedded_model,
    expand_image,
)
from vf_mm.renderers import load_renderer
from vf_mm.testing import ScriptedBackend, build_tiny_vlm
from vf_mm.training import (
    ImageProcessing,
    ImageRebuilder,
    ImageStore,
    pack_group,
    unpack_group,
)
from vf_mm.types import RolloutOutput
from vf_mm.wire import packb, unpackb

ROLLOUTS = 8
REPEATS = 7
REAL_QWEN25_MAX_PIXELS = 12845056


def tool_call(name: str, **args: Any) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(args)}}}\n</tool_call>'


REPLIES = {
    "shapes": ["<answer>3</answer>"],
    "gridnav": ["<move>right</move>", "<move>down</move>", "<move>left</move>"],
    "zoom": [tool_call("zoom", x=200, y=150, w=64, h=32), "<answer>AB12</answer>"],
}


def env_group(env_id: str, renderer: Any) -> list[RolloutOutput]:
    env = vf_mm.load_environment(env_id)
    client = vf_mm.RendererClient(
        ScriptedBackend(renderer, REPLIES[env_id], record=False), renderer
    )
    outputs = asyncio.run(env.evaluate(client, num_examples=1, rollouts_per_example=ROLLOUTS))
    return list(outputs)


def photo(seed: int, size: tuple[int, int] = (1280, 720)) -> bytes:
    """A photo-like JPEG (quality 90): smooth colour fields, edges, and sensor noise."""
    rng = np.random.default_rng(seed)
    small = Image.fromarray(rng.integers(0, 256, (9, 16, 3), dtype=np.uint8))
    base = np.asarray(small.resize(size, Image.Resampling.BICUBIC), dtype=np.float32)
    detail = np.asarray(
        Image.fromarray(rng.integers(0, 256, (90, 160, 3), dtype=np.uint8)).resize(
            size, Image.Resampling.BILINEAR
        ),
        dtype=np.float32,
    )
    pixels = 0.75 * base + 0.25 * detail + rng.normal(0, 4, (size[1], size[0], 3))
    buffer = io.BytesIO()
    Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


def photo_group(renderer: Any) -> list[RolloutOutput]:
    client = vf_mm.RendererClient(ScriptedBackend(renderer, ["looks like a street"], record=False), renderer)  # fmt: skip

    def user(data: bytes) -> dict:
        return {"role": "user", "content": [{"type": "image", "image": data},
                                            {"type": "text", "text": "what now?"}]}  # fmt: skip

    first = photo(0)

    async def rollout(r: int) -> RolloutOutput:
        messages, steps = [user(first)], []
        for turn in range(4):
            result = await client.generate(messages, trajectory=steps)
            steps.append(result.step(messages))
            messages = [*messages, result.message]
            if turn < 3:
                messages.append(user(photo(1000 + 10 * r + turn)))
        return RolloutOutput(example_id=0, prompt=messages[:1], completion=messages[1:],
                             trajectory=steps, reward=1.0)  # fmt: skip

    async def main() -> list[RolloutOutput]:
        return [await rollout(r) for r in range(ROLLOUTS)]

    return asyncio.run(main())


def items(outputs: list[Any]) -> list[dict[str, Any]]:
    return [
        item
        for o in outputs
        for step in o.trajectory
        if step.tokens is not None and step.tokens.multi_modal_data is not None
        for item in step.tokens.multi_modal_data.mm_items.get("image", [])
    ]


def image_sources(outputs: list[RolloutOutput]) -> dict[str, Any]:
    """Each distinct image's source part, by hash (for timing the sampler's processing)."""
    out: dict[str, Any] = {}
    for o in outputs:
        for message in [*o.prompt, *o.completion]:
            content = message.get("content")
            for part in content if isinstance(content, list) else ():
                if part.get("type") in ("image", "image_url"):
                    out.setdefault(image_hash(load_image(part)), part)
    return out


def measure(name: str, outputs: list[RolloutOutput], renderer: Any, store: ImageStore) -> dict:
    processing = ImageProcessing.from_vision(renderer.vision)
    frames = {
        mode: pack_group(outputs, images=mode, processing=processing, store=store)
        for mode in ("tensors", "encoded", "ref")
    }
    sizes = {mode: len(packb(frame)) for mode, frame in frames.items()}
    rest = len(packb({**frames["encoded"], "images": {}, "sources": {}}))  # tokens, messages
    distinct_enc = sum(e["size"] for e in frames["encoded"]["sources"].values())
    distinct = len(frames["encoded"]["sources"]) + len(frames["encoded"]["images"])
    # the sampler's processing per distinct image (what the renderer does on a miss, its
    # results kept as the renderer's cache keeps them) against the trainer's rebuild of
    # the encoded group (one worker, no cache: every image rebuilt each round), interleaved,
    # best of REPEATS each (this machine is small and shared: the minimum is the cost)
    parts = list(image_sources(outputs).values())
    wire = unpackb(packb(frames["encoded"]))
    sampler_s, rebuild_s = [], []
    # one rebuilder for every round, as a trainer keeps one: its thread (and that thread's
    # allocator arena) warm, and no cache (cache_bytes=0), so each round rebuilds every
    # image; a first, untimed round warms it up. (A new rebuilder per round would time a
    # new thread's first allocations too: page faults no running trainer pays.)
    steady = ImageRebuilder(ImageProcessing.from_vision(renderer.vision), workers=1, cache_bytes=0)
    unpack_group(wire, images=steady)
    for _ in range(REPEATS):
        kept = []
        start = time.perf_counter()
        for part in parts:
            image = load_image(part)
            image_hash(image)
            kept.append(expand_image(processing.processor, image, kwargs=processing.kwargs))
        sampler_s.append((time.perf_counter() - start) / max(1, len(parts)))
        del kept
        steady.rebuild_s, steady.rebuilt = 0.0, 0
        got = unpack_group(wire, images=steady)
        rebuild_s.append(steady.rebuild_s / max(1, steady.rebuilt))
        for a, b in zip(items(outputs), items(got), strict=True):
            assert a.keys() == b.keys()
            assert all(np.asarray(a[k]).tobytes() == np.asarray(b[k]).tobytes() for k in a), name
        del got
    steady.close()
    with ImageRebuilder(ImageProcessing.from_vision(renderer.vision), workers=4) as pool:
        start = time.perf_counter()
        unpack_group(unpackb(packb(frames["encoded"])), images=pool)
        pool_wall = time.perf_counter() - start
    return {
        "case": name,
        "distinct": distinct,
        "sizes": sizes,
        "distinct_enc": distinct_enc,
        "rest": rest,
        "sampler_ms": 1e3 * min(sampler_s),
        "rebuild_ms": 1e3 * min(rebuild_s),
        "pool_ms": 1e3 * pool_wall,
    }


def main() -> None:
    print(f"{platform.python_version()} on {cpu_name()}")
    tmp = Path(tempfile.mkdtemp(prefix="vf_mm_image_modes_"))
    try:
        store = ImageStore(tmp / "store")
        tiny = load_renderer(embedded_model(), image_backend="auto")
        rows = [measure(e, env_group(e, tiny), tiny, store) for e in ("shapes", "gridnav", "zoom")]
        # a tiny Qwen2.5-VL with the real checkpoint's image config
        path = build_tiny_vlm(tmp / "qwen25", "qwen2_5_vl")
        config = json.loads((path / "preprocessor_config.json").read_text())
        config["size"] = {"longest_edge": REAL_QWEN25_MAX_PIXELS, "shortest_edge": 3136}
        (path / "preprocessor_config.json").write_text(json.dumps(config))
        real = load_renderer(path, image_backend="auto")
        rows.append(measure("photo 1280x720", photo_group(real), real, store))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    head = (f"{'case':<16}{'images':>7}{'tensors':>13}{'encoded':>12}{'ref':>9}"
            f"{'non-image':>11}{'distinct enc.':>15}{'img/distinct':>14}{'tensors/enc.':>14}")  # fmt: skip
    print("\nbytes per group (8 rollouts)\n" + head)
    for r in rows:
        s = r["sizes"]
        print(f"{r['case']:<16}{r['distinct']:>7}{s['tensors']:>13,}{s['encoded']:>12,}"
              f"{s['ref']:>9,}{r['rest']:>11,}{r['distinct_enc']:>15,}"
              f"{(s['encoded'] - r['rest']) / r['distinct_enc']:>14.3f}"
              f"{s['tensors'] / s['encoded']:>14.1f}")  # fmt: skip
    print("\nper distinct image: sampler processing vs trainer rebuild (1 thread, no cache)")
    print(
        f"{'case':<16}{'sampler ms':>12}{'rebuild ms':>12}{'ratio':>8}{'group, 4 workers ms':>22}"
    )
    for r in rows:
        ratio = r["rebuild_ms"] / r["sampler_ms"]
        print(f"{r['case']:<16}{r['sampler_ms']:>12.2f}{r['rebuild_ms']:>12.2f}{ratio:>8.2f}"
              f"{r['pool_ms']:>22.1f}")  # fmt: skip
    print("\nevery rebuilt tensor equals the sampler's, bit for bit")


if __name__ == "__main__":
    main()
