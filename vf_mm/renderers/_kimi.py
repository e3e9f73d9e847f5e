"""Kimi-K2.5's tool calls and tool declarations.

Calls: one section per turn, ``<|tool_calls_section_begin|>``, then per
call ``<|tool_call_begin|>ID<|tool_call_argument_begin|>ARGUMENTS<|tool_call_end|>``, then
``<|tool_calls_section_end|>``.

The template writes a call as its ``id`` and its arguments (a string verbatim, a mapping
as JSON), never its function name: Kimi's own ids carry the name
(``functions.NAME:INDEX``, the index counting the calls of the conversation), and that is
how a parser recovers it. So a parsed call keeps the id and the arguments text exactly as
the model wrote them, and the conversation re-renders to the sampled tokens.

Declarations: Kimi's tokenizer hands its template the tools as TypeScript function types
(``tools_ts_str``), not as JSON; ``typescript_tools`` writes them.
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


# -- tool declarations --------------------------------------------------------------------

# the JSON Schema keywords a declaration states as a constraint comment, by schema type
_CONSTRAINTS = {
    "string": ("maxLength", "minLength", "pattern"),
    "number": ("maximum", "minimum"),
    "integer": ("maximum", "minimum"),
    "array": ("maxItems", "minItems"),
}
_TYPE_NAMES = {"string": "string", "number": "number", "integer": "number", "boolean": "boolean",
               "null": "null", "object": "{}", "array": "Array<any>"}  # fmt: skip
_STEP = "  "


def typescript_tools(tools: Sequence[Mapping[str, Any]]) -> str:
    """The tools as Kimi-K2.5's tokenizer declares them to its template (``tools_ts_str``):
    a ``functions`` namespace of TypeScript function types, each parameter with its
    description, constraints and default as ``//`` comments, required parameters first
    (each group by name). OpenAI-style ``{"type": "function", "function": {...}}`` entries
    and bare function specs are declared; other tool types are left out, as the tokenizer
    leaves them. Schemas with ``$ref`` / ``$defs`` are refused (``ValueError``): their
    interfaces are not written here."""
    functions = []
    for tool in tools:
        if tool.get("type") and tool.get("type") != "function":
            continue
        spec = tool["function"] if isinstance(tool.get("function"), Mapping) else tool
        if not spec:
            continue
        lines = []
        if spec.get("description"):
            lines.append(_comment(spec["description"], ""))
        params = _object(spec.get("parameters") or {}, "")
        lines.append(f"type {spec.get('name', 'function')} = (_: {params}) => any;")
        functions.append("\n".join(lines))
    if not functions:
        return ""
    return "# Tools\n\n## functions\nnamespace functions {\n" + "\n".join(functions) + "\n}\n"


def _comment(text: str, indent: str) -> str:
    """``text`` as ``//`` comment lines at ``indent`` (a blank line stays blank)."""
    return "\n".join(f"{indent}// {line}" if line else "" for line in text.split("\n"))


def _type(schema: Any, indent: str) -> str:
    """A JSON Schema as a TypeScript type, written at ``indent``."""
    if schema is True or schema == {}:
        return "any"
    if schema is False:
        return "null"
    if not isinstance(schema, Mapping):
        raise ValueError(f"not a JSON Schema: {schema!r}")
    if "$ref" in schema or "$defs" in schema:
        raise ValueError("a schema with $ref or $defs (declared as interfaces) is not written")
    if "anyOf" in schema:
        return " | ".join(_type(option, indent) for option in schema["anyOf"])
    if "enum" in schema:
        return " | ".join(f'"{v}"' if isinstance(v, str) else json.dumps(v) for v in schema["enum"])
    kind = schema.get("type")
    if isinstance(kind, list):
        return " | ".join(_TYPE_NAMES[k] for k in kind)
    if kind == "object":
        return _object(schema, indent)
    if kind == "array":
        item = schema.get("items") or {}
        notes = _notes(item, indent + _STEP)
        if notes:
            return f"Array<\n{notes}{indent}{_STEP}{_type(item, indent + _STEP)}\n{indent}>"
        return f"Array<{_type(item, indent)}>"
    if kind is None:
        raise ValueError(f"a schema without a type: {dict(schema)!r}")
    return "number" if kind == "integer" else str(kind)


def _object(schema: Mapping[str, Any], indent: str) -> str:
    inner = indent + _STEP
    properties = schema.get("properties") or {}
    required = set(schema.get("required") or ())
    names = sorted(n for n in properties if n in required) + sorted(
        n for n in properties if n not in required
    )
    fields = []
    for name in names:
        prop = properties[name]
        notes = _notes(prop, inner)
        default = prop.get("default") if isinstance(prop, Mapping) else None
        if default is not None:
            notes += f"{inner}// Default: {json.dumps(default, ensure_ascii=False)}\n"
        optional = "" if name in required else "?"
        fields.append(f"{notes}{inner}{name}{optional}: {_type(prop, inner)}")
    extra = schema.get("additionalProperties")
    if extra is not None:
        value = {True: "any", False: "never"}.get(extra) if isinstance(extra, bool) else None
        fields.append(f"{inner}[k: string]: {value or _type(extra, inner)}")
    if not fields:
        return "{}"
    return "{\n" + ",\n".join(fields) + f"\n{indent}}}"


def _notes(schema: Any, indent: str) -> str:
    """The comment lines above a value of ``schema``: its description, then its
    constraints (``// maxLength: 5, minLength: 1``), each line ending in a newline."""
    if not isinstance(schema, Mapping):
        return ""
    lines = []
    if schema.get("description"):
        lines.append(_comment(schema["description"], indent))
    kind = schema.get("type")
    keys = () if "anyOf" in schema or "enum" in schema or not isinstance(kind, str) else (
        _CONSTRAINTS.get(kind, ())
    )  # fmt: skip
    present = sorted(k for k in keys if k in schema)
    if present:
        lines.append(f"{indent}// " + ", ".join(f"{k}: {schema[k]}" for k in present))
    return "".join(line + "\n" for line in lines)
