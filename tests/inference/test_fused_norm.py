"""Fused RMSNorms in packed forwards (``_fused_norm``): a text layer's norm runs as one
``rms_norm`` kernel only where a probe shows that computes the module's own output; a
norm of another formula keeps its forward; the swap holds only inside a packed forward,
and answers stay those of a full forward."""

from __future__ import annotations

import asyncio

import pytest
import torch

from tests.inference.test_local_history import (
    GREEDY,
    full_forward_logprobs,
    user_turn,
)
from vf_mm.inference import GenerateRequest, LocalBackend
from vf_mm.inference._fused_norm import fusable_norms, fused, fused_forward
from vf_mm.renderers import load_renderer

POOL = {"kv_pool": True, "kv_pool_bytes": 4 << 20}


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl", "internvl", "glm46v", "text"])
def test_every_text_norm_of_the_pool_families_fuses_and_computes_the_same(checkpoints, family):
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    path = checkpoints(family)
    loader = AutoModelForCausalLM if family == "text" else AutoModelForImageTextToText
    model = loader.from_pretrained(path).eval()
    modules = list(model.get_decoder().modules())
    norms = [m for m in modules if type(m).__name__.endswith("RMSNorm")]
    with torch.no_grad():  # a trained model's weights (the tiny ones start at ones)
        for norm in norms:
            norm.weight.uniform_(0.5, 1.5)
    found = fusable_norms(modules)
    assert norms and set(found) == set(norms)
    x = torch.randn(3, 7, norms[0].weight.shape[0])
    with torch.no_grad():
        own = norms[0](x)
        with fused(found):
            assert norms[0](x) is not None and "forward" in vars(norms[0])
            torch.testing.assert_close(norms[0](x), own, rtol=1e-6, atol=1e-6)
    assert not any("forward" in vars(m) for m in norms)  # the class's forward again


def test_a_norm_of_another_formula_keeps_its_own_forward():
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm

    gemma = Gemma3RMSNorm(16)  # weight * (1 + w): the probe sees it differ
    with torch.no_grad():
        gemma.weight.normal_()
    assert fused_forward(gemma) is None
    assert fused_forward(torch.nn.LayerNorm(16)) is None  # no RMSNorm
    assert fusable_norms([gemma, torch.nn.LayerNorm(16)]) == {}


def test_a_pool_engine_with_fused_norms_answers_as_a_full_forward(checkpoints):
    path = checkpoints("qwen2_5_vl")
    renderer = load_renderer(path)
    prompts = [user_turn(renderer, [i], f"look {i}") for i in range(2)]

    async def run():
        backend = LocalBackend(path, **POOL)
        packed = backend._pool.packed
        packed.norms = fusable_norms(list(backend.model.get_decoder().modules()))
        try:
            results = await asyncio.gather(
                *(backend.generate(GenerateRequest(p.ids, GREEDY, p.data)) for p in prompts)
            )
            return backend, packed, results
        finally:
            await backend.aclose()

    backend, packed, results = asyncio.run(run())
    assert packed.norms
    for prompt, result in zip(prompts, results, strict=True):
        reference = full_forward_logprobs(backend, prompt, result.completion_ids)
        assert result.logprobs == pytest.approx(reference, abs=1e-4)
    assert not any("forward" in vars(m) for m in packed.norms)
