"""vf_mm: multimodal, multi-turn RL environments with exact tokens and a fast tensor wire."""

from vf_mm import errors

__version__ = "0.1.0"

__all__ = ["__version__", "errors"]
