"""Formatting values for the report: numbers, JSON, and long text cut into a preview."""

from __future__ import annotations

import json
import math
from typing import Any

from vf_mm._text import shorten

#: text longer than this (characters or lines) shows a preview and a "show more"
TEXT_PREVIEW_CHARS = 2000
TEXT_PREVIEW_LINES = 40
#: text past this many characters is left out of the report (and the count said)
TEXT_MAX_CHARS = 200_000


def _number(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, int | float):
        return None
    try:
        return float(x)
    except OverflowError:
        return math.inf if x > 0 else -math.inf


def _fmt(x: Any) -> str:
    if x is None:
        return "—"
    if isinstance(x, bool):
        return str(x).lower()
    if isinstance(x, int):
        return f"{x:,}" if abs(x) >= 10_000 else str(x)
    if isinstance(x, float):
        if math.isnan(x):
            return "NaN"
        if math.isinf(x):
            return "∞" if x > 0 else "-∞"
        if x.is_integer() and abs(x) < 1e15:
            return str(int(x))
        return f"{x:.4g}"
    if isinstance(x, str):
        return x
    return _json(x, indent=None)


def _fmt_stat(x: Any) -> str:
    if isinstance(x, dict) and "mean" in x:
        std = f" ± {_fmt(x['std'])}" if x.get("std") is not None else ""
        return f"{_fmt(x['mean'])}{std}"
    if isinstance(x, dict):
        return ", ".join(f"{k}: {_fmt_stat(v)}" for k, v in x.items())
    return _fmt(x)


def _json(x: Any, indent: int | None = 2) -> str:
    try:
        return json.dumps(x, indent=indent, ensure_ascii=False, default=repr)
    except (TypeError, ValueError):
        return repr(x)


def _plural(n: Any, word: str) -> str:
    return f"{n} {word}" if str(n) == "1" else f"{n} {word}s"


def _short(s: str, n: int = 200) -> str:
    return shorten(s, n)


def _text(s: Any) -> dict[str, Any]:
    """A text block: ``head`` always shown, ``tail`` behind "show more", ``omitted`` dropped."""
    s = s if isinstance(s, str) else _json(s)
    total = len(s)
    omitted = max(0, total - TEXT_MAX_CHARS)
    s = s[:TEXT_MAX_CHARS]
    cut = min(len(s), TEXT_PREVIEW_CHARS)
    newline = -1
    for _ in range(TEXT_PREVIEW_LINES):
        newline = s.find("\n", newline + 1)
        if newline < 0:
            break
    if newline >= 0:
        cut = min(cut, newline + 1)
    if cut >= len(s) - 200 and not omitted:  # not worth a fold for the last few characters
        cut = len(s)
    elif s[cut - 1] != "\n":  # end the preview at a line break or a space near the limit
        at = s.rfind("\n", cut - 300, cut)
        at = at if at > 0 else s.rfind(" ", cut - 80, cut)
        cut = at + 1 if at > 0 else cut
    return {"head": s[:cut], "tail": s[cut:], "omitted": omitted, "total": total}
