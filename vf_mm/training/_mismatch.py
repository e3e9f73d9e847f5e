"""The sampler/trainer mismatch: how far the trainer's log-probabilities of the sampled
tokens are from the ones the sampler recorded.

On policy, with the sampler's weights, the two should agree: the GRPO ratio is then 1
and the loss is what its formula says. They drift apart when the two sides compute
differently (kernels, dtypes, batch shapes, image processing, a template that rendered
other tokens) or the sampler's weights are stale, and a large gap biases every update.
So a trainer watches it every step: ``logprob_mismatch(batch, token_logprobs(model,
batch))``.

Over the tokens the sampler drew (``loss_mask`` 1), with ``d = trainer - sampler``:

- ``mismatch_kl``: the mean of ``exp(d) - d - 1``, the "k3" estimator of
  KL(sampler || trainer) from the sampler's own samples (what prime-rl logs as
  ``mismatch_kl``): never negative, 0 exactly when the two agree on every token, and
  about ``d**2 / 2`` for a small gap. Computed in float64 with ``expm1``, so a gap of
  1e-4 is not lost to float32 rounding;
- ``max_abs_diff``: the largest ``|d|``, the worst token;
- ``tokens``: how many tokens were compared.

A batch without drawn tokens gives 0 for both (nothing differs). Inputs that cannot be
compared are refused with ``TrajectoryError`` naming what is wrong: trainer logprobs
whose shape is not the batch's ``(B, L)``, and a NaN or an infinity in them (on a drawn
token) or in the batch's own logprobs (anywhere), naming the sample and the token.
"""

from __future__ import annotations

import torch

from vf_mm.errors import TrajectoryError
from vf_mm.training._batch import MicroBatch, check_finite, first_non_finite


def logprob_mismatch(batch: MicroBatch, trainer_logprobs: torch.Tensor) -> dict[str, float]:
    """``{"mismatch_kl", "max_abs_diff", "tokens"}`` of the sampler against the trainer.

    The module docstring defines each number and what is refused.

    Args:
        batch: The micro-batch (its ``logprobs`` are the sampler's).
        trainer_logprobs: The trainer's ``(B, L)`` log-probability of each of the batch's
            tokens (``token_logprobs(model, batch)``; gradients are not followed).
    """
    if not isinstance(trainer_logprobs, torch.Tensor):
        raise TrajectoryError(
            f"trainer_logprobs must be a torch.Tensor of shape {tuple(batch.input_ids.shape)}, "
            f"not a {type(trainer_logprobs).__name__} (token_logprobs(model, batch) gives one)"
        )
    if tuple(trainer_logprobs.shape) != tuple(batch.input_ids.shape):
        raise TrajectoryError(
            f"trainer_logprobs has shape {tuple(trainer_logprobs.shape)}, but the batch's "
            f"tokens are {tuple(batch.input_ids.shape)} (one per token, 0 at t=0: "
            "token_logprobs(model, batch) gives them)"
        )
    check_finite(batch, ("logprobs",))
    new = trainer_logprobs.detach().to(torch.float64)
    mask = batch.loss_mask.to(new.device) > 0
    found = first_non_finite(batch, new, where=mask)
    if found is not None:
        source, row, token, _ = found
        raise TrajectoryError(
            f"{source}: trainer_logprobs hold {float(new[row, token])} at token {token} (row "
            f"{row}), a token the sampler drew: the trainer gives it no finite log-probability"
        )
    count = int(mask.sum())
    if count == 0:
        return {"mismatch_kl": 0.0, "max_abs_diff": 0.0, "tokens": 0.0}
    d = new[mask] - batch.logprobs.to(new.device, torch.float64)[mask]
    return {
        "mismatch_kl": float((torch.expm1(d) - d).mean()),
        "max_abs_diff": float(d.abs().max()),
        "tokens": float(count),
    }
