"""``ChatTemplateRenderer``: messages -> exact token ids with the checkpoint's own chat template.

Rendering: the chat template renders the conversation to text with one image pad
token per image; the text is split at those pads, the pieces are tokenized, and each
image's pad is expanded to the image's token count. This equals what the HF processor
does (template, then one tokenizer pass over the text with pads expanded): image pads
and the vision start/end markers around them are added tokens, at which the tokenizer
splits its input anyway, so tokenizing piece by piece changes nothing.

Bridging (``bridge_to_next_turn``) is ``vf_mm.renderers._bridge``'s: the next turn's
prompt is the previous prompt, the sampled completion verbatim and what the template
writes after it; None, with the reason counted in ``bridge_refusals`` and passed to
``on_refusal``, wherever the result might differ from a full render. What each template
does (whether it renders reasoning, rewrites earlier turns, drops content) is probed
once at load into ``TemplateFacts`` (``vf_mm.renderers._facts``).
"""

from __future__ import annotations

import functools
import re
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from vf_mm.errors import RenderError, ReservedTokenError
from vf_mm.models import VIDEO_FAMILIES
from vf_mm.renderers._bridge import Refusal, TurnBridge
from vf_mm.renderers._drops import refuse_dropped
from vf_mm.renderers._facts import TemplateFacts, probe_template
from vf_mm.renderers._kimi import typescript_tools
from vf_mm.renderers._parse import (
    ARGUMENTS_AS_TEXT,
    REASONING_END,
    TOOL_FORMATS,
    ParsedResponse,
    arguments_as_mapping,
    format_tool_calls,
    parse_text,
)
from vf_mm.renderers._vision import ProcessedImage, VisionSpec
from vf_mm.types import MultiModalData, PlaceholderRange, RenderedTokens

_IMAGE_TYPES = ("image", "image_url")
_VIDEO_TYPES = ("video", "video_url")
_PART_TYPES = ("text", "image", "image_url", "video", "video_url")


class ChatTemplateRenderer:
    """Renders with a Hugging Face tokenizer's chat template.

    One concept: messages to exact token ids through one chat template and back (render,
    bridge, parse); what the template does is ``TemplateFacts``, the bridge plan is
    ``TurnBridge``, images are ``VisionSpec``'s, and what is left is the message
    preparation and tokenization every one of those calls shares.

    Expands images when ``vision`` is given (any family in
    ``vf_mm.models.VISION_FAMILIES``). Thread-safe: the tokenizer, the template and the
    image cache are shared; between calls only the bridge's probe renders and the counts of
    returned token lists are kept (``TurnBridge``), both bounded.

    Args:
        tokenizer: The Hugging Face tokenizer (with its chat template).
        vision: What images and videos need (None: a text renderer).
        name: The renderer's name (the model's, in errors and stats).
        template_kwargs: Go to the template on every render (e.g. ``enable_thinking``).
        stop_tokens: The tokens that end an assistant turn (default: the tokenizer's eos and
            the ChatML turn ends, ``<|im_end|>`` and ``<|endoftext|>``, where the vocabulary
            has them).
        content_as_parts: Give the template every string content as one text part (for
            templates that render only lists of parts, like SmolVLM's, which would drop a
            string's text without a word).
        tool_format: The model's tool-call format (``"json"``, ``"xml"`` or ``"gemma4"``,
            see ``vf_mm.renderers._parse``): ``parse_response`` reads it,
            ``format_tool_calls`` writes it, and with ``"xml"`` and ``"gemma4"`` the
            template gets each call's arguments as a mapping (those templates render
            nothing, or the JSON text verbatim, from an OpenAI-style JSON string).

    Raises:
        RenderError: The tokenizer has no chat template.
        ValueError: An unknown ``tool_format``.
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
        # what each template does, probed once: the tokenizer's, and the clip template
        self._facts: dict[str | None, TemplateFacts] = {
            t: self._probe(t) for t in {None, self._video_template}
        }
        self._bridge = TurnBridge(self)

    @property
    def is_multimodal(self) -> bool:
        return self.vision is not None

    @property
    def image_backend(self) -> str | None:
        """The image processing backend (``"pil"`` / ``"torchvision"``), None for text."""
        return self.vision.backend if self.vision is not None else None

    def _probe(self, template: str | None) -> TemplateFacts:
        """The facts of ``template`` (None: the tokenizer's), rendered as every
        conversation is, with this renderer's settings."""

        def render(messages: list[dict[str, Any]], tools: Any, prompt: bool) -> str:
            return self._template(messages, tools, prompt, template)

        return probe_template(
            render,
            text=template if template is not None else self.tokenizer.chat_template,
            encode=self._encode,
            tool_format=self.tool_format,
            placeholder=self.vision.placeholders["image"] if self.vision is not None else None,
            add_vision_id=bool(self.template_kwargs.get("add_vision_id")),
        )

    # -- render -------------------------------------------------------------------------

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
    ) -> RenderedTokens:
        """Token ids (and images' multi-modal data) for a whole conversation.

        Args:
            messages: The conversation.
            tools: Tool schemas (OpenAI format) for the template.
            add_generation_prompt: End with the assistant turn's opening.

        Raises:
            RenderError: Messages the template or processor cannot turn into tokens.
            ReservedTokenError: Text holding a token reserved for images and videos.
            ImageError: An image that cannot be loaded (``VideoError`` for a video).
        """
        template_messages, parts = self._prepare(messages)
        template = self._template_for(any(m == "video" for _, _, m in parts))
        refuse_dropped(self._facts[template].drops, template_messages, name=self.name or "this model",
                       after_call=False)  # fmt: skip
        text = self._template(template_messages, tools, add_generation_prompt, template)
        rendered = self._tokenize(text, parts, base=0)
        self._bridge.remember(rendered.token_ids, self._count(rendered.token_ids))
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
        """The next turn's prompt, built on the previous turn's tokens; None to re-render.

        The reason for a None is counted in ``bridge_refusals`` and passed to ``on_refusal``.

        Args:
            previous_prompt_ids: The previous turn's prompt token ids.
            previous_completion_ids: The previous turn's sampled token ids.
            new_messages: The messages after the previous turn's assistant message.
            tools: Tool schemas, as for ``render``.
            previous_multi_modal_data: The previous prompt's sidecar (never mutated).
            previous_messages: The previous prompt and the assistant message made from the
                completion: lets a template that rewrites earlier turns
                (``history_sensitive``, e.g. Qwen3 dropping earlier reasoning) be checked on
                the real history; without them such a template is not bridged across a new
                user query once any turn so far holds reasoning.
            on_refusal: Called with the reason when the bridge refuses.
        """
        out = self._bridge.build(
            previous_prompt_ids,
            previous_completion_ids,
            new_messages,
            tools,
            previous_multi_modal_data,
            previous_messages,
        )
        if isinstance(out, Refusal):
            with self._lock:
                _count_reason(self.bridge_refusals, out.reason)
            if on_refusal is not None:
                on_refusal(out.reason)
            return None
        return out

    def _count(self, ids: list[int]) -> dict[tuple[int, ...], int]:
        """The embedding tokens in ``ids`` per token group."""
        return {tokens: sum(ids.count(t) for t in tokens) for tokens in self._embed_groups}

    # -- parse --------------------------------------------------------------------------

    def parse_response(self, completion_ids: Sequence[int]) -> ParsedResponse:
        """Reasoning, content and tool calls of a completion (stops at the first stop token).

        Args:
            completion_ids: The sampled token ids.
        """
        ids = list(completion_ids)
        stopped = False
        for i, token in enumerate(ids):
            if token in self.stop_token_ids:
                ids, stopped = ids[:i], True
                break
        text = self.tokenizer.decode(ids, skip_special_tokens=False)
        # the whitespace the template puts before the content is the template's, not the
        # message's: kept in the content, it would be written twice on a re-render
        facts = self._facts[None]
        lead = facts.lead if facts.lead and text.startswith(facts.lead) else ""
        parsed = parse_text(
            text[len(lead) :],
            stopped=stopped,
            keep_reasoning_in_content=not facts.reasoning,
            keep_tool_calls_in_content=not facts.tool_calls,
            tool_format=self.tool_format,
        )
        parsed.text = text
        return parsed

    def format_tool_calls(self, calls: Sequence[tuple[str, Mapping[str, Any]]]) -> str:
        """The completion text that makes ``calls`` in this model's tool-call format.

        ``parse_response`` of its tokens gives those calls back.

        Args:
            calls: ``(name, arguments)`` pairs.
        """
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

        extra: dict[str, Any] = {}
        if tools and self.tool_format == "kimi" and not self.template_kwargs.get("tools_ts_str"):
            # Kimi's own tokenizer hands its template the tools as TypeScript declarations;
            # the template's JSON fallback would be a prompt the served model never sees
            try:
                extra["tools_ts_str"] = typescript_tools(list(tools))
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                raise RenderError(
                    f"{self.name or 'this model'}: the tools cannot be declared as Kimi-K2.5's "
                    f"tokenizer declares them ({type(exc).__name__}: {exc}); pass the "
                    "declaration as template_kwargs={'tools_ts_str': ...}"
                ) from None
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
                **extra,
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
            if self.tool_format not in ARGUMENTS_AS_TEXT and message.get("tool_calls"):
                message["tool_calls"] = [arguments_as_mapping(c) for c in message["tool_calls"]]
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


def _stop_ids(tokenizer: Any, names: Sequence[str] | None) -> tuple[int, ...]:
    """The ids that end an assistant turn: the named tokens, else the tokenizer's eos and
    the ChatML turn ends (``<|im_end|>``, ``<|endoftext|>``) where the vocabulary has them."""
    vocab = tokenizer.get_vocab()
    candidates = list(names) if names is not None else [
        t for t in (getattr(tokenizer, "eos_token", None), "<|im_end|>", "<|endoftext|>") if t
    ]  # fmt: skip
    return tuple(dict.fromkeys(vocab[t] for t in candidates if t in vocab))


#: distinct refusal reasons counted apart (a reason may quote the conversation: a run of any
#: length must not keep one per rollout); the rest are counted under ``OTHER_REASONS``
MAX_REASONS = 64
OTHER_REASONS = "(other reasons)"


def _count_reason(counter: Counter[str], reason: str) -> None:
    """Count ``reason``, keeping at most ``MAX_REASONS`` distinct ones."""
    if reason not in counter and len(counter) >= MAX_REASONS:
        reason = OTHER_REASONS
    counter[reason] += 1
