"""Shared fixtures for the inference tests: one tiny Qwen2.5-VL checkpoint per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from vf_mm.testing import build_tiny_vlm


@pytest.fixture(scope="session")
def tiny_vlm_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An offline tiny Qwen2.5-VL checkpoint directory (random weights, ~1 s to build)."""
    return build_tiny_vlm(tmp_path_factory.mktemp("tiny_vlm") / "qwen2_5_vl", "qwen2_5_vl")
