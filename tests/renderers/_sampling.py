"""A claim two families' tests make of ``LocalBackend`` on a text turn."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest


def assert_samples_as_a_full_forward_scores(path: Path, family: str) -> None:
    """``LocalBackend`` samples 6 tokens after a 35-token prompt, and their logprobs equal
    one forward of the family's model over the prompt and completion (within 1e-4)."""
    import torch

    from vf_mm.inference import GenerateRequest, LocalBackend, SamplingParams
    from vf_mm.models import model_class

    prompt = list(range(5, 40))

    async def sample():
        backend = LocalBackend(path)
        try:
            params = SamplingParams(max_tokens=6, temperature=1.0, seed=3)
            return await backend.generate(GenerateRequest(prompt, params))
        finally:
            await backend.aclose()

    result = asyncio.run(sample())
    model = model_class(family).from_pretrained(path).eval()
    with torch.no_grad():
        ids = torch.tensor([prompt + result.completion_ids])
        logprobs = model(input_ids=ids).logits.float().log_softmax(-1)[0]
    expected = [
        logprobs[len(prompt) - 1 + i, t].item() for i, t in enumerate(result.completion_ids)
    ]
    assert len(result.completion_ids) == 6
    assert result.logprobs == pytest.approx(expected, abs=1e-4)
