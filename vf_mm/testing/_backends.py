"""Fake backends for tests (vf_mm's and environment authors'): scripted replies, zero latency."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

from vf_mm.inference._types import (
    ChatResult,
    GenerateRequest,
    GenerateResult,
    SamplingParams,
    Usage,
)

Reply = str | Callable[[Any], str]


class ScriptedBackend:
    """A token-level ``Backend`` that answers with scripted text, tokenized by ``renderer``'s
    tokenizer and closed with its first stop token (cut at ``max_tokens`` like a model).

    ``replies``: strings used in turn (cycling), or one function of the
    ``GenerateRequest`` returning the text. Every sampled token gets logprob ``-0.5``.
    ``requests`` keeps what was asked, for assertions.
    """

    def __init__(self, renderer: Any, replies: Sequence[str] | Callable[[GenerateRequest], str], *,
                 name: str = "scripted", max_model_len: int | None = None) -> None:  # fmt: skip
        self.name = name
        self.max_model_len = max_model_len
        self._tokenizer = renderer.tokenizer if hasattr(renderer, "tokenizer") else renderer
        self._stop = renderer.stop_token_ids[0]
        self._replies = replies if callable(replies) else itertools.cycle(list(replies))
        self.requests: list[GenerateRequest] = []

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        self.requests.append(request)
        text = self._replies(request) if callable(self._replies) else next(self._replies)
        ids = [*self._tokenizer(text, add_special_tokens=False)["input_ids"], self._stop]
        finish = "stop"
        if len(ids) > request.sampling.max_tokens:
            ids, finish = ids[: request.sampling.max_tokens], "length"
        return GenerateResult(
            completion_ids=ids,
            logprobs=[-0.5] * len(ids),
            finish_reason=finish,  # type: ignore[arg-type]
            usage=Usage(prompt_tokens=len(request.prompt_ids), completion_tokens=len(ids)),
        )

    async def aclose(self) -> None:
        return None


class ScriptedChatBackend:
    """A message-level ``ChatBackend`` answering with scripted text (no token ids)."""

    def __init__(self, replies: Sequence[str], *, name: str = "scripted-chat") -> None:
        self.name = name
        self._replies = itertools.cycle(list(replies))
        self.calls: list[Any] = []

    async def chat(
        self, messages: Any, sampling: SamplingParams, *, tools: Any = None
    ) -> ChatResult:
        self.calls.append((messages, sampling, tools))
        return ChatResult(
            message={"role": "assistant", "content": next(self._replies)},
            finish_reason="stop",
            usage=Usage(prompt_tokens=0, completion_tokens=0),
        )

    async def aclose(self) -> None:
        return None
