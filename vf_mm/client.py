"""``RendererClient``: one model turn, from messages to exact tokens and back.

For each turn it finds the newest trajectory step whose prompt and completion are a
prefix of the new prompt and bridges onto that step's tokens, carrying its images'
model inputs forward (``previous_multi_modal_data``); when no step fits, or the
renderer declines, it renders the whole prompt. Then it calls the backend and parses
the completion. ``stats`` counts bridges, full renders and why each fallback
happened, so a caller can see when a template stops bridging.

Rendering (template, tokenizer, image processing) runs in worker threads, never on
the event loop. A message-level backend (``ChatBackend``, e.g. an OpenAI API) skips
all of that: its turns carry messages and ``tokens=None``.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import os
import time
from array import array
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, cast

from vf_mm.errors import BackendProtocolError, PromptTooLongError, ReservedTokenError
from vf_mm.inference import Backend, ChatBackend, GenerateRequest, SamplingParams, Usage
from vf_mm.renderers import Renderer, bridge
from vf_mm.types import Messages, RenderedTokens, ResponseTokens, TrajectoryStep

if TYPE_CHECKING:
    from vf_mm.models import TokenizerSnapshot


@dataclass(slots=True)
class ClientStats:
    """What the client did, summed over its turns (read it, don't write it).

    Attributes:
        turns: Model turns taken.
        bridges: Turns whose prompt was bridged from the previous turn's tokens.
        renders: Turns whose prompt was rendered in full.
        fallbacks: Why a turn was fully rendered instead of bridged, counted by reason.
        render_s: Seconds spent rendering.
        backend_s: Seconds spent waiting on the backend.
        prompt_tokens: Prompt tokens sent.
        completion_tokens: Completion tokens received.
    """

    turns: int = 0
    bridges: int = 0
    renders: int = 0
    fallbacks: Counter[str] = field(default_factory=Counter)  # why a turn was fully rendered
    render_s: float = 0.0
    backend_s: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0


@dataclass(slots=True)
class ModelTurn:
    """One model turn: the assistant message to append, and its tokens.

    Attributes:
        message: The assistant message.
        tokens: Its tokens; None when the backend works on messages and never saw token
            ids.
        usage: The backend's token counts.
        bridged: Whether the prompt was bridged from the previous turn's tokens.
        tool_call_errors: Tool calls in the completion that did not parse, one message
            each.
    """

    message: dict[str, Any]
    tokens: ResponseTokens | None
    usage: Usage
    bridged: bool = False
    tool_call_errors: list[str] = field(default_factory=list)

    def step(self, prompt: Messages, **extras: Any) -> TrajectoryStep:
        """The trajectory step this turn makes (its completion is ``[self.message]``).

        The messages are copied (dicts and content lists; images are shared), so an environment
        that later edits its message list in place cannot rewrite this step.

        Args:
            prompt: The messages the turn saw.
            **extras: The step's ``extras``.
        """
        return TrajectoryStep(
            prompt=cast(Messages, [_copy_message(m) for m in prompt]),
            completion=cast(Messages, [_copy_message(self.message)]),
            tokens=self.tokens,
            extras=extras,
        )


class RendererClient:
    """Turns messages into model turns through a renderer and a backend.

    Args:
        backend: A ``Backend`` (token ids) or a ``ChatBackend`` (messages).
        renderer: A ``vf_mm.renderers.Renderer``, e.g. a ``RendererPool`` (needed for
            token backends; use a pool when many rollouts run concurrently).
        sampling: Defaults for every turn, overridable per call.

    Raises:
        ValueError: A token backend without a renderer.
    """

    def __init__(
        self,
        backend: Backend | ChatBackend,
        renderer: Renderer | None = None,
        *,
        sampling: SamplingParams | None = None,
    ) -> None:
        self.backend = backend
        self.renderer = renderer
        self.sampling = sampling or SamplingParams()
        self.stats = ClientStats()
        self.token_level = hasattr(backend, "generate")
        if self.token_level and renderer is None:
            raise ValueError(f"backend {backend.name} works on token ids: pass a renderer")
        banned = getattr(self.vision, "banned_token_ids", None) or ()
        #: ids every request bans from sampling: the renderer's image and video tokens
        self.banned_token_ids: tuple[int, ...] = tuple(sorted(banned))

    async def aclose(self) -> None:
        """Close the backend (its connections, its engine's threads); the client is done."""
        close = getattr(self.backend, "aclose", None)
        if close is not None:
            await close()

    async def __aenter__(self) -> RendererClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    @property
    def vision(self) -> Any:
        """The renderer's vision spec (what images and clips it takes, and under which
        rules), through a ``RendererPool`` too; None for a text renderer or none."""
        renderer = self.renderer
        renderers = getattr(renderer, "renderers", None)
        if renderers:  # a RendererPool: every renderer was made by one factory
            renderer = renderers[0]
        return getattr(renderer, "vision", None)

    @property
    def media_rules(self) -> tuple[Any, Any]:
        """``(image_policy, video_limits)`` the renderer reads images and clips under (each
        None where it uses the defaults, or has no vision). Storing or packing this
        client's rollouts reads their media under the same rules, so a clip a rollout
        took is never refused there, nor a source it refused read."""
        vision = self.vision
        if vision is None:
            return None, None
        return getattr(vision, "policy", None), getattr(vision, "video_limits", None)

    async def generate(
        self,
        prompt: Messages,
        *,
        trajectory: Sequence[TrajectoryStep] = (),
        tools: Sequence[Mapping[str, Any]] | None = None,
        sampling: SamplingParams | None = None,
        session_id: str | None = None,
        max_prompt_tokens: int | None = None,
    ) -> ModelTurn:
        """One model turn.

        Args:
            prompt: The conversation so far.
            trajectory: The rollout's earlier steps: the prompt is bridged onto the newest
                step whose prompt and completion are a prefix of it (the tokens the model saw
                stay exact); when none fits, it is rendered whole.
            tools: Tool schemas (OpenAI format) the template shows the model.
            sampling: This turn's sampling, over the client's defaults.
            session_id: Names the rollout the turn belongs to (the same for all its turns): a
                backend with several servers sends them all to one server, whose prefix cache
                holds the earlier turns; end it with ``end_session``.
            max_prompt_tokens: Token-level backends only: a rendered prompt longer than this
                is refused before anything is sent (a server's cap).

        Raises:
            PromptTooLongError: The rendered prompt is over ``max_prompt_tokens``.
            BackendProtocolError: The backend's answer breaks its schema (logprobs missing or
                of the wrong length).
            ReservedTokenError: The completion holds a token reserved for images and videos.
            ValueError: ``max_prompt_tokens`` with a chat backend.
        """
        sampling = sampling or self.sampling
        self.stats.turns += 1
        if not self.token_level:
            if max_prompt_tokens is not None:
                raise ValueError(
                    "max_prompt_tokens needs a token-level backend (a chat backend's prompt "
                    "is rendered by its server, and its length is not known here)"
                )
            return await self._chat(prompt, tools, sampling)
        missing = [t for t in self.renderer.stop_token_ids if t not in sampling.stop_token_ids]  # type: ignore[union-attr]
        if missing:  # the backend must stop where the renderer's turn ends
            sampling = replace(sampling, stop_token_ids=(*sampling.stop_token_ids, *missing))
        start = time.perf_counter()
        rendered, bridged = await asyncio.to_thread(self._prompt_tokens, prompt, trajectory, tools)
        self.stats.render_s += time.perf_counter() - start
        if max_prompt_tokens is not None and len(rendered.token_ids) > max_prompt_tokens:
            n = len(rendered.token_ids)
            raise PromptTooLongError(
                f"the prompt is {n} tokens; at most {max_prompt_tokens} are taken here",
                backend=self.backend.name,
                prompt_tokens=n,
                limit=max_prompt_tokens,
            )
        start = time.perf_counter()
        result = await self.backend.generate(  # type: ignore[union-attr]
            GenerateRequest(
                rendered.token_ids,
                sampling,
                rendered.multi_modal_data,
                messages=prompt,
                session_id=session_id,
                banned_token_ids=self.banned_token_ids,
            )
        )
        self.stats.backend_s += time.perf_counter() - start
        n = len(result.completion_ids)
        if result.logprobs is None and sampling.logprobs:
            raise BackendProtocolError(
                f"{self.backend.name} returned no logprobs although they were asked for",
                backend=self.backend.name,
            )
        if result.logprobs is not None and len(result.logprobs) != n:
            raise BackendProtocolError(
                f"{self.backend.name} returned {len(result.logprobs)} logprobs for {n} tokens",
                backend=self.backend.name,
            )
        parsed = await asyncio.to_thread(self.renderer.parse_response, result.completion_ids)  # type: ignore[union-attr]
        self._check_reserved(result.completion_ids, parsed.text, turn=len(trajectory) + 1)
        tokens = ResponseTokens(
            prompt_ids=result.prompt_ids if result.prompt_ids is not None else rendered.token_ids,
            completion_ids=list(result.completion_ids),
            # NaN, not a made-up number, when the caller turned logprobs off
            completion_logprobs=list(result.logprobs)
            if result.logprobs is not None
            else [math.nan] * n,
            completion_mask=[1] * n,
            finish_reason=result.finish_reason,
            multi_modal_data=(
                result.multi_modal_data
                if result.multi_modal_data is not None
                else rendered.multi_modal_data
            ),
        )
        self.stats.prompt_tokens += result.usage.prompt_tokens
        self.stats.completion_tokens += result.usage.completion_tokens
        return ModelTurn(
            message=_with_call_ids(parsed.message, tokens),
            tokens=tokens,
            usage=result.usage,
            bridged=bridged,
            tool_call_errors=parsed.tool_call_errors,
        )

    def _check_reserved(self, completion_ids: Sequence[int], text: str, *, turn: int) -> None:
        """A completion holding an image or video token (a backend that ignored the ban, a
        scripted or recorded reply) fails its turn here, naming the token and why: kept,
        it would crash a later turn's render or train on a placeholder no image explains."""
        check = getattr(self.vision, "sampled_reserved", None)
        found = check(completion_ids, text) if check is not None else None
        if found is not None:
            token, reason = found
            raise ReservedTokenError(
                f"turn {turn}: {reason}; the rollout fails here rather than crash a later "
                "turn or train on a placeholder no image explains",
                token=token,
            )

    def end_session(self, session_id: str) -> None:
        """The rollout ``session_id`` named is over.

        A backend that routes sessions (one with an ``end_session`` of its own) stops counting
        it; others ignore it.

        Args:
            session_id: The rollout's session id, as passed to ``generate``.
        """
        end = getattr(self.backend, "end_session", None)
        if end is not None:
            end(session_id)

    def _prompt_tokens(
        self,
        prompt: Messages,
        trajectory: Sequence[TrajectoryStep],
        tools: Sequence[Mapping[str, Any]] | None,
    ) -> tuple[RenderedTokens, bool]:
        """Bridge from the newest step that prefixes ``prompt``; else render it whole."""
        reason = "no earlier step"
        for step in reversed(trajectory):
            if step.tokens is None:
                continue
            history = [*step.prompt, *step.completion]
            if not _is_prefix(history, prompt):
                reason = "no earlier step is a prefix of the prompt"
                continue
            refusals: list[str] = []
            out = bridge(
                self.renderer,
                step.tokens.prompt_ids,
                step.tokens.completion_ids,
                prompt[len(history) :],
                tools=tools,
                previous_multi_modal_data=step.tokens.multi_modal_data,
                previous_messages=history,
                on_refusal=refusals.append,
            )
            if out is not None:
                self.stats.bridges += 1
                return out, True
            reason = refusals[0] if refusals else "the renderer declined to bridge"
            break
        self.stats.renders += 1
        if reason not in self.stats.fallbacks and len(self.stats.fallbacks) >= _MAX_REASONS:
            reason = "(other reasons)"  # a reason may quote the conversation: keep few
        self.stats.fallbacks[reason] += 1
        return self.renderer.render(prompt, tools=tools), False  # type: ignore[union-attr]

    async def _chat(
        self, prompt: Messages, tools: Sequence[Mapping[str, Any]] | None, sampling: SamplingParams
    ) -> ModelTurn:
        start = time.perf_counter()
        chat = cast(ChatBackend, self.backend)
        result = await chat.chat(
            prompt, sampling, tools=cast("Sequence[dict[str, Any]] | None", tools)
        )
        self.stats.backend_s += time.perf_counter() - start
        self.stats.prompt_tokens += result.usage.prompt_tokens
        self.stats.completion_tokens += result.usage.completion_tokens
        return ModelTurn(message=result.message, tokens=None, usage=result.usage)


#: distinct fallback reasons counted apart in ``ClientStats.fallbacks`` (the rest together),
#: so that the client's state stays the same size over a run of any length
_MAX_REASONS = 64


def _with_call_ids(message: dict[str, Any], tokens: ResponseTokens) -> dict[str, Any]:
    """The message with each tool call's id made unique within its conversation and stable
    under a seed: derived from the turn's prompt and completion ids (the prompt grows every
    turn, so two turns never share an id) and the call's position in the turn."""
    calls = message.get("tool_calls")
    if not calls:
        return message
    digest = hashlib.sha256(
        array("q", [*tokens.prompt_ids, -1, *tokens.completion_ids]).tobytes()
    ).hexdigest()[:12]
    ids = [f"call_{digest}_{i}" for i in range(len(calls))]
    return {**message, "tool_calls": [{**c, "id": i} for c, i in zip(calls, ids, strict=True)]}


def _copy_message(message: Mapping[str, Any]) -> dict[str, Any]:
    content = message.get("content")
    if isinstance(content, list):
        content = [dict(part) if isinstance(part, Mapping) else part for part in content]
    return {**message, "content": content}


def _is_prefix(history: Sequence[Any], prompt: Sequence[Any]) -> bool:
    if len(history) > len(prompt):
        return False
    return all(_same(a, b) for a, b in zip(history, prompt, strict=False))


def _same(a: Any, b: Any) -> bool:
    """Equality that short-cuts on identity, so images (PIL objects, tensors) shared by
    reference are never compared pixel by pixel."""
    if a is b:
        return True
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, (str, int, float, bool, type(None), bytes)):
        return a == b
    return False  # distinct image objects: treat as different (a full render is always correct)


#: the backends ``make_client`` builds by name
BACKENDS = ("local", "vllm", "openai")


#: the served name of the embedded tiny model (``vf-mm serve --model embedded``)
EMBEDDED_NAME = "embedded"


def make_client(
    model: str | os.PathLike[str] | None = None,
    *,
    backend: str | Backend | ChatBackend = "local",
    base_url: str | Sequence[str] | None = None,
    api_key: str | Sequence[str] | None = None,
    image_backend: str = "auto",
    image_cache_bytes: int | None = None,
    renderers: int | None = None,
    sampling: SamplingParams | None = None,
    backend_options: Mapping[str, Any] | None = None,
    tokenizer: TokenizerSnapshot | None = None,
) -> RendererClient:
    """A ``RendererClient`` in one call: the renderer pool, the backend and the client that
    ``vf-mm eval`` builds from its flags. Close it with ``await client.aclose()``.

    Args:
        model: a checkpoint directory (or, for ``"vllm"`` / ``"openai"``, the model name
            the server knows; the renderer then loads from ``model`` too, so give vLLM the
            directory it serves). ``None``: the embedded tiny model, built offline on first
            use (``"local"`` only). ``"embedded"`` with ``"vllm"`` (and no ``./embedded``):
            the name ``vf-mm serve --model embedded`` serves, rendered from the embedded
            model's checkpoint.
        backend: ``"local"`` (an in-process transformers model, ``LocalBackend``),
            ``"vllm"`` (``VLLMBackend`` on ``base_url``: one URL or several, one rollout
            sticking to one server), ``"openai"`` (``OpenAIChatBackend``: messages only, no
            renderer), or a backend object you built (its renderer is still made here
            from ``model``, unless it is a ``ChatBackend``).
        base_url: the server(s) of ``"vllm"`` (required) and ``"openai"`` (optional).
        api_key: the key (one per server for several vLLM servers, or one for all).
        image_backend: the renderer's image processing: ``"auto"`` (what transformers'
            ``AutoProcessor`` and vLLM use here), ``"pil"``, ``"torchvision"`` or ``"torch"``
            (vf_mm's torch-only port of a torchvision-only image processor).
        image_cache_bytes: the processed-image cache the pool's renderers share (default:
            ``load_renderer``'s).
        renderers: how many renderers the pool holds (concurrent renders); default
            ``min(8, max(2, cpu_count))``.
        sampling: the client's default ``SamplingParams``.
        backend_options: keyword arguments for the backend's constructor (``device``,
            ``dtype`` for ``LocalBackend``; timeouts and routing for ``VLLMBackend``).
            With ``{"mode": "content_parts"}`` and neither ``embed_token_ids`` nor
            ``embed_swaps`` given, both come from the renderer, so the server's expansion
            is checked against the renderer's ids (and InternVL3's clips map back);
            ``refusals`` comes from the renderer unless given (Kimi-K2.5's clips are
            refused before sending: vLLM 0.32 cannot take them).
        tokenizer: ``model``'s tokenizer, loaded already (``vf_mm.models.TokenizerSnapshot``,
            e.g. made by a parent process and sent to its workers): each renderer gets a
            copy instead of loading ``model``'s tokenizer again. None: it is loaded from
            ``model`` once, and the pool's other renderers get copies of it.

    Raises:
        ValueError: an unknown backend name, arguments that do not go together, or a
            ``tokenizer`` of another checkpoint than ``model``.
    """
    from vf_mm.renderers import RendererPool, load_renderer

    options = dict(backend_options or {})
    if isinstance(backend, str) and backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, not {backend!r}")
    if model is None:
        if backend != "local":
            raise ValueError(f"backend {backend!r} needs model= (the embedded model is local)")
        from vf_mm.models import embedded_model

        model = embedded_model()
    name = source = os.fspath(model)
    if name == EMBEDDED_NAME and backend == "vllm" and not os.path.exists(name):
        # the name `vf-mm serve --model embedded` serves under: render from its checkpoint
        from vf_mm.models import embedded_model

        source = os.fspath(embedded_model())
    if backend == "openai":
        from vf_mm.inference import OpenAIChatBackend

        url = base_url if base_url is None or isinstance(base_url, str) else base_url[0]
        key = api_key if api_key is None or isinstance(api_key, str) else api_key[0]
        return RendererClient(
            OpenAIChatBackend(name, base_url=url, api_key=key, **options), None, sampling=sampling
        )
    if backend == "local" and base_url is not None:
        raise ValueError("base_url is for the vllm and openai backends, not the local one")
    if backend == "vllm" and not base_url:
        raise ValueError("backend 'vllm' needs base_url= (the server's URL, or several)")
    if not isinstance(backend, str) and not hasattr(backend, "generate"):
        return RendererClient(backend, None, sampling=sampling)  # a ChatBackend
    size = renderers if renderers is not None else max(2, min(8, os.cpu_count() or 2))
    if tokenizer is not None and not tokenizer.belongs_to(source):
        raise ValueError(f"tokenizer= is the tokenizer of {tokenizer.path}, not of {source}")
    if tokenizer is None and size > 1:
        from vf_mm.models import TokenizerSnapshot

        tokenizer = TokenizerSnapshot.of_checkpoint(source)

    def renderer() -> Renderer:
        loaded = None if tokenizer is None else tokenizer.copy()
        if image_cache_bytes is None:
            return load_renderer(source, image_backend=image_backend, tokenizer=loaded)
        return load_renderer(
            source, image_backend=image_backend, cache_bytes=image_cache_bytes, tokenizer=loaded
        )

    pool = RendererPool(renderer, size=size)
    engine: Backend
    if backend == "vllm":
        from vf_mm.inference import Expansion, VLLMBackend

        assert base_url is not None
        urls = [base_url] if isinstance(base_url, str) else list(base_url)
        if options.get("mode") == "content_parts" and not (_EXPANSION & options.keys()):
            # the renderer's facts, unless the caller gives them (all or part: theirs)
            options["expansion"] = Expansion.of(getattr(pool.renderers[0], "vision", None))
        engine = VLLMBackend(urls, model=name, api_key=api_key, **options)
    elif backend == "local":
        from vf_mm.inference import LocalBackend

        engine = LocalBackend(name, **options)
    else:
        assert not isinstance(backend, str)
        engine = backend  # type: ignore[assignment]
    return RendererClient(engine, pool, sampling=sampling)


#: the VLLMBackend options that carry the renderer's facts for content_parts mode
_EXPANSION = frozenset({"expansion", "embed_token_ids", "embed_swaps", "refusals"})
