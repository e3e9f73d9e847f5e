"""Shortening text for messages: every error and report line that quotes user data uses this,
so a multi-megabyte value never floods a log and every cut is marked the same way (``…``)."""

from __future__ import annotations


def shorten(text: str, limit: int, *, keep_end: bool = False) -> str:
    """``text`` if it fits in ``limit`` characters, else cut to exactly ``limit`` with ``…``.

    ``keep_end`` keeps the last third as well (for paths and URLs, whose ends say most).
    """
    if len(text) <= limit:
        return text
    keep = limit - 1
    if keep_end:
        return text[: keep - keep // 3] + "…" + text[len(text) - keep // 3 :]
    return text[:keep] + "…"


def describe_exception(exc: BaseException, limit: int = 160) -> str:
    """The exception's message (its class name when the message is empty), shortened."""
    return shorten(str(exc) or type(exc).__name__, limit)
