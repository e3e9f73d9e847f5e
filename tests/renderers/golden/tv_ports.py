"""Write ``tv_ports.json``: transformers' torchvision image processors' outputs for the
families that have no other (Kimi-K2.5, LFM2.5-VL), the goldens vf_mm's torch-only
ports must reproduce in the default tier, which has no torchvision.

It runs where torchvision imports, in the torchvision tier's venv (the default lock's
transformers with .venv-vllm's torch and torchvision; ``python3 dev.py torchvision``
makes it):

    PYTHONPATH=. .venv-torchvision/bin/python tests/renderers/golden/tv_ports.py

Each case is a conversation of stress images (1x1, huge, 3x500 and 500x3, sizes that
force a resize, a pad or tiles; modes RGB, L, RGBA, P and LA; several images, some in a
system message), made from seeded noise (``conversation``). The processor of the
family's tiny checkpoint (``build_tiny_vlm``), loaded with ``image_backend="torchvision"``
(transformers' own class), gives the token ids and the batched model inputs, stored as
shape, dtype and the sha256 of their bytes; each input image's sha256 is stored too, so a
failure says whether the images or the processing differ. The file records the versions
of torch, torchvision, transformers, numpy and Pillow it was written with.
``tests/renderers/test_tv_ports.py`` checks vf_mm's renderer (with the port) against it.
"""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from tests.renderers.golden._records import tensor_record, write_golden

HERE = Path(__file__).parent
OUT = HERE / "tv_ports.json"
FAMILIES = ("kimi_k25", "lfm2_vl")
SIZES = ((1, 1), (3, 500), (500, 3), (64, 64), (97, 501), (1000, 120), (640, 480), (1500, 1300),
         (13, 29), (300, 90))  # fmt: skip
MODES = ("RGB", "L", "RGBA", "P", "LA")
CASES = 6


def stress_image(seed: int, index: int) -> Image.Image:
    """Image ``index`` of case ``seed``: a stress size and mode, seeded noise."""
    w, h = SIZES[(seed * 3 + index) % len(SIZES)]
    noise = np.random.default_rng(1000 * seed + index).integers(0, 256, (h, w, 3), dtype=np.uint8)
    picture = Image.fromarray(noise)
    mode = MODES[(seed + index) % len(MODES)]
    if mode == "P":  # fast octree: the mode, not how its palette is chosen, is tested
        return picture.quantize(16, method=Image.Quantize.FASTOCTREE)
    return picture.convert(mode)


def conversation(seed: int) -> list[dict[str, Any]]:
    """Case ``seed``: one to three images, the first in a system message on odd seeds."""
    images = [{"type": "image", "image": stress_image(seed, i)} for i in range(1 + seed % 3)]
    messages: list[dict[str, Any]] = []
    if seed % 2 and len(images) > 1:
        messages.append({"role": "system", "content": [{"type": "text", "text": "Look: "},
                                                       images.pop(0)]})  # fmt: skip
    messages.append({"role": "user", "content": [*images, {"type": "text", "text": "How many?"}]})
    return messages


def image_digest(picture: Image.Image) -> str:
    return hashlib.sha256(picture.mode.encode() + repr(picture.size).encode() +
                          picture.tobytes()).hexdigest()  # fmt: skip


def images_of(messages: list[dict[str, Any]]) -> list[Image.Image]:
    return [p["image"] for m in messages for p in m["content"] if p.get("type") == "image"]


def reference(processor: Any, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The processor's token ids and batched image inputs for ``messages``: the template
    text with one image token per image, then ``processor(text=..., images=...)``."""
    text = processor.tokenizer.apply_chat_template(
        [{**m, "content": [p if p.get("type") != "image" else {"type": "image"}
                           for p in m["content"]]} for m in messages],
        tokenize=False, add_generation_prompt=True,
    )  # fmt: skip
    return processor(text=text, images=images_of(messages), return_tensors="np")


def main() -> None:
    import torch
    import torchvision
    import transformers
    from PIL import __version__ as pillow

    from vf_mm.models import family_info, load_processor
    from vf_mm.testing import build_tiny_vlm

    out: dict[str, Any] = {
        "written_by": "tests/renderers/golden/tv_ports.py",
        "versions": {"torch": torch.__version__, "torchvision": torchvision.__version__,
                     "transformers": transformers.__version__, "numpy": np.__version__,
                     "pillow": pillow,
                     "cpu_capability": torch.backends.cpu.get_cpu_capability()},
        "families": {},
    }  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        for family in FAMILIES:
            path = build_tiny_vlm(Path(tmp) / family, family)
            processor = load_processor(path, image_backend="torchvision")
            source = type(processor.image_processor)
            cases = []
            for seed in range(CASES):
                messages = conversation(seed)
                ref = reference(processor, messages)
                cases.append({
                    "seed": seed,
                    "images": [image_digest(p) for p in images_of(messages)],
                    "input_ids": ref["input_ids"][0].tolist(),
                    "inputs": {k: tensor_record(ref[k]) for k in family_info(family).image_inputs},
                })  # fmt: skip
            out["families"][family] = {
                "source": f"transformers {transformers.__version__} "
                f"{source.__module__}.{source.__name__}",
                "cases": cases,
            }
    write_golden(OUT, out)


if __name__ == "__main__":
    main()
