"""Text helpers for messages. ``shorten``: every error and report line that quotes user
data uses it, so a multi-megabyte value never floods a log and every cut is marked the
same way (``…``). ``lone_surrogate``: where a value holds text that is not Unicode, so a
store that needs UTF-8 refuses it by name instead of failing deep inside an encoder."""

from __future__ import annotations

from typing import Any


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


def lone_surrogate(value: Any, path: str = "") -> tuple[str, int] | None:
    """Where the first lone surrogate in ``value`` is, as ``(path, character index)``:
    a str, or a str inside dicts (keys and values) and lists, ``path`` naming it
    (``"info.note"``, ``"tags[2]"``); None when every str is valid Unicode. A lone
    surrogate (``errors="surrogateescape"`` makes them) is no UTF-8 text: msgpack and
    the stores that need UTF-8 cannot hold it."""
    if isinstance(value, str):
        if value.isascii():
            return None
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            return path, exc.start
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            name = f"{path}.{key}" if path else str(key)
            found = lone_surrogate(key, f"{name} (the key)") or lone_surrogate(item, name)
            if found is not None:
                return found
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            found = lone_surrogate(item, f"{path}[{i}]")
            if found is not None:
                return found
    return None
