"""The Qwen-VL family registry: which families vf_mm renders, and their transformers pieces.

``QWEN_VL_FAMILIES`` are the ``model_type`` values that get image support;
``model_type(path)`` reads a checkpoint's; ``model_class``, ``image_processor_class``
and ``processor_class`` name the transformers classes of a family; ``load_processor``
loads a checkpoint directory's processor.

Everything loads without torchvision: on a CPU-only machine it is absent, so
transformers' "fast" image and video processors are unavailable and the stock
processors refuse to build (they look up a video processor class). The registry uses
the PIL image processor (``Qwen2VLImageProcessorPil``, which every Qwen-VL family
shares) and a processor subclass that accepts ``video_processor=None``.
``AutoProcessor`` on such a directory silently returns only the tokenizer, so
everything is loaded by concrete class.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from vf_mm.errors import UnsupportedModelError

QWEN_VL_FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")


def image_processor_class(family: str) -> type:
    """The family's image processor class (the PIL one, which needs no torchvision)."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    return Qwen2VLImageProcessorPil


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


def load_processor(path: str | Path) -> Any:
    """The HF processor of a Qwen-VL checkpoint directory (tokenizer + PIL image processor)."""
    from transformers import AutoTokenizer

    path = Path(path)
    family = model_type(path)
    if family not in QWEN_VL_FAMILIES:
        raise UnsupportedModelError(
            f"{path}: model type {family!r} has no Qwen-VL processor "
            f"(supported: {', '.join(QWEN_VL_FAMILIES)})"
        )
    tokenizer = AutoTokenizer.from_pretrained(path)
    image_processor = image_processor_class(family).from_pretrained(path)
    template = tokenizer.chat_template
    if template is None and (path / "chat_template.jinja").exists():
        template = (path / "chat_template.jinja").read_text()
    return processor_class(family)(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=None,
        chat_template=template,
    )
