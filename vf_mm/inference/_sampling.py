"""Per-request sampling inside one batched forward pass.

Rollouts batched together may each want their own temperature, filters, seed and stop
tokens. ``sample_rows`` samples every row of a ``(rows, vocab)`` score tensor by its
own request's rules, with the request's own ``torch.Generator`` (so a seeded request
repeats whatever else shares its batch), and returns each sampled token's raw
log-probability (before temperature and filters, vLLM's ``raw_logprobs``). Suppressed
tokens (an image's own tokens: they need image inputs), for every row and each row's
own (a request's ``banned_token_ids``), are never sampled. Greedy rows
are one batched ``argmax``; rows that sample are filtered in one batch and each draws
its noise from its own generator.

``sample_packed`` is the pool engine's sampler: the same rules, but its noise is a hash
of (the row's seed, the token's index in its completion, the vocabulary id) computed on
the device, not a draw from a per-row ``torch.Generator``. It needs no host sync and no
per-row launch, so a CUDA graph can hold it, and a seeded request still repeats
whatever else shares its batch.

``RowSampler`` and ``RowStopper`` put the same rules into Hugging Face ``generate``
(a logits processor and a stopping criterion) for the families the local backend runs
through ``generate``: ``RowSampler`` hands ``generate`` a one-hot row so its greedy
step picks exactly the sampled token.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from vf_mm.inference._types import SamplingParams


def sample_rows(
    scores: torch.Tensor,
    sampling: Sequence[SamplingParams],
    generators: Sequence[torch.Generator | None],
    suppress: torch.Tensor,
    row_suppress: Sequence[Sequence[int]] = (),
) -> tuple[torch.Tensor, list[int], list[float]]:
    """One token per row of ``scores`` (``(rows, vocab)``): the chosen ids as a tensor on
    the scores' device, and as Python ints with their raw log-probabilities.
    ``suppress``: ids no row samples; ``row_suppress`` (empty, or one sequence per row):
    ids that row does not sample besides.

    Rows that sample are filtered together (temperature, top-k, min-p, top-p, each row
    by its own values) and drawn by an exponential race: row r takes
    ``argmax(p_r / e_r)`` with ``e_r`` exponential noise from row r's own generator,
    which picks token i with probability ``p_r[i]``."""
    logits = scores.float()
    raw = torch.log_softmax(logits, dim=-1)
    if suppress.numel():
        logits = logits.index_fill(1, suppress.to(logits.device), float("-inf"))
    if any(row_suppress):
        rows = [r for r, ids in enumerate(row_suppress) for _ in ids]
        cols = [t for ids in row_suppress for t in ids]
        where = (torch.tensor(rows, device=logits.device), torch.tensor(cols, device=logits.device))
        logits = logits.index_put(where, torch.tensor(float("-inf"), device=logits.device))
    chosen = logits.argmax(dim=-1)
    hot = [i for i, params in enumerate(sampling) if params.temperature != 0]
    if hot:
        params = [sampling[i] for i in hot]
        index = torch.tensor(hot, device=logits.device)
        probs = _filtered_probs(logits.index_select(0, index), params)
        noise = torch.stack(
            [torch.empty_like(probs[0]).exponential_(generator=generators[i]) for i in hot]
        )
        chosen[index] = (probs / noise).argmax(dim=-1)
    picked = raw.gather(1, chosen[:, None]).squeeze(1)
    both = torch.stack([chosen.double(), picked.double()]).tolist()  # one device sync
    return chosen, [int(t) for t in both[0]], both[1]


def sample_packed(
    logits: torch.Tensor,
    *,
    temperature: torch.Tensor,
    seeds: torch.Tensor,
    counters: torch.Tensor,
    suppress: torch.Tensor,
    filters: Sequence[SamplingParams] | None = None,
    row_suppress: Sequence[Sequence[int]] = (),
) -> torch.Tensor:
    """One token per row of ``logits`` (``(rows, vocab)``), as ``(2, rows)`` float32: the
    ids (exact in float32 below 2**24) and their raw log-probabilities.

    A row with ``temperature`` 0 takes the argmax; another takes
    ``argmax(logits / temperature + g)`` with ``g`` Gumbel noise from ``gumbel_noise``
    (the Gumbel-max trick: token i with probability ``softmax(logits / temperature)[i]``).
    ``filters``: every row's ``SamplingParams`` when some use top-k, min-p or top-p
    (``_filtered_probs``, the same filters as ``sample_rows``); None when none does.
    ``suppress``: ids no row samples; ``row_suppress`` (empty, or one sequence per row):
    ids that row does not sample besides. Without ``filters`` and ``row_suppress`` nothing
    here depends on Python values (a CUDA graph can hold it)."""
    x = logits.float()
    raw = torch.log_softmax(x, dim=-1)
    if suppress.numel():
        x = x.index_fill(1, suppress, float("-inf"))
    if any(row_suppress):
        rows = [r for r, ids in enumerate(row_suppress) for _ in ids]
        cols = [t for ids in row_suppress for t in ids]
        where = (torch.tensor(rows, device=x.device), torch.tensor(cols, device=x.device))
        x = x.index_put(where, torch.tensor(float("-inf"), device=x.device))
    hot = temperature > 0
    noise = gumbel_noise(seeds, counters, x.shape[-1])
    if filters is not None and any(uses_filters(p) for p in filters):
        rows = [i for i, p in enumerate(filters) if p.temperature != 0]
        if rows:
            index = torch.tensor(rows, device=x.device)
            probs = _filtered_probs(x.index_select(0, index), [filters[i] for i in rows])
            x = x.index_copy(0, index, probs.log())
        scores = torch.where(hot[:, None], x + noise, x)
    else:
        scale = torch.where(hot, temperature, torch.ones_like(temperature))
        scores = torch.where(hot[:, None], x / scale[:, None] + noise, x)
    chosen = scores.argmax(dim=-1)
    picked = raw.gather(1, chosen[:, None]).squeeze(1)
    return torch.stack([chosen.float(), picked])


def uses_filters(params: SamplingParams) -> bool:
    """Whether a request samples with top-k, min-p or top-p (``sample_packed``'s
    ``filters``)."""
    return params.temperature != 0 and (params.top_k > 0 or params.min_p > 0 or params.top_p < 1)


# lowbias32 (a 32-bit integer hash: two multiply-xorshift rounds), in int32 arithmetic
# that wraps; ``(x >> k) & mask`` is a logical shift of a signed value
_MUL1 = 0x7FEB352D
_MUL2 = 0x846CA68B - (1 << 32)
_GOLDEN = 0x9E3779B9 - (1 << 32)


def _mix32(x: torch.Tensor) -> torch.Tensor:
    x = x ^ ((x >> 16) & 0xFFFF)
    x = x * _MUL1
    x = x ^ ((x >> 15) & 0x1FFFF)
    x = x * _MUL2
    return x ^ ((x >> 16) & 0xFFFF)


def gumbel_noise(seeds: torch.Tensor, counters: torch.Tensor, vocab: int) -> torch.Tensor:
    """``(rows, vocab)`` standard Gumbel noise, a function of each row's ``seeds`` and
    ``counters`` (int64) and the column only: the same seed and counter give the same
    noise on any batch, any device."""
    folded = (seeds ^ (seeds >> 32)).to(torch.int32)
    row = _mix32(_mix32(folded) ^ (counters.to(torch.int32) * _GOLDEN))
    column = _mix32(torch.arange(vocab, dtype=torch.int32, device=seeds.device) * _GOLDEN)
    # both sides are hashed already: one multiply-xorshift round joins them (the work
    # over rows x vocab is what a step pays for)
    bits = (column[None, :] ^ row[:, None]) * _MUL2
    bits = bits ^ ((bits >> 15) & 0x1FFFF)
    uniform = (((bits >> 8) & 0xFFFFFF).float() + 0.5) * (1.0 / (1 << 24))
    return -torch.log(-torch.log(uniform))


def _filtered_probs(logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """Each row's sampling distribution after its temperature, top-k, min-p and top-p
    (vLLM's order), unnormalised where a filter zeroed some of it."""
    device = logits.device
    x = logits / torch.tensor([p.temperature for p in params], device=device)[:, None]
    vocab = x.shape[-1]
    ks = [p.top_k if 0 < p.top_k < vocab else 0 for p in params]
    if any(ks):
        top = torch.topk(x, max(ks), dim=-1).values
        kth = top.gather(1, (torch.tensor(ks, device=device).clamp(min=1) - 1)[:, None])
        kth[torch.tensor([k == 0 for k in ks], device=device)] = float("-inf")
        x = x.masked_fill(x < kth, float("-inf"))
    probs = torch.softmax(x, dim=-1)
    if any(p.min_p > 0 for p in params):
        min_p = torch.tensor([p.min_p for p in params], device=device)[:, None]
        probs = probs.masked_fill(probs < min_p * probs.amax(dim=-1, keepdim=True), 0.0)
    if any(p.top_p < 1 for p in params):
        top_p = torch.tensor([p.top_p for p in params], device=device)[:, None]
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
        before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        keep = (before <= top_p * sorted_probs.sum(dim=-1, keepdim=True)) | (top_p >= 1)
        probs = torch.zeros_like(probs).scatter_(1, order, sorted_probs * keep)
    return probs


class Seeds:
    """Each request's seed: its own (``SamplingParams.seed``), else the next from one
    stream started at ``seed``, so a backend given the same seed and the same requests
    in the same order samples the same tokens."""

    def __init__(self, seed: int, device: torch.device) -> None:
        self._stream = np.random.default_rng(seed)
        self._device = device

    def seed(self, params: SamplingParams) -> int:
        """The request's seed, else one drawn from the stream."""
        return params.seed if params.seed is not None else int(self._stream.integers(2**63))

    def generator(self, seed: int) -> torch.Generator:
        """A request's own random stream (``sample_rows``), on the model's device."""
        return torch.Generator(self._device).manual_seed(seed)


class RowSampler:
    """A logits processor for ``generate``: every row sampled by its own request's rules
    (``sample_rows``), each sampled token's raw log-probability kept per row."""

    def __init__(
        self,
        sampling: Sequence[SamplingParams],
        generators: Sequence[torch.Generator],
        suppress_token_ids: Sequence[int],
        row_suppress: Sequence[Sequence[int]] = (),
    ) -> None:
        self.sampling = list(sampling)
        self.generators = list(generators)
        self.suppress = torch.tensor(sorted(set(suppress_token_ids)), dtype=torch.long)
        self.row_suppress = [list(ids) for ids in row_suppress]
        self.logprobs: list[list[float]] = [[] for _ in self.sampling]

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        chosen, _, picked = sample_rows(
            scores, self.sampling, self.generators, self.suppress, self.row_suppress
        )
        for row, value in enumerate(picked):
            self.logprobs[row].append(value)
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
