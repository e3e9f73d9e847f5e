"""The results package's internal tier (docs/architecture.md): library code only.

The results format's version string (metadata.json records it; docs/formats/results.md).
"""

from __future__ import annotations

from vf_mm.results._format import RESULTS_FORMAT

__all__ = [
    "RESULTS_FORMAT",
]
