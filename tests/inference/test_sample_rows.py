"""sample_rows, the batched sampler: every row of one batch sampled by its own rules and
its own generator; suppressed tokens never drawn; raw logprobs whatever the filters."""

from __future__ import annotations

import math

import pytest
import torch

from vf_mm.inference import SamplingParams
from vf_mm.inference._sampling import sample_rows

NONE = torch.tensor([], dtype=torch.long)


def draws(scores, params, n=2000, seed=0, suppress=NONE):
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        _, tokens, _ = sample_rows(scores[None], [params], [gen], suppress)
        out.append(tokens[0])
    return out


def test_a_sampling_row_follows_its_distribution():
    probs = torch.tensor([0.5, 0.3, 0.2])
    tokens = draws(probs.log(), SamplingParams(temperature=1.0), n=4000)
    for token, p in enumerate(probs.tolist()):
        assert tokens.count(token) / len(tokens) == pytest.approx(p, abs=0.03)


def test_filters_keep_only_what_they_allow():
    scores = torch.tensor([0.6, 0.25, 0.1, 0.05]).log()
    assert set(draws(scores, SamplingParams(top_k=2), n=300)) == {0, 1}
    assert set(draws(scores, SamplingParams(top_p=0.5), n=300)) == {0}
    assert set(draws(scores, SamplingParams(top_p=0.8), n=300)) == {0, 1}
    assert set(draws(scores, SamplingParams(min_p=0.3), n=300)) == {0, 1}


def test_each_row_of_a_batch_has_its_own_rules_and_generator():
    scores = torch.tensor([0.4, 0.35, 0.25]).log().expand(3, -1).clone()
    params = [SamplingParams(temperature=0), SamplingParams(top_k=1), SamplingParams(seed=5)]

    def batch(seed_others: int) -> list[int]:
        gens = [torch.Generator().manual_seed(seed_others), torch.Generator().manual_seed(1),
                torch.Generator().manual_seed(5)]  # fmt: skip
        return [sample_rows(scores, params, gens, NONE)[1] for _ in range(20)]

    first, second = batch(0), batch(99)
    assert all(row[0] == 0 and row[1] == 0 for row in first)
    assert [row[2] for row in first] == [row[2] for row in second]  # row 3 repeats
    assert len({row[2] for row in first}) > 1


def test_suppressed_tokens_are_never_drawn_and_logprobs_stay_raw():
    scores = torch.tensor([5.0, 0.0, 0.0])
    suppress = torch.tensor([0])
    gen = torch.Generator().manual_seed(0)
    for params in (SamplingParams(temperature=0), SamplingParams(temperature=2.0, top_p=0.9)):
        _, tokens, logprobs = sample_rows(scores[None], [params], [gen], suppress)
        assert tokens[0] != 0
        assert logprobs[0] == pytest.approx(float(torch.log_softmax(scores, -1)[tokens[0]]))
        assert not math.isnan(logprobs[0])
