"""The torchvision image processors (as beside vLLM) read a picture 1-4 pixels tall or
wide as a processor told its layout does: ``expand_image`` tells an array's layout (a
guess read an RGB array 1, 3 or 4 pixels tall as channels-first) and leaves a PIL image
untold (transformers 5.19's torchvision backend permutes a PIL image told channels-last).
The PIL backends' twin is ``tests/models/test_expand_image.py``."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image
from transformers.image_transforms import convert_to_rgb

from vf_mm.models import expand_image, load_processor
from vf_mm.testing import build_tiny_vlm

pytestmark = pytest.mark.vllm

SHAPES = ((1, 9), (2, 9), (3, 9), (4, 9), (9, 3), (3, 3), (3, 4))


@pytest.fixture(scope="module", params=["qwen2_5_vl", "gemma3", "lfm2_vl"])
def processor(request, tmp_path_factory):
    pytest.importorskip("torchvision")
    path = build_tiny_vlm(tmp_path_factory.mktemp(request.param) / "m", request.param)
    return load_processor(path, image_backend="torchvision")


def _told(processor, array: np.ndarray) -> dict[str, np.ndarray]:
    out = processor.image_processor([array], input_data_format="channels_last", return_tensors="np")
    return {k: np.asarray(v) for k, v in out.items()}


def test_thin_arrays_and_pil_images_give_the_tensors_of_a_processor_told_the_layout(processor):
    for height, width in SHAPES:
        pixels = np.random.default_rng(height * 10 + width).integers(
            0, 256, (height, width, 3), dtype=np.uint8
        )
        cases = [("array", pixels, pixels)]
        rgb = Image.fromarray(pixels)
        for mode in ("L", "RGB", "RGBA", "P"):
            picture = rgb.quantize(4) if mode == "P" else rgb.convert(mode)
            cases.append((mode, picture, np.asarray(convert_to_rgb(picture))))
        for name, image, reference in cases:
            _, item = expand_image(processor, image)
            told = _told(processor, reference)
            for key, value in item.items():
                same = told[key].shape == value.shape and (told[key] == value).all()
                assert same, (name, height, width, key)
