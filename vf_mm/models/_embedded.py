"""Tiny checkpoints built once into the cache: ``cached_tiny_vlm(family)``, and
``embedded_model``, the one ``vf-mm eval`` runs when given no model.

Each is ``build_tiny_vlm``'s checkpoint of its family with the tiny vocabulary and seed
0: deterministic and offline, so a fresh machine needs no download, and built on first
use into the cache and reused (``check_environment(env, family=...)`` in a test suite
builds each family once, not once per call). The names carry a version, so a change to
a recipe must bump it rather than silently reuse an older build.
"""

from __future__ import annotations

from pathlib import Path
from typing import cast

from vf_mm.models._cache import build_once
from vf_mm.models._families import family_info
from vf_mm.models._tiny_vlm import Family, build_tiny_vlm

EMBEDDED_FAMILY = "qwen2_5_vl"


def cached_tiny_vlm(family: str = EMBEDDED_FAMILY) -> Path:
    """The tiny ``family`` checkpoint's directory (built offline on first use).

    Args:
        family: A ``model_type`` (``vf_mm.models.VISION_FAMILIES``).

    Raises:
        UnsupportedModelError: An unknown family (naming the nearest known one).
    """
    family_info(family)
    return build_once(
        f"tiny-{family}-v1",
        lambda path: build_tiny_vlm(path, cast(Family, family)),  # checked just above
        marker="config.json",
    )


def embedded_model() -> Path:
    """The embedded tiny model's checkpoint directory (built offline on first use)."""
    return cached_tiny_vlm(EMBEDDED_FAMILY)
