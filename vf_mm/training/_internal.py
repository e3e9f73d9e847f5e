"""The training package's internal tier (docs/architecture.md): library code only.

ZeroMQ endpoint parsing (``vf-mm rollout --stream`` tells a path from an endpoint), and
the group format's table by source.
"""

from __future__ import annotations

from vf_mm.training._groups import GROUP_FORMAT_BY_SOURCE
from vf_mm.training._transport import is_endpoint

__all__ = [
    "GROUP_FORMAT_BY_SOURCE",
    "is_endpoint",
]
