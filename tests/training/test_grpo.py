"""The GRPO objective, checked against a separately written reference on hand-made cases.

``grpo_loss`` is the clipped, importance-weighted policy gradient of PPO with GRPO's
group-normalised advantages, averaged over every sampled token of the micro-batch (per
token, not per sequence). The model here is a table of logits, one row per position, so
every log-probability and every gradient is known in closed form: a flipped sign, an
ignored advantage or mask, a clip on the wrong side, or a per-sequence mean would each
change a number these tests pin down.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from vf_mm.errors import TrajectoryError
from vf_mm.training import MicroBatch, grpo_loss, token_logprobs

VOCAB = 11


class TableModel(torch.nn.Module):
    """Logits that depend only on the position: row ``t`` of ``table`` for every sample."""

    def __init__(self, length: int, seed: int = 0) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.table = torch.nn.Parameter(torch.randn(length, VOCAB, generator=gen))

    def forward(self, input_ids, attention_mask=None, **_):
        rows, length = input_ids.shape
        return SimpleNamespace(logits=self.table[:length].unsqueeze(0).expand(rows, -1, -1))


def micro_batch(ids, mask, old, adv) -> MicroBatch:
    ids = torch.tensor(ids, dtype=torch.long)
    return MicroBatch(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        loss_mask=torch.tensor(mask, dtype=torch.float32),
        logprobs=torch.tensor(old, dtype=torch.float32),
        advantages=torch.tensor(adv, dtype=torch.float32),
        mm_token_type_ids=torch.zeros_like(ids),
        images=None,
        sources=[f"row {i}" for i in range(len(ids))],
    )


def table_logprob(model: TableModel, token: int, position: int) -> float:
    """log p(token at ``position``), from the logits at ``position - 1``, by hand."""
    row = model.table[position - 1].detach().tolist()
    top = max(row)
    return row[token] - top - math.log(sum(math.exp(x - top) for x in row))


def reference_loss(model, batch, clip_eps=0.2) -> float:
    """The objective written out token by token: -mean over sampled tokens of
    min(r * A, clip(r, 1 - eps, 1 + eps) * A), r = exp(new - old)."""
    total, count = 0.0, 0
    for b, row in enumerate(batch.input_ids.tolist()):
        for t in range(1, len(row)):
            if batch.loss_mask[b, t] == 0:
                continue
            ratio = math.exp(table_logprob(model, row[t], t) - float(batch.logprobs[b, t]))
            adv = float(batch.advantages[b, t])
            clipped = min(max(ratio, 1 - clip_eps), 1 + clip_eps)
            total -= min(ratio * adv, clipped * adv)
            count += 1
    return total / max(count, 1)


def new_logprobs(model, ids) -> list[list[float]]:
    return [[0.0] + [table_logprob(model, row[t], t) for t in range(1, len(row))] for row in ids]


def test_token_logprobs_reads_each_token_from_the_previous_positions_logits():
    model = TableModel(6)
    ids = [[3, 1, 4, 1, 5, 9], [2, 7, 1, 8, 2, 8]]
    got = token_logprobs(model, micro_batch(ids, [[0] * 6] * 2, [[0.0] * 6] * 2, [[0.0] * 6] * 2))
    assert got.shape == (2, 6)
    assert torch.allclose(got, torch.tensor(new_logprobs(model, ids)), atol=1e-6)


@pytest.mark.parametrize("seed", range(6))
def test_the_loss_equals_the_reference_on_random_batches(seed):
    """Ratios spread over both sides of both clip bounds, advantages of both signs, masks
    with holes, and rows of different numbers of sampled tokens."""
    gen = torch.Generator().manual_seed(seed)
    model = TableModel(8, seed)
    ids = torch.randint(0, VOCAB, (3, 8), generator=gen).tolist()
    mask = (torch.rand(3, 8, generator=gen) < 0.6).float()
    mask[:, 0] = 0
    new = torch.tensor(new_logprobs(model, ids))
    old = (new + torch.randn(3, 8, generator=gen) * 0.4) * mask  # ratios from ~0.3 to ~3
    adv = torch.randn(3, 8, generator=gen)
    batch = micro_batch(ids, mask.tolist(), old.tolist(), adv.tolist())
    loss, stats = grpo_loss(model, batch)
    assert loss.item() == pytest.approx(reference_loss(model, batch), rel=1e-5, abs=1e-6)
    assert stats["tokens"] == float(mask.sum())


def on_policy(model, ids, mask, adv):
    """A batch whose sampler log-probabilities are the model's own (every ratio is 1)."""
    old = [[lp * m for lp, m in zip(row, mrow, strict=True)] for row, mrow in
           zip(new_logprobs(model, ids), mask, strict=True)]  # fmt: skip
    return micro_batch(ids, mask, old, adv)


def test_on_policy_the_loss_is_minus_the_mean_advantage_and_pushes_up_good_tokens():
    model = TableModel(4)
    ids = [[0, 5, 2, 7]]
    batch = on_policy(model, ids, [[0, 1, 1, 0]], [[0.0, 2.0, -1.0, 9.0]])
    loss, _ = grpo_loss(model, batch)
    assert loss.item() == pytest.approx(-(2.0 - 1.0) / 2, abs=1e-6)
    loss.backward()
    grad = model.table.grad
    # raising the logit of a positive-advantage token lowers the loss, and the reverse
    assert grad[0, 5] < 0  # token 5 at position 1 (advantage +2), from row 0
    assert grad[1, 2] > 0  # token 2 at position 2 (advantage -1), from row 1
    assert torch.all(grad[2] == 0) and torch.all(grad[3] == 0)  # position 3 is not sampled


def test_the_loss_scales_with_the_advantages_and_vanishes_without_them():
    model = TableModel(5)
    ids, mask = [[1, 2, 3, 4, 5]], [[0, 1, 1, 1, 1]]
    base = [[0.0, 1.0, -0.5, 0.25, 2.0]]
    one, _ = grpo_loss(model, on_policy(model, ids, mask, base))
    two, _ = grpo_loss(model, on_policy(model, ids, mask, [[2 * a for a in base[0]]]))
    zero, _ = grpo_loss(model, on_policy(model, ids, mask, [[0.0] * 5]))
    assert two.item() == pytest.approx(2 * one.item(), rel=1e-6)
    assert zero.item() == 0.0 and one.item() != 0.0


def test_tokens_outside_the_loss_mask_change_nothing():
    model = TableModel(6)
    ids, mask = [[1, 2, 3, 4, 5, 6]], [[0, 1, 0, 1, 0, 0]]
    batch = on_policy(model, ids, mask, [[0.0, 1.0, 0.0, -2.0, 0.0, 0.0]])
    loss, _ = grpo_loss(model, batch)
    loss.backward()
    grad = model.table.grad.clone()
    model.table.grad = None
    noisy = micro_batch(ids, mask, [[0.0, batch.logprobs[0, 1].item(), -7.0,
                                     batch.logprobs[0, 3].item(), 3.0, -1.0]],
                        [[5.0, 1.0, 100.0, -2.0, -50.0, 8.0]])  # fmt: skip
    other, _ = grpo_loss(model, noisy)
    other.backward()
    assert other.item() == pytest.approx(loss.item(), abs=1e-7)
    assert torch.equal(model.table.grad, grad)
    assert torch.all(grad[1] == 0) and torch.all(grad[3:] == 0)  # unmasked rows: no gradient


@pytest.mark.parametrize(
    ("log_ratio", "adv", "flows"),
    [
        (math.log(1.5), 1.0, False),  # above 1 + eps, good token: clipped, no gradient
        (math.log(1.5), -1.0, True),  # above 1 + eps, bad token: the unclipped term is kept
        (math.log(0.5), -1.0, False),  # below 1 - eps, bad token: clipped
        (math.log(0.5), 1.0, True),  # below 1 - eps, good token: kept
        (math.log(1.1), 1.0, True),  # inside the band: never clipped
    ],
)
def test_the_clip_stops_the_gradient_only_on_the_side_that_would_overshoot(log_ratio, adv, flows):
    model = TableModel(3)
    ids = [[0, 4, 1]]
    new = new_logprobs(model, ids)[0][1]
    batch = micro_batch(ids, [[0, 1, 0]], [[0.0, new - log_ratio, 0.0]], [[0.0, adv, 0.0]])
    loss, stats = grpo_loss(model, batch, clip_eps=0.2)
    assert loss.item() == pytest.approx(reference_loss(model, batch), rel=1e-5)
    loss.backward()
    assert bool(model.table.grad.abs().sum() > 0) is flows
    assert stats["clip_frac"] == (1.0 if abs(math.exp(log_ratio) - 1) > 0.2 else 0.0)


def test_the_mean_is_over_tokens_not_over_sequences():
    """A row with one sampled token and a row with three: each token weighs the same."""
    model = TableModel(5)
    ids = [[1, 2, 3, 4, 5], [5, 4, 3, 2, 1]]
    mask = [[0, 1, 0, 0, 0], [0, 1, 1, 1, 0]]
    adv = [[0.0, 4.0, 0.0, 0.0, 0.0], [0.0, 1.0, 1.0, 1.0, 0.0]]
    loss, _ = grpo_loss(model, on_policy(model, ids, mask, adv))
    per_token = -(4.0 + 3 * 1.0) / 4
    per_sequence = -(4.0 / 1 + 3.0 / 3) / 2
    assert loss.item() == pytest.approx(per_token, abs=1e-6)
    assert per_token != pytest.approx(per_sequence)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("field", ["advantages", "logprobs"])
def test_a_non_finite_advantage_or_logprob_is_refused_by_name_not_a_nan_loss(field, bad):
    """A None advantage once became NaN here and the loss tensor(nan), silently."""
    model = TableModel(4)
    ids, mask = [[0, 5, 2, 7], [1, 1, 1, 1]], [[0, 1, 1, 0], [0, 1, 0, 0]]
    batch = on_policy(model, ids, mask, [[0.0, 1.0, -1.0, 0.0], [0.0, 0.5, 0.0, 0.0]])
    getattr(batch, field)[1, 1] = bad
    with pytest.raises(TrajectoryError, match=rf"row 1: the batch's {field} hold .* at token 1"):
        grpo_loss(model, batch)
