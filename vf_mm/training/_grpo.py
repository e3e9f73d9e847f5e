"""The GRPO objective on a ``MicroBatch``: clipped importance-weighted policy gradient.

For each sampled token t (``loss_mask`` 1): the policy's log-probability of token t
comes from the logits at position t - 1; the ratio to the sampler's log-probability
(``logprobs``, recorded at sampling time) is clipped to ``[1 - eps, 1 + eps]`` as in PPO,
and weighted by the token's advantage (the rollout's group-normalised reward). The loss
is the negative mean over sampled tokens.
"""

from __future__ import annotations

from typing import Any

import torch

from vf_mm.training._batch import MicroBatch


def token_logprobs(model: Any, batch: MicroBatch) -> torch.Tensor:
    """(B, L) log-probability the model gives each token of ``batch.input_ids`` (0 at t=0)."""
    device = next(model.parameters()).device
    inputs = {k: v.to(device) for k, v in batch.model_inputs().items()}
    if "pixel_values" in inputs:
        inputs["pixel_values"] = inputs["pixel_values"].to(next(model.parameters()).dtype)
    logits = model(**inputs).logits.float()
    logp = torch.log_softmax(logits[:, :-1], dim=-1)
    picked = logp.gather(-1, inputs["input_ids"][:, 1:, None]).squeeze(-1)
    return torch.nn.functional.pad(picked, (1, 0))


def grpo_loss(
    model: Any, batch: MicroBatch, *, clip_eps: float = 0.2
) -> tuple[torch.Tensor, dict[str, float]]:
    new = token_logprobs(model, batch)
    device = new.device
    mask = batch.loss_mask.to(device)
    old = batch.logprobs.to(device)
    adv = batch.advantages.to(device)
    ratio = torch.exp((new - old) * mask)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * adv
    per_token = -torch.minimum(unclipped, clipped)
    count = mask.sum().clamp(min=1)
    loss = (per_token * mask).sum() / count
    with torch.no_grad():
        stats = {
            "loss": float(loss),
            "ratio": float((ratio * mask).sum() / count),
            "clip_frac": float((((ratio - 1).abs() > clip_eps).float() * mask).sum() / count),
            "kl": float(((old - new) * mask).sum() / count),
            "tokens": float(count),
        }
    return loss, stats
