"""A request while the local backend runs it, and how it is answered.

``Pending`` is a request waiting in the queue with the future its caller awaits (and,
once held, its ``Prepared`` CPU work); ``Row`` is that request admitted: its prompt,
images, cached prefix, positions, sampling rules and what it has sampled so far. Both
engines of ``LocalBackend`` (the padded batch and the KV pool) run rows (``RowBuilder``
makes them); ``take`` keeps a row's sampled token and ends it at a stop id or its
length; ``answer`` resolves a caller's future from the worker thread.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from vf_mm.inference._prefix_cache import Match, MediaSpan
from vf_mm.inference._types import GenerateRequest, GenerateResult, SamplingParams, Usage


@dataclass(slots=True)
class Pending:
    """A queued request, the future its caller awaits and that caller's loop.
    ``prepared``: its row's CPU work done ahead, while it was held (``RowBuilder.prepare``);
    taken by the first ``RowBuilder.row`` for it, so that no dropped entry outlives it."""

    request: GenerateRequest
    future: asyncio.Future[GenerateResult]
    loop: asyncio.AbstractEventLoop
    prepared: Prepared | None = None


@dataclass(frozen=True, slots=True)
class Prepared:
    """What a row needs that depends only on its request and the prefix match found when
    it was made: its images, and its new tokens' positions for ``match``. Valid at
    admission only while a lookup still gives the same entry and length."""

    media: list[tuple[MediaSpan, str, Mapping[str, Any]]]
    match: Match
    positions: torch.Tensor
    delta: int
    reach: np.ndarray | None


@dataclass(slots=True, eq=False)
class Row:
    """One request while it runs (``pending`` None once it is answered)."""

    pending: Pending | None
    prompt: list[int]
    spans: tuple[MediaSpan, ...]
    media: list[tuple[MediaSpan, str, Mapping[str, Any]]]  # (span, modality, inputs)
    match: Match
    positions: torch.Tensor  # the new tokens' positions: (n,) or (3, n) for M-RoPE
    delta: int  # a text token at index t sits at position t + delta
    reach: np.ndarray | None  # M-RoPE: the highest position of the first t + 1 tokens
    sampling: SamplingParams
    seed: int  # the request's seed, else one drawn from the backend's
    generator: torch.Generator | None  # the batch engine's random stream (from ``seed``)
    stop_ids: set[int]
    banned: tuple[int, ...] = ()  # the request's banned ids beyond the backend's own
    completion: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish: str = "length"
    stop_reason: int | None = None
    done: bool = False
    start: int = -1  # the pool engine: where its range of KV slots begins (-1: none)
    reserved: int = 0  # and how many slots it holds: prompt and max_tokens
    unread: int = 0  # the pool engine: tokens sampled on the device, not read back yet

    @property
    def cached(self) -> int:
        return self.match.length

    @property
    def new_ids(self) -> list[int]:
        return self.prompt[self.cached :]

    def reach_through(self, length: int) -> np.ndarray | None:
        """``reach`` over the first ``length`` tokens of prompt and completion (a sampled
        token at index t sits at t + delta, above everything before it)."""
        if self.reach is None:
            return None
        n = len(self.prompt)
        return np.concatenate([self.reach[:length], np.arange(n, max(n, length)) + self.delta])

    @property
    def next_position(self) -> int:
        """Where the last sampled token goes (it is fed at the next step)."""
        return len(self.prompt) + len(self.completion) - 1 + self.delta


def take(
    rows: Sequence[Row], tokens: Sequence[int], logprobs: Sequence[float], eos: set[int]
) -> None:
    """Each row's newly sampled token: kept, and the row done at a stop id (its
    ``stop_reason`` the id, unless it is one of the model's ``eos`` ids) or its length."""
    for row, token, logprob in zip(rows, tokens, logprobs, strict=True):
        row.completion.append(token)
        row.logprobs.append(logprob)
        if token in row.stop_ids:
            row.finish = "stop"
            row.stop_reason = None if token in eos else token
            row.done = True
        elif len(row.completion) >= row.sampling.max_tokens:
            row.done = True


def result(row: Row) -> GenerateResult:
    """What the caller gets for a finished row."""
    return GenerateResult(
        completion_ids=list(row.completion),
        logprobs=list(row.logprobs) if row.sampling.logprobs else None,
        finish_reason=row.finish,  # type: ignore[arg-type]
        stop_reason=row.stop_reason,
        usage=Usage(prompt_tokens=len(row.prompt), completion_tokens=len(row.completion)),
    )


def answer(pending: Pending, result: Any) -> None:
    """Resolve the caller's future with ``result`` (a value or an exception), from any
    thread."""
    # a RuntimeError means the caller's event loop is gone: nobody waits for it
    with contextlib.suppress(RuntimeError):
        pending.loop.call_soon_threadsafe(_resolve, pending.future, result)


def _resolve(future: asyncio.Future[GenerateResult], result: Any) -> None:
    if future.done():
        return  # cancelled while it ran
    if isinstance(result, BaseException):
        future.set_exception(result)
    else:
        future.set_result(result)
