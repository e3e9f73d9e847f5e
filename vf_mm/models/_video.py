"""Video model inputs, computed as transformers' video processors compute them.

transformers' video processors (``Qwen2VLVideoProcessor``, ``Qwen3VLVideoProcessor``) are
built on torchvision, which cannot be imported beside a CPU-only torch. This module
computes the same tensors with torch alone, step for step:

1. frame sampling, when the processor samples (``do_sample_frames``): Qwen2-VL's uniform
   ``arange`` of ``num_frames`` or ``fps`` frames, Qwen3-VL's ``linspace`` at 2 fps by
   default, with the same clamps and the same fallbacks (Qwen3-VL takes an unknown frame
   rate as 24 fps);
2. the resize: the family's ``smart_resize`` (transformers' own function) picks the size,
   and ``torch.nn.functional.interpolate`` with antialiasing does what
   ``torchvision.transforms.v2.functional.resize`` does on a uint8 tensor (bicubic, and
   bilinear on AVX2/AVX512/ARM CPUs, interpolate the uint8 frames directly; anything else
   goes through float32 and is rounded back);
3. rescale and normalize fused, in float32, as transformers' torchvision backend fuses
   them (``(x - mean / s) / (std / s)`` with ``s`` the rescale factor);
4. the temporal padding (the last frame repeated up to a multiple of
   ``temporal_patch_size``) and the patch layout of the family's ``patchify``.

The vLLM tier checks every step against transformers' own video processors, bit for bit,
where torchvision imports (``tests/vllm/test_video_processing.py``). The settings are
read from the checkpoint the way ``AutoVideoProcessor`` reads them: the
``video_processor`` entry of ``processor_config.json``, else
``video_preprocessor_config.json``, else the image processor's
``preprocessor_config.json``, over the video processor class's defaults.

The text that replaces a video's placeholder: ``<|video_pad|>`` once per merged patch
(Qwen2-VL, Qwen2.5-VL), or, per temporal group, ``<{t:.1f} seconds>`` then
``<|vision_start|>`` + pads + ``<|vision_end|>`` (Qwen3-VL, Qwen3.5: ``t`` the mean
timestamp of the group's first and last frame).

LLaVA-OneVision (``LlavaOnevisionVideoProcessor``) is simpler: frames sampled by the
base processor's uniform sampler when asked, each resized to one size, normalised, and
kept as ``(1, T, 3, H, W)``; its text is ``<video>`` once per pooled token of every frame
plus one (the newline the model appends).

Gemma 4 (``Gemma4VideoProcessor``) is ported in ``_gemma4_video``: frames sampled by the
base processor's uniform sampler (32 by default), each resized to keep its aspect within a
soft-token budget, cut into patches padded to the budget, with each patch's position; its
text is, per frame, the frame's ``mm:ss`` then ``<|image>`` + ``<|video|>`` * N +
``<image|>``.

SmolVLM2 (``SmolVLMVideoProcessor``) takes a clip as a run of images: frames sampled
between one second after the start and one before the end (when the clip is long
enough), each resized with Lanczos twice (longest edge to the video size, then to the
square ``max_image_size``: torch's ``interpolate`` has the same ``lanczos`` kernel that
torchvision calls), normalised, and given to the model as ``pixel_values`` ``(1, T, 3, S,
S)`` with a ``pixel_attention_mask``, the images' own inputs. Its text names the frame
count in words and the clip's duration, then each frame's ``mm:ss`` timestamp before the
frame's image tokens (``<fake_token_around_image><global-img>`` + ``<image>`` * N +
``<fake_token_around_image>``). Its processor renders any conversation that holds a clip
with another chat template (``chat_template`` in the settings), and samples whenever the
checkpoint sets a rate or a frame count, as its ``apply_chat_template`` does.

Kimi-K2.5 (``Kimi_K25VideoProcessor``) is ported in ``_kimi_k25_video``: frames sampled by
the base processor's uniform sampler (2 fps by default), cut into chunks of 4 frames, each
frame resized and padded as the family's images are, cut into MoonViT's patches; its text
is, per chunk, the chunk's ``HH:MM:SS.mmm`` then ``<|media_begin|>video<|media_content|>``
+ one frame's video tokens + ``<|media_end|>``.

InternVL (``InternVLVideoProcessor``) has a module of its own, ``_internvl_video``: its
frames are resized to the vision tower's tile and taken by the model as image tiles, one
``Frame{i}: <img>...</img>`` line each.

GLM-4.6V (``Glm46VVideoProcessor``) is ported in ``_glm46v_video``: frames sampled at a
rate the processor picks by the clip's duration, Qwen-VL's patches, and per temporal group
``<|begin_of_image|>`` + ``<|image|>`` * N + ``<|end_of_image|>`` + the group's time.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vf_mm.errors import RenderError, UnsupportedModelError
from vf_mm.types import VIDEO_OPTIONS, video_options

_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
_HALF = (0.5, 0.5, 0.5)
_BICUBIC, _BILINEAR, _LANCZOS = 3, 2, 1  # PIL resample codes, as the configs store them


@dataclass(frozen=True, slots=True)
class VideoSettings:
    """A checkpoint's video processing: its video processor's settings after loading.

    ``style`` is the video processor class the checkpoint's files select: ``"qwen2"``
    (``Qwen2VLVideoProcessor``: samples only when asked, a 2-D ``smart_resize``) or
    ``"qwen3"`` (``Qwen3VLVideoProcessor``: 2 fps by default, a resize budget over all
    frames). ``timestamps`` comes from the processor (Qwen3-VL, Qwen3.5 write each
    temporal group's time in the text, whichever video processor the files select).
    ``second_per_grid_ts``: the model takes the seconds each temporal patch spans
    (Qwen2.5-VL's M-RoPE).
    """

    style: str
    patch_size: int
    temporal_patch_size: int
    merge_size: int
    min_pixels: int
    max_pixels: int
    image_mean: tuple[float, ...]
    image_std: tuple[float, ...]
    rescale_factor: float = 1 / 255
    do_resize: bool = True
    do_rescale: bool = True
    do_normalize: bool = True
    resample: int = _BICUBIC
    do_sample_frames: bool = False
    fps: float | None = None
    num_frames: int | None = None
    min_frames: int = 4
    max_frames: int = 768
    second_per_grid_ts: bool = False
    timestamps: bool = False
    size: tuple[int, int] | None = None  # LLaVA-OneVision, SmolVLM: every frame resized to (H, W)
    tokens_per_frame: int = 0  # LLaVA-OneVision: pooled tokens per frame; SmolVLM: per frame
    longest_edge: int = 0  # SmolVLM: the first resize's longest edge
    # SmolVLM: the model takes a clip's frames as images (its pixel_values beside the
    # images', its embedding positions the image token), and the processor renders a
    # conversation holding a clip with this chat template
    frames_as_images: bool = False
    chat_template: str | None = None
    # Gemma 4: the most soft tokens a frame may take, and the k x k patches pooled into one
    max_soft_tokens: int = 0
    pooling_kernel_size: int = 0
    # Kimi-K2.5: the patch budget of a frame (its side's budget is ``size[0]`` patches)
    max_patches: int = 0
    # InternVL: where sampling starts (True: half a step in, the middle of each stretch)
    initial_shift: bool | float = True

    def with_options(self, options: dict[str, Any] | None) -> VideoSettings:
        """These settings with call options applied (``fps``, ``num_frames``,
        ``min_pixels``, ``max_pixels``, ``do_sample_frames``); unknown options are refused
        by name, since a misspelt one would silently change nothing."""
        if not options:
            return self
        unknown = sorted(set(options) - set(VIDEO_OPTIONS))
        if unknown:
            raise RenderError(
                f"unknown video option(s) {unknown}: the video processor takes "
                f"{', '.join(VIDEO_OPTIONS)}"
            )
        try:
            changes: dict[str, Any] = video_options(options)
        except ValueError as exc:
            raise RenderError(str(exc)) from None
        asked = [k for k in ("fps", "num_frames") if changes.get(k) is not None]
        if asked and changes.get("do_sample_frames") is False:
            raise RenderError(
                f"do_sample_frames=False keeps every frame, so {' and '.join(asked)} would "
                f"change nothing (transformers ignores {'them' if len(asked) > 1 else 'it'} "
                "then): drop do_sample_frames to sample, or drop "
                f"{' and '.join(asked)} to keep every frame"
            )
        if self.style in _FIXED_SIZE and ({"min_pixels", "max_pixels"} & set(changes)):
            name = _FIXED_SIZE[self.style]
            raise RenderError(
                f"{name} resizes every frame to its processor's size: min_pixels and "
                "max_pixels do not apply"
            )
        if self.style == "gemma4" and ({"min_pixels", "max_pixels"} & set(changes)):
            raise RenderError(
                "Gemma 4 sizes every frame by its soft-token budget (the checkpoint's "
                f"max_soft_tokens, {self.max_soft_tokens}): min_pixels and max_pixels do not "
                "apply; use num_frames to choose the frames"
            )
        if self.style == "kimi" and ({"min_pixels", "max_pixels"} & set(changes)):
            raise RenderError(
                "Kimi-K2.5 sizes every frame by its patch budget (the checkpoint's max_patches, "
                f"{self.max_patches}, and {self.size[0] if self.size else 0} patches a side): "
                "min_pixels and max_pixels do not apply"
            )
        if (
            self.style == "internvl"
            and self.num_frames is not None
            and "fps" in changes
            and ("num_frames" not in changes)
        ):  # its sampler reads num_frames first: the rate asked for would change nothing
            raise RenderError(
                f"InternVL's video processor samples the checkpoint's num_frames "
                f"({self.num_frames}) whatever fps says: give num_frames instead of fps"
            )
        if self.style == "glm46v":
            from vf_mm.models._glm46v_video import refuse_rate_options

            refuse_rate_options(set(changes))
        if ("fps" in changes or "num_frames" in changes) and "do_sample_frames" not in changes:
            changes["do_sample_frames"] = True  # asking for a rate means sampling
        # SmolVLM samples with both (at most num_frames, at fps); Gemma 4's processor takes
        # a part's one beside the checkpoint's other, which its sampler refuses as a pair
        # (so does Kimi-K2.5's, whose class default is a rate)
        if self.style not in ("smol", "gemma4", "kimi"):
            if "fps" in changes:
                changes["num_frames"] = None
            elif "num_frames" in changes:
                changes["fps"] = None
        return dataclasses.replace(self, **changes)


#: the styles that resize every frame to one size, by family name for errors
_FIXED_SIZE = {"llava": "LLaVA-OneVision", "smol": "SmolVLM", "internvl": "InternVL"}

_DEFAULTS = {
    # Qwen2VLVideoProcessor's class defaults
    "qwen2": VideoSettings("qwen2", 14, 2, 2, 128 * 28 * 28, 28 * 28 * 768, _CLIP_MEAN,
                           _CLIP_STD),
    # Qwen3VLVideoProcessor's
    "qwen3": VideoSettings("qwen3", 16, 2, 2, 128 * 32 * 32, 32 * 32 * 768, _HALF, _HALF,
                           do_sample_frames=True, fps=2),
    # LlavaOnevisionVideoProcessor's (no patches of its own: the vision tower's)
    "llava": VideoSettings("llava", 1, 1, 1, 0, 0, _CLIP_MEAN, _CLIP_STD, size=(384, 384)),
    # SmolVLMVideoProcessor's (IMAGENET_STANDARD mean and std are 0.5)
    "smol": VideoSettings("smol", 1, 1, 1, 0, 0, _HALF, _HALF, resample=_LANCZOS,
                          size=(364, 364), longest_edge=4 * 364, frames_as_images=True),
    # Gemma4VideoProcessor's (mean 0 and std 1: pixels scaled to [0, 1])
    "gemma4": VideoSettings("gemma4", 16, 1, 1, 0, 0, (0.0, 0.0, 0.0), (1.0, 1.0, 1.0),
                            do_sample_frames=True, num_frames=32, max_soft_tokens=70,
                            pooling_kernel_size=3),
    # Kimi_K25VideoProcessor's (IMAGENET_STANDARD mean and std, 2 fps, chunks of 4 frames)
    "kimi": VideoSettings("kimi", 14, 4, 2, 0, 0, _HALF, _HALF, do_sample_frames=True, fps=2,
                          size=(512, 512), max_patches=4096),
    # InternVLVideoProcessor's (OPENAI_CLIP mean and std, 384x384, bicubic, no sampling)
    "internvl": VideoSettings("internvl", 1, 1, 1, 0, 0, _CLIP_MEAN, _CLIP_STD,
                              size=(384, 384), frames_as_images=True),
    # Glm46VVideoProcessor's (OPENAI_CLIP mean and std, a rate picked by the clip's duration)
    "glm46v": VideoSettings("glm46v", 14, 2, 2, 112 * 112, 28 * 28 * 2 * 30000, _CLIP_MEAN,
                            _CLIP_STD, do_sample_frames=True),
}  # fmt: skip
_STYLE = {"qwen2_vl": "qwen2", "qwen2_5_vl": "qwen2", "qwen3_vl": "qwen3", "qwen3_5": "qwen3",
          "llava_onevision": "llava", "smolvlm": "smol", "qwen3_vl_moe": "qwen3",
          "qwen3_5_moe": "qwen3", "gemma4": "gemma4", "internvl": "internvl",
          "kimi_k25": "kimi", "glm46v": "glm46v"}  # fmt: skip
VIDEO_FAMILIES = tuple(_STYLE)
# the video processor class a config names (``AutoVideoProcessor`` maps an image
# processor's type to its family's video processor when only the image config exists)
_CLASS_STYLE = {
    "Qwen2VLVideoProcessor": "qwen2",
    "Qwen3VLVideoProcessor": "qwen3",
    "Qwen2VLImageProcessor": "qwen2",
    "Qwen2VLImageProcessorPil": "qwen2",
    "LlavaOnevisionVideoProcessor": "llava",
    "LlavaOnevisionImageProcessor": "llava",
    "LlavaOnevisionImageProcessorPil": "llava",
    "SmolVLMVideoProcessor": "smol",
    "SmolVLMImageProcessor": "smol",
    "SmolVLMImageProcessorPil": "smol",
    "Gemma4VideoProcessor": "gemma4",
    "Gemma4ImageProcessor": "gemma4",
    "Gemma4ImageProcessorPil": "gemma4",
    "InternVLVideoProcessor": "internvl",
    "Kimi_K25VideoProcessor": "kimi",
    "Kimi_K25ImageProcessor": "kimi",
    "Glm46VVideoProcessor": "glm46v",
    "Glm46VImageProcessor": "glm46v",
    "Glm46VImageProcessorPil": "glm46v",
}


def load_video_settings(path: str | Path, family: str) -> VideoSettings | None:
    """The video settings of a ``family`` checkpoint directory, or None.

    None for a family whose video vf_mm does not process.

    Args:
        path: The checkpoint directory.
        family: Its ``model_type``.
    """
    if family not in _STYLE:
        return None
    path = Path(path)
    saved: dict[str, Any] = {}
    nested = _read_json(path / "processor_config.json").get("video_processor")
    if isinstance(nested, dict):
        saved = nested
    elif (path / "video_preprocessor_config.json").exists():
        saved = _read_json(path / "video_preprocessor_config.json")
    else:
        saved = _read_json(path / "preprocessor_config.json")
    named = saved.get("video_processor_type") or saved.get("image_processor_type")
    style = _CLASS_STYLE.get(named, _STYLE[family]) if isinstance(named, str) else _STYLE[family]
    settings = _DEFAULTS[style]
    changes: dict[str, Any] = {
        "second_per_grid_ts": family == "qwen2_5_vl",
        "timestamps": _STYLE[family] == "qwen3",
    }
    size = saved.get("size")
    if style == "llava":
        if isinstance(size, dict) and size.get("height") and size.get("width"):
            changes["size"] = (int(size["height"]), int(size["width"]))
        # the processor's text: per frame, the tower's tokens pooled 2x2 (ceil), + 1 newline
        tokens = _read_json(path / "processor_config.json").get("num_image_tokens")
        if not isinstance(tokens, int) or tokens < 1:
            raise UnsupportedModelError(
                f"{path}: processor_config.json has no num_image_tokens (LLaVA-OneVision's "
                "video text needs it)"
            )
        changes["tokens_per_frame"] = math.ceil(int(math.sqrt(tokens)) / 2) ** 2
        size = None
    if style == "internvl":
        from vf_mm.models._internvl_video import internvl_settings

        options = _read_json(path / "processor_config.json")
        changes.update(internvl_settings(path, saved, options))
        size = None
    if style == "kimi":
        from vf_mm.models._kimi_k25_video import kimi_size

        changes["size"] = kimi_size(path, size, settings.size)
        size = None
    if isinstance(size, dict):
        changes["min_pixels"] = int(size.get("shortest_edge", settings.min_pixels))
        changes["max_pixels"] = int(size.get("longest_edge", settings.max_pixels))
    for key in ("min_pixels", "max_pixels"):  # the older spelling wins, as in __init__
        if saved.get(key) is not None:
            changes[key] = int(saved[key])
    for field in dataclasses.fields(VideoSettings):
        name = field.name
        if name in ("style", "min_pixels", "max_pixels", "second_per_grid_ts", "timestamps",
                    "size", "tokens_per_frame", "longest_edge", "frames_as_images",
                    "chat_template", "initial_shift"):  # fmt: skip
            continue
        if name in saved:
            value = saved[name]
            changes[name] = tuple(value) if isinstance(value, list) else value
    if style == "smol":
        changes.update(_smol_settings(path, saved, changes))
    if style == "gemma4":
        changes.update(min_pixels=0, max_pixels=0)  # Gemma 4 takes no size
    loaded = dataclasses.replace(settings, **changes)
    if style == "gemma4":
        from vf_mm.models._gemma4_video import check_settings

        check_settings(path, loaded)
    return loaded


def _smol_settings(path: Path, saved: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """SmolVLM's video settings, as ``SmolVLMVideoProcessor.__init__`` and
    ``SmolVLMProcessor.apply_chat_template`` settle them: ``video_sampling`` sets the rate,
    the frame cap and the first resize's size (the image config's ``size`` replaces its
    ``video_size`` when both are there); ``max_image_size`` is the square each frame ends
    at; sampling is on whenever a rate or a cap is set (``apply_chat_template`` passes
    both, which turns sampling on whatever the config says)."""
    from transformers.models.smolvlm.processing_smolvlm import DEFAULT_CHAT_TEMPLATE

    out: dict[str, Any] = {"chat_template": DEFAULT_CHAT_TEMPLATE, "min_pixels": 0,
                           "max_pixels": 0}  # fmt: skip
    size = saved.get("size")
    sampling = saved.get("video_sampling")
    if isinstance(sampling, dict):
        if isinstance(size, dict):
            sampling = {**sampling, "video_size": size}
        out["num_frames"] = sampling.get("max_frames")
        out["fps"] = sampling.get("fps")
        size = sampling.get("video_size")
    if isinstance(size, dict) and size.get("longest_edge"):
        out["longest_edge"] = int(size["longest_edge"])
    square = saved.get("max_image_size")
    if isinstance(square, dict) and square.get("longest_edge"):
        out["size"] = (int(square["longest_edge"]),) * 2
    fps = out.get("fps", changes.get("fps"))
    frames = out.get("num_frames", changes.get("num_frames"))
    out["do_sample_frames"] = fps is not None or frames is not None
    tokens = _read_json(path / "processor_config.json").get("image_seq_len", 169)
    if not isinstance(tokens, int) or tokens < 1:
        raise UnsupportedModelError(
            f"{path}: processor_config.json's image_seq_len is {tokens!r}, not a positive int"
        )
    out["tokens_per_frame"] = tokens
    return out


def _read_json(file: Path) -> dict[str, Any]:
    if not file.exists():
        return {}
    try:
        data = json.loads(file.read_text())
    except ValueError as exc:
        raise UnsupportedModelError(f"{file}: not valid JSON ({exc})") from None
    return data if isinstance(data, dict) else {}


@dataclass(frozen=True, slots=True)
class SampledVideo:
    """Which frames of a clip the processor keeps, and the frame rate its text and M-RoPE
    use: ``indices`` into the clip's frames, ``fps`` the clip's rate (None: unknown)."""

    indices: tuple[int, ...]
    fps: float | None


def sample_frames(settings: VideoSettings, total: int, fps: float | None) -> SampledVideo:
    """The frames the family's video processor keeps from a clip of ``total`` frames.

    A sampler that would pick a frame past the clip's end (Qwen2-VL's float ``arange`` can
    reach index ``total``, where transformers fails with an ``IndexError``) is refused by
    name, never clamped into a clip transformers would not make."""
    sampled = _pick_frames(settings, total, fps)
    beyond = [i for i in sampled.indices if not 0 <= i < total]
    if beyond:
        raise RenderError(
            f"the video processor's sampler picks frame {beyond[0]} of a {total}-frame clip "
            "(transformers fails on it with an IndexError): ask for fewer frames (a lower "
            "fps, or num_frames), or do_sample_frames=False to keep every frame"
        )
    return sampled


def _pick_frames(settings: VideoSettings, total: int, fps: float | None) -> SampledVideo:
    if total < 1:
        raise RenderError("a video needs at least one frame")
    if not settings.do_sample_frames:
        return SampledVideo(tuple(range(total)), fps)
    if settings.style == "qwen2":
        return SampledVideo(_sample_qwen2(settings, total, fps), fps)
    if settings.style == "gemma4":
        from vf_mm.models._gemma4_video import check_sampling

        check_sampling(settings)
    if settings.style == "kimi":
        from vf_mm.models._kimi_k25_video import check_sampling as check_kimi

        check_kimi(settings)
    if settings.style in ("llava", "gemma4", "kimi"):
        return SampledVideo(_sample_uniform(settings, total, fps), fps)
    if settings.style == "smol":
        return SampledVideo(_sample_smol(settings, total, fps), fps)
    if settings.style == "internvl":
        from vf_mm.models._internvl_video import sample_internvl

        return SampledVideo(sample_internvl(settings, total, fps), fps)
    if settings.style == "glm46v":
        from vf_mm.models._glm46v_video import sample_glm46v

        return SampledVideo(sample_glm46v(settings, total, fps), fps)
    return _sample_qwen3(settings, total, fps)


def _sample_smol(settings: VideoSettings, total: int, fps: float | None) -> tuple[int, ...]:
    """SmolVLM's sampler: about ``fps`` frames a second, at most ``num_frames``, spread
    evenly; a clip long enough to spare them loses its first and last second."""
    if fps is None:
        raise RenderError(
            "SmolVLM samples a clip by its duration, which needs the clip's frame rate: give "
            "the video part a frame_rate, or do_sample_frames=False to keep every frame"
        )
    if settings.fps is None or settings.num_frames is None:
        raise RenderError(
            "SmolVLM's sampler takes both a rate and a frame cap: give the video part fps "
            "and num_frames"
        )
    rate, cap, skip = settings.fps, settings.num_frames, 1
    duration = total / fps
    wanted = max(1, min(round(rate * duration), cap))
    start, end = 0, total - 1
    if skip > 0 and duration - 2 * skip > cap * rate:
        start, end = int(skip * fps), int(total - skip * fps)
    start, end = max(0, start), min(end, total - 1)
    if start >= end:
        start, end = 0, total - 1
    return tuple(int(i) for i in np.unique(np.linspace(start, end, wanted, dtype=int)))


def _sample_uniform(settings: VideoSettings, total: int, fps: float | None) -> tuple[int, ...]:
    """transformers' ``default_sample_indices_fn`` (the base video processor's)."""
    num = settings.num_frames
    if num is None and settings.fps is not None:
        num = max(1, int(total / clip_rate(settings, fps) * settings.fps))
    if num is None:
        return tuple(range(total))
    if num > total:
        raise too_many_frames(settings, num, total, fps)
    return tuple(int(i) for i in np.arange(num, dtype=int) * total // num)


def clip_rate(settings: VideoSettings, fps: float | None) -> float:
    """The clip's frame rate, which sampling at ``settings.fps`` needs: refused by name
    when the clip's is unknown."""
    if fps is None:
        raise RenderError(
            f"sampling at {settings.fps} fps needs the clip's frame rate: give the video "
            "part a frame_rate, or sample by num_frames"
        )
    return fps


def too_many_frames(
    settings: VideoSettings, num: int, total: int, fps: float | None
) -> RenderError:
    """The refusal of sampling ``num`` frames from a ``total``-frame clip (at ``fps``), as
    the samplers refuse it, naming where the count came from and the options that fix it:
    the count may be the checkpoint's default (Gemma 4 samples 32), which the user never
    wrote."""
    if settings.num_frames is not None:
        why = f"num_frames is {settings.num_frames} (the part's, else the checkpoint's default)"
        if num != settings.num_frames:  # Qwen2-VL's, rounded to whole temporal patches
            why += f", {num} in whole temporal patches"
        fix = f"give the video part num_frames of at most {total}"
    else:
        why = f"fps {settings.fps} on a clip at {fps} fps keeps {num}"
        fix = f"give the video part an fps of at most {fps}, or num_frames of at most {total}"
    return RenderError(
        f"cannot sample {num} frames from a {total}-frame clip ({why}): {fix}, or "
        "do_sample_frames=False to keep every frame"
    )


def _sample_qwen2(settings: VideoSettings, total: int, fps: float | None) -> tuple[int, ...]:
    import torch

    tps = settings.temporal_patch_size
    num: float | int | None = None
    if settings.num_frames is not None:
        num = round(settings.num_frames / tps) * tps
    elif settings.fps is not None:
        fps = clip_rate(settings, fps)
        most = math.floor(min(settings.max_frames, total) / tps) * tps
        num = min(max(total / fps * settings.fps, settings.min_frames), most, total)
        num = math.floor(num / tps) * tps
    if num is None:  # transformers fails here (a TypeError deep in its sampler)
        raise RenderError(
            "Qwen2-VL's video processor samples by fps or num_frames only: give one, or "
            "do_sample_frames=False to keep every frame"
        )
    if num <= 0:
        raise RenderError(
            f"sampling leaves no frames from a {total}-frame clip (frames are taken in "
            f"multiples of {tps}): ask for more frames"
        )
    if num > total:
        raise too_many_frames(settings, int(num), total, fps)
    return tuple(torch.arange(0, total, total / num).int().tolist())


def _sample_qwen3(settings: VideoSettings, total: int, fps: float | None) -> SampledVideo:
    num = settings.num_frames
    if num is None and settings.fps is not None:
        if fps is None:
            fps = 24.0  # what the processor assumes, and then writes in the timestamps
        num = int(total / fps * settings.fps)
        num = min(max(num, settings.min_frames), settings.max_frames, total)
    if num is None:
        num = min(max(total, settings.min_frames), settings.max_frames)
    # more frames than the clip has repeat frames (linspace), as the processor does: the
    # only way a one-frame clip reaches Qwen3-VL, whose temporal patch takes two
    indices = np.linspace(0, total - 1, num).round().astype(int)
    return SampledVideo(tuple(int(i) for i in indices), fps)


def resized_size(
    settings: VideoSettings, num_frames: int, height: int, width: int
) -> tuple[int, int]:
    """The frame size the family's ``smart_resize`` picks (transformers' own function)."""
    factor = settings.patch_size * settings.merge_size
    try:
        if settings.style == "qwen2":
            from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

            return smart_resize(
                height, width, factor=factor, min_pixels=settings.min_pixels,
                max_pixels=settings.max_pixels,
            )  # fmt: skip
        from transformers.models.qwen3_vl.video_processing_qwen3_vl import (
            smart_resize as smart_resize_3d,
        )

        return smart_resize_3d(
            num_frames=num_frames, height=height, width=width,
            temporal_factor=settings.temporal_patch_size, factor=factor,
            min_pixels=settings.min_pixels, max_pixels=settings.max_pixels,
        )  # fmt: skip
    except ValueError as exc:  # aspect ratio over 200, fewer frames than a temporal patch
        if num_frames < settings.temporal_patch_size:
            raise RenderError(
                f"the video processor refuses a clip of {num_frames} frame(s) (after sampling): "
                f"it needs at least {settings.temporal_patch_size}, one temporal patch "
                f"({exc})"
            ) from None
        raise RenderError(
            f"the video processor refuses this clip ({num_frames} frames of {height}x{width} "
            f"after sampling): {exc}"
        ) from None


def resize_frames(frames: Any, height: int, width: int, resample: int) -> Any:
    """(T, C, H, W) uint8 frames resized as torchvision's v2 ``resize`` resizes them
    (``_tv_ops.resize``, the image ports' too)."""
    from vf_mm.models._tv_ops import interpolation_mode, resize

    if resample not in (_BICUBIC, _BILINEAR, _LANCZOS):
        raise RenderError(
            f"video resample {resample} is not supported (bicubic 3, bilinear 2 and lanczos 1 are)"
        )
    return resize(frames, height, width, mode=interpolation_mode(resample))


def normalize_frames(frames: Any, settings: VideoSettings) -> Any:
    """transformers' fused rescale and normalise (``_tv_ops.rescale_and_normalize``)."""
    from vf_mm.models._tv_ops import rescale_and_normalize

    return rescale_and_normalize(
        frames, do_rescale=settings.do_rescale, rescale_factor=settings.rescale_factor,
        do_normalize=settings.do_normalize, mean=settings.image_mean, std=settings.image_std,
    )  # fmt: skip


def patchify_frames(frames: Any, settings: VideoSettings) -> tuple[Any, int, int, int]:
    """(T, C, H, W) frames as Qwen-VL's patch rows, the last frame repeated up to whole
    temporal patches: the rows and the grid (t, h, w)."""
    import torch

    t, c, h, w = frames.shape
    tps, p, m = settings.temporal_patch_size, settings.patch_size, settings.merge_size
    if pad := -t % tps:
        frames = torch.cat((frames, frames[-1:].expand(pad, -1, -1, -1)), dim=0)
        t += pad
    gt, gh, gw = t // tps, h // p, w // p
    patches = frames.reshape(gt, tps, c, gh // m, m, p, gw // m, m, p)
    patches = patches.permute(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return patches.reshape(gt * gh * gw, c * tps * p * p), gt, gh, gw


@dataclass(frozen=True, slots=True)
class ExpandedVideo:
    """One clip as the processor sees it: the text that replaces its placeholder, its model
    inputs (numpy, leading video axis), and the frames kept (``sampled``)."""

    replacement: str
    item: dict[str, np.ndarray]
    sampled: SampledVideo


def expand_video(
    settings: VideoSettings,
    frames: np.ndarray,
    *,
    fps: float | None,
    tokens: dict[str, str],
) -> ExpandedVideo:
    """A clip's model inputs and replacement text.

    As the family's video processor and processor compute them for ``videos=[frames]``
    with metadata ``{"total_num_frames": T, "fps": fps, "frames_indices": range(T)}``.

    Args:
        settings: The checkpoint's video settings.
        frames: ``(T, H, W, 3)`` uint8 RGB.
        fps: The clip's frame rate, when known.
        tokens: The processor's ``video_token``, ``vision_start_token`` and
            ``vision_end_token`` (SmolVLM's and InternVL's image markup: see theirs).
    """
    import torch

    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8:
        raise RenderError(
            f"video frames must be (T, H, W, 3) uint8, got {frames.shape} {frames.dtype}"
        )
    sampled = sample_frames(settings, int(frames.shape[0]), fps)
    whole = sampled.indices == tuple(range(frames.shape[0]))  # not only as many: the same
    kept = frames if whole else frames[list(sampled.indices)]
    with warnings.catch_warnings():  # read-only frames: only read, then copied by contiguous()
        warnings.simplefilter("ignore", UserWarning)
        video = torch.from_numpy(np.ascontiguousarray(kept))
    video = video.permute(0, 3, 1, 2).contiguous()
    if settings.style == "llava":
        return _expand_llava(settings, video, sampled, tokens)
    if settings.style == "smol":
        return _expand_smol(settings, video, sampled, int(frames.shape[0]), tokens)
    if settings.style == "gemma4":
        from vf_mm.models._gemma4_video import expand_gemma4

        return expand_gemma4(settings, video, sampled, tokens)
    if settings.style == "kimi":
        from vf_mm.models._kimi_k25_video import expand_kimi_k25

        return expand_kimi_k25(settings, video, sampled, tokens)
    if settings.style == "internvl":
        from vf_mm.models._internvl_video import expand_internvl

        return expand_internvl(settings, video, sampled, tokens)
    if settings.style == "glm46v":
        from vf_mm.models._glm46v_video import expand_glm46v

        return expand_glm46v(settings, video, sampled, tokens)
    if settings.do_resize:
        height, width = resized_size(settings, video.shape[0], *video.shape[-2:])
        video = resize_frames(video, height, width, settings.resample)
    video = normalize_frames(video, settings)
    pixels, gt, gh, gw = patchify_frames(video, settings)
    item = {
        "pixel_values_videos": pixels.numpy(),
        "video_grid_thw": np.array([[gt, gh, gw]], dtype=np.int64),
    }
    if settings.second_per_grid_ts:
        # the processor's sampled fps: kept frames over all frames times the clip's rate
        rate = len(sampled.indices) / frames.shape[0] * sampled.fps if sampled.fps else 24
        item["second_per_grid_ts"] = np.array(
            [settings.temporal_patch_size / rate], dtype=np.float32
        )
    per_group = gh * gw // settings.merge_size**2
    pad = tokens["video_token"]
    if not settings.timestamps:
        replacement = pad * (gt * per_group)
    else:
        stamps = _timestamps(sampled, settings.temporal_patch_size)
        replacement = "".join(
            f"<{stamps[g]:.1f} seconds>"
            + tokens["vision_start_token"]
            + pad * per_group
            + tokens["vision_end_token"]
            for g in range(gt)
        )
    return ExpandedVideo(replacement, item, sampled)


def _expand_llava(
    settings: VideoSettings, video: Any, sampled: SampledVideo, tokens: dict[str, str]
) -> ExpandedVideo:
    """LLaVA-OneVision: every frame resized to the processor's size, normalised, kept as
    ``(1, T, 3, H, W)``; the text is ``<video>`` once per pooled token of every frame, plus
    one for the newline the model appends."""
    if settings.do_resize and settings.size is not None:
        video = resize_frames(video, *settings.size, settings.resample)
    video = normalize_frames(video, settings)
    count = int(video.shape[0])
    replacement = tokens["video_token"] * (count * settings.tokens_per_frame + 1)
    return ExpandedVideo(replacement, {"pixel_values_videos": video[None].numpy()}, sampled)


def _expand_smol(
    settings: VideoSettings, video: Any, sampled: SampledVideo, total: int, tokens: dict[str, str]
) -> ExpandedVideo:
    """SmolVLM: every frame resized twice with Lanczos (longest edge, then the square),
    normalised, kept as ``(1, T, 3, S, S)`` with an all-ones ``pixel_attention_mask``; the
    text is the processor's intro, then each frame's timestamp and image tokens."""
    import torch
    from num2words import num2words

    if settings.do_resize:
        rows, cols = video.shape[-2:]
        height, width = _longest_edge_size(int(rows), int(cols), settings.longest_edge)
        video = resize_frames(video, height, width, settings.resample)
        if settings.size is not None:
            video = resize_frames(video, *settings.size, settings.resample)
    video = normalize_frames(video, settings)
    count = int(video.shape[0])
    mask = torch.ones((1, count, *video.shape[-2:]), dtype=torch.int64)
    # without a rate the processor takes 24 fps, and the duration from the last timestamp
    fps = sampled.fps if sampled.fps is not None else 24.0
    seconds = [i / fps for i in sampled.indices]
    duration = int(total / sampled.fps) if sampled.fps is not None else int(seconds[-1])
    frame = (
        tokens["fake_image_token"]
        + tokens["global_image_token"]
        + tokens["image_token"] * settings.tokens_per_frame
        + tokens["fake_image_token"]
    )
    text = (
        f"You are provided the following series of {num2words(count)} frames from a "
        f"{dt.timedelta(seconds=duration)} [H:MM:SS] video.\n"
    )
    for second in seconds:
        text += f"\nFrame from {int(second // 60):02d}:{int(second % 60):02d}:" + frame
    item = {"pixel_values": video[None].numpy(), "pixel_attention_mask": mask.numpy()}
    return ExpandedVideo(text + "\n\n", item, sampled)


def _longest_edge_size(height: int, width: int, longest: int) -> tuple[int, int]:
    """SmolVLM's first resize: the longest edge to ``longest`` (at most 4096), the other
    edge by the aspect ratio, rounded down and then up to even."""
    longest = min(4096, longest)
    aspect = width / height
    if width >= height:
        width, height = longest, int(longest / aspect)
        height += height % 2
    else:
        height, width = longest, int(longest * aspect)
        width += width % 2
    return max(height, 1), max(width, 1)


def _timestamps(sampled: SampledVideo, merge: int) -> list[float]:
    """Qwen3-VL's timestamp per temporal group: the mean time of its first and last frame."""
    fps = sampled.fps if sampled.fps is not None else 24
    indices = list(sampled.indices)
    if len(indices) % merge:
        indices.extend(indices[-1] for _ in range(merge - len(indices) % merge))
    times = [i / fps for i in indices]
    return [(times[i] + times[i + merge - 1]) / 2 for i in range(0, len(times), merge)]
