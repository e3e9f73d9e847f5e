"""Offline fixtures for tests, vf_mm's and its users': tiny Qwen-VL checkpoints built
with random weights and no network."""

from vf_mm.testing._tiny_vlm import FAMILIES, build_tiny_vlm

__all__ = ["FAMILIES", "build_tiny_vlm"]
