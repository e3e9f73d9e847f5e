"""Offline fixtures for tests, vf_mm's and its users': tiny Qwen-VL and Qwen2 text
checkpoints built with random weights and no network, and backends that replay
scripted replies.

The checkpoint recipes live in ``vf_mm.models`` and the token-level scripted backend in
``vf_mm.inference`` (library code uses them too); this package gathers what a test needs.
"""

from vf_mm.inference import ScriptedBackend
from vf_mm.models import QWEN_VL_FAMILIES, build_tiny_lm, build_tiny_vlm
from vf_mm.testing._backends import ScriptedChatBackend

FAMILIES = (
    QWEN_VL_FAMILIES  # the Qwen-VL families (all of build_tiny_vlm's: models.VISION_FAMILIES)
)

__all__ = ["FAMILIES", "ScriptedBackend", "ScriptedChatBackend", "build_tiny_lm", "build_tiny_vlm"]
