"""Inference backends: token ids (and images) in, sampled token ids and logprobs out.

``Backend`` (token level: ``LocalBackend``, ``VLLMBackend``) and ``ChatBackend``
(message level: ``OpenAIChatBackend``) are the two contracts. ``encode_kwargs_item`` /
``decode_kwargs_item`` are vLLM's ``kwargs_data`` encoding of one image's model inputs
(what ``features`` mode sends), checked against vLLM's own decoder; ``encode_features``
is a prompt's whole ``features`` field. ``create_app`` is the
HTTP app of ``vf-mm serve``: a token-level backend (the ``LocalBackend``) behind vLLM's
token-in/token-out route and an OpenAI-compatible chat route. ``VLLMServers`` starts N
vLLM servers of one model as subprocesses (``server_flags``: what each needs for
``VLLMBackend``; ``vllm_command``: what starts one), stopped with their parent however
it ends. ``Retry``, ``Routing``, ``Auth`` and ``Expansion`` are ``VLLMBackend``'s settings
objects (retries and backoff; the routing policy and its sessions; the API keys; how a
content_parts answer is read against the renderer), each checked when it is made; ``KeepAliveTransport`` is the httpx transport it sends plain-HTTP
requests through (pass it to any ``httpx.AsyncClient`` that posts to an inference server).
"""

from typing import TYPE_CHECKING

from vf_mm._lazy import lazy_exports
from vf_mm.inference._server_guard import ServerLimits
from vf_mm.inference._spawn import VLLMServers, server_flags, vllm_command
from vf_mm.inference._types import (
    Backend,
    ChatBackend,
    ChatResult,
    FinishReason,
    GenerateRequest,
    GenerateResult,
    SamplingParams,
    Usage,
)
from vf_mm.inference._vllm_config import Auth, Expansion, Retry, Routing

__all__ = [
    "Auth",
    "Expansion",
    "Backend",
    "ChatBackend",
    "ChatResult",
    "FinishReason",
    "GenerateRequest",
    "GenerateResult",
    "KeepAliveTransport",
    "LocalBackend",
    "OpenAIChatBackend",
    "Retry",
    "Routing",
    "SamplingParams",
    "ServerLimits",
    "Usage",
    "VLLMBackend",
    "VLLMServers",
    "create_app",
    "encode_features",
    "server_flags",
    "vllm_command",
]

if TYPE_CHECKING:
    from vf_mm.inference._http import KeepAliveTransport
    from vf_mm.inference._local import LocalBackend
    from vf_mm.inference._openai import OpenAIChatBackend
    from vf_mm.inference._server import create_app
    from vf_mm.inference._vllm import VLLMBackend
    from vf_mm.inference._vllm_protocol import encode_features

# Backends import torch or httpx, the server starlette: they load on first use, so
# importing vf_mm stays light.
__getattr__ = lazy_exports(
    __name__,
    {
        "KeepAliveTransport": "vf_mm.inference._http",
        "LocalBackend": "vf_mm.inference._local",
        "OpenAIChatBackend": "vf_mm.inference._openai",
        "VLLMBackend": "vf_mm.inference._vllm",
        "create_app": "vf_mm.inference._server",
        "encode_features": "vf_mm.inference._vllm_protocol",
    },
)
