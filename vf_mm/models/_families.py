"""The Qwen-VL family registry: which families vf_mm renders, and their transformers pieces.

``QWEN_VL_FAMILIES`` are the ``model_type`` values that get image support;
``model_type(path)`` reads a checkpoint's; ``model_class``, ``image_processor_class``
and ``processor_class`` name the transformers classes of a family; ``load_processor``
loads a checkpoint directory's processor.

Image processing has two backends in transformers, and they compute different pixels
whenever an image is resized (up to 0.3 apart in normalised ``pixel_values``):
``torchvision`` (``Qwen2VLImageProcessor``), which ``AutoProcessor`` and vLLM pick
wherever torchvision imports (every GPU machine), and ``pil``
(``Qwen2VLImageProcessorPil``), the fallback. The renderer's pixels must be the ones the
engine and the trainer compute, so the backend is a choice (``image_backend``):
``"auto"`` (the default) picks what ``AutoProcessor`` would on this machine,
``resolve_image_backend`` says which that is.

Everything also loads without torchvision (a CPU-only machine): the stock processors
refuse to build there (they look up a video processor class), so the registry uses a
processor subclass that accepts ``video_processor=None``. ``AutoProcessor`` on such a
directory silently returns only the tokenizer, so everything is loaded by concrete class.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from vf_mm.errors import MissingDependencyError, UnsupportedModelError

QWEN_VL_FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")


IMAGE_BACKENDS = ("auto", "pil", "torchvision")


def torchvision_available() -> bool:
    """Whether torchvision imports here (installed is not enough: a torchvision built for
    another torch fails at import, and transformers then falls back to PIL too)."""
    try:
        import torchvision  # noqa: F401
    except Exception:  # ImportError, or a binary that does not match this torch
        return False
    return True


def resolve_image_backend(backend: str = "auto") -> str:
    """``"pil"`` or ``"torchvision"``: ``"auto"`` is what ``AutoProcessor`` picks on this
    machine (torchvision where it imports, else PIL). Asking for torchvision where it does
    not import raises ``MissingDependencyError``."""
    if backend not in IMAGE_BACKENDS:
        raise ValueError(f"image_backend must be one of {list(IMAGE_BACKENDS)}, not {backend!r}")
    if backend == "auto":
        return "torchvision" if torchvision_available() else "pil"
    if backend == "torchvision" and not torchvision_available():
        raise MissingDependencyError(
            "image_backend='torchvision' needs torchvision, which does not import here "
            "(install the build that matches your torch, or use image_backend='pil')"
        )
    return backend


def image_processor_class(family: str, backend: str = "pil") -> type:
    """The family's image processor class for ``backend`` (``"pil"`` or ``"torchvision"``;
    ``"auto"`` is resolved first)."""
    backend = resolve_image_backend(backend)
    if backend == "torchvision":
        from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor

        return Qwen2VLImageProcessor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    return Qwen2VLImageProcessorPil


def image_backend_of(image_processor: Any) -> str:
    """Which backend a loaded image processor computes with (``"pil"`` or ``"torchvision"``)."""
    names = {cls.__name__ for cls in type(image_processor).__mro__}
    return "torchvision" if "TorchvisionBackend" in names else "pil"


def model_class(family: str) -> type:
    """The family's transformers model class (``...ForConditionalGeneration``)."""
    import transformers

    return {
        "qwen2_vl": transformers.Qwen2VLForConditionalGeneration,
        "qwen2_5_vl": transformers.Qwen2_5_VLForConditionalGeneration,
        "qwen3_vl": transformers.Qwen3VLForConditionalGeneration,
    }[family]


@cache
def processor_class(family: str) -> type:
    """The family's HF processor, accepting ``video_processor=None``."""
    import transformers

    base = {
        "qwen2_vl": transformers.Qwen2VLProcessor,
        "qwen2_5_vl": transformers.Qwen2_5_VLProcessor,
        "qwen3_vl": transformers.Qwen3VLProcessor,
    }[family]

    def check_argument_for_proper_class(self: Any, name: str, argument: Any) -> Any:
        if argument is None and name == "video_processor":
            return None
        return base.check_argument_for_proper_class(self, name, argument)

    return type(
        f"{base.__name__}NoVideo",
        (base,),
        {"check_argument_for_proper_class": check_argument_for_proper_class},
    )


def model_type(path: str | Path) -> str:
    """The ``model_type`` of a checkpoint directory's ``config.json``."""
    config = Path(path) / "config.json"
    try:
        return json.loads(config.read_text())["model_type"]
    except (OSError, ValueError, KeyError) as exc:
        raise UnsupportedModelError(f"{config}: cannot read the model type ({exc})") from None


def load_processor(path: str | Path, *, image_backend: str = "auto") -> Any:
    """The HF processor of a Qwen-VL checkpoint directory (tokenizer + the image processor of
    ``image_backend``: ``"auto"``, ``"pil"`` or ``"torchvision"``)."""
    from transformers import AutoTokenizer

    path = Path(path)
    family = model_type(path)
    if family not in QWEN_VL_FAMILIES:
        raise UnsupportedModelError(
            f"{path}: model type {family!r} has no Qwen-VL processor "
            f"(supported: {', '.join(QWEN_VL_FAMILIES)})"
        )
    tokenizer = AutoTokenizer.from_pretrained(path)
    image_processor = image_processor_class(family, image_backend).from_pretrained(path)
    template = tokenizer.chat_template
    if template is None and (path / "chat_template.jinja").exists():
        template = (path / "chat_template.jinja").read_text()
    return processor_class(family)(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=None,
        chat_template=template,
    )
