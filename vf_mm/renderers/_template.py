"""``ChatTemplateRenderer``: messages -> exact token ids with the checkpoint's own chat template.

Rendering: the chat template renders the conversation to text with one image pad
token per image; the text is split at those pads, the pieces are tokenized, and each
image's pad is expanded to the image's token count. This equals what the HF processor
does (template, then one tokenizer pass over the text with pads expanded): image pads
and the vision start/end markers around them are added tokens, at which the tokenizer
splits its input anyway, so tokenizing piece by piece changes nothing.

Bridging (``bridge_to_next_turn``): the next turn's prompt is the previous prompt, the
sampled completion tokens verbatim, the template's turn closing, and the new messages
rendered as the template would render them after that assistant turn. To know what the
template does, the renderer renders a probe conversation (sentinel strings for the user
and assistant text) with and without the new messages and compares. It returns None,
and records why (in ``bridge_refusals`` and through ``on_refusal``), whenever it cannot
guarantee the result equals a full render: an assistant message in the new messages, a
template that renders earlier turns differently once later turns exist (Qwen3's
dropping of earlier reasoning is caught this way), image pads in the previous tokens
without the multi-modal data that explains them, and so on.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import threading
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from vf_mm.errors import RenderError, ReservedTokenError
from vf_mm.models import VIDEO_FAMILIES
from vf_mm.renderers._drops import TemplateDrops, probe_drops, refuse_dropped
from vf_mm.renderers._parse import (
    REASONING_END,
    TOOL_FORMATS,
    ParsedResponse,
    format_tool_calls,
    parse_text,
)
from vf_mm.renderers._vision import ProcessedImage, VisionSpec
from vf_mm.types import MultiModalData, PlaceholderRange, RenderedTokens

#: Chat templates read line by line and known to render every message after the first as
#: ChatML, ``<|im_start|>{role}\n{body}<|im_end|>\n``, its body a string verbatim or its
#: parts in order (an image and a video as fixed text, a text part its text, nothing else
#: looked at), with nothing in one message depending on another but the first (which may
#: bring a default system message): Qwen2-VL's and Qwen2.5-VL's as published, and the
#: tiny checkpoints' rendition. By sha256 of the template text: an edited template is not
#: one of them. For these the text a bridge adds is built without running the template
#: (``_chatml_tail``), and checked against the template on probes at load.
_CHATML_TEMPLATES = frozenset(
    {
        "a0bc6f6fc7a29a80017a433e8f03a1cc1236e838a944a2d034295a60c4f2fddb",
        "3831da04f324cf8f484e320a8e0eb838c02dce973297756204d958fc4e16047e",
    }
)
_CHATML_END = "<|im_end|>"
_CHATML_IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"
_CHATML_VIDEO = "<|vision_start|><|video_pad|><|vision_end|>"
_USER = "\ue000vf_mm user probe\ue000"
_CONTENT = "\ue000vf_mm content probe\ue000"
_REASONING = "\ue000vf_mm reasoning probe\ue000"
_IMAGE_TYPES = ("image", "image_url")
_VIDEO_TYPES = ("video", "video_url")
_PART_TYPES = ("text", "image", "image_url", "video", "video_url")
# the token lists this renderer returned whose embedding tokens it counted, by their total
# length: a bridge onto one of them skips a scan of the whole previous prompt
COUNTED_TOKENS = 1 << 20


class ChatTemplateRenderer:
    """Renders with a Hugging Face tokenizer's chat template; expands images when ``vision``
    is given (any family in ``vf_mm.models.VISION_FAMILIES``). Thread-safe: the tokenizer, the template and the image cache are
    shared, nothing else is kept between calls.

    ``template_kwargs`` go to the template on every render (e.g. ``enable_thinking``).
    ``content_as_parts``: give the template every string content as one text part (for
    templates that render only lists of parts, like SmolVLM's, which would drop a
    string's text without a word). ``tool_format`` is the model's tool-call format
    (``"json"``, ``"xml"`` or ``"gemma4"``, see ``vf_mm.renderers._parse``):
    ``parse_response`` reads it, ``format_tool_calls`` writes it, and with ``"xml"`` and
    ``"gemma4"`` the template gets each call's arguments as a mapping (those templates
    render nothing, or the JSON text verbatim, from an OpenAI-style JSON string).
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        vision: VisionSpec | None = None,
        name: str = "",
        template_kwargs: Mapping[str, Any] | None = None,
        stop_tokens: Sequence[str] | None = None,
        content_as_parts: bool = False,
        tool_format: str = "json",
    ) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise RenderError(f"tokenizer {name or type(tokenizer).__name__} has no chat template")
        self.tokenizer = tokenizer
        self.vision = vision
        self.name = name
        self.template_kwargs = dict(template_kwargs or {})
        self.content_as_parts = content_as_parts
        if tool_format not in TOOL_FORMATS:
            raise ValueError(
                f"tool_format must be one of {list(TOOL_FORMATS)}, not {tool_format!r}"
            )
        self.tool_format = tool_format
        self.stop_token_ids: tuple[int, ...] = _stop_ids(tokenizer, stop_tokens)
        self.bridge_refusals: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._probe_cache: dict[str, str] = {}
        # id(list) -> (the list, its length then, its embedding tokens per token group)
        self._counted: OrderedDict[int, tuple[list[int], int, dict[tuple[int, ...], int]]] = (
            OrderedDict()
        )
        self._counted_tokens = 0
        self._plain_decode = _plain_decode(tokenizer)
        # modalities that share embedding tokens (SmolVLM's frames are images) count together
        self._embed_groups: dict[tuple[int, ...], list[str]] = {}
        for modality in vision.placeholders if vision is not None else ():
            self._embed_groups.setdefault(vision.embed_ids(modality), []).append(modality)  # type: ignore[union-attr]
        # the token that ends a reasoning block in this model's format
        self._think_end = tokenizer.convert_tokens_to_ids(REASONING_END[tool_format])
        # the template for a conversation holding a clip, where the processor switches to
        # another (SmolVLM); None: the tokenizer's own, for every conversation
        video_template = vision.video.chat_template if vision and vision.video else None
        self._video_template = video_template if video_template != tokenizer.chat_template else None
        self._facts = {t: (self._probe_template(t), self._assistant_lead(t))
                       for t in {None, self._video_template}}  # fmt: skip
        self._renders, self._lead = self._facts[None]
        self._chatml = {t: self._is_chatml(t) for t in {None, self._video_template}}
        self._drops = {t: self._probe_drops(t) for t in {None, self._video_template}}
        self._generation_prompt = {t: self._generation_prompt_ids(t)
                                   for t in {None, self._video_template}}  # fmt: skip

    @property
    def is_multimodal(self) -> bool:
        return self.vision is not None

    @property
    def image_backend(self) -> str | None:
        """The image processing backend (``"pil"`` / ``"torchvision"``), None for text."""
        return self.vision.backend if self.vision is not None else None

    def _probe_template(self, template: str | None) -> dict[str, bool]:
        """What the chat template does with an assistant turn: does it render
        ``reasoning_content`` and ``tool_calls``, and does it render an earlier turn
        differently once a later user query exists (Qwen3 drops earlier reasoning)?"""
        user = {"role": "user", "content": _USER}
        call = {
            "id": "c",
            "type": "function",
            "function": {"name": "vf_mm_probe_tool", "arguments": "{}"},
        }
        if self.tool_format != "json":  # as _prepare hands calls to such a template
            call = _arguments_as_mapping(call)
        assistant = {"role": "assistant", "content": _CONTENT, "reasoning_content": _REASONING,
                     "tool_calls": [call]}  # fmt: skip
        try:
            text = self._template([user, assistant], None, False, template)
            later = self._template(
                [user, assistant, {"role": "user", "content": _USER}], None, True, template
            )
        except Exception:  # a template that cannot render the probe: assume the safe answers
            return {"reasoning": False, "tool_calls": False, "history_sensitive": True}
        return {
            "reasoning": _REASONING in text,
            "tool_calls": "vf_mm_probe_tool" in text,
            # the user turn and the assistant header must come out the same either way
            "history_sensitive": not later.startswith(text[: text.find(_CONTENT)]),
        }

    def _generation_prompt_ids(self, template: str | None) -> list[int] | None:
        """The ids the template's generation prompt ends a prompt with (after a user
        turn), None where the probe cannot tell."""
        user = {"role": "user", "content": _USER}
        try:
            with_prompt = self._template([user], None, True, template)
            without = self._template([user], None, False, template)
        except RenderError:
            return None
        if not with_prompt.startswith(without) or with_prompt == without:
            return None
        return self._encode([with_prompt[len(without) :]])[0]

    def _probe_drops(self, template: str | None) -> TemplateDrops:
        """What the template leaves out of a conversation (``_drops``), seen on probes."""
        call = {"id": "c", "type": "function",
                "function": {"name": "vf_mm_probe_tool", "arguments": "{}"}}  # fmt: skip
        if self.tool_format != "json":
            call = _arguments_as_mapping(call)
        placeholder = self.vision.placeholders["image"] if self.vision is not None else None
        return probe_drops(
            lambda messages: self._template(messages, None, True, template),
            placeholder=placeholder,
            call=call,
        )

    def _assistant_lead(self, template: str | None) -> str:
        """Whitespace the template writes between its generation prompt and an assistant
        turn's content in the history (SmolVLM: ``Assistant:`` then ``Assistant: ``): the
        model writes it itself, and it is not part of the message's content."""
        user = {"role": "user", "content": _USER}
        try:
            prompt = self._probe_prompt(user, None, template)
            full = self._template(
                [user, {"role": "assistant", "content": _CONTENT}], None, False, template
            )
        except RenderError:
            return ""
        at = full.find(_CONTENT, len(prompt))
        if not full.startswith(prompt) or at < 0:
            return ""
        lead = full[len(prompt) : at]
        return lead if lead and not lead.strip() else ""

    # -- render -------------------------------------------------------------------------

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
    ) -> RenderedTokens:
        """Token ids (and images' multi-modal data) for a whole conversation."""
        template_messages, parts = self._prepare(messages)
        template = self._template_for(any(m == "video" for _, _, m in parts))
        refuse_dropped(self._drops[template], template_messages, name=self.name or "this model",
                       after_call=False)  # fmt: skip
        text = self._template(template_messages, tools, add_generation_prompt, template)
        rendered = self._tokenize(text, parts, base=0)
        self._remember(rendered.token_ids, self._count(rendered.token_ids))
        return rendered

    def _template_for(self, video: bool) -> str | None:
        """The template a conversation is rendered with: SmolVLM's processor renders one
        that holds a clip with its own default template (None: the tokenizer's)."""
        return self._video_template if video else None

    # -- bridge -------------------------------------------------------------------------

    def bridge_to_next_turn(
        self,
        previous_prompt_ids: Sequence[int],
        previous_completion_ids: Sequence[int],
        new_messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        previous_multi_modal_data: MultiModalData | None = None,
        previous_messages: Sequence[Mapping[str, Any]] | None = None,
        on_refusal: Callable[[str], object] | None = None,
    ) -> RenderedTokens | None:
        """The next turn's prompt, built on the previous turn's tokens; None to re-render
        (the reason is counted in ``bridge_refusals`` and passed to ``on_refusal``).

        ``previous_messages`` (the previous prompt and the assistant message made from the
        completion) lets a template that rewrites earlier turns (``history_sensitive``,
        e.g. Qwen3 dropping earlier reasoning) be checked on the real history; without
        them such a template is not bridged across a new user query once any turn so
        far holds reasoning.
        """
        out = self._bridge(
            previous_prompt_ids,
            previous_completion_ids,
            new_messages,
            tools,
            previous_multi_modal_data,
            previous_messages,
        )
        if isinstance(out, _Refusal):
            with self._lock:
                _count(self.bridge_refusals, out.reason)
            if on_refusal is not None:
                on_refusal(out.reason)
            return None
        return out

    def _bridge(
        self,
        previous_prompt_ids: Sequence[int],
        previous_completion_ids: Sequence[int],
        new_messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None,
        previous_multi_modal_data: MultiModalData | None,
        previous_messages: Sequence[Mapping[str, Any]] | None,
    ) -> RenderedTokens | _Refusal:
        reason, counts = self._bridge_refusal(
            previous_prompt_ids, previous_completion_ids, new_messages, previous_multi_modal_data
        )
        first = len(previous_messages) if previous_messages is not None else 0
        template_messages, parts = self._prepare(new_messages, first=first)
        had_video = previous_multi_modal_data is not None and bool(
            previous_multi_modal_data.mm_placeholders.get("video")
        )
        has_video = had_video or any(m == "video" for _, _, m in parts)
        template = self._template_for(has_video)
        if reason is None and template != self._template_for(had_video):
            reason = "the first clip switches the chat template (SmolVLM's processor does)"
        renders, lead = self._facts[template]
        drops = self._drops[template]
        after_call = None  # whether the sampled turn made calls: known from the history
        if previous_messages:
            last = previous_messages[-1]
            after_call = last.get("role") == "assistant" and bool(last.get("tool_calls"))
        refuse_dropped(drops, template_messages, name=self.name or "this model", first=first,
                       after_call=after_call)  # fmt: skip
        if (
            after_call is None
            and drops.tool_without_call
            and any(m.get("role") == "tool" for m in new_messages)
        ):
            reason = reason or (
                "the template writes a tool message only after the call it answers, which "
                "the bridge cannot see without previous_messages"
            )
        if reason is None and previous_messages is None and renders["history_sensitive"]:
            # without the messages only the tokens can tell: the rewrite we know of
            # (dropping earlier reasoning on a new user query) needs reasoning to drop
            reasoning = (
                self._think_end in previous_prompt_ids or self._think_end in previous_completion_ids
            )
            if reasoning and any(m.get("role") == "user" for m in new_messages):
                reason = "the template drops the reasoning of earlier turns"
            elif not _ends_with(previous_prompt_ids, self._generation_prompt[template]):
                # the model went on inside a turn (Gemma 4 after tool results): how the
                # template closes that turn depends on what follows, which only the
                # messages show
                reason = (
                    "the previous prompt ends inside a model turn, which this template "
                    "closes according to what follows: pass previous_messages"
                )
        if reason is not None:
            return _Refusal(reason)
        completion = list(previous_completion_ids)
        # reasoning the template renders from ``reasoning_content`` (Qwen3) must survive the
        # next turn; a template that does not render it (Qwen2-VL, Qwen2.5-VL) keeps the
        # ``<think>`` text inside the content, which it renders verbatim: nothing to check
        has_reasoning = renders["reasoning"] and self._think_end in completion
        # with the real history one render shows the text after the sampled turn; the
        # probe render (which names why not) only where that render does not fit
        replayed = self._replayed_tail(
            previous_messages, template_messages, tools, completion, template
        )
        tail = (
            replayed
            if replayed is not None
            else self._tail_text(template_messages, tools, has_reasoning, template)
        )
        if isinstance(tail, _Refusal):
            return tail
        if lead and previous_messages is None:
            # the template writes text between the generation prompt and the content
            # (SmolVLM: "Assistant:" then ": " + content); the model wrote it itself when
            # its completion starts with it, and then the tokens are the same
            text = self._decode(completion)
            if not text.startswith(lead):
                return _Refusal(f"the template rewrites the assistant turn (adds {lead[:40]!r})")
        # The completion ends with the stop token the template writes to close the turn
        # (or was cut off by max_tokens and needs the whole closing).
        if replayed is None and completion and completion[-1] in self.stop_token_ids:
            stop_text = self.tokenizer.convert_ids_to_tokens(completion[-1])
            if not tail.startswith(stop_text):
                return _Refusal("the completion ends with a stop token the template does not write")
            tail = tail[len(stop_text) :]
        if replayed is None and previous_messages is not None:
            replay = self._replay_refusal(
                previous_messages, template_messages, tools, completion, tail, template
            )
            if replay is not None:
                return _Refusal(replay)
        base = [*previous_prompt_ids, *completion]
        rendered = self._tokenize(tail, parts, base=len(base))
        merged = rendered.multi_modal_data
        if previous_multi_modal_data is not None and not previous_multi_modal_data.is_empty:
            merged = previous_multi_modal_data.extended(merged or MultiModalData())
        token_ids = base
        token_ids += rendered.token_ids
        if merged is not None:
            merged.validate(len(token_ids))
        if counts is not None:  # the completion holds no embedding tokens (checked)
            new = self._count(rendered.token_ids)
            self._remember(token_ids, {group: n + new[group] for group, n in counts.items()})
        return RenderedTokens(token_ids=token_ids, multi_modal_data=merged)

    def _bridge_refusal(
        self,
        prompt_ids: Sequence[int],
        completion_ids: Sequence[int],
        new_messages: Sequence[Mapping[str, Any]],
        previous: MultiModalData | None,
    ) -> tuple[str | None, dict[tuple[int, ...], int] | None]:
        """Why the bridge cannot be built from these tokens (None: it can), and the
        previous prompt's embedding tokens per token group (None for a text model)."""
        if not new_messages:
            return "no new messages", None
        stops = [i for i, t in enumerate(completion_ids) if t in self.stop_token_ids]
        if stops and stops[0] != len(completion_ids) - 1:
            return "the completion has a stop token before its end", None
        if any(m.get("role") == "assistant" for m in new_messages):
            return "an assistant message in the new messages", None
        if self.template_kwargs.get("add_vision_id"):
            return "add_vision_id numbers images across the whole conversation", None
        if self.vision is None:
            return None, None
        if not self.vision.marker_token_ids.isdisjoint(completion_ids):
            return "the completion contains image tokens", None
        counts = self._counted_in(prompt_ids)
        for tokens, modalities in self._embed_groups.items():
            covered = sum(
                r.num_embeds
                for m in modalities
                for r in (previous.mm_placeholders.get(m, ()) if previous else ())
            )
            if counts[tokens] != covered:
                return (
                    f"the previous prompt has {counts[tokens]} {' and '.join(modalities)} "
                    f"tokens but its multi-modal data covers {covered}"
                ), None
        return None, counts

    # -- embedding-token counts ---------------------------------------------------------

    def _count(self, ids: list[int]) -> dict[tuple[int, ...], int]:
        return {tokens: sum(ids.count(t) for t in tokens) for tokens in self._embed_groups}

    def _counted_in(self, ids: Sequence[int]) -> dict[tuple[int, ...], int]:
        """The embedding tokens in ``ids`` per token group. A list this renderer returned
        (a render's or bridge's ``token_ids``) and that still has the length it had then
        was counted when it was made (its new part only, for a bridge), so bridging onto
        it does not scan the whole history again: the count costs nothing at turn 200.
        Any other sequence is scanned."""
        if isinstance(ids, list):
            with self._lock:
                entry = self._counted.get(id(ids))
                if entry is not None and entry[0] is ids and entry[1] == len(ids):
                    self._counted.move_to_end(id(ids))
                    return entry[2]
        return self._count(ids if isinstance(ids, list) else list(ids))

    def _remember(self, ids: list[int], counts: dict[tuple[int, ...], int]) -> None:
        """Keep ``ids``'s counts (and the list itself, so its id names no other list while
        the entry lives), the least recently used dropped past ``COUNTED_TOKENS`` tokens in
        all: a dropped list is scanned again when bridged onto, nothing else changes."""
        if not self._embed_groups or len(ids) > COUNTED_TOKENS:
            return
        with self._lock:
            old = self._counted.pop(id(ids), None)
            if old is not None:
                self._counted_tokens -= old[1]
            self._counted[id(ids)] = (ids, len(ids), counts)
            self._counted_tokens += len(ids)
            while self._counted_tokens > COUNTED_TOKENS:
                _, (_, length, _) = self._counted.popitem(last=False)
                self._counted_tokens -= length

    def _replay_refusal(
        self,
        previous_messages: Sequence[Mapping[str, Any]],
        new_messages: list[dict[str, Any]],
        tools: Any,
        completion: list[int],
        tail: str,
        template: str | None,
    ) -> str | None:
        """With the real history: the template's render of the conversation must be the
        previous prompt's render, then exactly the sampled completion and the tail. This
        catches every rewrite of the history (Qwen3 dropping earlier reasoning: for a
        template the probe found history-sensitive, the whole history is rendered) and of
        the sampled turn (Gemma 3 and Qwen3.5 trimming its whitespace, Qwen3.5
        re-serialising tool arguments, a SmolVLM completion without the space its
        template writes: for any other template, the sampled turn alone is rendered after
        a probe user turn, which costs the same at turn 2 and turn 200)."""
        if not previous_messages or previous_messages[-1].get("role") != "assistant":
            return "the previous messages do not end with the sampled assistant message"
        if self._facts[template][0]["history_sensitive"]:  # the history may change: render it
            history, _ = self._prepare(previous_messages)
            prompt = self._template(history[:-1], tools, True, template)
            full = self._template([*history, *new_messages], tools, True, template)
        else:  # only the sampled turn can differ: render it after a probe user turn
            (turn,), _ = self._prepare(previous_messages[-1:], first=len(previous_messages) - 1)
            user = {"role": "user", "content": _USER}
            prompt = self._probe_prompt(user, tools, template)
            full = self._template([user, turn, *new_messages], tools, True, template)
        if not full.startswith(prompt):
            return "the template renders earlier turns differently once this turn is added"
        sampled = self._decode(completion) + tail
        if full[len(prompt) :] != sampled:
            return "the template renders the sampled turn differently from what was sampled"
        return None

    def _replayed_tail(
        self,
        previous_messages: Sequence[Mapping[str, Any]] | None,
        new_messages: list[dict[str, Any]],
        tools: Any,
        completion: list[int],
        template: str | None,
    ) -> str | None:
        """The text after the sampled completion, when the template's render of the real
        history (as ``_replay_refusal`` renders it) is the previous prompt's render, then
        the completion verbatim: then the bridged text equals the full render's by
        construction, and this one render replaces the probe render and the replay
        check. Only for a completion closed by a stop token: the tail then starts after
        an added token, where the tokenizer splits anyway (after a cut-off completion the
        render could continue its last word). None where it does not fit (the probe path
        then says why)."""
        if not previous_messages or previous_messages[-1].get("role") != "assistant":
            return None
        if not completion or completion[-1] not in self.stop_token_ids:
            return None
        if self._facts[template][0]["history_sensitive"]:
            history, _ = self._prepare(previous_messages)
            prompt = self._template(history[:-1], tools, True, template)
            full = self._template([*history, *new_messages], tools, True, template)
        else:
            (turn,), _ = self._prepare(previous_messages[-1:], first=len(previous_messages) - 1)
            if self._chatml[template] and not tools:
                tail = _chatml_tail(turn, new_messages, self._decode(completion))
                if tail is not None:
                    return tail
            prompt = self._probe_prompt({"role": "user", "content": _USER}, tools, template)
            full = self._template(
                [{"role": "user", "content": _USER}, turn, *new_messages], tools, True, template
            )
        sampled = self._decode(completion)
        if not full.startswith(prompt) or not full.startswith(sampled, len(prompt)):
            return None
        return full[len(prompt) + len(sampled) :]

    def _is_chatml(self, template: str | None) -> bool:
        """Whether ``template`` is one of ``_CHATML_TEMPLATES`` and renders, on probes of
        every kind of message ``_chatml_tail`` builds, exactly what it builds: a template
        text that matches but renders otherwise here (another Jinja, other settings)
        runs itself, as any other template does."""
        text = template if template is not None else self.tokenizer.chat_template
        if not isinstance(text, str) or self.template_kwargs.get("add_vision_id"):
            return False
        if hashlib.sha256(text.encode()).hexdigest() not in _CHATML_TEMPLATES:
            return False
        user = {"role": "user", "content": _USER}
        turn = {"role": "assistant", "content": " sampled,\n with <b>marks</b> "}
        probes: list[list[dict[str, Any]]] = [
            [{"role": "user", "content": "next?\n "}],
            [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "a"},
                                          {"type": "video"}, {"type": "text", "text": " b\n"}]}],
            [{"role": "tool", "content": "{\"x\": 1}"}, {"role": "system", "content": ""},
             {"role": "user", "content": [{"type": "text", "text": "t", "image_url": None}]}],
        ]  # fmt: skip
        try:
            prompt = self._template([user], None, True, template)
            for new in probes:
                full = self._template([user, turn, *new], None, True, template)
                sampled = turn["content"] + _CHATML_END
                tail = _chatml_tail(turn, new, sampled)
                if tail is None or full != prompt + sampled + tail:
                    return False
        except RenderError:
            return False
        return True

    def _tail_text(
        self,
        new_messages: list[dict[str, Any]],
        tools: Any,
        has_reasoning: bool,
        template: str | None,
    ) -> str | _Refusal:
        """What the template writes after the sampled assistant content: turn closing,
        the new messages, the generation prompt (whitespace before the content is the
        template's lead, ``_assistant_lead``)."""
        user = {"role": "user", "content": _USER}
        assistant: dict[str, Any] = {"role": "assistant", "content": _CONTENT}
        if has_reasoning:
            assistant["reasoning_content"] = _REASONING
        prompt = self._probe_prompt(user, tools, template)
        full = self._template([user, assistant, *new_messages], tools, True, template)
        if not full.startswith(prompt):
            return _Refusal("the template renders earlier turns differently once later turns exist")
        rest = full[len(prompt) :]
        at = rest.find(_CONTENT)
        if at < 0:
            return _Refusal("the template drops the assistant's content")
        before = rest[:at]
        if has_reasoning and _REASONING not in before:
            return _Refusal("the template drops the reasoning of earlier turns")
        if not has_reasoning and before.strip():
            return _Refusal(f"the template rewrites the assistant turn (adds {before[:40]!r})")
        return rest[at + len(_CONTENT) :]

    def _probe_prompt(self, user: dict[str, Any], tools: Any, template: str | None) -> str:
        used = template if template is not None else self.tokenizer.chat_template
        key = f"{hash(used)}:{json.dumps(tools, sort_keys=True, default=str)}"
        with self._lock:
            cached = self._probe_cache.get(key)
        if cached is None:
            cached = self._template([user], tools, True, template)
            with self._lock:
                if len(self._probe_cache) >= _MAX_PROBES:  # tools that vary by rollout
                    self._probe_cache.pop(next(iter(self._probe_cache)))
                self._probe_cache[key] = cached
        return cached

    # -- parse --------------------------------------------------------------------------

    def parse_response(self, completion_ids: Sequence[int]) -> ParsedResponse:
        """Reasoning, content and tool calls of a completion (stops at the first stop token)."""
        ids = list(completion_ids)
        stopped = False
        for i, token in enumerate(ids):
            if token in self.stop_token_ids:
                ids, stopped = ids[:i], True
                break
        text = self.tokenizer.decode(ids, skip_special_tokens=False)
        # the whitespace the template puts before the content is the template's, not the
        # message's: kept in the content, it would be written twice on a re-render
        lead = self._lead if self._lead and text.startswith(self._lead) else ""
        parsed = parse_text(
            text[len(lead) :],
            stopped=stopped,
            keep_reasoning_in_content=not self._renders["reasoning"],
            keep_tool_calls_in_content=not self._renders["tool_calls"],
            tool_format=self.tool_format,
        )
        parsed.text = text
        return parsed

    def format_tool_calls(self, calls: Sequence[tuple[str, Mapping[str, Any]]]) -> str:
        """The completion text that makes ``calls`` (``(name, arguments)`` pairs) in this
        model's tool-call format: ``parse_response`` of its tokens gives those calls back."""
        return format_tool_calls(calls, tool_format=self.tool_format)

    # -- internals ----------------------------------------------------------------------

    def _template(
        self,
        messages: list[dict[str, Any]],
        tools: Any,
        add_generation_prompt: bool,
        template: str | None = None,
    ) -> str:
        from jinja2 import TemplateError

        if self.content_as_parts:
            messages = [
                {**m, "content": [{"type": "text", "text": m["content"]}]}
                if isinstance(m.get("content"), str)
                else m
                for m in messages
            ]
        try:
            return self.tokenizer.apply_chat_template(
                messages,
                tools=list(tools) if tools else None,
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
                chat_template=template,
                **self.template_kwargs,
            )
        except (TemplateError, TypeError, ValueError) as exc:
            # the template's own raise_exception, a bad template, or content it cannot
            # handle (a non-string text, no messages)
            raise RenderError(
                f"the chat template of {self.name or 'this model'} refused the conversation: "
                f"{type(exc).__name__}: {exc}"
            ) from exc

    def _prepare(
        self, messages: Sequence[Mapping[str, Any]], *, first: int = 0
    ) -> tuple[list[dict[str, Any]], list[tuple[str, Any, str]]]:
        """Messages for the template (image and video parts reduced to ``{"type": "image"}``
        / ``{"type": "video"}``, so no pixels reach Jinja) and those parts in conversation
        order, with where they are and their modality. ``first``: the conversation index
        of ``messages[0]`` (new messages of a bridge), so errors name the message a user
        sees in the conversation."""
        out: list[dict[str, Any]] = []
        parts: list[tuple[str, Any, str]] = []
        for i, message in enumerate(messages, start=first):
            if not isinstance(message.get("role"), str):
                raise RenderError(f"message {i} has no role (a string: user, assistant, ...)")
            if self.vision is not None:
                self._refuse_reserved(message, i)
            content = message.get("content")
            if isinstance(content, Mapping):  # one part given without its list
                content = [content]
                message = {**message, "content": content}
            if isinstance(content, list):
                new_content: list[Any] = []
                for j, part in enumerate(content):
                    # the shorthand forms every template reads the same way: a bare string
                    # and an untyped {"text": ...} are text parts
                    if isinstance(part, str):
                        part = {"type": "text", "text": part}
                    elif isinstance(part, Mapping) and "type" not in part and "text" in part:
                        part = {**part, "type": "text"}
                    if not isinstance(part, Mapping) or part.get("type") not in _PART_TYPES:
                        kind = (
                            part.get("type") if isinstance(part, Mapping) else type(part).__name__
                        )
                        raise RenderError(
                            f"message {i}, part {j}: unknown content part {kind!r} (parts are "
                            f"{', '.join(_PART_TYPES)})"
                        )
                    kind = part.get("type")
                    if kind in _IMAGE_TYPES or kind in _VIDEO_TYPES:
                        modality = "image" if kind in _IMAGE_TYPES else "video"
                        if self.vision is None:
                            raise RenderError(
                                f"message {i}, part {j}: {self.name or 'this model'} has no vision "
                                f"input, but the message holds {'an image' if modality == 'image' else 'a video'}"
                            )
                        if modality == "video" and self.vision.video is None:
                            raise RenderError(
                                f"message {i}, part {j}: {self.name or 'this model'} renders no "
                                f"video here (video is rendered for {', '.join(VIDEO_FAMILIES)}, "
                                "with the renderer loaded from the checkpoint directory)"
                            )
                        parts.append((f"message {i}, part {j}", part, modality))
                        new_content.append({"type": modality})
                    else:
                        new_content.append(part)
                message = {**message, "content": new_content}
            else:
                message = dict(message)
            if self.tool_format != "json" and message.get("tool_calls"):
                message["tool_calls"] = [_arguments_as_mapping(c) for c in message["tool_calls"]]
            out.append(message)
        return out, parts

    def _refuse_reserved(self, message: Mapping[str, Any], index: int) -> None:
        """A message whose text holds a reserved token literally (``<image>``,
        ``<|video_pad|>``, ...) is refused, naming the message, its role, the field and
        the token: the template writes one placeholder per image and video part itself,
        and a literal one would be an image or video no input explains."""
        vision = self.vision
        assert vision is not None
        for field, text in _message_texts(message):
            token = vision.reserved_in(text)
            if token is not None:
                raise ReservedTokenError(
                    f"message {index} ({message.get('role')}), {field}: the text holds {token} "
                    f"literally, a placeholder {vision.family_label} reserves for images and "
                    "videos (its template writes one for each image or video part): remove it "
                    "from the text, and give the image or video as a content part (or a "
                    "dataset row's image/video column)",
                    token=token,
                )

    def _encode(self, pieces: list[str]) -> list[list[int]]:
        """Each piece's ids, without special tokens: what ``tokenizer(pieces,
        add_special_tokens=False)`` gives. A fast tokenizer's Rust backend is called
        directly, one piece at a time (a bridge's pieces are short: the Python wrapper
        around them cost more than the tokenizing; ``encode_batch`` hands them to a thread
        pool, which costs more again), unless the backend is set to truncate,
        pad or split special tokens (state a caller may have left on a shared tokenizer),
        in which case the tokenizer's own call applies its settings as it always does."""
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if (
            backend is None
            or backend.truncation is not None
            or backend.padding is not None
            or backend.encode_special_tokens
            or getattr(self.tokenizer, "split_special_tokens", False)
        ):
            return [
                list(ids) for ids in self.tokenizer(pieces, add_special_tokens=False)["input_ids"]
            ]
        return [backend.encode(piece, add_special_tokens=False).ids for piece in pieces]

    def _decode(self, ids: list[int]) -> str:
        """``tokenizer.decode(ids, skip_special_tokens=False)``. For a transformers fast
        tokenizer whose class keeps the library's own decoding and that does not clean up
        spaces afterwards, that is exactly its Rust backend's decode, called directly (the
        wrapper costs more than decoding one completion)."""
        if self._plain_decode and self.tokenizer.clean_up_tokenization_spaces is False:
            return self.tokenizer.backend_tokenizer.decode(ids, skip_special_tokens=False)
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def _tokenize(
        self, text: str, parts: list[tuple[str, Any, str]], *, base: int
    ) -> RenderedTokens:
        if self.vision is None:
            (ids,) = self._encode([text])
            return RenderedTokens(token_ids=ids, multi_modal_data=None)
        placeholders = self.vision.placeholders
        found = _split_placeholders(text, placeholders)
        pieces = found[0::2]
        written = found[1::2]
        wanted = [modality for _, _, modality in parts]
        if any(written.count(m) != wanted.count(m) for m in placeholders):
            # text holding a placeholder was refused by _prepare: the template itself
            # dropped or repeated an item (Gemma 3's drops a system message's images)
            counts = ", ".join(
                f"{written.count(m)} {placeholders[m]} for {wanted.count(m)} {m}s"
                for m in placeholders
                if written.count(m) or wanted.count(m)
            )
            raise RenderError(
                f"the {self.vision.family_label} chat template wrote placeholders that do not "
                f"match the images and videos ({counts}): it drops or repeats an image or "
                "video of these messages (one in a message of a role it does not render "
                "with images?)"
            )
        # each modality's placeholders take its items in order, as the processors pair them
        # (LLaVA-OneVision's template writes a message's images before its videos)
        queues = {m: [(w, p) for w, p, mm in parts if mm == m] for m in placeholders}
        items: list[ProcessedImage] = []
        for modality in written:
            w, part = queues[modality].pop(0)
            process = self.vision.process if modality == "image" else self.vision.process_video
            items.append(process(part, where=w))
        # the text the processor puts around an item's span joins the prompt text beside it
        for k, item in enumerate(items):
            pieces[k] += item.text_before
            pieces[k + 1] = item.text_after + pieces[k + 1]
        encoded = self._encode(pieces)
        reserved = self.vision.reserved_token_ids
        for piece in encoded:
            if not reserved.isdisjoint(piece):
                token = self.tokenizer.convert_ids_to_tokens(
                    next(t for t in piece if t in reserved)
                )
                raise ReservedTokenError(
                    f"the text holds {token} literally: {self.vision.family_label} reserves it "
                    "for images (or videos) the renderer expands itself",
                    token=str(token),
                )
        ids = list(encoded[0])
        data = MultiModalData()
        for item, piece in zip(items, encoded[1:], strict=True):
            m = item.modality
            data.mm_hashes.setdefault(m, []).append(item.hash)
            data.mm_placeholders.setdefault(m, []).append(
                PlaceholderRange(base + len(ids), item.num_tokens, item.is_embed)
            )
            data.mm_items.setdefault(m, []).append(item.item)
            ids.extend(item.tokens)
            ids.extend(piece)
        return RenderedTokens(token_ids=ids, multi_modal_data=data)


def _chatml_tail(
    turn: Mapping[str, Any], new_messages: Sequence[Mapping[str, Any]], sampled: str
) -> str | None:
    """What one of ``_CHATML_TEMPLATES`` writes after the sampled assistant ``turn`` (its
    text ``sampled``, closed by ``<|im_end|>``): the rest of its closing line, each new
    message, the generation prompt. None where the template might not write this (an
    assistant turn with anything but text, a sampled text other than the turn's, content
    or parts of other forms), and the template itself runs."""
    content = turn.get("content")
    present = {k for k, v in turn.items() if v is not None}
    if present - {"role", "content"} or not isinstance(content, str):
        return None
    if sampled != content + _CHATML_END:
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
        out.append(f"<|im_start|>{message['role']}\n{body}{_CHATML_END}\n")
    out.append("<|im_start|>assistant\n")
    return "".join(out)


def _ends_with(ids: Sequence[int], suffix: list[int] | None) -> bool:
    """Whether ``ids`` end with ``suffix`` (None, an unknown suffix: assume they do)."""
    if suffix is None:
        return True
    return len(ids) >= len(suffix) and list(ids[len(ids) - len(suffix) :]) == suffix


def _message_texts(message: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Every text of ``message`` a template may write, with the field it is in: the
    content (a string, or its text parts), and any other string the message holds
    (reasoning, tool calls and their arguments, names), however deep."""
    out: list[tuple[str, str]] = []
    for key, value in message.items():
        if key == "role":
            continue
        if key == "content" and isinstance(value, (list, Mapping)):
            for j, part in enumerate(value if isinstance(value, list) else [value]):
                if isinstance(part, str):
                    out.append((f"content part {j}", part))
                elif isinstance(part, Mapping) and isinstance(part.get("text"), str):
                    out.append((f"content part {j}", part["text"]))
            continue
        stack: list[Any] = [value]
        while stack:
            item = stack.pop()
            if isinstance(item, str):
                out.append((f"field {key!r}", item))
            elif isinstance(item, Mapping):
                stack.extend(item.values())
            elif isinstance(item, (list, tuple)):
                stack.extend(item)
    return out


def _plain_decode(tokenizer: Any) -> bool:
    """Whether ``tokenizer.decode(ids, skip_special_tokens=False)`` is its Rust backend's
    decode and nothing else while ``clean_up_tokenization_spaces`` is off (checked at each
    call: it is a setting a caller may change): a transformers fast tokenizer whose class
    overrides neither ``decode`` nor ``_decode``."""
    try:
        from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast
    except ImportError:  # pragma: no cover - transformers is a dependency
        return False
    kind = type(tokenizer)
    return (
        isinstance(tokenizer, PreTrainedTokenizerFast)
        and getattr(tokenizer, "backend_tokenizer", None) is not None
        and kind.decode is PreTrainedTokenizerBase.decode
        and kind._decode is PreTrainedTokenizerFast._decode
    )


def _split_placeholders(text: str, placeholders: Mapping[str, str]) -> list[str]:
    """``text`` split at every placeholder: text, modality, text, modality, ..., text."""
    pattern, by_token = _placeholder_pattern(tuple(placeholders.items()))
    split = pattern.split(text)
    return [piece if k % 2 == 0 else by_token[piece] for k, piece in enumerate(split)]


@functools.lru_cache(maxsize=32)
def _placeholder_pattern(
    placeholders: tuple[tuple[str, str], ...],
) -> tuple[re.Pattern[str], dict[str, str]]:
    """The compiled split of ``_split_placeholders`` (built once per set of placeholders:
    it runs on every render and bridge) and each placeholder's modality."""
    by_token = {token: modality for modality, token in placeholders}
    alternatives = "|".join(re.escape(t) for t in sorted(by_token, key=len, reverse=True))
    return re.compile(f"({alternatives})"), by_token


def _arguments_as_mapping(call: Any) -> Any:
    """An OpenAI-style call whose ``function.arguments`` is a JSON object string, with the
    arguments as that object (what a template that iterates arguments needs)."""
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


def _stop_ids(tokenizer: Any, names: Sequence[str] | None) -> tuple[int, ...]:
    """The ids that end an assistant turn: the named tokens, else the tokenizer's eos and
    the ChatML turn ends (``<|im_end|>``, ``<|endoftext|>``) where the vocabulary has them."""
    vocab = tokenizer.get_vocab()
    candidates = list(names) if names is not None else [
        t for t in (getattr(tokenizer, "eos_token", None), "<|im_end|>", "<|endoftext|>") if t
    ]  # fmt: skip
    return tuple(dict.fromkeys(vocab[t] for t in candidates if t in vocab))


class _Refusal:
    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


#: distinct refusal reasons counted apart (a reason may quote the conversation: a run of any
#: length must not keep one per rollout); the rest are counted under ``OTHER_REASONS``
MAX_REASONS = 64
OTHER_REASONS = "(other reasons)"
#: prefix probes kept, one per (template, tools): a few, unless tools vary by rollout
_MAX_PROBES = 64


def _count(counter: Counter[str], reason: str) -> None:
    """Count ``reason``, keeping at most ``MAX_REASONS`` distinct ones."""
    if reason not in counter and len(counter) >= MAX_REASONS:
        reason = OTHER_REASONS
    counter[reason] += 1
