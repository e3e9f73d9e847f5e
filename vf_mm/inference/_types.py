"""The backend contract: token ids (and images) in, sampled token ids and logprobs out.

Every token-level backend (local, vLLM, ``vf-mm serve`` behind the vLLM backend)
implements ``Backend.generate``. The OpenAI-compatible backend cannot see tokens; it
implements ``ChatBackend.chat`` (messages in, a message out) instead, and the
``RendererClient`` records such turns with ``tokens=None`` so nobody mistakes them
for training data.

Plain dataclasses: these are built once per request on the hot path.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from vf_mm.types import Messages, MultiModalData

FinishReason = Literal["stop", "length", "abort"]


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """What to sample. Field names follow vLLM's SamplingParams.

    Attributes:
        max_tokens: The most tokens sampled.
        temperature: The sampling temperature (0: greedy).
        top_p: Nucleus filter; 1 disables it.
        top_k: Top-k filter; ``<= 0`` disables it.
        min_p: Min-p filter; 0 disables it.
        seed: Makes one request's sampling repeatable.
        stop_token_ids: Add to the model's own stop tokens.
        logprobs: Return the sampled tokens' log-probabilities under the model's raw
            distribution (before temperature and filters, as vLLM's default
            ``raw_logprobs`` mode).
    """

    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    logprobs: bool = True

    def __post_init__(self) -> None:
        for name, (kind, label) in _SAMPLING_TYPES.items():
            value = getattr(self, name)
            if name == "seed" and value is None:
                continue
            fits = isinstance(value, kind)  # apart: narrowing by a runtime type says nothing
            if isinstance(value, bool) != (kind is bool) or not fits:
                raise TypeError(
                    f"sampling arg {name} must be {label}, not {type(value).__name__} ({value!r})"
                )
            if kind is not bool:  # numpy numbers become Python's (they go out as JSON)
                number = int(value) if kind is numbers.Integral else float(value)
                object.__setattr__(self, name, number)  # frozen: set once, at construction
        if not all(
            isinstance(t, numbers.Integral) and not isinstance(t, bool) for t in self.stop_token_ids
        ):
            raise TypeError(f"stop_token_ids must be ints, got {list(self.stop_token_ids)!r}")
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> SamplingParams:
        """From an environment's sampling args.

        Args:
            values: Field names to values.

        Raises:
            ValueError: Unknown keys (named) or bad values.
        """
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown sampling args {unknown}; known: {sorted(known)}")
        values = dict(values)
        if "stop_token_ids" in values:
            values["stop_token_ids"] = tuple(values["stop_token_ids"])
        return cls(**values)


_SAMPLING_TYPES: dict[str, tuple[type, str]] = {
    "max_tokens": (numbers.Integral, "an int"), "temperature": (numbers.Real, "a number"),
    "top_p": (numbers.Real, "a number"), "top_k": (numbers.Integral, "an int"),
    "min_p": (numbers.Real, "a number"), "seed": (numbers.Integral, "an int or None"),
    "logprobs": (bool, "a bool"),
}  # fmt: skip


@dataclass(slots=True)
class GenerateRequest:
    """One prompt to continue.

    Attributes:
        prompt_ids: The prompt's token ids.
        sampling: What to sample.
        multi_modal_data: The images' placeholders into ``prompt_ids`` and their model
            inputs (or only hashes, for a server that caches).
        request_id: An id for the server's logs.
        content_parts: content_parts mode: raw OpenAI-style image parts the server
            processes itself (``prompt_ids`` then hold one pad per image, and the result
            carries the expanded ids).
        messages: The conversation ``prompt_ids`` were rendered from, for backends that
            answer from it (a scripted policy); never sent to a server.
        session_id: The rollout this request is a turn of: a backend with several servers
            keeps one session on one server, whose prefix cache holds its earlier turns;
            never sent to a server, and ignored by backends with one engine.
        banned_token_ids: Ids the backend must never sample: the family's image and video
            tokens (pads, placeholders, vision markers), which text cannot hold
            (``RendererClient`` fills it from its renderer). Model backends honour it: the
            local engine masks them, vLLM gets a logit_bias of -100 on each (the OpenAI
            convention for a ban). A scripted backend replays its text; ``RendererClient``
            refuses a completion holding one, whatever made it.
    """

    prompt_ids: list[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    multi_modal_data: MultiModalData | None = None
    request_id: str | None = None
    # content_parts mode: raw OpenAI-style image parts the server processes itself
    # (prompt_ids then hold one pad per image, and the result carries the expanded ids)
    content_parts: list[dict[str, Any]] | None = None
    # the conversation ``prompt_ids`` were rendered from, for backends that answer from it
    # (a scripted policy); never sent to a server
    messages: Messages | None = None
    # the rollout this request is a turn of: a backend with several servers keeps one
    # session on one server, whose prefix cache holds its earlier turns; never sent to a
    # server, and ignored by backends with one engine
    session_id: str | None = None
    # ids the backend must never sample: the family's image and video tokens (pads,
    # placeholders, vision markers), which text cannot hold (RendererClient fills it from
    # its renderer). Model backends honour it: the local engine masks them, vLLM gets a
    # logit_bias of -100 on each (the OpenAI convention for a ban). A scripted backend
    # replays its text; RendererClient refuses a completion holding one, whatever made it
    banned_token_ids: tuple[int, ...] = ()


@dataclass(slots=True)
class Usage:
    """Token counts of one request.

    Attributes:
        prompt_tokens: Tokens in the prompt.
        completion_tokens: Tokens sampled.
    """

    prompt_tokens: int = 0
    completion_tokens: int = 0


@dataclass(slots=True)
class GenerateResult:
    """The sampled continuation.

    Attributes:
        completion_ids: The sampled token ids.
        logprobs: One per completion token (None when not asked for).
        finish_reason: Why sampling stopped.
        usage: Prompt and completion token counts.
        stop_reason: The stop token id or string that ended it, when the server says.
        prompt_ids: Set when the server expanded the prompt itself (content_parts mode);
            otherwise None.
        multi_modal_data: The expanded prompt's placeholders, set with ``prompt_ids``.
    """

    completion_ids: list[int]
    logprobs: list[float] | None
    finish_reason: FinishReason
    usage: Usage
    stop_reason: int | str | None = None
    prompt_ids: list[int] | None = None
    multi_modal_data: MultiModalData | None = None


@runtime_checkable
class Backend(Protocol):
    """A token-in / token-out inference backend. ``generate`` is a coroutine; cancelling
    the awaiting task cancels the request (the backend frees its slot)."""

    name: str
    max_model_len: int | None

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        """Sample a continuation of ``request``'s prompt.

        A coroutine; cancelling the awaiting task cancels the request (the backend frees its
        slot).

        Args:
            request: The prompt, its images and its sampling.

        Raises:
            BackendError: The request failed (after the backend's retries); its subclasses say
                how (``PromptTooLongError``, ``BackendUnavailableError``, ...).
        """

    async def aclose(self) -> None: ...


@dataclass(slots=True)
class ChatResult:
    """The answer of a ``ChatBackend``.

    Attributes:
        message: An OpenAI-style assistant message.
        finish_reason: Why sampling stopped (``"stop"``, ``"length"``, ``"tool_calls"``).
        usage: The token counts the API reported.
    """

    message: dict[str, Any]  # an OpenAI-style assistant message
    finish_reason: str
    usage: Usage


@runtime_checkable
class ChatBackend(Protocol):
    """A message-in / message-out backend (OpenAI-compatible APIs): no token ids."""

    name: str

    async def chat(
        self,
        messages: Messages,
        sampling: SamplingParams,
        *,
        tools: Sequence[dict[str, Any]] | None = None,
    ) -> ChatResult:
        """The assistant message a model answers ``messages`` with.

        Args:
            messages: The conversation.
            sampling: What to sample.
            tools: Tool schemas (OpenAI format).

        Raises:
            BackendError: The request failed (after the backend's retries).
        """

    async def aclose(self) -> None: ...


def check_prompt_length(
    request: GenerateRequest, max_model_len: int | None, *, backend: str
) -> None:
    """Refuse, before sending, a prompt that cannot fit with its ``max_tokens``; the
    error says how many of its tokens its images and clips take, since a clip's frames
    are what users most often shrink (``num_frames`` / ``fps`` on the video part)."""
    from vf_mm.errors import PromptTooLongError

    prompt_len, sampling = len(request.prompt_ids), request.sampling
    if max_model_len is None or prompt_len + sampling.max_tokens <= max_model_len:
        return
    taken = []
    data = request.multi_modal_data
    for modality, fix in (("image", "send smaller images or fewer"),
                          ("video", "sample fewer frames: num_frames or fps on the video part")):  # fmt: skip
        ranges = data.mm_placeholders.get(modality, []) if data is not None else []
        if ranges:
            tokens = sum(r.length for r in ranges)
            taken.append(f"its {len(ranges)} {modality}(s) take {tokens} of them ({fix})")
    raise PromptTooLongError(
        f"prompt of {prompt_len} tokens + max_tokens {sampling.max_tokens} = "
        f"{prompt_len + sampling.max_tokens} exceeds the model's {max_model_len}"
        + ("; " + "; ".join(taken) if taken else ""),
        backend=backend,
        prompt_tokens=prompt_len,
        limit=max_model_len,
    )
