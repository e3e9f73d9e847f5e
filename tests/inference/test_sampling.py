"""Sampling draws from exactly the distribution the request asks for.

Each filter is checked statistically against its exact distribution, computed here
independently: temperature rescales the logits; ``top_k`` keeps the k most likely tokens;
``top_p`` keeps the smallest set of most likely tokens whose probability reaches p (the
token that crosses p included); ``min_p`` keeps the tokens at least ``min_p`` times as
likely as the most likely one. Draws come from seeded generators, so every run sees the
same draws: the tolerance (five standard errors) is for the law of large numbers, not
for luck. A filtered-out token must never be drawn at all.
"""

from __future__ import annotations

import math

import pytest
import torch

from vf_mm.inference import SamplingParams
from vf_mm.inference._sampling import RowSampler, gumbel_noise, sample_packed

LOGITS = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0])
DRAWS = 10_000


def draw(params: SamplingParams, *, draws: int = DRAWS, first_seed: int = 0) -> list[int]:
    """One token per row: ``draws`` rows with the same logits, each its own seeded
    generator (rows of one batch never share randomness)."""
    sampler = RowSampler(
        [params] * draws,
        [torch.Generator().manual_seed(first_seed + i) for i in range(draws)],
        suppress_token_ids=[],
    )
    out = sampler(torch.zeros((draws, 1), dtype=torch.long), LOGITS.repeat(draws, 1))
    chosen = out.argmax(dim=1)
    assert torch.all(out.gather(1, chosen[:, None]) == 0)  # a one-hot row for generate
    return chosen.tolist()


def softmax(values: list[float]) -> list[float]:
    top = max(values)
    weights = [math.exp(v - top) for v in values]
    return [w / sum(weights) for w in weights]


def keep(probs: list[float], kept: set[int]) -> list[float]:
    total = sum(p for i, p in enumerate(probs) if i in kept)
    return [p / total if i in kept else 0.0 for i, p in enumerate(probs)]


def expected(params: SamplingParams) -> list[float]:
    probs = softmax([v / params.temperature for v in LOGITS.tolist()])
    order = sorted(range(len(probs)), key=lambda i: -probs[i])
    if params.top_k > 0:
        probs = keep(probs, set(order[: params.top_k]))
    if params.min_p > 0:
        probs = keep(probs, {i for i, p in enumerate(probs) if p >= params.min_p * max(probs)})
    if params.top_p < 1:
        kept, mass = set(), 0.0
        for i in order:
            if mass >= params.top_p or probs[i] == 0:
                break
            kept.add(i)
            mass += probs[i]
        probs = keep(probs, kept)
    return probs


def assert_draws_follow(tokens: list[int], probs: list[float]) -> None:
    n = len(tokens)
    for token, p in enumerate(probs):
        freq = tokens.count(token) / n
        if p == 0:
            assert freq == 0, f"token {token} is filtered out but was drawn {freq:.4f} of the time"
            continue
        bound = 5 * math.sqrt(p * (1 - p) / n)
        assert abs(freq - p) <= bound, (token, freq, p, bound)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.5),
        SamplingParams(temperature=2.0),
        SamplingParams(temperature=1.0, top_k=3),
        SamplingParams(temperature=1.0, top_p=0.6),
        SamplingParams(temperature=1.0, top_p=0.9),
        SamplingParams(temperature=0.7, top_p=0.8),
        SamplingParams(temperature=1.0, min_p=0.2),
        SamplingParams(temperature=1.5, min_p=0.05),
        SamplingParams(temperature=1.0, top_k=5, top_p=0.8, min_p=0.1),
    ],
    ids=lambda p: f"T{p.temperature}-k{p.top_k}-p{p.top_p}-min{p.min_p}",
)
def test_draws_follow_the_exact_filtered_distribution(params):
    probs = expected(params)
    assert sum(1 for p in probs if p > 0) >= 2  # a real distribution, not a forced token
    assert_draws_follow(draw(params), probs)


def draw_packed(params: SamplingParams, *, draws: int = DRAWS, first_seed: int = 0) -> list[int]:
    """The pool engine's sampler: ``draws`` rows, row i seeded ``first_seed + i``."""
    seeds = torch.arange(first_seed, first_seed + draws)
    filtering = params.top_k > 0 or params.top_p < 1 or params.min_p > 0
    out = sample_packed(
        LOGITS.repeat(draws, 1),
        temperature=torch.full((draws,), float(params.temperature)),
        seeds=seeds,
        counters=torch.zeros(draws, dtype=torch.long),
        suppress=torch.tensor([], dtype=torch.long),
        filters=[params] * draws if filtering else None,
    )
    tokens = out[0].long()
    raw = torch.log_softmax(LOGITS, -1)
    assert torch.allclose(out[1], raw[tokens])  # each token's raw logprob
    return tokens.tolist()


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.5),
        SamplingParams(temperature=2.0),
        SamplingParams(temperature=1.0, top_k=3),
        SamplingParams(temperature=0.7, top_p=0.8),
        SamplingParams(temperature=1.0, top_k=5, top_p=0.8, min_p=0.1),
    ],
    ids=lambda p: f"T{p.temperature}-k{p.top_k}-p{p.top_p}-min{p.min_p}",
)
def test_the_pool_engines_draws_follow_the_same_distribution(params):
    assert_draws_follow(draw_packed(params), expected(params))


def test_the_pool_engines_noise_depends_on_seed_and_index_only():
    """A row's noise is the same in any batch (a seeded request repeats whatever shares
    its step), differs from step to step and from seed to seed, and is standard Gumbel."""
    seeds = torch.tensor([3, 9, 3, 12])
    counters = torch.tensor([0, 0, 1, 0])
    noise = gumbel_noise(seeds, counters, 5000)
    alone = gumbel_noise(seeds[:1], counters[:1], 5000)
    assert torch.equal(noise[0], alone[0])
    assert not torch.equal(noise[0], noise[2]) and not torch.equal(noise[0], noise[1])
    mean, std = noise.mean().item(), noise.std().item()
    assert abs(mean - 0.5772) < 0.05 and abs(std - math.pi / math.sqrt(6)) < 0.05


def test_the_pool_engine_never_draws_a_suppressed_token_and_greedy_is_the_argmax():
    logits = LOGITS.repeat(400, 1)
    temperature = torch.tensor([0.0] * 200 + [1.0] * 200)
    out = sample_packed(
        logits,
        temperature=temperature,
        seeds=torch.arange(400),
        counters=torch.zeros(400, dtype=torch.long),
        suppress=torch.tensor([1, 2]),
    )
    tokens = out[0].long()
    assert set(tokens[:200].tolist()) == {0}
    assert not ({1, 2} & set(tokens.tolist()))
    assert len(set(tokens[200:].tolist())) > 3


def test_the_filters_exclude_what_they_should():
    """The reference itself, pinned on the fixture's numbers (so a wrong reference cannot
    hide a wrong sampler): top_p 0.6 keeps 0.405 and then 0.245, which crosses 0.6; min_p
    0.2 keeps what is at least 0.2 x 0.405 = 0.081 likely (0.090 in, 0.055 out)."""
    base = softmax(LOGITS.tolist())
    assert [round(p, 3) for p in base[:5]] == [0.405, 0.245, 0.149, 0.09, 0.055]
    assert [i for i, p in enumerate(expected(SamplingParams(top_p=0.6))) if p] == [0, 1]
    assert [i for i, p in enumerate(expected(SamplingParams(min_p=0.2))) if p] == [0, 1, 2, 3]


def test_temperature_zero_is_the_argmax():
    assert set(draw(SamplingParams(temperature=0.0), draws=50)) == {0}


def test_the_same_seed_repeats_and_different_seeds_differ():
    params = SamplingParams(temperature=1.0)
    first = draw(params, draws=200, first_seed=7)
    assert draw(params, draws=200, first_seed=7) == first
    assert draw(params, draws=200, first_seed=1_000) != first


def test_the_local_backend_honours_each_requests_seed(tiny_vlm_checkpoint):
    """A request's seed decides its tokens: the same seed repeats in another batch of the
    same backend, and different seeds give different completions."""
    import asyncio

    from vf_mm.inference import GenerateRequest, LocalBackend
    from vf_mm.renderers import load_renderer

    renderer = load_renderer(tiny_vlm_checkpoint)
    prompt = renderer.render([{"role": "user", "content": "Count the circles."}]).token_ids

    async def main():
        backend = LocalBackend(tiny_vlm_checkpoint, batch_window_ms=0)
        try:

            async def one(seed):
                params = SamplingParams(max_tokens=8, temperature=1.0, seed=seed)
                return (await backend.generate(GenerateRequest(prompt, params))).completion_ids

            return [await one(s) for s in (5, 6, 7, 8, 5)]
        finally:
            await backend.aclose()

    outs = asyncio.run(main())
    assert outs[0] == outs[4]  # seed 5 again, in a later batch
    assert len({tuple(o) for o in outs[:4]}) >= 3  # four seeds: (almost) all differ
