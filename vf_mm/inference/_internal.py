"""The inference package's internal tier: what sibling packages use and users have no
need of. Only vf_mm's own packages import this module (the architecture test allows
``vf_mm.<package>._internal`` and no other private module); it carries no stability
promise.
"""

from __future__ import annotations

from vf_mm.inference._mm_kwargs import decode_kwargs_item, encode_kwargs_item
from vf_mm.inference._scripted import ScriptedBackend
from vf_mm.inference._types import check_prompt_length

__all__ = [
    "ScriptedBackend",
    "check_prompt_length",
    "decode_kwargs_item",
    "encode_kwargs_item",
]
