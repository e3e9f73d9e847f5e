"""What a chat template silently leaves out, found by probing it, and the refusals that follow.

Some real templates drop content without a word: Gemma 4's at b446025 and 6b7e72c write
only the text of a tool result (its images vanish), and from b446025 on a ``tool``
message that does not follow an assistant's tool call is not written at all; Gemma 3's
and Gemma 4's write no image of a system message; Gemma 4's before 6b7e72c write a system
message given as a list of parts as Python text (``[{'type': 'text', ...}]``);
Qwen3-VL-Instruct's writes no system message but the first; Gemma 3's and LLaVA-NeXT's
write only the first part of a system (LLaVA-NeXT: and assistant) message. A
renderer that passed such a conversation through would train on a prompt that lacks
what the data holds. So each template is probed once, when the renderer loads, with
conversations holding a sentinel text and an image in each of those places, and what it
was seen to drop is refused by name (``RenderError``: the message, its role, what the
template does, what to do instead) before anything is rendered. A template that cannot
render a probe at all (Gemma 3 refuses any ``tool`` message) is left to refuse the real
conversation itself. The placeholder count check after rendering stays the backstop
for images a probe did not foresee.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from vf_mm.errors import RenderError

# plain ASCII: a template that writes a list as Python text writes this one unescaped
_TEXT = "vf_mm dropped-content probe 5d1c"
_USER = {"role": "user", "content": "\ue000vf_mm user probe\ue000"}
_MEDIA = ("image", "image_url", "video", "video_url")


@dataclass(frozen=True, slots=True)
class TemplateDrops:
    """What the probes saw the template drop (None: the probe could not tell).

    ``tool_images``: an image in a tool message answering a call gets no placeholder;
    ``system_images``: an image in the (first) system message gets none;
    ``tool_without_call``: a tool message after a user message is not written, while
    one after an assistant's tool call is; ``system_parts_as_python``: a system message
    given as a list of parts is written as Python text; ``later_system``: a system
    message after the first message is not written (Qwen3-VL-Instruct's);
    ``first_part_only``: the roles whose messages are written from their first part
    alone (Gemma 3's system message, LLaVA-NeXT's system and assistant messages).
    """

    tool_images: bool | None = None
    system_images: bool | None = None
    tool_without_call: bool = False
    system_parts_as_python: bool = False
    later_system: bool = False
    first_part_only: frozenset[str] = frozenset()


def probe_drops(
    render: Callable[[list[dict[str, Any]]], str],
    *,
    placeholder: str | None,
    call: Mapping[str, Any],
) -> TemplateDrops:
    """Probe a template through ``render`` (messages -> text, with the generation
    prompt); ``placeholder`` is the text it writes for an image (None: a text model, whose
    image probes are skipped); ``call`` a tool call in the form the renderer hands the
    template (its arguments a mapping or a JSON string)."""
    text = {"type": "text", "text": _TEXT}
    image = {"type": "image"}
    called = {"role": "assistant", "content": "", "tool_calls": [call]}
    answer = {"role": "tool", "tool_call_id": call.get("id"), "name": call["function"]["name"]}

    def attempt(messages: list[dict[str, Any]]) -> str | None:
        try:
            return render(messages)
        except Exception:  # the template refuses the probe: it will refuse the real thing
            return None

    after_call = attempt([_USER, called, {**answer, "content": _TEXT}])
    after_user = attempt([_USER, {**answer, "content": _TEXT}])
    system = attempt([{"role": "system", "content": [text]}, _USER])
    later = attempt([_USER, {"role": "system", "content": _TEXT}, _USER])
    second = {"type": "text", "text": _TEXT + " second"}
    first_only = set()
    for role, messages in (
        ("system", [{"role": "system", "content": [text, second]}, _USER]),
        ("assistant", [_USER, {"role": "assistant", "content": [text, second]}, _USER]),
    ):
        out = attempt(cast(list[dict[str, Any]], messages))
        if out is not None and _TEXT in out and second["text"] not in out:
            first_only.add(role)
    tool_images = system_images = None
    if placeholder is not None:
        tool = attempt([_USER, called, {**answer, "content": [image, text]}])
        if tool is not None and _TEXT in tool:
            tool_images = placeholder not in tool
        shown = attempt([{"role": "system", "content": [text, image]}, _USER])
        if shown is not None and _TEXT in shown:
            system_images = placeholder not in shown
    return TemplateDrops(
        tool_images=tool_images,
        system_images=system_images,
        tool_without_call=(
            after_call is not None
            and _TEXT in after_call
            and after_user is not None
            and _TEXT not in after_user
        ),
        system_parts_as_python=system is not None and f"'text': '{_TEXT}'" in system,
        later_system=later is not None and _TEXT not in later,
        first_part_only=frozenset(first_only),
    )


def refuse_dropped(
    drops: TemplateDrops,
    messages: Sequence[Mapping[str, Any]],
    *,
    name: str,
    first: int = 0,
    after_call: bool | None = None,
) -> None:
    """Raise ``RenderError`` for the first message whose content the template would
    drop. ``messages`` start at conversation index ``first`` (a bridge's new messages);
    ``after_call``: whether the message before them is an assistant tool call (None:
    unknown, so a leading tool message is not judged here)."""
    follows_call = after_call
    for i, message in enumerate(messages, start=first):
        role = message.get("role")
        content = message.get("content")
        media = isinstance(content, list) and any(
            isinstance(part, Mapping) and part.get("type") in _MEDIA for part in content
        )
        where = f"message {i} ({role})"
        if role == "system" and i == 0 and isinstance(content, list):
            if drops.system_parts_as_python:
                raise RenderError(
                    f"{where} is a list of parts, which the chat template of {name} writes "
                    "as Python text ([{'type': ...}]): give the system message as a string"
                )
            if media and drops.system_images:
                raise RenderError(
                    f"{where} holds an image or video, which the chat template of {name} "
                    "drops (it writes no placeholder for it): vf_mm refuses rather than lose "
                    "it; put it in a user message"
                )
        if role in drops.first_part_only and isinstance(content, list) and len(content) > 1:
            raise RenderError(
                f"{where} has {len(content)} parts, and the chat template of {name} writes "
                f"only the first part of a {role} message (the rest would be dropped): give "
                "it one text part"
            )
        if role == "system" and i > 0 and drops.later_system:
            raise RenderError(
                f"{where} is not the first message, and the chat template of {name} writes "
                "only a system message that opens the conversation (this one would be "
                "dropped): move its text into the first system message or a user message"
            )
        if role == "tool":
            if drops.tool_without_call and follows_call is False:
                raise RenderError(
                    f"{where} does not answer an assistant tool call, and the chat template "
                    f"of {name} writes a tool message only after the call it answers (this "
                    "one would be dropped): give the assistant message its tool_calls, or "
                    "send the result as a user message"
                )
            if media and drops.tool_images:
                raise RenderError(
                    f"{where} holds an image or video, which the chat template of {name} "
                    "drops from tool results (it writes their text only): vf_mm refuses "
                    "rather than lose it; return the image in a user message, or use a "
                    "checkpoint whose template keeps images in tool results (Gemma 4: "
                    "revision 905e84b or later)"
                )
        else:
            follows_call = role == "assistant" and bool(message.get("tool_calls"))
