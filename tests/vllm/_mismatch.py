"""The sampler/trainer mismatch of one family against a real vLLM server.

vLLM samples a few multi-turn ``gridnav`` rollouts through vf_mm's own client (the
renderer, bridging, ``VLLMBackend`` in features mode, logprobs on): every environment
turn shows a new image, so the last turn's prompt holds images from earlier and later
turns. vf_mm's builder turns them into training batches (``build_samples``,
``make_batches``), the same tiny checkpoint's transformers forward scores them
(``token_logprobs``: the trainer side), and ``logprob_mismatch`` compares the two on the
sampled tokens.

The negative control replaces one image of a later turn with flat grey in the batch
(what a trainer that lost that image's pixel rows computes; grey, not zeros, because
SmolVLM takes an all-zero tile for padding) and measures again: the mismatch must then
be far larger, so the small number above is evidence that every image reached the
trainer as the sampler saw it.

A family whose images vLLM 0.32 takes only as content_parts (Gemma 4) is measured on
prompts vLLM expands from raw images instead (``measure_content_parts``): each expanded
prompt must equal the renderer's ids and placeholders, and the batch carries the
renderer's model inputs.

Used by the modules that already run a server per family (``test_families_vllm.py``,
``test_video_vllm.py``, the session's Qwen2-VL server): no server is started here.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

import vf_mm as vf
from vf_mm.inference import GenerateRequest, SamplingParams, VLLMBackend
from vf_mm.models import model_class
from vf_mm.renderers import load_renderer
from vf_mm.training import (
    MicroBatch,
    build_samples,
    logprob_mismatch,
    make_batches,
    token_logprobs,
)
from vf_mm.types import RolloutOutput

#: prime-rl's bar for a new model (its ``mismatch_kl``): a bf16 sampler against a
#: float32 trainer is held to it
PRIME_RL_BAR = 0.015
#: a float32 sampler against a float32 trainer: the same weights and inputs, only the
#: kernels differ (vLLM's CPU attention and GEMMs against transformers' eager ones). The
#: logprobs agree to ~1e-6 (float32 rounding) and the k3 KL (about d**2 / 2, averaged)
#: to ~1e-13; 1e-9 is four orders of magnitude above that noise and seven below
#: prime-rl's bar
FLOAT32_BOUND = 1e-9
#: a float32 sampler: no token may be further than this from the trainer
FLOAT32_MAX_ABS = 1e-4
#: the negative control (one later image grey) must raise the KL at least this far above
#: the bound. A random tiny model's logits barely depend on an image (a grey one moves
#: them by ~1e-2 at most: KL 1e-6 to 1e-3 here, where a real model shows ~5, as prime-rl
#: saw for dropped pixel rows), so the control is held against the float32 bound, not
#: prime-rl's bar
CONTROL_FACTOR = 100


@dataclass
class Mismatch:
    family: str
    rollouts: int
    images: int  # images in the batches (every turn's, counted once per sample)
    mismatch_kl: float
    max_abs_diff: float
    tokens: int
    control_kl: float  # the same batches with one later image turned grey
    control_max_abs_diff: float

    def line(self) -> str:
        return (
            f"MISMATCH {self.family}: mismatch_kl={self.mismatch_kl:.3g} "
            f"max_abs_diff={self.max_abs_diff:.3g} tokens={self.tokens} "
            f"rollouts={self.rollouts} images={self.images} | one image grey: "
            f"mismatch_kl={self.control_kl:.3g} max_abs_diff={self.control_max_abs_diff:.3g}"
        )


def combined(batches: list[MicroBatch], logprobs: list[torch.Tensor]) -> dict[str, float]:
    """``logprob_mismatch`` over several batches: the token-weighted mean KL, the max
    difference, the tokens summed."""
    stats = [logprob_mismatch(b, lp) for b, lp in zip(batches, logprobs, strict=True)]
    tokens = sum(s["tokens"] for s in stats)
    return {
        "mismatch_kl": sum(s["mismatch_kl"] * s["tokens"] for s in stats) / max(tokens, 1.0),
        "max_abs_diff": max(s["max_abs_diff"] for s in stats),
        "tokens": tokens,
    }


def rollouts(
    family: str, server_url: str, path: Path, *, count: int, seed: int | None = 0
) -> list[RolloutOutput]:
    """``count`` two-turn gridnav rollouts sampled by vLLM through vf_mm's client: the
    second prompt holds the first image and the environment's new one. ``seed=None``
    sends unseeded requests: vLLM 0.32's CPU engine fails a seeded request to a hybrid
    model (Qwen3.5: "CPU Generator does not use offset") and its engine dies with it."""
    env = vf.load_environment(
        "gridnav", difficulty="easy", num_examples=count, num_eval_examples=count,
        max_turns=2, sampling_args={"max_tokens": 8, "temperature": 1.0, "logprobs": True},
    )  # fmt: skip
    renderer = load_renderer(path)

    async def go() -> list[RolloutOutput]:
        async with VLLMBackend(server_url, mode="features") as backend:
            client = vf.RendererClient(backend, renderer)
            return await env.evaluate(client, num_examples=count, seed=seed)

    return asyncio.run(go())


def measure(
    family: str, server_url: str, path: Path, *, count: int = 2, seed: int | None = 0
) -> Mismatch:
    outputs = rollouts(family, server_url, path, count=count, seed=seed)
    for output in outputs:
        assert output.error is None, (family, str(output.error))
        assert len(output.trajectory) == 2, (family, len(output.trajectory))
    renderer = load_renderer(path)
    token = renderer.vision.image_token_id
    samples = [s for o in outputs for s in build_samples(o, advantage=1.0, image_token_id=token)]
    return scored(family, path, samples, token, rollouts=len(outputs))


def conversation(seed: int) -> list[dict[str, Any]]:
    """Two user turns with an image each (sizes that force a resize, the second an
    extreme aspect) and an answer between them: the prompt holds an earlier turn's image
    and the last turn's."""
    rng = np.random.default_rng(seed)

    def picture(width: int, height: int) -> Image.Image:
        return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))

    return [
        {"role": "user", "content": [{"type": "image", "image": picture(640, 480)},
                                     {"type": "text", "text": "What is in it?"}]},
        {"role": "assistant", "content": "A grid of cells."},
        {"role": "user", "content": [{"type": "text", "text": "And in this one?"},
                                     {"type": "image", "image": picture(97, 501)}]},
    ]  # fmt: skip


def content_parts_steps(
    server_url: str, path: Path, *, count: int, seed: int = 0
) -> tuple[list[dict[str, Any]], Any]:
    """``count`` conversations (``conversation``) sampled by vLLM in content_parts mode:
    the prompt as the chat template writes it (one placeholder per image) with the images
    sent raw, so vLLM processes them itself; 8 tokens each at temperature 1, the family's
    image tokens banned as ``RendererClient`` bans them. Each becomes one trajectory step
    whose model inputs are the renderer's, after checking that vLLM expanded the prompt to
    exactly the renderer's ids and placeholders."""
    renderer = load_renderer(path)
    vision = renderer.vision
    embed = {"image": list(vision.embed_ids("image"))}
    steps = []

    async def go() -> None:
        async with VLLMBackend(server_url, mode="content_parts", embed_token_ids=embed) as backend:
            for i in range(count):
                messages = conversation(seed + i)
                ours = renderer.render(messages)
                shown = [{**m, "content": [{"type": "image"} if p["type"] == "image" else p
                                           for p in m["content"]]}
                         if isinstance(m["content"], list) else m for m in messages]  # fmt: skip
                text = renderer.tokenizer.apply_chat_template(
                    shown, tokenize=False, add_generation_prompt=True
                )
                parts = [p for m in messages if isinstance(m["content"], list)
                         for p in m["content"] if p["type"] == "image"]  # fmt: skip
                request = GenerateRequest(
                    prompt_ids=renderer.tokenizer(text, add_special_tokens=False)["input_ids"],
                    sampling=SamplingParams(max_tokens=8, temperature=1.0, seed=seed + i,
                                            logprobs=True),
                    content_parts=parts, banned_token_ids=tuple(sorted(vision.banned_token_ids)),
                )  # fmt: skip
                result = await backend.generate(request)
                assert result.prompt_ids == list(ours.token_ids), "vLLM expanded another prompt"
                assert result.multi_modal_data is not None
                theirs = result.multi_modal_data.mm_placeholders["image"]
                assert theirs == ours.multi_modal_data.mm_placeholders["image"], theirs
                steps.append({"tokens": {
                    "prompt_ids": list(ours.token_ids),
                    "completion_ids": list(result.completion_ids),
                    "completion_logprobs": list(result.logprobs or []),
                    "completion_mask": [1] * len(result.completion_ids),
                    "multi_modal_data": ours.multi_modal_data,
                }})  # fmt: skip

    asyncio.run(go())
    return steps, renderer


def score(
    family: str, path: Path, batches: list[MicroBatch], *, causal_images: bool = False
) -> tuple[dict[str, float], dict[str, float]]:
    """The trainer's view of ``batches`` (the transformers forward, float32) against the
    sampler's logprobs, and the same with each sample's last image grey (the negative
    control). ``causal_images``: a Gemma 4 26B/31B checkpoint scored with causal attention
    over its images instead of its bidirectional image blocks (a diagnosis, not the
    model)."""
    model = model_class(family, checkpoint=path).from_pretrained(path, dtype=torch.float32).eval()
    if causal_images:
        model.config.get_text_config().use_bidirectional_attention = None
    with torch.no_grad():
        stats = combined(batches, [token_logprobs(model, b) for b in batches])
        # the negative control: in each row that holds two images (that reaches a later
        # turn), the last one (the later turn's) grey
        greyed = 0
        for batch in batches:
            for images in batch.images or []:
                if len(images) >= 2:
                    last = images[-1]
                    pixels = np.asarray(last["pixel_values"])
                    images[-1] = {**last, "pixel_values": np.full_like(pixels, 0.5)}
                    greyed += 1
        assert greyed, "no sample holds a later turn's image"
        control = combined(batches, [token_logprobs(model, b) for b in batches])
    return stats, control


def measure_content_parts(
    family: str, server_url: str, path: Path, *, count: int = 4, causal_images: bool = False
) -> Mismatch:
    """``measure`` for a family whose images vLLM 0.32 takes only as content_parts
    (placeholders with ``is_embed``: Gemma 4): ``content_parts_steps`` sampled, vf_mm's
    builder makes the batches from the renderer's model inputs, the transformers forward
    scores them."""
    steps, renderer = content_parts_steps(server_url, path, count=count)
    token = renderer.vision.image_token_id
    samples = [s for step in steps
               for s in build_samples({"steps": [step]}, advantage=1.0, image_token_id=token)]  # fmt: skip
    return scored(family, path, samples, token, rollouts=len(steps), causal_images=causal_images)


def scored(
    family: str,
    path: Path,
    samples: list[Any],
    token: int,
    *,
    rollouts: int,
    causal_images: bool = False,
) -> Mismatch:
    """The trainer's scores of ``samples`` (the sampler's, images included) against the
    sampler's logprobs, and the grey-image control, as one printed ``Mismatch``."""
    batches = make_batches(samples, token_budget=100_000, pad_token_id=0,
                           image_token_id=token, family=family)  # fmt: skip
    assert all(b.is_multimodal for b in batches)
    images = sum(len(i) for b in batches for i in b.images or [])
    stats, control = score(family, path, batches, causal_images=causal_images)
    result = Mismatch(
        family=family, rollouts=rollouts, images=images,
        mismatch_kl=stats["mismatch_kl"], max_abs_diff=stats["max_abs_diff"],
        tokens=int(stats["tokens"]), control_kl=control["mismatch_kl"],
        control_max_abs_diff=control["max_abs_diff"],
    )  # fmt: skip
    print(result.line(), flush=True)
    assert result.tokens > 0 and math.isfinite(result.mismatch_kl)
    return result


def assert_agrees(result: Mismatch, *, bf16_sampler: bool = False) -> None:
    """The sampler and the trainer agree within the sampler's precision, and the negative
    control is far outside it (module docstring; the bounds' reasons at their
    definitions)."""
    if bf16_sampler:
        assert result.mismatch_kl < PRIME_RL_BAR, result.line()
        return
    assert result.mismatch_kl < FLOAT32_BOUND, result.line()
    assert result.max_abs_diff < FLOAT32_MAX_ABS, result.line()
    assert result.control_kl > CONTROL_FACTOR * FLOAT32_BOUND, result.line()


def assert_refused(family: str, server_url: str, path: Path) -> None:
    """A family whose image placeholders carry ``is_embed`` (Gemma 3's and Gemma 4's
    markers inside the range, SmolVLM's tile tags): vLLM 0.32's features route takes
    offset and length only, and ``RendererClient`` builds features requests, so every
    rollout fails at its first turn with a typed error naming content_parts; nothing is
    sampled, nothing trained."""
    outputs = rollouts(family, server_url, path, count=1)
    for output in outputs:
        assert output.error is not None and output.error.type == "MultiModalDataError", output
        assert "content_parts" in output.error.message and not output.trajectory
    print(f"MISMATCH {family}: refused ({outputs[0].error})", flush=True)
