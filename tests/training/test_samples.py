"""Training samples from real rollouts: merging, masks, logprob alignment, images, packing."""

from __future__ import annotations

import asyncio
import math

import numpy as np
import pytest
import torch
from PIL import Image

import vf_mm as vf
from vf_mm.errors import TrajectoryError
from vf_mm.renderers import load_renderer
from vf_mm.testing import ScriptedBackend, build_tiny_vlm
from vf_mm.training._batch import make_batches
from vf_mm.training._samples import build_samples, group_advantages


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    path = build_tiny_vlm(tmp_path_factory.mktemp("samples") / "m", "qwen2_5_vl")
    return path, load_renderer(path)


def picture(seed):
    return Image.fromarray(
        np.random.default_rng(seed).integers(0, 256, (56, 84, 3), dtype=np.uint8)
    )


class Nav(vf.MultiTurnEnv):
    async def env_response(self, messages, state):
        if state.get("compact") and state["turn"] == 2:  # rewrite history: drop the first image
            state["done"] = False
        return [{"role": "user", "content": [{"type": "image", "image": picture(state["turn"])},
                                             {"type": "text", "text": "next"}]}]  # fmt: skip


def rollout(renderer, turns=3):
    env = Nav(dataset=[{"question": "go", "image": picture(99)}], max_turns=turns)
    client = vf.RendererClient(ScriptedBackend(renderer, ["left", "up"]), renderer)
    return asyncio.run(env.rollout(client, env.get_dataset()[0]))


def test_extending_steps_merge_into_one_sample(setup):
    _, renderer = setup
    state = rollout(renderer)
    pad = renderer.vision.image_token_id
    (sample,) = build_samples(state, advantage=0.5, image_token_id=pad)
    last = state["trajectory"][-1].tokens
    assert sample.input_ids.tolist() == last.prompt_ids + last.completion_ids
    # loss mask exactly on the three sampled completions
    expected = np.zeros(sample.num_tokens, dtype=np.int8)
    for step in state["trajectory"]:
        begin = len(step.tokens.prompt_ids)
        expected[begin : begin + len(step.tokens.completion_ids)] = 1
        assert sample.logprobs[
            begin : begin + len(step.tokens.completion_ids)
        ].tolist() == pytest.approx(step.tokens.completion_logprobs)
    assert sample.loss_mask.tolist() == expected.tolist()
    assert np.all(sample.advantages[expected == 1] == 0.5) and np.all(
        sample.advantages[expected == 0] == 0
    )
    # the images: three (the prompt's + one per env turn before the last model turn)
    assert sample.image_grid_thw.shape == (3, 3)
    assert sample.pixel_values.shape[0] == int(sample.image_grid_thw.prod(axis=1).sum())
    assert np.array_equal(sample.mm_token_type_ids == 1, sample.input_ids == pad)
    sample.validate(image_token_id=pad)


def test_a_step_that_does_not_extend_starts_a_new_sample(setup):
    _, renderer = setup
    state = rollout(renderer)
    for step in state["trajectory"][1:]:  # history rewritten from step 1 on (compaction)
        step.tokens.prompt_ids = step.tokens.prompt_ids[5:]
        step.tokens.multi_modal_data = step.tokens.multi_modal_data.shifted(-5)
    samples = build_samples(state, advantage=1.0, image_token_id=renderer.vision.image_token_id)
    assert [s.source.split("steps ")[1] for s in samples] == ["0-0", "1-2"]


def test_mismatched_images_are_an_error_naming_the_rollout(setup):
    _, renderer = setup
    state = rollout(renderer, turns=1)
    (sample,) = build_samples(state, advantage=1.0, image_token_id=renderer.vision.image_token_id,
                              example_id=3, rollout_index=1)  # fmt: skip
    sample.images[0] = {
        **sample.images[0],
        "image_grid_thw": sample.images[0]["image_grid_thw"] * 2,
    }
    with pytest.raises(
        TrajectoryError, match=r"example 3, rollout 1.*image tokens but the images' grids"
    ):
        sample.validate(image_token_id=renderer.vision.image_token_id)


def test_api_backend_steps_are_not_trainable(setup):
    _, renderer = setup
    state = rollout(renderer, turns=1)
    state["trajectory"][0].tokens = None
    with pytest.raises(TrajectoryError, match="no token ids"):
        build_samples(state, advantage=1.0, image_token_id=renderer.vision.image_token_id)


def test_batches_keep_modalities_apart_and_respect_the_budget(setup):
    _, renderer = setup
    pad = renderer.vision.image_token_id
    mm = build_samples(rollout(renderer), advantage=1.0, image_token_id=pad)
    text_state = asyncio.run(vf.SingleTurnEnv(dataset=[{"question": "hi"}]).rollout(
        vf.RendererClient(ScriptedBackend(renderer, ["hello"]), renderer), {"question": "hi"}))  # fmt: skip
    text = build_samples(text_state, advantage=-1.0, image_token_id=pad)
    budget = 2 * max(s.num_tokens for s in mm + text)
    batches = make_batches(
        mm * 3 + text * 3, token_budget=budget, pad_token_id=0, image_token_id=pad
    )
    assert all(b.input_ids.numel() <= budget for b in batches)
    kinds = [b.is_multimodal for b in batches]
    assert True in kinds and False in kinds
    for b in batches:
        if b.is_multimodal:
            assert b.pixel_values.cat().shape[0] == int(b.image_grid_thw.cat().prod(dim=1).sum())
    assert sum(b.input_ids.shape[0] for b in batches) == 6


def test_never_truncated_through_an_image(setup):
    _, renderer = setup
    pad = renderer.vision.image_token_id
    (sample,) = build_samples(rollout(renderer), advantage=1.0, image_token_id=pad)
    offset, length = sample.placeholders[2].offset, sample.placeholders[2].length
    limit = offset + length // 2  # inside the third image
    with pytest.raises(TrajectoryError, match="through an image"):
        make_batches(
            [sample], token_budget=10_000, pad_token_id=0, image_token_id=pad, max_seq_len=limit
        )
    (batch,) = make_batches([sample], token_budget=10_000, pad_token_id=0, image_token_id=pad,
                            max_seq_len=limit, truncate="image_boundary")  # fmt: skip
    assert batch.input_ids.shape[1] == offset and batch.image_grid_thw.cat().shape == (2, 3)


def test_group_advantages():
    assert group_advantages([1.0, 0.0, 1.0, 0.0]) == pytest.approx([1, -1, 1, -1], abs=1e-3)
    assert group_advantages([0.5, 0.5]) == [0.0, 0.0]
    assert group_advantages([3.0, 1.0], scale=False) == [1.0, -1.0]
    assert group_advantages([True, False], scale=False) == [0.5, -0.5]
    assert group_advantages(torch.tensor([3.0, 1.0]), scale=False) == [1.0, -1.0]
    assert group_advantages(np.array([3.0, 1.0]), scale=False) == [1.0, -1.0]


def test_group_advantages_skip_failed_rollouts_never_averaging_them_in():
    """An errored rollout's reward is None: its advantage is None and the others are
    normalised among themselves (it once made every advantage of the group NaN)."""
    got = group_advantages([1.0, None, 0.0, None])
    assert got[1] is None and got[3] is None
    assert got[0] == pytest.approx(1, abs=1e-3) and got[2] == pytest.approx(-1, abs=1e-3)
    assert group_advantages([None, None]) == [None, None]


@pytest.mark.parametrize("scale", [1e200, 1e-200, 1.0])
def test_group_advantages_of_rewards_near_the_float_range_are_not_lost(scale):
    """The deviation of [1e200, 0] once overflowed to inf, giving advantages [0, -0]."""
    assert group_advantages([scale, 0.0], eps=0.0) == pytest.approx([1.0, -1.0])
    assert group_advantages([scale, 0.0], scale=False) == pytest.approx([scale / 2, -scale / 2])
    assert group_advantages([1e308, -1e308]) == pytest.approx([1.0, -1.0])


@pytest.mark.parametrize("eps", [1e-4, 0.0])
def test_a_group_with_no_spread_has_zero_advantages_not_nan(eps):
    assert group_advantages([0.7], eps=eps) == [0.0]
    assert group_advantages([0.1, 0.1, 0.1], eps=eps) == [0.0, 0.0, 0.0]
    assert group_advantages([0.1, None], eps=eps) == [0.0, None]
    assert group_advantages([], eps=eps) == []


@pytest.mark.parametrize("bad", [math.nan, math.inf, "1.0", torch.tensor(math.nan), [1.0]])
def test_a_reward_that_is_not_a_finite_number_is_refused_naming_it(bad):
    with pytest.raises(TrajectoryError, match="reward 1 of the group"):
        group_advantages([1.0, bad, 0.0])


@pytest.mark.parametrize(
    ("rollout", "advantage", "says"),
    [
        ({"example_id": 3, "rollout_index": 1, "steps": []}, None, "group_advantages"),
        ({"example_id": 3, "rollout_index": 1, "steps": [], "error": "BackendError: down"},
         None, "the rollout failed .*BackendError"),
        ({"example_id": 3, "rollout_index": 1, "steps": []}, math.nan, "nan, not a finite"),
        ({"example_id": 3, "rollout_index": 1, "steps": []}, "0.5", "not str"),
    ],
)  # fmt: skip
def test_build_samples_refuses_a_missing_or_non_finite_advantage(rollout, advantage, says):
    """Groups streamed without advantages carry None: build_samples once filled the
    samples with NaN, and the loss became NaN without an error."""
    with pytest.raises(TrajectoryError, match=rf"example 3, rollout 1: advantage .*{says}"):
        build_samples(rollout, advantage=advantage, image_token_id=5)


def test_a_sample_with_nan_advantages_is_refused_when_batched(setup):
    _, renderer = setup
    pad = renderer.vision.image_token_id
    (sample,) = build_samples(rollout(renderer, turns=1), advantage=1.0, image_token_id=pad)
    sample.advantages[sample.loss_mask == 1] = np.nan  # a hand-made sample
    with pytest.raises(TrajectoryError, match="advantages are not all finite"):
        make_batches([sample], token_budget=10_000, pad_token_id=0, image_token_id=pad)


def test_grpo_loss_is_finite_and_has_gradients(setup):
    from vf_mm.models import model_class
    from vf_mm.training._grpo import grpo_loss

    path, renderer = setup
    pad = renderer.vision.image_token_id
    model = model_class("qwen2_5_vl").from_pretrained(path)
    samples = build_samples(rollout(renderer, turns=2), advantage=1.0, image_token_id=pad)
    (batch,) = make_batches(samples, token_budget=10_000, pad_token_id=0, image_token_id=pad)
    loss, stats = grpo_loss(model, batch)
    loss.backward()
    assert torch.isfinite(loss) and stats["tokens"] == float(batch.loss_mask.sum())
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


def test_a_wrong_image_token_id_is_refused_not_trained_as_text():
    """With an id that is not the model's image token, no image position would be marked
    (mm_token_type_ids 0): the forward runs the images as text and nothing fails."""
    import pytest

    from vf_mm.errors import TrajectoryError
    from vf_mm.types import MultiModalData, PlaceholderRange, ResponseTokens, TrajectoryStep

    pad = 9
    item = {"pixel_values": np.zeros((4, 2), np.float32), "image_grid_thw": np.array([[1, 2, 2]])}
    mm = MultiModalData({"image": ["h"]}, {"image": [PlaceholderRange(1, 4)]}, {"image": [item]})
    tokens = ResponseTokens(
        prompt_ids=[1, pad, pad, pad, pad, 2],
        completion_ids=[5, 6],
        completion_logprobs=[-0.1, -0.2],
        completion_mask=[1, 1],
        finish_reason="stop",
        multi_modal_data=mm,
    )
    rollout = {"example_id": 0, "rollout_index": 0, "trajectory": [TrajectoryStep([], [], tokens)]}
    assert build_samples(rollout, advantage=1.0, image_token_id=pad)[0].mm_token_type_ids.sum() == 4
    with pytest.raises(TrajectoryError, match=r"image_token_id=7 does not mark the tokens"):
        build_samples(rollout, advantage=1.0, image_token_id=7)
    with pytest.raises(TypeError, match="image_token_id must be a token id"):
        build_samples(rollout, advantage=1.0, image_token_id=None)
