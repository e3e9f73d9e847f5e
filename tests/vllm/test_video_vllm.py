"""Video against a real vLLM 0.32 server (Qwen2.5-VL, Qwen3-VL, LLaVA-OneVision, InternVL3
and Gemma 4, one tiny checkpoint and one server each, ``--limit-mm-per-prompt
'{"image":4,"video":2}'``; Gemma 4's with ``"audio":0`` and a 4096-token context, as its
clips run over 2048 tokens). A run starts only the selected families' servers.

- The render route (``/v1/chat/completions/render``) on a raw clip (a lossless MP4 data URL,
  so vLLM's OpenCV decoding and vf_mm's PyAV decoding see the same pixels): vLLM's token
  ids equal the renderer's, and every tensor of its ``kwargs_data`` (decoded by our
  decoder) equals the renderer's model inputs bit for bit. Qwen3-VL at the clip's 4 fps
  (vLLM samples it to 2 fps as transformers does), LLaVA-OneVision at 4 fps (every frame
  kept, as transformers keeps them); Qwen2.5-VL at 2 fps, because vLLM's
  own loader samples a Qwen2.5-VL clip to 2 fps where transformers keeps every frame
  (measured here too: a 4 fps clip comes back with half the frames).
- InternVL3 and Gemma 4 differ from transformers where stated (``test_vllm_*``): vLLM's
  loader keeps at most 32 frames of a clip (``linspace``), where transformers' InternVL
  keeps every frame and Gemma 4's samples 32 with ``arange``; vLLM's InternVL writes a
  clip's frames with ``<video>`` where transformers writes ``<IMG_CONTEXT>`` (the same
  pixels, the same positions); vLLM's Gemma 4 runs the frames through the image processor,
  whose rescale differs from the video processor's by at most one float32 ulp. A Gemma 4
  clip of at most 32 frames is the renderer's clip with ``num_frames`` set to its length.
- content_parts: the template's prompt (one ``<|video_pad|>``) and the raw clip expand
  to the renderer's ids, posted raw and through ``VLLMBackend`` (raw frames sent
  losslessly encoded; the returned placeholders count the renderer's embeddings; InternVL3's
  ``<video>`` ids mapped back to the renderer's ``<IMG_CONTEXT>`` by ``embed_swaps``).
- Kimi-K2.5 (``REFUSED``; its server with ``'{"vision_chunk":2}'`` and ``KIMI_ROPE``): vLLM
  answers a clip with 400, and the backend refuses one before sending.
- features (Qwen2.5-VL, LLaVA-OneVision): vLLM's decoder takes our ``kwargs_data`` for a clip and samples
  what its own processing of the raw clip gives, tokens and logprobs. Qwen3-VL's, InternVL3's
  and Gemma 4's placeholders carry ``is_embed`` (timestamps, frame labels): refused before
  anything is sent.
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
from tests.vllm.test_families_vllm import KIMI_ROPE
from vf_mm.errors import BackendHTTPError, MultiModalDataError
from vf_mm.inference import (
    Expansion,
    GenerateRequest,
    SamplingParams,
    VLLMBackend,
)
from vf_mm.inference._internal import decode_kwargs_item
from vf_mm.renderers import load_renderer
from vf_mm.testing import build_tiny_vlm

pytestmark = pytest.mark.vllm

FAMILIES = ("qwen2_5_vl", "qwen3_vl", "llava_onevision", "internvl", "gemma4")
#: families whose generic clips are at 2 fps: Qwen2.5-VL (vLLM samples to 2 fps)
WHOLE_SECONDS = ("qwen2_5_vl",)
#: families tested by one test of their own, whose server stops after it (six tiny servers
#: up at once ran the 2-core, 24 GiB machine out of memory: workers killed with -9)
ALONE = ("glm46v",)
TIMEOUT = httpx.Timeout(300.0, connect=5.0)
#: servers started together (the rest start when a test first asks for them)
AHEAD = 3
#: per family, transformers' (and vf_mm's) name of a clip's model input -> vLLM's
VLLM_NAMES = {
    "internvl": {"pixel_values": "pixel_values_videos"},
    "gemma4": {"video_position_ids": "pixel_position_ids_videos",
               "num_frames_per_video": "video_frame_counts"},
}  # fmt: skip
#: per family, vLLM's own bookkeeping in a clip's kwargs_data (no model input of transformers')
VLLM_ONLY = {
    "qwen3_vl": {"timestamps"},
    "internvl": {"video_num_patches", "video_token_id"},
    "gemma4": {"video_num_soft_tokens", "video_timestamps"},
}
#: families whose clips vLLM 0.32 cannot take (``VisionFamily.vllm_video_refusal``): their
#: servers start only for the test that holds the refusal to the server's answer
REFUSED = ("kimi_k25",)
#: vLLM 0.32's video loader keeps at most this many frames of a clip (``linspace``)
VLLM_MAX_FRAMES = 32


class Servers(dict):
    """The selected families' servers by name; one not yet started starts when asked for."""

    def __init__(self, servers: dict[str, tuple[VLLMServer, object]], python: str):
        super().__init__(servers)
        self.python = python

    def __getitem__(self, name: str) -> tuple[VLLMServer, object]:
        server, path = super().__getitem__(name)
        if server.proc is None:
            server.start(self.python)
        return server, path


@pytest.fixture(autouse=True, scope="module")
def _needs_torchvision():
    pytest.importorskip("torchvision")


@pytest.fixture(scope="module")
def servers(request, vllm_py, tmp_path_factory) -> Iterator[Servers]:
    """The servers of the families the selected tests use (``-k gemma4`` starts one)."""
    root = tmp_path_factory.mktemp("video-vllm")
    chosen = {
        value
        for item in request.session.items
        if item.module is request.module and hasattr(item, "callspec")
        for key in ("family", "name")
        if (value := item.callspec.params.get(key)) is not None
    }
    out: dict[str, tuple[VLLMServer, object]] = {}
    for family in [f for f in (*FAMILIES, *REFUSED, *ALONE) if f in chosen]:
        path = build_tiny_vlm(root / family, family)
        limits = {"gemma4": '{"image":4,"video":2,"audio":0}', "kimi_k25": '{"vision_chunk":2}'}
        args = ["--limit-mm-per-prompt", limits.get(family, '{"image":4,"video":2}')]
        args += ["--no-mm-device-do-normalize"]
        if family == "gemma4":  # 32 frames of ~65 tokens each
            args += ["--max-model-len", "4096"]
        if family == "kimi_k25":
            args += KIMI_ROPE
        out[family] = (VLLMServer(family, path, free_port(), root / f"{family}.log", args), path)
    fleet = Servers(out, vllm_py)
    try:
        for family in list(out)[:AHEAD]:
            fleet[family]  # starts it
        yield fleet
    finally:
        for server, _ in out.values():
            server.stop()
        if os.environ.get("VF_MM_KEEP_VLLM_LOGS"):
            for family in out:
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
    """A clip's URL, the messages sent to vLLM, and the messages the renderer takes: for
    Gemma 4 the clip's part with ``num_frames`` set to its length (its processor samples 32
    frames and refuses a shorter clip; vLLM keeps every frame of one)."""
    rate = 2 if name in WHOLE_SECONDS else 4
    rng = np.random.default_rng(seed)
    clip = rng.integers(0, 256, (frames, 64, 80, 3), dtype=np.uint8)
    url = lossless_mp4(clip, rate)
    messages = [{"role": "user", "content": [{"type": "video_url", "video_url": {"url": url}},
                                             {"type": "text", "text": "What moved?"}]}]  # fmt: skip
    return url, messages, renderer_messages(name, messages, frames)


def renderer_messages(name, messages, frames):
    if name != "gemma4":
        return messages
    clips = ("video", "video_url")
    return [{**m, "content": [{**p, "num_frames": frames} if p["type"] in clips else p
                              for p in m["content"]]} for m in messages]  # fmt: skip


def as_vllm_writes(name, renderer, ids):
    """``ids`` as vLLM 0.32 writes them: its InternVL puts ``<video>`` at a clip's embedding
    positions, where transformers' processor (and the renderer) puts ``<IMG_CONTEXT>``."""
    if name != "internvl":
        return list(ids)
    (context,) = renderer.vision.embed_ids("video")
    video = renderer.tokenizer.convert_tokens_to_ids("<video>")
    return [video if t == context else t for t in ids]


def assert_same_inputs(name, mine, decoded):
    """The renderer's inputs for a clip against vLLM's ``kwargs_data``: bit for bit, but for
    Gemma 4's pixels (vLLM rescales the frames as images, ``x * (1/255)``; transformers' video
    processor fuses rescale and normalise, ``x / 255``: one ulp apart where they differ)."""
    names = VLLM_NAMES.get(name, {})
    assert set(decoded) - VLLM_ONLY.get(name, set()) == {names.get(k, k) for k in mine}
    for key, value in mine.items():
        theirs = decoded[names.get(key, key)]
        ours = np.asarray(value).reshape(theirs.shape)
        assert ours.dtype == theirs.dtype, key
        if name == "gemma4" and key == "pixel_values_videos":
            np.testing.assert_array_max_ulp(ours, theirs, maxulp=1)
            assert not np.array_equal(ours, theirs), "now bit for bit: update the docs"
        else:
            assert np.array_equal(ours, theirs), key  # bit-exact


def post(server, body, path="/inference/v1/generate"):
    response = httpx.post(server.base_url + path, json=body, timeout=TIMEOUT)
    assert response.status_code == 200, response.text[:2000]
    return response.json()


def render_route(server, path, messages):
    """vLLM's render route on ``messages``: its answer and its first clip's decoded
    ``kwargs_data``."""
    theirs = post(server, {"model": str(path), "messages": messages},
                  path="/v1/chat/completions/render")  # fmt: skip
    return theirs, decode_kwargs_item(theirs["features"]["kwargs_data"]["video"][0])


def test_the_render_route_equals_the_renderer_on_a_clip(family):
    name, server, path, renderer = family
    _url, messages, ours_messages = case(name)
    ours = renderer.render(ours_messages)
    theirs, decoded = render_route(server, path, messages)
    assert theirs["token_ids"] == as_vllm_writes(name, renderer, ours.token_ids)
    item = ours.multi_modal_data.mm_items["video"][0]
    assert_same_inputs(name, item, decoded)
    (range_,) = theirs["features"]["mm_placeholders"]["video"]
    (mine,) = ours.multi_modal_data.mm_placeholders["video"]
    # Qwen3-VL: vLLM's range starts at the template's <|vision_start|> (ours at the first
    # group's, after the first timestamp); InternVL3 and Gemma 4 at the first frame's label
    # or timestamp (ours at its <img> / <|image>); all end at the last frame's end
    end = range_["offset"] + range_["length"]
    assert end == mine.end
    assert range_["offset"] <= mine.offset


@pytest.mark.parametrize("name", ["internvl"])
def test_vllm_keeps_32_frames_of_a_longer_internvl_clip_where_transformers_keeps_every_one(
    servers, name
):
    server, path = servers[name]
    server.wait_healthy()
    renderer = load_renderer(path)
    clip = np.random.default_rng(6).integers(0, 256, (33, 64, 80, 3), dtype=np.uint8)
    url = lossless_mp4(clip, 4)
    messages = [{"role": "user", "content": [{"type": "video_url", "video_url": {"url": url}}]}]
    theirs, decoded = render_route(server, path, messages)
    assert decoded["video_num_patches"].tolist() == [VLLM_MAX_FRAMES]
    kept = np.linspace(0, 32, VLLM_MAX_FRAMES, dtype=int)  # every frame but the 32nd
    sampled = [{"type": "video", "video": clip[kept], "frame_rate": 4.0}]
    ours = renderer.render([{"role": "user", "content": sampled}])
    assert theirs["token_ids"] == as_vllm_writes("internvl", renderer, ours.token_ids)
    assert_same_inputs("internvl", ours.multi_modal_data.mm_items["video"][0], decoded)
    whole = renderer.render(messages).multi_modal_data.mm_items["video"][0]
    assert np.asarray(whole["pixel_values"]).shape[0] == 33


@pytest.mark.parametrize("name", ["gemma4"])
def test_vllm_samples_a_longer_gemma4_clip_by_linspace_where_transformers_uses_arange(
    servers, name
):
    server, path = servers[name]
    server.wait_healthy()
    renderer = load_renderer(path)
    clip = np.random.default_rng(7).integers(0, 256, (33, 64, 80, 3), dtype=np.uint8)
    url = lossless_mp4(clip, 4)
    messages = [{"role": "user", "content": [{"type": "video_url", "video_url": {"url": url}}]}]
    theirs, decoded = render_route(server, path, messages)
    kept = np.linspace(0, 32, VLLM_MAX_FRAMES, dtype=int)  # vLLM: frames 0-30 and 32
    np.testing.assert_array_equal(decoded["video_timestamps"], [kept / 4])
    ours = renderer.render(messages)  # transformers: 32 frames by arange, 0-31
    mine = ours.multi_modal_data.mm_items["video"][0]
    assert np.asarray(mine["num_frames_per_video"]).tolist() == [32]
    assert theirs["token_ids"] != list(ours.token_ids)  # the last timestamp: 00:08, ours 00:07
    # the frames vLLM kept are the renderer's frames of those indices
    sampled = [{"type": "video", "video": clip[kept], "frame_rate": 4.0, "num_frames": 32}]
    frames = renderer.render([{"role": "user", "content": sampled}])
    assert_same_inputs("gemma4", frames.multi_modal_data.mm_items["video"][0], decoded)


@pytest.mark.parametrize("name", ["qwen2_5_vl"])
def test_vllm_samples_a_qwen2_5_clip_to_2_fps_where_transformers_keeps_every_frame(servers, name):
    server, path = servers[name]
    server.wait_healthy()
    renderer = load_renderer(path)
    clip = np.random.default_rng(5).integers(0, 256, (8, 64, 80, 3), dtype=np.uint8)
    url = lossless_mp4(clip, 4)
    messages = [{"role": "user", "content": [{"type": "video_url", "video_url": {"url": url}}]}]
    ours = renderer.render(messages)
    theirs, decoded = render_route(server, path, messages)
    mine = ours.multi_modal_data.mm_items["video"][0]
    assert mine["video_grid_thw"][0][0] == 4 and decoded["video_grid_thw"][0][0] == 2
    assert len(theirs["token_ids"]) < len(ours.token_ids)


@pytest.mark.parametrize("name", ["glm46v"])
def test_vllm_writes_glm46v_timestamps_in_whole_seconds_and_refuses_a_clip_under_one(servers, name):
    """vLLM 0.32's GLM-4.6V clip text times each group by ``int(idx / fps)``
    (``glm4_1v.py:1316``) where transformers' processor (and the renderer) writes
    ``idx / fps`` to a tenth: a clip whose groups start off whole seconds (8 frames at 4
    fps: 0, 0.5, 1, 1.5 s) gets other ids inside the timestamps only, the same pixels.
    A 0.4 s clip at 30 fps is answered 400 (vLLM's loader keeps one frame, a temporal patch
    takes two), where transformers samples it to one group. When this fails, vLLM changed: compare
    again and update docs/videos.md."""
    server, path = servers[name]
    server.wait_healthy()
    renderer = load_renderer(path)
    clip = np.random.default_rng(9).integers(0, 256, (8, 64, 80, 3), dtype=np.uint8)
    url = lossless_mp4(clip, 4)
    messages = [{"role": "user", "content": [{"type": "video_url", "video_url": {"url": url}}]}]
    ours = renderer.render(messages)
    theirs, decoded = render_route(server, path, messages)
    assert_same_inputs(name, ours.multi_modal_data.mm_items["video"][0], decoded)
    text = renderer.tokenizer.decode(ours.token_ids)
    their_text = renderer.tokenizer.decode(theirs["token_ids"])
    stamps = [f"{t:.1f} seconds" for t in (0.0, 0.5, 1.0, 1.5)]
    assert all(s in text for s in stamps)
    assert their_text == text.replace("0.5 seconds", "0.0 seconds").replace(
        "1.5 seconds", "1.0 seconds"
    )
    fast = np.random.default_rng(10).integers(0, 256, (12, 64, 80, 3), dtype=np.uint8)
    short = lossless_mp4(fast, 30)  # 0.4 s
    response = httpx.post(server.base_url + "/v1/chat/completions/render", timeout=TIMEOUT,
                          json={"model": str(path), "messages": [{"role": "user", "content": [
                              {"type": "video_url", "video_url": {"url": short}}]}]})  # fmt: skip
    assert response.status_code == 400, response.text[:500]
    raw = [{"type": "video", "video": fast, "frame_rate": 30.0}]
    assert (
        renderer.render([{"role": "user", "content": raw}]).multi_modal_data.num_items("video") == 1
    )
    # at whole seconds (2 fps) the render route and content_parts through the backend with
    # the renderer's facts give the renderer's ids; features are refused (is_embed)
    words = {"type": "text", "text": "What moved?"}
    whole = [{"role": "user", "content": [{"type": "video_url", "video_url": {
        "url": lossless_mp4(clip, 2)}}, words]}]  # fmt: skip
    part = {"type": "video", "video": clip, "frame_rate": 2.0}
    ours = renderer.render([{"role": "user", "content": [part, words]}])
    theirs, decoded = render_route(server, path, whole)
    assert theirs["token_ids"] == ours.token_ids
    assert_same_inputs(name, ours.multi_modal_data.mm_items["video"][0], decoded)
    (range_,) = theirs["features"]["mm_placeholders"]["video"]
    (mine,) = ours.multi_modal_data.mm_placeholders["video"]
    # vLLM's range spans <|begin_of_video|> to <|end_of_video|>, ours the frames'
    assert range_["offset"] < mine.offset and range_["offset"] + range_["length"] > mine.end
    backend = VLLMBackend(server.base_url, mode="content_parts",
                          expansion=Expansion.of(renderer.vision))  # fmt: skip
    request = GenerateRequest(template_prompt(renderer, whole), SamplingParams(max_tokens=1),
                              content_parts=[part])  # fmt: skip
    result = asyncio.run(backend.generate(request))
    assert result.prompt_ids == list(ours.token_ids)
    (returned,) = result.multi_modal_data.mm_placeholders["video"]
    assert returned.num_embeds == mine.num_embeds
    features = GenerateRequest(list(ours.token_ids), SamplingParams(max_tokens=1),
                               multi_modal_data=ours.multi_modal_data)  # fmt: skip
    with pytest.raises(MultiModalDataError, match="content_parts"):
        asyncio.run(VLLMBackend(server.base_url, mode="features").generate(features))
    server.stop()  # its memory back for the servers after it


def template_prompt(renderer, messages):
    shown = [{**m, "content": [{"type": "video"} if p["type"] in ("video", "video_url") else p
                               for p in m["content"]]} for m in messages]  # fmt: skip
    text = renderer.tokenizer.apply_chat_template(shown, tokenize=False, add_generation_prompt=True)
    return renderer.tokenizer(text, add_special_tokens=False)["input_ids"]


def test_content_parts_expand_a_clip_to_the_renderers_ids(family):
    name, server, _path, renderer = family
    url, messages, ours_messages = case(name, seed=1)
    ours = renderer.render(ours_messages)
    out = post(server, {
        "token_ids": template_prompt(renderer, messages),
        "sampling_params": {"max_tokens": 2, "temperature": 0.0},
        "content_parts": [{"type": "video_url", "url": url}],
        "return_token_ids": True,
    })  # fmt: skip
    assert out["prompt_token_ids"] == as_vllm_writes(name, renderer, ours.token_ids)


def test_features_sample_what_the_servers_own_processing_of_the_clip_samples(family):
    name, server, _path, renderer = family
    url, messages, ours_messages = case(name, seed=2)
    ours = renderer.render(ours_messages)
    backend = VLLMBackend(server.base_url, mode="features")
    request = GenerateRequest(prompt_ids=list(ours.token_ids),
                              multi_modal_data=ours.multi_modal_data,
                              sampling=SamplingParams(max_tokens=6, temperature=0.0, logprobs=True))  # fmt: skip
    if name in ("qwen3_vl", "internvl", "gemma4"):  # text inside the range: is_embed
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
    placeholders count the renderer's embeddings (Qwen3-VL's timestamps are not). InternVL3:
    vLLM's prompt holds ``<video>`` where the renderer's embeddings go (``<IMG_CONTEXT>``);
    with the family's swap (``vllm_embed_swaps``) the backend maps them back, so the
    returned ids are the renderer's, as for every other family."""
    name, server, _path, renderer = family
    rate = 2.0 if name in WHOLE_SECONDS else 4.0
    frames = np.random.default_rng(4).integers(0, 256, (8, 64, 80, 3), dtype=np.uint8)
    part = {"type": "video", "video": frames, "frame_rate": rate}
    messages = [{"role": "user", "content": [part, {"type": "text", "text": "What moved?"}]}]
    ours = renderer.render(renderer_messages(name, messages, 8))
    swaps = renderer.vision.vllm_embed_swaps("video")
    assert bool(swaps) == (name == "internvl")
    backend = VLLMBackend(server.base_url, mode="content_parts",
                          embed_token_ids={"video": renderer.vision.embed_ids("video")},
                          embed_swaps={"video": swaps})  # fmt: skip
    request = GenerateRequest(template_prompt(renderer, messages), SamplingParams(max_tokens=1),
                              content_parts=[part])  # fmt: skip
    result = asyncio.run(backend.generate(request))
    assert result.prompt_ids == list(ours.token_ids)
    (theirs,) = result.multi_modal_data.mm_placeholders["video"]
    (mine,) = ours.multi_modal_data.mm_placeholders["video"]
    assert theirs.num_embeds == mine.num_embeds
    assert theirs.end == mine.end
    if name != "gemma4":  # the renderer's clip has num_frames set: another hash
        assert result.multi_modal_data.mm_hashes == ours.multi_modal_data.mm_hashes


@pytest.mark.parametrize("name", REFUSED)
def test_vllm_answers_a_kimi_k25_clip_with_400_and_the_backend_refuses_it_first(servers, name):
    """vLLM 0.32 takes no Kimi-K2.5 clip: a one-frame clip (the only kind the renderer
    renders) as a video_url with the template's prompt is answered 400 (its token-in route
    hands the decoded clip to ``KimiK25Processor`` unsplit), with no ids to compare; a
    backend given the family's refusal refuses the clip before sending, by name, and one
    without it gets the server's 400. When this test fails because vLLM took the clip,
    compare its ids with the renderer's and update docs/videos.md."""
    server, path = servers[name]
    server.wait_healthy()
    renderer = load_renderer(path)
    frames = np.random.default_rng(5).integers(0, 256, (8, 56, 56, 3), dtype=np.uint8)
    part = {"type": "video", "video": frames, "frame_rate": 4.0}
    messages = [{"role": "user", "content": [part, {"type": "text", "text": "What moved?"}]}]
    ours = renderer.render([{**messages[0], "content": [{**part, "fps": 0.5},
                                                        messages[0]["content"][1]]}])  # fmt: skip
    (item,) = ours.multi_modal_data.mm_items["video"]
    assert item["video_grid_thw"][:, 0].tolist() == [1]  # the renderer keeps one frame
    url = lossless_mp4(frames, 4)
    response = httpx.post(server.base_url + "/inference/v1/generate", json={
        "token_ids": template_prompt(renderer, messages),
        "sampling_params": {"max_tokens": 1, "temperature": 0.0},
        "content_parts": [{"type": "video_url", "url": url}],
        "return_token_ids": True,
    }, timeout=TIMEOUT)  # fmt: skip
    assert response.status_code == 400, response.text[:500]
    assert "Failed to apply KimiK25Processor" in response.text
    refusal = renderer.vision.vllm_refusal("video")
    assert refusal is not None
    embed = {"video": renderer.vision.embed_ids("video")}
    request = GenerateRequest(template_prompt(renderer, messages), SamplingParams(max_tokens=1),
                              content_parts=[{"type": "video_url", "video_url": {"url": url}}])  # fmt: skip
    refusing = VLLMBackend(server.base_url, mode="content_parts", embed_token_ids=embed,
                           refusals={"video": refusal})  # fmt: skip
    with pytest.raises(MultiModalDataError, match=r"cannot take Kimi-K2\.5's clips"):
        asyncio.run(refusing.generate(request))
    plain = VLLMBackend(server.base_url, mode="content_parts", embed_token_ids=embed)
    with pytest.raises(BackendHTTPError, match="Failed to apply KimiK25Processor"):
        asyncio.run(plain.generate(request))


@pytest.mark.parametrize("name", ["qwen2_5_vl", "qwen3_vl"])
def test_the_trainer_scores_vllms_multi_turn_image_samples_as_vllm_did(servers, name):
    """Issue 31's mismatch metric on these servers' image families (LLaVA-OneVision's is
    measured in test_families_vllm.py): vLLM's multi-turn gridnav samples, images in both
    turns, scored by the same checkpoint's transformers forward (``tests/vllm/_mismatch.py``)."""
    server, path = servers[name]
    server.wait_healthy()
    assert_agrees(measure(name, server.base_url, path))
