"""The renderer's pixels are the engine's: with torchvision present (as beside vLLM, and on
every GPU machine), ``image_backend="auto"`` is torchvision, and for every family the
renderer's model inputs equal transformers' ``AutoProcessor`` (what vLLM's processing and
a trainer run) bit for bit, on images of every mode that force a resize. The PIL
backend computes different pixels for them: the mismatch this choice prevents.

Runs in the vllm tier's venv (``python3 dev.py vllm``), which has torchvision; the main
venv cannot (PyPI's torchvision does not import beside the CPU torch wheel).
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from vf_mm.models import VISION_FAMILIES, image_backend_of, resolve_image_backend
from vf_mm.renderers import load_renderer
from vf_mm.testing import build_tiny_vlm

pytestmark = pytest.mark.vllm


@pytest.fixture(autouse=True, scope="module")
def _needs_torchvision():  # checked when the tests run, not when they are collected
    pytest.importorskip("torchvision")


# sizes from the field report: a resize happens for each (1000x120 is an extreme aspect)
SIZES = [(640, 480), (97, 501), (1000, 120), (28, 28), (333, 777)]


def picture(size, seed, mode="RGB"):
    """Random pixels; RGBA with a real (varying) alpha, LA too, P with a transparent index."""
    rng = np.random.default_rng(seed)
    rgb = Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))
    if mode in ("RGBA", "LA"):
        alpha = Image.fromarray(rng.integers(0, 256, (size[1], size[0]), dtype=np.uint8))
        image = rgb.convert(mode)
        image.putalpha(alpha)
        return image
    if mode == "P":
        image = rgb.convert("P")
        image.info["transparency"] = 0
        return image
    return rgb.convert(mode)


@pytest.fixture(scope="module", params=VISION_FAMILIES)
def family_checkpoint(request, tmp_path_factory):
    path = build_tiny_vlm(tmp_path_factory.mktemp(request.param) / "m", request.param)
    return request.param, path


@pytest.fixture(scope="module", params=["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def checkpoint(request, tmp_path_factory):
    return build_tiny_vlm(tmp_path_factory.mktemp(request.param) / "m", request.param)


def rendered_item(renderer, image):
    messages = [{"role": "user", "content": [{"type": "image", "image": image},
                                             {"type": "text", "text": "?"}]}]  # fmt: skip
    (item,) = renderer.render(messages).multi_modal_data.mm_items["image"]
    return item


def rendered_pixels(renderer, image):
    item = rendered_item(renderer, image)
    return item["pixel_values"], item["image_grid_thw"]


def test_auto_is_torchvision_where_it_imports():
    assert resolve_image_backend("auto") == "torchvision"


def vllm_rgb(images, tmp_path):
    """``images`` converted to RGB by vLLM's own ``convert_image_mode`` (alpha onto white),
    in a subprocess run outside the repo (tests/vllm would shadow the vllm package here)."""
    paths = []
    for i, image in enumerate(images):
        paths.append(tmp_path / f"in{i}.png")
        image.save(paths[-1])
    code = (
        "import sys\nfrom PIL import Image\nfrom vllm.multimodal.image import convert_image_mode\n"
        "for p in sys.argv[1:]:\n"
        "    convert_image_mode(Image.open(p), 'RGB').save(p + '.rgb.png')\n"
    )
    subprocess.run([sys.executable, "-c", code, *map(str, paths)], cwd=tmp_path, check=True,
                   capture_output=True, timeout=300)  # fmt: skip
    return [Image.open(f"{p}.rgb.png").copy() for p in paths]


MODES = ["RGB", "L", "RGBA", "LA", "P"]


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """Every mode's pictures after vLLM's RGB conversion, in one subprocess."""
    images = [picture(size, i, mode) for mode in MODES for i, size in enumerate(SIZES)]
    rgb = vllm_rgb(images, tmp_path_factory.mktemp("rgb"))
    return {mode: rgb[k * len(SIZES) : (k + 1) * len(SIZES)] for k, mode in enumerate(MODES)}


@pytest.mark.parametrize("mode", MODES)
def test_every_familys_torchvision_inputs_equal_its_auto_processor(family_checkpoint, mode,
                                                                   converted):  # fmt: skip
    """Every family, every image mode, sizes that force a resize: the renderer's model
    inputs (all of them: pixel_values, grids, attention masks, image sizes) equal what
    transformers' own ``AutoProcessor`` (the torchvision one, as beside vLLM) computes for
    the image after vLLM's RGB conversion, bit for bit."""
    from transformers import AutoProcessor

    family, path = family_checkpoint
    engine = AutoProcessor.from_pretrained(path)
    assert image_backend_of(engine.image_processor) == "torchvision"
    renderer = load_renderer(path)  # auto
    assert renderer.image_backend == "torchvision"
    images = [picture(size, i, mode) for i, size in enumerate(SIZES)]
    for size, image, rgb in zip(SIZES, images, converted[mode], strict=True):
        item = rendered_item(renderer, image)
        # one image, one sample (LLaVA-OneVision: single-image mode, as vLLM computes it)
        ref = engine(text=[engine.image_token], images=[rgb], return_tensors="np")
        shared = set(item) & set(ref)
        assert shared == set(item), (family, set(item) - set(ref))
        for key in shared:
            expected = np.asarray(ref[key])
            assert item[key].dtype == expected.dtype, (family, key)
            assert np.array_equal(item[key], expected), (family, key, size)  # bit-exact


def test_the_pil_backend_differs_on_resized_images(checkpoint):
    pil = load_renderer(checkpoint, image_backend="pil")
    tv = load_renderer(checkpoint, image_backend="torchvision")
    assert (pil.image_backend, tv.image_backend) == ("pil", "torchvision")
    worst = 0.0
    for i, size in enumerate(SIZES[:3]):
        a, _ = rendered_pixels(pil, picture(size, i))
        b, _ = rendered_pixels(tv, picture(size, i))
        worst = max(worst, float(np.abs(a - b).max()))
    assert worst > 1e-3  # why the backend must match the engine's
