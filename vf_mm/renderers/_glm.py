"""GLM-4.6V's tool calls: ``<tool_call>NAME`` then one ``<arg_key>K</arg_key>`` and
``<arg_value>V</arg_value>`` pair per argument, each on its own line, then ``</tool_call>``.

The template writes a string value raw and any other value as JSON (``[1, 2]``, ``true``),
so a value's type is read back best-effort: JSON if it parses as JSON, else the string
itself. A value the template would write differently from what the model wrote (``[1,2]``
comes back as ``[1, 2]``; a string that reads as JSON, such as ``"7"``, comes back a
number) makes a full re-render differ from what was sampled: the renderer's bridge sees
that and renders in full.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)
_PAIR = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)


def split_calls(body: str) -> tuple[str, list[str]]:
    """``body``'s text before its first call (its trailing newline dropped, as the template
    writes one before each call), and the inside of each call (a call cut off by the token
    budget runs to the end)."""
    first = body.find("<tool_call>")
    if first < 0:
        return body, []
    return body[:first].rstrip("\n"), [m.group(1) for m in _CALL.finditer(body, first)]


def parse_call(raw: str) -> tuple[dict[str, Any] | None, str | None]:
    """One call's ``{"name", "arguments"}``, or ``(None, why it is malformed)``: a name on
    the first line, then only ``<arg_key>``/``<arg_value>`` pairs."""
    name, _, rest = raw.partition("\n")
    name = name.strip()
    if not name or "<" in name:
        return None, "no function name before the arguments"
    arguments: dict[str, Any] = {}
    end = 0
    for match in _PAIR.finditer(rest):
        if rest[end : match.start()].strip():
            return None, f"text between arguments: {rest[end : match.start()].strip()[:60]!r}"
        arguments[match.group(1).strip()] = _value(match.group(2))
        end = match.end()
    if rest[end:].strip():
        return None, f"not an <arg_key>/<arg_value> pair: {rest[end:].strip()[:60]!r}"
    return {"name": name, "arguments": arguments}, None


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def format_calls(calls: Sequence[tuple[str, Mapping[str, Any]]]) -> str:
    """The text the model writes to make ``calls`` (what the template writes for them)."""
    return "".join(
        f"\n<tool_call>{name}\n"
        + "".join(
            f"<arg_key>{key}</arg_key>\n<arg_value>"
            + (value if isinstance(value, str) else json.dumps(value, ensure_ascii=False))
            + "</arg_value>\n"
            for key, value in dict(arguments).items()
        )
        + "</tool_call>"
        for name, arguments in calls
    ).lstrip("\n")
