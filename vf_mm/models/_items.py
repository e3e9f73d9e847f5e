"""``ItemChecker``: one image's model inputs, as a client sends them, checked against a
family's processor before a forward reads them.

A served engine takes each image's processed inputs from its client (``vf-mm serve``'s
``features`` mode): numpy arrays a buggy or malicious client made. A forward reads
them blindly: a wrong dtype, a tile of another size, a count of embeddings that differs
from the image tokens in the prompt fail inside the model (or, worse, run and mean
something else). So each item is checked here against the facts of the family's own
processor (its tile and patch sizes, tokens per tile, grid pinpoints) and its shapes
made the ones the family's processor makes, and the number of embeddings the model
will fill from it is computed the way the model computes it: that number must equal
the image tokens of the item's placeholder.

Per family (``VisionFamily.item_layout`` names the layout; the facts are the
processor's):

- ``"grid"`` (Qwen-VL, Qwen3.5): ``pixel_values`` ``(patches, C*T*P*P)`` and
  ``image_grid_thw`` ``(1, 3)``: patches = t*h*w, h and w multiples of the merge size;
  embeddings t*h*w / merge^2;
- ``"crops"`` (Gemma 3, InternVL): ``pixel_values`` ``(crops, 3, S, S)`` (InternVL) or
  ``(1 + pan-and-scan crops, 3, S, S)`` (Gemma 3), S the image processor's size;
  embeddings crops * the processor's tokens per crop;
- ``"tiles"`` (SmolVLM): ``pixel_values`` ``(1, tiles, 3, S, S)`` and
  ``pixel_attention_mask`` ``(1, tiles, S, S)`` of 0/1, no tile all padding (the model
  drops all-zero tiles, and its count would no longer match); embeddings tiles * the
  processor's tokens per tile;
- ``"anyres"`` (LLaVA-OneVision, LLaVA-NeXT): ``pixel_values`` ``(1, tiles, 3, S, S)``
  and ``image_sizes`` ``(1, 2)``: tiles is what the grid pinpoints give for that size,
  embeddings the processor's own count for it;
- ``"soft_tokens"`` (Gemma 4): ``pixel_values`` ``(1, patches, 3*P*P)`` and
  ``image_position_ids`` ``(1, patches, 2)``: the real patches' positions an x-major
  grid whose sides are multiples of the pooling kernel k, the rest (-1, -1) padding;
  embeddings real patches / k^2.

Every float input must be finite (a NaN pixel turns into NaN logits, which the
sampler cannot draw from). A family with no layout (LFM2-VL: its variable tiles and
``spatial_shapes`` are not checked yet) is refused by ``ItemChecker`` with why. Videos
are checked for the ``"grid"`` layout only (``pixel_values_videos``, ``video_grid_thw``
and the family's other video inputs).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from vf_mm.errors import MultiModalDataError, UnsupportedModelError
from vf_mm.models._families import family_info

__all__ = ["ItemChecker"]

#: layouts whose image span holds tokens that take no embedding (markers, row text)
_SPARSE_LAYOUTS = frozenset({"crops", "tiles", "soft_tokens"})


def _bad(field: str, message: str) -> MultiModalDataError:
    return MultiModalDataError(f"{field}: {message}")


def _floats(item: Mapping[str, Any], key: str, ndim: int) -> np.ndarray:
    """``item[key]`` as a finite float32 array of ``ndim`` dimensions (bfloat16 and
    float16 widened), read-only."""
    value = np.asarray(item[key])
    if value.ndim != ndim or not (value.dtype.kind == "f" or value.dtype.name == "bfloat16"):
        raise _bad(key, f"must be a {ndim}-D float array, got {value.dtype} {value.shape}")
    if value.dtype != np.float32:
        value = value.astype(np.float32)
    if not np.isfinite(value).all():
        raise _bad(key, "holds NaN or infinite values")
    if value.flags.writeable:
        value = value.view()
        value.flags.writeable = False
    return value


def _ints(item: Mapping[str, Any], key: str, shape: tuple[int | None, ...]) -> np.ndarray:
    """``item[key]`` as an int64 array of ``shape`` (None: any length on that axis)."""
    value = np.asarray(item[key])
    if (
        value.dtype.kind not in "iu"
        or value.ndim != len(shape)
        or any(
            want is not None and got != want for got, want in zip(value.shape, shape, strict=True)
        )
    ):
        wanted = "(" + ", ".join("n" if s is None else str(s) for s in shape) + ")"
        raise _bad(key, f"must be an int array of shape {wanted}, got {value.dtype} {value.shape}")
    return value.astype(np.int64)


def _side(size: Any, *names: str) -> int:
    """The first of ``names`` a processor's size (a dict or a ``SizeDict``) sets."""
    for name in names:
        value = size.get(name) if isinstance(size, Mapping) else getattr(size, name, None)
        if value:
            return int(value)
    raise UnsupportedModelError(f"the image processor's size {size!r} sets none of {names}")


class ItemChecker:
    """The checks of one family's items (see the module docstring), with the facts of
    ``processor`` (the family's HF processor, as the renderer loaded it) read once.
    ``check(item, modality=...)`` returns the item as the family's forward takes it
    (floats as float32, grids ``(1, 3)`` int64) or raises ``MultiModalDataError`` naming
    the field; ``embeds(item, modality=...)`` is the number of embeddings the model
    fills from a checked item. ``sparse``: an item's placeholder range may hold tokens
    that take no embedding (markers around and between its image tokens)."""

    def __init__(self, family: str, *, processor: Any) -> None:
        info = family_info(family)
        if info.item_layout is None:
            raise UnsupportedModelError(
                f"{info.label}'s processed images ({', '.join(info.image_inputs)}) are not "
                "checked yet, so a server cannot take them from a client safely"
            )
        self.family = family
        self.label = info.label
        self.layout = info.item_layout
        self.sparse = self.layout in _SPARSE_LAYOUTS
        self.image_inputs = frozenset(info.image_inputs)
        self.video_inputs = frozenset(info.video_inputs)
        #: clips are taken as processed inputs (the grid layout's; another family's clips
        #: must come as content_parts, which the server processes itself)
        self.takes_video = self.layout == "grid" and bool(self.video_inputs)
        self.processor = processor
        image_processor = processor.image_processor
        layouts: dict[str, tuple[Callable[[dict[str, Any]], None], Callable[..., int]]] = {
            "grid": (self._check_grid, self._embeds_grid),
            "crops": (self._check_crops, self._embeds_crops),
            "tiles": (self._check_tiles, self._embeds_tiles),
            "anyres": (self._check_anyres, self._embeds_anyres),
            "soft_tokens": (self._check_soft_tokens, self._embeds_soft_tokens),
        }
        self._check_layout, self._embeds_layout = layouts[self.layout]
        if self.layout == "grid":
            self.merge_size = int(getattr(image_processor, "merge_size", None) or 2)
            patch = int(image_processor.patch_size)
            temporal = int(getattr(image_processor, "temporal_patch_size", None) or 1)
            self.row_width = 3 * temporal * patch * patch
        elif self.layout == "crops":
            self.side = _side(image_processor.size, "height", "longest_edge")
            self.per_crop = int(processor.image_seq_length)
        elif self.layout == "tiles":
            self.side = _side(image_processor.max_image_size, "longest_edge", "height")
            self.per_crop = int(processor.image_seq_len)
        elif self.layout == "anyres":
            crop = getattr(image_processor, "crop_size", None) or image_processor.size
            self.side = _side(crop, "height", "shortest_edge")
            self.pinpoints = [
                tuple(int(x) for x in p) for p in image_processor.image_grid_pinpoints
            ]
        else:  # soft_tokens
            patch = int(image_processor.patch_size)
            self.kernel = int(image_processor.pooling_kernel_size)
            self.patches = int(image_processor.max_soft_tokens) * self.kernel**2
            self.row_width = 3 * patch * patch

    def check(self, item: Mapping[str, Any], *, modality: str = "image") -> dict[str, Any]:
        """``item`` checked (see the class docstring)."""
        if not isinstance(item, Mapping):
            raise _bad("item", f"must be a map of input names to arrays, got {type(item).__name__}")
        if modality == "video":
            if not self.takes_video:
                raise _bad(
                    "video",
                    f"{self.label}'s processed clips are not checked: send its clips as "
                    "content_parts (the server processes them)",
                )
            expected = self.video_inputs
        else:
            expected = self.image_inputs - {"batch_num_images"}  # transformers-only
        keys = set(item)
        if keys - {"batch_num_images"} != expected:
            raise _bad(
                "item",
                f"a {self.label} {modality} takes {sorted(expected)}, got {sorted(keys)}",
            )
        out = dict(item)
        if modality == "video":
            self._check_grid(out, modality="video")
        else:
            self._check_layout(out)
        if "batch_num_images" in self.image_inputs and modality == "image":
            out["batch_num_images"] = np.ones(1, dtype=np.int64)  # one image, anyres mode
        return out

    def embeds(self, item: Mapping[str, Any], *, modality: str = "image") -> int:
        """How many embeddings the model fills from a checked ``item``."""
        if modality == "video":
            return self._embeds_grid(item, modality="video")
        return int(self._embeds_layout(item))

    def describe(self, item: Mapping[str, Any], *, modality: str = "image") -> str:
        """What makes a checked ``item``'s count of embeddings, for an error message."""
        n = self.embeds(item, modality=modality)
        if modality == "video" or self.layout == "grid":
            key = f"{modality}_grid_thw"
            grid = [int(x) for x in np.asarray(item[key]).reshape(-1)]
            return f"its {key} {grid} makes prod(grid) / merge_size^2 = {n}"
        if self.layout in ("crops", "tiles"):
            count = np.asarray(item["pixel_values"]).shape[0 if self.layout == "crops" else 1]
            what = "crops" if self.layout == "crops" else "tiles"
            return f"its {count} {what} of {self.per_crop} tokens make {n}"
        if self.layout == "anyres":
            sizes = np.asarray(item["image_sizes"]).reshape(-1).tolist()
            return f"its image_sizes {sizes} make {n}"
        return f"its real patches / pooling_kernel^2 ({self.kernel}^2) make {n}"

    # -- grid (Qwen-VL) ---------------------------------------------------------------------

    def _check_grid(self, out: dict[str, Any], *, modality: str = "image") -> None:
        pixels = "pixel_values" if modality == "image" else "pixel_values_videos"
        grid_key = f"{modality}_grid_thw"
        grid = np.asarray(out[grid_key])
        if grid.shape not in ((1, 3), (3,)) or grid.dtype.kind not in "iu" or (grid <= 0).any():
            raise _bad(grid_key, f"must be 3 positive ints, got {grid.tolist()}")
        grid = grid.astype(np.int64).reshape(1, 3)
        pv = _floats(out, pixels, 2)
        rows = int(np.prod(grid))
        if pv.shape[0] != rows:
            raise _bad(pixels, f"has {pv.shape[0]} rows but {grid_key} {grid[0].tolist()} needs {rows}")  # fmt: skip
        if pv.shape[1] != self.row_width:
            raise _bad(pixels, f"rows have {pv.shape[1]} values; the model takes {self.row_width}")
        if grid[0, 1] % self.merge_size or grid[0, 2] % self.merge_size:
            raise _bad(
                grid_key, f"{grid[0].tolist()} is not a multiple of merge_size {self.merge_size}"
            )
        out[pixels], out[grid_key] = pv, grid
        if "second_per_grid_ts" in out:
            seconds = np.asarray(out["second_per_grid_ts"])
            if (
                seconds.size != 1
                or seconds.dtype.kind != "f"
                or not np.isfinite(seconds).all()
                or (seconds <= 0).any()
            ):
                raise _bad(
                    "second_per_grid_ts",
                    f"must be one finite positive float, got {seconds.dtype} {seconds.tolist()}",
                )
            out["second_per_grid_ts"] = seconds.astype(np.float32).reshape(1)

    def _embeds_grid(self, item: Mapping[str, Any], *, modality: str = "image") -> int:
        return int(np.prod(item[f"{modality}_grid_thw"])) // self.merge_size**2

    # -- crops (Gemma 3, InternVL) ----------------------------------------------------------

    def _check_crops(self, out: dict[str, Any]) -> None:
        pv = _floats(out, "pixel_values", 4)
        if pv.shape[0] < 1 or pv.shape[1:] != (3, self.side, self.side):
            raise _bad(
                "pixel_values",
                f"must be (crops, 3, {self.side}, {self.side}) with at least one crop, got "
                f"{pv.shape}",
            )
        out["pixel_values"] = pv

    def _embeds_crops(self, item: Mapping[str, Any]) -> int:
        return int(np.asarray(item["pixel_values"]).shape[0]) * self.per_crop

    # -- tiles (SmolVLM) --------------------------------------------------------------------

    def _check_tiles(self, out: dict[str, Any]) -> None:
        pv = _floats(out, "pixel_values", 5)
        s = self.side
        if pv.shape[0] != 1 or pv.shape[1] < 1 or pv.shape[2:] != (3, s, s):
            raise _bad("pixel_values", f"must be (1, tiles, 3, {s}, {s}), got {pv.shape}")
        mask = np.asarray(out["pixel_attention_mask"])
        if mask.shape != (1, pv.shape[1], s, s) or mask.dtype.kind not in "biu":
            raise _bad(
                "pixel_attention_mask",
                f"must be a bool or int array of shape (1, {pv.shape[1]}, {s}, {s}) (one "
                f"mask per tile), got {mask.dtype} {mask.shape}",
            )
        if mask.dtype.kind != "b" and not np.isin(mask, (0, 1)).all():
            raise _bad("pixel_attention_mask", "must hold 0 and 1 only")
        # the model drops a tile whose pixels are all zero (it takes it for batch padding)
        # and reads the mask per patch: either would change its count of embeddings
        empty = [i for i in range(pv.shape[1]) if not pv[0, i].any() or not mask[0, i].any()]
        if empty:
            raise _bad(
                "pixel_values",
                f"tile {empty[0]} is all padding (zero pixels or an empty mask); the model "
                "would drop it and fill fewer image tokens",
            )
        out["pixel_values"], out["pixel_attention_mask"] = pv, mask.astype(np.int64)

    def _embeds_tiles(self, item: Mapping[str, Any]) -> int:
        return int(np.asarray(item["pixel_values"]).shape[1]) * self.per_crop

    # -- anyres (LLaVA-OneVision, LLaVA-NeXT) -----------------------------------------------

    def _tiles_for(self, height: int, width: int) -> int:
        from transformers.models.llava_next.modeling_llava_next import image_size_to_num_patches

        return int(image_size_to_num_patches((height, width), self.pinpoints, self.side))

    def _check_anyres(self, out: dict[str, Any]) -> None:
        sizes = _ints(out, "image_sizes", (1, 2))
        if (sizes <= 0).any() or (sizes > 1 << 16).any():
            raise _bad("image_sizes", f"must be a height and width in 1..65536, got {sizes.tolist()}")  # fmt: skip
        pv = _floats(out, "pixel_values", 5)
        s = self.side
        tiles = self._tiles_for(int(sizes[0, 0]), int(sizes[0, 1]))
        if pv.shape != (1, tiles, 3, s, s):
            raise _bad(
                "pixel_values",
                f"must be (1, {tiles}, 3, {s}, {s}) for image_sizes {sizes[0].tolist()} (the "
                f"grid pinpoints give {tiles} tiles), got {pv.shape}",
            )
        out["pixel_values"], out["image_sizes"] = pv, sizes

    def _embeds_anyres(self, item: Mapping[str, Any]) -> int:
        height, width = (int(x) for x in np.asarray(item["image_sizes"]).reshape(2))
        processor = self.processor
        count = int(processor._get_number_of_features(height, width, self.side, self.side))
        if processor.vision_feature_select_strategy == "default":
            count -= 1  # as the processor's replace_image_token
        return count

    # -- soft tokens (Gemma 4) --------------------------------------------------------------

    def _check_soft_tokens(self, out: dict[str, Any]) -> None:
        pv = _floats(out, "pixel_values", 3)
        if pv.shape != (1, self.patches, self.row_width):
            raise _bad(
                "pixel_values", f"must be (1, {self.patches}, {self.row_width}), got {pv.shape}"
            )
        positions = _ints(out, "image_position_ids", (1, self.patches, 2))[0]
        real = (positions != -1).all(axis=-1)
        count = int(real.sum())
        k = self.kernel
        # the grid's width is one past the largest x (bounded by the count before use)
        width = int(positions[:count, 0].max()) + 1 if count else 0
        height = count // width if 0 < width <= count else 0

        def is_grid() -> bool:
            ys, xs = np.meshgrid(np.arange(height), np.arange(width), indexing="ij")
            return np.array_equal(positions[:count], np.stack([xs, ys], axis=-1).reshape(-1, 2))

        if (
            height == 0
            or not real[:count].all()
            or (positions[count:] != -1).any()
            or width % k
            or height % k
            or width * height != count
            or not is_grid()
        ):
            raise _bad(
                "image_position_ids",
                "the real patches' (x, y) must come first, as an x-major grid whose sides "
                f"are multiples of the pooling kernel {k}, and every other entry (-1, -1)",
            )
        out["pixel_values"], out["image_position_ids"] = pv, positions[None]

    def _embeds_soft_tokens(self, item: Mapping[str, Any]) -> int:
        positions = np.asarray(item["image_position_ids"])[0]
        return int((positions != -1).all(axis=-1).sum()) // self.kernel**2
