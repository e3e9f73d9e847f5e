"""Shared fixtures for the inference tests: one tiny Qwen2.5-VL checkpoint per session,
and one tiny checkpoint per family on demand (``checkpoints``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from vf_mm.testing import build_tiny_lm, build_tiny_vlm


@pytest.fixture(scope="session")
def tiny_vlm_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An offline tiny Qwen2.5-VL checkpoint directory (random weights, ~1 s to build)."""
    return build_tiny_vlm(tmp_path_factory.mktemp("tiny_vlm") / "qwen2_5_vl", "qwen2_5_vl")


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """``checkpoints(family)``: an offline tiny checkpoint of ``family`` (a
    ``build_tiny_vlm`` family, or ``"text"`` for ``build_tiny_lm``'s causal LM), built on
    first use and shared by every test of the session (tests only read it)."""
    root = tmp_path_factory.mktemp("checkpoints")
    built: dict[str, Path] = {}

    def get(family: str) -> Path:
        if family not in built:
            if family == "text":
                built[family] = build_tiny_lm(root / family)
            else:
                built[family] = build_tiny_vlm(root / family, family)
        return built[family]

    return get
