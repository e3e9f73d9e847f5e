"""Renderers: messages and images -> exact token ids, turn bridging, response parsing.

``load_renderer(model)`` picks one for a checkpoint directory, processor or tokenizer.
Every renderer offers ``render(messages, *, tools=None, add_generation_prompt=True)``,
``bridge_to_next_turn(previous_prompt_ids, previous_completion_ids, new_messages, *,
tools=None, previous_multi_modal_data=None)`` (None means "re-render"),
``parse_response(completion_ids)`` and ``stop_token_ids``. ``RendererPool`` shares
renderers across threads; ``is_multimodal`` answers for a renderer or a pool.
"""

from vf_mm.errors import RenderError, UnsupportedModelError
from vf_mm.renderers._load import load_renderer
from vf_mm.renderers._parse import ParsedResponse
from vf_mm.renderers._pool import RendererPool, is_multimodal
from vf_mm.renderers._template import ChatTemplateRenderer
from vf_mm.renderers._vision import ProcessedImage, VisionSpec

__all__ = [
    "ChatTemplateRenderer",
    "ParsedResponse",
    "ProcessedImage",
    "RenderError",
    "RendererPool",
    "UnsupportedModelError",
    "VisionSpec",
    "is_multimodal",
    "load_renderer",
]
