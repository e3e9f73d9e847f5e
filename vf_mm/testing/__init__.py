"""Offline fixtures for tests, vf_mm's and its users': tiny checkpoints of every family
vf_mm renders, built with random weights and no network, the chat templates and
tokenizers they carry, and backends that replay scripted replies.

- ``build_tiny_vlm(path, family, *, variant=None)`` / ``build_tiny_lm(path)``: a
  checkpoint directory ``load_renderer``, the local backend and transformers all load;
- ``chat_template(family, variant)`` / ``CHAT_TEMPLATES``: the templates those
  checkpoints carry (the real checkpoints' text, or a variant's);
- ``tiny_tokenizer()`` / ``qwen_tokenizer()``: their tokenizers;
- ``ScriptedBackend`` (token level) and ``ScriptedChatBackend`` (OpenAI chat level):
  engines that answer with scripted replies, for environment and client tests;
- ``FAMILIES``: the Qwen-VL families, the ones a suite covers first (every family is
  in ``vf_mm.models.VISION_FAMILIES``).

The recipes live in ``vf_mm.models`` and the scripted engine in ``vf_mm.inference``
(library code uses them too); this package is where tests reach them.
"""

from vf_mm.inference._internal import ScriptedBackend
from vf_mm.models._internal import (
    CHAT_TEMPLATES,
    QWEN_VL_FAMILIES,
    build_tiny_lm,
    build_tiny_vlm,
    chat_template,
    qwen_tokenizer,
    tiny_tokenizer,
)
from vf_mm.testing._backends import ScriptedChatBackend

FAMILIES = QWEN_VL_FAMILIES

__all__ = [
    "CHAT_TEMPLATES",
    "FAMILIES",
    "ScriptedBackend",
    "ScriptedChatBackend",
    "build_tiny_lm",
    "build_tiny_vlm",
    "chat_template",
    "qwen_tokenizer",
    "tiny_tokenizer",
]
