"""Kimi-K2.5's image processor with torch alone: ``KimiK25Images``.

It computes what transformers 5.23's ``Kimi_K25ImageProcessor`` (torchvision only)
computes, bit for bit, where torchvision does not import. An image is scaled down
(never up) to fit MoonViT's patch budget, ``max_patches`` patches of ``patch_size`` and
``size["max_height"]`` patches a side (``navit_size``), resized with antialiased bicubic
interpolation, padded with zeros on the bottom and right to a multiple of
``merge_size * patch_size``, normalised, and cut into ``(patches, C, patch, patch)``
squares; ``image_grid_thw`` is ``(1, rows, columns)`` of patches, and the prompt holds
``rows * columns // merge_size**2`` image tokens.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from transformers.image_processing_utils import BatchFeature
from transformers.image_utils import (
    IMAGENET_STANDARD_MEAN,
    IMAGENET_STANDARD_STD,
    PILImageResampling,
)
from transformers.processing_utils import ImagesKwargs

from vf_mm.models._tv_ops import (
    TorchvisionPort,
    interpolation_mode,
    pad,
    rescale_and_normalize,
    resize,
)


class KimiK25ImagesKwargs(ImagesKwargs, total=False):
    """The call options of Kimi-K2.5's image processor beyond transformers' common ones."""

    max_patches: int
    patch_size: int
    merge_size: int


def navit_size(
    height: int, width: int, *, patch_size: int, merge_size: int, max_patches: int, max_side: int
) -> tuple[tuple[int, int], tuple[int, int]]:
    """``((height, width), (padded_height, padded_width))`` an image is resized and
    padded to: scaled by the tightest of the total budget (``sqrt(max_patches /
    patches)``, patches counted as at least one a side), the per-side budget
    (``max_side * patch_size`` pixels) and 1 (never up), each side truncated and kept
    in 1 .. ``max_side * patch_size``, then padded up to a multiple of
    ``merge_size * patch_size``."""
    rows = max(1.0, height // patch_size)
    columns = max(1.0, width // patch_size)
    limit = max_side * patch_size
    scale = min(1.0, math.sqrt(max_patches / (rows * columns)), limit / height, limit / width)
    new_h = min(max(1, int(height * scale)), limit)
    new_w = min(max(1, int(width * scale)), limit)
    unit = merge_size * patch_size
    return (new_h, new_w), (-(-new_h // unit) * unit, -(-new_w // unit) * unit)


class KimiK25Images(TorchvisionPort):
    """Kimi-K2.5's image processor (``Kimi_K25ImageProcessor``'s numbers, torch alone).

    Its settings and defaults are transformers'; ``preprocess(images)`` gives
    ``pixel_values`` ``(patches, C, patch, patch)`` of every image in turn and
    ``image_grid_thw`` ``(images, 3)``.
    """

    torchvision_class = "Kimi_K25ImageProcessor"
    do_resize = True
    resample = PILImageResampling.BICUBIC
    size = {"max_height": 512, "max_width": 512}  # noqa: RUF012 (transformers' settings)
    max_patches = 16384
    do_rescale = True
    do_normalize = True
    image_mean = IMAGENET_STANDARD_MEAN
    image_std = IMAGENET_STANDARD_STD
    do_convert_rgb = True
    patch_size = 14
    merge_size = 2
    valid_kwargs = KimiK25ImagesKwargs
    model_input_names = ["pixel_values", "image_grid_thw"]  # noqa: RUF012

    def _validate_preprocess_kwargs(self, *args: Any, **kwargs: Any) -> Any:
        size = kwargs.get("size")
        if size is not None and (
            size.max_height is None or size.max_width is None or size.max_height != size.max_width
        ):
            raise ValueError(
                f"size must be {{'max_height': N, 'max_width': N}} with one N, not {dict(size)}"
            )
        return super()._validate_preprocess_kwargs(*args, **kwargs)

    def _preprocess(
        self,
        images: list[torch.Tensor],
        *,
        do_resize: bool,
        size: Any,
        resample: Any,
        do_rescale: bool,
        rescale_factor: float,
        do_normalize: bool,
        image_mean: Any,
        image_std: Any,
        patch_size: int,
        merge_size: int,
        max_patches: int,
        return_tensors: Any = None,
        **kwargs: Any,
    ) -> BatchFeature:
        patches, grids = [], []
        mode = interpolation_mode(resample)
        for image in images:
            if do_resize:
                (h, w), (ph, pw) = navit_size(
                    *image.shape[-2:], patch_size=patch_size, merge_size=merge_size,
                    max_patches=max_patches, max_side=size.max_height,
                )  # fmt: skip
                image = pad(resize(image[None], h, w, mode=mode), ph, pw)[0]
            image = rescale_and_normalize(
                image[None], do_rescale=do_rescale, rescale_factor=rescale_factor,
                do_normalize=do_normalize, mean=image_mean, std=image_std,
            )[0]  # fmt: skip
            channels, height, width = image.shape
            rows, columns = height // patch_size, width // patch_size
            squares = image.reshape(channels, rows, patch_size, columns, patch_size)
            squares = squares.permute(1, 3, 0, 2, 4).reshape(
                rows * columns, channels, patch_size, patch_size
            )
            patches.append(squares)
            grids.append([1, rows, columns])
        pixel_values = patches[0] if len(patches) == 1 else torch.cat(patches, dim=0)
        return BatchFeature(
            data={"pixel_values": pixel_values, "image_grid_thw": torch.tensor(grids)},
            tensor_type=return_tensors,
        )

    def get_number_of_image_patches(
        self, height: int, width: int, images_kwargs: dict[str, Any] | None = None
    ) -> int:
        """How many patches an image of ``height`` x ``width`` becomes (vLLM asks this
        without the image)."""
        options = images_kwargs or {}
        max_side = options["size"]["max_height"] if "size" in options else self.size["max_height"]
        patch = options.get("patch_size", self.patch_size)
        _, (ph, pw) = navit_size(
            height, width, patch_size=patch, merge_size=options.get("merge_size", self.merge_size),
            max_patches=options.get("max_patches", self.max_patches), max_side=max_side,
        )  # fmt: skip
        return (ph // patch) * (pw // patch)
