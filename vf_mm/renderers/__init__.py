"""Renderers: messages and images -> exact token ids, turn bridging, response parsing.

``Renderer`` is the contract every renderer meets:
``render(messages, *, tools=None, add_generation_prompt=True)``;
``bridge_to_next_turn(previous_prompt_ids, previous_completion_ids, new_messages, *,
tools=None, previous_multi_modal_data=None)``, which returns None to mean "re-render"
(the optional ``previous_messages`` let it check the real history, ``on_refusal``
hears why it declined: optional extensions, which ``bridge(renderer, ...)`` passes only
to a renderer that takes them); ``parse_response(completion_ids)`` (``format_tool_calls`` writes the tool-call text it
parses); ``stop_token_ids``,
``is_multimodal`` and ``bridge_refusals``. ``load_renderer(model)`` picks one for a
checkpoint directory, processor or tokenizer (a ``ChatTemplateRenderer``);
``RendererPool`` shares renderers across threads and is a ``Renderer`` itself (its
renderers share one ``ImageCache``: processed images, bounded in bytes);
``is_multimodal`` answers for either. The model families and their transformers
pieces are in ``vf_mm.models``.
"""

from vf_mm.renderers._cache import DEFAULT_CACHE_BYTES, ImageCache
from vf_mm.renderers._load import load_renderer
from vf_mm.renderers._parse import ParsedResponse, format_tool_calls
from vf_mm.renderers._pool import RendererPool, is_multimodal
from vf_mm.renderers._protocol import Renderer, bridge
from vf_mm.renderers._template import ChatTemplateRenderer
from vf_mm.renderers._vision import ProcessedImage, VisionSpec

__all__ = [
    "DEFAULT_CACHE_BYTES",
    "ChatTemplateRenderer",
    "ImageCache",
    "ParsedResponse",
    "ProcessedImage",
    "Renderer",
    "RendererPool",
    "VisionSpec",
    "bridge",
    "format_tool_calls",
    "is_multimodal",
    "load_renderer",
]
