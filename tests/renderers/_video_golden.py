"""The claim a video golden makes (``golden/gemma4_video.json``, ``kimi_k25_video.json``,
written by the real processors): the render of its conversation has the golden's token
ids and model inputs (shape, dtype, sha256 of the bytes), and each clip's placeholders
cover exactly its video tokens (what sits between its frames or chunks is text)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from tests.renderers.golden._records import tensor_record


def assert_renders_the_clip_golden(
    renderer: Any,
    family: str,
    messages: list[dict[str, Any]],
    golden: dict[str, Any],
    *,
    inputs: Sequence[str],
) -> None:
    import torch

    from vf_mm.models import model_inputs

    rendered = renderer.render(messages)
    assert rendered.token_ids == golden["input_ids"]
    data = rendered.multi_modal_data
    data.validate(len(rendered.token_ids))
    batch = model_inputs(
        family, torch.tensor([rendered.token_ids]), data.mm_items.get("image", []),
        image_token_ids=renderer.vision.embed_ids("image"), videos=data.mm_items["video"],
        video_token_ids=renderer.vision.embed_ids("video"),
    )  # fmt: skip
    assert sorted(batch) == sorted(golden["inputs"])
    for name in inputs:
        if name in golden["inputs"]:
            assert tensor_record(batch[name].numpy()) == golden["inputs"][name], name
    (video_id,) = renderer.vision.embed_ids("video")
    covered = np.zeros(len(rendered.token_ids), dtype=bool)
    for placeholder in data.mm_placeholders["video"]:
        covered[placeholder.embed_positions()] = True
    assert np.array_equal(covered, np.asarray(rendered.token_ids) == video_id)
    assert len(data.mm_placeholders["video"]) == len(golden["clips"])
