"""``forward_inputs``: the inputs a family's forward takes, with the vision features
computed by vf_mm only where transformers' own forward computes them wrong.

That one case is Kimi-K2.5's clips whose chunks keep several frames (transformers 5.23
fails on them: ``tests/renderers/test_kimi_k25_video.py``). Held here on the tiny
checkpoint: where transformers is right the inputs pass through as they were; vf_mm's
encoding of a batch of chunks (the tower once per chunk length, its pooled output split
by one frame's merged patches) gives each chunk the features it gets alone, and one-frame
chunks the logits of transformers' own forward. The local backend's engines generating
with such a clip are ``tests/inference/test_local_backend.py``; the trainer's logprobs equal to the sampler's on such clips, and the GRPO
gradient reaching the vision tower through them, are ``tests/training/test_video_training.py``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from vf_mm.models import cached_tiny_vlm, forward_inputs, model_class, model_inputs
from vf_mm.models._forward import _kimi_k25_encoded


@pytest.fixture(scope="module")
def kimi() -> tuple[Any, Any, Any]:
    from vf_mm.renderers import load_renderer

    path = cached_tiny_vlm("kimi_k25")
    model = model_class("kimi_k25").from_pretrained(path).eval()
    return path, load_renderer(path), model


def clip(seed: int, t: int, h: int = 30, w: int = 40) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (t, h, w, 3), dtype=np.uint8)


def video(seed: int, t: int, h: int = 30, w: int = 40) -> dict[str, Any]:
    """A clip part that keeps all ``t`` frames (chunks of 4, the last shorter)."""
    return {"type": "video", "video": clip(seed, t, h, w), "frame_rate": 2.0,
            "do_sample_frames": False}  # fmt: skip


def rendered(renderer: Any, *parts: Any) -> tuple[Any, dict[str, Any]]:
    """A user turn of ``parts``, rendered, and its forward inputs (``model_inputs``)."""
    messages = [{"role": "user", "content": [*parts, {"type": "text", "text": "What moved?"}]}]
    prompt = renderer.render(messages)
    items = prompt.multi_modal_data.mm_items
    ids = torch.tensor([prompt.token_ids])
    inputs = model_inputs(
        "kimi_k25", ids, items.get("image", []), image_token_ids=renderer.vision.embed_ids("image"),
        videos=items.get("video", []), video_token_ids=renderer.vision.embed_ids("video"),
        order=[m for m in ("image", "video") for _ in items.get(m, [])],
    )  # fmt: skip
    return prompt, {"input_ids": ids, **inputs}


def test_other_families_and_one_frame_chunks_pass_through_as_they_were(kimi):
    """Where transformers' forward is right the inputs are returned as they were (the
    same dict): every family but Kimi-K2.5, and Kimi-K2.5's images and one-frame chunks.
    vf_mm's own encoding of those gives transformers' logits bit for bit (the same tower
    and projector, split per chunk as transformers splits a one-frame chunk)."""
    _, renderer, model = kimi
    from PIL import Image

    picture = Image.fromarray(clip(9, 1, 60, 90)[0])
    _, inputs = rendered(renderer, {"type": "image", "image": picture}, video(1, t=1),
                         video(2, t=1, h=50, w=20))  # fmt: skip
    assert inputs["video_grid_thw"][:, 0].tolist() == [1, 1]
    assert forward_inputs("kimi_k25", model, inputs) is inputs
    pixels = {"input_ids": inputs["input_ids"], "pixel_values_videos": torch.zeros(4, 3, 14, 14),
              "video_grid_thw": torch.tensor([[4, 2, 2]])}  # fmt: skip
    for family in ("qwen2_vl", "qwen3_vl", "glm46v", "gemma4", "smolvlm"):
        assert forward_inputs(family, None, pixels) is pixels  # the family decides, not shapes
    with torch.no_grad():
        theirs = model(**inputs).logits
        ours = model(**_kimi_k25_encoded(model, inputs)).logits
    assert torch.equal(ours, theirs)


def test_a_batch_of_chunks_gives_each_chunk_the_features_it_has_alone(kimi):
    """Clips of 6 frames (chunks of 4 and 2), 3 frames and 1 frame, of two sizes, beside
    an image: each chunk's features from the batch equal that chunk encoded on its own
    (the split by one frame's merged patches puts every chunk's tokens where they go;
    6e-8 apart, the tower's batch size), and a chunk counts one frame's tokens, as the
    prompt holds; the image's features are transformers' own."""
    _, renderer, model = kimi
    from PIL import Image

    picture = Image.fromarray(clip(9, 1, 60, 90)[0])
    prompt, inputs = rendered(renderer, video(3, t=6), {"type": "image", "image": picture},
                              video(4, t=3, h=50, w=20), video(5, t=1))  # fmt: skip
    grid = inputs["video_grid_thw"]
    assert grid[:, 0].tolist() == [4, 2, 3, 1] and len({tuple(g[1:]) for g in grid.tolist()}) == 2
    with torch.no_grad():
        given = forward_inputs("kimi_k25", model, inputs)
        assert "pixel_values_videos" not in given and "pixel_values" not in given
        batch = given["mm_encoder_outputs"]["video"].pooler_output
        rows = inputs["pixel_values_videos"].split(grid.prod(-1).tolist())
        for i, (chunk, pixels) in enumerate(zip(grid, rows, strict=True)):
            alone = _kimi_k25_encoded(model, {"pixel_values_videos": pixels,
                                              "video_grid_thw": chunk[None]})  # fmt: skip
            (features,) = alone["mm_encoder_outputs"]["video"].pooler_output
            assert features.shape[0] == int(chunk[1] * chunk[2]) // 4
            torch.testing.assert_close(batch[i], features, rtol=0, atol=1e-6)
        video_token = renderer.vision.embed_ids("video")[0]
        assert sum(len(f) for f in batch) == prompt.token_ids.count(video_token)
        image = given["mm_encoder_outputs"]["image"].pooler_output
        theirs = model.model.get_image_features(
            inputs["pixel_values"], inputs["image_grid_thw"], return_dict=True
        ).pooler_output
        assert all(torch.equal(a, b) for a, b in zip(image, theirs, strict=True))
        assert torch.isfinite(model(**given).logits).all()
