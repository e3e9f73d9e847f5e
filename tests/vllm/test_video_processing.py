"""Video is exact against transformers' own video processors, which need torchvision.

vf_mm computes a clip's model inputs with torch alone (``vf_mm.models.expand_video``), so
the main venv (CPU torch, no torchvision) renders video too. Here, where torchvision
imports, every step is compared with what transformers computes: the frames the video
processor samples, the resize, the normalisation, the patch layout, ``video_grid_thw``,
Qwen2.5-VL's ``second_per_grid_ts`` and the prompt text (pads, and Qwen3-VL's timestamps),
bit for bit, for every Qwen-VL family, over clips of 1 to 64 frames (odd counts
included), tiny and large frames, and each sampling option. A clip the processor refuses
(Qwen3-VL: fewer frames than a temporal patch) is refused by vf_mm too.

The reference call is ``processor(text, videos=[frames], video_metadata=[{"total_num_frames":
T, "fps": frame_rate, "frames_indices": range(T)}], **options)``, with ``fps`` or
``num_frames`` implying ``do_sample_frames=True`` (as ``apply_chat_template`` does).
"""

from __future__ import annotations

import numpy as np
import pytest

from vf_mm.models import VIDEO_FAMILIES, expand_video, load_video_settings
from vf_mm.renderers import load_renderer
from vf_mm.testing import build_tiny_vlm

pytestmark = pytest.mark.vllm

PLACEHOLDER = "<|vision_start|><|video_pad|><|vision_end|>"

# (frames, height, width, frame rate, options)
CLIPS = [
    (1, 40, 40, 5.0, {}),
    (2, 28, 28, None, {}),
    (3, 97, 201, 10.0, {}),
    (7, 64, 48, None, {}),
    (8, 20, 30, 24.0, {}),
    (9, 333, 120, 30.0, {"fps": 4.0}),
    (16, 50, 70, 24.0, {"num_frames": 6}),
    (17, 224, 224, 2.0, {"max_pixels": 20000}),
    (33, 64, 64, 12.0, {"min_pixels": 40000}),
    (64, 48, 80, 30.0, {}),
    (64, 48, 80, None, {"fps": 1.0}),
    (4, 480, 640, 25.0, {}),
    (5, 36, 1000, 8.0, {}),
    (12, 120, 90, 6.0, {"do_sample_frames": False}),
    (4, 40, 40, 8.0, {"num_frames": 8}),  # more than the clip: Qwen3-VL repeats frames
    (1, 40, 40, 8.0, {"num_frames": 2}),
    (6, 40, 40, 8.0, {"do_sample_frames": True}),  # Qwen2-VL: neither fps nor num_frames
]


@pytest.fixture(autouse=True, scope="module")
def _needs_torchvision():  # checked when the tests run, not when they are collected
    pytest.importorskip("torchvision")


# SmolVLM's, Gemma 4's, InternVL's, Kimi-K2.5's and GLM-4.6V's clips are compared with
# their processors below and in tests/renderers/test_{gemma4,internvl,kimi_k25,glm46v}_video.py:
# their text and inputs take other tokens and options (frames as images, for SmolVLM and
# InternVL; Kimi-K2.5's chunks of up to 4 frames, each one frame's tokens)
OWN_TESTS = ("smolvlm", "gemma4", "internvl", "kimi_k25", "glm46v")


@pytest.fixture(
    scope="module",
    params=[f for f in VIDEO_FAMILIES if f not in OWN_TESTS],
)
def family_checkpoint(request, tmp_path_factory):
    path = build_tiny_vlm(tmp_path_factory.mktemp(request.param) / "m", request.param)
    return request.param, path


def reference_kwargs(settings, options):
    kwargs = dict(options)
    if ("fps" in kwargs or "num_frames" in kwargs) and "do_sample_frames" not in kwargs:
        kwargs["do_sample_frames"] = True
    if "num_frames" in kwargs:
        kwargs["fps"] = None
    if "min_pixels" in kwargs or "max_pixels" in kwargs:
        kwargs["size"] = {
            "shortest_edge": kwargs.pop("min_pixels", settings.min_pixels),
            "longest_edge": kwargs.pop("max_pixels", settings.max_pixels),
        }
    return kwargs


def tokens_of(processor):
    return {
        "video_token": processor.video_token,
        "vision_start_token": getattr(processor, "vision_start_token", "<|vision_start|>"),
        "vision_end_token": getattr(processor, "vision_end_token", "<|vision_end|>"),
    }


@pytest.mark.parametrize("clip", CLIPS, ids=lambda c: f"{c[0]}x{c[1]}x{c[2]}-{c[4]}")
def test_a_clip_is_processed_as_transformers_processes_it(family_checkpoint, clip):
    from transformers import AutoProcessor

    family, path = family_checkpoint
    frames_count, height, width, rate, options = clip
    processor = AutoProcessor.from_pretrained(path)
    settings = load_video_settings(path, family)
    if family == "llava_onevision" and {"min_pixels", "max_pixels"} & set(options):
        from vf_mm.errors import RenderError

        with pytest.raises(RenderError, match="do not apply"):  # every frame is one size
            settings.with_options(options)
        return
    rng = np.random.default_rng(frames_count * 1000 + height)
    frames = rng.integers(0, 256, (frames_count, height, width, 3), dtype=np.uint8)
    metadata = {"total_num_frames": frames_count, "fps": rate,
                "frames_indices": list(range(frames_count))}  # fmt: skip
    placeholder = PLACEHOLDER if "video_pad" in processor.video_token else processor.video_token
    try:
        reference = processor(
            text=[placeholder],
            videos=[frames],
            video_metadata=[metadata],
            return_tensors="pt",
            **reference_kwargs(settings, options),
        )
    except (ValueError, TypeError, ZeroDivisionError) as exc:  # the processor refuses it
        from vf_mm.errors import RenderError

        with pytest.raises(RenderError):  # a clear error where the processor raises
            expand_video(
                settings.with_options(options), frames, fps=rate, tokens=tokens_of(processor)
            )
        assert str(exc)
        return
    ours = expand_video(
        settings.with_options(options), frames, fps=rate, tokens=tokens_of(processor)
    )
    ids = processor.tokenizer(
        placeholder.replace(processor.video_token, ours.replacement), add_special_tokens=False
    )["input_ids"]
    assert ids == reference["input_ids"][0].tolist()
    expected = reference["pixel_values_videos"].numpy()
    got = ours.item["pixel_values_videos"]
    assert got.dtype == expected.dtype and got.shape == expected.shape
    assert np.array_equal(got, expected), float(np.abs(got - expected).max())
    if "video_grid_thw" not in reference:  # LLaVA-OneVision: frames, not patches
        assert set(ours.item) == {"pixel_values_videos"}
        return
    assert np.array_equal(ours.item["video_grid_thw"], reference["video_grid_thw"].numpy())
    if "second_per_grid_ts" in reference:
        assert np.array_equal(
            ours.item["second_per_grid_ts"],
            np.asarray(reference["second_per_grid_ts"], dtype=np.float32),
        )
    else:
        assert "second_per_grid_ts" not in ours.item


@pytest.mark.parametrize(
    "family",
    [f for f in VIDEO_FAMILIES if f not in ("llava_onevision", *OWN_TESTS)],
)
def test_the_renderer_matches_the_processor_on_a_conversation(family, tmp_path):
    """Video and images in one message, a second clip in a later turn: token ids and every
    tensor equal what the processor computes from the template's text."""
    from PIL import Image
    from transformers import AutoProcessor

    path = build_tiny_vlm(tmp_path / "m", family)  # (LLaVA-OneVision's: the next test)
    processor = AutoProcessor.from_pretrained(path)
    rng = np.random.default_rng(7)
    clip_a = rng.integers(0, 256, (9, 70, 90, 3), dtype=np.uint8)
    clip_b = rng.integers(0, 256, (6, 120, 64, 3), dtype=np.uint8)
    picture = Image.fromarray(rng.integers(0, 256, (50, 80, 3), dtype=np.uint8))
    messages = [
        {"role": "user", "content": [
            {"type": "video", "video": clip_a, "frame_rate": 3.0},
            {"type": "image", "image": picture},
            {"type": "text", "text": "Where did the ball go?"},
        ]},
        {"role": "assistant", "content": "Left."},
        {"role": "user", "content": [
            {"type": "text", "text": "Slower:"},
            {"type": "video", "video": clip_b, "frame_rate": 2.0, "num_frames": 4},
        ]},
    ]  # fmt: skip
    renderer = load_renderer(path)
    ours = renderer.render(messages)

    shown = [
        {**m, "content": [{"type": p["type"]} if p["type"] != "text" else p for p in m["content"]]}
        if isinstance(m["content"], list)
        else m
        for m in messages
    ]
    text = processor.apply_chat_template(shown, tokenize=False, add_generation_prompt=True)
    # one processor call takes one set of video options: give it the second clip's frames
    # as its own sampling keeps them (num_frames=4), with that sampling in the metadata
    # (Qwen3-VL's processor, which Qwen3.5 and both MoE families share, also samples the
    # first clip, at its default 2 fps: 6 of 9 frames)
    qwen3 = type(processor.video_processor).__name__ == "Qwen3VLVideoProcessor"
    kept_a = np.linspace(0, 8, 6).round().astype(int).tolist() if qwen3 else list(range(9))
    kept_b = [0, 2, 3, 5] if qwen3 else [0, 1, 3, 4]  # linspace / arange sampling of 4 in 6
    whole = processor(
        text=[text],
        images=[picture],
        videos=[clip_a[kept_a], clip_b[kept_b]],
        video_metadata=[
            {"total_num_frames": 9, "fps": 3.0, "frames_indices": kept_a},
            {"total_num_frames": 6, "fps": 2.0, "frames_indices": kept_b},
        ],
        return_tensors="pt",
        do_sample_frames=False,
    )
    data = ours.multi_modal_data
    assert ours.token_ids == whole["input_ids"][0].tolist()
    assert data.modalities == ("video", "image")
    videos = data.mm_items["video"]
    assert np.array_equal(
        np.concatenate([v["pixel_values_videos"] for v in videos]),
        whole["pixel_values_videos"].numpy(),
    )
    assert np.array_equal(
        np.concatenate([v["video_grid_thw"] for v in videos]), whole["video_grid_thw"].numpy()
    )
    if "second_per_grid_ts" in whole:
        assert np.array_equal(
            np.concatenate([v["second_per_grid_ts"] for v in videos]),
            np.asarray(whole["second_per_grid_ts"], dtype=np.float32),
        )
    assert np.array_equal(data.mm_items["image"][0]["pixel_values"], whole["pixel_values"].numpy())
    marks = np.zeros(len(ours.token_ids), dtype=np.int64)
    ids = np.asarray(ours.token_ids)
    marks[ids == processor.image_token_id] = 1
    marks[ids == processor.video_token_id] = 2
    assert np.array_equal(marks, whole["mm_token_type_ids"][0].numpy())


def test_a_llava_onevision_conversation_matches_the_processor(tmp_path):
    """A clip and an image in one message: the ids are the processor's expansion of the
    template's text, and the tensors its (frames resized to one size, the tokens pooled
    per frame plus one newline)."""
    from PIL import Image
    from transformers import AutoProcessor

    path = build_tiny_vlm(tmp_path / "m", "llava_onevision")
    processor = AutoProcessor.from_pretrained(path)
    rng = np.random.default_rng(3)
    clip = rng.integers(0, 256, (6, 70, 90, 3), dtype=np.uint8)
    picture = Image.fromarray(rng.integers(0, 256, (50, 80, 3), dtype=np.uint8))
    messages = [{"role": "user", "content": [
        {"type": "video", "video": clip, "frame_rate": 3.0}, {"type": "image", "image": picture},
        {"type": "text", "text": "What moved?"}]}]  # fmt: skip
    ours = load_renderer(path).render(messages)
    shown = [{**m, "content": [{"type": p["type"]} if p["type"] != "text" else p
                               for p in m["content"]]} for m in messages]  # fmt: skip
    text = processor.apply_chat_template(shown, tokenize=False, add_generation_prompt=True)
    whole = processor(text=[text], images=[picture], videos=[clip], return_tensors="pt",
                      video_metadata=[{"total_num_frames": 6, "fps": 3.0,
                                       "frames_indices": list(range(6))}])  # fmt: skip
    assert ours.token_ids == whole["input_ids"][0].tolist()
    assert np.array_equal(ours.multi_modal_data.mm_items["video"][0]["pixel_values_videos"],
                          whole["pixel_values_videos"].numpy())  # fmt: skip


# SmolVLM2: (frames, height, width, frame rate, options). Its processor samples whenever
# the checkpoint sets a rate (the tiny one: 1 fps, at most 64 frames, as the real one),
# and skips the first and last second of a clip long enough to spare them.
SMOL_CLIPS = [
    (1, 40, 40, 5.0, {}),
    (3, 97, 201, 10.0, {}),
    (9, 333, 120, 30.0, {}),
    (64, 48, 80, 30.0, {}),
    (40, 50, 70, 2.0, {}),
    (200, 30, 30, 10.0, {"num_frames": 5}),  # 20 s: the skip applies
    (61, 36, 1000, 3.0, {"fps": 2.0}),
    (13, 480, 640, 1.0, {}),
    (7, 64, 48, None, {"do_sample_frames": False}),  # no rate: the text takes 24 fps
    (33, 120, 90, 6.0, {"do_sample_frames": False}),
    (5, 20, 20, None, {}),  # sampling needs the rate: both refuse
]


@pytest.fixture(scope="module")
def smolvlm(tmp_path_factory):
    from transformers import AutoProcessor

    path = build_tiny_vlm(tmp_path_factory.mktemp("smolvlm") / "m", "smolvlm")
    return path, AutoProcessor.from_pretrained(path)


def smol_tokens(processor):
    return {"video_token": processor.video_token, "image_token": processor.image_token,
            "fake_image_token": processor.fake_image_token,
            "global_image_token": processor.global_image_token}  # fmt: skip


@pytest.mark.parametrize("clip", SMOL_CLIPS, ids=lambda c: f"{c[0]}x{c[1]}x{c[2]}-{c[4]}")
def test_a_smolvlm_clip_is_processed_as_its_processor_processes_it(smolvlm, clip):
    """The reference is the processor called as its ``apply_chat_template`` calls it (the
    checkpoint's rate and frame cap, sampling on), on a clip whose metadata is what its
    PyAV reader reports for a file: ids, ``pixel_values`` (Lanczos twice) and the mask."""
    from vf_mm.errors import RenderError

    path, processor = smolvlm
    frames_count, height, width, rate, options = clip
    settings = load_video_settings(path, "smolvlm")
    rng = np.random.default_rng(frames_count * 1000 + width)
    frames = rng.integers(0, 256, (frames_count, height, width, 3), dtype=np.uint8)
    metadata = {"total_num_frames": frames_count, "fps": rate,
                "duration": frames_count / rate if rate else None,
                "frames_indices": list(range(frames_count))}  # fmt: skip
    kwargs = {"num_frames": settings.num_frames, "fps": settings.fps, "do_sample_frames": True,
              **options}  # fmt: skip
    try:
        reference = processor(text=["<video>"], videos=[[frames]], video_metadata=[[metadata]],
                              return_tensors="pt", **kwargs)  # fmt: skip
    except ValueError:
        with pytest.raises(RenderError, match="frame rate"):
            expand_video(settings.with_options(options), frames, fps=rate,
                         tokens=smol_tokens(processor))  # fmt: skip
        return
    ours = expand_video(settings.with_options(options), frames, fps=rate,
                        tokens=smol_tokens(processor))  # fmt: skip
    ids = processor.tokenizer(ours.replacement, add_special_tokens=False)["input_ids"]
    assert ids == reference["input_ids"][0].tolist()
    for name in ("pixel_values", "pixel_attention_mask"):
        expected = reference[name].numpy()
        got = ours.item[name]
        assert got.dtype == expected.dtype and got.shape == expected.shape, name
        assert np.array_equal(got, expected), (name, float(np.abs(got - expected).max()))


def test_a_smolvlm_conversation_matches_apply_chat_template(smolvlm, tmp_path, monkeypatch):
    """A clip file in a user turn, answered, then a second clip: the renderer's ids and
    tensors are what ``apply_chat_template(tokenize=True)`` computes from the files (it
    switches to the processor's own template for a conversation holding a clip, decodes
    with PyAV and samples at the checkpoint's rate)."""
    import av

    path, processor = smolvlm
    rng = np.random.default_rng(5)
    files = []
    for k, (count, rate) in enumerate([(45, 15), (30, 10)]):
        # AVI states its frame count, which transformers' PyAV reader takes as the total
        file = tmp_path / f"clip{k}.avi"
        with av.open(str(file), "w") as container:
            stream = container.add_stream("ffv1", rate=rate)
            stream.width, stream.height, stream.pix_fmt = 90, 70 + 10 * k, "bgr0"
            for _ in range(count):
                pixels = rng.integers(0, 256, (stream.height, 90, 3), dtype=np.uint8)
                container.mux(stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")))
            container.mux(stream.encode())
        files.append(str(file))
    messages = [
        {"role": "user", "content": [{"type": "video", "path": files[0]},
                                     {"type": "text", "text": "Where did the ball go?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Left."}]},
        {"role": "user", "content": [{"type": "text", "text": "And here?"},
                                     {"type": "video", "path": files[1]}]},
    ]  # fmt: skip
    # transformers decodes files with torchcodec, not installed here: its own PyAV reader
    # stands in (both decode FFV1 exactly)
    from transformers.video_utils import load_video

    def fetch_videos(urls, sample_indices_fn=None):
        if isinstance(urls, list):
            return list(zip(*[fetch_videos(u, sample_indices_fn) for u in urls], strict=True))
        return load_video(urls, backend="pyav", sample_indices_fn=sample_indices_fn)

    monkeypatch.setattr(processor.video_processor, "fetch_videos", fetch_videos)
    whole = processor.apply_chat_template(messages, tokenize=True, return_dict=True,
                                          add_generation_prompt=True, return_tensors="pt")  # fmt: skip
    ours_messages = [
        {**m, "content": [{"type": "video", "video": p["path"]} if p["type"] == "video" else p
                          for p in m["content"]]}
        for m in messages
    ]  # fmt: skip
    ours = load_renderer(path).render(ours_messages)
    assert ours.token_ids == whole["input_ids"][0].tolist()
    clips = ours.multi_modal_data.mm_items["video"]
    # one call pads every clip to the longest's frame count; here both keep 3 frames
    assert np.array_equal(np.concatenate([c["pixel_values"] for c in clips]),
                          whole["pixel_values"].numpy())  # fmt: skip
