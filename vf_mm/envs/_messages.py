"""Checking messages where they enter a rollout: dataset prompts, system prompts,
``env_response`` returns and tool results.

Each message is checked once, at its point of entry, against the message types in
``vf_mm.types``, so a mistake in environment code fails *that* rollout with an error
naming the method, the turn, the exact field and a hint, instead of surfacing later as a
template error, a results-store error that ends the run, or an image the model never saw.

Forms a user would reasonably write are normalised, never stringified:

- a single message dict where a list is expected becomes a one-element list;
- content that is a bare image (a PIL image, an ``(H, W, 3)`` array, encoded bytes)
  becomes one image part; a single part dict becomes a one-part list;
- inside a content list, a bare str becomes a text part and a bare image an image part.

Everything else that is not a message is refused with ``MessageError``. Inputs are never
mutated: the result is a new list of new dicts (images are shared, not copied).

Text is text (``check_text``): a ``str`` that is valid Unicode. ``bytes`` where text is
expected are refused with the fix (``.decode("utf-8")``, or the encoding they were
written in): guessing an encoding would be silently wrong for some rows; ``str(b"...")``
would render the repr. A string holding a lone surrogate (what ``errors="surrogateescape"``
makes of undecodable bytes) is refused too: no tokenizer takes it, and it would fail deep
inside one naming neither the row nor the field. Any other type (a number, None, a dict)
is refused, never ``str()``-ed.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from typing import Any, cast

from vf_mm._text import shorten
from vf_mm.errors import MessageError
from vf_mm.types import (
    IMAGE_PART_TYPES,
    VIDEO_PART_KEYS,
    VIDEO_PART_TYPES,
    Messages,
    unknown_video_key,
    video_options,
)

ROLES = ("system", "developer", "user", "assistant", "tool")
PART_TYPES = ("text", *sorted(IMAGE_PART_TYPES), *sorted(VIDEO_PART_TYPES))


def check_messages(value: Any, *, where: str) -> Messages:
    """``value`` as a list of checked, normalised messages; ``MessageError`` naming
    ``where`` (e.g. ``"gridnav.env_response returned, turn 3"``) if it is not one."""
    if isinstance(value, Mapping):
        value = [value]
    elif value is None:
        raise MessageError(
            f"{where}: None, not a list of messages",
            where=where,
            hint="return [] for no new messages",
        )
    elif not isinstance(value, (list, tuple)):
        raise MessageError(
            f"{where}: a {type(value).__name__}, not a list of messages",
            where=where,
            hint=_DECODE_HINT
            if isinstance(value, (bytes, bytearray))
            else 'return [{"role": "user", "content": ...}, ...]',
        )
    return cast(Messages, [_message(m, f"{where}, message {i}") for i, m in enumerate(value)])


def _message(message: Any, where: str) -> dict[str, Any]:
    if not isinstance(message, Mapping):
        raise MessageError(
            f"{where}: a {type(message).__name__}, not a message dict",
            where=where,
            hint='a message is {"role": ..., "content": ...}',
        )
    role = message.get("role")
    if role is None:
        raise MessageError(
            f"{where}: no 'role'", where=where, hint=f"give it one of {', '.join(ROLES)}"
        )
    if role not in ROLES:
        raise MessageError(
            f"{where}, field 'role': {role!r} is not a role",
            where=where,
            hint=did_you_mean(role, ROLES) or f"use one of {', '.join(ROLES)}",
        )
    out = dict(message)
    content = message.get("content")
    if content is None:
        if role != "assistant":
            raise MessageError(
                f"{where}, field 'content': missing or None in a {role} message",
                where=where,
                hint='use "" for an empty text',
            )
    elif isinstance(content, str):
        check_text(content, where=f"{where}, field 'content'")
    elif isinstance(content, Mapping):
        out["content"] = [_part(content, f"{where}, field 'content'")]
    elif isinstance(content, (list, tuple)):
        out["content"] = [_part(p, f"{where}, content part {i}") for i, p in enumerate(content)]
    elif is_image_value(content):
        out["content"] = [{"type": "image", "image": content}]
    else:
        raise MessageError(
            f"{where}, field 'content': a {type(content).__name__}, not text or content parts",
            where=where,
            hint='content is a str or a list of {"type": "text" | "image" | "video", ...}',
        )
    if role == "tool" and not isinstance(message.get("tool_call_id", ""), str):
        raise MessageError(f"{where}, field 'tool_call_id': must be a str", where=where)
    calls = message.get("tool_calls")
    if calls is not None and not (
        isinstance(calls, (list, tuple)) and all(isinstance(c, Mapping) for c in calls)
    ):
        raise MessageError(f"{where}, field 'tool_calls': must be a list of dicts", where=where)
    return out


def _part(part: Any, where: str) -> dict[str, Any]:
    if isinstance(part, str):
        return {"type": "text", "text": check_text(part, where=where)}
    if is_image_value(part):
        return {"type": "image", "image": part}
    if not isinstance(part, Mapping):
        raise MessageError(
            f"{where}: a {type(part).__name__}, not a content part",
            where=where,
            hint='a part is {"type": "text", "text": ...} or {"type": "image", "image": ...}',
        )
    kind = part.get("type")
    if kind not in PART_TYPES:
        raise MessageError(
            f"{where}, field 'type': {kind!r} is not a content part type",
            where=where,
            hint=did_you_mean(kind, PART_TYPES) or f"use one of {', '.join(PART_TYPES)}",
        )
    if kind == "text":
        check_text(part.get("text"), where=f"{where}, field 'text'", what="a text part")
    if kind == "image" and all(part.get(k) is None for k in ("image", "url", "path")):
        raise MessageError(
            f"{where}: an image part without an image",
            where=where,
            hint='{"type": "image", "image": PIL image | array | bytes | path}',
        )
    if kind in ("image_url", "video_url"):
        inner = part.get(kind)
        url = inner.get("url") if isinstance(inner, Mapping) else inner
        if not isinstance(url, str) or not url:
            media = kind.split("_")[0]
            raise MessageError(
                f"{where}, field '{kind}': needs a URL",
                where=where,
                hint=f'{{"type": "{kind}", "{kind}": {{"url": "data:{media}/..."}}}}',
            )
    if kind == "video" and all(part.get(k) is None for k in ("video", "url", "path")):
        raise MessageError(
            f"{where}: a video part without a video",
            where=where,
            hint='{"type": "video", "video": frames list | (T, H, W, 3) uint8 array | path}',
        )
    if kind in VIDEO_PART_TYPES:
        _video_options(part, where)
    return dict(part)


_DECODE_HINT = (
    'decode it where it is read: value.decode("utf-8"), or the encoding it was written in; '
    "vf_mm does not guess one"
)


def check_text(value: Any, *, where: str, what: str = "the text") -> str:
    """``value`` if it is text a tokenizer takes (a ``str`` of valid Unicode); else
    ``MessageError`` naming ``where`` (the row or method, the field) and the fix."""
    if isinstance(value, str):
        if not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as exc:
                char = value[exc.start]
                raise MessageError(
                    f"{where}: the text holds a lone surrogate ({char!r} at character "
                    f"{exc.start}), which is not Unicode text and no tokenizer takes",
                    where=where,
                    hint="bytes decoded with errors='surrogateescape' make these: decode the "
                    'original bytes with their encoding, e.g. raw.decode("utf-8")',
                ) from None
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        raise MessageError(
            f"{where}: {what} needs a str, not {type(value).__name__}",
            where=where,
            hint=_DECODE_HINT,
        )
    raise MessageError(
        f"{where}: {what} needs a str, not {type(value).__name__} ({shorten(repr(value), 60)})",
        where=where,
        hint="vf_mm does not str() it: convert it where the value is made, if text is "
        "what you mean",
    )


def _video_options(part: Mapping[str, Any], where: str) -> None:
    """A video part's keys are known (a misspelt option would silently change nothing) and
    its numbers positive (``fps`` and ``num_frames`` exclude each other, as in the
    processors): refused here, where the author's code made them."""
    unknown = unknown_video_key(part)
    if unknown is not None:
        raise MessageError(
            f"{where}: unknown key {unknown} in a video part",
            where=where,
            hint=f"a video part holds {', '.join(sorted(VIDEO_PART_KEYS))}",
        )
    rate = part.get("frame_rate")
    if rate is not None and not (
        isinstance(rate, (int, float)) and not isinstance(rate, bool) and math.isfinite(rate)
        and rate > 0
    ):  # fmt: skip
        raise MessageError(
            f"{where}, field 'frame_rate': must be a finite positive number, not {rate!r}",
            where=where,
        )
    try:
        video_options(part)
    except ValueError as exc:
        raise MessageError(f"{where}: {exc}", where=where) from None


def is_image_value(value: Any) -> bool:
    """A PIL image, an (H, W[, C]) array or encoded image bytes: what ``load_image`` takes."""
    from PIL import Image

    if isinstance(value, Image.Image):
        return True
    if isinstance(value, (bytes, bytearray, memoryview)):
        return True
    shape = getattr(value, "shape", None)
    return isinstance(shape, tuple) and len(shape) in (2, 3) and hasattr(value, "dtype")


def did_you_mean(value: Any, choices: tuple[str, ...], *, cutoff: float = 0.5) -> str | None:
    """``"did you mean 'x'?"`` for the choice closest to ``value`` (compared lowercased),
    or None when none is within ``cutoff`` (difflib's ratio)."""
    if not isinstance(value, str):
        return None
    close = difflib.get_close_matches(value.lower(), choices, n=1, cutoff=cutoff)
    return f"did you mean {close[0]!r}?" if close else None
