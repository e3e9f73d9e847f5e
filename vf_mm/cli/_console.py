"""``cli_console``: the one way the ``vf-mm`` commands make their rich console.

Soft wrap: a long line (a run directory's path, a command to copy) is never broken across
lines, so what a user copies from the terminal, or a script reads from a pipe, is whole.
Tables still fit the terminal's width.
"""

from __future__ import annotations

from rich.console import Console

__all__ = ["cli_console"]


def cli_console(*, stderr: bool = False) -> Console:
    """A console for the ``vf-mm`` commands (``stderr``: write to standard error)."""
    return Console(stderr=stderr, soft_wrap=True)
