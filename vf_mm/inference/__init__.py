"""Inference backends: token ids (and images) in, sampled token ids and logprobs out.

``Backend`` (token level: ``LocalBackend``, ``VLLMBackend``) and ``ChatBackend``
(message level: ``OpenAIChatBackend``) are the two contracts; ``vf-mm serve`` exposes a
``LocalBackend`` over HTTP with vLLM's token-in/token-out route.
"""

from typing import TYPE_CHECKING, Any

from vf_mm.inference._types import (
    Backend,
    ChatBackend,
    ChatResult,
    FinishReason,
    GenerateRequest,
    GenerateResult,
    SamplingParams,
    Usage,
    check_prompt_length,
)

__all__ = [
    "Backend",
    "ChatBackend",
    "ChatResult",
    "FinishReason",
    "GenerateRequest",
    "GenerateResult",
    "LocalBackend",
    "OpenAIChatBackend",
    "SamplingParams",
    "Usage",
    "VLLMBackend",
    "check_prompt_length",
]

# Backends import torch or httpx: load them on first use, so that importing vf_mm (and
# vf_mm.wire through it) stays light.
_LAZY = {
    "LocalBackend": "vf_mm.inference._local",
    "OpenAIChatBackend": "vf_mm.inference._openai",
    "VLLMBackend": "vf_mm.inference._vllm",
}

if TYPE_CHECKING:
    from vf_mm.inference._local import LocalBackend
    from vf_mm.inference._openai import OpenAIChatBackend
    from vf_mm.inference._vllm import VLLMBackend


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'vf_mm.inference' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
