"""Shortening text for messages: every error and report line that quotes user data uses this,
so a multi-megabyte value never floods a log and every cut is marked the same way (``…``)."""

from __future__ import annotations

import traceback

from vf_mm.errors import VfMmError


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


def describe_failure(exc: BaseException) -> str:
    """One line naming a failure, its type first (``"ImageFetchError: ..."``): vf_mm errors by
    their message, others also with where in the code they were raised."""
    if isinstance(exc, VfMmError):
        return f"{type(exc).__name__}: {exc}"
    frame = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
    where = (
        f" (at {frame.filename.rsplit('/', 1)[-1]}:{frame.lineno} in {frame.name})" if frame else ""
    )
    return f"{type(exc).__name__}: {exc}{where}"
