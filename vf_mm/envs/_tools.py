"""``ToolEnv``: plain Python functions become tools the model can call.

Each function's JSON schema comes from its signature (parameter names, type hints,
defaults) and its docstring (the first paragraph describes the tool; ``name: text``
lines under ``Args:`` describe parameters). A parameter named ``state`` is left out of
the schema and receives the rollout's ``State`` (e.g. the image a ``zoom`` tool crops). After each model turn the environment runs
the calls it made, in order, and answers with one ``tool`` message per call. A tool
may return text, a number, JSON-able data, or images (a PIL image, an ``(H, W, 3)``
uint8 array, or a list mixing images and text): images land in the tool message as
image parts, so the model sees them on its next turn. An array is read as the
content-part path reads one (``vf_mm.images.load_image``): a float or channels-first
array is refused with how to convert it, never cast; a 2-D array is refused too (data
or a grey image: the tool says which). Text must be text (``check_text``). A call that fails (unknown tool, bad JSON arguments, the tool
raising) is answered with the error text in its tool message: the model can recover. A
tool that returns a value JSON cannot hold fails the rollout (``MessageError``): that
is a bug in the tool, not the model's move.
The rollout ends when a model turn makes no tool call: that is the ``@stop`` method
``no_tool_calls``, which a subclass redefines to change the rule (without ``@stop`` it is
no rule at all; a tool may also end the rollout by setting ``state["done"]``).
"""

from __future__ import annotations

import inspect
import json
import re
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

from vf_mm._json import to_json_value
from vf_mm.envs._env import MultiTurnEnv, State, _maybe_await, stop
from vf_mm.envs._messages import check_text
from vf_mm.errors import MessageError, ResultsError
from vf_mm.types import Messages

STATE_ARG = "state"
_JSON_TYPES: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean",
                               dict: "object", list: "array"}  # fmt: skip


def tool_schema(func: Callable[..., Any]) -> dict[str, Any]:
    """The OpenAI-style tool schema of ``func``.

    Args:
        func: A function with annotated parameters (and a docstring describing them).
    """
    doc = inspect.getdoc(func) or ""
    description, arg_docs = _parse_doc(doc)
    hints = typing.get_type_hints(func)
    properties: dict[str, Any] = {}
    required = []
    for name, param in inspect.signature(func).parameters.items():
        if param.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            continue
        if name == STATE_ARG:  # filled in by the environment, never by the model
            continue
        prop = _json_type(hints.get(name, Any))
        if name in arg_docs:
            prop["description"] = arg_docs[name]
        properties[name] = prop
        if param.default is inspect.Parameter.empty:
            required.append(name)
    return {
        "type": "function",
        "function": {
            "name": func.__name__,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }


def schema_gaps(func: Callable[..., Any]) -> list[str]:
    """What ``func``'s schema leaves the model to guess: no description, a parameter without
    a type hint or a description, an ``Args:`` entry naming no parameter (a typo)."""
    schema = tool_schema(func)["function"]
    name = schema["name"]
    gaps = [] if schema["description"] else [f"tool {name!r} has no description (a docstring)"]
    properties = schema["parameters"]["properties"]
    for param, prop in properties.items():
        if not {"type", "anyOf", "enum"} & set(prop):
            gaps.append(f"tool {name!r}: parameter {param!r} has no type hint")
        if "description" not in prop:
            gaps.append(f"tool {name!r}: parameter {param!r} is not described under Args:")
    _, documented = _parse_doc(inspect.getdoc(func) or "")
    for param in sorted(set(documented) - set(properties) - {STATE_ARG}):
        gaps.append(f"tool {name!r}: Args: describes {param!r}, which is not a parameter")
    return gaps


class ToolEnv(MultiTurnEnv):
    """A multi-turn environment whose environment turns are tool results.

    Args:
        tools: Plain functions the model may call, by their names; their schemas come from
            their signatures and docstrings (``tool_schema``).
        max_turns: The most model turns in a rollout.
        **kwargs: ``Environment``'s arguments.

    Raises:
        TypeError: A tool that is not a function.
        ValueError: A tool name the model cannot call, or two tools of one name.
    """

    def __init__(
        self, *, tools: Sequence[Callable[..., Any]], max_turns: int = 10, **kwargs: Any
    ) -> None:
        super().__init__(max_turns=max_turns, **kwargs)
        self.tool_funcs: dict[str, Callable[..., Any]] = {}
        for i, func in enumerate(tools):
            name = getattr(func, "__name__", None)
            if not callable(func) or not isinstance(name, str):
                raise TypeError(f"tools[{i}] is a {type(func).__name__}, not a function")
            if not name.isidentifier():
                raise ValueError(
                    f"tools[{i}] is named {name!r}, which the model cannot call: define it "
                    "with def and a name"
                )
            if name in self.tool_funcs:
                raise ValueError(f"two tools are named {name!r}: the model could call only one")
            self.tool_funcs[name] = func
        self.tools = [tool_schema(f) for f in self.tool_funcs.values()]

    @stop
    def no_tool_calls(self, state: State) -> bool:
        """Stop condition: the model's last message called no tool.

        Args:
            state: The rollout's state.
        """
        last = state["completion"][-1] if state["completion"] else {}
        return not last.get("tool_calls")

    async def env_response(self, messages: Messages, state: State) -> Messages:
        replies: list[dict[str, Any]] = []
        calls = cast(list[dict[str, Any]], messages[-1].get("tool_calls") or [])
        for call in calls:
            replies.append(
                {
                    "role": "tool",
                    "tool_call_id": call.get("id", ""),
                    "name": call.get("function", {}).get("name", ""),
                    "content": await self.call_tool(call, state),
                }
            )
        return cast(Messages, replies)

    async def call_tool(self, call: Mapping[str, Any], state: State) -> str | list[dict[str, Any]]:
        """Run one tool call and return its answer (the tool message's content).

        An unknown tool, arguments that are not a JSON object, or a tool that raises come back
        as an ``Error: ...`` answer the model can read and may act on. A return value the tool
        message cannot hold is the tool's bug: it raises, failing the rollout.

        Args:
            call: The OpenAI-style tool call (``{"id", "function": {"name", "arguments"}}``).
            state: The rollout's state.
        """
        function = call.get("function") or {}
        name = function.get("name")
        func = self.tool_funcs.get(name) if isinstance(name, str) else None
        if func is None:
            return f"Error: unknown tool {name!r}; available: {', '.join(self.tool_funcs)}"
        try:
            args = function.get("arguments") or {}
            if isinstance(args, str):
                args = json.loads(args) if args.strip() else {}
            if not isinstance(args, dict):
                return "Error: tool arguments must be a JSON object"
            args.pop(STATE_ARG, None)  # the model may not set it
            if STATE_ARG in inspect.signature(func).parameters:
                args[STATE_ARG] = state
            result = await _maybe_await(func(**args))
        except Exception as exc:  # the model sees the error and may try again
            return f"Error: {type(exc).__name__}: {exc}"
        if result is None and inspect.signature(func).return_annotation not in (None, "None"):
            # a forgotten return: the model would read "null" as the tool's answer
            raise MessageError(
                f"tool {name!r} returned None (turn {state.get('turn')}): a missing return?",
                where=f"tool {name!r}",
                hint="return what the model should read (a string such as 'done' when the tool "
                "has nothing to say); a tool annotated -> None sends null on purpose",
            )
        # a bad return value is the tool's bug: it fails the rollout
        return _tool_content(result, str(name))


def _tool_content(result: Any, name: str) -> str | list[dict[str, Any]]:
    """A tool's return value as tool-message content: text stays text; images (PIL, or
    an ``(H, W, C)`` array, read now so a float array is refused here naming the tool)
    and videos (a ``vf_mm.videos.Video``), and lists mixing them, text and content parts
    (``{"type": "image", ...}``, ``{"type": "video", ...}``), become parts; any
    other value is written as JSON. A value JSON cannot hold is refused, never stringified."""
    where = f"tool {name!r} returned"
    items = result if isinstance(result, (list, tuple)) else [result]
    if not any(_is_image(r) or _is_image_array(r) or _is_video(r) or _is_part(r) for r in items):
        return (
            check_text(result, where=where) if isinstance(result, str) else _json_text(result, name)
        )
    parts: list[dict[str, Any]] = []
    for item in items:
        if _is_image(item):
            parts.append({"type": "image", "image": item})
        elif _is_image_array(item):
            parts.append({"type": "image", "image": _array_image(item, name)})
        elif _is_video(item):
            parts.append({"type": "video", "video": item})
        elif _is_part(item):
            parts.append(dict(item))
        else:
            text = (
                check_text(item, where=where) if isinstance(item, str) else _json_text(item, name)
            )
            parts.append({"type": "text", "text": text})
    return parts


def _is_image_array(value: Any) -> bool:
    """An ``(H, W, C)`` array (numpy, a tensor): a picture, whatever its dtype (a float
    one is refused by ``_array_image`` with how to convert it). 2-D arrays are not taken
    for images: a tool returns grids and tables as arrays too."""
    shape = getattr(value, "shape", None)
    return isinstance(shape, tuple) and len(shape) == 3 and hasattr(value, "dtype")


def _array_image(array: Any, name: str) -> Any:
    """The array as an RGB image, read by the rule content parts follow
    (``load_image``: uint8 only, channels last); a copy, so a tool that later changes
    its array does not change what the model was shown."""
    from vf_mm.errors import ImageError
    from vf_mm.images import load_image

    try:
        return load_image(array)
    except ImageError as exc:
        raise MessageError(
            f"tool {name!r} returned an array that is not an image: {exc}",
            where=f"tool {name!r}",
        ) from None


def _is_part(value: Any) -> bool:
    """A content part, not merely a dict with a ``type`` key (a search result
    ``{"type": "text", "title": ...}`` is data, written as JSON)."""
    if not isinstance(value, Mapping):
        return False
    kind = value.get("type")
    if kind == "text":
        return isinstance(value.get("text"), str) and set(value) <= {"type", "text"}
    if kind == "image":
        return any(value.get(k) is not None for k in ("image", "url", "path"))
    if kind == "video":
        return any(value.get(k) is not None for k in ("video", "url", "path"))
    if kind in ("image_url", "video_url"):
        url = value.get(kind)
        return (isinstance(url, Mapping) and isinstance(url.get("url"), str)) or isinstance(
            value.get("url"), str
        )
    return False


def _json_text(value: Any, name: str) -> str:
    """``value`` as JSON text, by the rule results files follow (``to_json_value``: numpy
    scalars are numbers, keys must be str, no NaN); anything else fails the rollout."""
    try:
        return json.dumps(to_json_value(value, f"tool {name!r} returned"))
    except ResultsError as exc:
        shape = getattr(value, "shape", None)
        if isinstance(shape, tuple) and len(shape) == 4:  # frames, not data
            hint = ("a (T, H, W, 3) array is a clip: return vf_mm.videos.Video(frames, fps) or "
                    '{"type": "video", "video": frames, "frame_rate": fps}')  # fmt: skip
        elif isinstance(shape, tuple) and len(shape) == 2:
            hint = ("a 2-D array is data or a grey image: return array.tolist() for data, "
                    "or array[..., None] (an (H, W, 1) uint8 array) for an image")  # fmt: skip
        else:
            hint = ("return a str, a JSON-able value (convert numpy values with .tolist()), a "
                    "PIL image, a vf_mm.videos.Video, or a list of those")  # fmt: skip
        raise MessageError(str(exc), where=f"tool {name!r}", hint=hint) from None


def _is_video(value: Any) -> bool:
    """A ``vf_mm.videos.Video`` (a clip a tool made or loaded)."""
    from vf_mm.videos import Video

    return isinstance(value, Video)


def _is_image(value: Any) -> bool:
    try:
        from PIL import Image
    except ImportError:  # pragma: no cover - pillow is a dependency
        return False
    return isinstance(value, Image.Image)


def _json_type(hint: Any) -> dict[str, Any]:
    origin = typing.get_origin(hint)
    if hint in _JSON_TYPES:
        return {"type": _JSON_TYPES[hint]}
    if origin in (list, tuple, Sequence):
        args = typing.get_args(hint)
        return {"type": "array", "items": _json_type(args[0])} if args else {"type": "array"}
    if origin in (dict, Mapping):
        return {"type": "object"}
    if origin is typing.Literal:
        values = list(typing.get_args(hint))
        return {**_json_type(type(values[0])), "enum": values}
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(hint) if a is not type(None)]
        return (
            _json_type(options[0])
            if len(options) == 1
            else {"anyOf": [_json_type(a) for a in options]}
        )
    return {}


_ARGS_HEADER = re.compile(r"^\s*(?:Args|Arguments|Parameters):\s*$")
_SECTION = re.compile(r"^\s*(?:Args|Arguments|Parameters|Returns|Raises|Example|Examples):\s*$")


def _parse_doc(doc: str) -> tuple[str, dict[str, str]]:
    first = []  # the first paragraph, up to a section header even without a blank line
    for line in doc.split("\n\n", 1)[0].splitlines():
        if _SECTION.match(line):
            break
        first.append(line.strip())
    description = " ".join(first).strip()
    args: dict[str, str] = {}
    lines = doc.splitlines()
    start = next((i + 1 for i, line in enumerate(lines) if _ARGS_HEADER.match(line)), len(lines))
    indent = None  # the entries' indentation; deeper lines continue the entry above
    name = None
    for line in lines[start:]:
        if not line.strip() or _SECTION.match(line):
            break  # the section ends at a blank line or the next header (Returns:, ...)
        depth = len(line) - len(line.lstrip())
        indent = depth if indent is None else indent
        match = re.match(r"\s*(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)", line)
        if depth == indent and match:
            name = match.group(1)
            args[name] = match.group(2).strip()
        elif depth > indent and name is not None:
            args[name] = f"{args[name]} {line.strip()}".strip()
    return description, args
