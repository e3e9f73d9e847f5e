"""GLM-4.6V's clips render as transformers' ``Glm46VProcessor`` and
``Glm46VVideoProcessor`` render them: the token ids (per temporal group
``<|begin_of_image|>`` + ``<|image|>`` run + ``<|end_of_image|>`` + its time), the
processor's ``mm_token_type_ids`` and every model input, bit for bit, and the model
computes a clip fed as images (one per temporal group) exactly as it computes the clip.

The default tier holds vf_mm's torch-only processing to the goldens the real classes
wrote (``golden/glm46v_video.json``, by ``golden/glm46v_video.py``, where torchvision
imports).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.renderers.golden.glm46v_video import (
    CASES,
    conversation,
    digest,
    parts_of,
    tensor_record,
)
from vf_mm.errors import RenderError
from vf_mm.models import model_inputs
from vf_mm.renderers import load_renderer

GOLDEN = json.loads((Path(__file__).parent / "golden" / "glm46v_video.json").read_text())


@pytest.fixture(scope="module")
def glm46v():
    from vf_mm.models import cached_tiny_vlm

    return cached_tiny_vlm("glm46v")


@pytest.fixture(scope="module")
def renderer(glm46v):
    return load_renderer(glm46v, image_backend="pil")


def clip(frames: int = 8, height: int = 30, width: int = 44, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (frames, height, width, 3), dtype=np.uint8)


def ask(*parts) -> list[dict]:
    return [{"role": "user", "content": [*parts, {"type": "text", "text": "What moved?"}]}]


def video(frames=None, **keys) -> dict:
    return {"type": "video", "video": clip() if frames is None else frames, **keys}


def stacked(items: list[dict], name: str) -> np.ndarray:
    arrays = [np.asarray(i[name]) for i in items]
    if name.endswith("grid_thw"):
        arrays = [a.reshape(-1, 3).astype(np.int64) for a in arrays]
    return np.concatenate(arrays)


@pytest.mark.parametrize("case", GOLDEN["cases"], ids=lambda c: f"case{c['case']}")
def test_clips_render_as_the_real_processor_wrote_them(renderer, case):
    """The ids, each clip's and image's inputs, and the processor's token types (2 on a
    clip's ``<|image|>`` runs, 1 on an image's) from the placeholders."""
    messages = conversation(case["case"])
    assert [digest(p["video"]) for p in parts_of(messages, "video")] == case["clips"]
    assert [digest(np.asarray(p["image"])) for p in parts_of(messages, "image")] == case["images"]
    rendered = renderer.render(messages)
    assert rendered.token_ids == case["input_ids"]
    data = rendered.multi_modal_data
    data.validate(len(rendered.token_ids))
    for modality, names in (("video", ("pixel_values_videos", "video_grid_thw")),
                            ("image", ("pixel_values", "image_grid_thw"))):  # fmt: skip
        for name in names:
            if name in case["inputs"]:
                assert tensor_record(stacked(data.mm_items[modality], name)) == case["inputs"][name]
    types = np.zeros(len(rendered.token_ids), dtype=np.int64)
    for modality, _, placeholder in data.all_placeholders():
        types[placeholder.embed_positions()] = 1 if modality == "image" else 2
    assert types.tolist() == case["mm_token_type_ids"]


def test_the_cases_cover_each_branch_of_the_sampler():
    """Short clips stretched, long ones stepped, fractional times, sampling off."""
    rates = [rate for spec in CASES for *_, rate in spec["clips"]]
    assert None in rates and 30.0 in rates and 7.0 in rates
    assert any(spec["options"].get("do_sample_frames") is False for spec in CASES)
    assert any(spec.get("where") == "tool" for spec in CASES)


def test_a_clip_is_computed_as_its_groups_as_images(glm46v, renderer):
    """The model on the processor's form of a clip (``pixel_values_videos``, 2 in
    ``mm_token_type_ids``) and on vf_mm's (each temporal group an image) gives the same
    logits; transformers' own form fails once a sequence holds an image beside a clip,
    which vf_mm's takes."""
    from vf_mm.models import model_class

    model = model_class("glm46v", checkpoint=glm46v).from_pretrained(glm46v, dtype=torch.float32)
    model.eval()
    rendered = renderer.render(ask(video(clip(frames=6), frame_rate=4.0)))
    ids = torch.tensor([rendered.token_ids])
    item = rendered.multi_modal_data.mm_items["video"][0]
    types = torch.zeros_like(ids)
    for _, _, placeholder in rendered.multi_modal_data.all_placeholders():
        types[0, placeholder.embed_positions()] = 2
    with torch.no_grad():
        theirs = model(
            input_ids=ids, mm_token_type_ids=types,
            pixel_values_videos=torch.from_numpy(np.asarray(item["pixel_values_videos"])),
            video_grid_thw=torch.from_numpy(np.asarray(item["video_grid_thw"])).reshape(-1, 3),
        ).logits  # fmt: skip
        embed = [renderer.vision.image_token_id]
        ours = model(input_ids=ids, **model_inputs(
            "glm46v", ids, [], image_token_ids=embed, videos=[item], video_token_ids=embed,
            order=["video"])).logits  # fmt: skip
    assert torch.equal(theirs, ours)

    picture = clip(frames=1, height=40, width=60, seed=3)[0]
    mixed = renderer.render(ask({"type": "image", "image": picture}, video(frame_rate=4.0)))
    ids = torch.tensor([mixed.token_ids])
    data = mixed.multi_modal_data
    order = [m for m, _, _ in data.all_placeholders()]
    inputs = model_inputs("glm46v", ids, data.mm_items["image"], image_token_ids=embed,
                          videos=data.mm_items["video"], video_token_ids=embed, order=order)  # fmt: skip
    assert inputs["mm_token_type_ids"].max() == 1
    with torch.no_grad():
        assert torch.isfinite(model(input_ids=ids, **inputs).logits).all()


@pytest.mark.parametrize("option", [{"fps": 2.0}, {"num_frames": 4}])
def test_a_rate_or_frame_count_is_refused_by_name(renderer, option):
    """Its sampler reads neither: asked for, either would change nothing."""
    with pytest.raises(RenderError, match="picks by the clip's duration"):
        renderer.render(ask(video(frame_rate=4.0, **option)))


def test_sampling_needs_the_clip_rate_and_keeping_every_frame_does_not(renderer):
    with pytest.raises(RenderError, match="needs the clip's frame rate"):
        renderer.render(ask(video()))
    kept = renderer.render(ask(video(do_sample_frames=False)))
    text = renderer.tokenizer.decode(kept.token_ids)
    # 8 frames in 4 groups, timed at 24 fps as the processor takes an unknown rate
    assert [f"{t:.1f} seconds" in text for t in (0, 2 / 24, 4 / 24, 6 / 24)] == [True] * 4


def test_a_clip_too_short_for_one_sampled_pair_is_refused(renderer):
    """Under a sixth of a second the processor's frame budget is zero: transformers goes on
    with no frame and fails deep in its resize; vf_mm names the cause and the fix."""
    with pytest.raises(RenderError, match=r"keeps no frame .* do_sample_frames=False"):
        renderer.render(ask(video(clip(frames=2), frame_rate=30.0)))


def test_a_clip_in_a_tool_result_bridges_onto_the_calling_turn(renderer):
    """A tool that answers with a clip, twice: each bridge equals the full render of the
    conversation with the parsed turn in it (a new user question is rendered in full: the
    template rewrites earlier reasoning, ``test_glm46v.py``)."""
    messages = ask(video(frame_rate=4.0))
    rendered = renderer.render(messages)
    observation = renderer.tokenizer.convert_tokens_to_ids("<|observation|>")
    for turn in range(2):
        calls = renderer.format_tool_calls([("film", {"take": turn})])
        text = f"<think>Again.</think>\nFilming.\n{calls}"
        completion = [*renderer.tokenizer(text, add_special_tokens=False)["input_ids"], observation]
        parsed = renderer.parse_response(completion)
        new = [{"role": "tool", "tool_call_id": parsed.tool_calls[0]["id"],
                "content": [video(clip(seed=5 + turn), frame_rate=2.0)]}]  # fmt: skip
        bridged = renderer.bridge_to_next_turn(
            rendered.token_ids, completion, new,
            previous_multi_modal_data=rendered.multi_modal_data,
        )  # fmt: skip
        assert bridged is not None, dict(renderer.bridge_refusals)
        messages = [*messages, parsed.message, *new]
        full = renderer.render(messages)
        assert bridged.token_ids == full.token_ids
        assert bridged.multi_modal_data.mm_placeholders == full.multi_modal_data.mm_placeholders
        rendered = bridged


# (frames, height, width, frame rate, options): each rate band of the sampler (up to 30 s,
# up to 300 s, beyond), a clip on whole seconds and one off them, and each size option
PARITY = [
    (61, 20, 30, 2.0, {}),
    (1350, 8, 8, 30.0, {}),
    (620, 8, 8, 2.0, {}),
    (24, 40, 60, 24.0, {"max_pixels": 20000}),
    (10, 30, 30, 5.0, {"min_pixels": 40000}),
    (7, 33, 17, 3.0, {"do_sample_frames": False}),
    (14, 24, 24, 6.0, {}),  # 14 frames kept, the last dropped and the one before repeated
]


@pytest.mark.vllm
@pytest.mark.parametrize("spec", PARITY, ids=lambda s: f"{s[0]}x{s[1]}x{s[2]}@{s[3]}")
def test_the_port_equals_the_real_video_processor(glm46v, renderer, spec):
    """Against ``Glm46VProcessor`` itself (torchvision): ids and clip inputs, bit for bit.
    Its video processor takes no ``min_pixels`` / ``max_pixels`` (a TypeError): a part's
    are the edges of its ``size``, the pixel budget over the clip, and are given so."""
    pytest.importorskip("torchvision")
    from transformers import AutoProcessor

    from tests.renderers.golden.glm46v_video import reference

    frames, height, width, rate, options = spec
    options = dict(options)
    rendered = renderer.render(ask(video(clip(frames, height, width, seed=frames),
                                         frame_rate=rate, **options)))  # fmt: skip
    settings = renderer.vision.video
    size = {"shortest_edge": options.pop("min_pixels", settings.min_pixels),
            "longest_edge": options.pop("max_pixels", settings.max_pixels)}  # fmt: skip
    part = video(clip(frames, height, width, seed=frames), frame_rate=rate, **options)
    ref = reference(AutoProcessor.from_pretrained(glm46v), ask({**part, "size": size}))
    assert rendered.token_ids == ref["input_ids"][0].tolist()
    (item,) = rendered.multi_modal_data.mm_items["video"]
    assert np.array_equal(item["pixel_values_videos"], ref["pixel_values_videos"].numpy())
    assert np.array_equal(np.asarray(item["video_grid_thw"]).reshape(-1, 3),
                          ref["video_grid_thw"].numpy())  # fmt: skip
