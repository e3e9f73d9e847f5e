"""Raw ``POST /inference/v1/generate`` against a real vLLM server (token ids in and out).

Text: greedy ids, usage, logprobs (checked against transformers' own forward pass),
stop tokens, seeds. Images (tiny Qwen2-VL): the features path with OUR kwargs_data
(checked against transformers and against the server's own image processing), the
content_parts path and the render route (ids, placeholders and pixels vs our renderer).
"""

from __future__ import annotations

import asyncio
import base64
import io

import httpx
import numpy as np
import pytest
import torch
from PIL import Image

from vf_mm.inference._internal import (
    decode_kwargs_item,
    encode_kwargs_item,
)
from vf_mm.renderers import load_renderer

pytestmark = pytest.mark.vllm

TIMEOUT = httpx.Timeout(120.0, connect=5.0)
LOGPROB_ATOL = 2e-3  # vLLM CPU attention vs transformers' eager/sdpa, both float32


def _post(server, body: dict, path: str = "/inference/v1/generate") -> httpx.Response:
    return httpx.post(server.base_url + path, json=body, timeout=TIMEOUT)


def _generate(server, body: dict) -> dict:
    response = _post(server, body)
    assert response.status_code == 200, response.text[:2000]
    return response.json()


def _hf_logprobs(model, prompt_ids: list[int], completion_ids: list[int], **kwargs) -> list[float]:
    """log p(completion[j] | prompt + completion[:j]) under transformers (raw, temperature 1)."""
    ids = torch.tensor([prompt_ids + completion_ids])
    with torch.no_grad():
        logits = model(input_ids=ids, **kwargs).logits[0].float()
    logp = torch.log_softmax(logits, dim=-1)
    start = len(prompt_ids) - 1
    return [float(logp[start + j, t]) for j, t in enumerate(completion_ids)]


# -- text -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def text_prompt(checkpoint_dirs) -> list[int]:
    renderer = load_renderer(checkpoint_dirs["text"])
    messages = [{"role": "user", "content": "Count from one to ten, please."}]
    return list(renderer.render(messages).token_ids)


@pytest.fixture(scope="module")
def hf_text_model(checkpoint_dirs):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(checkpoint_dirs["text"], dtype=torch.float32).eval()


def test_text_greedy_ids_usage_and_logprobs(text_server, text_prompt, hf_text_model) -> None:
    body = {
        "token_ids": text_prompt,
        "sampling_params": {"max_tokens": 12, "temperature": 0.0, "logprobs": 0},
    }
    out = _generate(text_server, body)
    assert out["output_mode"] == "tokens"
    choice = out["choices"][0]
    ids = choice["token_ids"]
    assert len(ids) == 12 and all(isinstance(t, int) for t in ids)
    assert choice["finish_reason"] == "length" and choice["stop_reason"] is None
    assert out["usage"]["prompt_tokens"] == len(text_prompt)
    assert out["usage"]["completion_tokens"] == 12
    content = choice["logprobs"]["content"]
    assert [e["token_id"] for e in content] == ids
    assert all(e["rank"] == 1 for e in content)  # greedy: every sampled token ranks first
    # the same logprobs as transformers computes for these ids (raw logprobs)
    ref = _hf_logprobs(hf_text_model, text_prompt, ids)
    np.testing.assert_allclose([e["logprob"] for e in content], ref, atol=LOGPROB_ATOL)
    # and greedy = transformers' argmax at each step
    with torch.no_grad():
        logits = hf_text_model(input_ids=torch.tensor([text_prompt + ids])).logits[0]
    hf_argmax = logits[len(text_prompt) - 1 : -1].argmax(-1).tolist()
    assert hf_argmax == ids
    # same request again: the same ids (greedy is deterministic)
    assert _generate(text_server, body)["choices"][0]["token_ids"] == ids


def test_text_top_logprobs(text_server, text_prompt) -> None:
    """``logprobs: 5``: vLLM 0.32's route returns the first 5 entries of the engine's map,
    the sampled token first, then the top ranks: when the sampled token ranks below 5,
    only ranks 1-4 follow it (serving.py ``_create_tokens_logprobs``)."""
    body = {
        "token_ids": text_prompt,
        "sampling_params": {"max_tokens": 6, "temperature": 1.0, "seed": 7, "logprobs": 5},
    }
    choice = _generate(text_server, body)["choices"][0]
    for entry, token in zip(choice["logprobs"]["content"], choice["token_ids"], strict=True):
        assert entry["token_id"] == token
        tops = entry["top_logprobs"]
        assert len(tops) == 5, entry
        assert tops[0] == {"token_id": token, "logprob": entry["logprob"], "rank": entry["rank"]}
        others = [t for t in tops if t["token_id"] != token]
        expected = [r for r in range(1, 6) if r != entry["rank"]][: len(others)]
        assert [t["rank"] for t in others] == expected, entry
        lps = [t["logprob"] for t in others]
        assert lps == sorted(lps, reverse=True)
        assert all(lp >= entry["logprob"] for lp in lps) or entry["rank"] <= 5


def test_text_stop_token_ids(text_server, text_prompt) -> None:
    base = {"token_ids": text_prompt, "sampling_params": {"max_tokens": 10, "temperature": 0.0}}
    ids = _generate(text_server, base)["choices"][0]["token_ids"]
    stop = ids[3]
    first = ids.index(stop)
    body = {**base, "sampling_params": {**base["sampling_params"], "stop_token_ids": [stop]}}
    choice = _generate(text_server, body)["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert choice["stop_reason"] == stop
    # the stop token is part of the returned ids (vLLM keeps stop_token_ids' token)
    assert choice["token_ids"] == ids[: first + 1]


def test_text_seeds(text_server, text_prompt) -> None:
    def body(seed: int) -> dict:
        return {
            "token_ids": text_prompt,
            "sampling_params": {"max_tokens": 16, "temperature": 1.0, "seed": seed},
        }

    async def run_all() -> list[list[int]]:
        async with httpx.AsyncClient(base_url=text_server.base_url, timeout=TIMEOUT) as client:
            responses = await asyncio.gather(
                *(client.post("/inference/v1/generate", json=body(s)) for s in [1, 1, 2, 3, 1])
            )
        assert all(r.status_code == 200 for r in responses), [r.text[:300] for r in responses]
        return [r.json()["choices"][0]["token_ids"] for r in responses]

    a, b, c, d, e = asyncio.run(run_all())  # concurrent: batched together by the engine
    assert a == b == e  # same seed -> same tokens, batched or not
    assert a == _generate(text_server, body(1))["choices"][0]["token_ids"]  # and alone
    assert len({tuple(a), tuple(c), tuple(d)}) == 3  # other seeds -> other samples


def test_text_request_errors(text_server, text_prompt) -> None:
    empty = _post(text_server, {"token_ids": [], "sampling_params": {"max_tokens": 2}})
    assert empty.status_code == 400, empty.text
    both = _post(
        text_server,
        {
            "token_ids": text_prompt,
            "sampling_params": {"max_tokens": 2},
            "features": {"mm_hashes": {"image": ["x"]}, "mm_placeholders": {"image": []}},
            "content_parts": [{"type": "image_url", "url": "data:,"}],
        },
    )
    assert both.status_code == 400, both.text


# -- images (tiny Qwen2-VL) -------------------------------------------------------------


@pytest.fixture(scope="module")
def vl_renderer(checkpoint_dirs):
    return load_renderer(checkpoint_dirs["vl"])


@pytest.fixture(scope="module")
def vl_case(vl_renderer) -> dict:
    rng = np.random.default_rng(0)
    image = Image.fromarray(rng.integers(0, 256, (224, 196, 3), dtype=np.uint8))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": url}},
                {"type": "text", "text": "What is in this picture?"},
            ],
        }
    ]
    rendered = vl_renderer.render(messages)
    return {"url": url, "messages": messages, "rendered": rendered}


def _features(mm, *, kwargs: bool = True) -> dict:
    return {
        "mm_hashes": {m: list(h) for m, h in mm.mm_hashes.items()},
        "mm_placeholders": {
            m: [{"offset": p.offset, "length": p.length} for p in ps]
            for m, ps in mm.mm_placeholders.items()
        },
        "kwargs_data": (
            {
                m: [encode_kwargs_item(it, modality=m) for it in its]
                for m, its in mm.mm_items.items()
            }
            if kwargs
            else None
        ),
    }


def _one_pad_prompt(rendered, image_pad: int) -> list[int]:
    """The rendered ids with each image's pads collapsed to one (content_parts input)."""
    ids = list(rendered.token_ids)
    for p in reversed(rendered.multi_modal_data.mm_placeholders["image"]):
        assert set(ids[p.offset : p.end]) == {image_pad}
        ids[p.offset : p.end] = [image_pad]
    return ids


def test_vl_features_with_our_kwargs_match_transformers(vl_server, vl_case, checkpoint_dirs):
    from vf_mm.models import model_class

    rendered = vl_case["rendered"]
    mm = rendered.multi_modal_data
    body = {
        "token_ids": list(rendered.token_ids),
        "sampling_params": {"max_tokens": 8, "temperature": 0.0, "logprobs": 0},
        "features": _features(mm),
    }
    out = _generate(vl_server, body)
    choice = out["choices"][0]
    ids = choice["token_ids"]
    assert len(ids) == 8
    assert out["usage"]["prompt_tokens"] == len(rendered.token_ids)

    model = model_class("qwen2_vl").from_pretrained(checkpoint_dirs["vl"], dtype=torch.float32)
    item = mm.mm_items["image"][0]
    image_pad = model.config.image_token_id
    full = list(rendered.token_ids) + ids
    ref = _hf_logprobs(
        model.eval(),
        list(rendered.token_ids),
        ids,
        pixel_values=torch.from_numpy(np.array(item["pixel_values"])),
        image_grid_thw=torch.from_numpy(np.array(item["image_grid_thw"])),
        mm_token_type_ids=(torch.tensor([full]) == image_pad).long(),
    )
    np.testing.assert_allclose(
        [e["logprob"] for e in choice["logprobs"]["content"]], ref, atol=LOGPROB_ATOL
    )


def test_vl_features_match_server_side_processing(vl_server, vl_case, vl_renderer):
    """Our pixels (features) and the server's own processing of the same image
    (content_parts) give the same tokens and logprobs."""
    rendered = vl_case["rendered"]
    sampling = {"max_tokens": 8, "temperature": 0.0, "logprobs": 0}
    ours = _generate(
        vl_server,
        {
            "token_ids": list(rendered.token_ids),
            "sampling_params": sampling,
            "features": _features(rendered.multi_modal_data),
        },
    )["choices"][0]
    image_pad = vl_renderer.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    theirs = _generate(
        vl_server,
        {
            "token_ids": _one_pad_prompt(rendered, image_pad),
            "sampling_params": sampling,
            "content_parts": [{"type": "image_url", "url": vl_case["url"]}],
        },
    )["choices"][0]
    assert ours["token_ids"] == theirs["token_ids"]
    np.testing.assert_allclose(
        [e["logprob"] for e in ours["logprobs"]["content"]],
        [e["logprob"] for e in theirs["logprobs"]["content"]],
        atol=1e-4,
    )


def test_vl_content_parts_expand_like_our_renderer(vl_server, vl_case, vl_renderer):
    rendered = vl_case["rendered"]
    image_pad = vl_renderer.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    out = _generate(
        vl_server,
        {
            "token_ids": _one_pad_prompt(rendered, image_pad),
            "sampling_params": {"max_tokens": 2, "temperature": 0.0},
            "content_parts": [{"type": "image_url", "url": vl_case["url"]}],
            "return_token_ids": True,
        },
    )
    assert out["prompt_token_ids"] == list(rendered.token_ids)
    assert out["mm_placeholders"] == {
        "image": [
            {"offset": p.offset, "length": p.length}
            for p in rendered.multi_modal_data.mm_placeholders["image"]
        ]
    }


def test_vl_content_parts_nested_openai_form_is_not_read(vl_server, vl_case, vl_renderer):
    """vLLM 0.32 reads only the flat form; the OpenAI nesting arrives as no image."""
    image_pad = vl_renderer.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    response = _post(
        vl_server,
        {
            "token_ids": _one_pad_prompt(vl_case["rendered"], image_pad),
            "sampling_params": {"max_tokens": 2},
            "content_parts": [{"type": "image_url", "image_url": {"url": vl_case["url"]}}],
        },
    )
    assert response.status_code == 400, response.text[:500]


def test_vl_render_route_matches_our_renderer(vl_server, vl_case, checkpoint_dirs):
    response = _post(
        vl_server,
        {"model": str(checkpoint_dirs["vl"]), "messages": vl_case["messages"]},
        path="/v1/chat/completions/render",
    )
    assert response.status_code == 200, response.text[:2000]
    ren = response.json()
    rendered = vl_case["rendered"]
    mm = rendered.multi_modal_data
    assert ren["token_ids"] == list(rendered.token_ids)
    features = ren["features"]
    assert features["mm_placeholders"] == _features(mm, kwargs=False)["mm_placeholders"]
    theirs = decode_kwargs_item(features["kwargs_data"]["image"][0])
    ours = mm.mm_items["image"][0]
    assert theirs["image_grid_thw"].tolist() == np.asarray(ours["image_grid_thw"]).tolist()
    # float32 (the server runs with --no-mm-device-do-normalize), equal up to rounding:
    # vLLM's processor is torchvision-based, ours PIL-based
    assert theirs["pixel_values"].dtype == np.float32
    assert theirs["pixel_values"].shape == ours["pixel_values"].shape
    np.testing.assert_allclose(theirs["pixel_values"], ours["pixel_values"], rtol=0, atol=1e-5)
    # the metadata-only item carries the keep_on_cpu field
    meta = decode_kwargs_item(features["mm_metadata"]["image"][0])
    assert list(meta) == ["image_grid_thw"]


def test_vl_features_cached_item_by_hash(vl_server, vl_case):
    """kwargs_data null = use the item the server already holds under that hash."""
    rendered = vl_case["rendered"]
    mm = rendered.multi_modal_data
    sampling = {"max_tokens": 6, "temperature": 0.0, "logprobs": 0}
    features = _features(mm)
    features["mm_hashes"] = {"image": ["vf-mm-test-cache-" + mm.mm_hashes["image"][0]]}
    first = _generate(
        vl_server,
        {"token_ids": list(rendered.token_ids), "sampling_params": sampling, "features": features},
    )["choices"][0]
    features = {**features, "kwargs_data": {"image": [None]}}
    second = _generate(
        vl_server,
        {"token_ids": list(rendered.token_ids), "sampling_params": sampling, "features": features},
    )["choices"][0]
    assert second["token_ids"] == first["token_ids"]
    # the server is still healthy afterwards
    assert httpx.get(vl_server.base_url + "/health", timeout=5).status_code == 200
