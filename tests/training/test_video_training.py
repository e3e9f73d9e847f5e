"""Training on video: a rollout whose turns show clips (and a picture), sampled by the
local backend, becomes samples whose forward gives back the sampler's logprobs, and a
GRPO step moves the vision weights, for every family that takes video.

The trainer's forward gets each clip's ``pixel_values_videos`` and ``video_grid_thw`` (and
Qwen2.5-VL's ``second_per_grid_ts``), and 2 in ``mm_token_type_ids`` on video tokens:
M-RoPE positions of a video differ from an image's, so a wrong mark changes every
logprob after it. SmolVLM takes a clip's frames as images: they join the picture's tiles
in token order, and ``video_token_id`` is its ``<image>`` id
(``renderer.vision.embed_ids("video")[0]`` names it for every family).
"""

from __future__ import annotations

import asyncio
from typing import ClassVar

import numpy as np
import pytest
import torch
from PIL import Image

import vf_mm as vf
from tests._forward import assert_scores_as_sampled
from vf_mm.errors import TrajectoryError
from vf_mm.inference import LocalBackend
from vf_mm.models import (
    VIDEO_FAMILIES,
    model_class,
)
from vf_mm.renderers import load_renderer
from vf_mm.testing import build_tiny_vlm
from vf_mm.training import build_samples, grpo_loss, make_batches


def clip(seed: int, frames: int = 6, size: tuple[int, int] = (56, 42)) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (frames, size[1], size[0], 3), dtype=np.uint8)


# Gemma 4's checkpoint samples 32 frames, more than these clips hold: 4 of their 5.
# Kimi-K2.5 keeps all 5: chunks of 4 frames and 1, which transformers 5.23's forward
# cannot take (vf_mm.models.forward_inputs computes their features, in the sampler and
# the trainer alike)
CLIP_OPTIONS = {"gemma4": {"num_frames": 4}, "kimi_k25": {"do_sample_frames": False}}


class Watch(vf.MultiTurnEnv):
    """Every turn shows the model one more clip (as a user message)."""

    clip_options: ClassVar[dict] = {}

    async def env_response(self, messages, state):
        # one frame count for every clip: LLaVA-OneVision's forward stacks them
        part = {
            "type": "video",
            "video": clip(state["turn"], frames=5),
            "frame_rate": 4.0,
            **self.clip_options,
        }
        return [{"role": "user", "content": [part, {"type": "text", "text": "and now?"}]}]


# Gemma 4's 31B architecture (bidirectional attention over each frame's soft tokens) in
# the slow tier: its marks and clips are the E2B one's
@pytest.fixture(
    scope="module",
    params=[*VIDEO_FAMILIES, pytest.param("gemma4/31b", marks=pytest.mark.slow)],
)
def trained(request, tmp_path_factory):
    family, _, variant = request.param.partition("/")
    path = build_tiny_vlm(
        tmp_path_factory.mktemp("video") / family, family, variant=variant or None
    )
    # Kimi-K2.5 has no PIL image processor: its images take vf_mm's torch-only port
    renderer = load_renderer(path, image_backend="auto" if family == "kimi_k25" else "pil")
    backend = LocalBackend(path)
    picture = Image.fromarray(clip(99, frames=1, size=(90, 60))[0])
    env = Watch(dataset=[{"question": "what moved?", "image": picture}], max_turns=3,
                sampling_args={"max_tokens": 5, "temperature": 1.0})  # fmt: skip
    env.clip_options = CLIP_OPTIONS.get(family, {})
    client = vf.RendererClient(backend, renderer)
    state = asyncio.run(env.rollout(client, env.get_dataset()[0]))
    assert state.get("error") is None, state.get("error")
    return family, path, renderer, state


def batches_of(trained):
    family, _path, renderer, state = trained
    ids = {"image_token_id": renderer.vision.image_token_id,
           "video_token_id": renderer.vision.embed_ids("video")[0]}  # fmt: skip
    samples = build_samples(state, advantage=1.0, **ids)
    assert samples[-1].videos and samples[-1].images
    return samples, make_batches(samples, token_budget=20_000, pad_token_id=0, family=family,
                                 **ids)  # fmt: skip


def test_the_forward_gives_back_the_samplers_logprobs_with_videos(trained):
    family, path, _renderer, _state = trained
    samples, batches = batches_of(trained)
    assert len(samples[-1].videos) == 2  # the env's clips of turns 1 and 2
    assert set(np.unique(samples[-1].mm_token_type_ids)) == {0, 1, 2}  # (sampler's marks)
    if family == "kimi_k25":  # each clip: a chunk of 4 frames and one of 1
        assert [v["video_grid_thw"][:, 0].tolist() for v in samples[-1].videos] == [[4, 1]] * 2
    model = model_class(family, checkpoint=path).from_pretrained(path, dtype=torch.float32).eval()
    assert_scores_as_sampled(model, batches)


def test_a_grpo_step_with_videos_trains_the_vision_weights(trained):
    family, path, _renderer, _state = trained
    _, batches = batches_of(trained)
    model = model_class(family, checkpoint=path).from_pretrained(path, dtype=torch.float32)
    loss, _ = grpo_loss(model, batches[0])
    loss.backward()
    assert torch.isfinite(loss)
    vision = [p for n, p in model.named_parameters() if "vision" in n or "visual" in n]
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in vision)


def test_video_samples_need_the_video_token_and_the_family(trained):
    family, _path, renderer, state = trained
    samples = build_samples(state, advantage=1.0, image_token_id=renderer.vision.image_token_id,
                            video_token_id=renderer.vision.embed_ids("video")[0])  # fmt: skip
    with pytest.raises(TrajectoryError, match="video_token_id"):
        make_batches(samples, token_budget=20_000, pad_token_id=0, family=family,
                     image_token_id=renderer.vision.image_token_id)  # fmt: skip
    with pytest.raises(TrajectoryError, match="family="):
        make_batches(samples, token_budget=20_000, pad_token_id=0,
                     image_token_id=renderer.vision.image_token_id,
                     video_token_id=renderer.vision.embed_ids("video")[0])  # fmt: skip


def test_a_cut_never_goes_through_a_video(trained):
    family, _path, renderer, _state = trained
    samples, _ = batches_of(trained)
    sample = samples[-1]
    video = sample.video_placeholders[-1]
    ids = {"image_token_id": renderer.vision.image_token_id,
           "video_token_id": renderer.vision.embed_ids("video")[0]}  # fmt: skip
    with pytest.raises(TrajectoryError, match="through an image or video"):
        make_batches([sample], token_budget=20_000, pad_token_id=0, family=family,
                     max_seq_len=video.offset + 2, **ids)  # fmt: skip
    (batch,) = make_batches([sample], token_budget=20_000, pad_token_id=0, family=family,
                            max_seq_len=video.offset + 2, truncate="image_boundary", **ids)  # fmt: skip
    assert batch.input_ids.shape[1] == video.offset
    assert len(batch.videos[0]) == len(sample.videos) - 1


def test_a_rollout_with_videos_needs_the_video_token_to_become_samples(trained):
    family, _path, renderer, state = trained
    with pytest.raises(TrajectoryError, match="video_token_id"):
        build_samples(state, advantage=1.0, image_token_id=renderer.vision.image_token_id)
    samples, _ = batches_of(trained)
    sample = samples[-1]
    sample.mm_token_type_ids[sample.video_placeholders[0].embed_positions()[0]] = 0  # as text
    with pytest.raises(TrajectoryError, match="not marked 2"):
        make_batches([sample], token_budget=20_000, pad_token_id=0, family=family,
                     image_token_id=renderer.vision.image_token_id,
                     video_token_id=renderer.vision.embed_ids("video")[0])  # fmt: skip
