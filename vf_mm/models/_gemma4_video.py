"""Gemma 4's video processing with torch alone, as transformers 5.23 computes it.

transformers' ``Gemma4VideoProcessor`` is built on torchvision, which does not import
beside a CPU-only torch. This module computes the same model inputs and the same prompt
text as that class and ``Gemma4Processor`` do, step for step, for one clip:

1. frame sampling (``do_sample_frames``, on by default): the base video processor's
   uniform sampler (``num_frames``, 32 by default, or ``fps`` frames a second where the
   checkpoint sets no count), with its refusals of more frames than the clip has and of
   a rate and a count at once (``_video.sample_frames``, ``check_sampling``);
2. the resize: each frame to the largest size that keeps its aspect ratio, has sides that
   are multiples of ``patch_size * pooling_kernel_size`` and holds at most
   ``max_soft_tokens * pooling_kernel_size**2`` patches (transformers' own
   ``get_aspect_ratio_preserving_size``), bicubic with antialiasing on the uint8 frames
   (``_tv_ops.resize``, torchvision's kernels), skipped when the size is already that;
3. rescale and normalise fused, in float32 (``_tv_ops.rescale_and_normalize``; the
   class's mean 0 and std 1 only scale by 1/255);
4. the patches: each frame cut into ``patch_size`` squares, each square's pixels row by
   row with the channels last, then zero-padded to the budget; ``video_position_ids``
   holds each real patch's ``(x, y)`` (x-major rows) and ``(-1, -1)`` on the padding.

The model takes ``pixel_values_videos`` ``(frames, max_patches, 3 * P * P)`` float32,
``video_position_ids`` ``(frames, max_patches, 2)`` int64 and ``num_frames_per_video``
``(1,)`` int64; a batch's clips are concatenated along the frame axis. The processor's
text for a clip is, for each kept frame, its time as ``mm:ss`` (frame index over the
clip's frame rate, 24 fps where the rate is unknown, as the processor assumes), a space,
then ``<|image>`` + ``<|video|>`` once per soft token + ``<image|>``, the frames joined by
single spaces. Every soft token of a frame is a ``<|video|>`` position
(``mm_token_type_ids`` 2); the markers and the timestamps are text.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from vf_mm.errors import RenderError, UnsupportedModelError
from vf_mm.models._video import (
    ExpandedVideo,
    SampledVideo,
    VideoSettings,
    normalize_frames,
    resize_frames,
)

#: the budgets ``Gemma4VideoProcessor`` takes (it refuses any other when it loads)
SOFT_TOKEN_BUDGETS = (70, 140, 280, 560, 1120)


def check_settings(path: Path, settings: VideoSettings) -> None:
    """Refuse a checkpoint whose video settings ``Gemma4VideoProcessor`` would refuse: a
    budget it does not take, or sampling by both a rate and a count (its sampler refuses
    the pair on every clip, and a part cannot unset the checkpoint's)."""
    if settings.max_soft_tokens not in SOFT_TOKEN_BUDGETS:
        raise UnsupportedModelError(
            f"{path}: the video processor's max_soft_tokens is {settings.max_soft_tokens!r}; "
            f"Gemma 4's video processor takes one of {SOFT_TOKEN_BUDGETS}"
        )
    if settings.do_sample_frames and settings.fps is not None and settings.num_frames is not None:
        raise UnsupportedModelError(
            f"{path}: the video processor sets fps={settings.fps} and "
            f"num_frames={settings.num_frames}; Gemma 4's sampler takes one or the other, so "
            "every clip would be refused: remove one from the checkpoint's video_processor "
            "section"
        )


def check_sampling(settings: VideoSettings) -> None:
    """Refuse sampling by ``fps`` and ``num_frames`` at once, as transformers 5.23's
    sampler does: a part cannot unset the checkpoint's own count (a ``None`` option falls
    back to it), so on the released checkpoints (32 frames) no call samples by rate."""
    if settings.fps is not None and settings.num_frames is not None:
        raise RenderError(
            f"Gemma 4's video processor samples by fps or by num_frames, not both: here "
            f"fps={settings.fps} and num_frames={settings.num_frames} (the part's and the "
            "checkpoint's; transformers refuses the pair, and a part cannot unset the "
            "checkpoint's): give num_frames instead, or do_sample_frames=False to keep "
            "every frame"
        )


def frame_size(settings: VideoSettings, height: int, width: int) -> tuple[int, int]:
    """The size the processor resizes a ``height`` x ``width`` frame to (transformers'
    ``get_aspect_ratio_preserving_size``), or ``RenderError`` where it refuses one."""
    from transformers.models.gemma4.processing_gemma4 import get_aspect_ratio_preserving_size

    k = settings.pooling_kernel_size
    try:
        return get_aspect_ratio_preserving_size(
            height=height, width=width, patch_size=settings.patch_size,
            max_patches=settings.max_soft_tokens * k * k, pooling_kernel_size=k,
        )  # fmt: skip
    except ValueError as exc:
        raise RenderError(
            f"Gemma 4's video processor refuses {height}x{width} frames: {exc}"
        ) from None


def patches_of(frames: Any, patch: int) -> Any:
    """``(T, C, H, W)`` frames as ``(T, H/P * W/P, P * P * C)`` patches: rows of patches
    top to bottom, each patch's pixels row by row with the channels last."""
    t, c, h, w = frames.shape
    grid = frames.reshape(t, c, h // patch, patch, w // patch, patch)
    return grid.permute(0, 2, 4, 3, 5, 1).reshape(t, (h // patch) * (w // patch), -1)


def expand_gemma4(
    settings: VideoSettings, video: Any, sampled: SampledVideo, tokens: dict[str, str]
) -> ExpandedVideo:
    """One clip's model inputs and replacement text (the module docstring).

    Args:
        settings: The checkpoint's video settings (style ``"gemma4"``).
        video: The kept frames, ``(T, 3, H, W)`` uint8.
        sampled: Which frames of the clip were kept, and its frame rate.
        tokens: The processor's ``video_token``, ``boi_token`` and ``eoi_token``.
    """
    import torch

    p, k = settings.patch_size, settings.pooling_kernel_size
    budget = settings.max_soft_tokens * k * k
    if settings.do_resize:
        height, width = frame_size(settings, *(int(s) for s in video.shape[-2:]))
        video = resize_frames(video, height, width, settings.resample)
    rows, cols = int(video.shape[-2]) // p, int(video.shape[-1]) // p
    if video.shape[-2] % p or video.shape[-1] % p or rows * cols > budget:
        raise RenderError(
            f"with do_resize off, Gemma 4's frames must have sides that are multiples of "
            f"{p} and at most {budget} patches; these are {tuple(video.shape[-2:])}"
        )
    video = normalize_frames(video, settings)
    count = int(video.shape[0])
    patches = patches_of(video, p)
    xs, ys = torch.meshgrid(torch.arange(cols), torch.arange(rows), indexing="xy")
    positions = torch.stack((xs, ys), dim=-1).reshape(rows * cols, 2)
    positions = positions[None].repeat(count, 1, 1)
    if pad := budget - rows * cols:
        patches = torch.nn.functional.pad(patches, [0, 0, 0, pad], value=0)
        positions = torch.nn.functional.pad(positions, [0, 0, 0, pad], value=-1)
    soft = rows * cols // (k * k)
    fps = sampled.fps if sampled.fps is not None else 24  # as the processor assumes
    frame = tokens["boi_token"] + tokens["video_token"] * soft + tokens["eoi_token"]
    stamps = [f"{int(i / fps // 60):02d}:{int(i / fps % 60):02d}" for i in sampled.indices]
    item = {
        "pixel_values_videos": patches.numpy(),
        "video_position_ids": positions.numpy(),
        "num_frames_per_video": np.array([count], dtype=np.int64),
    }
    return ExpandedVideo(" ".join(f"{s} {frame}" for s in stamps), item, sampled)
