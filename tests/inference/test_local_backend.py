"""LocalBackend: batches concurrent requests, samples each row by its own rules, never
samples image tokens, fails a bad request alone, swaps weights between batches."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch
from PIL import Image

from vf_mm.errors import BackendError, PromptTooLongError
from vf_mm.inference import GenerateRequest, LocalBackend, SamplingParams
from vf_mm.renderers import load_renderer
from vf_mm.testing import build_tiny_vlm


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return build_tiny_vlm(tmp_path_factory.mktemp("local") / "m", "qwen2_5_vl")


@pytest.fixture(scope="module")
def renderer(checkpoint):
    return load_renderer(checkpoint)


def run(coro):
    return asyncio.run(coro)


def with_backend(checkpoint, fn, **kwargs):
    async def main():
        backend = LocalBackend(checkpoint, **kwargs)
        try:
            return await fn(backend)
        finally:
            await backend.aclose()

    return run(main())


def image_prompt(renderer, seed=0):
    img = Image.fromarray(
        np.random.default_rng(seed).integers(0, 256, (112, 168, 3), dtype=np.uint8)
    )
    return renderer.render(
        [
            {
                "role": "user",
                "content": [{"type": "image", "image": img}, {"type": "text", "text": "?"}],
            }
        ]
    )


def text_prompt(renderer, text="Hello, how many circles?"):
    return renderer.render([{"role": "user", "content": text}])


def test_tokens_and_logprobs_come_back_parallel(checkpoint, renderer):
    prompt = text_prompt(renderer)

    async def go(b):
        return await b.generate(
            GenerateRequest(prompt.token_ids, SamplingParams(max_tokens=7, seed=3))
        )

    out = with_backend(checkpoint, go)
    assert len(out.completion_ids) == 7 and out.finish_reason == "length"
    assert len(out.logprobs) == 7 and all(lp <= 0 for lp in out.logprobs)
    assert out.usage.prompt_tokens == len(prompt.token_ids) and out.usage.completion_tokens == 7


def test_same_seed_same_tokens_alone_or_batched(checkpoint, renderer):
    text, image = text_prompt(renderer), image_prompt(renderer)
    seeded = GenerateRequest(
        image.token_ids, SamplingParams(max_tokens=6, seed=11), image.multi_modal_data
    )

    async def go(b):
        alone = await b.generate(seeded)
        others = [
            GenerateRequest(text.token_ids, SamplingParams(max_tokens=4, seed=s, temperature=0.8))
            for s in range(3)
        ]
        batched = await asyncio.gather(b.generate(seeded), *(b.generate(o) for o in others))
        return alone, batched, b.batches_run

    alone, batched, batches = with_backend(checkpoint, go, batch_window_ms=50)
    assert batched[0].completion_ids == alone.completion_ids
    assert batches == 2  # the four concurrent requests shared one batch


def test_greedy_is_top_k_one(checkpoint, renderer):
    prompt = text_prompt(renderer)

    async def go(b):
        greedy = await b.generate(
            GenerateRequest(prompt.token_ids, SamplingParams(max_tokens=5, temperature=0))
        )
        top1 = await b.generate(
            GenerateRequest(prompt.token_ids, SamplingParams(max_tokens=5, top_k=1, seed=9))
        )
        return greedy, top1

    greedy, top1 = with_backend(checkpoint, go)
    assert greedy.completion_ids == top1.completion_ids


def test_stops_at_a_stop_token_and_keeps_it(checkpoint, renderer):
    prompt = text_prompt(renderer)

    async def go(b):
        first = await b.generate(
            GenerateRequest(prompt.token_ids, SamplingParams(max_tokens=5, temperature=0))
        )
        stop = first.completion_ids[2]
        again = await b.generate(
            GenerateRequest(
                prompt.token_ids,
                SamplingParams(max_tokens=5, temperature=0, stop_token_ids=(stop,)),
            )
        )
        return first, again, stop

    first, again, stop = with_backend(checkpoint, go)
    cut = first.completion_ids.index(stop) + 1
    assert again.completion_ids == first.completion_ids[:cut]
    assert again.finish_reason == "stop" and again.stop_reason == stop
    assert len(again.logprobs) == cut


def test_never_samples_image_or_vision_tokens(checkpoint, renderer):
    """Even when the weights make the image pad the most likely token by far."""
    prompt = text_prompt(renderer)

    async def go(b):
        state = {k: v.clone() for k, v in b.model.state_dict().items()}
        head = "lm_head.weight"
        for token in b.suppress_token_ids:
            state[head][token] = state[head].abs().max() * 50 * torch.sign(state[head][0] + 1e-9)
        b.load_weights(state)
        return await b.generate(
            GenerateRequest(prompt.token_ids, SamplingParams(max_tokens=12, seed=1))
        ), b

    out, b = with_backend(checkpoint, go)
    assert not set(out.completion_ids) & set(b.suppress_token_ids)


def test_a_requests_banned_ids_are_never_sampled_and_logprobs_stay_raw(checkpoint, renderer):
    """``banned_token_ids`` (what RendererClient sends: the renderer's image and video
    tokens) hold for that request only, batched with others or not; the tokens sampled
    instead keep their raw log-probabilities (no renormalisation over what is left)."""
    prompt = text_prompt(renderer).token_ids
    greedy = SamplingParams(max_tokens=6, temperature=0)

    async def go(b):
        free = await b.generate(GenerateRequest(prompt, greedy))
        banned = tuple(sorted(set(free.completion_ids)))
        both = await asyncio.gather(
            b.generate(GenerateRequest(prompt, greedy, banned_token_ids=banned)),
            b.generate(GenerateRequest(prompt, greedy)),
        )
        return free, banned, both

    free, banned, (held, other) = with_backend(checkpoint, go)
    assert not set(held.completion_ids) & set(banned)
    assert other.completion_ids == free.completion_ids  # a neighbour's ban is not its own
    assert held.logprobs[0] < free.logprobs[0]  # the raw logprob of a lesser token


def test_banned_ids_outside_the_vocabulary_are_refused(checkpoint, renderer):
    prompt = text_prompt(renderer).token_ids

    async def go(b):
        return await b.generate(GenerateRequest(prompt, banned_token_ids=(10**7,)))

    with pytest.raises(ValueError, match=r"banned_token_ids \[10000000\] are outside"):
        with_backend(checkpoint, go)


def test_load_weights_changes_the_policy_between_batches(checkpoint, renderer):
    prompt = text_prompt(renderer)
    request = GenerateRequest(prompt.token_ids, SamplingParams(max_tokens=5, temperature=0))

    async def go(b):
        before = await b.generate(request)
        state = {
            k: torch.randn_like(v) if v.dtype.is_floating_point else v
            for k, v in b.model.state_dict().items()
        }
        b.load_weights(state)
        after = await b.generate(request)
        return before, after, b.weights_version

    before, after, version = with_backend(checkpoint, go)
    assert version == 1
    assert before.completion_ids != after.completion_ids


def test_a_bad_request_fails_alone(checkpoint, renderer):
    good, image = text_prompt(renderer), image_prompt(renderer)

    async def go(b):
        bad = GenerateRequest(image.token_ids, SamplingParams(max_tokens=3), None)  # pads, no data
        results = await asyncio.gather(
            b.generate(bad),
            b.generate(GenerateRequest(good.token_ids, SamplingParams(max_tokens=3))),
            return_exceptions=True,
        )
        return results

    bad, ok = with_backend(checkpoint, go)
    assert isinstance(bad, BackendError) and "image pad tokens" in str(bad)
    assert len(ok.completion_ids) == 3


def test_prompt_too_long_is_refused_before_generation(checkpoint, renderer):
    async def go(b):
        with pytest.raises(PromptTooLongError, match="100 tokens"):
            await b.generate(GenerateRequest([1] * 100, SamplingParams(max_tokens=50)))
        return b.batches_run

    assert with_backend(checkpoint, go, max_model_len=128) == 0


def test_cancelled_request_does_not_break_the_others(checkpoint, renderer):
    prompt = text_prompt(renderer)

    async def go(b):
        slow = asyncio.create_task(
            b.generate(GenerateRequest(prompt.token_ids, SamplingParams(max_tokens=40)))
        )
        await asyncio.sleep(0)
        slow.cancel()
        ok = await b.generate(GenerateRequest(prompt.token_ids, SamplingParams(max_tokens=2)))
        with pytest.raises(asyncio.CancelledError):
            await slow
        return ok

    assert len(with_backend(checkpoint, go).completion_ids) == 2


def test_images_reach_the_model(checkpoint, renderer):
    """Two different images in the same text give different greedy continuations."""
    a, b_ = image_prompt(renderer, 1), image_prompt(renderer, 2)

    async def go(b):
        sp = SamplingParams(max_tokens=8, temperature=0)
        return await asyncio.gather(
            b.generate(GenerateRequest(a.token_ids, sp, a.multi_modal_data)),
            b.generate(GenerateRequest(b_.token_ids, sp, b_.multi_modal_data)),
        )

    out_a, out_b = with_backend(checkpoint, go)
    assert out_a.logprobs != out_b.logprobs


def test_logprobs_are_raw_even_if_the_checkpoint_sets_a_repetition_penalty(tmp_path, renderer):
    import json
    import shutil

    from vf_mm.models import model_class

    path = tmp_path / "m"
    shutil.copytree(renderer.tokenizer.name_or_path, path)
    config = json.loads((path / "generation_config.json").read_text())
    (path / "generation_config.json").write_text(json.dumps({**config, "repetition_penalty": 3.0}))
    prompt = text_prompt(renderer)

    async def go(b):
        return await b.generate(
            GenerateRequest(prompt.token_ids, SamplingParams(max_tokens=6, temperature=0))
        )

    out = with_backend(path, go)
    model = model_class("qwen2_5_vl").from_pretrained(path)
    ids = torch.tensor([prompt.token_ids + out.completion_ids])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), -1)
    n = len(prompt.token_ids)
    expected = [float(logp[n - 1 + i, t]) for i, t in enumerate(out.completion_ids)]
    assert out.logprobs == pytest.approx(expected, abs=1e-4)


def test_worker_survives_a_closed_event_loop(checkpoint, renderer):
    prompt = text_prompt(renderer)
    backend = LocalBackend(checkpoint)

    async def abandon():
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(
                backend.generate(GenerateRequest(prompt.token_ids, SamplingParams(max_tokens=64))),
                0.01,
            )

    async def again():
        try:
            return await asyncio.wait_for(
                backend.generate(GenerateRequest(prompt.token_ids, SamplingParams(max_tokens=2))),
                60,
            )
        finally:
            await backend.aclose()

    asyncio.run(abandon())
    assert len(asyncio.run(again()).completion_ids) == 2


def test_a_kimi_k25_clip_of_chunks_of_4_and_2_frames_generates():
    """A Kimi-K2.5 clip that keeps 6 frames (chunks of 4 and 2, which transformers
    5.23's own forward cannot take): the local backend's engine (the batch engine: the
    family is resumable, and takes no pool) and the ``generate`` engine answer it with the
    same greedy tokens, the first one's logprob the forward's through ``forward_inputs``."""
    from vf_mm.inference._generate import GenerateEngine
    from vf_mm.inference._local_model import LocalModel
    from vf_mm.inference._sampling import Seeds
    from vf_mm.models import cached_tiny_vlm, forward_inputs, model_inputs

    path = cached_tiny_vlm("kimi_k25")
    kimi = load_renderer(path)
    frames = np.random.default_rng(6).integers(0, 256, (6, 30, 40, 3), dtype=np.uint8)
    part = {"type": "video", "video": frames, "frame_rate": 2.0, "do_sample_frames": False}
    prompt = kimi.render([{"role": "user", "content": [part, {"type": "text", "text": "?"}]}])
    (clip,) = prompt.multi_modal_data.mm_items["video"]
    assert clip["video_grid_thw"][:, 0].tolist() == [4, 2]
    request = GenerateRequest(
        prompt.token_ids, SamplingParams(max_tokens=4, temperature=0), prompt.multi_modal_data
    )
    backend = LocalBackend(path)
    try:
        assert backend.engine == "batch"
        result = run(backend.generate(request))
    finally:
        run(backend.aclose())
    loaded = LocalModel.from_pretrained(path)
    (generated,) = GenerateEngine(loaded, seeds=Seeds(0, loaded.device))._generate([request])
    assert generated.completion_ids == result.completion_ids and result.logprobs
    ids = torch.tensor([prompt.token_ids])
    inputs = {"input_ids": ids, **model_inputs(
        "kimi_k25", ids, [], image_token_ids=(), videos=[clip],
        video_token_ids=kimi.vision.embed_ids("video"),
    )}  # fmt: skip
    with torch.no_grad():
        logits = loaded.model(**forward_inputs("kimi_k25", loaded.model, inputs)).logits[0, -1]
    first = torch.log_softmax(logits.float(), -1)[result.completion_ids[0]]
    assert abs(float(first) - result.logprobs[0]) < 1e-4
