"""The torch-only ports' resize casts a float resize back as torchvision does."""

from __future__ import annotations

import pytest
import torch

from vf_mm.models._tv_ops import resize


@pytest.mark.parametrize(
    ("dtype", "rounded"),
    [(torch.uint16, False), (torch.uint32, False), (torch.int16, True), (torch.int32, True)],
)
def test_a_wide_integer_image_is_cast_back_as_torchvision_casts_it(dtype, rounded):
    """torchvision rounds a float resize back to uint8 and the signed integers only; a
    uint16 or uint32 image (a 16-bit PNG as an array) is truncated by the cast, and the
    port must give the same numbers (rounding them moved pixels by one level)."""
    image = (torch.arange(3 * 9 * 11, dtype=torch.float32).reshape(3, 9, 11) * 97 % 30011).to(dtype)
    out = resize(image, 5, 7, mode="bilinear")
    floats = torch.nn.functional.interpolate(
        image[None].float(), size=[5, 7], mode="bilinear", align_corners=False, antialias=True
    )[0]
    assert torch.equal(out, (floats.round() if rounded else floats).to(dtype))
    try:
        import torchvision.transforms.v2.functional as tvf
    except ImportError:
        return
    assert torch.equal(out, tvf.resize(image, [5, 7], antialias=True))


@pytest.mark.parametrize("given", ["bilinear", "bicubic", "nearest", "nearest-exact", "lanczos"])
def test_torchvisions_interpolation_names_are_taken_as_transformers_takes_them(given):
    """transformers' torchvision processors take ``resample`` as torchvision's
    ``InterpolationMode`` (a str enum) as well as a PIL code; the port must too, not fail
    on ``int("bilinear")``."""
    from enum import Enum

    from vf_mm.models._tv_ops import interpolation_mode

    mode = Enum("InterpolationMode", {"X": given})  # torchvision's enum, without torchvision
    assert interpolation_mode(given) == interpolation_mode(mode.X) == given
    with pytest.raises(ValueError, match="box and hamming"):
        interpolation_mode("box")


def test_a_torch_without_lanczos_is_refused_by_name(monkeypatch):
    """SmolVLM's frames are resized with torch's own Lanczos mode, which older torch
    releases lack (2.11 raises a ValueError about anti-aliasing): the resize is refused,
    naming the version that has it, never done another way."""
    from vf_mm.errors import RenderError

    real = torch.nn.functional.interpolate

    def older(*args, **kwargs):
        if kwargs.get("mode") == "lanczos":
            raise ValueError("Anti-alias option is restricted to bilinear and bicubic modes")
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "interpolate", older)
    frames = torch.zeros((2, 3, 20, 30), dtype=torch.uint8)
    assert resize(frames, 10, 15, mode="bicubic").shape == (2, 3, 10, 15)
    with pytest.raises(RenderError, match=r"'lanczos'.*torch 2\.13 does"):
        resize(frames, 10, 15, mode="lanczos")
