"""``VfMMRenderer``: vf_mm's renderer behind the ``renderers`` package's ``Renderer`` protocol.

verifiers 0.4's train client (the one prime-rl's orchestrator drives) takes its tokens
from a ``renderers`` renderer, and ``renderers``' ``custom`` config loads one by import
path, so this class is how verifiers renders with vf_mm's chat templates, bridging and
image rules::

    [renderer]                      # verifiers' TrainClientConfig.renderer, prime-rl's too
    name = "custom"
    import_path = "vf_mm.integrations.verifiers.VfMMRenderer"
    model = "/path/to/checkpoint"   # optional: default the tokenizer's own directory

Every render and bridge is vf_mm's (``vf_mm.renderers.load_renderer`` of the checkpoint),
so the token ids are the ones vf_mm's own client sends.

Images: verifiers 0.4's train client never processes images itself. A prompt holding one
is rendered with ``process_multimodal=False`` and sent as vLLM's ``content_parts`` (one
pad per image, the raw images beside it); the server expands each pad and answers with
the expanded ids and placeholder ranges. Here such a render is vf_mm's full render with
each image's placeholder range collapsed back to its one pad: the server's expansion of
it (vLLM, or ``vf-mm serve``, which expands with vf_mm's own processing) gives back
exactly vf_mm's ids, provided an image's range is a run of its pad token and nothing
else. That holds for the Qwen-VL families and LLaVA; a family whose range also holds
markers or row text (Gemma 3, Gemma 4, SmolVLM, InternVL3, Qwen3-VL's video timestamps)
is refused with ``UnsupportedModelError``, because a server writes that text on its own
side of the pad and the ids would no longer be the ones vf_mm renders.

Bridging: verifiers hands a bridge the previous turn's *collapsed* ids. Each collapsed
render or bridge is remembered (bounded, least recently used first out) with its
expanded ids and images, so the bridge runs on vf_mm's own tokens and images and
collapses its answer again; a collapsed prompt not remembered is re-rendered (None), as
the protocol allows.

Attribution: vf_mm's renderer does not attribute tokens to messages, so
``message_indices`` is empty (every span unknown): verifiers then stores a turn's new
prompt tokens on its assistant node. A branch's tokens, mask and logprobs are the same.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from renderers import MultiModalData as RMultiModalData
from renderers import ParsedResponse as RParsedResponse
from renderers import ParsedToolCall, ToolCallParseStatus
from renderers import PlaceholderRange as RPlaceholderRange
from renderers import RenderedTokens as RRenderedTokens
from renderers.configs import BaseRendererConfig

from vf_mm.errors import UnsupportedModelError
from vf_mm.inference import encode_features
from vf_mm.renderers import bridge, load_renderer
from vf_mm.types import MultiModalData, PlaceholderRange, RenderedTokens

#: collapsed prompts remembered for bridging (each with its expanded ids and images)
REMEMBERED = 4096


class VfMMRendererConfig(BaseRendererConfig):
    """The fields of ``renderers``' ``custom`` config beside ``import_path``.

    Attributes:
        model: The checkpoint directory vf_mm's renderer loads from (None: the directory
            the tokenizer was loaded from, ``tokenizer.name_or_path``, which is what
            verifiers' ``renderer_model_name`` names).
        image_backend: vf_mm's image processing (``"auto"``, ``"pil"``, ``"torchvision"``, ``"torch"``);
            the server that expands the images must process them the same way.
    """

    model: str | None = None
    image_backend: str = "auto"

    _internal_fields = frozenset({"model", "image_backend"})


class VfMMRenderer:
    """A ``renderers.Renderer`` whose every render, bridge and parse is vf_mm's.

    A ``MultimodalRenderer`` too for a vision checkpoint; see the module docstring.

    Args:
        tokenizer: The tokenizer ``renderers`` loaded.
        config: Where vf_mm's renderer loads from and how it processes images.
    """

    config_class: ClassVar[type[BaseRendererConfig]] = VfMMRendererConfig
    supports_process_multimodal: ClassVar[bool] = True
    supports_tools: ClassVar[bool] = True

    def __init__(self, tokenizer: Any, config: VfMMRendererConfig | None = None) -> None:
        self.config = config if config is not None else VfMMRendererConfig()
        model = self.config.model or getattr(tokenizer, "name_or_path", None)
        if not model:
            raise UnsupportedModelError(
                "VfMMRenderer needs the checkpoint directory: set model= in the renderer "
                "config, or load the tokenizer from the directory"
            )
        self.model = str(model)
        self.renderer: Any = load_renderer(self.model, image_backend=self.config.image_backend)
        #: a bool attribute: ``renderers.is_multimodal`` reads it before any protocol check
        self.is_multimodal: bool = bool(self.renderer.is_multimodal)
        vision = self.renderer.vision if self.is_multimodal else None
        self._pads: dict[str, int] = {}
        if vision is not None:
            self._pads["image"] = int(vision.image_token_id)
            video_id = getattr(vision, "video_token_id", None)
            if (
                vision.video is not None
                and video_id is not None
                and video_id != vision.image_token_id
            ):
                self._pads["video"] = int(video_id)
        if self.is_multimodal:
            _route_features_through_vf_mm()
        self._lock = threading.Lock()
        # collapsed prompt ids -> (expanded ids, their multi-modal data)
        self._expanded: OrderedDict[tuple[int, ...], tuple[list[int], MultiModalData | None]] = (
            OrderedDict()
        )

    # -- the protocol's properties -------------------------------------------------------

    @property
    def is_prefix_stable(self) -> bool:
        """Not promised: templates vary (Qwen3's drops earlier reasoning); vf_mm's bridge
        checks each extension itself."""
        return False

    @property
    def mm_token_type_id_map(self) -> dict[int, int]:
        """The pad each image (1) and video (2) is written as: in a collapsed prompt it
        marks where the server's placeholder ranges go; in the expanded ids it marks the
        tokens that take the item's embeddings (the whole range, for the families this
        adapter takes)."""
        return {pad: 1 if modality == "image" else 2 for modality, pad in self._pads.items()}

    def get_stop_token_ids(self) -> list[int]:
        return [int(t) for t in self.renderer.stop_token_ids]

    # -- render -------------------------------------------------------------------------

    def render(
        self,
        messages: list[Any],
        *,
        tools: list[Any] | None = None,
        add_generation_prompt: bool = False,
        process_multimodal: bool = True,
    ) -> RRenderedTokens:
        """vf_mm's render of ``messages``.

        Args:
            messages: The conversation.
            tools: Tool schemas.
            add_generation_prompt: End with the assistant turn's opening.
            process_multimodal: False collapses each image's range to its one pad (the
                ``content_parts`` form).
        """
        rendered = self.renderer.render(
            messages, tools=tools, add_generation_prompt=add_generation_prompt
        )
        return self._answer(rendered, messages, process_multimodal)

    def render_ids(
        self,
        messages: list[Any],
        *,
        tools: list[Any] | None = None,
        add_generation_prompt: bool = False,
    ) -> list[int]:
        """The token ids of ``render``.

        Args:
            messages: The conversation.
            tools: Tool schemas.
            add_generation_prompt: End with the assistant turn's opening.
        """
        return self.render(
            messages, tools=tools, add_generation_prompt=add_generation_prompt
        ).token_ids

    def bridge_to_next_turn(
        self,
        previous_prompt_ids: list[int],
        previous_completion_ids: list[int],
        new_messages: list[Any],
        *,
        tools: list[Any] | None = None,
        previous_multi_modal_data: RMultiModalData | None = None,
        process_multimodal: bool = True,
    ) -> RRenderedTokens | None:
        """vf_mm's bridge onto the previous turn.

        The previous prompt is looked up among the prompts this renderer returned (its expanded
        ids and images); one it did not return is taken as it is when it holds no pad, else
        re-rendered (None).

        Args:
            previous_prompt_ids: The previous turn's prompt ids.
            previous_completion_ids: The previous turn's sampled ids.
            new_messages: The messages after the previous turn's assistant message.
            tools: Tool schemas.
            previous_multi_modal_data: The previous prompt's multi-modal data.
            process_multimodal: False collapses each image's range to its one pad (the
                ``content_parts`` form).
        """
        previous = [int(t) for t in previous_prompt_ids]
        remembered = self._lookup(previous)
        if remembered is not None:
            expanded, data = remembered
        elif previous_multi_modal_data is not None and not previous_multi_modal_data.is_empty():
            expanded, data = previous, _from_renderers(previous_multi_modal_data)
        elif any(t in self._pads.values() for t in previous):
            return None  # pads whose images this renderer cannot name: render again
        else:
            expanded, data = previous, None
        bridged = bridge(
            self.renderer,
            expanded,
            [int(t) for t in previous_completion_ids],
            new_messages,
            tools=tools,
            previous_multi_modal_data=data,
        )
        if bridged is None:
            return None
        return self._answer(bridged, new_messages, process_multimodal)

    # -- parse --------------------------------------------------------------------------

    def parse_response(
        self,
        token_ids: list[int],
        *,
        tools: list[Any] | None = None,
        prompt_ids: list[int] | None = None,
    ) -> RParsedResponse:
        """vf_mm's parse of a completion (reasoning, content, tool calls).

        A call vf_mm could not read comes back as a malformed attempt, its raw text kept.

        Args:
            token_ids: The sampled ids.
            tools: Tool schemas (not needed: vf_mm's renderer knows the format).
            prompt_ids: The prompt's ids (not needed).
        """
        parsed = self.renderer.parse_response(list(token_ids))
        calls = [
            ParsedToolCall(
                raw=str(call["function"].get("arguments", "")),
                name=call["function"]["name"],
                arguments=call["function"].get("arguments"),
                status=ToolCallParseStatus.OK,
                id=call.get("id"),
            )
            for call in parsed.tool_calls
        ]
        calls += [
            ParsedToolCall(raw=error, status=ToolCallParseStatus.MALFORMED_STRUCTURE)
            for error in parsed.tool_call_errors
        ]
        content = parsed.content if parsed.message_content is None else parsed.message_content
        return RParsedResponse(
            content=content,
            reasoning_content=parsed.reasoning,
            tool_calls=calls,
            reasoning_complete=None,
        )

    # -- internals ----------------------------------------------------------------------

    def _answer(
        self, rendered: RenderedTokens, messages: Sequence[Any], process_multimodal: bool
    ) -> RRenderedTokens:
        roles = [str(m.get("role", "")) if isinstance(m, Mapping) else "" for m in messages]
        data = rendered.multi_modal_data
        if data is not None and data.is_empty:
            data = None
        if process_multimodal:
            return RRenderedTokens(
                token_ids=list(rendered.token_ids),
                message_roles=roles,
                multi_modal_data=_to_renderers(data),
            )
        collapsed = self._collapse(list(rendered.token_ids), data)
        with self._lock:
            self._expanded[tuple(collapsed)] = (list(rendered.token_ids), data)
            self._expanded.move_to_end(tuple(collapsed))
            while len(self._expanded) > REMEMBERED:
                self._expanded.popitem(last=False)
        return RRenderedTokens(token_ids=collapsed, message_roles=roles)

    def _lookup(self, ids: list[int]) -> tuple[list[int], MultiModalData | None] | None:
        with self._lock:
            found = self._expanded.get(tuple(ids))
            if found is not None:
                self._expanded.move_to_end(tuple(ids))
            return found

    def _collapse(self, ids: list[int], data: MultiModalData | None) -> list[int]:
        """``ids`` with every item's placeholder range replaced by its one pad; refused where
        a range holds anything but that pad (the server would not expand it back)."""
        if data is None:
            return ids
        ranges: list[tuple[PlaceholderRange, int, str]] = []
        for modality, placeholders in data.mm_placeholders.items():
            pad = self._pads.get(modality)
            if pad is None:
                raise UnsupportedModelError(
                    f"{self.model}: a {modality} in the prompt, which this renderer cannot "
                    "send as content_parts"
                )
            ranges += [(p, pad, modality) for p in placeholders]
        ranges.sort(key=lambda r: r[0].offset)
        out: list[int] = []
        at = 0
        for placeholder, pad, modality in ranges:
            span = ids[placeholder.offset : placeholder.offset + placeholder.length]
            if placeholder.is_embed is not None or any(t != pad for t in span):
                raise UnsupportedModelError(
                    f"{self.model}: its {modality} placeholders hold more than the {modality} "
                    "pad (markers or text around the embeddings), which a server writes on its "
                    "own side of the pad in content_parts mode, the only mode verifiers 0.4 "
                    "sends images in: the ids would not be vf_mm's. verifiers' renderers take "
                    "Qwen-VL families (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3.5) and LLaVA images"
                )
            out += ids[at : placeholder.offset]
            out.append(pad)
            at = placeholder.offset + placeholder.length
        out += ids[at:]
        return out


def _route_features_through_vf_mm() -> None:
    """Make ``renderers.client._build_mm_features`` encode a ``VfMMRenderer``'s images
    (once per process; every other renderer still goes to the original).

    The unreleased verifiers prime-rl pins (a60a606) renders a prompt holding an image with
    ``process_multimodal=True`` and posts its sidecar as vLLM's ``features`` through
    ``renderers.client.generate``, whose encoder dispatches on the renderer's class (Qwen3-VL,
    Qwen3.5, Gemma 4, Nemotron 3.5) and raises ``NotImplementedError`` for any other:
    ``renderers`` has no public hook a custom renderer could register an encoder with. The
    sidecar is vf_mm's, so vf_mm's own encoding of it (``encode_features``, the one
    ``VLLMBackend`` sends vLLM and ``vf-mm serve``) is the right one. verifiers 0.4.0 never
    calls it (images go as ``content_parts``); a ``renderers`` without the function is left
    alone."""
    import renderers.client as client

    original = getattr(client, "_build_mm_features", None)
    if original is None or getattr(original, "vf_mm_routes", False):
        return

    def build_mm_features(renderer: Any, mm_data: RMultiModalData) -> Any:
        if not isinstance(renderer, VfMMRenderer):
            return original(renderer, mm_data)
        data = _from_renderers(mm_data)
        end = max(
            (p.offset + p.length for ranges in data.mm_placeholders.values() for p in ranges),
            default=0,
        )
        return encode_features(data, num_tokens=end)

    build_mm_features.vf_mm_routes = True  # type: ignore[attr-defined]
    client._build_mm_features = build_mm_features  # type: ignore[attr-defined, unused-ignore]


def _to_renderers(data: MultiModalData | None) -> RMultiModalData | None:
    """vf_mm's sidecar as ``renderers``' (the same item arrays, not copied)."""
    if data is None:
        return None
    return RMultiModalData(
        mm_hashes={m: list(h) for m, h in data.mm_hashes.items()},
        mm_placeholders={
            m: [RPlaceholderRange(offset=p.offset, length=p.length) for p in ranges]
            for m, ranges in data.mm_placeholders.items()
        },
        mm_items={m: [dict(item) for item in items] for m, items in data.mm_items.items()},
    )


def _from_renderers(data: RMultiModalData) -> MultiModalData:
    return MultiModalData(
        mm_hashes={m: list(h) for m, h in data.mm_hashes.items()},
        mm_placeholders={
            m: [PlaceholderRange(p.offset, p.length) for p in ranges]
            for m, ranges in data.mm_placeholders.items()
        },
        mm_items={m: [dict(item) for item in items] for m, items in data.mm_items.items()},
    )
