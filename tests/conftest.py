"""Suite-wide setup: caches stay inside pytest's temporary directory."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory):
    """vf_mm's cache (the converted real Qwen vocabulary) goes to a session temp dir, not ~."""
    saved = os.environ.get("VF_MM_CACHE")
    os.environ["VF_MM_CACHE"] = str(tmp_path_factory.mktemp("vf_mm_cache"))
    yield
    if saved is None:
        os.environ.pop("VF_MM_CACHE", None)
    else:
        os.environ["VF_MM_CACHE"] = saved
