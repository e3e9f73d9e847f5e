"""LFM2.5-VL's image processor with torch alone: ``Lfm2VlImages``.

It computes what transformers 5.23's ``Lfm2VlImageProcessor`` (torchvision only)
computes, bit for bit, where torchvision does not import. An image small enough for one
SigLIP2 NaFlex pass (``max_image_tokens`` tokens, with ``max_pixels_tolerance``) is
resized to sides that are multiples of ``encoder_patch_size * downsample_factor``,
within ``min_image_tokens`` to ``max_image_tokens`` tokens (``single_size``); a larger
one is resized to a grid of ``tile_size`` tiles (``min_tiles`` to ``max_tiles``, the
grid of the nearest aspect ratio, ``tile_grid``) and cut into them, followed by a
thumbnail at the single-pass size (``use_thumbnail``). Each crop is normalised, cut into
``encoder_patch_size`` patches (each patch's pixels row by row, channels last) and
zero-padded to ``max_num_patches`` patches, with ``pixel_attention_mask`` marking the
real ones and ``spatial_shapes`` the crop's patch rows and columns.
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

from vf_mm.models._tv_ops import TorchvisionPort, interpolation_mode, rescale_and_normalize, resize


class Lfm2VlImagesKwargs(ImagesKwargs, total=False):
    """The call options of LFM2-VL's image processor beyond transformers' common ones."""

    downsample_factor: int
    do_image_splitting: bool
    min_tiles: int
    max_tiles: int
    use_thumbnail: bool
    min_image_tokens: int
    max_image_tokens: int
    encoder_patch_size: int
    tile_size: int
    max_pixels_tolerance: float
    return_row_col_info: bool


def single_size(
    height: int, width: int, *, patch: int, downsample: int, min_tokens: int, max_tokens: int
) -> tuple[int, int]:
    """``(height, width)`` of an image resized for one pass: each side rounded to a
    multiple of ``patch * downsample`` (at least one), then, if that holds more than
    ``max_tokens`` (fewer than ``min_tokens``) tokens, both sides scaled by the one
    factor that makes the area fit and floored (ceiled) to the multiple."""
    unit = patch * downsample
    per_token = patch**2 * downsample**2
    h = max(unit, round(height / unit) * unit)
    w = max(unit, round(width / unit) * unit)
    if h * w > max_tokens * per_token:
        beta = math.sqrt(height * width / (max_tokens * per_token))
        h = max(unit, math.floor(height / beta / unit) * unit)
        w = max(unit, math.floor(width / beta / unit) * unit)
    elif h * w < min_tokens * per_token:
        beta = math.sqrt(min_tokens * per_token / (height * width))
        h = math.ceil(height * beta / unit) * unit
        w = math.ceil(width * beta / unit) * unit
    return h, w


def is_too_large(
    height: int, width: int, *, patch: int, downsample: int, max_tokens: int, tolerance: float
) -> bool:
    """Whether an image is cut into tiles: its sides rounded to multiples of
    ``patch * downsample`` (at least ``patch``) hold more than ``max_tokens`` tokens'
    pixels times ``tolerance``."""
    unit = patch * downsample
    h = max(patch, round(height / unit) * unit)
    w = max(patch, round(width / unit) * unit)
    return h * w > max_tokens * patch**2 * downsample**2 * tolerance


def grid_ratios(min_tiles: int, max_tiles: int) -> list[tuple[int, int]]:
    """Every ``(columns, rows)`` grid of ``min_tiles`` to ``max_tiles`` tiles, fewest tiles
    first; grids of as many tiles keep the order a set of them iterates in (the order
    that decides ties, as in transformers)."""
    grids = {
        (c, r)
        for n in range(min_tiles, max_tiles + 1)
        for c in range(1, n + 1)
        for r in range(1, n + 1)
        if min_tiles <= c * r <= max_tiles
    }
    return sorted(grids, key=lambda g: g[0] * g[1])


def max_patches(*, tile: int, patch: int, max_tokens: int, downsample: int, splitting: bool) -> int:
    """The patches every crop is padded to: a single pass's most (``max_tokens`` before
    the ``downsample`` merge), or a whole tile's where images are split into tiles."""
    tiles = (tile // patch) ** 2 if splitting else 0
    return max(max_tokens * downsample**2, tiles)


def tile_grid(
    height: int, width: int, *, min_tiles: int, max_tiles: int, tile: int
) -> tuple[int, int]:
    """``(columns, rows)`` of tiles: the grid whose aspect ratio is nearest the image's;
    of grids equally near, a later one replaces the one found when the image's area is
    more than half of the later grid's."""
    aspect = width / height
    best, best_diff = (1, 1), float("inf")
    for columns, rows in grid_ratios(min_tiles, max_tiles):
        diff = abs(aspect - columns / rows)
        if diff < best_diff:
            best, best_diff = (columns, rows), diff
        elif diff == best_diff and height * width > 0.5 * tile * tile * columns * rows:
            best = (columns, rows)
    return best


class Lfm2VlImages(TorchvisionPort):
    """LFM2-VL's image processor (``Lfm2VlImageProcessor``'s numbers, torch alone).

    Its settings and defaults are transformers'; ``preprocess(images)`` gives every crop
    of every image in turn (tiles row by row, then the thumbnail):
    ``pixel_values`` ``(crops, max_num_patches, patch * patch * C)``,
    ``pixel_attention_mask`` ``(crops, max_num_patches)`` (int32) and ``spatial_shapes``
    ``(crops, 2)``; with ``return_row_col_info`` (the processor asks for it) also each
    image's ``image_rows``, ``image_cols`` and single-pass ``image_sizes``, from which
    the processor writes its tokens.
    """

    torchvision_class = "Lfm2VlImageProcessor"
    downsample_factor = 2
    do_image_splitting = True
    min_tiles = 2
    max_tiles = 10
    use_thumbnail = True
    min_image_tokens = 64
    max_image_tokens = 256
    encoder_patch_size = 16
    tile_size = 512
    max_pixels_tolerance = 2.0
    do_resize = True
    size = {"height": 512, "width": 512}  # noqa: RUF012 (transformers' settings)
    resample = PILImageResampling.BILINEAR
    do_rescale = True
    rescale_factor = 1 / 255
    do_normalize = True
    do_pad = True
    return_row_col_info = False
    image_mean = IMAGENET_STANDARD_MEAN
    image_std = IMAGENET_STANDARD_STD
    valid_kwargs = Lfm2VlImagesKwargs
    model_input_names = ["pixel_values", "pixel_attention_mask", "spatial_shapes"]  # noqa: RUF012

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.max_num_patches = max_patches(
            tile=self.tile_size, patch=self.encoder_patch_size,
            max_tokens=self.max_image_tokens, downsample=self.downsample_factor,
            splitting=self.do_image_splitting,
        )  # fmt: skip

    def _crops(
        self, image: torch.Tensor, o: dict[str, Any]
    ) -> tuple[list[torch.Tensor], int, int, list[int]]:
        """One image's crops (tiles row by row, then the thumbnail; or the one resized
        image), its tile rows and columns, and its single-pass size."""
        height, width = image.shape[-2:]
        mode = interpolation_mode(o["resample"])
        patch, downsample = o["encoder_patch_size"], o["downsample_factor"]
        size = single_size(
            height, width, patch=patch, downsample=downsample,
            min_tokens=o["min_image_tokens"], max_tokens=o["max_image_tokens"],
        )  # fmt: skip
        large = is_too_large(
            height, width, patch=patch, downsample=downsample,
            max_tokens=o["max_image_tokens"], tolerance=o["max_pixels_tolerance"],
        )  # fmt: skip
        if not (large and not o["min_tiles"] == o["max_tiles"] == 1):
            return [resize(image[None], *size, mode=mode)[0]], 1, 1, list(size)
        tile = o["tile_size"]
        columns, rows = tile_grid(
            height, width, min_tiles=o["min_tiles"], max_tiles=o["max_tiles"], tile=tile
        )
        grid = resize(image[None], tile * rows, tile * columns, mode=mode)[0]
        channels = grid.shape[0]
        tiles = grid.reshape(channels, rows, tile, columns, tile).permute(1, 3, 0, 2, 4)
        crops = list(tiles.contiguous().reshape(rows * columns, channels, tile, tile))
        if o["use_thumbnail"] and rows * columns != 1:
            crops.append(resize(image[None], *size, mode=mode)[0])
        return crops, rows, columns, list(size)

    def _preprocess(
        self,
        images: list[torch.Tensor],
        *,
        do_image_splitting: bool,
        min_tiles: int,
        max_tiles: int,
        do_pad: bool,
        return_row_col_info: bool,
        return_tensors: Any = None,
        **kwargs: Any,
    ) -> BatchFeature:
        if not do_image_splitting:
            min_tiles = max_tiles = 1
        elif min_tiles > max_tiles:
            raise ValueError("min_tiles must be less than or equal to max_tiles")
        o = {**kwargs, "min_tiles": min_tiles, "max_tiles": max_tiles}
        patch = o["encoder_patch_size"]
        padded = max_patches(
            tile=o["tile_size"], patch=patch, max_tokens=o["max_image_tokens"],
            downsample=o["downsample_factor"], splitting=do_image_splitting,
        )  # fmt: skip
        values, masks, shapes = [], [], []
        rows, columns, sizes = [], [], []
        for image in images:
            crops, r, c, size = self._crops(image, o)
            rows.append(r)
            columns.append(c)
            sizes.append(size)
            crop_values, crop_masks, crop_shapes = [], [], []
            for crop in crops:
                x = rescale_and_normalize(
                    crop[None], do_rescale=o["do_rescale"], rescale_factor=o["rescale_factor"],
                    do_normalize=o["do_normalize"], mean=o["image_mean"], std=o["image_std"],
                )[0]  # fmt: skip
                channels, height, width = x.shape
                ph, pw = height // patch, width // patch
                x = x.reshape(channels, ph, patch, pw, patch).permute(1, 3, 2, 4, 0)
                x = x.reshape(ph * pw, patch * patch * channels)
                crop_shapes.append([ph, pw])
                if do_pad:
                    mask = torch.ones((padded,), dtype=torch.int32)
                    missing = padded - x.shape[0]
                    if missing > 0:
                        x = torch.nn.functional.pad(x, [0, 0, 0, missing], value=0)
                        mask[-missing:] = 0
                    crop_masks.append(mask)
                crop_values.append(x)
            values.append(torch.stack(crop_values))
            if do_pad:
                masks.append(torch.stack(crop_masks))
                shapes.append(torch.tensor(crop_shapes))
        data: dict[str, Any] = {"pixel_values": torch.cat(values)}
        if do_pad:
            data["pixel_attention_mask"] = torch.cat(masks)
            data["spatial_shapes"] = torch.cat(shapes)
        if return_row_col_info:
            data.update(image_rows=rows, image_cols=columns, image_sizes=sizes)
        return BatchFeature(data=data, tensor_type=return_tensors)
