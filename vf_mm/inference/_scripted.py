"""``ScriptedBackend``: a token-level backend that replays scripted replies.

It is a real ``Backend``: prompts in, completion ids, logprobs and usage out, cut at
``max_tokens`` and closed with a stop token like a model's. What it samples is text
chosen in advance, so an environment's rollout loop, its rubric and the client's
turn bridging can be exercised with no model at all (``check_environment`` does, and
so do tests and benchmarks that measure everything but the model).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

from vf_mm.inference._types import GenerateRequest, GenerateResult, Usage, check_prompt_length


class ScriptedBackend:
    """A token-level ``Backend`` that answers with scripted text.

    The text is tokenized by ``renderer``'s tokenizer and closed with its first stop token
    unless it ends with one of its stop tokens itself (Gemma 4's calls end with
    ``<|tool_response>``); cut at ``max_tokens`` like a model. Every sampled token gets
    logprob ``-0.5``. ``requests`` keeps what was asked, for assertions.

    Args:
        renderer: Supplies the tokenizer (its ``tokenizer``; itself when it has none) and
            the stop token (its first ``stop_token_ids``).
        replies: Strings used in turn (cycling), or one function of the
            ``GenerateRequest`` returning the text: it sees the prompt's token ids
            (``request.prompt_ids``) and, from a ``RendererClient``, the conversation they
            were rendered from (``request.messages``), so a scripted policy can answer what
            it was shown.
        name: The backend's name.
        max_model_len: A prompt that cannot fit with its ``max_tokens`` is refused
            (``PromptTooLongError``) as a real backend refuses it, so a test can make a
            rollout run out of context at a chosen turn.
        record: False keeps nothing in ``requests`` (each request holds its images' model
            inputs: a long run, a soak test or a benchmark of memory must not keep them).
    """

    def __init__(self, renderer: Any, replies: Sequence[str] | Callable[[GenerateRequest], str], *,
                 name: str = "scripted", max_model_len: int | None = None,
                 record: bool = True) -> None:  # fmt: skip
        self.name = name
        self.max_model_len = max_model_len
        self._tokenizer = renderer.tokenizer if hasattr(renderer, "tokenizer") else renderer
        self._stops = tuple(renderer.stop_token_ids)
        self._stop = self._stops[0]
        self._replies = replies if callable(replies) else itertools.cycle(list(replies))
        self.requests: list[GenerateRequest] = []
        self.record = record

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        if self.record:
            self.requests.append(request)
        check_prompt_length(request, self.max_model_len, backend=self.name)
        text = self._replies(request) if callable(self._replies) else next(self._replies)
        ids = list(self._tokenizer(text, add_special_tokens=False)["input_ids"])
        if not ids or ids[-1] not in self._stops:  # a reply may end with its own stop token
            ids.append(self._stop)
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
