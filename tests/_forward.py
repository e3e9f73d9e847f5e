"""The trainer's side of the sampler/trainer agreement, shared by the family tests."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from vf_mm.training import token_logprobs


def assert_scores_as_sampled(model: Any, batches: Sequence[Any], *, atol: float = 2e-4) -> None:
    """``model`` (in eval mode) gives back, on every batch's trained tokens, the logprobs
    the sampler recorded for them, within ``atol`` (float32 across two code paths); each
    batch trains at least one token, so the claim is never vacuous."""
    for batch in batches:
        with torch.no_grad():
            ours = token_logprobs(model, batch)
        mask = batch.loss_mask.bool()
        assert mask.any()
        assert torch.allclose(ours[mask], batch.logprobs[mask], atol=atol)
