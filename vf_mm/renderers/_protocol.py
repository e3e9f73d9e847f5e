"""``Renderer``: what the client and the pool need from a renderer; ``bridge``, the one way to call it.

A renderer turns messages into the exact token ids a model sees and back:
``render`` a whole conversation, ``bridge_to_next_turn`` to extend the previous turn's
tokens (so the sampled completion is kept verbatim and earlier images are not
processed again), ``parse_response`` to read a completion, and ``stop_token_ids``, the
ids that end an assistant turn (the backend must stop there). ``ChatTemplateRenderer``
and ``RendererPool`` both are renderers; code that takes one takes either.

``previous_messages`` and ``on_refusal`` are optional extensions of
``bridge_to_next_turn``: a renderer written to the core signature ``(previous_prompt_ids,
previous_completion_ids, new_messages, *, tools=None, previous_multi_modal_data=None)``
is a renderer too. Callers go through ``bridge``, which passes the extensions only to a
renderer that accepts them (checked once per renderer class).

A renderer's tokenizer and image processor are not part of the contract: a pool
shares them across threads only by lending a whole renderer (``pool.renderer()``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from vf_mm.renderers._parse import ParsedResponse
from vf_mm.types import MultiModalData, RenderedTokens


@runtime_checkable
class Renderer(Protocol):
    """Messages <-> exact token ids for one model (see the module docstring)."""

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        """The ids that end an assistant turn."""
        ...

    @property
    def is_multimodal(self) -> bool:
        """True when image parts become tokens (else a message holding one is refused)."""
        ...

    @property
    def bridge_refusals(self) -> Mapping[str, int]:
        """How often ``bridge_to_next_turn`` returned None, by reason."""
        ...

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
    ) -> RenderedTokens:
        """Token ids (and the images' multi-modal data) of a whole conversation.

        Args:
            messages: The conversation.
            tools: Tool schemas (OpenAI format) for the template.
            add_generation_prompt: End with the assistant turn's opening.

        Raises:
            RenderError: Messages the renderer cannot turn into tokens.
        """
        ...

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
        """The next turn's prompt, built on the previous turn's tokens.

        The previous prompt and completion verbatim, then ``new_messages`` as a full render
        would write them. None means "render the whole conversation instead"; the reason goes
        to ``on_refusal`` and ``bridge_refusals``.

        Args:
            previous_prompt_ids: The previous turn's prompt token ids.
            previous_completion_ids: The previous turn's sampled token ids.
            new_messages: The messages after the previous turn's assistant message.
            tools: Tool schemas, as for ``render``.
            previous_multi_modal_data: The previous prompt's sidecar (never mutated: copied,
                then appended to).
            previous_messages: The previous prompt plus the assistant message made from the
                completion: lets the renderer check the real history instead of refusing
                whenever the tokens alone cannot tell.
            on_refusal: Called with the reason when the bridge refuses.
        """
        ...

    def parse_response(self, completion_ids: Sequence[int]) -> ParsedResponse:
        """Reasoning, content and tool calls of a completion.

        Args:
            completion_ids: The sampled token ids.
        """
        ...


_EXTENSIONS = ("previous_messages", "on_refusal")
_ACCEPTS: dict[type, frozenset[str]] = {}


def bridge(
    renderer: Any,
    previous_prompt_ids: Sequence[int],
    previous_completion_ids: Sequence[int],
    new_messages: Sequence[Mapping[str, Any]],
    *,
    tools: Sequence[Mapping[str, Any]] | None = None,
    previous_multi_modal_data: MultiModalData | None = None,
    previous_messages: Sequence[Mapping[str, Any]] | None = None,
    on_refusal: Callable[[str], object] | None = None,
) -> RenderedTokens | None:
    """``renderer.bridge_to_next_turn(...)``, passing only what its signature takes.

    ``previous_messages`` / ``on_refusal`` are passed only where the renderer takes them:
    the one way callers (the client, the pool) bridge, so a renderer written to the core
    signature works everywhere.

    Args:
        renderer: Any ``Renderer``.
        previous_prompt_ids: See ``Renderer.bridge_to_next_turn``.
        previous_completion_ids: See ``Renderer.bridge_to_next_turn``.
        new_messages: See ``Renderer.bridge_to_next_turn``.
        tools: See ``Renderer.bridge_to_next_turn``.
        previous_multi_modal_data: See ``Renderer.bridge_to_next_turn``.
        previous_messages: See ``Renderer.bridge_to_next_turn``.
        on_refusal: See ``Renderer.bridge_to_next_turn``.
    """
    kind = type(renderer)
    accepts = _ACCEPTS.get(kind)
    if accepts is None:
        params = inspect.signature(renderer.bridge_to_next_turn).parameters
        var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        accepts = frozenset(n for n in _EXTENSIONS if var_kw or n in params)
        _ACCEPTS[kind] = accepts
    extras = {
        name: value
        for name, value in (("previous_messages", previous_messages), ("on_refusal", on_refusal))
        if value is not None and name in accepts
    }
    return renderer.bridge_to_next_turn(
        previous_prompt_ids,
        previous_completion_ids,
        new_messages,
        tools=tools,
        previous_multi_modal_data=previous_multi_modal_data,
        **extras,
    )
