"""expand_image tells the processor the image's layout: a picture 1-4 pixels tall or wide
gives the tensors of a processor told it is channels-last, never a guess from its shape
(transformers reads an (H, W, 3) array with H in 1, 3, 4 as channels-first)."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image
from transformers.image_transforms import convert_to_rgb

from vf_mm.models import cached_tiny_vlm, expand_image, load_processor

#: heights and widths of 1-4 pixels (an RGB array 1, 3 or 4 pixels tall is what a guess
#: reads as channels-first)
SHAPES = ((1, 9), (2, 9), (3, 9), (4, 9), (9, 3), (3, 3), (3, 4))


@pytest.fixture(scope="module", params=["qwen2_5_vl", "gemma3"])
def processor(request):
    return load_processor(cached_tiny_vlm(request.param), image_backend="pil")


def _told(processor, array: np.ndarray) -> dict[str, np.ndarray]:
    """The image processor's inputs for ``array``, told its layout."""
    processed = processor.image_processor(
        [array], input_data_format="channels_last", return_tensors="np"
    )
    return {k: np.asarray(v) for k, v in processed.items()}


def _assert_same(ours: dict[str, np.ndarray], told: dict[str, np.ndarray], case: str) -> None:
    for key, value in ours.items():
        assert told[key].shape == value.shape and (told[key] == value).all(), (case, key)


def _pixels(height: int, width: int, channels: int) -> np.ndarray:
    rng = np.random.default_rng(height * 10 + width)
    return rng.integers(0, 256, (height, width, channels), dtype=np.uint8)


def test_a_thin_rgb_or_rgba_array_is_read_channels_last(processor):
    for height, width in SHAPES:
        for channels in (3, 4):
            array = _pixels(height, width, channels)
            _, item = expand_image(processor, array)
            _assert_same(item, _told(processor, array), f"{array.shape}")


def test_a_thin_pil_image_of_any_mode_is_read_channels_last(processor):
    for height, width in SHAPES:
        rgb = Image.fromarray(_pixels(height, width, 3))
        for mode in ("L", "RGB", "RGBA", "P"):
            picture = rgb.quantize(4) if mode == "P" else rgb.convert(mode)
            _, item = expand_image(processor, picture)
            told = _told(processor, np.asarray(convert_to_rgb(picture)))
            _assert_same(item, told, f"{mode} {width}x{height}")
