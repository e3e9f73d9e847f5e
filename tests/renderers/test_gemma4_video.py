"""Gemma 4's video: rendered where every template revision writes it, exact against
transformers' own processor, and its mistakes refused by name.

The default tier has no torchvision, which ``Gemma4VideoProcessor`` needs: vf_mm's
torch-only port (``vf_mm/models/_gemma4_video.py``) is held to goldens the real processor
wrote (``golden/gemma4_video.json``, by ``golden/gemma4_video.py``: token ids and every
model input's bytes, over five template revisions and the 31B one). The forward taking
the clips, and the trainer's logprobs equal to the sampler's, are held in
``tests/training/test_video_training.py`` with the other video families. Where torchvision
imports (``dev.py torchvision``), the ``vllm``-marked tests compare the port with the
real class directly, bit for bit, on more clips and options.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.renderers._video_golden import assert_renders_the_clip_golden
from tests.renderers.golden.gemma4_video import (
    CASES,
    INPUTS,
    clip_digest,
    conversation,
    parts_of,
    real_processor,
    reference,
    tensor_record,
)
from tests.renderers.test_gemma4 import TOOLS, sampled
from vf_mm.errors import RenderError, UnsupportedModelError
from vf_mm.models import expand_video, load_video_settings
from vf_mm.renderers import load_renderer

GOLDEN = json.loads((Path(__file__).parent / "golden" / "gemma4_video.json").read_text())


@pytest.fixture(scope="module")
def variant_paths(gemma4_variants):
    """A tiny Gemma 4 checkpoint per template revision (the session's, conftest.py)."""
    return gemma4_variants


@pytest.fixture(scope="module")
def renderer_of(variant_paths):
    cache: dict[str, Any] = {}

    def get(variant: str = "8995379") -> Any:
        if variant not in cache:
            cache[variant] = load_renderer(variant_paths(variant), image_backend="pil")
        return cache[variant]

    return get


def clip(seed: int, t: int = 4, h: int = 30, w: int = 40) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (t, h, w, 3), dtype=np.uint8)


def ask(*parts: Any) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [*parts, {"type": "text", "text": "What moved?"}]}]


@pytest.mark.parametrize("case", list(CASES))
def test_clips_render_as_the_real_processor_wrote_them(renderer_of, case):
    """Token ids, and every model input's shape, dtype and bytes (``mm_token_type_ids``
    too), equal what transformers' ``Gemma4Processor`` with its video processor made of
    the same conversation; each clip's placeholder covers exactly its ``<|video|>``
    tokens (the timestamps and markers between its frames are text)."""
    golden = GOLDEN["cases"][case]
    messages = conversation(case)
    assert [clip_digest(v["video"]) for v in parts_of(messages, "video")] == golden["clips"]
    renderer = renderer_of(CASES[case][0])
    assert_renders_the_clip_golden(renderer, "gemma4", messages, golden, inputs=INPUTS)


def test_a_clip_in_a_tool_result_is_refused_where_the_template_drops_it(renderer_of):
    """b446025 and 6b7e72c write only a tool result's text: a clip there would vanish."""
    messages = conversation("tool-result")
    assert renderer_of("905e84b").render(messages).multi_modal_data.num_items("video") == 2
    for variant in ("b446025", "6b7e72c"):
        with pytest.raises(RenderError, match=r"message 2 \(tool\).*drops from tool results"):
            renderer_of(variant).render(messages)


@pytest.mark.parametrize("variant", ["4742fe8", "905e84b", "8995379", "31b"])
def test_a_clip_in_the_system_message_is_refused_as_every_template_drops_it(renderer_of, variant):
    video = {"type": "video", "video": clip(6), "do_sample_frames": False}
    messages = [{"role": "system", "content": ["Watch.", video]}, *ask("Go.")]
    # (at 4742fe8 and b446025 a system message of parts is refused before its clip is seen)
    with pytest.raises(RenderError, match=r"message 0 \(system\) (holds|is a list of parts)"):
        renderer_of(variant).render(messages)


def test_a_later_turns_clip_bridges_equal_to_a_full_render(renderer_of):
    renderer = renderer_of("8995379")
    first = ask({"type": "video", "video": clip(1), "frame_rate": 2.0, "num_frames": 2})
    later = ask({"type": "video", "video": clip(2, t=3), "do_sample_frames": False})
    prompt = renderer.render(first)
    reply = renderer.tokenizer("A ball.", add_special_tokens=False)["input_ids"]
    completion = [*reply, renderer.stop_token_ids[0]]
    history = [*first, {"role": "assistant", "content": "A ball."}]
    bridged = renderer.bridge_to_next_turn(
        prompt.token_ids, completion, later,
        previous_multi_modal_data=prompt.multi_modal_data, previous_messages=history,
    )  # fmt: skip
    full = renderer.render([*history, *later])
    assert bridged is not None
    assert bridged.token_ids == full.token_ids
    assert bridged.multi_modal_data.mm_placeholders == full.multi_modal_data.mm_placeholders
    for a, b in zip(
        bridged.multi_modal_data.mm_items["video"],
        full.multi_modal_data.mm_items["video"],
        strict=True,
    ):
        assert all(np.array_equal(a[k], b[k]) for k in b)


@pytest.mark.parametrize("variant", ["905e84b", "8995379"])
def test_a_clip_in_a_tool_result_bridges_to_a_full_render(renderer_of, variant):
    """A call stopped at <|tool_response>, then a result holding a clip: the bridge
    equals a full render, the clip's inputs included."""
    renderer = renderer_of(variant)
    messages = ask({"type": "video", "video": clip(7), "num_frames": 2})
    text = renderer.format_tool_calls([("zoom", {"x": 2})])
    result = {"role": "tool", "tool_call_id": "call_0", "name": "zoom",
              "content": [{"type": "video", "video": clip(8, t=3), "frame_rate": 1.0,
                           "do_sample_frames": False}, "zoomed"]}  # fmt: skip
    bridged, full, _ = sampled(renderer, messages, text, "<|tool_response>", [result],
                               tools=TOOLS)  # fmt: skip
    assert bridged is not None, dict(renderer.bridge_refusals)
    assert bridged.token_ids == full.token_ids
    assert bridged.multi_modal_data.mm_placeholders == full.multi_modal_data.mm_placeholders
    assert full.multi_modal_data.num_items("video") == 2
    for a, b in zip(bridged.multi_modal_data.mm_items["video"],
                    full.multi_modal_data.mm_items["video"], strict=True):  # fmt: skip
        assert all(np.array_equal(a[k], b[k]) for k in b)


@pytest.mark.parametrize(
    ("part", "error"),
    [
        # the checkpoint samples 32 frames: a shorter clip needs num_frames or no sampling
        # the message says the 32 is the checkpoint's, and how to ask for fewer or none
        ({"video": clip(3)}, r"cannot sample 32 frames from a 4-frame clip \(num_frames is 32 "
         r"\(the part's, else the checkpoint's default\)\): give the video part num_frames of "
         r"at most 4, or do_sample_frames=False"),
        ({"video": clip(3), "num_frames": 9}, r"cannot sample 9 frames"),
        ({"video": clip(3), "fps": 2.0, "frame_rate": 4.0}, r"fps or by num_frames, not both.*fps=2.0 and num_frames=32"),
        ({"video": clip(3), "min_pixels": 1000}, r"soft-token budget.*min_pixels"),
        ({"video": clip(3), "max_soft_tokens": 280}, r"unknown key 'max_soft_tokens'"),
        ({"video": clip(3)[:0]}, r"(?i)no frames|at least one frame|empty"),
        ({"video": [clip(3, t=1)[0], clip(4, t=1, h=20)[0]], "do_sample_frames": False},
         r"(?i)frame 1.*size|sizes differ|same size"),
    ],
    ids=["too-few-frames", "num-frames-over", "fps", "min-pixels", "budget-option",
         "zero-frames", "ragged-frames"],
)  # fmt: skip
def test_the_mistakes_users_make_are_refused_by_name(renderer_of, part, error):
    with pytest.raises((RenderError, ValueError), match=error) as info:
        renderer_of().render(ask({"type": "video", **part}))
    assert "message 0, part 0" in str(info.value) or "message 0" in str(info.value)


def test_a_checkpoint_with_a_budget_the_processor_refuses_is_refused(variant_paths, tmp_path):
    path = Path(shutil.copytree(variant_paths("8995379"), tmp_path / "m"))
    config = json.loads((path / "processor_config.json").read_text())
    config["video_processor"]["max_soft_tokens"] = 100
    (path / "processor_config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedModelError, match=r"max_soft_tokens is 100.*\(70, 140"):
        load_video_settings(path, "gemma4")


def test_a_checkpoint_that_samples_by_rate_and_count_is_refused_when_it_loads(
    variant_paths, tmp_path
):
    """Its sampler refuses the pair on every clip, and a part cannot unset the
    checkpoint's: refused once, at load, naming the section to fix."""
    path = Path(shutil.copytree(variant_paths("8995379"), tmp_path / "m"))
    config = json.loads((path / "processor_config.json").read_text())
    config["video_processor"].update(fps=2.0, num_frames=8, do_sample_frames=True)
    (path / "processor_config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedModelError, match=r"fps=2.0 and num_frames=8.*remove one"):
        load_video_settings(path, "gemma4")
    config["video_processor"]["do_sample_frames"] = False  # nothing is sampled: loads
    (path / "processor_config.json").write_text(json.dumps(config))
    assert load_video_settings(path, "gemma4").num_frames == 8


def test_the_budget_and_sampling_are_read_from_the_checkpoint(variant_paths, tmp_path):
    """The ``video_processor`` section's settings are the ones applied: a budget of 140
    soft tokens gives frames of up to 140 tokens and 1260 patches; 3 frames by default."""
    path = Path(shutil.copytree(variant_paths("8995379"), tmp_path / "m"))
    config = json.loads((path / "processor_config.json").read_text())
    config["video_processor"].update(max_soft_tokens=140, num_frames=3)
    (path / "processor_config.json").write_text(json.dumps(config))
    settings = load_video_settings(path, "gemma4")
    tokens = {"video_token": "<|video|>", "boi_token": "<|image>", "eoi_token": "<image|>"}
    out = expand_video(settings, clip(5, t=6, h=48, w=48), fps=3.0, tokens=tokens)
    assert out.sampled.indices == (0, 2, 4)
    assert out.item["pixel_values_videos"].shape == (3, 1260, 768)
    assert out.replacement.startswith("00:00 <|image>" + "<|video|>" * 121 + "<image|> 00:00 ")


def test_a_checkpoint_without_a_frame_count_samples_by_rate(variant_paths, tmp_path):
    """With ``num_frames`` null and ``fps`` set in its video config, the checkpoint
    samples by rate (``int(T / clip rate * fps)`` frames), a part's ``fps`` replaces it,
    and a part's ``num_frames`` beside the checkpoint's rate is refused as the pair."""
    path = Path(shutil.copytree(variant_paths("8995379"), tmp_path / "m"))
    config = json.loads((path / "processor_config.json").read_text())
    config["video_processor"].update(num_frames=None, fps=1.0)
    (path / "processor_config.json").write_text(json.dumps(config))
    settings = load_video_settings(path, "gemma4")
    tokens = {"video_token": "<|video|>", "boi_token": "<|image>", "eoi_token": "<image|>"}
    frames = clip(8, t=12, h=16, w=16)
    assert expand_video(settings, frames, fps=4.0, tokens=tokens).sampled.indices == (0, 4, 8)
    faster = settings.with_options({"fps": 2.0})
    assert expand_video(faster, frames, fps=4.0, tokens=tokens).sampled.indices == tuple(
        range(0, 12, 2)
    )
    with pytest.raises(RenderError, match=r"not both.*fps=1.0 and num_frames=3"):
        expand_video(settings.with_options({"num_frames": 3}), frames, fps=4.0, tokens=tokens)


# -- where torchvision imports: the port against transformers' own class, bit for bit ------

# (frames, height, width, frame rate, options): odd counts, 1x1 to 640x480 and extreme
# aspects, sampling off, by count and by the checkpoint's default, resize off
PORT_CLIPS = [
    (1, 1, 1, None, {"do_sample_frames": False}),
    (3, 97, 201, 10.0, {"do_sample_frames": False}),
    (7, 64, 48, None, {"num_frames": 7}),
    (9, 333, 120, 30.0, {"num_frames": 4}),
    (33, 20, 30, 24.0, {}),
    (5, 36, 1000, 8.0, {"num_frames": 2}),
    (4, 1000, 36, None, {"num_frames": 3}),
    (2, 480, 640, 25.0, {"do_sample_frames": False}),
    (3, 48, 96, 2.0, {"do_sample_frames": False, "do_resize": False}),
    (6, 40, 40, 8.0, {"num_frames": 8}),  # more than the clip: refused by both
    (8, 40, 40, 8.0, {"fps": 2.0}),  # a rate beside the checkpoint's count: refused by both
]


@pytest.mark.vllm
@pytest.mark.parametrize("clip_spec", PORT_CLIPS, ids=lambda c: f"{c[0]}x{c[1]}x{c[2]}-{c[4]}")
def test_the_port_computes_the_video_processors_numbers_bit_for_bit(variant_paths, clip_spec):
    """The same ids (timestamps, markers, soft tokens) and every tensor's bytes as
    ``processor(text="<|video|>", videos=[frames], video_metadata=...)``; where the
    processor refuses the clip, vf_mm refuses it by name."""
    import dataclasses

    pytest.importorskip("torchvision")
    from transformers import AutoProcessor

    frames_count, height, width, rate, options = clip_spec
    path = variant_paths("8995379")
    processor = AutoProcessor.from_pretrained(path)
    assert type(processor.video_processor).__name__ == "Gemma4VideoProcessor"
    frames = clip(frames_count * 1000 + height, t=frames_count, h=height, w=width)
    metadata = {"total_num_frames": frames_count, "fps": rate,
                "frames_indices": list(range(frames_count))}  # fmt: skip
    settings = load_video_settings(path, "gemma4")
    part_options = {k: v for k, v in options.items() if k != "do_resize"}
    settings = dataclasses.replace(
        settings.with_options(part_options), do_resize=options.get("do_resize", True)
    )
    tokens = {"video_token": processor.video_token, "boi_token": processor.boi_token,
              "eoi_token": processor.eoi_token}  # fmt: skip
    try:
        want = processor(text=["<|video|>"], videos=[frames], video_metadata=[metadata],
                         input_data_format="channels_last", return_tensors="np", **options)  # fmt: skip
    except ValueError as exc:
        with pytest.raises(RenderError):
            expand_video(settings, frames, fps=rate, tokens=tokens)
        assert str(exc)
        return
    got = expand_video(settings, frames, fps=rate, tokens=tokens)
    ids = processor.tokenizer(got.replacement, add_special_tokens=False)["input_ids"]
    assert ids == want["input_ids"][0].tolist()
    for key in ("pixel_values_videos", "video_position_ids", "num_frames_per_video"):
        a, b = np.asarray(want[key]), got.item[key]
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b), key


@pytest.mark.vllm
@pytest.mark.parametrize("case", list(CASES))
def test_the_goldens_are_what_the_real_processor_writes_here(variant_paths, case):
    """The goldens the default tier holds the port to still are transformers' output
    (token ids and every input's bytes) under this environment's transformers."""
    pytest.importorskip("torchvision")
    golden = GOLDEN["cases"][case]
    ref = reference(real_processor(variant_paths(CASES[case][0])), case)
    assert ref["input_ids"][0].tolist() == golden["input_ids"]
    assert {k: tensor_record(ref[k]) for k in INPUTS if k in ref} == golden["inputs"]
