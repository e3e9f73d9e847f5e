"""Offline fixtures for tests, vf_mm's and its users': tiny Qwen-VL and Qwen2
text checkpoints built with random weights and no network."""

from vf_mm.testing._backends import ScriptedBackend, ScriptedChatBackend
from vf_mm.testing._tiny_lm import build_tiny_lm
from vf_mm.testing._tiny_vlm import FAMILIES, build_tiny_vlm

__all__ = ["FAMILIES", "ScriptedBackend", "ScriptedChatBackend", "build_tiny_lm", "build_tiny_vlm"]
