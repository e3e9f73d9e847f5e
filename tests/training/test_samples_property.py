"""Property: random trajectories (extension, branching, compaction, repeated images, API
turns) packed, sent through a stream file and unpacked, then built into training samples:
every sample keeps each image aligned with its pad run, and its tokens equal the steps'."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from tests.training.test_groups import IMAGE_PAD, World, groups, make_group
from vf_mm.errors import TrajectoryError
from vf_mm.training import build_samples, pack_group, unpack_group
from vf_mm.wire import read_stream, write_stream


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
          HealthCheck.function_scoped_fixture])  # fmt: skip
@given(groups)
def test_samples_from_streamed_groups_keep_images_aligned(tmp_path, params):
    world = World(params["seed"], copies=params["copies"])
    outputs = make_group(world, params["base_ops"], params["rollout_ops"], api=params["api"])
    path = tmp_path / f"g{params['seed']}.vfmm"
    write_stream(path, [pack_group(outputs)])
    (frame,) = list(read_stream(path))
    for rollout in unpack_group(frame):
        if not rollout.trainable or not rollout.trajectory:
            continue
        lost = any(
            m and not np.isfinite(lp)
            for step in rollout.trajectory
            for m, lp in zip(
                step.tokens.completion_mask, step.tokens.completion_logprobs, strict=True
            )
        )
        if lost:  # a sampled token without a logprob cannot be trained on: refused, by name
            with pytest.raises(TrajectoryError, match=r"has logprob nan"):
                build_samples(rollout, advantage=1.0, image_token_id=IMAGE_PAD)
            continue
        samples = build_samples(rollout, advantage=1.0, image_token_id=IMAGE_PAD)
        covered = 0
        for sample in samples:
            sample.validate(image_token_id=IMAGE_PAD, merge_size=2)
            grids = sample.image_grid_thw if sample.image_grid_thw is not None else np.zeros((0, 3))
            assert len(grids) == len(sample.placeholders)
            rows = 0
            for placeholder, grid in zip(sample.placeholders, grids, strict=True):
                assert placeholder.num_embeds == int(grid.prod()) // 4
                assert np.all(sample.input_ids[placeholder.embed_positions()] == IMAGE_PAD)
                rows += int(grid.prod())
            if sample.pixel_values is not None:
                assert sample.pixel_values.shape[0] == rows
            covered += 1
        # each sample ends where one of the rollout's steps ends
        ends = {len(s.tokens.prompt_ids) + len(s.tokens.completion_ids) for s in rollout.trajectory}
        assert all(s.num_tokens in ends for s in samples) and covered == len(samples)
