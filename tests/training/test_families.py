"""Training on every vision family: a rollout sampled by the local backend becomes
samples whose forward gives back the sampler's logprobs, and a GRPO step trains.

This is the train/inference agreement that matters: the trainer's forward (the family's
``model_inputs``: Gemma 3's ``token_type_ids`` switch on bidirectional attention over
each image, Qwen's ``mm_token_type_ids`` set M-RoPE positions) must compute the same
log-probabilities the sampler recorded for the same tokens and images.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch
from PIL import Image

import vf_mm as vf
from tests._forward import assert_scores_as_sampled
from vf_mm.inference import LocalBackend
from vf_mm.models import model_class
from vf_mm.renderers import load_renderer
from vf_mm.testing import build_tiny_vlm
from vf_mm.training import build_samples, grpo_loss, make_batches, token_logprobs

FAMILIES = (
    "qwen3_5", "gemma3", "smolvlm", "llava_onevision", "gemma4", "llava_next", "internvl",
    "glm46v",
)  # fmt: skip


def picture(seed: int, size: tuple[int, int] = (84, 56)) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))


class Look(vf.MultiTurnEnv):
    """Every turn shows the model one more picture (as a user message)."""

    async def env_response(self, messages, state):
        return [{"role": "user", "content": [{"type": "image", "image": picture(state["turn"])},
                                             {"type": "text", "text": "and now?"}]}]  # fmt: skip


@pytest.fixture(scope="module", params=FAMILIES)
def trained(request, tmp_path_factory):
    family = request.param
    path = build_tiny_vlm(tmp_path_factory.mktemp("train") / family, family)
    renderer = load_renderer(path, image_backend="pil")
    backend = LocalBackend(path)
    env = Look(dataset=[{"question": "what is it?", "image": picture(99, (300, 90))}], max_turns=3,
               sampling_args={"max_tokens": 6, "temperature": 1.0})  # fmt: skip
    client = vf.RendererClient(backend, renderer)
    state = asyncio.run(env.rollout(client, env.get_dataset()[0]))
    return family, path, renderer, state


def test_the_forward_gives_back_the_samplers_logprobs(trained):
    family, path, renderer, state = trained
    token = renderer.vision.image_token_id
    # one sample when every turn bridged, more when a turn was re-rendered (a random
    # SmolVLM does not write the space its template puts after "Assistant:")
    samples = build_samples(state, advantage=1.0, image_token_id=token)
    assert samples[-1].is_multimodal and len(samples[-1].images) == 3
    batches = make_batches(samples, token_budget=10_000, pad_token_id=0,
                           image_token_id=token, family=family)  # fmt: skip
    model = model_class(family, checkpoint=path).from_pretrained(path, dtype=torch.float32).eval()
    assert_scores_as_sampled(model, batches)


def test_a_grpo_step_trains_the_language_and_vision_weights(trained):
    family, path, renderer, state = trained
    token = renderer.vision.image_token_id
    samples = build_samples(state, advantage=1.0, image_token_id=token)
    batch = make_batches(samples, token_budget=10_000, pad_token_id=0,
                         image_token_id=token, family=family)[0]  # fmt: skip
    model = model_class(family, checkpoint=path).from_pretrained(path, dtype=torch.float32)
    loss, stats = grpo_loss(model, batch)
    loss.backward()
    assert torch.isfinite(loss) and stats["tokens"] == float(batch.loss_mask.sum())
    vision = [p for n, p in model.named_parameters() if "vision" in n or "visual" in n]
    assert vision and any(p.grad is not None and p.grad.abs().sum() > 0 for p in vision)


def test_make_batches_names_an_unknown_family():
    with pytest.raises(vf.errors.UnsupportedModelError, match="supported: qwen2_vl"):
        make_batches([], token_budget=10, pad_token_id=0, image_token_id=1, family="llava")


def test_leaving_out_the_family_is_refused_for_images_that_are_not_qwens(trained):
    """Gemma 3 without its token_type_ids would still run, with different logprobs: a
    batch of non-Qwen images needs the family named."""
    family, _path, renderer, state = trained
    samples = build_samples(state, advantage=1.0, image_token_id=renderer.vision.image_token_id)
    if family in ("qwen3_5", "glm46v"):  # Qwen-VL's layout (image_grid_thw): the default is right
        assert make_batches(samples, token_budget=10_000, pad_token_id=0,
                            image_token_id=renderer.vision.image_token_id)  # fmt: skip
        return
    with pytest.raises(
        vf.errors.TrajectoryError, match=r"family=vf_mm\.models\.model_type\(checkpoint\)"
    ):
        make_batches(samples, token_budget=10_000, pad_token_id=0,
                     image_token_id=renderer.vision.image_token_id)  # fmt: skip


def test_pixel_values_that_do_not_stack_on_axis_0_are_none_not_an_error(trained):
    _family, _path, renderer, state = trained
    (*_, sample) = build_samples(state, advantage=1.0,
                                 image_token_id=renderer.vision.image_token_id)  # fmt: skip
    shapes = {np.asarray(im["pixel_values"]).shape[1:] for im in sample.images}
    if len(shapes) > 1:  # tiles of different counts (SmolVLM, LLaVA-OneVision)
        assert sample.pixel_values is None
    else:
        assert sample.pixel_values.shape[0] == sum(
            np.asarray(im["pixel_values"]).shape[0] for im in sample.images
        )


def test_a_family_whose_forward_takes_other_inputs_is_refused(trained):
    """Naming the wrong family would still run in a wrong layout: the images' inputs must
    be the ones that family's forward takes."""
    family, _path, renderer, state = trained
    samples = build_samples(state, advantage=1.0, image_token_id=renderer.vision.image_token_id)
    other = "smolvlm" if family != "smolvlm" else "gemma3"
    with pytest.raises(vf.errors.TrajectoryError, match=f"not a {other} forward's"):
        make_batches(samples, token_budget=10_000, pad_token_id=0,
                     image_token_id=renderer.vision.image_token_id, family=other)  # fmt: skip


def test_dropping_one_images_pixels_breaks_the_agreement(trained):
    """The negative control of the agreement above: the same batch with one image's
    pixels blanked (what a trainer that loses an image computes; flat grey, since SmolVLM
    drops an all-zero tile as padding) is far from the sampler's logprobs, so the
    agreement is evidence that the pixels arrived."""
    family, path, renderer, state = trained
    token = renderer.vision.image_token_id
    samples = build_samples(state, advantage=1.0, image_token_id=token)
    (batch,) = make_batches(samples[-1:], token_budget=10_000, pad_token_id=0,
                            image_token_id=token, family=family)  # fmt: skip
    first = batch.images[0][0]
    batch.images[0][0] = {**first, "pixel_values": np.full_like(first["pixel_values"], 0.5)}
    model = model_class(family, checkpoint=path).from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        ours = token_logprobs(model, batch)
    mask = batch.loss_mask.bool()
    assert float((ours[mask] - batch.logprobs[mask]).abs().max()) > 1e-2


def test_a_packed_batch_gives_each_sample_what_it_gets_alone(trained):
    """Samples of different lengths share a right-padded batch: each row's logprobs are
    the ones a forward of that sample alone computes."""
    from vf_mm.training._batch import _truncate

    family, path, renderer, state = trained
    token = renderer.vision.image_token_id
    sample = build_samples(state, advantage=1.0, image_token_id=token)[-1]
    cut = sample.placeholders[-1].offset  # drops the last image and what follows it
    shorter = _truncate(sample, cut, "image_boundary")
    assert shorter.num_tokens < sample.num_tokens and shorter.images

    def batches(group):
        return make_batches(group, token_budget=100_000, pad_token_id=0,
                            image_token_id=token, family=family)  # fmt: skip

    model = model_class(family, checkpoint=path).from_pretrained(path, dtype=torch.float32).eval()
    (packed,) = batches([sample, shorter])
    assert packed.input_ids.shape[0] == 2
    with torch.no_grad():
        together = token_logprobs(model, packed)
        for row, alone in enumerate(batches([sample]) + batches([shorter])):
            n = int(packed.attention_mask[row].sum())
            own = token_logprobs(model, alone)[0]
            assert own.shape[0] == n
            assert torch.allclose(together[row, :n], own, atol=2e-4), float(
                (together[row, :n] - own).abs().max()
            )


@pytest.mark.parametrize(
    ("family", "variant", "router"),
    [("gemma4", "26b-a4b", "router"), ("qwen3_vl_moe", None, "gate"), ("qwen3_5_moe", None, "gate"),
     pytest.param("gemma4", "31b", None, marks=pytest.mark.slow)],  # a build of its own
)  # fmt: skip
def test_a_mixture_of_experts_trains_as_it_sampled(tmp_path, family, variant, router):
    """The MoE checkpoints (their tiny renditions): Gemma 4's 26B-A4B (experts beside each
    MLP, and bidirectional attention over each image, which only the
    ``mm_token_type_ids`` of ``model_inputs`` switch on), Qwen3-VL-MoE (experts in place
    of the MLPs) and Qwen3.5-MoE (experts beside a shared expert, Gated DeltaNet layers);
    in the slow tier also Gemma 4's 31B (dense, bidirectional attention over each image).
    A rollout sampled by the local backend gives back its logprobs in the training
    forward, and a GRPO step reaches the routers, the experts and the vision tower."""
    path = build_tiny_vlm(tmp_path / "m", family, variant=variant)
    renderer = load_renderer(path, image_backend="pil")
    env = Look(dataset=[{"question": "what is it?", "image": picture(5, (120, 200))}], max_turns=2,
               sampling_args={"max_tokens": 5, "temperature": 1.0})  # fmt: skip
    client = vf.RendererClient(LocalBackend(path), renderer)
    state = asyncio.run(env.rollout(client, env.get_dataset()[0]))
    token = renderer.vision.image_token_id
    samples = build_samples(state, advantage=1.0, image_token_id=token)
    batches = make_batches(samples, token_budget=10_000, pad_token_id=0,
                           image_token_id=token, family=family)  # fmt: skip
    model = model_class(family, checkpoint=path).from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        for batch in batches:
            ours = token_logprobs(model.eval(), batch)
            mask = batch.loss_mask.bool()
            assert torch.allclose(ours[mask], batch.logprobs[mask], atol=2e-4)
        if family == "gemma4":
            assert model.config.text_config.use_bidirectional_attention == "vision"
            # without the image marks the images are attended causally: other logits, so
            # the agreement above is evidence the marks reached both forwards
            inputs = batches[-1].model_inputs()
            marks = torch.zeros_like(inputs["input_ids"])
            causal = model(**{**inputs, "mm_token_type_ids": marks})
            assert float((causal.logits - model(**inputs).logits).abs().max()) > 1e-3
    loss, _ = grpo_loss(model.train(), batches[-1])
    loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    experts = (f".{router}.", "experts") if router else ()  # the 31B is dense
    for part in (*experts, "visual" if family != "gemma4" else "vision_tower"):
        assert any(part in n and g.abs().sum() > 0 for n, g in grads.items()), (part, list(grads))
