"""GLM-4.6V's clips, computed as transformers 5.23's ``Glm46VVideoProcessor`` and
``Glm46VProcessor`` compute them.

``Glm46VVideoProcessor`` needs torchvision (it is a ``BaseVideoProcessor``); this module
computes the same numbers with torch alone:

1. sampling, on unless ``do_sample_frames`` is False: the processor picks its own rate
   from the clip's duration (the frame count over the clip's rate, as transformers' video
   loaders report it): 3 temporal pairs a second up to 30 s, 1 up to 300 s, 0.5 beyond,
   at most 640 frames, the whole of a short clip stretched with ``linspace``, repeated
   frames dropped and the last one repeated to an even count. It reads neither ``fps`` nor
   ``num_frames``, so both are refused by name (they would change nothing);
2. one size for all kept frames, GLM's ``smart_resize`` over the frame count (transformers'
   own function, from the PIL image processor's module, which is the video module's
   too), bicubic;
3. rescale and normalise fused, the temporal padding and the patch layout: Qwen-VL's
   (``_video``).

Text: per temporal group (two frames), ``<|begin_of_image|>`` + ``<|image|>`` per merged
patch + ``<|end_of_image|>`` + ``"{t:.1f} seconds"``, ``t`` the time of the group's first
frame (its index over the clip's rate; 24 fps when the rate is unknown, as the processor
takes it). The chat template writes ``<|begin_of_video|>``/``<|end_of_video|>`` around the
clip's ``<|video|>``, so a clip's frames hold the image's token: ``Glm46VProcessor`` marks
them 2 in ``mm_token_type_ids`` by those markers, and the model fills the video features
in at the image token's positions (``VisionFamily.video_image_token``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from vf_mm.errors import RenderError
from vf_mm.models._video import (
    ExpandedVideo,
    SampledVideo,
    VideoSettings,
    normalize_frames,
    patchify_frames,
    resize_frames,
)

__all__ = ["expand_glm46v", "glm46v_size", "refuse_rate_options", "sample_glm46v"]

# the processor's rate by duration: (longest duration in seconds, temporal pairs a second)
_RATES = ((30, 3.0), (300, 1.0), (2400, 0.5))
_MOST_FRAMES = 640
_LONGEST = 2400  # seconds: a longer clip is sampled as if it were this long
_UNKNOWN_RATE = 24.0  # what the processor writes timestamps with when the rate is unknown
_BEGIN, _END = "<|begin_of_image|>", "<|end_of_image|>"  # Glm46VProcessor's frame markers


def refuse_rate_options(asked: set[str]) -> None:
    """GLM-4.6V's sampler picks its rate by the clip's duration: a part's ``fps`` or
    ``num_frames`` would change nothing (``Glm46VVideoProcessor.sample_frames`` reads
    neither), so asking for one is refused by name."""
    named = sorted(asked & {"fps", "num_frames"})
    if named:
        raise RenderError(
            f"GLM-4.6V's video processor samples each clip at a rate it picks by the clip's "
            f"duration and reads no {' or '.join(named)}: drop {' and '.join(named)} (or "
            "set do_sample_frames=False to keep every frame, after sampling the clip yourself)"
        )


def sample_glm46v(settings: VideoSettings, total: int, fps: float | None) -> tuple[int, ...]:
    """The frames ``Glm46VVideoProcessor.sample_frames`` keeps from a clip of ``total``
    frames at ``fps`` (needed: the rate is picked by the clip's duration)."""
    if fps is None:
        raise RenderError(
            "GLM-4.6V's video processor samples a clip by its duration, which needs the "
            "clip's frame rate: give the video part a frame_rate, or do_sample_frames=False "
            "to keep every frame"
        )
    duration = min(total / fps, _LONGEST)
    rate = next(r for longest, r in _RATES if duration <= longest)
    wanted = min(int(duration * rate * settings.temporal_patch_size), _MOST_FRAMES)
    if total < wanted:
        picked = _spread(0, total - 1, wanted)
    else:
        picked = []
        step = 1 / (settings.temporal_patch_size * rate)
        next_time, end = 0.0, int(total / fps)
        for index in range(total):
            if index * (1 / fps) >= next_time:  # the processor's own arithmetic
                next_time += step
                picked.append(index)
                if next_time >= end:
                    break
    if len(picked) < wanted:
        picked = _spread(picked[0], picked[-1], wanted) if picked else _spread(0, total - 1, wanted)
    elif len(picked) > wanted:
        picked = _spread(0, total - 1, wanted)
    kept = list(dict.fromkeys(picked))  # first occurrences, in order
    if not kept:  # transformers goes on with no frame and fails deep in its resize
        raise RenderError(
            f"GLM-4.6V's video processor keeps no frame of a {total}-frame clip at {fps} fps "
            f"({total / fps:.3f} s: it samples {rate} pairs of frames a second): give a longer "
            "clip, or do_sample_frames=False to keep every frame"
        )
    if len(kept) % 2:
        kept.append(kept[-1])
    return tuple(kept)


def _spread(start: int, end: int, count: int) -> list[int]:
    return [int(i) for i in np.linspace(start, end, count, dtype=int)]


def glm46v_size(
    settings: VideoSettings, num_frames: int, height: int, width: int
) -> tuple[int, int]:
    """The size every kept frame is resized to: GLM's ``smart_resize`` over the clip."""
    from transformers.models.glm46v.image_processing_pil_glm46v import smart_resize

    try:
        return smart_resize(
            num_frames, height, width, temporal_factor=settings.temporal_patch_size,
            factor=settings.patch_size * settings.merge_size, min_pixels=settings.min_pixels,
            max_pixels=settings.max_pixels,
        )  # fmt: skip
    except ValueError as exc:  # fewer frames than a temporal patch, an aspect over 200
        raise RenderError(
            f"GLM-4.6V's video processor refuses this clip ({num_frames} frames of "
            f"{height}x{width} after sampling): {exc}"
        ) from None


def expand_glm46v(
    settings: VideoSettings, video: Any, sampled: SampledVideo, tokens: dict[str, str]
) -> ExpandedVideo:
    """A clip's ``pixel_values_videos`` and ``video_grid_thw`` and the text replacing its
    ``<|video|>``.

    Args:
        settings: The checkpoint's video settings.
        video: The kept frames, ``(T, 3, H, W)`` uint8.
        sampled: Which frames were kept, and the clip's rate.
        tokens: The processor's ``image_token`` (the frame markers are the processor's own
            literals, ``<|begin_of_image|>`` and ``<|end_of_image|>``).
    """
    if settings.do_resize:
        height, width = glm46v_size(settings, int(video.shape[0]), *map(int, video.shape[-2:]))
        video = resize_frames(video, height, width, settings.resample)
    pixels, gt, gh, gw = patchify_frames(normalize_frames(video, settings), settings)
    per_group = gh * gw // settings.merge_size**2
    rate = sampled.fps if sampled.fps is not None else _UNKNOWN_RATE
    # every second frame's time, whatever the temporal patch (the processor's own step)
    times = [index / rate for index in sampled.indices][::2]
    times += [times[-1]] * (gt - len(times))  # as the processor pads a short list
    frame = _BEGIN + tokens["image_token"] * per_group + _END
    replacement = "".join(f"{frame}{t:.1f} seconds" for t in times[:gt])
    item = {
        "pixel_values_videos": pixels.numpy(),
        "video_grid_thw": np.array([[gt, gh, gw]], dtype=np.int64),
    }
    return ExpandedVideo(replacement, item, sampled)
