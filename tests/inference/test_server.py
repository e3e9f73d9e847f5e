"""``vf-mm serve``: vLLM's token-in/token-out route, the chat route, and the CLI.

Most tests talk to ``create_app`` in-process through starlette's TestClient; one starts
the real ``vf-mm serve`` command on a free 127.0.0.1 port and talks HTTP to it.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image
from starlette.testclient import TestClient

from vf_mm.errors import MultiModalDataError
from vf_mm.inference import (
    GenerateRequest,
    GenerateResult,
    LocalBackend,
    SamplingParams,
    Usage,
    VLLMBackend,
    create_app,
)
from vf_mm.renderers import load_renderer

MODEL = "tiny"


# -- fixtures --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def renderer(tiny_vlm_checkpoint):
    return load_renderer(tiny_vlm_checkpoint)


@pytest.fixture(scope="module")
def backend(tiny_vlm_checkpoint):
    b = LocalBackend(tiny_vlm_checkpoint, batch_window_ms=1)
    yield b
    asyncio.run(b.aclose())


@pytest.fixture(scope="module")
def client(backend, renderer):
    with TestClient(create_app(backend, renderer=renderer, model_name=MODEL)) as c:
        yield c


@pytest.fixture
def stand_in_codec(monkeypatch):
    """A stand-in for the real kwargs_data codec (pickle-free: JSON of lists in base64)."""
    import json

    from vf_mm.inference import _server

    def encode(item: dict[str, Any]) -> str:
        data = {
            k: {"dtype": str(np.asarray(v).dtype), "data": np.asarray(v).tolist()}
            for k, v in item.items()
        }
        return base64.b64encode(json.dumps(data).encode()).decode()

    def decode(b64: str) -> dict[str, np.ndarray]:
        try:
            data = json.loads(base64.b64decode(b64, validate=True))
        except Exception as exc:
            raise ValueError(f"not a stand-in item: {exc}") from None
        return {k: np.asarray(v["data"], dtype=v["dtype"]) for k, v in data.items()}

    monkeypatch.setattr(_server, "_decode_item", decode)
    return encode


def _image(seed: int = 0, size: tuple[int, int] = (56, 56)) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))


def _data_url(image: Image.Image) -> str:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _text_ids(renderer, text: str = "Count the circles.") -> list[int]:
    return renderer.render([{"role": "user", "content": text}]).token_ids


def _image_request(renderer, encode, *, seed: int = 0, size=(56, 56), **sampling) -> dict:
    """A features-mode request body built from the renderer's output for one image."""
    rendered = renderer.render(
        [
            {
                "role": "user",
                "content": [
                    {"type": "image", "image": _image(seed, size)},
                    {"type": "text", "text": "What is it?"},
                ],
            }
        ]
    )
    mm = rendered.multi_modal_data
    return {
        "token_ids": rendered.token_ids,
        "features": {
            "mm_hashes": {"image": list(mm.mm_hashes["image"])},
            "mm_placeholders": {
                "image": [
                    {"offset": p.offset, "length": p.length} for p in mm.mm_placeholders["image"]
                ]
            },
            "kwargs_data": {"image": [encode(item) for item in mm.mm_items["image"]]},
        },
        "sampling_params": {"max_tokens": 6, "temperature": 0.0, **sampling},
    }


def _real_encode(item: dict[str, Any]) -> str:
    from vf_mm.inference._mm_kwargs import encode_kwargs_item

    return encode_kwargs_item(item)


def _generate(client, body: dict) -> httpx.Response:
    return client.post("/inference/v1/generate", json=body)


def _error(response: httpx.Response, status: int = 400) -> str:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) >= {"message", "type", "code"}
    assert error["code"] == status
    return error["message"]


# -- /inference/v1/generate: tokens ----------------------------------------------------


def test_generate_tokens_in_tokens_and_logprobs_out(client, renderer):
    ids = _text_ids(renderer)
    body = {
        "token_ids": ids,
        "sampling_params": {"max_tokens": 8, "seed": 3, "logprobs": 0},
        "return_token_ids": True,
        "request_id": "abc",
        "model": MODEL,
    }
    r = _generate(client, body)
    assert r.status_code == 200, r.text
    out = r.json()
    choice = out["choices"][0]
    assert 1 <= len(choice["token_ids"]) <= 8
    assert choice["finish_reason"] in ("stop", "length")
    content = choice["logprobs"]["content"]
    assert [c["token_id"] for c in content] == choice["token_ids"]
    assert all(c["logprob"] <= 0 for c in content)
    assert all(c["top_logprobs"][0]["token_id"] == c["token_id"] for c in content)
    assert out["prompt_token_ids"] == ids
    assert out["usage"] == {
        "prompt_tokens": len(ids),
        "completion_tokens": len(choice["token_ids"]),
        "total_tokens": len(ids) + len(choice["token_ids"]),
    }
    assert out["request_id"] == "generate-tokens-abc"
    # no logprobs asked, none returned; no return_token_ids, no prompt ids
    r = _generate(client, {"token_ids": ids, "sampling_params": {"max_tokens": 2}})
    assert r.json()["choices"][0]["logprobs"] is None
    assert "prompt_token_ids" not in r.json()


def test_seed_repeats_and_seeds_differ(client, renderer):
    def sample(seed: int) -> list[int]:
        body = {
            "token_ids": _text_ids(renderer),
            "sampling_params": {"max_tokens": 12, "seed": seed},
        }
        r = _generate(client, body)
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["token_ids"]

    assert sample(7) == sample(7)
    assert sample(7) != sample(8)


def test_stop_token_ids_end_the_completion(client, renderer):
    body = {
        "token_ids": _text_ids(renderer),
        "sampling_params": {"max_tokens": 12, "temperature": 0},
    }
    free = _generate(client, body).json()["choices"][0]["token_ids"]
    assert len(free) >= 4
    stop = free[3]
    body["sampling_params"]["stop_token_ids"] = [stop]
    choice = _generate(client, body).json()["choices"][0]
    assert choice["token_ids"] == free[: free.index(stop) + 1]
    assert choice["finish_reason"] == "stop"
    assert choice["stop_reason"] == stop


def test_default_max_tokens_and_too_long_prompt(client, renderer):
    ids = _text_ids(renderer)
    message = _error(
        _generate(client, {"token_ids": ids, "sampling_params": {"max_tokens": 10**6}})
    )
    assert "8192" in message and str(len(ids)) in message and str(10**6) in message
    message = _error(_generate(client, {"token_ids": [1] * 8192, "sampling_params": {}}))
    assert "8192" in message


# -- /inference/v1/generate: images in features mode -----------------------------------


def _features_round_trip(client, renderer, encode):
    body = _image_request(renderer, encode, seed=11)
    r = _generate(client, body)
    assert r.status_code == 200, r.text
    first = r.json()["choices"][0]["token_ids"]
    # the same image by hash only: resolved from the server's cache, same greedy output
    hash_only = copy.deepcopy(body)
    hash_only["features"]["kwargs_data"] = None
    r = _generate(client, hash_only)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["token_ids"] == first
    per_item_none = copy.deepcopy(body)
    per_item_none["features"]["kwargs_data"] = {"image": [None]}
    assert _generate(client, per_item_none).json()["choices"][0]["token_ids"] == first
    # and the image matters: another image, other tokens (or at least a 200)
    other = _image_request(renderer, encode, seed=12, size=(84, 56))
    assert _generate(client, other).status_code == 200


def test_image_features_with_real_kwargs_data(client, renderer):
    _features_round_trip(client, renderer, _real_encode)


def test_image_features_with_stand_in_codec(client, renderer, stand_in_codec):
    _features_round_trip(client, renderer, stand_in_codec)


def test_an_item_sent_again_is_decoded_once(client, renderer, stand_in_codec, monkeypatch):
    """A client re-sends every image of a growing conversation each turn (VLLMBackend's
    default): the server decodes a kwargs_data string it has decoded before only once;
    other bytes under the same hash are decoded (and checked) again."""
    from vf_mm.inference import _server

    decoded: list[str] = []
    inner = _server._decode_item

    def counting(b64: str) -> dict[str, np.ndarray]:
        decoded.append(b64)
        return inner(b64)

    monkeypatch.setattr(_server, "_decode_item", counting)
    body = _image_request(renderer, stand_in_codec, seed=13)
    first = _generate(client, body).json()["choices"][0]["token_ids"]
    again = _generate(client, copy.deepcopy(body))
    assert again.status_code == 200, again.text
    assert again.json()["choices"][0]["token_ids"] == first
    assert len(decoded) == 1
    # the same item, other bytes (base64 of JSON with other spacing): decoded again
    sent = body["features"]["kwargs_data"]["image"][0]
    respaced = base64.b64encode(base64.b64decode(sent).replace(b", ", b",  ")).decode()
    other = copy.deepcopy(body)
    other["features"]["kwargs_data"]["image"][0] = respaced
    assert _generate(client, other).json()["choices"][0]["token_ids"] == first
    assert decoded == [sent, respaced]


def test_unknown_hash_is_400_naming_it(client, renderer, stand_in_codec):
    body = _image_request(renderer, stand_in_codec, seed=21)
    body["features"]["mm_hashes"]["image"] = ["never-seen-hash"]
    body["features"]["kwargs_data"] = None
    message = _error(_generate(client, body))
    assert "never-seen-hash" in message and "cache" in message


def test_a_null_entry_with_a_digest_takes_only_the_item_of_those_bytes(
    client, renderer, stand_in_codec
):
    """VLLMBackend sends an item it sent before as null with the digest of its string:
    the server resolves it only to the item decoded from those bytes, and answers a
    miss with the typed error the client resends on; every answer advertises the cache."""
    from vf_mm.inference._mm_kwargs import sent_digest
    from vf_mm.inference._vllm_items import ITEM_CACHE_HEADER, MISS_ERROR_TYPE

    body = _image_request(renderer, stand_in_codec, seed=22)
    r = _generate(client, body)
    assert r.status_code == 200, r.text
    assert r.headers[ITEM_CACHE_HEADER].startswith("instance=")
    first = r.json()["choices"][0]["token_ids"]
    sent = body["features"]["kwargs_data"]["image"][0]
    held = copy.deepcopy(body)
    held["features"]["kwargs_data"] = {"image": [None]}
    held["vf_mm_kwargs_digests"] = {"image": [sent_digest(sent)]}
    r = _generate(client, held)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["token_ids"] == first
    other = copy.deepcopy(held)
    other["vf_mm_kwargs_digests"] = {"image": ["0" * 32]}  # bytes this server never decoded
    r = _generate(client, other)
    assert "not in the server's multi-modal cache" in _error(r)
    assert r.json()["error"]["type"] == MISS_ERROR_TYPE
    unknown = copy.deepcopy(held)
    unknown["features"]["mm_hashes"]["image"] = ["never-seen-hash-2"]
    unknown["vf_mm_kwargs_digests"] = None
    assert _generate(client, unknown).json()["error"]["type"] == MISS_ERROR_TYPE
    wrong = copy.deepcopy(held)
    wrong["vf_mm_kwargs_digests"] = {"image": [None, None]}
    assert "vf_mm_kwargs_digests.image has 2 entries for 1" in _error(_generate(client, wrong))


def test_vllm_backend_sends_vf_mm_serve_each_image_once(backend, renderer):
    """Two turns of one conversation (its image, then its image and a new one): the
    second turn sends the first image as null, the answer is what sending both gives,
    and a restarted server (a new app) makes the client resend the turn in full once."""

    class Swappable(httpx.AsyncBaseTransport):
        def __init__(self, app: Any) -> None:
            self.transport = httpx.ASGITransport(app=app)

        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            return await self.transport.handle_async_request(request)

    first, second = _image(81, (56, 56)), _image(82, (56, 84))
    turn1 = [{"role": "user", "content": [{"type": "image", "image": first}, "What?"]}]
    turn1[0]["content"][1] = {"type": "text", "text": "What?"}
    turn2 = [
        *turn1,
        {"role": "assistant", "content": "A picture."},
        {"role": "user", "content": [{"type": "image", "image": second}]},
    ]
    sampling = SamplingParams(max_tokens=4, temperature=0)
    requests = [
        GenerateRequest(r.token_ids, sampling, r.multi_modal_data)
        for r in (renderer.render(turn1), renderer.render(turn2))
    ]
    url = "http://vf-mm.test"

    async def main() -> tuple[list[list[int]], dict[str, int], dict[str, int]]:
        transport = Swappable(create_app(backend, renderer=renderer, model_name=MODEL))
        client = VLLMBackend(url, model=MODEL, transport=transport)
        fresh = VLLMBackend(
            url,
            model=MODEL,
            transport=httpx.ASGITransport(
                app=create_app(backend, renderer=renderer, model_name=MODEL)
            ),
        )
        try:
            outputs = [(await client.generate(r)).completion_ids for r in requests]
            once = dict(client.item_stats[url])
            outputs.append((await fresh.generate(requests[1])).completion_ids)
            transport.transport = httpx.ASGITransport(
                app=create_app(backend, renderer=renderer, model_name=MODEL)
            )  # restarted: it holds nothing
            outputs.append((await client.generate(requests[1])).completion_ids)
            return outputs, once, dict(client.item_stats[url])
        finally:
            await client.aclose()
            await fresh.aclose()

    outputs, once, after = asyncio.run(main())
    assert once == {"sent": 2, "skipped": 1, "misses": 0, "held": 2}
    assert outputs[1] == outputs[2] == outputs[3]
    assert after == {"sent": 4, "skipped": 1, "misses": 1, "held": 2}


def test_image_checks_pads_and_grid(client, renderer, stand_in_codec):
    body = _image_request(renderer, stand_in_codec, seed=31)
    place = body["features"]["mm_placeholders"]["image"][0]

    shifted = copy.deepcopy(body)
    shifted["features"]["mm_placeholders"]["image"][0]["offset"] = place["offset"] - 1
    assert "image pad" in _error(_generate(client, shifted))

    # the placeholder of one image with the pixels of a bigger one
    bigger = _image_request(renderer, stand_in_codec, seed=32, size=(112, 112))
    mixed = copy.deepcopy(body)
    mixed["features"]["kwargs_data"] = bigger["features"]["kwargs_data"]
    message = _error(_generate(client, mixed))
    assert "image_grid_thw" in message and "merge_size" in message

    # image pads with no features at all
    assert "image pad" in _error(
        _generate(client, {"token_ids": body["token_ids"], "sampling_params": {}})
    )

    garbage = copy.deepcopy(body)
    garbage["features"]["kwargs_data"] = {"image": ["!!not base64!!"]}
    assert "kwargs_data.image[0]" in _error(_generate(client, garbage))


def test_malformed_real_kwargs_data_is_400(client, renderer):
    body = _image_request(renderer, _real_encode, seed=41)
    body["features"]["kwargs_data"] = {"image": [base64.b64encode(b"\x93\x01\x02\x03").decode()]}
    assert "kwargs_data.image[0]" in _error(_generate(client, body))


# -- /inference/v1/generate: vLLM's validation errors ----------------------------------


def _set(path: str, value: Any):
    def apply(body: dict) -> None:
        *head, last = path.split(".")
        node = body
        for key in head:
            node = node[key]
        if value is _DELETE:
            del node[last]
        else:
            node[last] = value

    return apply


_DELETE = object()
_ONE = {"offset": 1, "length": 1}

VALIDATION_CASES = [
    ("empty token_ids", _set("token_ids", []), "at least 1 item"),
    (
        "negative token id",
        _set("token_ids", [1, -2, 3]),
        "token_ids must not contain negative values",
    ),
    (
        "modalities differ",
        _set("features.mm_placeholders", {"video": [_ONE]}),
        "mm_hashes and mm_placeholders must use the same modalities",
    ),
    (
        "kwargs_data modalities differ",
        _set("features.kwargs_data", {"video": [None]}),
        "kwargs_data must use the same modalities as mm_hashes",
    ),
    (
        "hash and placeholder lengths differ",
        _set("features.mm_hashes", {"image": ["a", "b"]}),
        "image mm_hashes and mm_placeholders must have the same length",
    ),
    (
        "kwargs_data length differs",
        _set("features.kwargs_data", {"image": [None, None]}),
        "image kwargs_data and mm_hashes must have the same length",
    ),
    (
        "overlapping placeholders",
        lambda b: b["features"].update(
            mm_hashes={"image": ["a", "b"]},
            mm_placeholders={"image": [{"offset": 2, "length": 4}, {"offset": 4, "length": 2}]},
            kwargs_data=None,
        ),
        "mm_placeholders must be globally non-overlapping and sorted",
    ),
    (
        "unsorted placeholders",
        lambda b: b["features"].update(
            mm_hashes={"image": ["a", "b"]},
            mm_placeholders={"image": [{"offset": 6, "length": 2}, {"offset": 1, "length": 2}]},
            kwargs_data=None,
        ),
        "mm_placeholders must be globally non-overlapping and sorted",
    ),
    (
        "zero-length placeholder",
        _set("features.mm_placeholders", {"image": [{"offset": 1, "length": 0}]}),
        "greater than 0",
    ),
    (
        "negative offset",
        _set("features.mm_placeholders", {"image": [{"offset": -1, "length": 2}]}),
        "greater than or equal to 0",
    ),
    (
        "placeholder past the end",
        _set("features.mm_placeholders", {"image": [{"offset": 10_000, "length": 4}]}),
        "mm_placeholders must remain within the token_ids sequence",
    ),
    (
        "features and content_parts",
        _set("content_parts", [{"type": "image_url", "image_url": {"url": "data:,"}}]),
        "content_parts and features are mutually exclusive",
    ),
    (
        "metadata-only item",
        lambda b: b["features"].update(mm_metadata={"image": ["eA=="]}, kwargs_data=None),
        "metadata-only multimodal items require ec_transfer_params",
    ),
    (
        "cache_salt with a slash",
        _set("cache_salt", "a/b"),
        "Parameter 'cache_salt' must be at most 128",
    ),
    (
        "cache_salt too long",
        _set("cache_salt", "x" * 129),
        "Parameter 'cache_salt' must be at most 128",
    ),
    (
        "empty cache_salt",
        _set("cache_salt", ""),
        "Parameter 'cache_salt' must be a non-empty string",
    ),
    ("no sampling_params", _set("sampling_params", _DELETE), "Field required"),
    (
        "negative temperature",
        _set("sampling_params.temperature", -1),
        "temperature must be non-negative",
    ),
    ("top_p 0", _set("sampling_params.top_p", 0), "top_p must be in (0, 1]"),
    ("top_k -2", _set("sampling_params.top_k", -2), "top_k must be 0 (disable), or at least 1"),
    ("min_p 2", _set("sampling_params.min_p", 2), "min_p must be in [0, 1]"),
    ("max_tokens 0", _set("sampling_params.max_tokens", 0), "max_tokens must be at least 1"),
    ("n 0", _set("sampling_params.n", 0), "n must be at least 1"),
    ("logprobs -3", _set("sampling_params.logprobs", -3), "logprobs must be non-negative"),
    (
        "text output without detokenize",
        lambda b: (b.update(output_mode="text"), b["sampling_params"].update(detokenize=False)),
        "requires sampling_params.detokenize to be true",
    ),
    ("token_ids not ints", _set("token_ids", ["a"]), "valid integer"),
]


@pytest.mark.parametrize(
    ("mutate", "expected"), [c[1:] for c in VALIDATION_CASES], ids=[c[0] for c in VALIDATION_CASES]
)
def test_vllm_validation_errors(client, renderer, stand_in_codec, mutate, expected):
    body = _image_request(renderer, stand_in_codec, seed=51)
    mutate(body)
    r = _generate(client, body)
    message = _error(r)
    assert expected in message
    assert message.startswith("1 validation error")
    assert r.json()["error"]["type"] == "Bad Request"


UNSUPPORTED_CASES = [
    ("stream", _set("stream", True), "not supported by vf-mm serve"),
    ("n 2", _set("sampling_params.n", 2), "not supported by vf-mm serve"),
    ("stop strings", _set("sampling_params.stop", ["\n"]), "not supported by vf-mm serve"),
    ("presence penalty", _set("sampling_params.presence_penalty", 0.5), "presence_penalty"),
    ("priority", _set("priority", 1), "Priority scheduling is not enabled"),
    ("text output", _set("output_mode", "text"), "not supported by vf-mm serve"),
    ("unknown model", _set("model", "other"), "The model `other` does not exist."),
    ("token out of vocabulary", _set("token_ids", [1, 10**7]), "out of vocabulary"),
]


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [c[1:] for c in UNSUPPORTED_CASES],
    ids=[c[0] for c in UNSUPPORTED_CASES],
)
def test_refusals(client, renderer, mutate, expected):
    body = {"token_ids": _text_ids(renderer), "sampling_params": {"max_tokens": 2}}
    mutate(body)
    r = _generate(client, body)
    message = _error(r, 404 if "does not exist" in expected else 400)
    assert expected in message


def _collapsed(renderer, image: Image.Image):
    """The rendered prompt for one image, and the same ids with its pads cut to one."""
    rendered = renderer.render(
        [
            {
                "role": "user",
                "content": [{"type": "image", "image": image}, {"type": "text", "text": "What?"}],
            }
        ]
    )
    p = rendered.multi_modal_data.mm_placeholders["image"][0]
    ids = rendered.token_ids
    return rendered, ids[: p.offset + 1] + ids[p.offset + p.length :]


def test_content_parts_expand_like_the_renderer(client, renderer):
    image = _image(61, (84, 56))
    rendered, collapsed = _collapsed(renderer, image)
    place = rendered.multi_modal_data.mm_placeholders["image"][0]
    for part in (
        {"type": "image_url", "url": _data_url(image)},  # vLLM's flat form
        {"type": "image_url", "image_url": {"url": _data_url(image)}},  # OpenAI's nested form
    ):
        body = {
            "token_ids": collapsed,
            "content_parts": [part],
            "sampling_params": {"max_tokens": 5, "temperature": 0},
            "return_token_ids": True,
        }
        r = _generate(client, body)
        assert r.status_code == 200, r.text
        out = r.json()
        assert out["prompt_token_ids"] == rendered.token_ids
        assert out["mm_placeholders"] == {
            "image": [{"offset": place.offset, "length": place.length}]
        }
        assert out["usage"]["prompt_tokens"] == len(rendered.token_ids)
    # the processed image is cached by its hash: a features request may now omit kwargs_data
    features = {
        "mm_hashes": {"image": list(rendered.multi_modal_data.mm_hashes["image"])},
        "mm_placeholders": {"image": [{"offset": place.offset, "length": place.length}]},
        "kwargs_data": None,
    }
    body = {
        "token_ids": rendered.token_ids,
        "features": features,
        "sampling_params": {"max_tokens": 5, "temperature": 0},
    }
    r = _generate(client, body)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["token_ids"] == out["choices"][0]["token_ids"]


def test_content_parts_refusals(client, renderer):
    image = _image(62)
    _, collapsed = _collapsed(renderer, image)

    def refuse(parts, ids=collapsed) -> str:
        return _error(
            _generate(client, {"token_ids": ids, "content_parts": parts, "sampling_params": {}})
        )

    ssrf = {"type": "image_url", "url": "http://169.254.169.254/latest/x.png"}
    assert "content_parts[0]" in refuse([ssrf])
    assert "content_parts[0]" in refuse([{"type": "image_url", "url": "/etc/hostname"}])
    assert "image_url and video_url parts only" in refuse(
        [{"type": "input_audio", "input_audio": {}}]
    )
    assert "no image URL" in refuse([{"type": "image_url"}])
    two = [{"type": "image_url", "url": _data_url(image)}] * 2
    assert "one pad per image" in refuse(two)


def test_vllm_backend_speaks_to_vf_mm_serve(backend, renderer):
    """vf_mm's own vLLM client, both modes, against this server (in-process ASGI)."""
    app = create_app(backend, renderer=renderer, model_name=MODEL)
    image = _image(71, (56, 84))
    rendered, collapsed = _collapsed(renderer, image)
    sampling = SamplingParams(max_tokens=5, temperature=0)

    async def main() -> None:
        outputs = []
        for mode, send in (("features", True), ("features", False), ("content_parts", True)):
            client = VLLMBackend(
                "http://vf-mm.test",
                model=MODEL,
                mode=mode,
                send_kwargs_data=send,
                transport=httpx.ASGITransport(app=app),
            )
            try:
                if mode == "features":
                    request = GenerateRequest(
                        rendered.token_ids, sampling, rendered.multi_modal_data
                    )
                else:
                    part = {"type": "image_url", "image_url": {"url": _data_url(image)}}
                    request = GenerateRequest(collapsed, sampling, content_parts=[part])
                result = await client.generate(request)
            finally:
                await client.aclose()
            if mode == "content_parts":
                assert result.prompt_ids == rendered.token_ids
            outputs.append(result.completion_ids)
        assert outputs[0] == outputs[1] == outputs[2]

    asyncio.run(main())


def test_a_ban_vllm_backend_sends_reaches_the_local_engine(backend, renderer):
    """VLLMBackend sends a request's banned ids as logit_bias -100 (vLLM's field for token
    ids); vf-mm serve honours it on the local engine, where it used to refuse the field."""
    app = create_app(backend, renderer=renderer, model_name=MODEL)
    prompt = _text_ids(renderer)
    sampling = SamplingParams(max_tokens=4, temperature=0)

    async def main():
        client = VLLMBackend(
            "http://vf-mm.test", model=MODEL, transport=httpx.ASGITransport(app=app)
        )
        try:
            free = await client.generate(GenerateRequest(prompt, sampling))
            banned = tuple(sorted(set(free.completion_ids)))
            held = await client.generate(GenerateRequest(prompt, sampling, banned_token_ids=banned))
        finally:
            await client.aclose()
        return banned, held

    banned, held = asyncio.run(main())
    assert banned and not set(held.completion_ids) & set(banned)


def test_a_logit_bias_other_than_a_ban_is_refused_by_name(client, renderer):
    body = {"token_ids": _text_ids(renderer), "sampling_params": {"max_tokens": 2}}
    body["sampling_params"]["logit_bias"] = {"5": 2.5}
    message = _error(_generate(client, body))
    assert "logit_bias={'5': 2.5} is not supported by vf-mm serve (only bans" in message
    body["sampling_params"]["logit_bias"] = {str(10**7): -100}
    assert "out of vocabulary" in _error(_generate(client, body))


def test_every_route_bans_the_renderers_image_and_video_tokens(renderer):
    """A raw client that sends no ban still gets the family's: the server adds its
    renderer's banned ids to every request it hands the engine."""
    seen = []

    class Recording:
        name, max_model_len, vocab_size = "recording", 2048, None

        async def generate(self, request):
            seen.append(request.banned_token_ids)
            return GenerateResult([1], [-0.5], "length", Usage(1, 1))

        async def aclose(self):
            return None

    with TestClient(create_app(Recording(), renderer=renderer, model_name=MODEL)) as c:
        body = {"token_ids": _text_ids(renderer), "sampling_params": {"max_tokens": 1}}
        assert _generate(c, body).status_code == 200
        assert _chat(c, [{"role": "user", "content": "hi"}]).status_code == 200
    assert len(seen) == 2
    assert all(set(ids) == renderer.vision.banned_token_ids for ids in seen)


def test_malformed_bodies_are_400(client):
    for raw in (b"{not json", b"", b"\xff\xfe", b"[1, 2]", b'"text"'):
        r = client.post("/inference/v1/generate", content=raw)
        _error(r)
        r = client.post("/v1/chat/completions", content=raw)
        _error(r)


@pytest.mark.parametrize(
    "raw",
    [
        b'{"a": NaN, "b": -Infinity}',  # json takes these, msgspec does not
        b'{"a": 123456789012345678901234567890123}',
        b'{"a": "\\ud800"}',  # a lone surrogate escape
        b'{"a": 1, "a": 2}',
        '{"a": "\u00e9\u4e2d"}'.encode(),
        '{"a": 1}'.encode("utf-16"),
        b'{"token_ids": [1, 2], "x": [1.5e300, -0.0, 1e-7]}',
    ],
)
def test_bodies_read_as_json_reads_them(raw: bytes) -> None:
    """The server's body decoder gives what ``json.loads`` gives, or its error."""
    from vf_mm.inference._server_engine import loads_body

    def read(f):
        try:
            return repr(f(raw))  # repr: NaN equals itself
        except ValueError as exc:
            return f"{type(exc).__name__}: {exc}"

    assert read(loads_body) == read(json.loads)


def test_generate_answers_are_the_json_they_were(client, renderer):
    """The generate route's answer parses to what ``JSONResponse`` wrote: compact JSON of
    the same values (logprobs as floats), with its content type."""
    body = {"model": MODEL, "token_ids": _text_ids(renderer),
            "sampling_params": {"max_tokens": 4, "logprobs": 1}}  # fmt: skip
    r = _generate(client, body)
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    answer = r.json()
    assert json.loads(json.dumps(answer, separators=(",", ":"))) == answer
    assert b": " not in r.content and b", " not in r.content
    entries = answer["choices"][0]["logprobs"]["content"]
    assert entries and all(isinstance(e["logprob"], float) for e in entries)


class _BrokenBackend:
    name = "broken"
    max_model_len = 64

    async def generate(self, request):
        raise RuntimeError("the engine caught fire")

    async def aclose(self) -> None:
        pass


def test_backend_failure_is_500_with_its_message():
    with TestClient(create_app(_BrokenBackend(), model_name="b")) as c:
        r = c.post("/inference/v1/generate", json={"token_ids": [1, 2], "sampling_params": {}})
        assert "the engine caught fire" in _error(r, 500)
        assert r.json()["error"]["type"] == "InternalServerError"
        # no renderer: the chat route says so instead of failing
        r = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]})
        assert "renderer" in _error(r, 501)


def test_models_health_and_unknown_routes(client):
    models = client.get("/v1/models").json()
    assert models["data"][0]["id"] == MODEL
    assert models["data"][0]["max_model_len"] == 8192
    assert client.get("/health").status_code == 200
    _error(client.get("/nope"), 404)
    _error(client.get("/inference/v1/generate"), 405)


# -- /v1/chat/completions --------------------------------------------------------------


def _chat(client, messages, **extra) -> httpx.Response:
    return client.post(
        "/v1/chat/completions",
        json={"model": MODEL, "messages": messages, "max_tokens": 8, **extra},
    )


def test_chat_with_an_image_data_url(client, renderer):
    messages = [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": _data_url(_image(3))}},
                {"type": "text", "text": "What is it?"},
            ],
        },
    ]
    r = _chat(client, messages, seed=5, temperature=0.7, logprobs=True)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["object"] == "chat.completion"
    choice = out["choices"][0]
    assert choice["message"]["role"] == "assistant"
    assert isinstance(choice["message"]["content"], str)
    assert choice["finish_reason"] in ("stop", "length")
    # the prompt is what the renderer makes of the same messages (image pads included)
    same = [
        messages[0],
        {
            **messages[1],
            "content": [{"type": "image", "image": _image(3)}, messages[1]["content"][1]],
        },
    ]
    assert out["usage"]["prompt_tokens"] == len(renderer.render(same).token_ids)
    assert 1 <= out["usage"]["completion_tokens"] <= 8
    assert len(choice["logprobs"]["content"]) == out["usage"]["completion_tokens"]
    # seeds repeat through the chat route too
    again = _chat(client, messages, seed=5, temperature=0.7).json()
    assert again["choices"][0]["message"]["content"] == choice["message"]["content"]


def test_chat_never_fetches_urls(client, monkeypatch):
    fetched: list[Any] = []

    def connect(self, address):
        fetched.append(address)
        raise AssertionError("the server tried to fetch a client URL")

    # no name is resolved and no connection opened, whatever the URL
    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect)
    monkeypatch.setattr(socket, "getaddrinfo", lambda *a, **k: fetched.append(a) or [])
    for url in (
        "http://169.254.169.254/x.png",
        "https://example.com/cat.png",
        "file:///etc/passwd",
        "/etc/hostname",
    ):
        part = {"type": "image_url", "image_url": {"url": url}}
        message = _error(_chat(client, [{"role": "user", "content": [part]}]))
        assert "message 0, part 0" in message
    assert fetched == []


def test_chat_bad_input_is_400_never_500(client):
    ok = [{"role": "user", "content": "hi"}]
    cases = [
        {"messages": []},
        {"messages": [{"role": "wizard", "content": "x"}]},
        {"messages": [{"role": "user"}]},
        {"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]},
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
                    ],
                }
            ]
        },
        {"messages": [{"role": "tool", "content": "x"}]},
        {"messages": ok, "n": 2},
        {"messages": ok, "max_tokens": 0},
        {"messages": ok, "temperature": -1},
        {"messages": ok, "stop": ["\n"]},
        {"messages": ok, "tools": [{"type": "function"}]},
        {"messages": ok, "max_tokens": 10**6},
        {"messages": "hello"},
    ]
    for body in cases:
        r = client.post("/v1/chat/completions", json={"model": MODEL, **body})
        assert r.status_code == 400, (body, r.text)
        assert r.json()["error"]["message"]
    r = client.post("/v1/chat/completions", json={"model": "gpt-x", "messages": ok})
    assert "does not exist" in _error(r, 404)


class _ScriptedBackend:
    """Answers every prompt with fixed completion token ids."""

    name = "scripted"
    max_model_len = 8192

    def __init__(self, completion_ids: list[int]) -> None:
        self.completion_ids = completion_ids

    async def generate(self, request):
        return GenerateResult(
            completion_ids=list(self.completion_ids),
            logprobs=[-0.5] * len(self.completion_ids),
            finish_reason="stop",
            usage=Usage(len(request.prompt_ids), len(self.completion_ids)),
        )

    async def aclose(self) -> None:
        pass


def test_chat_tool_calls_and_reasoning(renderer):
    tok = renderer.tokenizer
    text = (
        "<think>\nlook first\n</think>\n\n"
        '<tool_call>\n{"name": "zoom", "arguments": {"x": 3}}\n</tool_call><|im_end|>'
    )
    ids = tok(text, add_special_tokens=False)["input_ids"]
    tools = [{"type": "function", "function": {"name": "zoom", "parameters": {"type": "object"}}}]
    with TestClient(create_app(_ScriptedBackend(ids), renderer=renderer, model_name=MODEL)) as c:
        r = c.post(
            "/v1/chat/completions",
            json={
                "model": MODEL,
                "messages": [{"role": "user", "content": "zoom in"}],
                "tools": tools,
            },
        )
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        assert choice["finish_reason"] == "tool_calls"
        call = choice["message"]["tool_calls"][0]
        assert call["function"]["name"] == "zoom"
        assert call["function"]["arguments"] == '{"x": 3}'
        assert choice["message"]["reasoning_content"] == "look first"
        assert choice["message"]["content"] is None
        # a later turn carrying that call and its result renders fine
        follow = [
            {"role": "user", "content": "zoom in"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "content": "zoomed"},
        ]
        r = c.post(
            "/v1/chat/completions", json={"model": MODEL, "messages": follow, "tools": tools}
        )
        assert r.status_code == 200, r.text


# -- the real CLI ----------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _vf_mm_command() -> list[str]:
    script = Path(sys.executable).parent / "vf-mm"
    if script.exists():
        return [str(script)]
    found = shutil.which("vf-mm")
    if found:
        return [found]
    return [sys.executable, "-c", "import sys; from vf_mm.cli import main; sys.exit(main())"]


@pytest.fixture(scope="module", autouse=True)
def serve_cli(tiny_vlm_checkpoint, tmp_path_factory):
    """The real ``vf-mm serve`` in a subprocess, started when this module starts so that
    its start-up (imports, model load) overlaps the in-process tests."""
    port = _free_port()
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    cmd = [
        *_vf_mm_command(),
        "serve",
        "--model",
        str(tiny_vlm_checkpoint),
        "--port",
        str(port),
        "--served-model-name",
        MODEL,
        "--batch-window-ms",
        "20",
        "--log-level",
        "warning",
    ]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield proc, f"http://127.0.0.1:{port}", log
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert proc.returncode in (0, -15), log.read_text()


def test_vf_mm_serve_cli(serve_cli, renderer):
    from vf_mm.errors import BackendHTTPError
    from vf_mm.inference import OpenAIChatBackend

    proc, base, log = serve_cli
    deadline = time.monotonic() + 90
    while True:
        if proc.poll() is not None:
            pytest.fail(f"vf-mm serve exited with {proc.returncode}: {log.read_text()}")
        try:
            if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            pytest.fail(f"vf-mm serve did not come up in 90 s: {log.read_text()}")
        time.sleep(0.1)
    ids = _text_ids(renderer)

    async def talk() -> None:
        async with httpx.AsyncClient(base_url=base, timeout=60) as http:
            # concurrent requests (the engine batches them)
            bodies = [
                {
                    "token_ids": ids,
                    "sampling_params": {"max_tokens": 5, "seed": s, "logprobs": 0},
                }
                for s in range(4)
            ]
            answers = await asyncio.gather(
                *(http.post("/inference/v1/generate", json=b) for b in bodies)
            )
            for a in answers:
                assert a.status_code == 200, a.text
                assert len(a.json()["choices"][0]["logprobs"]["content"]) >= 1
            bad = await http.post("/inference/v1/generate", json={"token_ids": []})
            assert bad.status_code == 400
            chat = await http.post(
                "/v1/chat/completions",
                json={
                    "model": MODEL,
                    "max_tokens": 4,
                    "messages": [
                        {
                            "role": "user",
                            "content": [
                                {
                                    "type": "image_url",
                                    "image_url": {"url": _data_url(_image(9))},
                                },
                                {"type": "text", "text": "hi"},
                            ],
                        }
                    ],
                },
            )
            assert chat.status_code == 200, chat.text
            assert chat.json()["choices"][0]["message"]["role"] == "assistant"
            models = (await http.get("/v1/models")).json()
            assert models["data"][0]["id"] == MODEL
            metrics = await http.get("/metrics")
            assert metrics.status_code == 200
            queries = next(
                line for line in metrics.text.splitlines()
                if line.startswith("vllm:prefix_cache_queries_total{")
            )  # fmt: skip
            assert queries.startswith(
                f'vllm:prefix_cache_queries_total{{engine="0",model_name="{MODEL}"}}'
            )
            assert float(queries.rsplit(" ", 1)[1]) >= 4 * len(ids)  # the four prompts at least

        api = OpenAIChatBackend(MODEL, base_url=f"{base}/v1", api_key="x", max_retries=0)
        try:
            result = await api.chat(
                [
                    {
                        "role": "user",
                        "content": [
                            {"type": "image", "image": _image(4)},
                            {"type": "text", "text": "Describe."},
                        ],
                    }
                ],
                SamplingParams(max_tokens=4, seed=1),
            )
            assert result.message["role"] == "assistant"
            assert result.usage.prompt_tokens > 16 and 1 <= result.usage.completion_tokens <= 4
            with pytest.raises(BackendHTTPError) as info:
                await api.chat(
                    [{"role": "user", "content": "x"}],
                    SamplingParams(max_tokens=4, stop_token_ids=(10**7,)),
                )
            assert info.value.status == 400
            assert "out of vocabulary" in info.value.detail
        finally:
            await api.aclose()

    asyncio.run(talk())


@pytest.mark.parametrize("family", ["lfm2_vl", "kimi_k25"])
def test_a_family_the_server_does_not_check_is_refused_at_start(family):
    """A family whose processed images are not checked (LFM2-VL, Kimi-K2.5) is refused
    when the app is made, naming the family, why, and what to use instead, not on its
    first image; every other vision family is served
    (tests/inference/test_server_families.py)."""
    from types import SimpleNamespace

    from vf_mm.errors import UnsupportedModelError

    with pytest.raises(
        UnsupportedModelError, match=rf"not serve '{family}'.*not checked.*LocalBackend"
    ):
        create_app(SimpleNamespace(family=family), model_name="m")
    # a backend that does not say its family (a scripted one): the renderer's is checked
    renderer = SimpleNamespace(vision=object(), name=family)
    with pytest.raises(UnsupportedModelError, match=f"not serve '{family}'"):
        create_app(SimpleNamespace(), renderer=renderer, model_name="m")


def _lossless_url(frames: np.ndarray, rate: int = 4) -> str:
    """``frames`` as a lossless video file (FFV1 in Matroska) in a ``data:`` URL."""
    from vf_mm.videos import Video, encode_lossless

    data = encode_lossless(Video(frames, fps=rate))
    return "data:video/x-matroska;base64," + base64.b64encode(data).decode()


def test_a_clip_serves_as_features_from_the_cache_and_as_content_parts(backend, renderer):
    """Video through vf-mm serve: features with kwargs_data, then hash-only (the server's
    cache), then the raw clip as a content part expanded by the server: one prompt, the
    same greedy tokens."""
    frames = np.random.default_rng(3).integers(0, 256, (6, 42, 56, 3), dtype=np.uint8)
    url = _lossless_url(frames)
    messages = [{"role": "user", "content": [{"type": "video_url", "video_url": {"url": url}},
                                             {"type": "text", "text": "What moved?"}]}]  # fmt: skip
    rendered = renderer.render(messages)
    pad = renderer.vision.video_token_id
    (span,) = rendered.multi_modal_data.mm_placeholders["video"]
    collapsed = [*rendered.token_ids[: span.offset], pad, *rendered.token_ids[span.end :]]
    app = create_app(backend, renderer=renderer, model_name=MODEL)
    sampling = SamplingParams(max_tokens=5, temperature=0)

    async def main() -> list[list[int]]:
        outputs = []
        for send in (True, False):  # with kwargs_data, then hash-only from the cache
            client = VLLMBackend("http://vf-mm.test", model=MODEL, send_kwargs_data=send,
                                 transport=httpx.ASGITransport(app=app))  # fmt: skip
            try:
                result = await client.generate(
                    GenerateRequest(rendered.token_ids, sampling, rendered.multi_modal_data)
                )
            finally:
                await client.aclose()
            outputs.append(result.completion_ids)
        return outputs

    features = asyncio.run(main())

    async def as_content_parts(part) -> Any:
        client = VLLMBackend("http://vf-mm.test", model=MODEL, mode="content_parts",
                             transport=httpx.ASGITransport(app=app),
                             embed_token_ids={"video": renderer.vision.embed_ids("video")})  # fmt: skip
        try:
            return await client.generate(GenerateRequest(collapsed, sampling, content_parts=[part]))
        finally:
            await client.aclose()

    # the client sends the clip's own file, or raw frames losslessly encoded
    for part in ({"type": "video_url", "video_url": {"url": url}},
                 {"type": "video", "video": frames, "frame_rate": 4.0}):  # fmt: skip
        sent = asyncio.run(as_content_parts(part))
        assert sent.prompt_ids == rendered.token_ids
        assert sent.multi_modal_data.mm_hashes == rendered.multi_modal_data.mm_hashes
        assert sent.completion_ids == features[0]
    with pytest.raises(MultiModalDataError, match="num_frames"):
        asyncio.run(as_content_parts({"type": "video", "video": frames, "num_frames": 2}))
    with TestClient(app) as c:
        body = {"token_ids": collapsed, "return_token_ids": True,
                "sampling_params": {"max_tokens": 5, "temperature": 0.0},
                "content_parts": [{"type": "video_url", "url": url}]}  # fmt: skip
        r = _generate(c, body)
        assert r.status_code == 200, r.text
        out = r.json()
        assert out["prompt_token_ids"] == rendered.token_ids
        # a clip's placeholders need a video pad per position, as an image's
        bad = {"token_ids": rendered.token_ids, "sampling_params": {},
               "features": {"mm_hashes": {"video": ["x"]},
                            "mm_placeholders": {"video": [{"offset": 0, "length": 3}]}}}  # fmt: skip
        assert "video pad tokens" in _error(_generate(c, bad))
    assert features[0] == features[1] == out["choices"][0]["token_ids"]


def test_the_chat_route_takes_a_clip_and_reads_it_through_the_servers_policy(client):
    frames = np.random.default_rng(4).integers(0, 256, (4, 28, 28, 3), dtype=np.uint8)
    content = [{"type": "video_url", "video_url": {"url": _lossless_url(frames)}},
               {"type": "text", "text": "What moved?"}]  # fmt: skip
    body = {"model": MODEL, "max_tokens": 3, "messages": [{"role": "user", "content": content}]}
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] > 20
    # a local path is not the server's to read, whatever the renderer's own policy says
    content[0] = {"type": "video_url", "video_url": {"url": "/etc/hostname"}}
    assert "message 0, part 0" in _error(client.post("/v1/chat/completions", json=body))
    # a misspelt per-clip option is refused, not ignored
    content[0] = {"type": "video_url", "video_url": {"url": _lossless_url(frames)},
                  "num_frame": 2}  # fmt: skip
    assert "num_frame" in _error(client.post("/v1/chat/completions", json=body))


def test_bad_video_features_and_content_parts_options_are_refused(client, renderer):
    frames = np.random.default_rng(6).integers(0, 256, (4, 28, 28, 3), dtype=np.uint8)
    url = _lossless_url(frames)
    rendered = renderer.render([{"role": "user", "content": [
        {"type": "video_url", "video_url": {"url": url}}, {"type": "text", "text": "?"}]}])  # fmt: skip
    (span,) = rendered.multi_modal_data.mm_placeholders["video"]
    item = dict(rendered.multi_modal_data.mm_items["video"][0])
    from vf_mm.inference._internal import encode_kwargs_item

    for bad in (np.array([np.nan], np.float32), np.array([-1.0], np.float32),
                np.array([2], np.int64)):  # fmt: skip
        body = {"token_ids": rendered.token_ids, "sampling_params": {},
                "features": {"mm_hashes": {"video": ["h"]},
                             "mm_placeholders": {"video": [{"offset": span.offset,
                                                            "length": span.length}]},
                             "kwargs_data": {"video": [encode_kwargs_item(
                                 {**item, "second_per_grid_ts": bad}, modality="video")]}}}  # fmt: skip
        assert "second_per_grid_ts" in _error(_generate(client, body))
    collapsed = [*rendered.token_ids[: span.offset], renderer.vision.video_token_id,
                 *rendered.token_ids[span.end :]]  # fmt: skip
    body = {"token_ids": collapsed, "sampling_params": {},
            "content_parts": [{"type": "video_url", "url": url, "num_frames": 2}]}  # fmt: skip
    assert "'num_frames'" in _error(_generate(client, body))


def test_content_parts_send_the_rate_a_part_gives_a_file_that_states_none(backend, renderer):
    from vf_mm.videos import Video, encode_lossless

    frames = np.random.default_rng(8).integers(0, 256, (6, 42, 56, 3), dtype=np.uint8)
    rateless = encode_lossless(Video(frames))  # a file that states no frame rate
    part = {"type": "video", "video": rateless, "frame_rate": 4.0}
    rendered = renderer.render([{"role": "user", "content": [part]}])
    (span,) = rendered.multi_modal_data.mm_placeholders["video"]
    collapsed = [*rendered.token_ids[: span.offset], renderer.vision.video_token_id,
                 *rendered.token_ids[span.end :]]  # fmt: skip
    app = create_app(backend, renderer=renderer, model_name=MODEL)

    async def send(part) -> Any:
        client = VLLMBackend("http://vf-mm.test", model=MODEL, mode="content_parts",
                             transport=httpx.ASGITransport(app=app),
                             embed_token_ids={"video": renderer.vision.embed_ids("video")})  # fmt: skip
        try:
            request = GenerateRequest(collapsed, SamplingParams(max_tokens=1), content_parts=[part])
            return await client.generate(request)
        finally:
            await client.aclose()

    sent = asyncio.run(send(part))
    assert sent.prompt_ids == rendered.token_ids
    assert sent.multi_modal_data.mm_hashes == rendered.multi_modal_data.mm_hashes

    async def hash_only() -> Any:  # found in the server's cache only if it read 4 fps too
        client = VLLMBackend("http://vf-mm.test", model=MODEL, send_kwargs_data=False,
                             transport=httpx.ASGITransport(app=app))  # fmt: skip
        try:
            request = GenerateRequest(rendered.token_ids, SamplingParams(max_tokens=1),
                                      rendered.multi_modal_data)  # fmt: skip
            return await client.generate(request)
        finally:
            await client.aclose()

    assert asyncio.run(hash_only()).completion_ids
    with pytest.raises(MultiModalDataError, match="no container states exactly"):
        asyncio.run(send({**part, "frame_rate": 3.14159}))


def test_content_parts_results_say_which_positions_are_embeddings(tmp_path):
    """A Qwen3-VL clip's range holds timestamps between its frame groups: with the
    renderer's embedding ids the returned placeholders carry is_embed, equal to the
    renderer's, so the result can be bridged onto and trained on."""
    from vf_mm.testing import build_tiny_vlm

    path = build_tiny_vlm(tmp_path / "q3", "qwen3_vl")
    renderer = load_renderer(path)
    backend = LocalBackend(path, batch_window_ms=1)
    frames = np.random.default_rng(9).integers(0, 256, (8, 42, 56, 3), dtype=np.uint8)
    part = {"type": "video", "video": frames, "frame_rate": 4.0}
    rendered = renderer.render([{"role": "user", "content": [part]}])
    (mine,) = rendered.multi_modal_data.mm_placeholders["video"]
    assert mine.is_embed is not None
    ids = rendered.token_ids
    text = renderer.tokenizer.apply_chat_template(  # the template's prompt: one pad per clip
        [{"role": "user", "content": [{"type": "video"}]}], tokenize=False,
        add_generation_prompt=True,
    )  # fmt: skip
    collapsed = renderer.tokenizer(text, add_special_tokens=False)["input_ids"]
    app = create_app(backend, renderer=renderer, model_name=MODEL)

    async def send(embed_ids) -> Any:
        client = VLLMBackend("http://vf-mm.test", model=MODEL, mode="content_parts",
                             transport=httpx.ASGITransport(app=app), embed_token_ids=embed_ids)  # fmt: skip
        try:
            request = GenerateRequest(collapsed, SamplingParams(max_tokens=1), content_parts=[part])
            return await client.generate(request)
        finally:
            await client.aclose()

    try:
        result = asyncio.run(send({"video": renderer.vision.embed_ids("video")}))
        assert result.prompt_ids == ids
        assert result.multi_modal_data.mm_placeholders["video"] == [mine]
        with pytest.raises(MultiModalDataError, match="no embed_token_ids for 'video'"):
            asyncio.run(send(None))  # without them: refused before sending
    finally:
        asyncio.run(backend.aclose())


def test_chat_stream_is_the_same_reply_as_server_sent_events(client):
    """stream=true: the reply generated whole, then sent in OpenAI's chunk format (role,
    content, finish reason, usage when asked, [DONE]); it holds what stream=false gives."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "seed": 3,
            "max_tokens": 6}  # fmt: skip
    whole = client.post("/v1/chat/completions", json=body).json()
    r = client.post("/v1/chat/completions",
                    json={**body, "stream": True, "stream_options": {"include_usage": True}})  # fmt: skip
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = [line.removeprefix("data: ") for line in r.text.split("\n\n") if line]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(
        c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks
    )
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert deltas[0]["role"] == "assistant"
    assert (
        "".join(d.get("content") or "" for d in deltas) == whole["choices"][0]["message"]["content"]
    )
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert finishes[-1] == whole["choices"][0]["finish_reason"] and set(finishes[:-1]) == {None}
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == whole["usage"]


# -- keys and limits on the real app ----------------------------------------------------


def test_the_app_with_keys_refuses_without_one_and_serves_with_one(backend, renderer):
    app = create_app(backend, renderer=renderer, model_name=MODEL, api_keys=["s3cret"])
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    with TestClient(app) as c:
        assert c.get("/health").status_code == 200
        for path, method in (("/v1/models", "get"), ("/metrics", "get")):
            assert getattr(c, method)(path).status_code == 401
        assert c.post("/v1/chat/completions", json=body).status_code == 401
        ok = c.post("/v1/chat/completions", json=body, headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["role"] == "assistant"


def test_images_and_prompt_tokens_per_request_are_limited(backend, renderer):
    from vf_mm.inference import ServerLimits

    limits = ServerLimits(max_images=2, max_request_tokens=40)
    app = create_app(backend, renderer=renderer, model_name=MODEL, limits=limits)
    url = _data_url(Image.fromarray(np.zeros((28, 28, 3), np.uint8)))
    part = {"type": "image_url", "image_url": {"url": url}}
    with TestClient(app) as c:
        many = {"model": MODEL, "messages": [{"role": "user", "content": [part, part, part]}]}
        r = c.post("/v1/chat/completions", json=many)
        assert r.status_code == 400 and r.json()["error"]["type"] == "RequestTooLargeError"
        assert "at most 2" in r.json()["error"]["message"]
        long = {"model": MODEL, "messages": [{"role": "user", "content": "word " * 200}]}
        r = c.post("/v1/chat/completions", json=long)
        assert r.status_code == 400 and "at most 40" in r.json()["error"]["message"]
        r = c.post("/inference/v1/generate", json={"model": MODEL, "token_ids": [1] * 41,
                                                   "sampling_params": {"max_tokens": 1}})  # fmt: skip
        assert r.status_code == 400 and "at most 40" in r.json()["error"]["message"]
        short = {"model": MODEL, "messages": [{"role": "user", "content": [part, {"type": "text", "text": "hi"}]}],
                 "max_tokens": 2}  # fmt: skip
        assert c.post("/v1/chat/completions", json=short).status_code == 200


def test_an_assistant_turn_echoed_with_null_content_renders_as_empty(client, renderer):
    history = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None},
               {"role": "user", "content": "again"}]  # fmt: skip
    r = client.post("/v1/chat/completions", json={"model": MODEL, "messages": history,
                                                  "max_tokens": 2, "seed": 1})  # fmt: skip
    assert r.status_code == 200
    assert r.json()["usage"]["prompt_tokens"] == len(renderer.render(
        [history[0], {"role": "assistant", "content": ""}, history[2]]).token_ids)  # fmt: skip
