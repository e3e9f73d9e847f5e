"""``vf_mm.models``' video processing, as a specification (what transformers' Qwen-VL video
processors do; the bit-for-bit comparison with them runs where torchvision imports, in
``tests/vllm/test_video_processing.py``)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from vf_mm.errors import RenderError
from vf_mm.models import (
    VIDEO_FAMILIES,
    expand_video,
    load_video_settings,
)
from vf_mm.models._internal import sample_frames
from vf_mm.testing import build_tiny_vlm

TOKENS = {"video_token": "<|video_pad|>", "vision_start_token": "<|vision_start|>",
          "vision_end_token": "<|vision_end|>"}  # fmt: skip


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("video-models")
    # (Gemma 4's video settings and port: tests/renderers/test_gemma4_video.py)
    return {f: build_tiny_vlm(root / f, f) for f in VIDEO_FAMILIES if f != "gemma4"}


def frames(t: int, h: int = 40, w: int = 56, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (t, h, w, 3), dtype=np.uint8)


def test_settings_come_from_the_files_transformers_reads(tiny):
    # Qwen2.5-VL ships no video config: the image config's sizes, Qwen2-VL's video processor
    qwen25 = load_video_settings(tiny["qwen2_5_vl"], "qwen2_5_vl")
    image = json.loads((tiny["qwen2_5_vl"] / "preprocessor_config.json").read_text())
    assert qwen25.style == "qwen2" and not qwen25.do_sample_frames and qwen25.second_per_grid_ts
    assert (qwen25.min_pixels, qwen25.max_pixels) == (
        image["size"]["shortest_edge"], image["size"]["longest_edge"])  # fmt: skip
    # Qwen3-VL ships one: its own video processor, 2 fps sampling, timestamps in the text
    qwen3 = load_video_settings(tiny["qwen3_vl"], "qwen3_vl")
    assert qwen3.style == "qwen3" and qwen3.do_sample_frames and qwen3.fps == 2
    assert qwen3.timestamps and not qwen3.second_per_grid_ts
    assert load_video_settings(tiny["qwen3_vl"], "gemma3") is None


def test_a_nested_video_processor_config_wins(tiny, tmp_path):
    path = tiny["qwen2_vl"]
    config = json.loads((path / "processor_config.json").read_text())
    config["video_processor"] = {"video_processor_type": "Qwen3VLVideoProcessor",
                                 "size": {"shortest_edge": 100, "longest_edge": 5000}}  # fmt: skip
    for f in path.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    (tmp_path / "processor_config.json").write_text(json.dumps(config))
    settings = load_video_settings(tmp_path, "qwen2_vl")
    assert settings.style == "qwen3" and (settings.min_pixels, settings.max_pixels) == (100, 5000)
    assert not settings.timestamps  # the text is the Qwen2-VL processor's


@pytest.mark.parametrize(
    ("options", "message"),
    [({"fsp": 2}, "unknown video option"), ({"fps": 2, "num_frames": 4}, "both given"), ({"fps": float("inf")}, "finite"),
     ({"min_pixels": float("nan")}, "finite"),
     ({"fps": -1}, "positive"), ({"num_frames": 2.5}, "whole number"),
     ({"fps": True}, "positive"), ({"do_sample_frames": "yes"}, "bool"),
     # a count or rate that sampling turned off would ignore (transformers ignores it)
     ({"num_frames": 4, "do_sample_frames": False}, "num_frames would change nothing"),
     ({"fps": 2, "do_sample_frames": False}, "fps would change nothing")],
)  # fmt: skip
def test_bad_options_are_refused_by_name(tiny, options, message):
    settings = load_video_settings(tiny["qwen2_vl"], "qwen2_vl")
    with pytest.raises(RenderError, match=message):
        settings.with_options(options)


def test_sampling_off_beside_a_rate_is_refused_before_a_familys_own_rate_rule(tiny):
    """InternVL refuses a rate without num_frames (its sampler reads the count); with
    do_sample_frames=False too, the message that fits is the one about sampling off
    (following InternVL's would then hit it)."""
    import dataclasses

    settings = dataclasses.replace(load_video_settings(tiny["internvl"], "internvl"), num_frames=8)
    with pytest.raises(RenderError, match="fps would change nothing"):
        settings.with_options({"fps": 2, "do_sample_frames": False})
    with pytest.raises(RenderError, match="give num_frames instead of fps"):
        settings.with_options({"fps": 2})


def test_asking_for_a_rate_or_a_count_turns_sampling_on(tiny):
    settings = load_video_settings(tiny["qwen2_vl"], "qwen2_vl")
    assert settings.with_options({"fps": 2}).do_sample_frames
    assert settings.with_options({"num_frames": 4}).do_sample_frames
    assert not settings.with_options({"do_sample_frames": False}).do_sample_frames


def test_qwen2_sampling(tiny):
    settings = load_video_settings(tiny["qwen2_vl"], "qwen2_vl")
    assert sample_frames(settings, 10, None).indices == tuple(range(10))  # no sampling by default
    # a count is rounded to whole temporal patches (Python's round: 5 frames are 2.5
    # patches, rounded to 2), then spread with arange
    assert sample_frames(settings.with_options({"num_frames": 6}), 12, None).indices == (0, 2, 4, 6, 8, 10)  # fmt: skip
    assert sample_frames(settings.with_options({"num_frames": 5}), 12, None).indices == (0, 3, 6, 9)  # fmt: skip
    with pytest.raises(RenderError, match="frame rate"):  # a rate needs the clip's rate
        sample_frames(settings.with_options({"fps": 2}), 12, None)
    with pytest.raises(RenderError, match=r"num_frames is 20 .*num_frames of at most 12"):
        sample_frames(settings.with_options({"num_frames": 20}), 12, 6.0)
    # arange's float step can reach the clip's end (58 of 59 frames at 1 fps picks frame
    # 59): transformers fails there with an IndexError, and vf_mm refuses it by name
    with pytest.raises(RenderError, match=r"picks frame 59 of a 59-frame clip"):
        sample_frames(settings.with_options({"fps": 1}), 59, 1.0)


def test_qwen3_sampling_takes_an_unknown_rate_as_24_fps(tiny):
    settings = load_video_settings(tiny["qwen3_vl"], "qwen3_vl")
    sampled = sample_frames(settings, 48, None)  # 2 s at 24 fps, sampled at 2 fps: 4 frames
    assert (sampled.fps, sampled.indices) == (24.0, (0, 16, 31, 47))
    assert sample_frames(settings, 48, 12.0).indices == tuple(np.linspace(0, 47, 8).round().astype(int))  # fmt: skip


def test_the_inputs_and_text_of_a_qwen2_clip(tiny):
    settings = load_video_settings(tiny["qwen2_5_vl"], "qwen2_5_vl")
    out = expand_video(settings, frames(5), fps=10.0, tokens=TOKENS)
    t, h, w = out.item["video_grid_thw"][0]
    assert t == 3  # 5 frames padded to 6 by repeating the last, 2 per temporal patch
    assert out.item["pixel_values_videos"].shape == (t * h * w, 3 * 2 * 14 * 14)
    assert out.item["pixel_values_videos"].dtype == np.float32
    assert out.replacement == "<|video_pad|>" * (t * h * w // 4)
    assert out.item["second_per_grid_ts"].tolist() == [pytest.approx(0.2)]  # 2 frames at 10 fps


def test_the_text_of_a_qwen3_clip_holds_each_groups_time(tiny):
    settings = load_video_settings(tiny["qwen3_vl"], "qwen3_vl").with_options({"num_frames": 4})
    out = expand_video(settings, frames(8), fps=2.0, tokens=TOKENS)
    # frames 0, 2, 5, 7 at 2 fps: groups (0 s, 1 s) and (2.5 s, 3.5 s)
    assert out.replacement.startswith("<0.5 seconds><|vision_start|><|video_pad|>")
    assert "<3.0 seconds><|vision_start|>" in out.replacement
    assert out.replacement.endswith("<|vision_end|>")


def test_a_repeated_frame_and_a_copied_clip_give_the_same_inputs(tiny):
    settings = load_video_settings(tiny["qwen2_vl"], "qwen2_vl")
    clip = frames(4)
    a = expand_video(settings, clip, fps=None, tokens=TOKENS)
    b = expand_video(settings, clip.copy(), fps=None, tokens=TOKENS)
    assert np.array_equal(a.item["pixel_values_videos"], b.item["pixel_values_videos"])
    assert clip.flags.writeable  # the caller's frames are not touched


@pytest.mark.parametrize("bad", [np.zeros((4, 8, 8), np.uint8), np.zeros((4, 8, 8, 3), np.float32),
                                 np.zeros((4, 3, 8, 8), np.uint8)])  # fmt: skip
def test_frames_that_are_not_t_h_w_3_uint8_are_refused(tiny, bad):
    settings = load_video_settings(tiny["qwen2_vl"], "qwen2_vl")
    with pytest.raises(RenderError, match=r"\(T, H, W, 3\) uint8"):
        expand_video(settings, bad, fps=None, tokens=TOKENS)


def test_an_extreme_aspect_ratio_is_refused_as_the_processor_refuses_it(tiny):
    settings = load_video_settings(tiny["qwen2_vl"], "qwen2_vl")
    with pytest.raises(RenderError, match="aspect ratio"):
        expand_video(settings, frames(2, h=2, w=500), fps=None, tokens=TOKENS)


def test_smolvlm_settings_follow_its_processors_init(tiny, tmp_path):
    """``video_sampling`` sets the rate, the frame cap and the first resize; the image
    config's ``size`` replaces its ``video_size``; ``max_image_size`` is the final square."""
    smol = load_video_settings(tiny["smolvlm"], "smolvlm")
    assert smol.style == "smol" and smol.frames_as_images and smol.do_sample_frames
    assert (smol.fps, smol.num_frames, smol.longest_edge, smol.size) == (1, 64, 192, (64, 64))
    assert smol.resample == 1 and smol.chat_template and smol.tokens_per_frame == 4
    path = tmp_path / "m"
    path.mkdir()
    for name in ("preprocessor_config.json", "processor_config.json"):
        (path / name).write_text((tiny["smolvlm"] / name).read_text())
    config = json.loads((path / "preprocessor_config.json").read_text())
    config["size"] = {"longest_edge": 256}
    config["video_sampling"] = {"fps": 3, "max_frames": 8, "video_size": {"longest_edge": 99}}
    (path / "preprocessor_config.json").write_text(json.dumps(config))
    changed = load_video_settings(path, "smolvlm")
    assert (changed.fps, changed.num_frames, changed.longest_edge) == (3, 8, 256)


def test_smolvlm_frames_are_images_in_token_order(tiny):
    """A SmolVLM forward fills its image tokens from one sequence: a clip's frames join the
    images' tiles in the order their tokens appear, and a batch holding both needs that
    order."""
    from vf_mm.models import model_inputs

    def item(value: float, count: int) -> dict:
        return {"pixel_values": np.full((1, count, 3, 4, 4), value, np.float32),
                "pixel_attention_mask": np.ones((1, count, 4, 4), np.int64)}  # fmt: skip

    import torch

    ids = torch.zeros((1, 4), dtype=torch.long)
    image, clip = item(1.0, 2), item(2.0, 3)
    out = model_inputs("smolvlm", ids, [image], image_token_ids=[7], videos=[clip],
                       video_token_ids=[7], order=["video", "image"])  # fmt: skip
    assert out["pixel_values"].shape == (1, 5, 3, 4, 4)
    assert out["pixel_values"][0, :, 0, 0, 0].tolist() == [2.0, 2.0, 2.0, 1.0, 1.0]
    with pytest.raises(ValueError, match="order="):
        model_inputs("smolvlm", ids, [image], image_token_ids=[7], videos=[clip],
                     video_token_ids=[7])  # fmt: skip
    only = model_inputs("smolvlm", ids, [], image_token_ids=[7], videos=[clip], video_token_ids=[7])
    assert only["pixel_values"].shape == (1, 3, 3, 4, 4)


def test_the_text_of_a_smolvlm_clip_is_its_processors(tiny):
    """The words SmolVLMProcessor writes for a clip (checked against it in the vllm tier):
    the frame count in words, the duration, and each kept frame's mm:ss before its image
    tokens; 30 frames at 10 fps keep frames 0, 14 and 29 at the checkpoint's 1 fps."""
    smol = load_video_settings(tiny["smolvlm"], "smolvlm")
    tokens = {"video_token": "<video>", "image_token": "<image>",
              "fake_image_token": "<fake_token_around_image>", "global_image_token": "<global-img>"}  # fmt: skip
    out = expand_video(smol, frames(30), fps=10.0, tokens=tokens)
    frame = "<fake_token_around_image><global-img>" + "<image>" * 4 + "<fake_token_around_image>"
    assert out.sampled.indices == (0, 14, 29)
    assert out.replacement == (
        "You are provided the following series of three frames from a 0:00:03 [H:MM:SS] "
        "video.\n" + "".join(f"\nFrame from 00:0{s}:{frame}" for s in (0, 1, 2)) + "\n\n"
    )
