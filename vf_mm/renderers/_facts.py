"""``TemplateFacts``: what a chat template does, probed once when the renderer loads.

A template is a program the renderer cannot read, only run. So it is run on probe
conversations (sentinel strings for the user and assistant text, which no real text
holds) and what comes out is kept as facts: does it render ``reasoning_content`` and
``tool_calls``, does it render an earlier turn differently once a later user query
exists (Qwen3 drops earlier reasoning), what does it write between the generation
prompt and an assistant turn's content, what does its generation prompt end with, what
does it silently drop (``vf_mm.renderers._drops``), and is it one of the ChatML
templates whose bridge text is built without running it (``vf_mm.renderers._chatml``).
A probe the template cannot render gives the answer that makes the renderer re-render
rather than bridge: the facts never claim more than was seen.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from vf_mm.errors import RenderError
from vf_mm.renderers._chatml import CHATML_END, chatml_tail, is_known_chatml
from vf_mm.renderers._drops import TemplateDrops, probe_drops
from vf_mm.renderers._parse import ARGUMENTS_AS_TEXT, arguments_as_mapping

PROBE_USER = "\ue000vf_mm user probe\ue000"
PROBE_CONTENT = "\ue000vf_mm content probe\ue000"
PROBE_REASONING = "\ue000vf_mm reasoning probe\ue000"

#: one template's render: (messages, tools, add_generation_prompt) -> text; raises
#: ``RenderError`` where the template refuses the conversation
TemplateCall = Callable[[list[dict[str, Any]], Any, bool], str]


@dataclass(frozen=True, slots=True)
class TemplateFacts:
    """What one chat template was seen to do on probes.

    ``reasoning`` / ``tool_calls``: an assistant turn's ``reasoning_content`` /
    ``tool_calls`` are written (else the completion keeps them in its content, which the
    template writes verbatim). ``history_sensitive``: an earlier turn is written
    differently once a later user query exists (or the probe could not tell), so only a
    render of the real history shows what a bridge must add. ``lead``: whitespace the
    template writes between its generation prompt and an assistant turn's content
    (SmolVLM's ``Assistant:`` then ``Assistant: ``), which the model writes itself.
    ``generation_prompt``: the ids the generation prompt ends a prompt with after a user
    turn (None: the probe could not tell). ``drops``: what the template leaves out.
    ``chatml``: one of the known ChatML templates, and its probes render exactly what
    ``chatml_tail`` builds.
    """

    reasoning: bool
    tool_calls: bool
    history_sensitive: bool
    lead: str
    generation_prompt: tuple[int, ...] | None
    drops: TemplateDrops
    chatml: bool


def probe_template(
    render: TemplateCall,
    *,
    text: object,
    encode: Callable[[list[str]], list[list[int]]],
    tool_format: str,
    placeholder: str | None,
    add_vision_id: bool,
) -> TemplateFacts:
    """The facts of one template, through ``render`` (that template's render). ``text``:
    the template's source (None or not a string where the tokenizer has none of its
    own); ``encode``: pieces of text -> their ids, without special tokens;
    ``tool_format``: the renderer's, which decides how a call reaches the template;
    ``placeholder``: the text written for an image (None for a text model);
    ``add_vision_id``: the template numbers images across the conversation."""
    call: dict[str, Any] = {
        # Kimi's template writes a call as its id alone, which names the function there
        "id": "functions.vf_mm_probe_tool:0" if tool_format == "kimi" else "c",
        "type": "function",
        "function": {"name": "vf_mm_probe_tool", "arguments": "{}"},
    }
    if tool_format not in ARGUMENTS_AS_TEXT:  # as the renderer hands calls to such a template
        call = arguments_as_mapping(call)
    reasoning, tool_calls, history_sensitive = _probe_assistant_turn(render, call)
    return TemplateFacts(
        reasoning=reasoning,
        tool_calls=tool_calls,
        history_sensitive=history_sensitive,
        lead=_probe_lead(render),
        generation_prompt=_probe_generation_prompt(render, encode),
        drops=probe_drops(
            lambda messages: render(messages, None, True), placeholder=placeholder, call=call
        ),
        chatml=_probe_chatml(render, text, add_vision_id=add_vision_id),
    )


def _probe_assistant_turn(render: TemplateCall, call: dict[str, Any]) -> tuple[bool, bool, bool]:
    """Whether an assistant turn's ``reasoning_content`` and ``tool_calls`` are written,
    and whether the turn is written differently once a later user query exists: a turn
    of calls, and a turn that answers (Kimi-K2.5's template drops the reasoning of every
    turn up to the last answer without calls, however the conversation goes on)."""
    user = {"role": "user", "content": PROBE_USER}
    assistant = {"role": "assistant", "content": PROBE_CONTENT,
                 "reasoning_content": PROBE_REASONING, "tool_calls": [call]}  # fmt: skip
    answer = {k: v for k, v in assistant.items() if k != "tool_calls"}
    query = {"role": "user", "content": PROBE_USER}
    try:
        text = render([user, assistant], None, False)
        later = render([user, assistant, query], None, True)
        answered = render([user, answer, query], None, True)
    except Exception:  # a template that cannot render the probe: assume the safe answers
        return False, False, True
    reasoning = PROBE_REASONING in text
    return (
        reasoning,
        "vf_mm_probe_tool" in text,
        # the user turn and the assistant header must come out the same either way, and
        # the reasoning the model wrote in an answer must survive the next query
        not later.startswith(text[: text.find(PROBE_CONTENT)])
        or (reasoning and PROBE_REASONING not in answered),
    )


def _probe_generation_prompt(
    render: TemplateCall, encode: Callable[[list[str]], list[list[int]]]
) -> tuple[int, ...] | None:
    """The ids the template's generation prompt ends a prompt with (after a user
    turn), None where the probe cannot tell."""
    user = {"role": "user", "content": PROBE_USER}
    try:
        with_prompt = render([user], None, True)
        without = render([user], None, False)
    except RenderError:
        return None
    if not with_prompt.startswith(without) or with_prompt == without:
        return None
    return tuple(encode([with_prompt[len(without) :]])[0])


def _probe_lead(render: TemplateCall) -> str:
    """Whitespace the template writes between its generation prompt and an assistant
    turn's content in the history: the model writes it itself, and it is not part of the
    message's content."""
    user = {"role": "user", "content": PROBE_USER}
    try:
        prompt = render([user], None, True)
        full = render([user, {"role": "assistant", "content": PROBE_CONTENT}], None, False)
    except RenderError:
        return ""
    at = full.find(PROBE_CONTENT, len(prompt))
    if not full.startswith(prompt) or at < 0:
        return ""
    lead = full[len(prompt) : at]
    return lead if lead and not lead.strip() else ""


def _probe_chatml(render: TemplateCall, text: object, *, add_vision_id: bool) -> bool:
    """Whether the template is one of the known ChatML templates and renders, on probes of
    every kind of message ``chatml_tail`` builds, exactly what it builds: a template text
    that matches but renders otherwise here (another Jinja, other settings) runs itself,
    as any other template does."""
    if not isinstance(text, str) or add_vision_id or not is_known_chatml(text):
        return False
    user = {"role": "user", "content": PROBE_USER}
    turn = {"role": "assistant", "content": " sampled,\n with <b>marks</b> "}
    probes: list[list[dict[str, Any]]] = [
        [{"role": "user", "content": "next?\n "}],
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "a"},
                                      {"type": "video"}, {"type": "text", "text": " b\n"}]}],
        [{"role": "tool", "content": "{\"x\": 1}"}, {"role": "system", "content": ""},
         {"role": "user", "content": [{"type": "text", "text": "t", "image_url": None}]}],
    ]  # fmt: skip
    try:
        prompt = render([user], None, True)
        for new in probes:
            full = render([user, turn, *new], None, True)
            sampled = turn["content"] + CHATML_END
            tail = chatml_tail(turn, new, sampled)
            if tail is None or full != prompt + sampled + tail:
                return False
    except RenderError:
        return False
    return True
