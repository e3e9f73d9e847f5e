"""Kimi-K2.5's images on vLLM's generate route, without a server: vLLM 0.32's Kimi-K2.5
model takes images as its one modality ``"vision_chunk"`` with the grid named
``grid_thws``. Sent as ``"image"`` / ``image_grid_thw`` they reach the model without the
grid and fail vLLM's engine, not the request (the vllm tier checks the real server:
``tests/vllm/test_families_vllm.py -k kimi_k25``)."""

from __future__ import annotations

import asyncio
import base64
import json

import msgpack
import numpy as np
import pytest

from vf_mm.errors import BackendUnavailableError, MultiModalDataError
from vf_mm.inference import GenerateRequest, SamplingParams, VLLMBackend, encode_features
from vf_mm.inference._internal import decode_kwargs_item
from vf_mm.inference._vllm_protocol import RequestBody, ResponseSchemaError, decode_response
from vf_mm.models import family_info
from vf_mm.types import MultiModalData, PlaceholderRange


def kimi_item(height: int, width: int) -> dict[str, np.ndarray]:
    """One image's inputs as transformers' ``Kimi_K25ImageProcessor`` makes them: MoonViT's
    patches ``(h * w, 3, 14, 14)`` and the grid ``(1, 3)``."""
    rng = np.random.default_rng(height * 100 + width)
    pixels = rng.standard_normal((height * width, 3, 14, 14), dtype=np.float32)
    return {"pixel_values": pixels, "image_grid_thw": np.array([[1, height, width]])}


def test_kimi_k25s_images_go_as_vllms_vision_chunks_with_its_grid_name():
    items = [kimi_item(2, 4), kimi_item(4, 2)]
    mmd = MultiModalData(
        {"image": ["h0", "h1"]},
        {"image": [PlaceholderRange(1, 2), PlaceholderRange(5, 2)]},
        {"image": items},
    )
    features = encode_features(mmd, num_tokens=8)
    assert set(features["mm_hashes"]) == set(features["mm_placeholders"]) == {"vision_chunk"}
    assert set(features["kwargs_data"]) == {"vision_chunk"}
    assert features["mm_hashes"]["vision_chunk"] == ["h0", "h1"]
    assert features["mm_placeholders"]["vision_chunk"] == [
        {"offset": 1, "length": 2},
        {"offset": 5, "length": 2},
    ]
    for sent, item in zip(features["kwargs_data"]["vision_chunk"], items, strict=True):
        decoded = decode_kwargs_item(sent)
        assert set(decoded) == {"pixel_values", "grid_thws"}
        assert np.array_equal(decoded["pixel_values"], item["pixel_values"])
        assert np.array_equal(decoded["grid_thws"], item["image_grid_thw"])
        # vLLM's field configs (kimi_k25.py _get_mm_fields_config): the patches flat over
        # the item's own grid, the grid one batched row kept on the CPU
        raw = msgpack.unpackb(base64.b64decode(sent), raw=False,
                              ext_hook=lambda code, data: code)  # fmt: skip
        n = len(item["pixel_values"])
        assert raw["pixel_values"]["field"] == [
            "flat", {"keep_on_cpu": False, "slices": [[[0, n, None]]], "dim": 0}
        ]  # fmt: skip
        assert raw["grid_thws"]["field"] == ["batched", {"keep_on_cpu": True}]
        assert raw["grid_thws"]["data"][:2] == ["int64", [3]]


def test_kimi_k25s_clips_are_refused_as_features_by_name():
    """vLLM 0.32 takes Kimi-K2.5's clips as one vision_chunk item per chunk, with
    ``<|media_pad|>`` positions, not as transformers' processor writes a clip: they are
    refused by name (the family's ``vllm_video_refusal``) rather than sent under
    ``"video"``, which its model does not take."""
    clip = {"pixel_values_videos": kimi_item(4, 4)["pixel_values"],
            "video_grid_thw": np.array([[1, 4, 4]])}  # fmt: skip
    mmd = MultiModalData({"video": ["v0"]}, {"video": [PlaceholderRange(1, 4)]},
                         {"video": [clip]})  # fmt: skip
    refused = r"Kimi-K2.5 clip cannot go to vLLM as features.*<\|media_pad\|>.*LocalBackend"
    with pytest.raises(MultiModalDataError, match=refused):
        encode_features(mmd, num_tokens=8)


def test_kimi_k25s_clips_are_refused_as_content_parts_before_sending():
    """vLLM 0.32 answers a raw Kimi-K2.5 clip with 400 (its token-in route hands the clip to
    ``KimiK25Processor`` unsplit): with the family's refusal the backend refuses the clip
    before anything is sent (no server listens here), naming the family and the fix, while
    an image part still goes to the server."""
    refusal = family_info("kimi_k25").vllm_video_refusal
    backend = VLLMBackend("http://127.0.0.1:9", mode="content_parts", max_retries=0,
                          max_model_len=64, embed_token_ids={"video": [5], "image": [4]},
                          refusals={"video": refusal})  # fmt: skip
    frames = np.zeros((1, 28, 28, 3), np.uint8)
    clip = GenerateRequest([1, 5, 2], SamplingParams(max_tokens=1),
                           content_parts=[{"type": "video", "video": frames, "frame_rate": 2.0}])  # fmt: skip
    with pytest.raises(MultiModalDataError, match=r"content_parts\[0\] is refused: vLLM 0.32 "
                                                  r"cannot take Kimi-K2.5's clips.*400.*"
                                                  r"LocalBackend or `vf-mm serve`"):  # fmt: skip
        asyncio.run(backend.generate(clip))
    image = GenerateRequest([1, 4, 2], SamplingParams(max_tokens=1),
                            content_parts=[{"type": "image", "image": frames[0]}])  # fmt: skip
    with pytest.raises(BackendUnavailableError):
        asyncio.run(backend.generate(image))


def test_a_qwen_grid_item_still_goes_as_an_image():
    """The other grid layout (Qwen-VL's flattened patches, 2-D) keeps vLLM's ``image``."""
    item = {
        "pixel_values": np.zeros((4, 1176), np.float32),
        "image_grid_thw": np.array([[1, 2, 2]]),
    }
    mmd = MultiModalData({"image": ["h"]}, {"image": [PlaceholderRange(1, 1)]}, {"image": [item]})
    features = encode_features(mmd, num_tokens=3)
    assert set(features["kwargs_data"]) == {"image"}
    assert set(decode_kwargs_item(features["kwargs_data"]["image"][0])) == set(item)


def answer(placeholders: dict[str, list[dict[str, int]]]) -> bytes:
    return json.dumps({
        "choices": [{"index": 0, "token_ids": [7], "finish_reason": "length"}],
        "prompt_token_ids": [1, 5, 5, 5, 2],
        "mm_placeholders": placeholders,
    }).encode()  # fmt: skip


def test_content_parts_placeholders_under_vision_chunk_are_the_images_sent():
    """A Kimi-K2.5 server answers an expanded prompt's placeholders under its modality
    ``vision_chunk``: they are the images the request sent."""
    request = GenerateRequest([1, 5, 2], SamplingParams(max_tokens=1, logprobs=False))
    sent = RequestBody(b"", media_hashes={"image": ["h0"]})
    result = decode_response(answer({"vision_chunk": [{"offset": 1, "length": 3}]}), request, sent)
    assert result.prompt_ids == [1, 5, 5, 5, 2]
    assert result.multi_modal_data is not None
    assert result.multi_modal_data.mm_placeholders == {"image": [PlaceholderRange(1, 3)]}
    assert result.multi_modal_data.mm_hashes == {"image": ["h0"]}


def test_vision_chunk_placeholders_for_images_and_clips_together_are_refused():
    """Which of one modality's ranges is an image and which a clip is not said: refused,
    naming the fix, never guessed."""
    request = GenerateRequest([1, 5, 2], SamplingParams(max_tokens=1, logprobs=False))
    sent = RequestBody(b"", media_hashes={"image": ["h0"], "video": ["v0"]})
    body = answer({"vision_chunk": [{"offset": 1, "length": 1}, {"offset": 3, "length": 1}]})
    with pytest.raises(ResponseSchemaError, match=r"vision_chunk.*separate requests"):
        decode_response(body, request, sent)
