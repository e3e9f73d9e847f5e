"""The report package's internal tier (docs/architecture.md): library code only.

How ``vf-mm view`` splits a report into pages, for the CLI.
"""

from __future__ import annotations

from vf_mm.report._pages import page_name
from vf_mm.report._write import PAGE_SIZE

__all__ = [
    "PAGE_SIZE",
    "page_name",
]
