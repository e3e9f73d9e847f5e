"""The training package's internal tier: what sibling packages use and users have no
need of. Only vf_mm's own packages import this module (the architecture test allows
``vf_mm.<package>._internal`` and no other private module); it carries no stability
promise.
"""

from __future__ import annotations

from vf_mm.training._groups import GROUP_FORMAT_BY_SOURCE
from vf_mm.training._transport import is_endpoint

__all__ = [
    "GROUP_FORMAT_BY_SOURCE",
    "is_endpoint",
]
