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

from vf_mm.training._batch import MicroBatch, check_finite
from vf_mm.training._mismatch import logprob_mismatch


def token_logprobs(model: Any, batch: MicroBatch) -> torch.Tensor:
    """``(B, L)`` log-probability the model gives each token of ``batch.input_ids``.

    0 at t=0. The forward takes ``forward_inputs(batch.family, model, ...)``: the
    batch's inputs, with the vision features computed by vf_mm where transformers'
    forward computes them wrong (Kimi-K2.5 clips of multi-frame chunks), gradients
    through the tower either way.

    Args:
        model: The policy.
        batch: The micro-batch.
    """
    from vf_mm.models import forward_inputs

    device = next(model.parameters()).device
    inputs = {k: v.to(device) for k, v in batch.model_inputs().items()}
    if "pixel_values" in inputs:
        inputs["pixel_values"] = inputs["pixel_values"].to(next(model.parameters()).dtype)
    logits = model(**forward_inputs(batch.family, model, inputs)).logits.float()
    logp = torch.log_softmax(logits[:, :-1], dim=-1)
    picked = logp.gather(-1, inputs["input_ids"][:, 1:, None]).squeeze(-1)
    return torch.nn.functional.pad(picked, (1, 0))


def grpo_loss(
    model: Any, batch: MicroBatch, *, clip_eps: float = 0.2
) -> tuple[torch.Tensor, dict[str, float]]:
    """The clipped GRPO loss of one micro-batch under ``model``, and its statistics.

    With ``new`` the model's ``(B, L)`` log-probabilities (``token_logprobs``),
    ``r = exp(new - logprobs)`` and ``A = advantages``, the loss is

        -sum over masked tokens of min(r * A, clip(r, 1 - clip_eps, 1 + clip_eps) * A)
        / (number of masked tokens)

    a 0-dimensional tensor with gradients through ``model`` (each token weighs the same,
    whatever its sequence's length; a batch without masked tokens gives 0). To combine
    micro-batches into one step, weigh each loss by its ``tokens`` over the step's total.

    Statistics (floats, over the masked tokens): ``loss``; ``ratio``, the mean of ``r``
    (1.0 when the trainer computes what the sampler did); ``clip_frac``, the share of
    tokens whose ``r`` is outside the clip range; ``kl``, the mean of ``logprobs - new``
    (an estimate of KL(sampler || trainer) that may be negative); ``tokens``, how many;
    ``mismatch_kl`` and ``max_abs_diff``, the sampler/trainer mismatch of the same tokens
    (``logprob_mismatch``: the non-negative k3 estimate of that KL, and the worst token's
    ``|new - logprobs|``).

    Args:
        model: The policy (a transformers model).
        batch: ``B`` right-padded rows of ``L`` tokens: ``input_ids``, ``loss_mask`` (1 on
            the tokens the sampler drew), ``logprobs`` (the sampler's log-probability of
            each drawn token) and ``advantages`` (the rollout's advantage on each drawn
            token), all ``(B, L)``.
        clip_eps: The clip range's half-width.

    Raises:
        TrajectoryError: ``advantages`` or ``logprobs`` hold a NaN or an infinity anywhere,
            padding included (naming the field, the sample and the token): one would make
            the loss NaN, and a step on it ruins the weights.
    """
    check_finite(batch, ("advantages", "logprobs"))
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
    mismatch = logprob_mismatch(batch, new)
    stats["mismatch_kl"], stats["max_abs_diff"] = mismatch["mismatch_kl"], mismatch["max_abs_diff"]
    return loss, stats
