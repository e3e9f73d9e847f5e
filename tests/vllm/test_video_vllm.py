"""Video against a real vLLM 0.32 server (Qwen2.5-VL, Qwen3-VL and LLaVA-OneVision, one tiny
checkpoint and one server each, ``--limit-mm-per-prompt '{"image":4,"video":2}'``).

- The render route (``/v1/chat/completions/render``) on a raw clip (a lossless MP4 data URL,
  so vLLM's OpenCV decoding and vf_mm's PyAV decoding see the same pixels): vLLM's token
  ids equal the renderer's, and every tensor of its ``kwargs_data`` (decoded by our
  decoder) equals the renderer's model inputs bit for bit. Qwen3-VL at the clip's 4 fps
  (vLLM samples it to 2 fps as transformers does), LLaVA-OneVision at 4 fps (every frame
  kept, as transformers keeps them); Qwen2.5-VL at 2 fps, because vLLM's
  own loader samples a Qwen2.5-VL clip to 2 fps where transformers keeps every frame
  (measured here too: a 4 fps clip comes back with half the frames).
- content_parts: the template's prompt (one ``<|video_pad|>``) and the raw clip expand
  to the renderer's ids, posted raw and through ``VLLMBackend`` (raw frames sent
  losslessly encoded; the returned placeholders count the renderer's embeddings).
- features (Qwen2.5-VL, LLaVA-OneVision): vLLM's decoder takes our ``kwargs_data`` for a clip and samples
  what its own processing of the raw clip gives, tokens and logprobs. Qwen3-VL's
  placeholders carry ``is_embed`` (the timestamps): refused before anything is sent.
"""

from __future__ import annotations

import asyncio
import base64
import io
import os
import shutil
from collections.abc import Iterator

import httpx
import numpy as np
import pytest

from tests.vllm._mismatch import assert_agrees, measure
from tests.vllm.conftest import VLLMServer, free_port
from vf_mm.errors import MultiModalDataError
from vf_mm.inference import (
    GenerateRequest,
    SamplingParams,
    VLLMBackend,
)
from vf_mm.inference._internal import decode_kwargs_item
from vf_mm.renderers import load_renderer
from vf_mm.testing import build_tiny_vlm

pytestmark = pytest.mark.vllm

FAMILIES = ("qwen2_5_vl", "qwen3_vl", "llava_onevision")
TIMEOUT = httpx.Timeout(300.0, connect=5.0)


@pytest.fixture(autouse=True, scope="module")
def _needs_torchvision():
    pytest.importorskip("torchvision")


@pytest.fixture(scope="module")
def servers(vllm_py, tmp_path_factory) -> Iterator[dict[str, tuple[VLLMServer, object]]]:
    root = tmp_path_factory.mktemp("video-vllm")
    out: dict[str, tuple[VLLMServer, object]] = {}
    for family in FAMILIES:
        path = build_tiny_vlm(root / family, family)
        args = ["--limit-mm-per-prompt", '{"image":4,"video":2}', "--no-mm-device-do-normalize"]
        out[family] = (VLLMServer(family, path, free_port(), root / f"{family}.log", args), path)
    try:
        for server, _ in out.values():
            server.start(vllm_py)
        yield out
    finally:
        for server, _ in out.values():
            server.stop()
        if os.environ.get("VF_MM_KEEP_VLLM_LOGS"):
            for family in FAMILIES:
                shutil.copy(root / f"{family}.log", os.environ["VF_MM_KEEP_VLLM_LOGS"])


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, servers):
    server, path = servers[request.param]
    server.wait_healthy()
    return request.param, server, path, load_renderer(path)


def lossless_mp4(frames: np.ndarray, rate: int) -> str:
    """``frames`` as an H.264 RGB (lossless) MP4 data URL."""
    import av

    buffer = io.BytesIO()
    with av.open(buffer, "w", format="mp4") as container:
        stream = container.add_stream("libx264rgb", rate=rate)
        stream.width, stream.height, stream.pix_fmt = frames.shape[2], frames.shape[1], "rgb24"
        stream.options = {"qp": "0"}
        for frame in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return "data:video/mp4;base64," + base64.b64encode(buffer.getvalue()).decode()


def case(name, seed=0, frames=8):
    rate = 2 if name == "qwen2_5_vl" else 4
    rng = np.random.default_rng(seed)
    clip = rng.integers(0, 256, (frames, 64, 80, 3), dtype=np.uint8)
    url = lossless_mp4(clip, rate)
    messages = [{"role": "user", "content": [{"type": "video_url", "video_url": {"url": url}},
                                             {"type": "text", "text": "What moved?"}]}]  # fmt: skip
    return url, messages


def post(server, body, path="/inference/v1/generate"):
    response = httpx.post(server.base_url + path, json=body, timeout=TIMEOUT)
    assert response.status_code == 200, response.text[:2000]
    return response.json()


def test_the_render_route_equals_the_renderer_on_a_clip(family):
    name, server, path, renderer = family
    _url, messages = case(name)
    ours = renderer.render(messages)
    theirs = post(server, {"model": str(path), "messages": messages},
                  path="/v1/chat/completions/render")  # fmt: skip
    assert theirs["token_ids"] == list(ours.token_ids)
    item = ours.multi_modal_data.mm_items["video"][0]
    decoded = decode_kwargs_item(theirs["features"]["kwargs_data"]["video"][0])
    assert set(decoded) - {"timestamps"} == set(item)  # timestamps: vLLM's bookkeeping
    for key, value in item.items():
        mine = np.asarray(value).reshape(decoded[key].shape)
        assert mine.dtype == decoded[key].dtype, key
        assert np.array_equal(mine, decoded[key]), key  # bit-exact
    (range_,) = theirs["features"]["mm_placeholders"]["video"]
    (mine,) = ours.multi_modal_data.mm_placeholders["video"]
    # Qwen3-VL: vLLM's range starts at the template's <|vision_start|> (ours at the first
    # group's, after the first timestamp); both end at the last <|vision_end|>
    assert range_["offset"] + range_["length"] == mine.end
    assert range_["offset"] <= mine.offset


def test_vllm_samples_a_qwen2_5_clip_to_2_fps_where_transformers_keeps_every_frame(servers):
    server, path = servers["qwen2_5_vl"]
    server.wait_healthy()
    renderer = load_renderer(path)
    clip = np.random.default_rng(5).integers(0, 256, (8, 64, 80, 3), dtype=np.uint8)
    url = lossless_mp4(clip, 4)
    messages = [{"role": "user", "content": [{"type": "video_url", "video_url": {"url": url}}]}]
    ours = renderer.render(messages)
    theirs = post(server, {"model": str(path), "messages": messages},
                  path="/v1/chat/completions/render")  # fmt: skip
    decoded = decode_kwargs_item(theirs["features"]["kwargs_data"]["video"][0])
    mine = ours.multi_modal_data.mm_items["video"][0]
    assert mine["video_grid_thw"][0][0] == 4 and decoded["video_grid_thw"][0][0] == 2
    assert len(theirs["token_ids"]) < len(ours.token_ids)


def template_prompt(renderer, messages):
    shown = [{**m, "content": [{"type": "video"} if p["type"] in ("video", "video_url") else p
                               for p in m["content"]]} for m in messages]  # fmt: skip
    text = renderer.tokenizer.apply_chat_template(shown, tokenize=False, add_generation_prompt=True)
    return renderer.tokenizer(text, add_special_tokens=False)["input_ids"]


def test_content_parts_expand_a_clip_to_the_renderers_ids(family):
    name, server, _path, renderer = family
    url, messages = case(name, seed=1)
    ours = renderer.render(messages)
    out = post(server, {
        "token_ids": template_prompt(renderer, messages),
        "sampling_params": {"max_tokens": 2, "temperature": 0.0},
        "content_parts": [{"type": "video_url", "url": url}],
        "return_token_ids": True,
    })  # fmt: skip
    assert out["prompt_token_ids"] == list(ours.token_ids)


def test_features_sample_what_the_servers_own_processing_of_the_clip_samples(family):
    name, server, _path, renderer = family
    url, messages = case(name, seed=2)
    ours = renderer.render(messages)
    backend = VLLMBackend(server.base_url, mode="features")
    request = GenerateRequest(prompt_ids=list(ours.token_ids),
                              multi_modal_data=ours.multi_modal_data,
                              sampling=SamplingParams(max_tokens=6, temperature=0.0, logprobs=True))  # fmt: skip
    if name == "qwen3_vl":  # timestamps inside the range: is_embed
        with pytest.raises(MultiModalDataError, match="content_parts"):
            asyncio.run(backend.generate(request))
        return
    mine = asyncio.run(backend.generate(request))
    own = post(server, {"token_ids": template_prompt(renderer, messages),
                        "sampling_params": {"max_tokens": 6, "temperature": 0.0, "logprobs": 0},
                        "content_parts": [{"type": "video_url", "url": url}]})  # fmt: skip
    choice = own["choices"][0]
    assert mine.completion_ids == choice["token_ids"]
    np.testing.assert_allclose(mine.logprobs, [e["logprob"] for e in choice["logprobs"]["content"]],
                               atol=1e-4)  # fmt: skip


def test_the_backend_sends_raw_frames_as_content_parts(family):
    """VLLMBackend in content_parts mode: raw frames go out losslessly encoded with their
    rate, vLLM expands them to the renderer's ids, and with the embedding ids the returned
    placeholders count the renderer's embeddings (Qwen3-VL's timestamps are not)."""
    name, server, _path, renderer = family
    rate = 2.0 if name == "qwen2_5_vl" else 4.0
    frames = np.random.default_rng(4).integers(0, 256, (8, 64, 80, 3), dtype=np.uint8)
    part = {"type": "video", "video": frames, "frame_rate": rate}
    messages = [{"role": "user", "content": [part, {"type": "text", "text": "What moved?"}]}]
    ours = renderer.render(messages)
    backend = VLLMBackend(server.base_url, mode="content_parts",
                          embed_token_ids={"video": renderer.vision.embed_ids("video")})  # fmt: skip
    request = GenerateRequest(template_prompt(renderer, messages), SamplingParams(max_tokens=1),
                              content_parts=[part])  # fmt: skip
    result = asyncio.run(backend.generate(request))
    assert result.prompt_ids == list(ours.token_ids)
    (theirs,) = result.multi_modal_data.mm_placeholders["video"]
    (mine,) = ours.multi_modal_data.mm_placeholders["video"]
    assert theirs.num_embeds == mine.num_embeds and theirs.end == mine.end
    assert result.multi_modal_data.mm_hashes == ours.multi_modal_data.mm_hashes


@pytest.mark.parametrize("name", ["qwen2_5_vl", "qwen3_vl"])
def test_the_trainer_scores_vllms_multi_turn_image_samples_as_vllm_did(servers, name):
    """Issue 31's mismatch metric on these servers' image families (LLaVA-OneVision's is
    measured in test_families_vllm.py): vLLM's multi-turn gridnav samples, images in both
    turns, scored by the same checkpoint's transformers forward (``tests/vllm/_mismatch.py``)."""
    server, path = servers[name]
    server.wait_healthy()
    assert_agrees(measure(name, server.base_url, path))
