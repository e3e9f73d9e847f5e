"""``model_inputs``: a batch's images and token ids -> what the family's forward takes.

The renderer keeps each image's model inputs as its processor returned them for a
batch of one (``expand_image``); a forward takes the images of a whole batch at once,
in the order their tokens appear (row by row). Per family:

- Qwen-VL, Qwen3.5: ``pixel_values`` rows and ``image_grid_thw`` rows concatenated, and
  ``mm_token_type_ids`` (1 on image tokens; M-RoPE positions need it);
- Gemma 3: ``pixel_values`` images concatenated, and ``token_type_ids`` (1 on image soft
  tokens; it switches on the bidirectional attention over each image that the model was
  trained with: without it the logits differ);
- SmolVLM: ``pixel_values`` ``(1, tiles, 3, S, S)`` and ``pixel_attention_mask``
  ``(1, tiles, S, S)`` with every image's tiles along axis 1 (the model flattens the
  first two axes and takes the tiles in order; no token types);
- LLaVA-OneVision: ``pixel_values`` ``(images, tiles, 3, S, S)`` with each image's tiles
  zero-padded to the batch's largest image (the model cuts each back by its
  ``image_sizes``), ``image_sizes`` ``(images, 2)``, and ``batch_num_images`` all 1:
  every image in single-image (anyres) mode, as vLLM computes them.

GLM-4.6V's clips go in as images, one per temporal group, in token order (``order``):
its forward computes a clip exactly so, and fills images and clips at one token's
positions, so it cannot take both as separate inputs; every embedding position is then 1.

Videos (the Qwen-VL families, Kimi-K2.5) go beside the images: ``pixel_values_videos`` rows
and ``video_grid_thw`` rows concatenated (and Qwen2.5-VL's ``second_per_grid_ts``), with 2
in ``mm_token_type_ids`` on video tokens (Qwen-VL; Kimi-K2.5 has no token types, and its
rows are MoonViT's ``(3, 14, 14)`` patches, one grid row per chunk of frames). LLaVA-OneVision's clips are ``pixel_values_videos``
``(clips, T, 3, H, W)``. Gemma 4's clips concatenate along the frame axis:
``pixel_values_videos`` and ``video_position_ids`` ``(frames, patches, ...)`` and
``num_frames_per_video`` ``(clips,)``, which splits them back. SmolVLM takes a clip's frames as images: its ``(1, T, 3, S, S)``
frames join the images' tiles along axis 1, in the order the items' tokens appear
(``order``), since the model fills its image tokens from one sequence.

The family's embedding token ids (``image_token_ids``, ``video_token_ids``) mark the
image and video positions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from vf_mm.models._families import family_info


def model_inputs(
    family: str,
    input_ids: Any,
    images: Sequence[Mapping[str, Any]],
    *,
    image_token_ids: Sequence[int],
    dtype: Any = None,
    videos: Sequence[Mapping[str, Any]] = (),
    video_token_ids: Sequence[int] = (),
    order: Sequence[str] = (),
) -> dict[str, Any]:
    """The forward's image, video and token-type inputs for ``input_ids``.

    Text-only batches get no image or video inputs.

    Args:
        family: A ``model_type``.
        input_ids: A ``(B, L)`` tensor.
        images: The images' inputs in token order, one item each, as ``expand_image``
            returns them.
        image_token_ids: The ids that take image embeddings.
        dtype: Casts the floating-point inputs (the model's own dtype).
        videos: The videos' inputs in token order, as ``expand_video`` returns them.
        video_token_ids: The ids that take video embeddings.
        order: The modality of every item (``"image"`` / ``"video"``) in token order over
            the whole batch, needed where a forward takes clips and images in one sequence
            (SmolVLM) and the batch holds both.
    """
    import torch

    info = family_info(family)
    if videos and not info.video_inputs:
        raise ValueError(f"a {info.label} forward takes no video")
    if info.frames_as_images and videos:
        images = _interleave(images, videos, order, info.label)
        videos = ()
    if info.video_image_token and videos:
        # a clip as the forward computes it: each temporal group one image (its grid's own
        # rows, the tower and M-RoPE the same), so images and clips share one sequence
        images = _interleave(images, [_groups_as_images(v) for v in videos], order, info.label)
        videos = ()
    out: dict[str, Any] = {}
    if info.token_types is not None:
        marks = torch.zeros_like(input_ids, dtype=torch.long)
        for token in image_token_ids:
            marks |= (input_ids == token).long()
        for token in video_token_ids if videos else ():  # clips taken as images stay 1
            marks[input_ids == token] = 2
        out[info.token_types] = marks
    for kind, items, expected in (
        ("image", images, info.image_inputs),
        ("video", videos, info.video_inputs),
    ):
        if not items:
            continue
        for item in items:
            if set(item) != set(expected):
                raise ValueError(
                    f"{'an' if kind == 'image' else 'a'} {kind}'s inputs are {sorted(item)}, but "
                    f"a {info.label} forward takes {sorted(expected)}: these {kind}s were made "
                    "by another family's processor"
                )
        axis = info.image_axis if kind == "image" else 0
        for name in expected:
            arrays = [_array(item, name) for item in items]
            if info.pad_axis is not None and kind == "image":
                arrays = _pad(arrays, info.pad_axis)
            tensor = torch.from_numpy(np.concatenate(arrays, axis=axis))
            if tensor.is_floating_point() and dtype is not None and name != "second_per_grid_ts":
                tensor = tensor.to(dtype)
            out[name] = tensor
    return out


def _interleave(
    images: Sequence[Mapping[str, Any]],
    videos: Sequence[Mapping[str, Any]],
    order: Sequence[str],
    label: str,
) -> list[Mapping[str, Any]]:
    """Images and clips as one sequence, in token order."""
    if not images:
        return list(videos)
    if sorted(order) != sorted(["image"] * len(images) + ["video"] * len(videos)):
        raise ValueError(
            f"a {label} forward takes images and clips in one sequence: give order= (each "
            f"item's modality in token order) for {len(images)} images and {len(videos)} "
            f"videos, not {list(order)}"
        )
    queues = {"image": iter(images), "video": iter(videos)}
    return [next(queues[m]) for m in order]


def _groups_as_images(video: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """GLM-4.6V's clip as images, one per temporal group: its ``get_video_features`` runs
    the tower on grids ``(1, h, w)`` per group and ``get_rope_index`` splits the clip's
    grid the same way, so the group's rows with grid ``(1, h, w)`` are what an image of
    them computes, bit for bit; the model fills both at the image token's positions."""
    if set(video) != {"pixel_values_videos", "video_grid_thw"}:
        raise ValueError(
            f"a clip's inputs are {sorted(video)}, but a GLM-4.6V forward takes "
            "['pixel_values_videos', 'video_grid_thw']: this clip was made by another "
            "family's processor"
        )
    rows = np.asarray(video["pixel_values_videos"])
    grids = np.asarray(video["video_grid_thw"]).reshape(-1, 3).astype(np.int64)
    per_frame = np.repeat(grids, grids[:, 0], axis=0)
    per_frame[:, 0] = 1
    return {"pixel_values": rows, "image_grid_thw": per_frame}


def _array(image: Mapping[str, Any], name: str) -> np.ndarray:
    if name not in image:
        raise KeyError(f"an image lacks {name!r}, which the batch's other images have")
    value = np.asarray(image[name])
    if name in ("image_grid_thw", "video_grid_thw"):
        value = value.reshape(-1, 3).astype(np.int64, copy=False)
    elif name == "second_per_grid_ts":
        value = value.reshape(-1)
    return value


def _pad(arrays: list[np.ndarray], axis: int) -> list[np.ndarray]:
    """Zero-pad every array along ``axis`` to the longest (arrays without that axis, or
    all of one length, are returned as they are)."""
    if any(a.ndim <= axis for a in arrays):
        return arrays
    longest = max(a.shape[axis] for a in arrays)
    out = []
    for a in arrays:
        if a.shape[axis] < longest:
            widths = [(0, 0)] * a.ndim
            widths[axis] = (0, longest - a.shape[axis])
            a = np.pad(a, widths)
        out.append(a)
    return out
