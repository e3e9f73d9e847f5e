"""Every vision family against a real vLLM 0.32 server: vLLM's own processing of an image
equals the renderer's, token for token and bit for bit.

For each of Qwen3.5, Gemma 3, Gemma 4 (E2B's architecture and, as ``gemma4_31b`` and
``gemma4_26b_a4b``, the 31B's and the 26B-A4B's with their template), SmolVLM,
LLaVA-OneVision, LLaVA-NeXT, InternVL3, Qwen3-VL-MoE, Qwen3.5-MoE, LFM2.5-VL, Kimi-K2.5 and
GLM-4.6V (GLM-4.6V-Flash's ``glm4v`` kind and, as ``glm46v_moe``, GLM-4.6V's
``glm4v_moe``) (one tiny checkpoint and one server
each, images of sizes that force a resize, the renderer on the torchvision backend, which
vLLM uses):

- the render route (``/v1/chat/completions/render``): vLLM's token ids equal the
  renderer's, and every tensor of its ``kwargs_data`` (decoded by our decoder from
  vLLM's own encoding) equals the renderer's model inputs bit for bit;
- content_parts generation: the prompt as the chat template writes it (one placeholder per
  image) with the image sent raw comes back expanded to exactly the renderer's ids;
- features generation (the renderer's ids, placeholders and kwargs_data): vLLM's decoder
  takes our ``kwargs_data`` and samples what its own processing of the image gives, for
  the families whose placeholders are plain runs (Qwen3.5, LLaVA-OneVision, LLaVA-NeXT,
  the MoEs, Kimi-K2.5, GLM-4.6V). Gemma 3's, Gemma 4's, SmolVLM's, InternVL3's and LFM2.5-VL's carry
  ``is_embed``, which vLLM 0.32's features protocol cannot take;
- the sampler/trainer mismatch: features-mode rollouts for the plain-run families, and
  Gemma 4's (E2B architecture) in content_parts mode, where vLLM processes the images
  (the 31B's and 26B-A4B's against transformers with causal attention over images:
  vLLM 0.32's CPU attention drops their bidirectional attention over each image,
  docs/models.md).

Qwen3.5's and Qwen3.5-MoE's servers run in bfloat16: vLLM 0.32's CPU Gated DeltaNet
refuses float32. vLLM's ``kwargs_data`` also holds its own bookkeeping (``VLLM_ONLY``: an
image's tile count, InternVL's image token id), no model input, which is not compared.

Placeholders: equal to vLLM's, except Gemma 3's, where vLLM's range also covers the newline
tokens its processor writes around the image markers (``"\\n\\n"`` merged with the text
beside them); ours is the markers and the image tokens, which vLLM's contains.

Kimi-K2.5: vLLM takes its images as the modality ``vision_chunk`` (the grid as
``grid_thws``), which ``VLLMBackend`` sends and reads back in both modes, and resizes
them with PIL where transformers uses torchvision, so its pixels are compared within
``KIMI_RESIZE_TOLERANCE``, and within one float32 ulp for an image nothing resizes. Its
features (the renderer's pixels, the trainer's) sample what vLLM's own processing samples
within the two resizers' difference, and exactly where nothing is resized
(``test_kimi_k25_through_the_backend_in_both_modes``), and its mismatch is float32's.
Its server runs without vLLM's CPU rotary kernel (``KIMI_ROPE``).

Gemma 4's patch positions are ``image_position_ids`` in transformers (and vf_mm), and
``pixel_position_ids`` in vLLM's ``kwargs_data``: the same tensor under vLLM's name.
The server is told no audio (``"audio": 0``): the tiny checkpoint has no audio tower.
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
import torch
from PIL import Image

from tests.vllm._mismatch import assert_agrees, assert_refused, measure, measure_content_parts
from tests.vllm.conftest import VLLMServer, free_port
from vf_mm.errors import MultiModalDataError
from vf_mm.inference import (
    GenerateRequest,
    SamplingParams,
    VLLMBackend,
    encode_features,
)
from vf_mm.inference._internal import decode_kwargs_item
from vf_mm.renderers import load_renderer
from vf_mm.testing import build_tiny_vlm

pytestmark = pytest.mark.vllm

FAMILIES = (
    "qwen3_5", "gemma3", "gemma4", "gemma4_31b", "gemma4_26b_a4b", "smolvlm", "llava_onevision",
    "llava_next", "internvl", "qwen3_vl_moe", "qwen3_5_moe", "lfm2_vl", "kimi_k25", "glm46v",
    "glm46v_moe",
)  # fmt: skip
#: a server's name that is a family's variant: (family, variant) it is built as (GLM-4.6V's
#: MoE, "glm4v_moe"; "glm46v" is GLM-4.6V-Flash's dense "glm4v"; Gemma 4's 31B and 26B-A4B
#: architectures and template, "gemma4" being E2B's)
VARIANTS = {"glm46v_moe": ("glm46v", "moe"), "gemma4_31b": ("gemma4", "31b"),
            "gemma4_26b_a4b": ("gemma4", "26b-a4b")}  # fmt: skip
#: placeholders without is_embed: features mode takes them
PLAIN_RUNS = ("qwen3_5", "llava_onevision", "llava_next", "qwen3_vl_moe", "qwen3_5_moe", "kimi_k25",
              "glm46v")  # fmt: skip
SIZES = [(640, 480), (97, 501), (1000, 120)]
TIMEOUT = httpx.Timeout(300.0, connect=5.0)
#: vLLM's names for a model input that transformers (and vf_mm) name otherwise
VLLM_NAMES = {"pixel_position_ids": "image_position_ids", "grid_thws": "image_grid_thw"}
#: vLLM's modality for a family's images where it is not "image": Kimi-K2.5 takes images
#: and videos as one "vision_chunk" modality
VLLM_MODALITY = {"kimi_k25": "vision_chunk"}
#: Kimi-K2.5's pixels, vLLM's against transformers': vLLM's processor resizes with PIL's
#: bicubic, transformers' with torchvision's (up to 5 levels of 255 apart: 0.039 after the
#: normalisation to [-1, 1]), and normalises through a lookup table (1 float32 ulp apart
#: where nothing is resized). A wrong layout or normalisation is ~1 apart
KIMI_RESIZE_TOLERANCE = 0.05
#: Kimi-K2.5's server leaves out vLLM 0.32's CPU rotary kernel (docs/models.md): MLA hands
#: it the query's rope part as (tokens, heads, 64), which it rotates wrongly for more than
#: one head (a flat (tokens, heads * 64) query, every other family's, it rotates right), so
#: the attention scores, and the logprobs, drift from transformers' from the second token
#: on, images or not (mismatch_kl 2.3e-6, max_abs_diff 5e-3 with it; 3.6e-14 and 4.8e-7
#: with vLLM's PyTorch rotary instead)
KIMI_ROPE = ["--compilation-config", '{"custom_ops": ["all", "-rotary_embedding"]}']
#: vLLM's own bookkeeping in an image's kwargs_data, no model input of the processor's: how
#: many tiles an image has (SmolVLM, InternVL) and InternVL's image token id
VLLM_ONLY = ("num_patches", "image_num_patches", "image_token_id")


@pytest.fixture(autouse=True, scope="module")
def _needs_torchvision():
    pytest.importorskip("torchvision")


#: servers running at once: the one in use and the next ones starting (all of them at
#: once, eleven on 2 cores and 23 GB, ran out of memory and time before any was healthy)
AHEAD = 3


class Fleet:
    """One server per chosen family, in the order their tests run (pytest groups a
    module's tests by the module-scoped ``family`` parameter, in ``FAMILIES`` order): at
    most ``AHEAD`` run at once, the next ones starting while the current one serves."""

    def __init__(
        self, order: list[str], servers: dict[str, tuple[VLLMServer, object]], python: str
    ):
        self.order, self.servers, self.python = order, servers, python

    def use(self, name: str) -> tuple[VLLMServer, object]:
        at = self.order.index(name)
        for done in self.order[:at]:
            self.servers[done][0].stop()
        for coming in self.order[at : at + AHEAD]:
            server = self.servers[coming][0]
            if server.proc is None:
                server.start(self.python)
        return self.servers[name]

    def stop(self) -> None:
        for server, _ in self.servers.values():
            server.stop()


@pytest.fixture(scope="module")
def servers(request, vllm_py, tmp_path_factory) -> Iterator[Fleet]:
    """A ``Fleet`` of the families the selected tests use (``-k gemma4`` starts one)."""
    root = tmp_path_factory.mktemp("families-vllm")
    chosen = {
        item.callspec.params.get("family")
        for item in request.session.items
        if item.module is request.module and hasattr(item, "callspec")
    }
    out: dict[str, tuple[VLLMServer, object]] = {}
    for family in [f for f in FAMILIES if f in chosen]:
        built, variant = VARIANTS.get(family, (family, None))
        path = build_tiny_vlm(root / family, built, variant=variant)
        limits = {"gemma4": '{"image":2,"video":0,"audio":0}', "kimi_k25": '{"vision_chunk":2}'}
        args = ["--limit-mm-per-prompt", limits.get(built, '{"image":2,"video":0}')]
        args += ["--no-mm-device-do-normalize"]
        if family in ("qwen3_5", "qwen3_5_moe"):
            args += ["--dtype", "bfloat16"]  # vLLM's CPU Gated DeltaNet runs only in bf16
        if family == "kimi_k25":
            args += KIMI_ROPE
        server = VLLMServer(family, path, free_port(), root / f"{family}.log", args)
        out[family] = (server, path)
    fleet = Fleet(list(out), out, vllm_py)
    try:
        yield fleet
    finally:
        fleet.stop()
        if os.environ.get("VF_MM_KEEP_VLLM_LOGS"):
            for family in out:
                shutil.copy(root / f"{family}.log", os.environ["VF_MM_KEEP_VLLM_LOGS"])


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, servers):
    server, path = servers.use(request.param)
    server.wait_healthy()
    return VARIANTS.get(request.param, (request.param,))[0], server, path, load_renderer(path)


def case(size, seed=0):
    rng = np.random.default_rng(seed)
    image = Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                             {"type": "text", "text": "What is in it?"}]}]  # fmt: skip
    return url, messages


def post(server, body, path="/inference/v1/generate"):
    response = httpx.post(server.base_url + path, json=body, timeout=TIMEOUT)
    assert response.status_code == 200, response.text[:2000]
    return response.json()


@pytest.mark.parametrize("size", SIZES)
def test_the_render_route_equals_the_renderer(family, size):
    name, server, path, renderer = family
    assert renderer.image_backend == "torchvision"
    _url, messages = case(size)
    ours = renderer.render(messages)
    theirs = post(server, {"model": str(path), "messages": messages},
                  path="/v1/chat/completions/render")  # fmt: skip
    assert theirs["token_ids"] == list(ours.token_ids)
    item = ours.multi_modal_data.mm_items["image"][0]
    modality = VLLM_MODALITY.get(name, "image")
    decoded = decode_kwargs_item(theirs["features"]["kwargs_data"][modality][0])
    for key, value in decoded.items():
        if key in VLLM_ONLY:
            continue
        mine = np.asarray(item[VLLM_NAMES.get(key, key)]).reshape(
            value.shape
        )  # SmolVLM: no leading image axis
        if str(value.dtype) == "bfloat16":  # the bf16 server (Qwen3.5) casts what it made
            mine = torch.from_numpy(mine).to(torch.bfloat16).float().numpy()
            value = np.asarray(value, dtype=np.float32)
        assert mine.dtype == value.dtype, key
        if name == "kimi_k25" and key == "pixel_values":  # resized apart (KIMI_RESIZE_...)
            assert np.abs(mine - value).max() <= KIMI_RESIZE_TOLERANCE, key
            continue
        assert np.array_equal(mine, value), key  # bit-exact
    (range_,) = theirs["features"]["mm_placeholders"][modality]
    (mine,) = ours.multi_modal_data.mm_placeholders["image"]
    if name == "gemma3":  # vLLM's range adds the newline tokens around the markers
        assert range_["offset"] < mine.offset and mine.end < range_["offset"] + range_["length"]
    else:
        assert (range_["offset"], range_["length"]) == (mine.offset, mine.length)


@pytest.mark.parametrize("family", ["gemma4_31b", "gemma4_26b_a4b"], indirect=True)
def test_the_large_gemma4_templates_prefill_an_empty_thought_block(family):
    """Gemma 4 26B/31B's template differs from E2B's at the generation prompt: with
    thinking off it prefills an empty thought block (docs/models.md). vLLM's render route
    writes it as the renderer does: the ids end with the block and are equal."""
    _name, server, path, renderer = family
    _url, messages = case((97, 501))
    ours = list(renderer.render(messages).token_ids)
    theirs = post(server, {"model": str(path), "messages": messages},
                  path="/v1/chat/completions/render")  # fmt: skip
    text = "<|turn>model\n<|channel>thought\n<channel|>"
    block = renderer.tokenizer(text, add_special_tokens=False)["input_ids"]
    assert ours[-len(block) :] == block
    assert theirs["token_ids"] == ours


@pytest.mark.parametrize("family", ["kimi_k25"], indirect=True)
def test_kimi_k25s_pixels_differ_by_rounding_only_where_nothing_is_resized(family):
    """An image at a size Kimi-K2.5 takes as it is (4x4 patches of 14): vLLM's pixels and
    the renderer's are at most one float32 ulp apart (vLLM normalises through a lookup
    table, transformers by arithmetic); ids, grid and placeholder are equal. The larger
    difference of the resized sizes above is the two resizers'."""
    _name, server, path, renderer = family
    _url, messages = case((56, 56))
    ours = renderer.render(messages)
    theirs = post(server, {"model": str(path), "messages": messages},
                  path="/v1/chat/completions/render")  # fmt: skip
    assert theirs["token_ids"] == list(ours.token_ids)
    decoded = decode_kwargs_item(theirs["features"]["kwargs_data"]["vision_chunk"][0])
    item = ours.multi_modal_data.mm_items["image"][0]
    assert np.array_equal(np.asarray(item["image_grid_thw"]), decoded["grid_thws"])
    mine, value = np.asarray(item["pixel_values"]), decoded["pixel_values"]
    assert mine.shape == value.shape and mine.dtype == value.dtype
    np.testing.assert_allclose(mine, value, rtol=0, atol=1.2e-7)


@pytest.mark.parametrize("family", ["kimi_k25"], indirect=True)
def test_kimi_k25_through_the_backend_in_both_modes(family):
    """``VLLMBackend`` serves Kimi-K2.5 in both modes: content_parts comes back expanded to
    the renderer's ids with its placeholder under ``image`` (the server answers
    ``vision_chunk``), and features (sent as ``vision_chunk`` with ``grid_thws``) sample
    the same greedy tokens and logprobs, for an image nothing resizes, where the two
    processors' pixels are one float32 ulp apart (measured: 4.8e-7)."""
    _name, server, _path, renderer = family
    url, messages = case((56, 56), seed=3)
    ours = renderer.render(messages)
    sampling = SamplingParams(max_tokens=6, temperature=0.0, logprobs=True)

    async def both():
        async with VLLMBackend(server.base_url, mode="content_parts") as backend:
            parts = await backend.generate(GenerateRequest(
                prompt_ids=template_prompt(renderer, messages), sampling=sampling,
                content_parts=[{"type": "image_url", "image_url": {"url": url}}],
            ))  # fmt: skip
        async with VLLMBackend(server.base_url, mode="features") as backend:
            features = await backend.generate(GenerateRequest(
                prompt_ids=list(ours.token_ids), sampling=sampling,
                multi_modal_data=ours.multi_modal_data,
            ))  # fmt: skip
        return parts, features

    parts, features = asyncio.run(both())
    assert parts.prompt_ids == list(ours.token_ids)
    assert parts.multi_modal_data is not None
    assert parts.multi_modal_data.mm_placeholders == ours.multi_modal_data.mm_placeholders
    assert features.completion_ids == parts.completion_ids
    np.testing.assert_allclose(features.logprobs, parts.logprobs, rtol=0, atol=1e-5)


def template_prompt(renderer, messages):
    """The prompt as the chat template writes it: one placeholder per image."""
    shown = [{**m, "content": [{"type": "image"} if p["type"] == "image_url" else p
                               for p in m["content"]]} for m in messages]  # fmt: skip
    text = renderer.tokenizer.apply_chat_template(shown, tokenize=False, add_generation_prompt=True)
    return renderer.tokenizer(text, add_special_tokens=False)["input_ids"]


def test_content_parts_expand_to_the_renderers_ids(family):
    _name, server, _path, renderer = family
    url, messages = case((97, 501), seed=1)
    ours = renderer.render(messages)
    out = post(server, {
        "token_ids": template_prompt(renderer, messages),
        "sampling_params": {"max_tokens": 2, "temperature": 0.0},
        "content_parts": [{"type": "image_url", "url": url}],
        "return_token_ids": True,
    })  # fmt: skip
    assert out["prompt_token_ids"] == list(ours.token_ids)


def test_features_sample_what_the_servers_own_processing_samples(family):
    """vLLM's decoder takes our kwargs_data: the same greedy tokens and logprobs as the
    server's own processing of the raw image. Placeholders with is_embed (Gemma 3,
    SmolVLM) are refused by the backend, naming content_parts, before a request is sent.
    Kimi-K2.5's resized pixels are the two resizers' apart (``KIMI_RESIZE_TOLERANCE``):
    its logprobs were measured 3.5e-5 apart here, within the bound."""
    name, server, _path, renderer = family
    url, messages = case((640, 480), seed=2)
    if name not in PLAIN_RUNS:  # is_embed: refused by VLLMBackend before anything is sent
        ours = renderer.render(messages)
        backend = VLLMBackend(server.base_url, mode="features")
        request = GenerateRequest(prompt_ids=list(ours.token_ids),
                                  multi_modal_data=ours.multi_modal_data,
                                  sampling=SamplingParams(max_tokens=2))  # fmt: skip
        with pytest.raises(MultiModalDataError, match="send this model's images as content_parts"):
            asyncio.run(backend.generate(request))
        return
    ours = renderer.render(messages)
    sampling = {"max_tokens": 6, "temperature": 0.0, "logprobs": 0}
    # vf_mm's features field, as VLLMBackend sends it (Kimi-K2.5's as vision_chunk)
    features = encode_features(ours.multi_modal_data, num_tokens=len(ours.token_ids))
    with_features = post(server, {"token_ids": list(ours.token_ids),
                                  "sampling_params": sampling, "features": features})  # fmt: skip
    own = post(server, {"token_ids": template_prompt(renderer, messages),
                        "sampling_params": sampling,
                        "content_parts": [{"type": "image_url", "url": url}]})  # fmt: skip
    a, b = with_features["choices"][0], own["choices"][0]
    assert a["token_ids"] == b["token_ids"]
    np.testing.assert_allclose([e["logprob"] for e in a["logprobs"]["content"]],
                               [e["logprob"] for e in b["logprobs"]["content"]], atol=1e-4)  # fmt: skip


def test_the_trainer_scores_vllms_multi_turn_image_samples_as_vllm_did(family):
    """Issue 31's mismatch metric, per family: two two-turn gridnav rollouts (an image
    each turn) sampled by this server through vf_mm's client, scored by the same
    checkpoint's transformers forward on vf_mm's training batch; with one later image
    turned grey, the metric must show it (``tests/vllm/_mismatch.py``). Qwen3.5's and
    Qwen3.5-MoE's servers sample in bfloat16 (vLLM's CPU DeltaNet): their bar is
    prime-rl's. Gemma 3, Gemma 4, SmolVLM, InternVL3 and LFM2.5-VL cannot be sampled by
    vf_mm's client on vLLM 0.32 (``is_embed``): refused by name."""
    name, server, path, _renderer = family
    if name not in PLAIN_RUNS:
        assert_refused(name, server.base_url, path)
        return
    # seeded requests kill vLLM 0.32's CPU engine on the hybrid stacks (_mismatch.py)
    hybrid = name in ("qwen3_5", "qwen3_5_moe")
    result = measure(name, server.base_url, path, seed=None if hybrid else 0)
    assert_agrees(result, bf16_sampler=hybrid)


@pytest.mark.parametrize("family", ["gemma4"], indirect=True)
def test_the_trainer_scores_vllms_content_parts_samples_as_vllm_did(family):
    """The mismatch metric where vLLM 0.32 takes the images as content_parts (Gemma 4's
    E2B architecture, whose placeholders carry is_embed): four two-image prompts sampled
    by the server from raw images, expanded to exactly the renderer's ids, scored by the
    transformers forward on the renderer's inputs; float32 on both sides, so float32's
    bound. Measured: mismatch_kl 1.6e-13, max_abs_diff 1.4e-6; the second image grey:
    0.012. With a pad id other than the released 0 it was 6.7e-6 (vLLM takes the per-layer
    embeddings of id 0 at image positions, transformers those of ``pad_token_id``). The
    26B/31B architecture is left out: vLLM 0.32's CPU attention ignores its bidirectional
    image blocks (docs/models.md)."""
    name, server, path, _renderer = family
    assert_agrees(measure_content_parts(name, server.base_url, path))


@pytest.mark.parametrize("family", ["gemma4_31b", "gemma4_26b_a4b"], indirect=True)
def test_vllm_runs_the_large_gemma4s_but_for_their_bidirectional_image_attention(family):
    """vLLM 0.32 on CPU runs Gemma 4's 31B and 26B-A4B architectures (keys equal values
    in full attention, no per-layer embeddings, the standardised vision output, 26B-A4B's
    experts) as transformers does, except that its CPU attention drops the bidirectional
    image blocks (docs/models.md): its content_parts samples are scored within float32's
    bound by the transformers forward with causal attention over images
    (``causal_images``: a diagnosis, not the model). Measured: 4.4e-13 and 4.3e-13; the
    model itself (bidirectional) gives 0.003 and 0.0041, which this bound would refuse."""
    name, server, path, _renderer = family
    assert_agrees(measure_content_parts(name, server.base_url, path, causal_images=True))
