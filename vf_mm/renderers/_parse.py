"""Parsing a sampled completion: reasoning, content, Qwen-style tool calls.

Qwen models write tool calls as JSON inside ``<tool_call>...</tool_call>`` and
reasoning inside ``<think>...</think>``. A malformed call (bad JSON, no name,
arguments that are not an object) is reported in ``ParsedResponse.tool_call_errors``
with its raw text, never raised: the environment decides what a bad call costs.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vf_mm.types import AssistantMessage, ToolCall

_TOOL_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)


@dataclass(slots=True)
class ParsedResponse:
    """A completion split into its parts. ``message`` is what goes into the conversation."""

    content: str  # the answer alone: no reasoning, no tool call text (what an API returns)
    reasoning: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    tool_call_errors: list[str] = field(default_factory=list)
    stopped: bool = False  # ended on a stop token (not cut off by max_tokens)
    text: str = ""  # the whole decoded completion, stop token excluded
    # what the conversation's assistant message holds as content: ``content``, plus the
    # reasoning / tool call text the chat template would not render from the fields
    message_content: str | None = None

    @property
    def message(self) -> AssistantMessage:
        content = self.content if self.message_content is None else self.message_content
        msg: AssistantMessage = {"role": "assistant", "content": content}
        if self.reasoning is not None:
            msg["reasoning_content"] = self.reasoning
        if self.tool_calls:
            msg["tool_calls"] = list(self.tool_calls)
        return msg


def parse_text(
    text: str,
    *,
    stopped: bool,
    call_id_prefix: str = "call",
    keep_reasoning_in_content: bool = False,
    keep_tool_calls_in_content: bool = False,
) -> ParsedResponse:
    """Split decoded completion text into reasoning, content and tool calls.

    ``message_content`` is what goes back into the conversation, so it must re-render as
    the model wrote it: for a template that does not render ``reasoning_content`` (or
    ``tool_calls``) they stay inside it (the ``keep_*`` flags); ``content``, ``reasoning``
    and ``tool_calls`` are the parsed parts, for environments and API answers.
    """
    reasoning = None
    body = text
    if "</think>" in body:
        head, _, body = body.partition("</think>")
        reasoning = head.split("<think>", 1)[-1].strip("\n")
        body = body.lstrip("\n")
    calls: list[ToolCall] = []
    errors: list[str] = []
    first = body.find("<tool_call>")
    content = body if first < 0 else body[:first].rstrip("\n")
    if first >= 0:
        for i, match in enumerate(_TOOL_CALL.finditer(body, first)):
            raw = match.group(1).strip()
            call, error = _parse_call(raw)
            if error is not None:
                errors.append(f"tool call {i}: {error}: {raw[:200]!r}")
            else:
                assert call is not None
                calls.append(
                    {
                        "id": f"{call_id_prefix}_{i}",
                        "type": "function",
                        "function": {
                            "name": call["name"],
                            "arguments": json.dumps(call["arguments"], ensure_ascii=False),
                        },
                    }
                )
    message_content = content
    if keep_tool_calls_in_content:
        message_content = body
    if keep_reasoning_in_content and reasoning is not None:
        message_content = text[: len(text) - len(body)] + message_content
    return ParsedResponse(
        content=content,
        message_content=message_content,
        reasoning=reasoning,
        tool_calls=calls,
        tool_call_errors=errors,
        stopped=stopped,
        text=text,
    )


def format_tool_calls(calls: Sequence[tuple[str, Mapping[str, Any]]]) -> str:
    """The text a model writes to make ``calls`` (``(name, arguments)`` pairs), in the
    format ``parse_text`` reads: what a scripted policy (``check_environment``) samples."""
    return "\n".join(
        "<tool_call>\n"
        + json.dumps({"name": name, "arguments": dict(arguments)}, ensure_ascii=False)
        + "\n</tool_call>"
        for name, arguments in calls
    )


def _parse_call(raw: str) -> tuple[dict[str, Any] | None, str | None]:
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        return None, f"not JSON ({exc.msg})"
    if not isinstance(value, dict):
        return None, "not a JSON object"
    name = value.get("name")
    if not isinstance(name, str) or not name:
        return None, "no function name"
    arguments = value.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None, "arguments are a string that is not JSON"
    if not isinstance(arguments, dict):
        return None, "arguments are not a JSON object"
    return {"name": name, "arguments": arguments}, None
