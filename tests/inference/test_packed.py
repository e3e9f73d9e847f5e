"""``PackedModel``'s vision attention: the Qwen-VL towers' windows and images in one
varlen call (``varlen_vision_attention``) compute what transformers' own path computes.

On a CPU the varlen function runs its reference path (``scaled_dot_product_attention``
per segment); on CUDA in half precision it is one FlashAttention call, compared on the
GPU by ``bench/prefill_probe.py --check``. Here: the tower's output with the varlen
function equals its output with the model's own attention, bit for bit, on images whose
sizes force several windows and partial ones; only towers that pass segments are
switched; the model's attention is back after the block."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch
from PIL import Image

from vf_mm.inference._packed import VISION_NAME, PackedModel, varlen_vision_attention
from vf_mm.models import model_class
from vf_mm.renderers import load_renderer

# sizes that make one window, several, and partial ones (Qwen2.5-VL's tiny windows)
SIZES = [(28, 28), (84, 140), (150, 61), (200, 200)]


def tower_output(model, pixel_values, grid) -> torch.Tensor:
    out = model.model.get_image_features(pixel_values=pixel_values, image_grid_thw=grid)
    features = out.pooler_output if hasattr(out, "pooler_output") else out
    return torch.cat(list(features))


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def test_the_varlen_vision_attention_is_the_towers_own(checkpoints, family):
    path = checkpoints(family)
    model = model_class(family, checkpoint=path).from_pretrained(path, dtype=torch.float32).eval()
    renderer = load_renderer(path)
    rng = np.random.default_rng(0)
    content = [
        {"type": "image", "image": Image.fromarray(rng.integers(0, 256, (h, w, 3), np.uint8))}
        for h, w in SIZES
    ]
    rendered = renderer.render([{"role": "user", "content": content}])
    items = rendered.multi_modal_data.mm_items["image"]
    pixel_values = torch.cat([torch.tensor(np.asarray(i["pixel_values"])) for i in items])
    grid = torch.cat([torch.tensor(np.asarray(i["image_grid_thw"])).reshape(-1, 3) for i in items])
    packed = PackedModel(model, varlen_vision=True)
    assert packed.vision_configs  # the tower's attention takes segments
    own = [c._attn_implementation_internal for c in packed.vision_configs]
    with torch.no_grad():
        expected = tower_output(model, pixel_values, grid)
        with packed.vision():  # as the pool engine's prefill runs the tower
            assert all(c._attn_implementation == VISION_NAME for c in packed.vision_configs)
            got = tower_output(model, pixel_values, grid)
    assert [c._attn_implementation_internal for c in packed.vision_configs] == own
    assert torch.equal(got, expected)


def test_towers_without_segments_keep_their_attention(checkpoints):
    model = model_class("llava_onevision").from_pretrained(checkpoints("llava_onevision"))
    assert PackedModel(model, varlen_vision=True).vision_configs == []


def test_the_varlen_vision_attention_refuses_a_call_without_segments():
    q = torch.zeros(1, 2, 4, 8)
    with pytest.raises(RuntimeError, match="cu_seq_lens_q"):
        varlen_vision_attention(torch.nn.Module(), q, q, q, None)


@pytest.mark.parametrize(
    "asked",
    [{"is_causal": True}, {"dropout": 0.1}, {"cu_seq_lens_k": torch.tensor([0, 1, 4])}],
    ids=["causal", "dropout", "other-key-segments"],
)
def test_the_varlen_vision_attention_refuses_what_it_would_compute_otherwise(asked):
    """A tower asking for attention other than bidirectional within the query segments
    fails, rather than getting that attention silently."""
    q = torch.zeros(1, 2, 4, 8)
    segments = {"cu_seq_lens_q": torch.tensor([0, 2, 4]), "max_length_q": 2}
    varlen_vision_attention(torch.nn.Module(), q, q, q, None, **segments)  # what it serves
    with pytest.raises(RuntimeError, match="varlen_vision=False"):
        varlen_vision_attention(torch.nn.Module(), q, q, q, None, **{**segments, **asked})


def test_a_backend_asked_for_the_towers_own_attention_keeps_it(checkpoints, monkeypatch):
    """``LocalBackend(varlen_vision=False)`` (the bench's ``--no-varlen-vision``) keeps the
    tower's own attention where FlashAttention would serve the varlen call."""
    from vf_mm.inference import LocalBackend, _local_model

    monkeypatch.setattr(_local_model, "flash_available", lambda device, dtype: True)
    for varlen, switched in ((True, True), (False, False)):
        backend = LocalBackend(checkpoints("qwen2_5_vl"), kv_pool=True, varlen_vision=varlen)
        try:
            assert bool(backend._scheduler._engine.packed.vision_configs) is switched
        finally:
            asyncio.run(backend.aclose())
