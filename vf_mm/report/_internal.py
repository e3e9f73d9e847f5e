"""The report package's internal tier: what sibling packages use and users have no
need of. Only vf_mm's own packages import this module (the architecture test allows
``vf_mm.<package>._internal`` and no other private module); it carries no stability
promise.
"""

from __future__ import annotations

from vf_mm.report._pages import page_name
from vf_mm.report._write import PAGE_SIZE

__all__ = [
    "PAGE_SIZE",
    "page_name",
]
