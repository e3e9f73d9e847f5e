"""Streaming and storing read a rollout's media under the rules its renderer read them
under: a clip the rollout took is never refused when its group is packed or its row is
stored, and a source the renderer's policy refused is never read there."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

import vf_mm as vf
from vf_mm.images import ImagePolicy
from vf_mm.renderers import load_renderer
from vf_mm.results import evaluate_to_dir, read_results
from vf_mm.testing import ScriptedBackend, build_tiny_vlm
from vf_mm.training import stream_rollouts, unpack_group
from vf_mm.videos import VideoLimits


class Collect:
    def __init__(self) -> None:
        self.groups: list[dict] = []

    async def asend(self, group) -> int:
        self.groups.append(group)
        return 1


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return build_tiny_vlm(tmp_path_factory.mktemp("media") / "m", "qwen2_5_vl")


def slow_clip_env():
    # 8 frames at 0.01 fps: 800 s, over the default max_duration_s (600)
    frames = np.random.default_rng(0).integers(0, 256, (8, 28, 28, 3), dtype=np.uint8)
    row = {"question": "What changed?", "answer": "x",
           "video": {"type": "video", "video": frames, "frame_rate": 0.01}}  # fmt: skip
    return vf.SingleTurnEnv(dataset=[row], rubric=vf.Rubric([lambda completion: 1.0]))


def test_a_clip_the_renderer_took_is_packed_and_stored(checkpoint, tmp_path):
    renderer = load_renderer(checkpoint, video_limits=VideoLimits(max_duration_s=1000))
    client = vf.RendererClient(ScriptedBackend(renderer, ["x"]), renderer)
    assert client.media_rules[1].max_duration_s == 1000
    sender = Collect()
    progress = asyncio.run(stream_rollouts(slow_clip_env(), client, sender))
    assert progress.repacked == 0
    (rollout,) = unpack_group(sender.groups[0])
    assert rollout.error is None and rollout.trajectory
    asyncio.run(evaluate_to_dir(slow_clip_env(), client, tmp_path / "run", metadata={}))
    (row,) = read_results(tmp_path / "run")
    assert row["error"] is None


def test_a_source_the_renderers_policy_refuses_is_not_read_when_packing(checkpoint, tmp_path):
    clip = tmp_path / "outside" / "clip.npy"  # any file outside the allowed root
    clip.parent.mkdir()
    clip.write_bytes(b"\x00" * 64)
    policy = ImagePolicy.dataset(roots=[tmp_path / "allowed"])
    renderer = load_renderer(checkpoint, image_policy=policy)
    client = vf.RendererClient(ScriptedBackend(renderer, ["x"]), renderer)
    row = {"question": "?", "answer": "x", "video": str(clip)}
    env = vf.SingleTurnEnv(dataset=[row], rubric=vf.Rubric([lambda completion: 1.0]))
    sender = Collect()
    asyncio.run(stream_rollouts(env, client, sender))
    (rollout,) = unpack_group(sender.groups[0])
    assert rollout.error.type == "UnsafeVideoSourceError"  # refused by the renderer, and
    # the packer, hashing the prompt's clip, is refused by the same policy (it used to
    # read and decode it under the default one)
    assert "packing the group" in rollout.error.where
    assert "prompt, message 0, part 0): path resolves outside local_roots" in rollout.error.where
