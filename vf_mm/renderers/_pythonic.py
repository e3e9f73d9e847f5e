"""LFM2's tool calls: one Python list of calls per turn, ``<|tool_call_start|>[NAME(KEY=VALUE,
...), ...]<|tool_call_end|>``.

The LFM2.5-VL template writes a call's arguments by keyword only, each value as a Python
literal of its own making: a string between single quotes with ``\\``, ``'``, newline and
carriage return escaped; an object or a list as JSON (so ``true``, ``false`` and ``null``
may appear inside it); any other scalar as Python's ``str`` (``True``, ``None``, ``1.5``).
``parse_block`` reads that back with Python's own parser (never evaluating anything: only
literals, with JSON's three names read as their values), ``format_call`` writes it.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Mapping
from typing import Any

CALL_START = "<|tool_call_start|>"
CALL_END = "<|tool_call_end|>"
_BLOCK = re.compile(re.escape(CALL_START) + r"(.*?)(?:" + re.escape(CALL_END) + r"|\Z)", re.DOTALL)
_JSON_NAMES = {"true": True, "false": False, "null": None}


def split_calls(body: str) -> tuple[str, list[str]]:
    """``body``'s text before its first call block, and each block's inside (a block cut
    off by the token budget runs to the end)."""
    first = body.find(CALL_START)
    if first < 0:
        return body, []
    return body[:first], [m.group(1) for m in _BLOCK.finditer(body, first)]


def parse_block(raw: str) -> list[tuple[dict[str, Any] | None, str | None]]:
    """The calls of one block, each ``(call, None)`` or ``(None, why it is malformed)``."""
    try:
        tree = ast.parse(raw.strip(), mode="eval").body
    except SyntaxError as exc:
        return [(None, f"not a Python list of calls ({exc.msg})")]
    if not isinstance(tree, ast.List):
        return [(None, "not a list of calls [NAME(KEY=VALUE, ...)]")]
    out: list[tuple[dict[str, Any] | None, str | None]] = []
    for node in tree.elts:
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
            out.append((None, "not a call NAME(KEY=VALUE, ...)"))
            continue
        if node.args or any(k.arg is None for k in node.keywords):
            out.append((None, f"{node.func.id}: arguments must be given by keyword"))
            continue
        try:
            arguments = {str(k.arg): _literal(k.value) for k in node.keywords}
        except ValueError as exc:
            out.append((None, f"{node.func.id}: {exc}"))
            continue
        out.append(({"name": node.func.id, "arguments": arguments}, None))
    return out


def _literal(node: ast.expr) -> Any:
    """A literal's value; JSON's ``true``/``false``/``null`` (inside an object or list the
    template wrote as JSON) are read as theirs, any other name or expression refused."""

    class _JsonNames(ast.NodeTransformer):
        def visit_Name(self, name: ast.Name) -> ast.AST:
            if name.id not in _JSON_NAMES:
                raise ValueError(f"{name.id!r} is not a literal value")
            return ast.copy_location(ast.Constant(_JSON_NAMES[name.id]), name)

    try:
        return ast.literal_eval(_JsonNames().visit(node))
    except (ValueError, TypeError, SyntaxError, RecursionError) as exc:
        raise ValueError(f"a value that is not a literal ({exc})") from None


def format_value(value: Any) -> str:
    """A value as the template writes it (see the module docstring)."""
    if isinstance(value, str):
        escaped = (
            value.replace("\\", "\\\\")
            .replace("'", "\\'")
            .replace("\n", "\\n")
            .replace("\r", "\\r")
        )
        return f"'{escaped}'"
    if isinstance(value, (Mapping, list, tuple)):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


def format_calls(calls: list[tuple[str, Mapping[str, Any]]]) -> str:
    """One block holding ``calls`` (``(name, arguments)`` pairs), as the template writes it."""
    written = (
        f"{name}(" + ", ".join(f"{k}={format_value(v)}" for k, v in dict(arguments).items()) + ")"
        for name, arguments in calls
    )
    return CALL_START + "[" + ", ".join(written) + "]" + CALL_END
