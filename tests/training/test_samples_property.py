"""Property: random trajectories (extension, branching, compaction, repeated images, API
turns) packed, sent through a stream file and unpacked, then built into training samples:
the samples cover the rollout's steps in order, once each; every sample's tokens equal its
last step's prompt and completion; and its images are that step's images, in order, each
byte for byte the image its hash names, aligned with its pad run."""

from __future__ import annotations

import re

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
        steps = rollout.trajectory
        expected_start = 0
        for sample in samples:
            sample.validate(image_token_id=IMAGE_PAD, merge_size=2)
            start, end = map(int, re.search(r"steps (\d+)-(\d+)$", sample.source).groups())
            assert start == expected_start  # the samples cover the steps in order, once
            expected_start = end + 1
            last = steps[end].tokens
            # its tokens are exactly the last step's prompt and completion
            assert sample.input_ids.tolist() == [*last.prompt_ids, *last.completion_ids]
            # its images are the last step's, in order, each the very image its hash names
            # (bytes, so a NaN pixel compares too): two same-shaped images swapped fail here
            data = last.multi_modal_data
            hashes = data.mm_hashes.get("image", []) if data is not None else []
            assert len(sample.images) == len(sample.placeholders) == len(hashes)
            for image, placeholder, h in zip(sample.images, sample.placeholders, hashes,
                                             strict=True):  # fmt: skip
                for name, array in world.items[h].items():
                    assert np.asarray(image[name]).tobytes() == array.tobytes(), (h, name)
                grid = world.items[h]["image_grid_thw"][0]
                assert placeholder.num_embeds == int(grid.prod()) // 4
                assert np.all(sample.input_ids[placeholder.embed_positions()] == IMAGE_PAD)
        assert expected_start == len(steps)
