"""transformers' torchvision image backend computed with torch alone.

transformers 5.23 has only torchvision image processors for some families (LFM2-VL,
Kimi-K2.5), and torchvision does not import beside a CPU-only torch. vf_mm's own ports of
those processors (``_kimi_k25_images``, ``_lfm2_vl_images``) derive from
``TorchvisionPort`` here, which computes what transformers' ``TorchvisionBackend`` does,
bit for bit, calling the very torch ops torchvision's v2 functional calls (torchvision
0.28):

- an image to a channels-first tensor as ``TorchvisionBackend.process_image`` makes it:
  a PIL image through transformers' own PIL conversion (alpha onto white), an array's
  grey channel repeated and its alpha blended in float32 (``to_rgb``);
- ``resize``: ``torch.nn.functional.interpolate`` (``align_corners=False``, antialias for
  bilinear and bicubic) on the uint8 tensor itself where torchvision lets torch's native
  uint8 kernels run on the CPU (bicubic always; bilinear on AVX2, AVX-512 and ARM CPUs),
  otherwise on a float32 copy that is clamped (bicubic, uint8) and cast back, rounded
  first for uint8 and the signed integers only (uint16 and wider truncate, as in torchvision);
- ``pad``: ``torch.nn.functional.pad`` with a constant, on the bottom and right;
- ``rescale_and_normalize``: one float32 subtraction and division by the mean and std
  scaled by ``1 / rescale_factor`` (transformers' fused rescale and normalise).

The video processing (``_video``) resizes and normalises its frames with the same ops.

Each image is processed alone, as transformers does on the CPU (its default
``disable_grouping`` on CPU tensors). The port reports ``image_backend_of(...) ==
"torchvision"``: the backend names whose numbers an image processor computes, and these
are torchvision's (the engine's, vLLM's, wherever torchvision imports).
"""

from __future__ import annotations

import platform
from typing import Any, ClassVar

import numpy as np
import torch
from transformers.image_processing_utils import BaseImageProcessor
from transformers.image_transforms import convert_to_rgb as _pil_to_rgb
from transformers.image_utils import (
    ChannelDimension,
    ImageType,
    get_image_type,
    infer_channel_dimension_format,
)

from vf_mm.errors import RenderError

#: PIL's resampling codes (``PILImageResampling``) to ``interpolate``'s modes, the ones
#: transformers maps them to for torchvision's resize (nearest is "nearest-exact"; lanczos
#: is torchvision >= 0.27's, on the CPU); box and hamming have none and are refused
_MODES = {0: "nearest-exact", 1: "lanczos", 2: "bilinear", 3: "bicubic"}
#: the modes torchvision runs with ``align_corners=False`` and antialiasing
_SMOOTH = ("bilinear", "bicubic", "lanczos")
#: the integer dtypes torchvision rounds back to after a float resize; the others
#: (uint16, uint32, uint64) it truncates, the cast's own rule
_ROUNDED = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


def interpolation_mode(resample: Any) -> str:
    """``interpolate``'s mode for a processor's ``resample``: a PIL code (as transformers
    maps it), torchvision's ``InterpolationMode`` or its value (taken as named: transformers
    passes one to torchvision as is), or None (bilinear).

    Raises:
        ValueError: A resampling torch's ``interpolate`` does not have.
    """
    if resample is None:
        return "bilinear"
    value = resample.value if hasattr(resample, "value") else resample
    if isinstance(value, str):  # torchvision's InterpolationMode (or its value), as given
        if value in ("nearest", *_MODES.values()):
            return value
        code = -1
    else:
        code = int(value)
    if code not in _MODES:
        raise ValueError(
            f"resample={resample!r}: vf_mm's torch-only image processing has nearest, "
            "bilinear, bicubic and lanczos (box and hamming: torch has no such kernel, and "
            "transformers' torchvision processors fail on them too when they resize)"
        )
    return _MODES[code]


def native_uint8(mode: str) -> bool:
    """Whether torchvision resizes a uint8 CPU tensor in ``mode`` without a float copy:
    nearest, bicubic and lanczos always; bilinear only where torch's uint8 kernel is vectorised
    (AVX2, AVX-512, ARM), elsewhere torchvision finds the float path faster."""
    if mode == "bilinear":
        return torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512") or (
            platform.machine() in ("aarch64", "arm64")
        )
    return True


def resize(image: torch.Tensor, height: int, width: int, *, mode: str) -> torch.Tensor:
    """``image`` (``(..., C, H, W)``) resized to ``height`` x ``width``, as transformers
    calls torchvision's ``resize(image, [height, width], interpolation, antialias=True)``
    (off the CPU: uint8 through float32 always, lanczos as bicubic).

    Args:
        image: A channels-first image or batch of them.
        height: The new height.
        width: The new width.
        mode: ``"nearest-exact"``, ``"bilinear"``, ``"bicubic"`` or ``"lanczos"``
            (``interpolation_mode``).
    """
    *lead, channels, old_h, old_w = image.shape
    if (old_h, old_w) == (height, width):
        return image
    dtype = image.dtype
    batch = image.reshape(-1, channels, old_h, old_w)
    strides = batch.stride()
    if (
        batch.is_contiguous(memory_format=torch.channels_last)
        and batch.shape[0] == 1
        and image.numel() != strides[0]
    ):  # torchvision restrides a lone channels-last image so the output keeps its layout
        batch = batch.as_strided((1, channels, old_h, old_w), (image.numel(), *strides[1:]))
    on_cpu = image.device.type == "cpu"
    if mode == "lanczos" and not on_cpu:  # transformers' fallback off the CPU
        mode = "bicubic"
    keep = dtype in (torch.float32, torch.float64) or (
        dtype == torch.uint8 and (mode == "nearest-exact" or (on_cpu and native_uint8(mode)))
    )
    if not keep:
        batch = batch.to(torch.float32)
    smooth = mode in _SMOOTH
    try:
        out = torch.nn.functional.interpolate(
            batch,
            size=[height, width],
            mode=mode,
            align_corners=False if smooth else None,
            antialias=smooth,
        )
    except (ValueError, NotImplementedError) as exc:
        if mode != "lanczos":
            raise
        # torchvision's Lanczos resize (SmolVLM's frames) is torch's own interpolate mode,
        # which older torch releases lack: refused by name, never resized another way
        raise RenderError(
            f"a Lanczos resize needs torch's interpolate mode 'lanczos', which torch "
            f"{torch.__version__} does not take ({exc}): torch 2.13 does; upgrade torch"
        ) from None
    if not keep:
        if mode in ("bicubic", "lanczos") and dtype == torch.uint8:
            out = out.clamp_(min=0, max=255)
        if dtype in _ROUNDED:
            out = out.round_()
        out = out.to(dtype)
    return out.reshape(*lead, channels, height, width)


def pad(image: torch.Tensor, height: int, width: int, *, fill: float = 0) -> torch.Tensor:
    """``image`` padded with ``fill`` on the bottom and right to ``height`` x ``width``
    (torchvision's constant ``pad``; unchanged when it has that size already)."""
    old_h, old_w = image.shape[-2:]
    if (old_h, old_w) == (height, width):
        return image
    if height < old_h or width < old_w:
        raise ValueError(f"cannot pad a {old_h}x{old_w} image to {height}x{width}")
    *lead, channels = image.shape[:-2]
    flat = image.reshape(-1, channels, old_h, old_w)
    out = torch.nn.functional.pad(
        flat, [0, width - old_w, 0, height - old_h], mode="constant", value=float(fill)
    )
    return out.reshape(*lead, channels, height, width)


def rescale_and_normalize(
    image: torch.Tensor,
    *,
    do_rescale: bool,
    rescale_factor: float,
    do_normalize: bool,
    mean: Any,
    std: Any,
) -> torch.Tensor:
    """transformers' fused rescale and normalise: with both on, float32
    ``(image - mean / rescale_factor) / (std / rescale_factor)``, the scaled mean and std
    computed as float32 tensors first, as transformers does."""
    if do_rescale and do_normalize:
        mean = torch.tensor(mean, device=image.device) * (1.0 / rescale_factor)
        std = torch.tensor(std, device=image.device) * (1.0 / rescale_factor)
        do_rescale = False
    if do_normalize:
        if isinstance(std, (tuple, list)) and not all(std):
            raise ValueError("image_std has a zero: normalising would divide by zero")
        out = image.to(torch.float32)
        mean_t = torch.as_tensor(mean, dtype=torch.float32, device=out.device)
        std_t = torch.as_tensor(std, dtype=torch.float32, device=out.device)
        if mean_t.ndim == 1:
            mean_t = mean_t.view(-1, 1, 1)
        if std_t.ndim == 1:
            std_t = std_t.view(-1, 1, 1)
        out = out.sub_(mean_t) if image.dtype != torch.float32 else out.sub(mean_t)
        return out.div_(std_t)
    if do_rescale:
        return image * rescale_factor
    return image


def to_rgb(image: torch.Tensor) -> torch.Tensor:
    """A channels-first array image as RGB, as transformers' torchvision backend converts
    one (a PIL image is converted by PIL instead): a grey channel repeated; RGBA blended
    onto white in float32 (``rgb * a + 1 - a``) and scaled back to its dtype."""
    if image.ndim == 2:
        image = image[None]
    if image.shape[-3] == 1:
        repeats = [1] * image.ndim
        repeats[-3] = 3
        image = image.repeat(repeats)
    elif image.shape[-3] == 2:
        raise ValueError("a 2-channel array is not an image transformers converts to RGB")
    if image.shape[-3] != 4:
        return image
    if image.is_floating_point() and (image.min() < 0.0 or image.max() > 1.0):
        raise ValueError(
            "an RGBA float array to convert to RGB must hold values in [0, 1], got "
            f"[{image.min().item()}, {image.max().item()}]"
        )
    dtype = image.dtype
    last = image.movedim(-3, -1)
    if dtype != torch.float32:
        last = (
            last.to(torch.float32)
            if dtype.is_floating_point
            else last.to(torch.float32).mul_(1.0 / _max_value(dtype))
        )
    blended = last[..., :3] * last[..., 3:] + (1 - last[..., 3:])
    if dtype != torch.float32:
        blended = (
            blended.to(dtype)
            if dtype.is_floating_point
            else blended.mul(_max_value(dtype) + 1.0 - 1e-3).to(dtype)
        )
    return blended.movedim(-1, -3)


def _max_value(dtype: torch.dtype) -> int:
    return 255 if dtype == torch.uint8 else int(torch.iinfo(dtype).max)


def channels_first(
    image: Any, *, do_convert_rgb: bool | None, input_data_format: Any = None
) -> torch.Tensor:
    """One input image as the contiguous ``(C, H, W)`` tensor transformers' torchvision
    backend starts from (``TorchvisionBackend.process_image``): a PIL image through PIL's
    RGB conversion, an array or tensor by its (given or guessed) channel layout."""
    kind = get_image_type(image)
    if kind not in (ImageType.PIL, ImageType.TORCH, ImageType.NUMPY):
        raise ValueError(f"unsupported image type {type(image).__name__}")
    if kind == ImageType.PIL:
        array = _pil_to_rgb(image, return_numpy=True) if do_convert_rgb else np.array(image)
        tensor = torch.from_numpy(array)
        input_data_format = ChannelDimension.LAST
    else:
        tensor = torch.from_numpy(image) if kind == ImageType.NUMPY else image
    if tensor.ndim == 2:
        tensor = tensor.unsqueeze(0)
        input_data_format = ChannelDimension.FIRST
    if input_data_format is None:
        guessed: Any = tensor  # transformers guesses a tensor's layout as an array's
        input_data_format = infer_channel_dimension_format(guessed, num_channels=(1, 3, 4))
    if ChannelDimension(input_data_format) == ChannelDimension.LAST:
        tensor = tensor.permute(2, 0, 1)
    if do_convert_rgb and kind != ImageType.PIL:
        tensor = to_rgb(tensor)
    return tensor.contiguous()


class TorchvisionPort(BaseImageProcessor):
    """The base of vf_mm's torch-only ports of transformers' torchvision image processors.

    A port is an image processor in transformers' sense (``preprocess``, its settings as
    attributes, ``from_pretrained``, ``to_dict``), so a family's processor takes it as its
    ``image_processor``. It computes the numbers of the class named ``torchvision_class``
    (its settings are saved under that name, so a checkpoint saved through it loads with
    transformers' own class wherever torchvision imports).
    """

    torchvision_class: ClassVar[str]

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._set_attributes(**kwargs)

    @property
    def backend(self) -> str:
        return "torchvision"

    def process_image(
        self,
        image: Any,
        do_convert_rgb: bool | None = None,
        input_data_format: Any = None,
        device: Any = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        """One input image as a channels-first tensor (``channels_first``)."""
        tensor = channels_first(
            image, do_convert_rgb=do_convert_rgb, input_data_format=input_data_format
        )
        return tensor if device is None else tensor.to(device)

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        out["image_processor_type"] = self.torchvision_class
        return out
