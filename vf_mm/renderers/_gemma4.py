"""Gemma 4's completion format: its thought channel and its tool-call dialect, read and written.

A Gemma 4 model turn is ``[<|channel>thought\\n REASONING \\n<channel|>] [CALLS] [CONTENT]``
closed by ``<turn|>`` (an answer) or ``<|tool_response>`` (after calls: the results come
next). When the prompt already opened the channel (the current revision's generation
prompt after tool results with thinking on), the completion starts inside it and holds
only its end.

Each call is ``<|tool_call>call:NAME{key:value,...}<tool_call|>`` in a dialect of its own:
keys bare, strings between ``<|"|>`` quotes (never escaped), ``true``/``false``, ``null``
(``None`` before the current revision), numbers as Python writes them, ``{...}`` and
``[...]`` nesting. The chat template writes arguments back with keys sorted, so a turn
whose model wrote them in another order re-renders differently, and the renderer's
bridge sees that and declines.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

QUOTE = '<|"|>'
CHANNEL_START = "<|channel>"
CHANNEL_END = "<channel|>"
CALL_START = "<|tool_call>"
CALL_END = "<tool_call|>"
RESULTS_NEXT = "<|tool_response>"  # what ends a turn of calls: the results come next
_CALL = re.compile(re.escape(CALL_START) + r"(.*?)(?:" + re.escape(CALL_END) + r"|\Z)", re.DOTALL)
_SCALARS: dict[str, Any] = {"true": True, "false": False, "null": None, "None": None}


def split_thought(text: str) -> tuple[str | None, str]:
    """The reasoning of a completion (the first thought channel, without its
    ``thought\\n`` name and the newline the template writes before ``<channel|>``) and
    the text after it; ``(None, text)`` where it has none."""
    if CHANNEL_END not in text:
        return None, text
    head, _, rest = text.partition(CHANNEL_END)
    if CHANNEL_START in head:
        head = head.split(CHANNEL_START, 1)[1]
        head = head.removeprefix("thought\n")
    return head.removesuffix("\n"), rest


def split_calls(body: str) -> tuple[str, list[str]]:
    """The text outside ``<|tool_call>...<tool_call|>`` blocks, and each block's inside
    (a block cut off by the token budget runs to the end)."""
    calls = [m.group(1) for m in _CALL.finditer(body)]
    return _CALL.sub("", body), calls


def parse_call(raw: str) -> tuple[dict[str, Any] | None, str | None]:
    """``call:NAME{...}`` as ``{"name", "arguments"}``, or an error naming what is wrong."""
    if not raw.startswith("call:"):
        return None, "no call:NAME{...}"
    name, brace, rest = raw[len("call:") :].partition("{")
    if not brace:
        return None, "no {...} of arguments"
    if not name.strip():
        return None, "no function name"
    try:
        arguments, end = _read_mapping("{" + rest, 0)
    except ValueError as exc:
        return None, f"arguments are not Gemma 4's dialect ({exc})"
    if ("{" + rest)[end:].strip():
        return None, f"text after the arguments: {('{' + rest)[end:][:40]!r}"
    return {"name": name.strip(), "arguments": arguments}, None


def _read_value(text: str, at: int) -> tuple[Any, int]:
    if text.startswith(QUOTE, at):
        end = text.find(QUOTE, at + len(QUOTE))
        if end < 0:
            raise ValueError("a string without its closing quote")
        return text[at + len(QUOTE) : end], end + len(QUOTE)
    if text.startswith("{", at):
        return _read_mapping(text, at)
    if text.startswith("[", at):
        items: list[Any] = []
        at += 1
        if text.startswith("]", at):
            return items, at + 1
        while True:
            item, at = _read_value(text, at)
            items.append(item)
            if text.startswith(",", at):
                at += 1
            elif text.startswith("]", at):
                return items, at + 1
            else:
                raise ValueError(f"expected , or ] at {text[at : at + 20]!r}")
    end = at
    while end < len(text) and text[end] not in ",}]":
        end += 1
    return _scalar(text[at:end]), end


def _read_mapping(text: str, at: int) -> tuple[dict[str, Any], int]:
    out: dict[str, Any] = {}
    at += 1  # the "{"
    if text.startswith("}", at):
        return out, at + 1
    while True:
        if text.startswith(QUOTE, at):  # a quoted key (the template quotes nested keys
            key, at = _read_value(text, at)  # in tool declarations, never in calls)
        else:
            colon = text.find(":", at)
            if colon < 0:
                raise ValueError(f"a key without its value at {text[at : at + 20]!r}")
            key, at = text[at:colon], colon
        if not text.startswith(":", at):
            raise ValueError(f"expected : after {key!r}")
        out[key], at = _read_value(text, at + 1)
        if text.startswith(",", at):
            at += 1
        elif text.startswith("}", at):
            return out, at + 1
        else:
            raise ValueError(f"expected , or }} at {text[at : at + 20]!r}")


def _scalar(raw: str) -> Any:
    if raw in _SCALARS:
        return _SCALARS[raw]
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        return raw
    return value if isinstance(value, (int, float)) else raw


def value_text(value: Any) -> str:
    """``value`` as the current template writes a call's argument (keys bare, sorted
    as Jinja's ``dictsort`` sorts them: case-insensitively)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return QUOTE + value + QUOTE
    if isinstance(value, Mapping):
        items = sorted(value.items(), key=lambda kv: str(kv[0]).lower())
        return "{" + ",".join(f"{k}:{value_text(v)}" for k, v in items) + "}"
    if isinstance(value, Sequence):
        return "[" + ",".join(value_text(v) for v in value) + "]"
    return str(value)


def format_call(name: str, arguments: Mapping[str, Any]) -> str:
    """One call as Gemma 4 writes it: ``<|tool_call>call:NAME{...}<tool_call|>``."""
    return f"{CALL_START}call:{name}{value_text(dict(arguments))}{CALL_END}"
