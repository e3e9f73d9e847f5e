"""The trl tier's fixtures: TRL itself (through ``vf_mm.integrations.trl``) and tiny
checkpoints of every family.

Nothing here imports TRL at collection: the default tier, where it is not installed,
deselects the tier's tests (marked ``trl``) without ever importing it.
"""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session")
def trl():
    """``vf_mm.integrations.trl`` (which imports TRL); TRL's notice that ``rollout_func`` is
    experimental silenced."""
    pytest.importorskip("trl")
    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
    import vf_mm.integrations.trl as integration

    return integration


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory):
    """``checkpoints(family)``: a tiny random checkpoint of ``family`` (a vision family, or
    ``"text"``: a tiny Qwen2 language model), built once per session."""
    from vf_mm.testing import build_tiny_lm, build_tiny_vlm

    root = tmp_path_factory.mktemp("trl-checkpoints")
    built: dict[str, object] = {}

    def get(family: str):
        if family not in built:
            path = root / family
            built[family] = (
                build_tiny_lm(path) if family == "text" else build_tiny_vlm(path, family)
            )
        return built[family]

    return get
