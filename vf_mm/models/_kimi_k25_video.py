"""Kimi-K2.5's video processing with torch alone, as transformers 5.23 computes it.

transformers' ``Kimi_K25VideoProcessor`` is built on torchvision, which does not import
beside a CPU-only torch. This module computes the same model inputs and the same prompt
text as that class and ``Kimi_K25Processor`` do, step for step, for one clip:

1. frame sampling (``do_sample_frames``, on by default): the base video processor's
   uniform sampler, ``fps`` frames a second (2 by default: the clip's frame rate is
   needed) or ``num_frames`` (``_video.sample_frames``);
2. the kept frames cut into chunks of ``temporal_patch_size`` (4) frames, the last one
   shorter where the count is not a multiple; every chunk's frames are resized as one of
   the clip's images would be (``_kimi_k25_images.navit_size``: scaled down, never up,
   to ``max_patches`` patches and ``size["max_height"]`` patches a side, antialiased
   bicubic on the uint8 frames, ``_tv_ops.resize``), zero-padded on the bottom and right
   to a multiple of ``merge_size * patch_size``, rescaled and normalised fused in float32;
3. each chunk's frames cut into ``(C, P, P)`` squares, frame by frame, row by row.

The model takes ``pixel_values_videos`` ``(patches, 3, P, P)`` float32 (every chunk's in
turn) and ``video_grid_thw`` ``(chunks, 3)`` int64, one ``(frames, rows, columns)`` row a
chunk: MoonViT pools a chunk's frames into one frame's tokens. The processor's text for
a clip is, per chunk, the time of its first frame as ``HH:MM:SS.mmm`` (frame index over
the clip's frame rate, 24 fps where the rate is unknown, as the processor assumes) then
``<|media_begin|>video<|media_content|>`` + the video token once per merged patch of one
frame + ``<|media_end|>``; it replaces the one placeholder the chat template writes.

transformers 5.23's Kimi-K2.5 forward cannot take a chunk of more than one frame (its
``get_image_features`` splits MoonViT's pooled output by ``frames * rows * columns /
merge**2`` tokens a chunk, and its temporal merge index cannot join chunks of different
lengths): every forward vf_mm runs takes such a clip's features from
``vf_mm.models.forward_inputs``, which runs the model's own tower and projector per chunk
length, so clips keep as many frames as the processor samples.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from vf_mm.errors import RenderError, UnsupportedModelError
from vf_mm.models._video import ExpandedVideo, SampledVideo, VideoSettings, normalize_frames

#: the unknown frame rate the processor's text assumes
_UNKNOWN_FPS = 24


def kimi_size(path: Path, size: Any, default: tuple[int, int] | None) -> tuple[int, int] | None:
    """The checkpoint's ``size`` as ``(max_height, max_width)`` patches a side, refused
    unless the two are one number, as ``Kimi_K25VideoProcessor`` refuses it."""
    if size is None:
        return default
    if (
        not isinstance(size, dict)
        or not isinstance(size.get("max_height"), int)
        or size.get("max_height") != size.get("max_width")
    ):
        raise UnsupportedModelError(
            f"{path}: the video processor's size is {size!r}; Kimi-K2.5's video processor "
            "takes {'max_height': N, 'max_width': N} with one N"
        )
    return (size["max_height"], size["max_width"])


def check_sampling(settings: VideoSettings) -> None:
    """Refuse sampling by ``fps`` and ``num_frames`` at once, as transformers 5.23's
    sampler does: the processor passes the checkpoint's rate (2 fps, the class default)
    beside a part's count, so a count is refused wherever the checkpoint sets a rate."""
    if settings.fps is not None and settings.num_frames is not None:
        raise RenderError(
            f"Kimi-K2.5's video processor samples by fps or by num_frames, not both: here "
            f"fps={settings.fps} and num_frames={settings.num_frames} (the part's and the "
            "checkpoint's; transformers refuses the pair, and a part cannot unset the "
            "checkpoint's): give fps instead, or do_sample_frames=False to keep every frame"
        )


def stamp(seconds: float) -> str:
    """A chunk's time as the processor writes it: ``HH:MM:SS`` of the whole seconds (the
    hours wrap at a day, as ``gmtime`` does) and the milliseconds truncated."""
    whole = time.strftime("%H:%M:%S", time.gmtime(seconds))
    return f"{whole}.{int(seconds % 1 * 1000):03d}"


def expand_kimi_k25(
    settings: VideoSettings, video: Any, sampled: SampledVideo, tokens: dict[str, str]
) -> ExpandedVideo:
    """One clip's model inputs and replacement text (the module docstring).

    Args:
        settings: The checkpoint's video settings (style ``"kimi"``).
        video: The kept frames, ``(T, 3, H, W)`` uint8.
        sampled: Which frames of the clip were kept, and its frame rate.
        tokens: The processor's ``video_token``.
    """
    from vf_mm.models._kimi_k25_images import navit_size
    from vf_mm.models._tv_ops import interpolation_mode, pad, resize

    p, m, tps = settings.patch_size, settings.merge_size, settings.temporal_patch_size
    if settings.do_resize:
        assert settings.size is not None  # load_video_settings sets Kimi's
        (h, w), (ph, pw) = navit_size(
            *(int(s) for s in video.shape[-2:]), patch_size=p, merge_size=m,
            max_patches=settings.max_patches, max_side=settings.size[0],
        )  # fmt: skip
        video = pad(resize(video, h, w, mode=interpolation_mode(settings.resample)), ph, pw)
    height, width = (int(s) for s in video.shape[-2:])
    if height % (p * m) or width % (p * m):  # the processor's patches would not tile them
        raise RenderError(
            f"with do_resize off, Kimi-K2.5's frames must have sides that are multiples of "
            f"merge_size * patch_size ({p * m}); these are {height}x{width}: leave "
            "do_resize on"
        )
    video = normalize_frames(video, settings)
    count, channels = int(video.shape[0]), int(video.shape[1])
    rows, cols = height // p, width // p
    squares = video.reshape(count, channels, rows, p, cols, p).permute(0, 2, 4, 1, 3, 5)
    pixels = squares.reshape(count * rows * cols, channels, p, p)
    starts = range(0, count, tps)
    grid = [[min(tps, count - s), rows, cols] for s in starts]
    fps = sampled.fps if sampled.fps is not None else _UNKNOWN_FPS
    per_chunk = tokens["video_token"] * (rows * cols // (m * m))
    text = "".join(
        f"{stamp(sampled.indices[s] / fps)}<|media_begin|>video<|media_content|>"
        f"{per_chunk}<|media_end|>"
        for s in starts
    )
    item = {
        "pixel_values_videos": pixels.numpy(),
        "video_grid_thw": np.array(grid, dtype=np.int64),
    }
    return ExpandedVideo(text, item, sampled)
