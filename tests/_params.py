"""Parameters shared by the suite's randomized tests."""

from __future__ import annotations

import pytest


def seeds(default: int, total: int) -> list[object]:
    """Seeds ``0..total-1`` for a randomized test: the first ``default`` run in the default
    tier, the rest in the slow tier (``python3 dev.py slow``), so every claim is checked
    on every run and the long tail of random cases on the slow one."""
    return [
        seed if seed < default else pytest.param(seed, marks=pytest.mark.slow)
        for seed in range(total)
    ]
