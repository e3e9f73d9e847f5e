"""Kimi-K2.5's tool calls: one section per turn, ``<|tool_calls_section_begin|>``, then per
call ``<|tool_call_begin|>ID<|tool_call_argument_begin|>ARGUMENTS<|tool_call_end|>``, then
``<|tool_calls_section_end|>``.

The template writes a call as its ``id`` and its arguments (a string verbatim, a mapping
as JSON), never its function name: Kimi's own ids carry the name
(``functions.NAME:INDEX``, the index counting the calls of the conversation), and that is
how a parser recovers it. So a parsed call keeps the id and the arguments text exactly as
the model wrote them, and the conversation re-renders to the sampled tokens.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

SECTION_BEGIN = "<|tool_calls_section_begin|>"
SECTION_END = "<|tool_calls_section_end|>"
CALL_BEGIN = "<|tool_call_begin|>"
ARGUMENTS_BEGIN = "<|tool_call_argument_begin|>"
CALL_END = "<|tool_call_end|>"
_SECTION = re.compile(
    re.escape(SECTION_BEGIN) + r"(.*?)(?:" + re.escape(SECTION_END) + r"|\Z)", re.DOTALL
)
_CALL = re.compile(re.escape(CALL_BEGIN) + r"(.*?)(?:" + re.escape(CALL_END) + r"|\Z)", re.DOTALL)
_ID = re.compile(r"\A(?:functions\.)?([^\s:]+):\d+\Z")


def split_calls(body: str) -> tuple[str, list[str]]:
    """``body``'s text before its first call section, and the inside of each call of that
    section and any later one (a call cut off by the token budget runs to the end)."""
    first = body.find(SECTION_BEGIN)
    if first < 0:
        return body, []
    raws = [
        call.group(1)
        for section in _SECTION.finditer(body, first)
        for call in _CALL.finditer(section.group(1))
    ]
    return body[:first], raws


def parse_call(raw: str) -> tuple[dict[str, Any] | None, str | None]:
    """One call's ``{"name", "id", "arguments", "arguments_text"}``, or ``(None, why it is
    malformed)``: the id must be Kimi's ``functions.NAME:INDEX`` (the only place the
    function's name is written) and the arguments one JSON object."""
    if ARGUMENTS_BEGIN not in raw:
        return None, f"no {ARGUMENTS_BEGIN} after the call's id"
    call_id, _, text = raw.partition(ARGUMENTS_BEGIN)
    match = _ID.match(call_id.strip())
    if match is None:
        return None, f"call id {call_id.strip()[:60]!r} is not functions.NAME:INDEX"
    try:
        arguments = json.loads(text)
    except json.JSONDecodeError as exc:
        return None, f"arguments are not JSON ({exc.msg})"
    if not isinstance(arguments, dict):
        return None, "arguments are not a JSON object"
    return {
        "name": match.group(1),
        "id": call_id.strip(),
        "arguments": arguments,
        "arguments_text": text,
    }, None


def format_calls(calls: Sequence[tuple[str, Mapping[str, Any]]]) -> str:
    """The section a model writes to make ``calls`` (indexed from 0 within the turn)."""
    return (
        SECTION_BEGIN
        + "".join(
            f"{CALL_BEGIN}functions.{name}:{i}{ARGUMENTS_BEGIN}"
            + json.dumps(dict(arguments), ensure_ascii=False)
            + CALL_END
            for i, (name, arguments) in enumerate(calls)
        )
        + SECTION_END
    )
