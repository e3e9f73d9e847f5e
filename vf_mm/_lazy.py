"""Lazy re-exports: a package names a class in ``__all__`` but imports its module on first use.

The backends, the server and the trainer-side tensors import torch, transformers or
starlette; importing ``vf_mm`` (and ``vf_mm.wire`` through it) must not. A package that re-exports such names
sets ``__getattr__ = lazy_exports(__name__, {"Name": "vf_mm.pkg._module", ...})`` and
lists the names under ``if TYPE_CHECKING:`` for type checkers.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, names: Mapping[str, str]) -> Callable[[str], Any]:
    """A module-level ``__getattr__`` that imports ``names[attr]`` when ``attr`` is asked for."""
    table = dict(names)

    def __getattr__(name: str) -> Any:
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module), name)

    return __getattr__
