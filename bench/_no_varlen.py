"""Run a bench script with the pool engine's varlen vision attention off (an A/B aid):
``python bench/_no_varlen.py SCRIPT ARGS...``. Every ``LocalBackend`` the script builds in
this process runs its vision towers with their own attention (a ``vf-mm serve`` it starts
as another process keeps the varlen call). Public names only: the engine's ``packed`` is
reached as ``prefill_probe.py`` reaches it."""

import runpy
import sys
from typing import Any

from vf_mm.inference import LocalBackend

init = LocalBackend.__init__


def without(self: LocalBackend, *args: Any, **kwargs: Any) -> None:
    init(self, *args, **kwargs)
    packed = getattr(self._scheduler._engine, "packed", None)  # the pool engine's
    if packed is not None:
        packed.vision_configs = []  # no tower switched: transformers' own attention


LocalBackend.__init__ = without  # type: ignore[method-assign]
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
