"""The models package's internal tier (docs/architecture.md): library code only.

The tiny checkpoints' recipes, chat templates and tokenizers (users reach them through
``vf_mm.testing``), and the per-family processing details renderers, training and the
server share (``ItemChecker``: a client's processed images checked against the family's
processor).
"""

from __future__ import annotations

from vf_mm.models._families import (
    QWEN_VL_FAMILIES,
    checkpoint_processor,
    image_kwargs,
    image_processor_class,
)
from vf_mm.models._items import ItemChecker
from vf_mm.models._templates import (
    CHAT_TEMPLATES,
    QWEN2_VL_TEMPLATE,
    QWEN3_VL_TEMPLATE,
    chat_template,
)
from vf_mm.models._tiny_lm import build_tiny_lm
from vf_mm.models._tiny_vlm import build_tiny_vlm
from vf_mm.models._video import ExpandedVideo, SampledVideo, VideoSettings, sample_frames
from vf_mm.models._vocab import qwen_tokenizer, tiny_tokenizer

__all__ = [
    "CHAT_TEMPLATES",
    "ExpandedVideo",
    "ItemChecker",
    "QWEN2_VL_TEMPLATE",
    "QWEN3_VL_TEMPLATE",
    "QWEN_VL_FAMILIES",
    "SampledVideo",
    "VideoSettings",
    "build_tiny_lm",
    "build_tiny_vlm",
    "chat_template",
    "checkpoint_processor",
    "image_kwargs",
    "image_processor_class",
    "qwen_tokenizer",
    "sample_frames",
    "tiny_tokenizer",
]
