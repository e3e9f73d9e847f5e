"""Run a bench script with the pool engine's varlen vision attention off (an A/B aid):
``python bench/_no_varlen.py SCRIPT ARGS...``."""

import runpy
import sys
from typing import Any

import vf_mm.inference._packed as packed

init = packed.PackedModel.__init__


def without(self: packed.PackedModel, model: Any, *, varlen_vision: bool = False) -> None:
    init(self, model, varlen_vision=False)


packed.PackedModel.__init__ = without  # type: ignore[method-assign]
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
