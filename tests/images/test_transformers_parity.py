"""Each odd image case gives the pixels transformers gives for the same input.

The reference is what a Qwen2-VL pipeline does: ``transformers.image_utils.load_image``
(EXIF rotation) for a file, and the Qwen2-VL image processor's ``convert_to_rgb``
(alpha composited onto white) for a PIL image; the last test runs the processor itself.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from transformers import image_transforms, image_utils

from vf_mm.images import load_image

from ._make import encode, gradient


def _palette_with_transparency() -> bytes:
    image = gradient(8, 6).convert("P")
    return encode(image, "PNG", transparency=int(np.asarray(image)[0, 0]))


def _rgba() -> bytes:
    array = np.asarray(gradient(8, 6).convert("RGBA")).copy()
    array[..., 3] = np.arange(48, dtype=np.uint8).reshape(6, 8) * 5
    return encode(Image.fromarray(array, "RGBA"), "PNG")


CASES = {
    "rgba": _rgba,
    "la": lambda: encode(gradient(8, 6).convert("LA"), "PNG"),
    "palette+transparency": _palette_with_transparency,
    "palette": lambda: encode(gradient(8, 6).convert("P"), "PNG"),
    "grey": lambda: encode(gradient(8, 6).convert("L"), "PNG"),
    "1-bit": lambda: encode(gradient(8, 6).convert("1"), "PNG"),
    "cmyk-jpeg": lambda: encode(gradient(8, 6).convert("CMYK"), "JPEG"),
    "16-bit grey": lambda: encode(
        Image.fromarray(np.arange(48, dtype=np.uint16).reshape(6, 8) * 1300), "PNG"
    ),
    "animated gif": lambda: encode(
        gradient(8, 6).convert("P"),
        "GIF",
        save_all=True,
        append_images=[Image.new("P", (8, 6), 3)],
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_convert_to_rgb_of_the_processor(case):
    data = CASES[case]()
    reference = image_transforms.convert_to_rgb(Image.open(io.BytesIO(data)), return_numpy=True)
    ours = np.asarray(load_image(data))
    assert ours.dtype == reference.dtype and ours.shape == reference.shape
    assert (ours == reference).all()


@pytest.mark.parametrize("orientation", [3, 6, 8])
def test_exif_rotation_matches_transformers_load_image(tmp_path: Path, orientation):
    exif = Image.Exif()
    exif[0x0112] = orientation
    path = tmp_path / "rotated.jpg"
    path.write_bytes(encode(gradient(16, 8), "JPEG", exif=exif.tobytes()))
    reference = np.asarray(image_utils.load_image(str(path)))
    ours = np.asarray(load_image(path))
    assert ours.shape == reference.shape
    assert (ours == reference).all()


def test_the_qwen2_vl_processor_sees_the_same_pixels():
    from transformers.models.qwen2_vl import image_processing_pil_qwen2_vl as module

    processor = module.Qwen2VLImageProcessorPil()
    for case in ("rgba", "palette+transparency", "16-bit grey", "cmyk-jpeg"):
        data = CASES[case]()
        raw = Image.open(io.BytesIO(data)).resize((56, 56))
        ours = load_image(raw)
        direct = processor(images=[raw], return_tensors="np")
        via_us = processor(images=[ours], return_tensors="np")
        assert (direct["image_grid_thw"] == via_us["image_grid_thw"]).all()
        assert np.array_equal(direct["pixel_values"], via_us["pixel_values"]), case
