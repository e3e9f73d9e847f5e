"""Parsing a sampled completion: reasoning, content, tool calls.

Qwen models write reasoning inside ``<think>...</think>`` and tool calls inside
``<tool_call>...</tool_call>``, in one of two formats (``tool_format``); Gemma 4
(``"gemma4"``) writes reasoning in a thought channel and calls in a dialect of its own
(``vf_mm.renderers._gemma4``):

- ``"json"`` (Qwen2.5-VL, Qwen3-VL): ``{"name": ..., "arguments": {...}}``;
- ``"kimi"`` (Kimi-K2.5): reasoning in ``<think>...</think>``, calls in one
  ``<|tool_calls_section_begin|>`` section, each its id (``functions.NAME:INDEX``) and its
  arguments, both kept as written (``vf_mm.renderers._kimi``);
- ``"pythonic"`` (LFM2.5-VL): reasoning in ``<think>...</think>``, calls as one Python
  list per turn between ``<|tool_call_start|>`` and ``<|tool_call_end|>``
  (``vf_mm.renderers._pythonic``);
- ``"glm"`` (GLM-4.6V): reasoning in ``<think>...</think>``, each call
  ``<tool_call>NAME`` with ``<arg_key>``/``<arg_value>`` pairs (``vf_mm.renderers._glm``);
- ``"xml"`` (Qwen3.5): ``<function=NAME>`` then one ``<parameter=P>\\nVALUE\\n</parameter>``
  per argument, then ``</function>``. The template writes string values raw, objects and
  lists as JSON and other scalars as Python's ``str`` (``True``, ``None``, ``5``), so a
  value's type is read back best-effort: JSON if it parses as JSON, ``True``/``False``/
  ``None`` as those, else the string itself. A value the template would write
  differently (``true``, ``1.50``, ``{"a":1}``) makes a full re-render differ from what
  was sampled; the renderer's bridge sees that and declines.

A malformed call (bad JSON, no name, arguments that are not an object, an XML call
without its ``<function=...>`` block) is reported in ``ParsedResponse.tool_call_errors``
with its raw text, never raised: the environment decides what a bad call costs.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vf_mm.errors import RenderError
from vf_mm.renderers import _gemma4, _glm, _kimi, _pythonic
from vf_mm.types import AssistantMessage, ToolCall

_TOOL_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)
_XML_FUNCTION = re.compile(r"\A<function=([^>\n]+)>\n?(.*?)</function>\s*\Z", re.DOTALL)
_XML_PARAMETER = re.compile(r"<parameter=([^>\n]+)>\n(.*?)\n</parameter>\n?", re.DOTALL)
_PYTHON_SCALARS = {"True": True, "False": False, "None": None}
TOOL_FORMATS = ("json", "xml", "gemma4", "pythonic", "kimi", "glm")
#: the formats whose templates write a call's OpenAI-style JSON arguments string verbatim
#: (the others are handed the arguments as a mapping: ``arguments_as_mapping``)
ARGUMENTS_AS_TEXT = ("json", "kimi")
#: the token that ends a format's reasoning
REASONING_END = {
    "json": "</think>", "xml": "</think>", "gemma4": _gemma4.CHANNEL_END, "pythonic": "</think>",
    "kimi": "</think>", "glm": "</think>",
}  # fmt: skip


@dataclass(slots=True)
class ParsedResponse:
    """A completion split into its parts. ``message`` is what goes into the conversation.

    Attributes:
        content: The answer alone: no reasoning, no tool call text (what an API returns).
        reasoning: The reasoning, when the model wrote any.
        tool_calls: The tool calls that parsed.
        tool_call_errors: Tool calls that did not parse, one message each.
        stopped: It ended on a stop token (not cut off by max_tokens).
        text: The whole decoded completion, stop token excluded.
        message_content: What the conversation's assistant message holds as content:
            ``content``, plus the reasoning / tool call text the chat template would not
            render from the fields (None: ``content``).
    """

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
    tool_format: str = "json",
) -> ParsedResponse:
    """Split decoded completion text into reasoning, content and tool calls.

    ``message_content`` is what goes back into the conversation, so it must re-render as
    the model wrote it: for a template that does not render ``reasoning_content`` (or
    ``tool_calls``) they stay inside it (the ``keep_*`` flags); ``content``, ``reasoning``
    and ``tool_calls`` are the parsed parts, for environments and API answers.
    """
    reasoning = None
    body = text
    if tool_format == "gemma4":
        reasoning, body = _gemma4.split_thought(text)
        content, raws = _gemma4.split_calls(body)
        parsed_calls = [(raw, *_gemma4.parse_call(raw)) for raw in raws]
    elif tool_format == "kimi":  # nor does Kimi-K2.5; its calls keep their ids and text
        if "</think>" in body:
            head, _, body = body.partition("</think>")
            reasoning = head.split("<think>", 1)[-1]
        content, raws = _kimi.split_calls(body)
        parsed_calls = [(raw, *_kimi.parse_call(raw)) for raw in raws]
    elif tool_format == "pythonic":  # LFM2.5-VL writes no newline around its think block
        if "</think>" in body:
            head, _, body = body.partition("</think>")
            reasoning = head.split("<think>", 1)[-1]
        content, raws = _pythonic.split_calls(body)
        parsed_calls = [(raw, *call) for raw in raws for call in _pythonic.parse_block(raw)]
    elif tool_format == "glm":  # GLM-4.6V: "<think>R</think>\nCONTENT\n<tool_call>..."
        if "</think>" in body:
            head, _, body = body.partition("</think>")
            reasoning = head.split("<think>", 1)[-1]
            body = body.lstrip("\n")
        content, raws = _glm.split_calls(body)
        parsed_calls = [(raw, *_glm.parse_call(raw)) for raw in raws]
    else:
        if "</think>" in body:
            head, _, body = body.partition("</think>")
            reasoning = head.split("<think>", 1)[-1].strip("\n")
            body = body.lstrip("\n")
        first = body.find("<tool_call>")
        content = body if first < 0 else body[:first].rstrip("\n")
        raws = [m.group(1).strip() for m in _TOOL_CALL.finditer(body, first)] if first >= 0 else []
        read = _parse_xml_call if tool_format == "xml" else _parse_call
        parsed_calls = [(raw, *read(raw)) for raw in raws]
    calls: list[ToolCall] = []
    errors: list[str] = []
    for i, (raw, call, error) in enumerate(parsed_calls):
        if error is not None:
            errors.append(f"tool call {i}: {error}: {raw[:200]!r}")
        else:
            assert call is not None
            # a format whose template writes the id and the arguments text (Kimi's) keeps
            # them as the model wrote them, so the conversation re-renders to its tokens
            calls.append(
                {
                    "id": call.get("id") or f"{call_id_prefix}_{i}",
                    "type": "function",
                    "function": {
                        "name": call["name"],
                        "arguments": call.get("arguments_text")
                        or json.dumps(call["arguments"], ensure_ascii=False),
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


def format_tool_calls(
    calls: Sequence[tuple[str, Mapping[str, Any]]], *, tool_format: str = "json"
) -> str:
    """The text a model writes to make ``calls``, in the format ``parse_text`` reads.

    What a scripted policy (``check_environment``) samples. Gemma 4's ends with the stop
    token its model closes a turn of calls with.

    Args:
        calls: ``(name, arguments)`` pairs.
        tool_format: ``"json"``, ``"xml"`` or ``"gemma4"``.
    """
    if tool_format not in TOOL_FORMATS:
        raise ValueError(f"tool_format must be one of {list(TOOL_FORMATS)}, not {tool_format!r}")
    if tool_format == "gemma4":  # the model ends a turn of calls with <|tool_response>
        text = "".join(_gemma4.format_call(name, arguments) for name, arguments in calls)
        return text + _gemma4.RESULTS_NEXT
    if tool_format == "pythonic":
        return _pythonic.format_calls(list(calls))
    if tool_format == "kimi":
        return _kimi.format_calls(list(calls))
    if tool_format == "glm":
        return _glm.format_calls(list(calls))
    if tool_format == "xml":
        return "\n".join(
            f"<tool_call>\n<function={name}>\n"
            + "".join(
                f"<parameter={key}>\n{_xml_value(value)}\n</parameter>\n"
                for key, value in dict(arguments).items()
            )
            + "</function>\n</tool_call>"
            for name, arguments in calls
        )
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


def _xml_value(value: Any) -> str:
    """A value as the Qwen3.5 template writes it (strings raw, objects and lists as JSON,
    other scalars as Jinja's ``string`` filter does: Python's ``str``)."""
    if isinstance(value, str):
        return value
    if isinstance(value, (Mapping, list, tuple)):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


def _parse_xml_call(raw: str) -> tuple[dict[str, Any] | None, str | None]:
    match = _XML_FUNCTION.match(raw)
    if match is None:
        return None, "no <function=NAME>...</function> block"
    name, body = match.group(1).strip(), match.group(2)
    if not name:
        return None, "no function name"
    arguments: dict[str, Any] = {}
    end = 0
    for parameter in _XML_PARAMETER.finditer(body):
        if body[end : parameter.start()].strip():
            return None, f"text outside a <parameter> block: {body[end : parameter.start()][:40]!r}"
        arguments[parameter.group(1).strip()] = _xml_read(parameter.group(2))
        end = parameter.end()
    if body[end:].strip():
        return None, f"text outside a <parameter> block: {body[end:][:40]!r}"
    return {"name": name, "arguments": arguments}, None


def _xml_read(text: str) -> Any:
    if text in _PYTHON_SCALARS:
        return _PYTHON_SCALARS[text]
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return text
    return text if isinstance(value, str) else value


def arguments_as_mapping(call: Any) -> Any:
    """An OpenAI-style call whose ``function.arguments`` is a JSON object string, with the
    arguments as that object (what a template that iterates arguments needs: the
    ``"xml"`` and ``"gemma4"`` formats' templates write nothing, or the JSON text
    verbatim, from a string)."""
    function = call.get("function") if isinstance(call, Mapping) else None
    if not isinstance(function, Mapping) or not isinstance(function.get("arguments"), str):
        return call
    try:
        arguments = json.loads(function["arguments"])
    except json.JSONDecodeError as exc:
        raise RenderError(
            f"tool call {function.get('name')!r}: arguments are not JSON ({exc.msg})"
        ) from None
    if not isinstance(arguments, dict):
        raise RenderError(f"tool call {function.get('name')!r}: arguments are not a JSON object")
    return {**call, "function": {**function, "arguments": arguments}}
