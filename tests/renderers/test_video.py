"""Rendering video: clips in user, environment and tool turns, beside images, bridged onto
earlier turns, each processed once. (Exactness against transformers' processors, which
need torchvision, is checked in ``tests/vllm/test_video_processing.py``.)"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from PIL import Image

from vf_mm.errors import RenderError, VideoError
from vf_mm.models import VIDEO_FAMILIES, family_info, load_processor
from vf_mm.renderers import load_renderer
from vf_mm.testing import build_tiny_vlm

# Gemma 4's clips are tested in test_gemma4_video.py (against its real processor's goldens,
# at each template revision): its checkpoint samples 32 frames, more than these clips hold.
# Kimi-K2.5's in test_kimi_k25_video.py: its chunks of up to 4 frames take one frame's tokens;
# GLM-4.6V's in test_glm46v_video.py: its sampler picks its own rate (num_frames refused)
FAMILIES = tuple(f for f in VIDEO_FAMILIES if f not in ("gemma4", "kimi_k25", "glm46v"))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("video-render")
    return {f: build_tiny_vlm(root / f, f) for f in (*FAMILIES, "gemma3")}


def clip(seed: int, t: int = 6, h: int = 42, w: int = 56) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (t, h, w, 3), dtype=np.uint8)


def video(seed: int, **keys) -> dict:
    return {"type": "video", "video": clip(seed), "frame_rate": 4.0, **keys}


def conversation() -> list[dict]:
    picture = Image.fromarray(clip(9, t=1)[0])
    return [
        {"role": "user", "content": [video(1), {"type": "image", "image": picture},
                                     {"type": "text", "text": "What moved?"}]},
        {"role": "assistant", "content": "The ball."},
        {"role": "user", "content": [{"type": "text", "text": "Slower:"}, video(2, num_frames=4)]},
    ]  # fmt: skip


@pytest.mark.parametrize("family", FAMILIES)
def test_videos_and_images_get_their_placeholders_in_order(tiny, family):
    renderer = load_renderer(tiny[family])
    out = renderer.render(conversation())
    data = out.multi_modal_data
    data.validate(len(out.token_ids))
    assert data.num_items("video") == 2 and data.num_items("image") == 1
    # the order the template writes them: LLaVA-OneVision writes a message's images first
    first = ["image", "video"] if family == "llava_onevision" else ["video", "image"]
    assert [m for m, _, _ in data.all_placeholders()] == [*first, "video"]
    ids = np.asarray(out.token_ids)
    (video_token,) = renderer.vision.embed_ids("video")
    for r in data.mm_placeholders["video"]:
        assert np.all(ids[r.embed_positions()] == video_token)
    # SmolVLM and InternVL take a clip's frames as images: they share the image token
    sharing = ("video", "image") if family in ("smolvlm", "internvl") else ("video",)
    assert int((ids == video_token).sum()) == sum(
        r.num_embeds for m in sharing for r in data.mm_placeholders[m]
    )
    for item in data.mm_items["video"]:
        assert set(item) == set(family_info(family).video_inputs)
        assert not any(array.flags.writeable for array in item.values())


# Qwen3.5's and Qwen3-VL's (Thinking) templates are not prefix-stable across a new user
# turn (the generation prompt opens a think block that the history drops), with or
# without video: tests/renderers/test_bridge.py holds that they refuse it by name
@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "smolvlm", "internvl"])
def test_bridging_a_new_clip_equals_a_full_render(tiny, family):
    renderer = load_renderer(tiny[family])
    messages = conversation()
    prompt = renderer.render(messages[:1])
    lead = " " if family == "smolvlm" else ""  # SmolVLM's model writes the space itself
    reply = renderer.tokenizer(lead + "The ball.", add_special_tokens=False)["input_ids"]
    completion = [*reply, renderer.stop_token_ids[0]]
    bridged = renderer.bridge_to_next_turn(
        prompt.token_ids, completion, messages[2:],
        previous_multi_modal_data=prompt.multi_modal_data, previous_messages=messages[:2],
    )  # fmt: skip
    assert bridged is not None, dict(renderer.bridge_refusals)
    full = renderer.render(messages)
    assert bridged.token_ids == full.token_ids
    assert bridged.multi_modal_data.mm_hashes == full.multi_modal_data.mm_hashes
    assert bridged.multi_modal_data.mm_placeholders == full.multi_modal_data.mm_placeholders


def test_a_bridge_without_the_previous_videos_data_is_refused(tiny):
    renderer = load_renderer(tiny["qwen2_5_vl"])
    messages = conversation()
    prompt = renderer.render(messages[:1])
    completion = [*renderer.tokenizer("x", add_special_tokens=False)["input_ids"],
                  renderer.stop_token_ids[0]]  # fmt: skip
    data = prompt.multi_modal_data
    only_images = type(data)(
        mm_hashes={"image": data.mm_hashes["image"]},
        mm_placeholders={"image": data.mm_placeholders["image"]},
        mm_items={"image": data.mm_items["image"]},
    )
    out = renderer.bridge_to_next_turn(prompt.token_ids, completion, messages[2:],
                                       previous_multi_modal_data=only_images)  # fmt: skip
    assert out is None
    assert any("video tokens" in reason for reason in renderer.bridge_refusals)


def test_a_clip_is_processed_once_and_its_options_are_part_of_its_hash(tiny):
    renderer = load_renderer(tiny["qwen2_vl"])
    messages = [{"role": "user", "content": [video(1), video(1), video(1, num_frames=2)]}]
    out = renderer.render(messages)
    hashes = out.multi_modal_data.mm_hashes["video"]
    assert hashes[0] == hashes[1] != hashes[2]  # one clip, two processings
    assert renderer.vision.misses == 2
    renderer.render(messages)
    assert renderer.vision.misses == 2  # every item came from the cache


def test_a_tool_result_may_hold_a_clip(tiny):
    renderer = load_renderer(tiny["qwen2_5_vl"])
    call = {"id": "c1", "type": "function", "function": {"name": "replay", "arguments": "{}"}}
    messages = [
        {"role": "user", "content": "Look."},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": [video(3)]},
    ]
    out = renderer.render(messages)
    assert out.multi_modal_data.num_items("video") == 1


def test_a_family_without_video_refuses_a_clip_by_name(tiny):
    renderer = load_renderer(tiny["gemma3"], image_backend="pil")
    with pytest.raises(RenderError, match="video"):
        renderer.render([{"role": "user", "content": [video(1)]}])


def test_a_renderer_from_a_loaded_processor_says_video_needs_the_checkpoint(tiny):
    renderer = load_renderer(load_processor(tiny["qwen2_vl"], image_backend="pil"))
    with pytest.raises(RenderError, match="checkpoint directory"):
        renderer.render([{"role": "user", "content": [video(1)]}])


def test_a_literal_video_pad_in_text_is_refused(tiny):
    renderer = load_renderer(tiny["qwen2_5_vl"])
    with pytest.raises(RenderError, match="literally"):
        renderer.render([{"role": "user", "content": "see <|video_pad|> here"}])


def test_bad_clips_fail_with_errors_that_name_them(tiny):
    renderer = load_renderer(tiny["qwen2_vl"])
    with pytest.raises(VideoError, match="message 0, part 0"):
        renderer.render([{"role": "user", "content": [
            {"type": "video", "video": np.zeros((4, 8, 8, 3), np.float32)}]}])  # fmt: skip
    with pytest.raises(RenderError, match="unknown key 'num_frame'"):  # a typo is not ignored
        renderer.render([{"role": "user", "content": [video(1, num_frame=3)]}])
    with pytest.raises(RenderError, match="both given"):
        renderer.render([{"role": "user", "content": [video(1, fps=2.0, num_frames=4)]}])


def test_option_errors_and_a_one_frame_qwen3_clip_name_the_part(tiny):
    qwen2 = load_renderer(tiny["qwen2_vl"])
    with pytest.raises(RenderError, match=r"message 0, part 1: cannot sample 100 frames"):
        qwen2.render([{"role": "user", "content": ["x", video(1, num_frames=100)]}])
    qwen3 = load_renderer(tiny["qwen3_vl"])
    one = {"type": "video", "video": clip(1, t=1), "frame_rate": 4.0}
    with pytest.raises(RenderError, match=r"message 0, part 0: .*1 frame\(s\).*at least 2"):
        qwen3.render([{"role": "user", "content": [one]}])
    # asking for two frames repeats the one (Qwen3-VL's linspace sampling does)
    out = qwen3.render([{"role": "user", "content": [{**one, "num_frames": 2}]}])
    assert out.multi_modal_data.mm_items["video"][0]["video_grid_thw"][0][0] == 1


def test_a_bad_clip_in_a_bridged_turn_names_its_place_in_the_conversation(tiny):
    renderer = load_renderer(tiny["qwen2_5_vl"])
    messages = conversation()
    prompt = renderer.render(messages[:1])
    completion = [*renderer.tokenizer("x", add_special_tokens=False)["input_ids"],
                  renderer.stop_token_ids[0]]  # fmt: skip
    previous = [messages[0], {"role": "assistant", "content": "x"}]
    bad = [{"role": "user", "content": ["again:", {"type": "video", "video": "missing.mp4"}]}]
    with pytest.raises(VideoError, match=r"message 2, part 1"):
        renderer.bridge_to_next_turn(prompt.token_ids, completion, bad,
                                     previous_multi_modal_data=prompt.multi_modal_data,
                                     previous_messages=previous)  # fmt: skip


def test_smolvlm_renders_a_conversation_holding_a_clip_with_its_processors_template(tiny, tmp_path):
    """SmolVLM's processor renders any conversation that holds a clip with its own default
    template: a checkpoint template that differs is used only for conversations without
    one, and a bridge onto the first clip (the template switches under the earlier
    turns) is refused rather than built on tokens the template no longer writes."""
    path = shutil.copytree(tiny["smolvlm"], tmp_path / "own-template")
    template = (path / "chat_template.jinja").read_text()
    marked = template.replace("'<|im_start|>'", "'<|im_start|>[own]'")
    assert marked != template
    (path / "chat_template.jinja").write_text(marked)
    renderer = load_renderer(path)
    picture = {"type": "image", "image": Image.fromarray(clip(9, t=1)[0])}
    first = [{"role": "user", "content": [picture, {"type": "text", "text": "Look."}]}]
    text = renderer.tokenizer.decode(renderer.render(first).token_ids)
    assert text.startswith("<|im_start|>[own]")  # no clip: the checkpoint's template
    both = [*first, {"role": "assistant", "content": "Ok."},
            {"role": "user", "content": [video(1)]}]  # fmt: skip
    text = renderer.tokenizer.decode(renderer.render(both).token_ids)
    assert "[own]" not in text and "frames from a 0:00:01 [H:MM:SS] video" in text
    prompt = renderer.render(first)
    reply = renderer.tokenizer(" Ok.", add_special_tokens=False)["input_ids"]
    out = renderer.bridge_to_next_turn(
        prompt.token_ids, [*reply, renderer.stop_token_ids[0]], both[2:],
        previous_multi_modal_data=prompt.multi_modal_data, previous_messages=both[:2],
    )  # fmt: skip
    assert out is None
    assert any("switches the chat template" in r for r in renderer.bridge_refusals)


def test_smolvlm_clip_options_follow_its_sampler(tiny):
    renderer = load_renderer(tiny["smolvlm"])
    long_clip = {"type": "video", "video": clip(4, t=40), "frame_rate": 4.0}  # 10 s at 1 fps
    out = renderer.render([{"role": "user", "content": [long_clip]}])
    (item,) = out.multi_modal_data.mm_items["video"]
    assert item["pixel_values"].shape[:2] == (1, 10)
    assert item["pixel_attention_mask"].shape == (1, 10, 64, 64)
    capped = renderer.render([{"role": "user", "content": [{**long_clip, "num_frames": 4}]}])
    # at most 4 frames; the first and last second are skipped (10 - 2 > 4 x 1 fps)
    assert capped.multi_modal_data.mm_items["video"][0]["pixel_values"].shape[1] == 4
    text = renderer.tokenizer.decode(capped.token_ids)
    assert "series of four frames" in text and "Frame from 00:01:" in text
    assert "Frame from 00:00:" not in text
    with pytest.raises(RenderError, match="min_pixels and max_pixels do not apply"):
        renderer.render([{"role": "user", "content": [{**long_clip, "max_pixels": 4096}]}])
    no_rate = {"type": "video", "video": clip(4, t=8)}
    with pytest.raises(RenderError, match="frame rate"):
        renderer.render([{"role": "user", "content": [no_rate]}])
    every = renderer.render([{"role": "user", "content": [{**no_rate, "do_sample_frames": False}]}])
    assert every.multi_modal_data.mm_items["video"][0]["pixel_values"].shape[1] == 8
