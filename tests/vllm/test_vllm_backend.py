"""``VLLMBackend`` (vf_mm/inference/_vllm.py) against a real vLLM server."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from vf_mm.errors import PromptTooLongError
from vf_mm.inference import GenerateRequest, SamplingParams, VLLMBackend
from vf_mm.renderers import load_renderer

pytestmark = pytest.mark.vllm

SEEDS = (11, 11, 12, 13, 11, 14, 15, 11)


def _run(coro):
    return asyncio.run(coro)


@pytest.fixture(scope="module")
def text_prompt(checkpoint_dirs) -> list[int]:
    renderer = load_renderer(checkpoint_dirs["text"])
    return list(renderer.render([{"role": "user", "content": "Say hello."}]).token_ids)


def test_text_generate_matches_raw_route(text_server, text_prompt) -> None:
    import httpx

    raw = httpx.post(
        text_server.base_url + "/inference/v1/generate",
        json={
            "token_ids": text_prompt,
            "sampling_params": {"max_tokens": 10, "temperature": 0.0, "logprobs": 0},
        },
        timeout=120,
    ).json()["choices"][0]

    async def go():
        async with VLLMBackend(text_server.base_url) as backend:
            result = await backend.generate(
                GenerateRequest(text_prompt, SamplingParams(max_tokens=10, temperature=0.0))
            )
            return result, backend.max_model_len

    result, max_model_len = _run(go())
    assert result.completion_ids == raw["token_ids"]
    np.testing.assert_allclose(
        result.logprobs, [e["logprob"] for e in raw["logprobs"]["content"]], atol=1e-5
    )
    assert result.finish_reason == "length"
    assert result.usage.prompt_tokens == len(text_prompt)
    assert result.usage.completion_tokens == 10
    assert result.prompt_ids is None and result.multi_modal_data is None
    assert max_model_len == 2048  # read from GET /v1/models


def test_text_stop_seed_and_concurrency(text_server, text_prompt) -> None:
    async def go():
        async with VLLMBackend(text_server.base_url) as backend:
            greedy = await backend.generate(
                GenerateRequest(text_prompt, SamplingParams(max_tokens=8, temperature=0.0))
            )
            stop = greedy.completion_ids[2]
            stopped = await backend.generate(
                GenerateRequest(
                    text_prompt,
                    SamplingParams(max_tokens=8, temperature=0.0, stop_token_ids=(stop,)),
                )
            )
            sampled = await asyncio.gather(
                *(
                    backend.generate(
                        GenerateRequest(
                            text_prompt, SamplingParams(max_tokens=12, temperature=1.0, seed=s)
                        )
                    )
                    for s in SEEDS
                )
            )
            return greedy, stop, stopped, sampled

    greedy, stop, stopped, sampled = _run(go())
    first = greedy.completion_ids.index(stop)
    assert stopped.finish_reason == "stop"
    assert stopped.stop_reason == stop
    assert stopped.completion_ids == greedy.completion_ids[: first + 1]
    assert len(stopped.logprobs) == len(stopped.completion_ids)
    same = [r.completion_ids for r, s in zip(sampled, SEEDS, strict=True) if s == 11]
    assert all(ids == same[0] for ids in same)
    assert len({tuple(r.completion_ids) for r in sampled}) == 5


def test_prompt_too_long_is_refused_before_sending(text_server, text_prompt) -> None:
    async def go():
        async with VLLMBackend(text_server.base_url) as backend:
            await backend.generate(GenerateRequest(text_prompt, SamplingParams(max_tokens=1)))
            with pytest.raises(PromptTooLongError):
                await backend.generate(
                    GenerateRequest(text_prompt, SamplingParams(max_tokens=2048))
                )
            return backend.stats

    stats = _run(go())
    assert next(iter(stats.values()))["requests"] == 1  # the refused one never went out


@pytest.fixture(scope="module")
def vl_case(checkpoint_dirs) -> dict:
    import base64
    import io

    from PIL import Image

    renderer = load_renderer(checkpoint_dirs["vl"])
    rng = np.random.default_rng(5)
    image = Image.fromarray(rng.integers(0, 256, (168, 252, 3), dtype=np.uint8))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
    part = {"type": "image_url", "image_url": {"url": url}}
    messages = [{"role": "user", "content": [part, {"type": "text", "text": "Describe it."}]}]
    rendered = renderer.render(messages)
    pad = renderer.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    one_pad = list(rendered.token_ids)
    for p in reversed(rendered.multi_modal_data.mm_placeholders["image"]):
        one_pad[p.offset : p.end] = [pad]
    return {"rendered": rendered, "part": part, "one_pad": one_pad}


def test_vl_features_and_content_parts_agree(vl_server, vl_case) -> None:
    rendered = vl_case["rendered"]
    sampling = SamplingParams(max_tokens=8, temperature=0.0)

    async def go():
        async with (
            VLLMBackend(vl_server.base_url, mode="features") as features,
            VLLMBackend(vl_server.base_url, mode="content_parts") as parts,
        ):
            a = await features.generate(
                GenerateRequest(
                    list(rendered.token_ids), sampling, multi_modal_data=rendered.multi_modal_data
                )
            )
            b = await parts.generate(
                GenerateRequest(vl_case["one_pad"], sampling, content_parts=[vl_case["part"]])
            )
            return a, b

    a, b = _run(go())
    assert a.prompt_ids is None
    assert a.completion_ids == b.completion_ids
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-4)
    # content_parts: the server's expansion is our renderer's, placeholders included
    assert b.prompt_ids == list(rendered.token_ids)
    assert b.multi_modal_data is not None
    assert b.multi_modal_data.mm_placeholders == rendered.multi_modal_data.mm_placeholders
    assert b.usage.prompt_tokens == len(rendered.token_ids)


def test_banned_ids_are_never_sampled_and_logprobs_stay_raw(vl_server, vl_case, checkpoint_dirs):
    """What ``VLLMBackend`` sends as a ban (``logit_bias`` -100 per id) is honoured by a
    real vLLM server: ids it would pick greedily are not sampled, the logprobs are the
    raw ones (vLLM takes them before the bias), and through ``RendererClient`` a random
    model never samples the family's image and video tokens."""
    from vf_mm import RendererClient

    renderer = load_renderer(checkpoint_dirs["vl"])
    rendered = vl_case["rendered"]
    prompt = list(rendered.token_ids)
    greedy = SamplingParams(max_tokens=8, temperature=0.0)
    messages = [{"role": "user", "content": [vl_case["part"], {"type": "text", "text": "Go."}]}]

    async def go():
        async with VLLMBackend(vl_server.base_url, mode="features") as backend:
            free = await backend.generate(
                GenerateRequest(prompt, greedy, multi_modal_data=rendered.multi_modal_data)
            )
            banned = tuple(sorted(set(free.completion_ids) | renderer.vision.banned_token_ids))
            held = await backend.generate(
                GenerateRequest(
                    prompt, greedy, multi_modal_data=rendered.multi_modal_data,
                    banned_token_ids=banned,
                )
            )  # fmt: skip
            client = RendererClient(backend, renderer)
            turns = await asyncio.gather(
                *(
                    client.generate(
                        messages, sampling=SamplingParams(max_tokens=32, temperature=1.0, seed=s)
                    )
                    for s in SEEDS
                )
            )
            return free, banned, held, turns

    free, banned, held, turns = _run(go())
    assert not set(held.completion_ids) & set(banned)
    assert held.logprobs[0] <= free.logprobs[0] + 1e-4  # raw, not renormalised after the ban
    for turn in turns:
        assert not set(turn.tokens.completion_ids) & renderer.vision.banned_token_ids
