"""VLLMBackend against a real, fault-injecting HTTP server on 127.0.0.1.

Each test runs its coroutine with ``asyncio.run``; the fake server runs its own loop in
a thread (``_faulty_server.FaultyServer``), so client and server never share a loop.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import sys
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image

from tests.inference import _faulty_server as fs
from vf_mm.errors import (
    BackendError,
    BackendHTTPError,
    BackendProtocolError,
    BackendUnavailableError,
    MultiModalDataError,
    PromptTooLongError,
    UnsafeImageSourceError,
)
from vf_mm.images import ImagePolicy, image_hash, load_image
from vf_mm.inference import Expansion, GenerateRequest, SamplingParams, VLLMBackend
from vf_mm.types import MultiModalData, PlaceholderRange

PAD = fs.IMAGE_PAD
FAST = {"backoff_s": 0.01, "max_backoff_s": 0.05, "timeout_s": 5.0, "connect_timeout_s": 2.0}


@pytest.fixture
def server() -> Iterator[fs.FaultyServer]:
    with fs.FaultyServer() as s:
        yield s


@pytest.fixture
def servers() -> Iterator[list[fs.FaultyServer]]:
    with fs.FaultyServer() as a, fs.FaultyServer() as b, fs.FaultyServer() as c:
        yield [a, b, c]


def backend(urls: Any, **kwargs: Any) -> VLLMBackend:
    return VLLMBackend(urls, **{"max_model_len": 4096, **FAST, **kwargs})


def run(coro_fn: Any) -> Any:
    """Run ``coro_fn()`` on a fresh loop (a coroutine function, so the backend is made
    inside the loop that uses it)."""
    return asyncio.run(coro_fn())


async def generate_once(b: VLLMBackend, request: GenerateRequest) -> Any:
    try:
        return await b.generate(request)
    finally:
        await b.aclose()


def png_data_url(image: Image.Image) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def decode_data_url(url: str) -> Image.Image:
    header, _, payload = url.partition(",")
    assert header == "data:image/png;base64"
    image = Image.open(io.BytesIO(base64.b64decode(payload)))
    assert image.format == "PNG"
    return image.convert("RGB")


def noise_image(seed: int, size: tuple[int, int] = (20, 14)) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8), "RGB")


@pytest.fixture
def fake_encoder(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Replace vf_mm.inference._mm_kwargs with a recording fake."""
    calls: list[Any] = []

    def encode_kwargs_item(item: Any, *, modality: str = "image") -> str:
        calls.append((modality, item))
        return f"ENC:{modality}:{item['name']}"

    module = types.ModuleType("vf_mm.inference._mm_kwargs")
    module.encode_kwargs_item = encode_kwargs_item  # type: ignore[attr-defined]
    module.item_fingerprint = lambda item: f"fp:{item['name']}"  # type: ignore[attr-defined]
    module.sent_digest = lambda b64: f"digest:{b64}"  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vf_mm.inference._mm_kwargs", module)
    return calls


def two_image_mmd(items: list[Any] | None = None) -> MultiModalData:
    return MultiModalData(
        mm_hashes={"image": ["h0", "h1"]},
        mm_placeholders={"image": [PlaceholderRange(2, 3), PlaceholderRange(6, 2)]},
        mm_items={"image": items if items is not None else [{"name": "a"}, {"name": "b"}]},
    )


# -- the request body -------------------------------------------------------------------


def test_placeholders_with_markers_inside_are_refused_before_sending(
    server: fs.FaultyServer, fake_encoder: list[Any]
) -> None:
    """vLLM 0.32's features placeholders are offset + length only: a range whose inner
    positions are not all embeddings cannot be said, so nothing is sent."""
    sparse = MultiModalData(
        mm_hashes={"image": ["h0"]},
        mm_placeholders={"image": [PlaceholderRange(1, 4, (False, True, True, False))]},
        mm_items={"image": [{"name": "a"}]},
    )
    request = GenerateRequest([11, 20, PAD, PAD, 21, 14], SamplingParams(max_tokens=2), sparse)
    with pytest.raises(
        MultiModalDataError, match=r"is_embed.*send this model's images as content_parts"
    ):
        run(lambda: generate_once(backend(server.url, model="m"), request))
    assert server.generate_bodies == []


def test_features_request_body_schema(server: fs.FaultyServer, fake_encoder: list[Any]) -> None:
    prompt = [11, 12, PAD, PAD, PAD, 13, PAD, PAD, 14]
    sampling = SamplingParams(
        max_tokens=7,
        temperature=0.5,
        top_p=0.9,
        top_k=5,
        min_p=0.1,
        seed=3,
        stop_token_ids=(9, 10),
        logprobs=True,
    )
    request = GenerateRequest(prompt, sampling, two_image_mmd(), request_id="rid-1")
    result = run(lambda: generate_once(backend(server.url, model="m"), request))

    assert server.generate_bodies == [
        {
            "token_ids": prompt,
            "sampling_params": {
                "max_tokens": 7,
                "temperature": 0.5,
                "top_p": 0.9,
                "top_k": 5,
                "min_p": 0.1,
                "repetition_penalty": 1.0,
                "presence_penalty": 0.0,
                "frequency_penalty": 0.0,
                "stop_token_ids": [9, 10],
                "skip_special_tokens": False,
                "detokenize": False,
                "seed": 3,
                "logprobs": 0,
            },
            "model": "m",
            "request_id": "rid-1",
            "features": {
                "mm_hashes": {"image": ["h0", "h1"]},
                "mm_placeholders": {
                    "image": [{"offset": 2, "length": 3}, {"offset": 6, "length": 2}]
                },
                "kwargs_data": {"image": ["ENC:image:a", "ENC:image:b"]},
            },
        }
    ]
    assert server.requests[0].headers["content-type"] == "application/json"
    assert [name for _, name in ((m, i["name"]) for m, i in fake_encoder)] == ["a", "b"]
    assert result.completion_ids == prompt[-3:]
    assert result.prompt_ids is None and result.multi_modal_data is None


def test_sampling_defaults_map_to_vllm_values(server: fs.FaultyServer) -> None:
    sampling = SamplingParams(max_tokens=4, top_k=-1, logprobs=False)
    result = run(lambda: generate_once(backend(server.url), GenerateRequest([1, 2], sampling)))
    (body,) = server.generate_bodies
    assert body == {
        "token_ids": [1, 2],
        "sampling_params": {
            "max_tokens": 4,
            "temperature": 1.0,
            "top_p": 1.0,
            "top_k": 0,  # vLLM: 0 (or -1) = off; no model / seed / logprobs keys
            "min_p": 0.0,
            "repetition_penalty": 1.0,
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "stop_token_ids": [],
            "skip_special_tokens": False,
            "detokenize": False,
        },
    }
    assert result.logprobs is None


def test_banned_ids_are_sent_as_a_logit_bias_that_bans(server: fs.FaultyServer) -> None:
    """vLLM honours token ids through ``logit_bias`` (``bad_words`` are strings a
    tokens-only server cannot tokenize); -100 is the OpenAI API's ban and within vLLM's clamp."""
    request = GenerateRequest([1, 2], SamplingParams(max_tokens=2), banned_token_ids=(9, 7))
    run(lambda: generate_once(backend(server.url), request))
    (body,) = server.generate_bodies
    assert body["sampling_params"]["logit_bias"] == {"9": -100.0, "7": -100.0}


def test_send_kwargs_data_false_sends_null(
    server: fs.FaultyServer, fake_encoder: list[Any]
) -> None:
    mmd = two_image_mmd(items=[{}, {}])  # hashes only: the server has the items cached
    request = GenerateRequest([1, 2, PAD, PAD, PAD, 3, PAD, PAD, 4], multi_modal_data=mmd)
    run(lambda: generate_once(backend(server.url, send_kwargs_data=False), request))
    (body,) = server.generate_bodies
    assert body["features"]["kwargs_data"] is None
    assert body["features"]["mm_hashes"] == {"image": ["h0", "h1"]}
    assert fake_encoder == []


def test_send_kwargs_data_false_needs_no_items(
    server: fs.FaultyServer, fake_encoder: list[Any]
) -> None:
    mmd = MultiModalData(
        mm_hashes={"image": ["h0"]}, mm_placeholders={"image": [PlaceholderRange(1, 2)]}
    )
    request = GenerateRequest([1, PAD, PAD, 2], multi_modal_data=mmd)
    run(lambda: generate_once(backend(server.url, send_kwargs_data=False), request))
    assert server.generate_bodies[0]["features"] == {
        "mm_hashes": {"image": ["h0"]},
        "mm_placeholders": {"image": [{"offset": 1, "length": 2}]},
        "kwargs_data": None,
    }
    assert fake_encoder == []


def test_items_without_inputs_are_sent_as_cache_references(
    server: fs.FaultyServer, fake_encoder: list[Any]
) -> None:
    mmd = two_image_mmd(items=[{}, {"name": "b"}])
    request = GenerateRequest([1, 2, PAD, PAD, PAD, 3, PAD, PAD, 4], multi_modal_data=mmd)
    run(lambda: generate_once(backend(server.url), request))
    assert server.generate_bodies[0]["features"]["kwargs_data"] == {"image": [None, "ENC:image:b"]}


def test_real_kwargs_encoder(server: fs.FaultyServer) -> None:
    import torch

    from vf_mm.inference import _mm_kwargs as mm_kwargs

    item = {
        "pixel_values": torch.arange(4 * 12, dtype=torch.float32).reshape(4, 12),
        "image_grid_thw": torch.tensor([[1, 2, 2]]),
    }
    mmd = MultiModalData(
        mm_hashes={"image": ["h"]},
        mm_placeholders={"image": [PlaceholderRange(1, 1)]},
        mm_items={"image": [item]},
    )
    run(
        lambda: generate_once(
            backend(server.url), GenerateRequest([5, PAD, 6], multi_modal_data=mmd)
        )
    )
    (entry,) = server.generate_bodies[0]["features"]["kwargs_data"]["image"]
    assert entry == mm_kwargs.encode_kwargs_item(item)
    if hasattr(mm_kwargs, "decode_kwargs_item"):
        back = mm_kwargs.decode_kwargs_item(entry)
        np.testing.assert_array_equal(
            np.asarray(back["pixel_values"]), item["pixel_values"].numpy()
        )
        np.testing.assert_array_equal(np.asarray(back["image_grid_thw"]), [[1, 2, 2]])


def test_bad_multimodal_data_is_refused_before_sending(
    server: fs.FaultyServer, fake_encoder: list[Any]
) -> None:
    mmd = two_image_mmd()
    request = GenerateRequest([1, 2, PAD, PAD, PAD, 3, PAD], multi_modal_data=mmd)  # ends at 8 > 7
    with pytest.raises(MultiModalDataError, match="past the prompt"):
        run(lambda: generate_once(backend(server.url), request))
    assert server.requests == []


def test_content_parts_request_and_expanded_prompt(server: fs.FaultyServer, tmp_path: Path) -> None:
    first, second, third = noise_image(1), noise_image(2, (9, 31)), noise_image(3)
    rgba = Image.new("RGBA", (8, 8), (255, 0, 0, 0))  # transparent: composited onto white
    path = tmp_path / "third.png"
    third.save(path)
    parts = [
        {"type": "image_url", "image_url": {"url": png_data_url(first)}},
        {"type": "text", "text": "ignored: vLLM reads media parts only"},
        {"type": "image", "image": second},
        {"type": "image_url", "url": path.as_uri()},  # vLLM's flat form, a local file
        {"type": "image", "image": rgba},
    ]
    prompt = [7, PAD, 8, PAD, PAD, 9, PAD, 10]
    request = GenerateRequest(prompt, SamplingParams(max_tokens=5), content_parts=parts)
    policy = ImagePolicy.dataset(roots=tmp_path)
    b = backend(server.url, mode="content_parts", image_policy=policy)
    result = run(lambda: generate_once(b, request))

    (body,) = server.generate_bodies
    assert "features" not in body
    assert body["return_token_ids"] is True
    assert body["token_ids"] == prompt
    assert [set(p) for p in body["content_parts"]] == [{"type", "url"}] * 4
    assert all(p["type"] == "image_url" for p in body["content_parts"])
    sent = [decode_data_url(p["url"]) for p in body["content_parts"]]
    for got, want in zip(sent, [first, second, third], strict=False):
        assert got.size == want.size
        assert got.tobytes() == want.tobytes()
    assert sent[3].getpixel((0, 0)) == (255, 255, 255)

    expanded = [7, *[PAD] * 4, 8, *[PAD] * 8, 9, *[PAD] * 4, 10]
    assert result.prompt_ids == expanded
    mm = result.multi_modal_data
    assert mm is not None
    assert mm.mm_placeholders == {
        "image": [
            PlaceholderRange(1, 4),
            PlaceholderRange(6, 4),
            PlaceholderRange(10, 4),
            PlaceholderRange(15, 4),
        ]
    }
    want_hashes = [image_hash(load_image(img)) for img in (first, second, third, rgba)]
    assert mm.mm_hashes == {"image": want_hashes}
    mm.validate(num_tokens=len(expanded))
    assert result.completion_ids == expanded[-3:]
    assert result.usage.prompt_tokens == len(expanded)


@pytest.mark.parametrize(
    ("url", "policy"),
    [
        # link-local cloud metadata: refused even when the network is on
        ("http://169.254.169.254/latest/meta-data/", ImagePolicy.trusted()),
        ("http://127.0.0.1:1/secret.png", ImagePolicy.trusted()),
        # the default policy has no network at all
        ("https://example.com/cat.png", None),
    ],
)
def test_content_parts_never_forward_unsafe_urls(
    server: fs.FaultyServer, url: str, policy: ImagePolicy | None
) -> None:
    parts = [
        {"type": "image", "image": noise_image(0)},
        {"type": "image_url", "image_url": {"url": url}},
    ]
    request = GenerateRequest([1, PAD, PAD, 2], content_parts=parts)
    b = backend(server.url, mode="content_parts", image_policy=policy)
    with pytest.raises(UnsafeImageSourceError):
        run(lambda: generate_once(b, request))
    assert server.requests == []


def test_content_parts_refuse_files_outside_the_policy(
    server: fs.FaultyServer, tmp_path: Path
) -> None:
    secret = tmp_path / "secret.png"
    noise_image(5).save(secret)
    allowed = tmp_path / "images"
    allowed.mkdir()
    for source in (secret.as_uri(), str(secret), str(allowed / ".." / "secret.png")):
        request = GenerateRequest(
            [1, PAD, 2], content_parts=[{"type": "image_url", "image_url": {"url": source}}]
        )
        b = backend(server.url, mode="content_parts", image_policy=ImagePolicy.dataset(allowed))
        with pytest.raises(UnsafeImageSourceError):
            run(lambda b=b, request=request: generate_once(b, request))
    assert server.requests == []


def test_content_parts_need_content_parts_mode(server: fs.FaultyServer) -> None:
    request = GenerateRequest(
        [1, PAD, 2], content_parts=[{"type": "image", "image": noise_image(0)}]
    )
    with pytest.raises(MultiModalDataError, match="features' mode"):
        run(lambda: generate_once(backend(server.url), request))
    assert server.requests == []


# -- the response -------------------------------------------------------------------------


def test_response_parsing(server: fs.FaultyServer) -> None:
    server.push(
        fs.json_body(
            {
                "request_id": "x",
                "output_mode": "tokens",
                "choices": [
                    {
                        "index": 0,
                        "token_ids": [5, 6, 7],
                        "finish_reason": "stop",
                        "stop_reason": 7,
                        "logprobs": {
                            "content": [
                                {"token_id": 5, "logprob": -0.25, "rank": 1, "top_logprobs": []},
                                {"token_id": 6, "logprob": -1, "rank": 2, "top_logprobs": []},
                                {"token_id": 7, "logprob": -9999.0, "rank": 9, "top_logprobs": []},
                            ]
                        },
                    }
                ],
                "usage": {"prompt_tokens": 40, "completion_tokens": 3, "total_tokens": 43},
                "some_future_field": {"ignored": True},
            }
        ),
        # an older server: OpenAI-style entries with "token_id:N" strings, no usage
        fs.json_body(
            {
                "choices": [
                    {
                        "index": 0,
                        "token_ids": [8, 9],
                        "finish_reason": "length",
                        "logprobs": {
                            "content": [
                                {"token": "token_id:8", "logprob": -0.5, "top_logprobs": []},
                                {"token": "token_id:9", "logprob": -0.75, "top_logprobs": []},
                            ]
                        },
                    }
                ]
            }
        ),
    )

    # newer vLLM main with return_token_logprobs: only a flat "sampled" list
    server.push(
        fs.json_body(
            {"choices": [{"index": 0, "token_ids": [3, 4], "logprobs": {"sampled": [-2.0, -3.5]}}]}
        )
    )

    async def go() -> list[Any]:
        async with backend(server.url) as b:
            return [await b.generate(GenerateRequest([1, 2, 3])) for _ in range(3)]

    first, second, third = run(go)
    assert third.completion_ids == [3, 4]
    assert third.logprobs == [-2.0, -3.5]
    assert third.finish_reason == "stop"  # vLLM's default when finish_reason is absent
    assert first.completion_ids == [5, 6, 7]
    assert first.logprobs == [-0.25, -1.0, -9999.0]
    assert first.finish_reason == "stop"
    assert first.stop_reason == 7
    assert (first.usage.prompt_tokens, first.usage.completion_tokens) == (40, 3)
    assert second.completion_ids == [8, 9]
    assert second.logprobs == [-0.5, -0.75]
    assert second.finish_reason == "length"
    assert second.stop_reason is None
    assert (second.usage.prompt_tokens, second.usage.completion_tokens) == (3, 2)


def _choice(**overrides: Any) -> dict[str, Any]:
    choice = {
        "index": 0,
        "token_ids": [1, 2],
        "finish_reason": "stop",
        "logprobs": {
            "content": [{"token_id": 1, "logprob": -1.0}, {"token_id": 2, "logprob": -2.0}]
        },
    }
    choice.update(overrides)
    return choice


@pytest.mark.parametrize(
    ("answer", "match"),
    [
        ({"usage": {"prompt_tokens": 1, "completion_tokens": 1}}, "choices"),
        ({"choices": []}, "choices"),
        ({"choices": [{"index": 0, "finish_reason": "stop"}]}, "token_ids"),
        ({"choices": [_choice(token_ids="12")]}, "token_ids"),
        ({"choices": [_choice(token_ids=[1, "2"])]}, "token_ids"),
        ({"choices": [_choice(token_ids=[1, -2])]}, "token_ids"),
        ({"choices": [_choice(finish_reason="error")]}, "finish_reason"),
        ({"choices": [_choice(logprobs=None)]}, "logprobs were asked"),
        (
            {"choices": [_choice(logprobs={"content": [{"token_id": 1, "logprob": -1.0}]})]},
            "1 logprobs for 2",
        ),
        (
            {"choices": [_choice(logprobs={"content": [{"logprob": "x"}, {"logprob": -1.0}]})]},
            "logprob",
        ),
        (
            {
                "choices": [
                    _choice(
                        logprobs={
                            "content": [
                                {"token_id": 1, "logprob": -1.0},
                                {"token_id": 3, "logprob": -1.0},
                            ]
                        }
                    )
                ]
            },
            "token_id is 3",
        ),
        ([1, 2, 3], "body"),
    ],
)
def test_schema_violations_are_protocol_errors_and_not_retried(
    server: fs.FaultyServer, answer: Any, match: str
) -> None:
    server.default = fs.json_body(answer)
    with pytest.raises(BackendProtocolError, match=match) as info:
        run(lambda: generate_once(backend(server.url, max_retries=3), GenerateRequest([1, 2, 3])))
    assert server.generate_count == 1
    assert server.url in str(info.value)


def test_content_parts_answer_without_expanded_prompt_is_a_protocol_error(
    server: fs.FaultyServer,
) -> None:
    server.default = fs.json_body({"choices": [_choice()]})  # ignored return_token_ids
    request = GenerateRequest(
        [1, PAD, 2], content_parts=[{"type": "image", "image": noise_image(0)}]
    )
    with pytest.raises(BackendProtocolError, match="prompt_token_ids"):
        run(lambda: generate_once(backend(server.url, mode="content_parts"), request))


def test_content_parts_range_without_the_renderers_embedding_ids_names_what_it_holds() -> None:
    """vLLM 0.32's InternVL writes a clip's frames with ``<video>`` (here 5) where the
    renderer's embeddings go (``<IMG_CONTEXT>``, here 9): refused, naming the id the server
    wrote and that its prompt ids are not the renderer's, never returned as the prompt."""
    from vf_mm.inference._vllm_protocol import RequestBody, ResponseSchemaError, decode_response

    body = json.dumps({
        "choices": [{"index": 0, "token_ids": [7], "finish_reason": "length"}],
        "prompt_token_ids": [1, 8, 5, 5, 2],
        "mm_placeholders": {"video": [{"offset": 1, "length": 3}]},
    }).encode()  # fmt: skip
    sent = RequestBody(
        b"", media_hashes={"video": ["v0"]}, embed_token_ids={"video": frozenset({9})}
    )
    request = GenerateRequest([1, 3, 2], SamplingParams(max_tokens=1, logprobs=False))
    with pytest.raises(
        ResponseSchemaError, match=r"most frequent token: \[5\].*not the renderer's"
    ):
        decode_response(body, request, sent)


@pytest.mark.parametrize(("modality", "swaps"), [("image", None), ("video", {"video": {5: 9}})])
def test_a_range_of_other_ids_names_the_fix_that_applies(modality, swaps) -> None:
    """The InternVL3 hint (pass ``embed_swaps``) is for a clip answered without the swap
    only: an image range of other ids, or a clip whose ids the given swap does not explain,
    is told to be sampled where the renderer's ids are used, never to pass a swap it cannot
    have or already has."""
    from vf_mm.inference._vllm_protocol import RequestBody, ResponseSchemaError, decode_response

    body = json.dumps({
        "choices": [{"index": 0, "token_ids": [7], "finish_reason": "length"}],
        "prompt_token_ids": [1, 8, 7, 7, 2],
        "mm_placeholders": {modality: [{"offset": 1, "length": 3}]},
    }).encode()  # fmt: skip
    sent = RequestBody(b"", media_hashes={modality: ["m0"]},
                       embed_token_ids={modality: frozenset({9})}, embed_swaps=swaps)  # fmt: skip
    request = GenerateRequest([1, 3, 2], SamplingParams(max_tokens=1, logprobs=False))
    with pytest.raises(ResponseSchemaError, match=r"most frequent token: \[7\]") as info:
        decode_response(body, request, sent)
    assert "embed_swaps" not in str(info.value)
    assert "LocalBackend" in str(info.value)


#: a recorded vLLM 0.32 answer's shape for an InternVL3 clip, in toy ids: <img> 8,
#: </img> 6, "Frame2: " 30, <IMG_CONTEXT> 9 (the renderer's), <video> 5 (what vLLM writes)
INTERNVL_CLIP = [1, 5, 8, 5, 5, 6, 30, 8, 5, 5, 6, 2]
INTERNVL_RANGE = {"offset": 2, "length": 9}


def internvl_clip_answer(prompt: list[int]) -> dict[str, Any]:
    return fs.json_body({"choices": [_choice()], "prompt_token_ids": prompt,
                         "mm_placeholders": {"video": [INTERNVL_RANGE]}})  # fmt: skip


def clip_request() -> GenerateRequest:
    frames = np.random.default_rng(0).integers(0, 256, (2, 8, 8, 3), dtype=np.uint8)
    part = {"type": "video", "video": frames, "frame_rate": 4.0}
    return GenerateRequest([1, 5, 2], SamplingParams(max_tokens=3), content_parts=[part])


def test_content_parts_map_an_internvl_clips_video_ids_back_to_the_renderers(
    server: fs.FaultyServer,
) -> None:
    """vLLM 0.32 writes an InternVL3 clip's embedding positions with ``<video>`` where the
    renderer writes ``<IMG_CONTEXT>``: with the family's swap the returned prompt holds the
    renderer's ids inside the clip's range (and only there), and ``is_embed`` marks them."""
    server.default = internvl_clip_answer(INTERNVL_CLIP)
    b = backend(server.url, mode="content_parts", embed_token_ids={"video": [9]},
                embed_swaps={"video": {5: 9}})  # fmt: skip
    result = run(lambda: generate_once(b, clip_request()))
    # position 1 lies outside the range: never touched
    assert result.prompt_ids == [1, 5, 8, 9, 9, 6, 30, 8, 9, 9, 6, 2]
    (span,) = result.multi_modal_data.mm_placeholders["video"]
    assert (span.offset, span.length, span.num_embeds) == (2, 9, 4)
    assert span.is_embed == (False, True, True, False, False, False, True, True, False)


def test_content_parts_refuse_an_internvl_clip_the_known_swap_does_not_explain(
    server: fs.FaultyServer,
) -> None:
    """Only whole swaps are mapped: a range holding vLLM's <video> beside the renderer's
    <IMG_CONTEXT>, or holding neither, is refused by name, never returned."""
    kw = {"mode": "content_parts", "embed_token_ids": {"video": [9]},
          "embed_swaps": {"video": {5: 9}}}  # fmt: skip
    mixed = [*INTERNVL_CLIP[:3], 9, *INTERNVL_CLIP[4:]]
    server.default = internvl_clip_answer(mixed)
    with pytest.raises(BackendProtocolError, match=r"holds the server's \[5\] beside.*\[9\]"):
        run(lambda: generate_once(backend(server.url, **kw), clip_request()))
    other = [7 if t == 5 else t for t in INTERNVL_CLIP]  # an id no swap names
    server.default = internvl_clip_answer(other)
    with pytest.raises(BackendProtocolError, match=r"most frequent token: \[7\]"):
        run(lambda: generate_once(backend(server.url, **kw), clip_request()))


def test_content_parts_refuse_a_clip_without_the_renderers_embedding_ids(
    server: fs.FaultyServer,
) -> None:
    """Without embed_token_ids the backend cannot tell vLLM's InternVL3 ids from the
    renderer's: the clip is refused before anything is sent, naming the fix."""
    server.default = internvl_clip_answer(INTERNVL_CLIP)
    with pytest.raises(
        MultiModalDataError,
        match=r"content_parts\[0\] is a clip.*Expansion\.of\(renderer\.vision\)",
    ):
        run(lambda: generate_once(backend(server.url, mode="content_parts"), clip_request()))
    with pytest.raises(MultiModalDataError, match="no embed_token_ids for 'video'"):
        b = backend(server.url, mode="content_parts", embed_token_ids={"image": [9]})
        run(lambda: generate_once(b, clip_request()))
    assert server.generate_count == 0


def test_content_parts_placeholder_count_mismatch_is_a_protocol_error(
    server: fs.FaultyServer,
) -> None:
    server.default = fs.json_body(
        {"choices": [_choice()], "prompt_token_ids": [1, PAD, PAD, 2], "mm_placeholders": None}
    )
    request = GenerateRequest(
        [1, PAD, 2], content_parts=[{"type": "image", "image": noise_image(0)}]
    )
    with pytest.raises(BackendProtocolError, match="0 image placeholders came back for 1"):
        run(lambda: generate_once(backend(server.url, mode="content_parts"), request))


# -- retries ---------------------------------------------------------------------------------


def test_500_then_200_succeeds_after_one_retry(server: fs.FaultyServer) -> None:
    server.push(fs.status(500))
    b = backend(server.url)
    result = run(lambda: generate_once(b, GenerateRequest([1, 2, 3, 4])))
    assert result.completion_ids == [2, 3, 4]
    assert server.generate_count == 2
    assert server.generate_bodies[0] == server.generate_bodies[1]
    assert b.stats[server.url] == {
        "requests": 2,
        "retries": 1,
        "failures": 1,
        "outstanding": 0,
        "sessions": 0,
    }


def test_5xx_every_time_gives_http_error_after_all_attempts(server: fs.FaultyServer) -> None:
    server.default = fs.status(503, {"error": {"message": "engine is overloaded"}})
    with pytest.raises(BackendHTTPError) as info:
        run(lambda: generate_once(backend(server.url, max_retries=2), GenerateRequest([1])))
    assert info.value.status == 503
    assert info.value.detail == "engine is overloaded"
    assert "3 attempt" in str(info.value) and server.url in str(info.value)
    assert server.generate_count == 3


@pytest.fixture
def waits(monkeypatch) -> list[float]:
    """The backoffs the backend waits, recorded instead of slept: what a test asserts is
    the delay asked for, never a wall-clock window."""
    from vf_mm.inference import _vllm

    slept: list[float] = []

    class Clock:
        def __getattr__(self, name: str) -> Any:
            return getattr(asyncio, name)

        @staticmethod
        async def sleep(delay: float, *args: Any) -> None:
            slept.append(delay)
            await asyncio.sleep(0)

    monkeypatch.setattr(_vllm, "asyncio", Clock())
    return slept


def test_429_honours_retry_after(server: fs.FaultyServer, waits: list[float]) -> None:
    server.push(fs.status(429, headers={"Retry-After": "1"}))
    run(lambda: generate_once(backend(server.url, max_backoff_s=5.0), GenerateRequest([1, 2])))
    assert server.generate_count == 2
    assert waits == [1.0]


def test_retry_after_is_capped_by_max_backoff(server: fs.FaultyServer, waits: list[float]) -> None:
    server.push(fs.status(429, headers={"Retry-After": "100"}))
    run(lambda: generate_once(backend(server.url, max_backoff_s=0.2), GenerateRequest([1, 2])))
    assert server.generate_count == 2
    assert waits == [0.2]


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        (
            {
                "error": {
                    "message": "token id 999999 is out of vocabulary",
                    "type": "BadRequestError",
                    "param": None,
                    "code": 400,
                }
            },
            "token id 999999 is out of vocabulary",
        ),
        (
            {"object": "error", "message": "older vLLM error", "type": "BadRequestError"},
            "older vLLM error",
        ),
        ({"detail": "Not Found"}, "Not Found"),
        (
            {"detail": [{"loc": ["body", "token_ids"], "msg": "too short"}]},
            '[{"loc": ["body", "token_ids"], "msg": "too short"}]',
        ),
        ("plain text says no", "plain text says no"),
    ],
)
def test_4xx_is_final_and_carries_the_server_message(
    server: fs.FaultyServer, body: Any, detail: str
) -> None:
    server.default = fs.status(400, body)
    with pytest.raises(BackendHTTPError) as info:
        run(lambda: generate_once(backend(server.url), GenerateRequest([1, 2])))
    assert info.value.status == 400
    assert info.value.detail == detail
    assert detail in str(info.value) and server.url in str(info.value)
    assert "1 attempt" in str(info.value)
    assert server.generate_count == 1


def test_404_says_how_to_enable_the_route(server: fs.FaultyServer) -> None:
    server.default = fs.status(404, {"detail": "Not Found"})
    with pytest.raises(BackendHTTPError, match="--enable-scale-out"):
        run(lambda: generate_once(backend(server.url), GenerateRequest([1, 2])))


def test_down_server_is_unavailable_after_all_attempts() -> None:
    url = fs.down_url()
    b = backend(url, max_retries=2)
    with pytest.raises(BackendUnavailableError) as info:
        run(lambda: generate_once(b, GenerateRequest([1, 2])))
    assert "3 attempt" in str(info.value) and url in str(info.value)
    assert b.stats[url] == {
        "requests": 3,
        "retries": 2,
        "failures": 3,
        "outstanding": 0,
        "sessions": 0,
    }


def test_slow_server_times_out(server: fs.FaultyServer) -> None:
    server.default = fs.sleep(3.0)
    b = backend(server.url, timeout_s=0.2, max_retries=1)
    with pytest.raises(BackendUnavailableError, match="timed out") as info:
        run(lambda: generate_once(b, GenerateRequest([1, 2])))
    assert "2 attempt" in str(info.value)
    assert server.generate_count == 2


@pytest.mark.parametrize("fault", [fs.cut, fs.drop])
def test_connection_closed_mid_answer_is_retried(server: fs.FaultyServer, fault: Any) -> None:
    server.push(fault())
    result = run(lambda: generate_once(backend(server.url), GenerateRequest([1, 2, 3])))
    assert result.completion_ids == [1, 2, 3]
    assert server.generate_count == 2


@pytest.mark.parametrize("fault", [fs.cut, fs.drop])
def test_connection_closed_every_time_is_unavailable(server: fs.FaultyServer, fault: Any) -> None:
    server.default = fault()
    with pytest.raises(BackendUnavailableError, match="closed the connection") as info:
        run(lambda: generate_once(backend(server.url, max_retries=2), GenerateRequest([1, 2, 3])))
    assert "3 attempt" in str(info.value)
    assert server.generate_count == 3


def test_malformed_json_is_retried(server: fs.FaultyServer) -> None:
    server.push(fs.malformed())
    b = backend(server.url)
    result = run(lambda: generate_once(b, GenerateRequest([4, 5, 6])))
    assert result.completion_ids == [4, 5, 6]
    assert server.generate_count == 2
    assert b.stats[server.url] == {
        "requests": 2,
        "retries": 1,
        "failures": 1,
        "outstanding": 0,
        "sessions": 0,
    }


def test_malformed_json_every_time_is_a_protocol_error(server: fs.FaultyServer) -> None:
    server.default = fs.malformed()
    with pytest.raises(BackendProtocolError, match="not JSON") as info:
        run(lambda: generate_once(backend(server.url, max_retries=2), GenerateRequest([4, 5, 6])))
    assert "3 attempt" in str(info.value)
    assert server.generate_count == 3


# -- several servers --------------------------------------------------------------------------


def test_ties_are_broken_round_robin(servers: list[fs.FaultyServer]) -> None:
    async def go() -> None:
        async with backend([s.url for s in servers]) as b:
            for i in range(9):
                await b.generate(GenerateRequest([i + 1]))

    run(go)
    assert [s.generate_count for s in servers] == [3, 3, 3]


def test_least_outstanding_sends_fewer_requests_to_a_slow_server(
    servers: list[fs.FaultyServer],
) -> None:
    slow, fast = servers[0], servers[1]
    slow.default = fs.sleep(0.4)

    async def go() -> VLLMBackend:
        b = backend([slow.url, fast.url])
        limit = asyncio.Semaphore(4)

        async def one(i: int) -> None:
            async with limit:
                await b.generate(GenerateRequest([i + 1, 2]))

        await asyncio.gather(*(one(i) for i in range(60)))
        await b.aclose()
        return b

    b = run(go)
    assert slow.generate_count + fast.generate_count == 60
    assert slow.generate_count <= 8, (slow.generate_count, fast.generate_count)
    assert slow.max_active <= 3
    assert all(s["outstanding"] == 0 for s in b.stats.values())


def test_failover_to_the_server_that_answers(server: fs.FaultyServer) -> None:
    down = fs.down_url()
    b = backend([down, server.url], max_retries=1)

    async def go() -> list[Any]:
        try:
            return [await b.generate(GenerateRequest([i + 1, 7])) for i in range(10)]
        finally:
            await b.aclose()

    results = run(go)
    assert [r.completion_ids for r in results] == [[i + 1, 7] for i in range(10)]
    assert server.generate_count == 10
    assert 1 <= b.stats[down]["failures"] <= 10


def test_a_retry_goes_to_another_server(servers: list[fs.FaultyServer], waits: list[float]) -> None:
    broken, good = servers[0], servers[1]
    broken.default = fs.status(500)
    b = backend([broken.url, good.url], max_retries=1, backoff_s=5.0, max_backoff_s=5.0)

    async def go() -> None:
        try:
            for i in range(4):
                await b.generate(GenerateRequest([i + 1]))
        finally:
            await b.aclose()

    run(go)
    # a retry on a server not tried yet starts at once (no 5 s backoff)
    assert waits == []
    assert good.generate_count == 4
    assert broken.generate_count >= 1


# -- routing: sessions ---------------------------------------------------------------------------


def turn(session: int, n: int) -> GenerateRequest:
    """Turn ``n`` of session ``session`` (its first token names the session)."""
    return GenerateRequest([100 + session, n + 1], session_id=f"s{session}")


def sessions_on(server: fs.FaultyServer) -> set[int]:
    return {body["token_ids"][0] - 100 for body in server.generate_bodies}


def test_each_session_stays_on_one_server_and_sessions_spread(
    servers: list[fs.FaultyServer],
) -> None:
    async def go() -> tuple[Any, Any]:
        async with backend([s.url for s in servers]) as b:
            for n in range(4):
                await asyncio.gather(*(b.generate(turn(s, n)) for s in range(6)))
            return b.stats, b.routing_stats

    stats, routing = run(go)
    on = [sessions_on(s) for s in servers]
    assert [len(x) for x in on] == [2, 2, 2] and set().union(*on) == set(range(6))
    assert [s.generate_count for s in servers] == [8, 8, 8]
    assert [v["sessions"] for v in stats.values()] == [2, 2, 2]
    assert routing == {"routing": "sticky", "placed": 6, "kept": 18, "shed_load": 0,
                       "shed_failure": 0, "expired": 0, "sessions": 6}  # fmt: skip


def test_ties_never_pin_new_sessions_onto_one_server(servers: list[fs.FaultyServer]) -> None:
    """Sessions one at a time, each ended before the next begins: every placement sees
    servers alike, and they take turns (never the first in the list every time)."""

    async def go() -> Any:
        async with backend([s.url for s in servers]) as b:
            for s in range(6):
                await b.generate(turn(s, 0))
                b.end_session(f"s{s}")
            return b.stats

    stats = run(go)
    assert [s.generate_count for s in servers] == [2, 2, 2]
    assert [v["sessions"] for v in stats.values()] == [0, 0, 0]


def test_new_sessions_go_to_the_server_with_fewest(servers: list[fs.FaultyServer]) -> None:
    a, other = servers[0], servers[1]

    async def go() -> Any:
        async with backend([a.url, other.url]) as b:
            for s in range(4):
                await b.generate(turn(s, 0))
            for s in sessions_on(a):  # a's rollouts are over: a has none
                b.end_session(f"s{s}")
            b.end_session("never-seen")  # unknown or ended twice: nothing happens
            for s in (4, 5):
                await b.generate(turn(s, 0))
            return b.stats

    stats = run(go)
    assert {4, 5} <= sessions_on(a) and sessions_on(other).isdisjoint({4, 5})
    assert [stats[a.url]["sessions"], stats[other.url]["sessions"]] == [2, 2]


def test_a_saturated_server_sheds_the_session(servers: list[fs.FaultyServer]) -> None:
    home, other = servers[0], servers[1]

    async def go() -> tuple[Any, Any]:
        b = backend([home.url, other.url], shed_margin=2)
        try:
            await b.generate(turn(0, 0))  # the first placement: home
            home.push(fs.sleep(30), fs.sleep(30))  # its next two requests hang
            held = [asyncio.create_task(b.generate(turn(0, n))) for n in (1, 2)]
            while b.stats[home.url]["outstanding"] < 2:
                await asyncio.sleep(0.01)
            await b.generate(turn(0, 3))  # home has 2 in flight, other 0: shed
            await b.generate(turn(0, 4))  # the session lives on the other server now
            stats, routing = b.stats, b.routing_stats
            for task in held:
                task.cancel()
            await asyncio.gather(*held, return_exceptions=True)
            return stats, routing
        finally:
            await b.aclose()

    stats, routing = run(go)
    assert other.generate_count == 2 and home.generate_count == 3
    assert (routing["kept"], routing["shed_load"]) == (3, 1)
    assert (stats[home.url]["sessions"], stats[other.url]["sessions"]) == (0, 1)


def test_a_failing_server_sheds_its_sessions(servers: list[fs.FaultyServer]) -> None:
    home, other = servers[0], servers[1]

    async def go() -> tuple[Any, Any]:
        async with backend([home.url, other.url], max_retries=1) as b:
            await b.generate(turn(0, 0))  # home
            home.default = fs.status(503)
            await b.generate(turn(0, 1))  # 503, then the retry on the other server
            home.default = fs.ok()  # back, but the session's history is on the other now
            await b.generate(turn(0, 2))
            return b.stats, b.routing_stats

    stats, routing = run(go)
    assert home.generate_count == 2 and other.generate_count == 2
    # turn 1 was kept (home), then its retry moved the session; turn 2 was kept (other)
    assert (routing["placed"], routing["shed_failure"], routing["kept"]) == (1, 1, 2)
    assert (stats[home.url]["sessions"], stats[other.url]["sessions"]) == (0, 1)
    assert stats[home.url]["failures"] == 1


def test_a_server_refusing_connections_gets_no_new_sessions(server: fs.FaultyServer) -> None:
    down = fs.down_url()

    async def go() -> Any:
        # a cooldown far longer than the test: the down server is not asked again
        async with backend([down, server.url], max_retries=1, backoff_s=60, max_backoff_s=60) as b:
            for s in range(4):
                await b.generate(turn(s, 0))
            return b.stats

    stats = run(go)
    assert server.generate_count == 4
    assert stats[down]["requests"] == 1 and stats[server.url]["sessions"] == 4


def test_idle_sessions_are_forgotten(servers: list[fs.FaultyServer]) -> None:
    async def go() -> Any:
        async with backend([s.url for s in servers], session_idle_s=0.01) as b:
            await b.generate(turn(0, 0))
            await asyncio.sleep(0.05)  # longer than session_idle_s
            await b.generate(turn(1, 0))
            return b.routing_stats

    routing = run(go)
    assert (routing["expired"], routing["sessions"]) == (1, 1)


@pytest.mark.parametrize("routing", ["least_outstanding", "round_robin"])
def test_the_baselines_spread_one_session_over_every_server(
    servers: list[fs.FaultyServer], routing: str
) -> None:
    async def go() -> tuple[Any, Any]:
        async with backend([s.url for s in servers], routing=routing) as b:
            for n in range(6):
                await b.generate(turn(0, n))
            return b.stats, b.routing_stats

    stats, counts = run(go)
    assert [s.generate_count for s in servers] == [2, 2, 2]
    assert counts["placed"] == counts["sessions"] == 0
    assert all(v["sessions"] == 0 for v in stats.values())


def test_round_robin_takes_turns_whatever_the_load(servers: list[fs.FaultyServer]) -> None:
    slow, fast = servers[0], servers[1]
    slow.default = fs.sleep(0.2)

    async def go() -> None:
        async with backend([slow.url, fast.url], routing="round_robin") as b:
            limit = asyncio.Semaphore(4)

            async def one(i: int) -> None:
                async with limit:
                    await b.generate(GenerateRequest([i + 1]))

            await asyncio.gather(*(one(i) for i in range(12)))

    run(go)
    assert (slow.generate_count, fast.generate_count) == (6, 6)


# -- before sending ------------------------------------------------------------------------------


def test_prompt_too_long_is_refused_before_sending(server: fs.FaultyServer) -> None:
    request = GenerateRequest(list(range(8)), SamplingParams(max_tokens=5))
    with pytest.raises(PromptTooLongError) as info:
        run(lambda: generate_once(backend(server.url, max_model_len=12), request))
    assert (info.value.prompt_tokens, info.value.limit) == (8, 12)
    assert "8 tokens" in str(info.value) and "12" in str(info.value)
    assert server.requests == []


def test_max_model_len_is_read_from_v1_models(server: fs.FaultyServer) -> None:
    server.max_model_len = 16
    b = VLLMBackend(server.url, **FAST)
    assert b.max_model_len is None

    async def go() -> None:
        try:
            with pytest.raises(PromptTooLongError, match="exceeds the model's 16"):
                await b.generate(GenerateRequest(list(range(10)), SamplingParams(max_tokens=7)))
            await b.generate(GenerateRequest(list(range(10)), SamplingParams(max_tokens=6)))
        finally:
            await b.aclose()

    run(go)
    assert b.max_model_len == 16
    assert [(r.method, r.path) for r in server.requests] == [
        ("GET", "/v1/models"),
        ("POST", fs.GENERATE),
    ]


def test_max_model_len_unknown_when_v1_models_is_missing(server: fs.FaultyServer) -> None:
    server.models_status = 404
    b = VLLMBackend(server.url, **FAST)

    async def go() -> None:
        try:
            for _ in range(2):
                await b.generate(GenerateRequest(list(range(10)), SamplingParams(max_tokens=6)))
        finally:
            await b.aclose()

    run(go)
    assert b.max_model_len is None
    assert [r.path for r in server.requests].count("/v1/models") == 1  # asked once
    assert server.generate_count == 2


# -- cancellation and closing ----------------------------------------------------------------------


def test_cancelling_frees_the_slot_and_the_connection(server: fs.FaultyServer) -> None:
    server.default = fs.sleep(5.0)
    b = backend(server.url)

    async def go() -> None:
        task = asyncio.create_task(b.generate(GenerateRequest([1, 2])))
        for _ in range(200):
            await asyncio.sleep(0.01)
            if server.generate_count == 1:
                break
        assert b.stats[server.url]["outstanding"] == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert b.stats[server.url]["outstanding"] == 0
        await b.aclose()

    run(go)
    while not server.disconnects:  # the server notices the closed connection (a hang: timeout)
        time.sleep(0.01)
    assert server.disconnects == 1


def test_closed_backend_refuses(server: fs.FaultyServer) -> None:
    async def go() -> None:
        b = backend(server.url)
        await b.generate(GenerateRequest([1]))
        await b.aclose()
        with pytest.raises(BackendError, match="closed"):
            await b.generate(GenerateRequest([1]))

    run(go)
    assert server.generate_count == 1


def test_constructor_checks() -> None:
    with pytest.raises(ValueError, match="at least one"):
        VLLMBackend([])
    with pytest.raises(ValueError, match="http"):
        VLLMBackend("ftp://host")
    with pytest.raises(ValueError, match="mode"):
        VLLMBackend("http://h", mode="images")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="routing"):
        VLLMBackend("http://h", routing="hash")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="shed_margin"):
        VLLMBackend("http://h", shed_margin=0)
    with pytest.raises(ValueError, match="session_idle_s"):
        VLLMBackend("http://h", session_idle_s=0)
    assert VLLMBackend(["http://h:1/v1/", "http://g:2"]).base_urls == ["http://h:1", "http://g:2"]
    # a swap maps a server's id to one of the renderer's embedding ids, never one away
    with pytest.raises(ValueError, match=r"embed_swaps\['video'\] maps 5 to 9"):
        VLLMBackend("http://h", embed_swaps={"video": {5: 9}})
    with pytest.raises(ValueError, match=r"maps 9 to 5"):
        VLLMBackend("http://h", embed_token_ids={"video": [9, 5]}, embed_swaps={"video": {9: 5}})
    # the keywords build the Expansion: one object, or the keywords, never both
    facts = Expansion(embed_token_ids={"video": [9]}, embed_swaps={"video": {5: 9}})
    assert VLLMBackend("http://h", expansion=facts).embed_swaps == {"video": {5: 9}}
    with pytest.raises(TypeError, match="refusals given with expansion=Expansion"):
        VLLMBackend("http://h", expansion=facts, refusals={"video": "no"})
    # ids that are not token ids, or a field that is not by modality, are named
    with pytest.raises(TypeError, match=r"embed_token_ids must be a mapping by modality"):
        Expansion(embed_token_ids=[9])  # type: ignore[arg-type]
    for bad in ("9", [9.0], [True]):
        with pytest.raises(TypeError, match="must be token ids"):
            Expansion(embed_token_ids={"video": bad})


def test_each_server_gets_its_own_api_key():
    seen: list[tuple[str, str | None]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.url.host, request.headers.get("authorization")))
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "m", "max_model_len": 4096}]})
        return httpx.Response(200, json={"choices": [{"index": 0, "token_ids": [5], "logprobs": None,
                                                      "finish_reason": "stop"}]})  # fmt: skip

    backend = VLLMBackend(["http://a:8000", "http://b:8000", "http://c:8000"], model="m",
                          api_key=["key-a", None, "key-c"], routing="round_robin",
                          transport=httpx.MockTransport(handler))  # fmt: skip

    async def main():
        try:
            for _ in range(3):
                await backend.generate(
                    GenerateRequest([1, 2, 3], SamplingParams(max_tokens=1, logprobs=False))
                )
        finally:
            await backend.aclose()

    asyncio.run(main())
    keys = {host: auth for host, auth in seen}
    assert keys == {"a": "Bearer key-a", "b": None, "c": "Bearer key-c"}
    with pytest.raises(ValueError, match="2 API keys for 3 base URLs"):
        VLLMBackend(["http://a:1", "http://b:1", "http://c:1"], api_key=["x", "y"])
