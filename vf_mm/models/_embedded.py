"""``embedded_model``: the checkpoint ``vf-mm eval`` runs when given no model.

It is ``build_tiny_vlm``'s Qwen2.5-VL with the tiny vocabulary and seed 0: deterministic
and offline, so the command works on a fresh machine without a download. It is built
on first use into the cache and reused; the name carries a version, so a change to
the recipe must bump it rather than silently reuse an older build.
"""

from __future__ import annotations

from pathlib import Path

from vf_mm.models._cache import build_once
from vf_mm.models._tiny_vlm import build_tiny_vlm

EMBEDDED_FAMILY = "qwen2_5_vl"


def embedded_model() -> Path:
    """The embedded tiny model's checkpoint directory (built offline on first use)."""
    return build_once(
        f"tiny-{EMBEDDED_FAMILY}-v1",
        lambda path: build_tiny_vlm(path, EMBEDDED_FAMILY),
        marker="config.json",
    )
