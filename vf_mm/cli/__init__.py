"""The ``vf-mm`` command."""

from vf_mm.cli._main import main

__all__ = ["main"]
