"""InternVL3's clips render as transformers' ``InternVLProcessor`` and
``InternVLVideoProcessor`` render them: the token ids (``Frame{i}: <img>...</img>`` per
frame), the frames as image tiles in ``pixel_values`` in token order, bit for bit.

The default tier holds vf_mm's torch-only processing to the goldens the real classes
wrote (``golden/internvl_video.json``, by ``golden/internvl_video.py``, where torchvision
imports); the ``vllm``-marked tests (``python3 dev.py torchvision``) compare the port with
the real video processor on several option sets.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.renderers.golden.internvl_video import (
    CASES,
    conversation,
    digest,
    parts_of,
    tensor_record,
)
from vf_mm.errors import RenderError, ReservedTokenError, VideoError
from vf_mm.models import expand_video, image_token_ids, load_video_settings, model_inputs
from vf_mm.renderers import load_renderer

TOKENS = {"start_image_token": "<img>", "image_token": "<IMG_CONTEXT>", "end_image_token": "</img>"}
GOLDEN = json.loads((Path(__file__).parent / "golden" / "internvl_video.json").read_text())


@pytest.fixture(scope="module")
def internvl():
    from vf_mm.models import cached_tiny_vlm

    return cached_tiny_vlm("internvl")


@pytest.fixture(scope="module")
def renderer(internvl):
    return load_renderer(internvl, image_backend="pil")


def clip(frames: int = 5, height: int = 21, width: int = 34, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (frames, height, width, 3), dtype=np.uint8)


def video(frames=None, **keys) -> dict:
    return {"type": "video", "video": clip() if frames is None else frames, **keys}


@pytest.mark.parametrize("case", GOLDEN["cases"], ids=lambda c: f"case{c['case']}")
def test_clips_render_as_the_real_processor_wrote_them(renderer, case):
    """The ids (each frame's line, the clip's options applied), and ``pixel_values``:
    images' crops and clips' frames in the order their tokens appear, as the processor
    merges them; the placeholders cover exactly the image-context tokens."""
    messages = conversation(case["case"])
    assert [digest(p["video"]) for p in parts_of(messages, "video")] == case["clips"]
    assert [digest(np.asarray(p["image"])) for p in parts_of(messages, "image")] == case["images"]
    rendered = renderer.render(messages)
    assert rendered.token_ids == case["input_ids"]
    data = rendered.multi_modal_data
    data.validate(len(rendered.token_ids))
    order = [m for m, _, _ in data.all_placeholders()]
    items = {m: data.mm_items.get(m, []) for m in ("image", "video")}
    embed = image_token_ids(renderer.vision.processor)
    inputs = model_inputs("internvl", torch.tensor([rendered.token_ids]), items["image"],
                          image_token_ids=embed, videos=items["video"], video_token_ids=embed,
                          order=order)  # fmt: skip
    assert tensor_record(inputs["pixel_values"].numpy()) == case["inputs"]["pixel_values"]
    marked = np.isin(rendered.token_ids, embed)
    covered = np.zeros(len(marked), dtype=bool)
    for _, _, placeholder in data.all_placeholders():
        covered[placeholder.embed_positions()] = True
    assert np.array_equal(covered, marked)


def test_the_goldens_cover_the_stress_shapes():
    """The cases the goldens hold: a 1x1 frame, both extreme aspects, sampling by count
    and by rate and off, two clips in a turn beside an image, a clip in a later turn."""
    shapes = [c[:3] for case in CASES for c in case["clips"]]
    assert (1, 1, 1) in shapes and (3, 4, 300) in shapes and (2, 300, 4) in shapes
    options = [case["options"] for case in CASES]
    assert {"fps": 2.0} in options and {"do_sample_frames": False} in options
    assert any("num_frames" in o for o in options)
    assert any(len(c["clips"]) > 1 and c.get("images") for c in CASES)
    assert any(c.get("later") for c in CASES)
    assert len(GOLDEN["cases"]) == len(CASES)


def test_the_settings_are_the_ones_its_video_processor_loads(internvl, tmp_path):
    """Without a video config, the image config's size, mean, std and resample (as
    ``AutoVideoProcessor`` reads them), the processor's tokens per tile per frame; a
    video config wins, and its ``initial_shift`` and sampling settings are read."""
    settings = load_video_settings(internvl, "internvl")
    assert settings.size == (32, 32) and settings.tokens_per_frame == 4
    assert settings.image_mean == (0.485, 0.456, 0.406) and settings.resample == 3
    assert settings.frames_as_images and not settings.do_sample_frames
    for name in ("config.json", "preprocessor_config.json", "processor_config.json"):
        (tmp_path / name).write_text((internvl / name).read_text())
    (tmp_path / "video_preprocessor_config.json").write_text(
        '{"video_processor_type": "InternVLVideoProcessor", "size": {"height": 64, "width": 48},'
        ' "initial_shift": 0, "num_frames": 3, "do_sample_frames": true}'
    )
    changed = load_video_settings(tmp_path, "internvl")
    assert changed.size == (64, 48) and changed.initial_shift == 0 and changed.num_frames == 3
    assert changed.image_mean == (0.48145466, 0.4578275, 0.40821073)  # the class's default


@pytest.mark.parametrize(
    "saved, message",
    [
        ('{"size": {"shortest_edge": 32}}', "not a height and a width"),
        ('{"size": {"height": 32, "width": 32}, "do_center_crop": true}', "do_center_crop"),
        ('{"initial_shift": "middle"}', "initial_shift"),
    ],
)
def test_settings_the_port_does_not_compute_are_refused_by_name(internvl, tmp_path, saved,
                                                                message):  # fmt: skip
    from vf_mm.errors import UnsupportedModelError

    for name in ("config.json", "preprocessor_config.json", "processor_config.json"):
        (tmp_path / name).write_text((internvl / name).read_text())
    (tmp_path / "video_preprocessor_config.json").write_text(saved)
    with pytest.raises(UnsupportedModelError, match=message):
        load_video_settings(tmp_path, "internvl")


def test_sampling_follows_its_sampler(internvl):
    """``torch.arange(shift, T, T / n).int()``: half a step in by default, or the given
    shift; by rate, ``int(T / clip_fps * fps)`` frames; every frame when sampling is off."""
    base = load_video_settings(internvl, "internvl")

    def kept(settings, total, fps=None):
        frames = clip(total, 4, 4)
        return expand_video(settings, frames, fps=fps, tokens=TOKENS).sampled.indices

    assert kept(base.with_options({"num_frames": 3}), 7) == (1, 3, 5)
    no_shift = dataclasses.replace(base.with_options({"num_frames": 4}), initial_shift=0)
    assert kept(no_shift, 10) == (0, 2, 5, 7)
    assert kept(base.with_options({"fps": 2.0}), 9, 6.0) == (1, 4, 7)
    assert kept(base, 4) == (0, 1, 2, 3)
    # a checkpoint's num_frames comes first in its sampler: a rate asked for would not apply
    counted = dataclasses.replace(base, num_frames=3)
    with pytest.raises(RenderError, match="give num_frames instead of fps"):
        counted.with_options({"fps": 2.0})
    assert kept(counted.with_options({"num_frames": 2}), 8) == (2, 6)


@pytest.mark.parametrize(
    "part, error, message",
    [
        (video(np.zeros((0, 8, 8, 3), np.uint8)), VideoError, "frame"),
        (video([np.zeros((8, 8, 3), np.uint8), np.zeros((9, 8, 3), np.uint8)]), VideoError,
         "same size"),
        (video(min_pixels=100), RenderError, "InternVL resizes every frame"),
        (video(do_sample_frames=True), RenderError, "samples by fps or num_frames"),
        (video(num_frames=9), RenderError,
         r"cannot sample 9 frames from a 5-frame clip .*num_frames of at most 5"),
        # a rate over the clip's: the message names the rate, not a count never given
        (video(fps=8.0, frame_rate=4.0), RenderError,
         r"cannot sample 10 frames .*fps 8.0 on a clip at 4.0 fps.*an fps of at most 4.0"),
        (video(fps=2.0), RenderError, "needs the clip's frame rate"),
        (video(fps=0.1, frame_rate=4.0), RenderError, "keeps no frame"),
        (video(initial_shift=0), RenderError, "unknown key"),
    ],
)  # fmt: skip
def test_mistakes_fail_by_name_with_the_part(renderer, part, error, message):
    with pytest.raises(error, match=message) as caught:
        renderer.render([{"role": "user", "content": [{"type": "text", "text": "Hi"}, part]}])
    assert "message 0, part 1" in str(caught.value)


def test_a_literal_video_placeholder_in_text_is_refused(renderer):
    """``<video>`` in a message's text would be expanded as a clip by the processor (it
    replaces every ``<video>``): refused by name, as the image placeholder is."""
    with pytest.raises(ReservedTokenError, match="<video>"):
        renderer.render([{"role": "user", "content": "Describe <video> please."}])


def test_clips_of_different_lengths_render_each_as_the_processor_does_alone(renderer):
    """transformers' processor stacks one call's clips (it fails on clips of different
    frame counts); vf_mm processes each clip alone, as the processor does a single clip,
    and the forward takes their frames in token order."""
    a, b = clip(3, seed=1), clip(5, seed=2)
    both = renderer.render([{"role": "user", "content": [video(a), video(b)]}])
    alone = [renderer.render([{"role": "user", "content": [video(x)]}]) for x in (a, b)]
    items = both.multi_modal_data.mm_items["video"]
    for item, single in zip(items, alone, strict=True):
        (want,) = single.multi_modal_data.mm_items["video"]
        assert np.array_equal(item["pixel_values"], want["pixel_values"])
    assert [i["pixel_values"].shape[0] for i in items] == [3, 5]


# -- torchvision tier: the port against the real class ----------------------------------


@pytest.mark.vllm
@pytest.mark.parametrize(
    "options",
    [
        {},
        {"do_sample_frames": True, "num_frames": 3},
        {"do_sample_frames": True, "num_frames": 4, "initial_shift": 0},
        {"do_sample_frames": True, "num_frames": 5, "initial_shift": 1.5},
        {"do_sample_frames": True, "fps": 3.0},
        {"size": {"height": 40, "width": 24}, "resample": 2},
        {"do_normalize": False},
        {"do_rescale": False, "do_normalize": False},
        {"image_mean": [0.1, 0.2, 0.3], "image_std": [0.3, 0.2, 0.1], "rescale_factor": 0.5},
    ],
)
def test_the_port_computes_the_video_processors_numbers_bit_for_bit(internvl, options):
    """For clips of every shape the goldens use and more (1 to 16 frames, 1x1 to 300x4),
    the frames kept and every value of ``pixel_values_videos`` equal
    ``InternVLVideoProcessor``'s with the same settings (given to the class here, read by
    vf_mm as a checkpoint's video config), and the text is ``replace_video_token``'s."""
    import tempfile

    pytest.importorskip("torchvision")
    from transformers import InternVLVideoProcessor

    from vf_mm.models import load_processor

    real = InternVLVideoProcessor.from_pretrained(internvl, **options)
    processor = load_processor(internvl, image_backend="pil")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp)
        for name in ("config.json", "preprocessor_config.json", "processor_config.json"):
            (path / name).write_text((internvl / name).read_text())
        real.save_pretrained(path)
        settings = load_video_settings(path, "internvl")
    shapes = [(1, 1, 1), (16, 4, 300), (7, 300, 4), (5, 33, 45), (12, 64, 48), (9, 32, 32)]
    for seed, (t, h, w) in enumerate(shapes):
        frames = clip(t, h, w, seed=seed)
        rate = 6.0
        metadata = {"total_num_frames": t, "fps": rate, "frames_indices": list(range(t))}
        call = dict(video_metadata=[metadata], input_data_format="channels_last",
                    return_metadata=True, return_tensors="pt")  # fmt: skip
        try:
            got = expand_video(settings, frames, fps=rate, tokens=TOKENS)
        except RenderError:  # too few frames for the count, or none at the rate
            with pytest.raises((ValueError, ZeroDivisionError)):
                real(frames, **call)
            continue
        want = real(frames, **call)
        pixels = want["pixel_values_videos"][0].numpy()
        ours = got.item["pixel_values"]
        assert ours.dtype == pixels.dtype and ours.shape == pixels.shape
        assert np.array_equal(ours, pixels), (seed, options)
        indices = want["video_metadata"][0].frames_indices
        assert list(got.sampled.indices) == [int(i) for i in indices]
        text = processor.replace_video_token({"pixel_values_videos": [pixels]}, 0)
        assert got.replacement == text


def test_vllm_embed_swaps_name_the_one_pair_vllm_writes_otherwise(renderer):
    """vLLM 0.32 (interns1.py) writes a clip's embedding positions with <video> where the
    renderer writes <IMG_CONTEXT>: the renderer names that pair for VLLMBackend, for clips
    only, and no other family names one."""
    from vf_mm.models import VISION_FAMILIES, family_info

    vocab = renderer.tokenizer.get_vocab()
    assert renderer.vision.vllm_embed_swaps("video") == {vocab["<video>"]: vocab["<IMG_CONTEXT>"]}
    assert renderer.vision.embed_ids("video") == (vocab["<IMG_CONTEXT>"],)
    assert renderer.vision.vllm_embed_swaps("image") == {}
    named = {f for f in VISION_FAMILIES if family_info(f).vllm_video_embed_token is not None}
    assert named == {"internvl"}
