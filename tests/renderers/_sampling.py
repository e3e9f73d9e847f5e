"""Claims the tests of the families whose image processor transformers has only for
torchvision (LFM2.5-VL, Kimi-K2.5) make of ``LocalBackend``: on a text turn, and on an
image rollout that trains."""

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
    model = model_class(family, checkpoint=path).from_pretrained(path).eval()
    with torch.no_grad():
        ids = torch.tensor([prompt + result.completion_ids])
        logprobs = model(input_ids=ids).logits.float().log_softmax(-1)[0]
    expected = [
        logprobs[len(prompt) - 1 + i, t].item() for i, t in enumerate(result.completion_ids)
    ]
    assert len(result.completion_ids) == 6
    assert result.logprobs == pytest.approx(expected, abs=1e-4)


def assert_an_image_rollout_trains(path: Path, family: str) -> None:
    """A three-turn rollout with an image each turn, sampled by ``LocalBackend`` through
    ``RendererClient``, becomes samples whose training forward (the family's
    ``make_batches`` layout) gives back the sampler's logprobs (within 2e-4), and a GRPO
    step reaches the vision tower. The renderer is ``load_renderer``'s default: the
    family's torchvision image processor where torchvision imports, else vf_mm's
    torch-only port of it."""
    import torch
    from PIL import Image

    import vf_mm as vf
    from tests._forward import assert_scores_as_sampled
    from vf_mm.inference import LocalBackend
    from vf_mm.models import model_class
    from vf_mm.renderers import load_renderer
    from vf_mm.training import build_samples, grpo_loss, make_batches

    class Look(vf.MultiTurnEnv):
        """Every turn shows the model one more picture."""

        async def env_response(self, messages, state):
            turn = state["turn"]
            picture = Image.new("RGB", (60 + 20 * turn, 40), (40 * turn, 90, 200))
            return [{"role": "user", "content": [{"type": "image", "image": picture},
                                                 {"type": "text", "text": "and now?"}]}]  # fmt: skip

    renderer = load_renderer(path)
    env = Look(dataset=[{"question": "what is it?", "image": Image.new("RGB", (300, 90), "red")}],
               max_turns=3, sampling_args={"max_tokens": 6, "temperature": 1.0})  # fmt: skip
    client = vf.RendererClient(LocalBackend(path), renderer)
    state = asyncio.run(env.rollout(client, env.get_dataset()[0]))
    token = renderer.vision.image_token_id
    samples = build_samples(state, advantage=1.0, image_token_id=token)
    assert samples[-1].is_multimodal and len(samples[-1].images) == 3
    batches = make_batches(samples, token_budget=10_000, pad_token_id=0,
                           image_token_id=token, family=family)  # fmt: skip
    model = model_class(family, checkpoint=path).from_pretrained(path, dtype=torch.float32).eval()
    assert_scores_as_sampled(model, batches)
    model.train()
    loss, _ = grpo_loss(model, batches[-1])
    loss.backward()
    vision = [p for n, p in model.named_parameters() if "vision" in n]
    assert vision and any(p.grad is not None and p.grad.abs().sum() > 0 for p in vision)
