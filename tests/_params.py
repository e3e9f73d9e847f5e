"""Parameters shared by the suite's randomized tests."""

from __future__ import annotations

import pytest
from hypothesis import strategies as st

#: Every character UTF-8 encodes (all but the surrogates): what ``st.text()`` draws by
#: default, but without its ``codec="utf-8"`` check, which in a fresh checkout (no
#: ``.hypothesis`` cache yet) first encodes all of Unicode, ~4 CPU-s in each test process.
UNICODE = st.characters(exclude_categories=("Cs",))


def seeds(default: int, total: int) -> list[object]:
    """Seeds ``0..total-1`` for a randomized test: the first ``default`` run in the default
    tier, the rest in the slow tier (``python3 dev.py slow``), so every claim is checked
    on every run and the long tail of random cases on the slow one."""
    return [
        seed if seed < default else pytest.param(seed, marks=pytest.mark.slow)
        for seed in range(total)
    ]
