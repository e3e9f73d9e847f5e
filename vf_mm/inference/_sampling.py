"""Per-request sampling inside one batched forward pass.

Hugging Face ``generate`` applies one sampling configuration to a whole batch; rollouts
batched together may each want their own temperature, filters, seed and stop tokens.
``RowSampler`` is a logits processor that samples every row by its own request's
rules (with the request's own ``torch.Generator``, so a seeded request repeats whatever
else shares its batch), records the sampled token's raw log-probability, and hands
``generate`` a one-hot row so its greedy step picks exactly that token.
``RowStopper`` ends each row at its own stop tokens or ``max_tokens``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from vf_mm.inference._types import SamplingParams


class RowSampler:
    def __init__(
        self,
        sampling: Sequence[SamplingParams],
        generators: Sequence[torch.Generator],
        suppress_token_ids: Sequence[int],
    ) -> None:
        self.sampling = list(sampling)
        self.generators = list(generators)
        self.suppress = torch.tensor(sorted(set(suppress_token_ids)), dtype=torch.long)
        self.logprobs: list[list[float]] = [[] for _ in self.sampling]
        self.last: torch.Tensor | None = None

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        logits = scores.float()
        raw = torch.log_softmax(logits, dim=-1)
        if self.suppress.numel():
            logits = logits.index_fill(1, self.suppress.to(logits.device), float("-inf"))
        chosen = torch.empty(logits.shape[0], dtype=torch.long, device=logits.device)
        for row, (params, gen) in enumerate(zip(self.sampling, self.generators, strict=True)):
            chosen[row] = _sample(logits[row], params, gen)
        picked = raw.gather(1, chosen[:, None]).squeeze(1).tolist()
        for row, value in enumerate(picked):
            self.logprobs[row].append(value)
        self.last = chosen
        out = torch.full_like(scores, float("-inf"))
        out.scatter_(1, chosen[:, None], 0.0)
        return out


class RowStopper:
    """A per-row stopping criterion: each row stops at its own stop ids or length."""

    def __init__(
        self, stop_ids: Sequence[set[int]], max_tokens: Sequence[int], prompt_len: int
    ) -> None:
        self.stop_ids = list(stop_ids)
        self.max_tokens = list(max_tokens)
        self.prompt_len = prompt_len
        self.done = [False] * len(self.stop_ids)

    def __call__(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> torch.Tensor:
        generated = input_ids.shape[1] - self.prompt_len
        last = input_ids[:, -1].tolist()
        for row, token in enumerate(last):
            if not self.done[row] and (
                token in self.stop_ids[row] or generated >= self.max_tokens[row]
            ):
                self.done[row] = True
        return torch.tensor(self.done, dtype=torch.bool, device=input_ids.device)


def _sample(logits: torch.Tensor, params: SamplingParams, gen: torch.Generator) -> torch.Tensor:
    if params.temperature == 0:
        return logits.argmax()
    x = logits / params.temperature
    if params.top_k > 0 and params.top_k < x.numel():
        kth = torch.topk(x, params.top_k).values[-1]
        x = x.masked_fill(x < kth, float("-inf"))
    probs = torch.softmax(x, dim=-1)
    if params.min_p > 0:
        probs = probs.masked_fill(probs < params.min_p * probs.max(), 0.0)
    if params.top_p < 1:
        sorted_probs, order = torch.sort(probs, descending=True)
        before = torch.cumsum(sorted_probs, dim=0) - sorted_probs
        sorted_probs = sorted_probs.masked_fill(before > params.top_p * sorted_probs.sum(), 0.0)
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
    return torch.multinomial(probs / probs.sum(), 1, generator=gen).squeeze(0)
