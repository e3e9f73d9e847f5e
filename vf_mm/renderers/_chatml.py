"""The ChatML templates whose bridge text is built without running them.

Chat templates read line by line and known to render every message after the first as
ChatML, ``<|im_start|>{role}\\n{body}<|im_end|>\\n``, its body a string verbatim or its
parts in order (an image and a video as fixed text, a text part its text, nothing else
looked at), with nothing in one message depending on another but the first (which may
bring a default system message): Qwen2-VL's and Qwen2.5-VL's as published, and the
tiny checkpoints' rendition. They are known by the sha256 of the template text, so an
edited template is not one of them; a template that matches is still checked against
``chatml_tail`` on probes when the renderer loads (``vf_mm.renderers._facts``), and
runs itself wherever that check fails.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

_CHATML_TEMPLATES = frozenset(
    {
        "a0bc6f6fc7a29a80017a433e8f03a1cc1236e838a944a2d034295a60c4f2fddb",
        "3831da04f324cf8f484e320a8e0eb838c02dce973297756204d958fc4e16047e",
    }
)
CHATML_END = "<|im_end|>"
_CHATML_IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"
_CHATML_VIDEO = "<|vision_start|><|video_pad|><|vision_end|>"


def is_known_chatml(template_text: str) -> bool:
    """Whether ``template_text`` is, byte for byte, one of the templates read as ChatML."""
    return hashlib.sha256(template_text.encode()).hexdigest() in _CHATML_TEMPLATES


def chatml_tail(
    turn: Mapping[str, Any], new_messages: Sequence[Mapping[str, Any]], sampled: str
) -> str | None:
    """What one of the ChatML templates writes after the sampled assistant ``turn`` (its
    text ``sampled``, closed by ``<|im_end|>``): the rest of its closing line, each new
    message, the generation prompt. None where the template might not write this (an
    assistant turn with anything but text, a sampled text other than the turn's, content
    or parts of other forms), and the template itself runs."""
    content = turn.get("content")
    present = {k for k, v in turn.items() if v is not None}
    if present - {"role", "content"} or not isinstance(content, str):
        return None
    if sampled != content + CHATML_END:
        return None
    out = ["\n"]
    for message in new_messages:
        body = message.get("content")
        if isinstance(body, list):
            texts = []
            for part in body:
                if not isinstance(part, Mapping):
                    return None
                # the templates' own tests, in their order, on the part's keys
                if part.get("type") == "image" or "image" in part or "image_url" in part:
                    texts.append(_CHATML_IMAGE)
                elif part.get("type") == "video" or "video" in part:
                    texts.append(_CHATML_VIDEO)
                elif "text" in part:
                    if not isinstance(part["text"], str):
                        return None
                    texts.append(part["text"])
            body = "".join(texts)
        elif not isinstance(body, str):
            return None
        out.append(f"<|im_start|>{message['role']}\n{body}{CHATML_END}\n")
    out.append("<|im_start|>assistant\n")
    return "".join(out)
