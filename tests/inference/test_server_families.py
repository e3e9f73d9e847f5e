"""``vf-mm serve`` beyond Qwen-VL: every family ``ItemChecker`` checks is served, a
features request answers what ``LocalBackend`` answers in-process, and a client's
malformed items are refused with a 400 naming the item and the field (the engine then
serves the next request as before)."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from PIL import Image
from starlette.testclient import TestClient

from vf_mm.inference import GenerateRequest, LocalBackend, SamplingParams, create_app
from vf_mm.inference._mm_kwargs import encode_kwargs_item
from vf_mm.renderers import load_renderer

# the newly served families (Qwen2-VL, Qwen2.5-VL and Qwen3-VL: tests/inference/test_server.py)
FAMILIES = (
    "qwen3_5", "gemma3", "gemma4", "smolvlm", "llava_onevision", "llava_next", "internvl", "glm46v"
)  # fmt: skip


class Served:
    """One family's renderer, its local backend (no prefix cache: each request is
    computed whole, so the served and in-process answers are the same floats) and the app
    over them."""

    def __init__(self, path: Any) -> None:
        self.renderer = load_renderer(path)
        self.backend = LocalBackend(path, batch_window_ms=1, prefix_cache=False)
        self.app = create_app(self.backend, renderer=self.renderer, model_name="m")

    def rendered(self) -> Any:
        image = Image.fromarray(
            np.random.default_rng(3).integers(0, 256, (60, 100, 3), dtype=np.uint8)
        )
        content = [{"type": "image", "image": image}, {"type": "text", "text": "What is it?"}]
        return self.renderer.render([{"role": "user", "content": content}])

    def body(self, rendered: Any, items: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """A features-mode body for ``rendered`` (its items, or ``items`` in their place)."""
        mm = rendered.multi_modal_data
        ranges = mm.mm_placeholders["image"]
        return {
            "token_ids": rendered.token_ids,
            "features": {
                "mm_hashes": {"image": list(mm.mm_hashes["image"])},
                "mm_placeholders": {
                    "image": [{"offset": p.offset, "length": p.length} for p in ranges]
                },
                "kwargs_data": {
                    "image": [encode_kwargs_item(i) for i in (items or mm.mm_items["image"])]
                },
            },
            "sampling_params": {"max_tokens": 4, "temperature": 0.0, "logprobs": 0},
        }


@pytest.fixture(scope="module")
def served(checkpoints: Callable[[str], Any]) -> Iterator[Callable[[str], Served]]:
    made: dict[str, Served] = {}

    def get(family: str) -> Served:
        if family not in made:
            made[family] = Served(checkpoints(family))
        return made[family]

    yield get
    for s in made.values():
        asyncio.run(s.backend.aclose())


def _post(served: Served, body: dict[str, Any]) -> Any:
    with TestClient(served.app) as client:
        return client.post("/inference/v1/generate", json=body)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_served_image_answers_what_the_local_backend_answers(served, family):
    s = served(family)
    rendered = s.rendered()
    request = GenerateRequest(
        rendered.token_ids,
        SamplingParams(max_tokens=4, temperature=0.0, logprobs=True),
        multi_modal_data=rendered.multi_modal_data,
        banned_token_ids=tuple(sorted(s.renderer.vision.banned_token_ids)),
    )
    local = asyncio.run(s.backend.generate(request))
    r = _post(s, s.body(rendered))
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["token_ids"] == list(local.completion_ids)
    assert [c["logprob"] for c in choice["logprobs"]["content"]] == list(local.logprobs)
    # by hash only: the item the first request sent, from the server's cache
    hash_only = s.body(rendered)
    hash_only["features"]["kwargs_data"] = None
    assert _post(s, hash_only).json()["choices"][0]["token_ids"] == choice["token_ids"]


def _assert_served_as_rendered(
    s: Served,
    shown: list[dict[str, Any]],
    parts: list[dict[str, Any]],
    rendered: Any,
    expansion: Any,
) -> None:
    """A rollout worker's ``VLLMBackend`` in content_parts mode (``shown``: the messages
    with one bare part per item, the template's prompt; ``parts``: the items, processed by
    the server) against ``rendered``: the prompt the server expands, its placeholders (with
    their ``is_embed``) and the greedy answer are what the renderer and the local backend
    make in-process."""
    import httpx

    from vf_mm.inference import VLLMBackend

    tokenizer = s.renderer.tokenizer
    text = tokenizer.apply_chat_template(shown, tokenize=False, add_generation_prompt=True)
    collapsed = tokenizer(text, add_special_tokens=False)["input_ids"]
    sampling = SamplingParams(max_tokens=4, temperature=0.0, logprobs=True)
    banned = tuple(sorted(s.renderer.vision.banned_token_ids))

    async def send() -> Any:
        client = VLLMBackend("http://vf-mm.test", model="m", mode="content_parts",
                             transport=httpx.ASGITransport(app=s.app), expansion=expansion)  # fmt: skip
        try:
            return await client.generate(
                GenerateRequest(collapsed, sampling, banned_token_ids=banned, content_parts=parts)
            )
        finally:
            await client.aclose()

    served_result = asyncio.run(send())
    local = asyncio.run(s.backend.generate(GenerateRequest(
        rendered.token_ids, sampling, banned_token_ids=banned,
        multi_modal_data=rendered.multi_modal_data,
    )))  # fmt: skip
    assert served_result.prompt_ids == rendered.token_ids
    mm = served_result.multi_modal_data
    assert mm.mm_placeholders == rendered.multi_modal_data.mm_placeholders
    assert list(served_result.completion_ids) == list(local.completion_ids)
    assert list(served_result.logprobs) == list(local.logprobs)


@pytest.mark.parametrize("family", [f for f in FAMILIES if f != "gemma3"])
def test_content_parts_expand_as_the_renderer_renders(served, family):
    """An image as content_parts, the server processing it, serves what the renderer
    renders and the local backend answers."""
    from vf_mm.inference import Expansion

    s = served(family)
    image = Image.fromarray(np.random.default_rng(3).integers(0, 256, (60, 100, 3), dtype=np.uint8))
    words = {"type": "text", "text": "What is it?"}
    shown = [{"role": "user", "content": [{"type": "image"}, words]}]
    _assert_served_as_rendered(
        s, shown, [{"type": "image", "image": image}], s.rendered(),
        Expansion(embed_token_ids={"image": s.renderer.vision.embed_ids("image")}),
    )  # fmt: skip


def test_a_glm46v_clip_beside_an_image_serves_as_the_renderer_renders(served):
    """GLM-4.6V's clip and image as content_parts (the server samples the clip at its
    duration-picked rate and writes its frames with the image's token): the server's
    prompt, placeholders and greedy answer are the renderer's and the local backend's, the
    clip going into the forward as images beside the real one."""
    from vf_mm.inference import Expansion

    s = served("glm46v")
    rng = np.random.default_rng(5)
    image = Image.fromarray(rng.integers(0, 256, (40, 60, 3), dtype=np.uint8))
    frames = rng.integers(0, 256, (8, 30, 44, 3), dtype=np.uint8)
    clip = {"type": "video", "video": frames, "frame_rate": 4.0}
    words = {"type": "text", "text": "What moved?"}
    rendered = s.renderer.render([{"role": "user", "content": [{"type": "image", "image": image}, clip, words]}])  # fmt: skip
    shown = [{"role": "user", "content": [{"type": "image"}, {"type": "video"}, words]}]
    _assert_served_as_rendered(s, shown, [{"type": "image", "image": image}, clip], rendered,
                               Expansion.of(s.renderer.vision))  # fmt: skip


def _set(key: str, value: Callable[[Any], Any]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def apply(item: dict[str, Any]) -> dict[str, Any]:
        return {**item, key: value(np.asarray(item[key]))}

    return apply


def _nan(a: np.ndarray) -> np.ndarray:
    out = a.astype(np.float32)
    out.reshape(-1)[0] = np.nan
    return out


def _zero_tile(a: np.ndarray) -> np.ndarray:
    out = a.copy()
    out[0, 1] = 0
    return out


def _far_position(a: np.ndarray) -> np.ndarray:
    out = a.copy()
    out[0, 0] = (1 << 40, 0)  # a grid 2^40 wide must be refused, never allocated
    return out


def _swap_positions(a: np.ndarray) -> np.ndarray:
    out = a.copy()
    out[0, [0, 1]] = out[0, [1, 0]]
    return out


# (family, what is wrong, the change to the item, the field the 400 must name)
MALFORMED = [
    ("qwen3_5", "dtype", _set("pixel_values", lambda a: a.astype(np.int64)), "pixel_values"),
    (
        "qwen3_5",
        "grid vs patches",
        _set("image_grid_thw", lambda a: a * [1, 2, 1]),
        "pixel_values",
    ),
    ("qwen3_5", "row width", _set("pixel_values", lambda a: a[:, :-1]), "pixel_values"),
    ("gemma3", "shape", _set("pixel_values", lambda a: a[..., :-1]), "pixel_values"),
    ("gemma3", "nan", _set("pixel_values", _nan), "pixel_values"),
    ("gemma3", "count", _set("pixel_values", lambda a: np.concatenate([a, a])), "placeholder"),
    ("internvl", "count", _set("pixel_values", lambda a: a[:-1]), "placeholder"),
    ("internvl", "dtype", _set("pixel_values", lambda a: a.astype(np.int32)), "pixel_values"),
    (
        "smolvlm",
        "mask shape",
        _set("pixel_attention_mask", lambda a: a[:, :-1]),
        "pixel_attention_mask",
    ),
    (
        "smolvlm",
        "mask values",
        _set("pixel_attention_mask", lambda a: a * 2),
        "pixel_attention_mask",
    ),
    ("smolvlm", "a padding tile", _set("pixel_values", _zero_tile), "tile 1"),
    ("smolvlm", "count", _set("pixel_values", lambda a: a[:, :-1]), "pixel_attention_mask"),
    (
        "llava_onevision",
        "sizes vs tiles",
        _set("image_sizes", lambda a: a * 0 + 32),
        "pixel_values",
    ),
    (
        "llava_onevision",
        "sizes dtype",
        _set("image_sizes", lambda a: a.astype(np.float32)),
        "image_sizes",
    ),
    ("llava_next", "sizes", _set("image_sizes", lambda a: a * 0), "image_sizes"),
    ("llava_next", "count", _set("image_sizes", lambda a: a * 0 + 56), "placeholder"),
    ("gemma4", "far position", _set("image_position_ids", _far_position), "image_position_ids"),
    ("gemma4", "not a grid", _set("image_position_ids", _swap_positions), "image_position_ids"),
    ("gemma4", "patch width", _set("pixel_values", lambda a: a[..., :-1]), "pixel_values"),
    ("gemma4", "missing input", lambda item: {"pixel_values": item["pixel_values"]}, "takes"),
]


@pytest.mark.parametrize(
    ("family", "change", "field"),
    [pytest.param(f, c, field, id=f"{f}-{what}") for f, what, c, field in MALFORMED],
)
def test_a_malformed_item_is_a_400_naming_the_item_and_field(served, family, change, field):
    s = served(family)
    rendered = s.rendered()
    (item,) = rendered.multi_modal_data.mm_items["image"]
    body = s.body(rendered, [change(dict(item))])
    body["features"]["mm_hashes"]["image"] = ["malformed"]  # never the good item's cache entry
    r = _post(s, body)
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert field in message and "image" in message, message
    if field != "placeholder":
        assert "kwargs_data.image[0]" in message, message


def test_placeholders_of_a_family_with_markers_count_its_pads(served):
    """Gemma 3's image span holds its start and end markers: a range over the whole span
    is taken (its markers take no embedding), a range with no pad is not, and the pads of
    every range must be all the prompt's."""
    s = served("gemma3")
    rendered = s.rendered()
    body = s.body(rendered)
    (place,) = body["features"]["mm_placeholders"]["image"]
    assert _post(s, body).status_code == 200
    markers_only = copy.deepcopy(body)
    markers_only["features"]["mm_placeholders"]["image"][0]["length"] = 1
    assert "holds no image pad" in _post(s, markers_only).json()["error"]["message"]
    short = copy.deepcopy(body)
    short["features"]["mm_placeholders"]["image"][0]["length"] = place["length"] - 2
    message = _post(s, short).json()["error"]["message"]
    assert "but mm_placeholders cover" in message


def test_a_vision_model_served_without_its_renderer_takes_no_processed_images(served):
    s = served("gemma3")
    with TestClient(create_app(s.backend, model_name="m")) as client:
        r = client.post("/inference/v1/generate", json=s.body(s.rendered()))
    assert r.status_code == 400 and "renderer" in r.json()["error"]["message"]


def test_a_clip_of_a_family_whose_clips_are_not_checked_is_refused_as_features(served):
    """LLaVA-OneVision's processed clips are not checked: refused by name, even by hash
    only (a clip cached from content_parts), never read unchecked."""
    s = served("llava_onevision")
    video = s.renderer.vision.video_token_id
    body = {
        "token_ids": [1, video, 2],
        "features": {
            "mm_hashes": {"video": ["clip"]},
            "mm_placeholders": {"video": [{"offset": 1, "length": 1}]},
            "kwargs_data": None,
        },
        "sampling_params": {"max_tokens": 1},
    }
    r = _post(s, body)
    assert r.status_code == 400 and "clips are not checked" in r.json()["error"]["message"]
