"""InternVL's video inputs and text, computed as transformers 5.23 computes them.

``InternVLVideoProcessor`` needs torchvision (it is a ``BaseVideoProcessor``); this
module computes the same numbers with torch alone, through the ops the image ports and
the other video families share (``_tv_ops`` via ``_video.resize_frames``):

1. sampling, only when asked (``do_sample_frames``, which ``fps`` or ``num_frames`` turn
   on): ``num_frames`` frames, or ``int(T / clip_fps * fps)`` of them, taken at
   ``torch.arange(shift, T, T / n).int()`` with ``shift`` half a step when
   ``initial_shift`` is True (the middle of each stretch), else the number given;
2. every frame resized to the processor's ``size`` (height and width: the vision tower's
   tile, 448 in the released checkpoints), bicubic by default;
3. rescale and normalise fused, in float32, with the checkpoint's mean and std.

The model takes a clip's frames as image tiles: ``InternVLProcessor`` moves
``pixel_values_videos`` ``(1, T, 3, S, S)`` into ``pixel_values`` as ``T`` tiles, in the
order the prompt's images and clips appear, and its text for a clip's ``<video>`` is one
line per frame, ``Frame{i}: <img>`` + ``<IMG_CONTEXT>`` * ``image_seq_length`` +
``</img>``, joined by newlines. So an item here is ``{"pixel_values": (T, 3, S, S)}``,
the image's own input (``VisionFamily.frames_as_images``).

What transformers does not do, or fails on deep inside, is refused by name
(``RenderError`` at render time, ``UnsupportedModelError`` for a checkpoint's settings): a
size other than a height and width, a centre crop, sampling without a rate or a count, a
rate that leaves no frame, more frames than the clip holds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vf_mm.errors import RenderError, UnsupportedModelError
from vf_mm.models._video import (
    ExpandedVideo,
    SampledVideo,
    VideoSettings,
    clip_rate,
    normalize_frames,
    resize_frames,
    too_many_frames,
)

__all__ = ["expand_internvl", "internvl_settings", "sample_internvl"]


def internvl_settings(path: Path, saved: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
    """The InternVL-only settings of a checkpoint's saved video config (``saved``: the
    file ``AutoVideoProcessor`` reads, the image processor's when there is no video one):
    the frame size, the tokens per frame (the processor's ``image_seq_length``), and the
    refusals of what the port does not compute.

    Args:
        path: The checkpoint directory (for errors).
        saved: The saved video processor settings.
        options: The processor's own options (``processor_config.json``).
    """
    out: dict[str, Any] = {"min_pixels": 0, "max_pixels": 0, "frames_as_images": True}
    size = saved.get("size")
    if size is not None:
        given = {k for k, v in size.items() if v} if isinstance(size, dict) else set()
        if given != {"height", "width"}:
            raise UnsupportedModelError(
                f"{path}: the InternVL video size {size!r} is not a height and a width; vf_mm "
                "resizes InternVL frames to a fixed height and width only (what the released "
                "checkpoints set)"
            )
        out["size"] = (int(size["height"]), int(size["width"]))
    if saved.get("do_center_crop"):
        raise UnsupportedModelError(
            f"{path}: the InternVL video processor's do_center_crop is set; vf_mm does not "
            "crop InternVL frames (the released checkpoints do not): unset it"
        )
    tokens = options.get("image_seq_length", 256)
    if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 1:
        raise UnsupportedModelError(
            f"{path}: processor_config.json's image_seq_length is {tokens!r}, not a positive int"
        )
    out["tokens_per_frame"] = tokens
    shift = saved.get("initial_shift", True)
    if not isinstance(shift, (bool, int, float)):
        raise UnsupportedModelError(
            f"{path}: the InternVL video processor's initial_shift is {shift!r}, not a bool "
            "or a number"
        )
    out["initial_shift"] = shift
    return out


def sample_internvl(settings: VideoSettings, total: int, fps: float | None) -> tuple[int, ...]:
    """The frames ``InternVLVideoProcessor.sample_frames`` keeps from a clip of ``total``
    frames at ``fps`` (None: unknown)."""
    import torch

    num = settings.num_frames
    if num is None and settings.fps is not None:
        num = int(total / clip_rate(settings, fps) * settings.fps)
    if num is None:  # transformers fails here (a TypeError inside its sampler)
        raise RenderError(
            "InternVL's video processor samples by fps or num_frames only: give one, or "
            "do_sample_frames=False to keep every frame"
        )
    if num <= 0:  # transformers divides by it
        raise RenderError(
            f"sampling a {total}-frame clip at {settings.fps} fps keeps no frame (the clip "
            f"lasts {total / fps if fps else 0:.3g} s): ask for a higher fps or for num_frames"
        )
    if num > total:
        raise too_many_frames(settings, num, total, fps)
    shift: Any = settings.initial_shift
    if shift is True:
        shift = total / num / 2
    return tuple(torch.arange(shift, total, total / num).int().tolist())


def expand_internvl(
    settings: VideoSettings, video: Any, sampled: SampledVideo, tokens: dict[str, str]
) -> ExpandedVideo:
    """A clip's ``pixel_values`` ``(T, 3, H, W)`` and its processor text.

    Args:
        settings: The checkpoint's video settings (style ``"internvl"``).
        video: The kept frames, a ``(T, 3, H, W)`` uint8 tensor.
        sampled: Which frames were kept.
        tokens: The processor's ``start_image_token``, ``image_token`` and
            ``end_image_token``.
    """

    if settings.do_resize and settings.size is not None:
        video = resize_frames(video, *settings.size, settings.resample)
    video = normalize_frames(video, settings)
    frame = (
        tokens["start_image_token"]
        + tokens["image_token"] * settings.tokens_per_frame
        + tokens["end_image_token"]
    )
    text = "\n".join(f"Frame{i + 1}: {frame}" for i in range(int(video.shape[0])))
    return ExpandedVideo(text, {"pixel_values": video.numpy()}, sampled)
