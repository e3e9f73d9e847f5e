"""logprob_mismatch: the sampler/trainer gap on the sampled tokens, against hand values."""

from __future__ import annotations

import math

import pytest
import torch

from tests.training.test_grpo import TableModel, on_policy
from vf_mm.errors import TrajectoryError
from vf_mm.training import MicroBatch, grpo_loss, logprob_mismatch


def batch(old, mask) -> MicroBatch:
    ids = torch.zeros((len(old), len(old[0])), dtype=torch.long)
    return MicroBatch(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        loss_mask=torch.tensor(mask, dtype=torch.float32),
        logprobs=torch.tensor(old, dtype=torch.float32),
        advantages=torch.zeros(ids.shape),
        mm_token_type_ids=torch.zeros_like(ids),
        images=None,
        sources=[f"example 0, rollout {i}, steps 0-0" for i in range(len(old))],
    )


def k3(new: float, old: float) -> float:
    d = new - old
    return math.expm1(d) - d


def test_the_masked_k3_kl_and_the_largest_difference_by_hand():
    b = batch([[0.0, -1.0, -2.0, 0.0], [0.0, -0.5, 0.0, 0.0]], [[0, 1, 1, 0], [0, 1, 0, 0]])
    # unmasked positions differ wildly (padding, prompt tokens): they must not count
    new = torch.tensor([[5.0, -0.9, -2.2, -9.0], [-7.0, -0.5, 3.0, 0.0]])
    got = logprob_mismatch(b, new)
    f32 = [float(torch.tensor(x)) for x in (-0.9, -2.2)]
    expected = (k3(f32[0], -1.0) + k3(f32[1], -2.0) + 0.0) / 3
    assert got["mismatch_kl"] == pytest.approx(expected, rel=1e-12)
    assert got["max_abs_diff"] == pytest.approx(abs(f32[1] + 2.0), rel=1e-12)
    assert got["tokens"] == 3.0


def test_equal_logprobs_give_zero_and_a_tiny_gap_is_not_lost_to_rounding():
    old = [[0.0, -1.0, -1.0]]
    b = batch(old, [[0, 1, 1]])
    assert logprob_mismatch(b, torch.tensor(old)) == {
        "mismatch_kl": 0.0, "max_abs_diff": 0.0, "tokens": 2.0,
    }  # fmt: skip
    near = torch.tensor([[0.0, -1.0 + 1e-4, -1.0]])
    d = float(near[0, 1]) + 1.0
    got = logprob_mismatch(b, near)["mismatch_kl"]
    assert got > 0 and got == pytest.approx(d * d / 2 / 2, rel=1e-3)  # exp(d)-d-1 ~ d^2/2


def test_a_batch_without_sampled_tokens_has_no_mismatch():
    b = batch([[0.0, 0.0]], [[0, 0]])
    assert logprob_mismatch(b, torch.tensor([[3.0, -3.0]])) == {
        "mismatch_kl": 0.0, "max_abs_diff": 0.0, "tokens": 0.0,
    }  # fmt: skip


@pytest.mark.parametrize(
    ("new", "says"),
    [
        (torch.zeros(1, 3), r"shape \(1, 3\), but the batch's tokens are \(2, 4\)"),
        (torch.zeros(4, 2), r"shape \(4, 2\)"),
        ([[0.0] * 4] * 2, "must be a torch.Tensor"),
    ],
)
def test_a_shape_mismatch_is_refused_by_name(new, says):
    b = batch([[0.0] * 4, [0.0] * 4], [[0, 1, 1, 0], [0, 1, 0, 0]])
    with pytest.raises(TrajectoryError, match=says):
        logprob_mismatch(b, new)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_input_is_refused_naming_the_sample_and_token(bad):
    b = batch([[0.0, -1.0, 0.0], [0.0, -1.0, 0.0]], [[0, 1, 0], [0, 1, 1]])
    new = torch.tensor([[0.0, -1.0, bad], [0.0, -1.0, 0.0]])
    assert logprob_mismatch(b, new)["tokens"] == 3.0  # an unmasked position: not compared
    new[1, 2] = bad
    with pytest.raises(
        TrajectoryError, match=r"rollout 1, steps 0-0: trainer_logprobs hold .* token 2"
    ):
        logprob_mismatch(b, new)
    b.logprobs[0, 1] = bad
    with pytest.raises(
        TrajectoryError, match=r"rollout 0, .*: the batch's logprobs hold .* token 1"
    ):
        logprob_mismatch(b, torch.zeros(2, 3))


def test_grpo_loss_reports_the_mismatch_of_its_own_forward():
    model = TableModel(4)
    ids, mask = [[0, 5, 2, 7]], [[0, 1, 1, 0]]
    exact = on_policy(model, ids, mask, [[0.0, 1.0, -1.0, 0.0]])
    _, stats = grpo_loss(model, exact)
    assert stats["mismatch_kl"] == pytest.approx(0.0, abs=1e-12)
    assert stats["max_abs_diff"] < 1e-6
    exact.logprobs[0, 2] -= 0.5  # the sampler saw this token as less likely
    _, stats = grpo_loss(model, exact)
    assert stats["max_abs_diff"] == pytest.approx(0.5, abs=1e-5)
    assert stats["mismatch_kl"] == pytest.approx(k3(0.5, 0.0) / 2, rel=1e-4)
