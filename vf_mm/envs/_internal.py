"""The envs package's internal tier (docs/architecture.md): library code only.

Loading without the adapters: ``vf_mm.adapters`` wraps it so that ``vf_mm.load_environment``
also takes verifiers' environments (the one users call).
"""

from __future__ import annotations

from vf_mm.envs._loading import Adapter, load_environment, load_environment_with

__all__ = [
    "Adapter",
    "load_environment",
    "load_environment_with",
]
