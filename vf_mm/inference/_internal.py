"""The inference package's internal tier (docs/architecture.md): library code only.

The token-level scripted engine (``check_environment`` runs on it; users reach it as
``vf_mm.testing.ScriptedBackend``), the prompt-length check, and the vLLM multimodal item
codec (its tests read it).
"""

from __future__ import annotations

from vf_mm.inference._mm_kwargs import decode_kwargs_item, encode_kwargs_item
from vf_mm.inference._scripted import ScriptedBackend
from vf_mm.inference._types import check_prompt_length

__all__ = [
    "ScriptedBackend",
    "check_prompt_length",
    "decode_kwargs_item",
    "encode_kwargs_item",
]
