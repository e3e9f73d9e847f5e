"""Kimi-K2.5's video: rendered as its real template writes it, exact against
transformers' own processor, and its mistakes refused by name.

The default tier has no torchvision, which ``Kimi_K25VideoProcessor`` needs: vf_mm's
torch-only port (``vf_mm/models/_kimi_k25_video.py``) is held to goldens the real
processor wrote (``golden/kimi_k25_video.json``, by ``golden/kimi_k25_video.py``: token
ids and every model input's bytes, the text from the real template). Where torchvision
imports (``dev.py torchvision``), the ``vllm``-marked test compares the goldens with the
real class again, case by case. The forward taking the clips, and the trainer's logprobs
equal to the sampler's, are held in ``tests/training/test_video_training.py`` with the
other video families; the features of chunks of several frames (which transformers'
forward cannot compute, ``vf_mm.models.forward_inputs``) in
``tests/models/test_forward_inputs.py``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.renderers._video_golden import assert_renders_the_clip_golden
from tests.renderers.golden.kimi_k25_video import (
    CASES,
    INPUTS,
    clip_digest,
    conversation,
    parts_of,
    real_processor,
    reference,
    tensor_record,
)
from vf_mm.errors import MultiModalDataError, RenderError, UnsupportedModelError, VideoError
from vf_mm.inference import GenerateRequest, SamplingParams
from vf_mm.models import load_video_settings, model_inputs
from vf_mm.renderers import load_renderer

GOLDEN = json.loads((Path(__file__).parent / "golden" / "kimi_k25_video.json").read_text())


@pytest.fixture(scope="module")
def kimi(kimi_k25_checkpoint) -> Path:
    return kimi_k25_checkpoint


@pytest.fixture(scope="module")
def renderer(kimi) -> Any:
    return load_renderer(kimi)


def clip(seed: int, t: int = 4, h: int = 30, w: int = 40) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (t, h, w, 3), dtype=np.uint8)


def ask(*parts: Any) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [*parts, {"type": "text", "text": "What moved?"}]}]


@pytest.mark.parametrize("case", list(CASES))
def test_clips_render_as_the_real_processor_wrote_them(renderer, case):
    """Token ids, and every model input's shape, dtype and bytes, equal what
    transformers' ``Kimi_K25Processor`` with its video processor made of the same
    conversation through the real template; each clip's placeholders cover exactly its
    video tokens (the timestamps and media markers between its chunks are text)."""
    golden = GOLDEN["cases"][case]
    messages = conversation(case)
    assert [clip_digest(v["video"]) for v in parts_of(messages, "video")] == golden["clips"]
    assert_renders_the_clip_golden(renderer, "kimi_k25", messages, golden, inputs=INPUTS)


def test_a_clip_in_a_tool_result_bridges_equal_to_a_full_render(renderer):
    """A clip a tool returns, after a turn of calls that holds a clip's prompt: the bridged
    prompt equals a full render of the whole conversation, ids, placeholders and every
    clip's inputs. (A turn after an answer is rendered in full, not bridged: the template
    rewrites the answer's reasoning, ``test_kimi_k25.py``.)"""
    first = ask({"type": "video", "video": clip(1), "frame_rate": 2.0})
    prompt = renderer.render(first)
    text = "look</think>" + renderer.format_tool_calls([("replay", {"speed": 2})])
    completion = renderer.tokenizer(text, add_special_tokens=False)["input_ids"]
    completion = [*completion, renderer.stop_token_ids[0]]
    parsed = renderer.parse_response(completion)
    later = [{"role": "tool", "tool_call_id": parsed.tool_calls[0]["id"],
              "content": [{"type": "text", "text": "slowed"},
                          {"type": "video", "video": clip(2, t=6, h=50, w=20),
                           "frame_rate": 4.0}]}]  # fmt: skip
    history = [*first, parsed.message]
    bridged = renderer.bridge_to_next_turn(
        prompt.token_ids, completion, later,
        previous_multi_modal_data=prompt.multi_modal_data, previous_messages=history,
    )  # fmt: skip
    full = renderer.render([*history, *later])
    assert bridged is not None, dict(renderer.bridge_refusals)
    assert bridged.token_ids == full.token_ids
    assert bridged.multi_modal_data.mm_placeholders == full.multi_modal_data.mm_placeholders
    got, want = bridged.multi_modal_data.mm_items["video"], full.multi_modal_data.mm_items["video"]
    assert len(got) == len(want) == 2
    for a, b in zip(got, want, strict=True):
        assert all(np.array_equal(a[k], b[k]) for k in b)


@pytest.mark.parametrize(
    ("part", "error"),
    [
        ({"video": np.zeros((0, 8, 8, 3), np.uint8), "frame_rate": 2.0},
         r"message 0, part 0.*at least one frame"),
        ({"video": [np.zeros((8, 8, 3), np.uint8), np.zeros((9, 8, 3), np.uint8)],
          "frame_rate": 2.0}, "every frame of a video must have the same size"),
        ({"video": clip(3), "frame_rate": 2.0, "num_frames": 2}, "fps or by num_frames"),
        ({"video": clip(3), "frame_rate": 2.0, "max_pixels": 5000}, "max_patches"),
        ({"video": clip(3)}, "frame rate"),  # 2 fps by default needs the clip's rate
        ({"video": clip(3), "frame_rate": 1.0, "fps": 4}, "cannot sample 16 frames"),
        ({"video": clip(3), "frame_rate": 2.0, "colour": "red"}, "colour"),
    ],
    ids=["no-frames", "ragged-frames", "rate-and-count", "pixels-budget", "no-rate",
         "too-many-frames", "unknown-key"],
)  # fmt: skip
def test_the_mistakes_users_make_are_refused_by_name(renderer, part, error):
    """Each fails its render with a typed error (``RenderError``, or ``VideoError`` where
    the clip itself is bad) that names the part and the fix."""
    with pytest.raises((RenderError, VideoError), match=error):
        renderer.render(ask({"type": "video", **part}))


def test_a_clip_keeps_every_frame_it_samples_in_chunks_of_four(renderer):
    """Kept frames go to the model in chunks of 4 (the last shorter), each chunk one
    frame's video tokens: a clip of 5 frames at 4 fps keeps 2 at 2 fps, one chunk of 2;
    with sampling off, chunks of 4 and 1."""
    rendered = renderer.render(ask({"type": "video", "video": clip(6, t=5), "frame_rate": 4.0}))
    (item,) = rendered.multi_modal_data.mm_items["video"]
    assert item["video_grid_thw"].tolist() == [[2, 4, 4]]
    rendered = renderer.render(ask({"type": "video", "video": clip(6, t=5), "frame_rate": 4.0,
                                    "do_sample_frames": False}))  # fmt: skip
    (item,) = rendered.multi_modal_data.mm_items["video"]
    assert item["video_grid_thw"].tolist() == [[4, 4, 4], [1, 4, 4]]
    video_token = renderer.vision.embed_ids("video")[0]
    assert rendered.token_ids.count(video_token) == 2 * 4 * 4 // 4


def test_a_content_parts_vllm_client_refuses_a_clip_before_sending(kimi, renderer):
    """vLLM 0.32 cannot take Kimi-K2.5's clips (a raw one is answered 400; docs/videos.md):
    a content_parts client built by make_client takes the family's refusal from the
    renderer, so a clip fails by name before anything is sent (nothing listens on the
    port), never as a server's 400."""
    import vf_mm as vf

    assert renderer.vision.vllm_refusal("image") is None
    client = vf.make_client(kimi, backend="vllm", base_url="http://127.0.0.1:9", renderers=1,
                            backend_options={"mode": "content_parts", "max_retries": 0,
                                             "max_model_len": 256})  # fmt: skip
    assert client.backend.refusals == {"video": renderer.vision.vllm_refusal("video")}
    part = {"type": "video", "video": clip(6, t=5), "frame_rate": 4.0}
    request = GenerateRequest([1, *renderer.vision.embed_ids("video"), 2],
                              SamplingParams(max_tokens=1), content_parts=[part])  # fmt: skip
    with pytest.raises(MultiModalDataError, match=r"cannot take Kimi-K2.5's clips.*LocalBackend"):
        asyncio.run(client.backend.generate(request))
    asyncio.run(client.aclose())


@pytest.mark.parametrize(
    ("frames", "grid", "where"),
    [(2, [[2, 4, 4]], "get_image_features"),
     (6, [[4, 4, 4], [2, 4, 4]], "get_vision_temporal_merge_index")],
    ids=["two-frame-chunk", "chunks-of-4-and-2"],
)  # fmt: skip
def test_transformers_own_forward_still_fails_on_chunks_of_several_frames(
    kimi, renderer, frames, grid, where
):
    """transformers 5.23's own Kimi-K2.5 forward fails on a chunk of two frames
    (``get_image_features`` splits the pooled output by frames * patches,
    ``modeling_kimi_k25.py:601``) and on chunks of 4 and 2 frames (its temporal merge
    index cannot join chunks of different lengths, ``modeling_kimi_k25.py:441-465``).
    vf_mm's forwards do not depend on it: they take such clips' features from
    ``forward_inputs``. When a transformers release fixes either, this fails: then
    ``forward_inputs`` may hand such clips to transformers' own path."""
    import torch

    from vf_mm.models import model_class

    rendered = renderer.render(ask({"type": "video", "video": clip(7, t=frames),
                                    "frame_rate": 2.0, "do_sample_frames": False}))  # fmt: skip
    data = rendered.multi_modal_data
    inputs = model_inputs(
        "kimi_k25", torch.tensor([rendered.token_ids]), [], image_token_ids=(),
        videos=data.mm_items["video"], video_token_ids=renderer.vision.embed_ids("video"),
    )  # fmt: skip
    assert inputs["video_grid_thw"].tolist() == grid
    model = model_class("kimi_k25").from_pretrained(kimi).eval()
    with torch.no_grad(), pytest.raises(RuntimeError) as failure:
        model(input_ids=torch.tensor([rendered.token_ids]), **inputs)
    assert where in [entry.name for entry in failure.traceback]  # fails there, not elsewhere


def test_a_checkpoint_with_a_size_the_processor_refuses_is_refused(kimi, tmp_path):
    import shutil

    path = Path(shutil.copytree(kimi, tmp_path / "m"))
    config = json.loads((path / "preprocessor_config.json").read_text())
    config["size"] = {"max_height": 16, "max_width": 20}
    (path / "preprocessor_config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedModelError, match="max_height"):
        load_video_settings(path, "kimi_k25")


@pytest.mark.vllm
@pytest.mark.parametrize("case", list(CASES))
def test_the_goldens_are_what_the_real_processor_writes_here(kimi, case):
    """Where torchvision imports: transformers' own processor still writes each golden
    (transformers 5.23's, the lock's, which wrote them: the vllm venv's 5.19 reads the
    case's image, given channels-last, as channels-first and fails in its own code)."""
    import transformers

    version = tuple(int(p) for p in transformers.__version__.split(".")[:2])
    if version < (5, 23) and CASES[case][2]:
        pytest.skip(f"transformers {version} fails on a Kimi-K2.5 image beside clips")
    ref = reference(real_processor(kimi), case)
    golden = GOLDEN["cases"][case]
    assert ref["input_ids"][0].tolist() == golden["input_ids"]
    for name in INPUTS:
        if name in golden["inputs"]:
            assert tensor_record(ref[name]) == golden["inputs"][name], name


#: (the real class's call options, the same as VideoSettings changes, the clip)
PORT_CASES = [
    ({}, {}, (9, 37, 61, 3.0)),
    ({"do_sample_frames": False}, {"do_sample_frames": False}, (6, 500, 3, None)),
    ({"fps": 1}, {"fps": 1}, (23, 120, 90, 4.0)),
    ({"max_patches": 16, "size": {"max_height": 8, "max_width": 8}},
     {"max_patches": 16, "size": (8, 8)}, (5, 300, 200, 2.0)),
    ({"do_resize": False, "do_sample_frames": False}, {"do_resize": False,
     "do_sample_frames": False}, (3, 56, 28, 1.0)),
    ({"resample": 2}, {"resample": 2}, (8, 45, 45, 2.0)),
    ({"do_normalize": False}, {"do_normalize": False}, (4, 1, 1, 2.0)),
]  # fmt: skip


@pytest.mark.vllm
@pytest.mark.parametrize(("options", "changes", "spec"), PORT_CASES)
def test_the_port_computes_the_video_processors_numbers_bit_for_bit(kimi, options, changes, spec):
    """Where torchvision imports: for each option set, the port's ``pixel_values_videos``
    and ``video_grid_thw`` equal ``Kimi_K25VideoProcessor``'s bit for bit, and its text
    equals ``Kimi_K25Processor.replace_video_token``'s (chunks of several frames
    included)."""
    from transformers import AutoProcessor

    from vf_mm.models import expand_video

    t, h, w, rate = spec
    frames = clip(sum(spec[:3]), t=t, h=h, w=w)
    processor = AutoProcessor.from_pretrained(kimi)
    meta = {"total_num_frames": t, "fps": rate, "frames_indices": list(range(t))}
    real = processor.video_processor(
        videos=[frames], video_metadata=[meta], input_data_format="channels_last",
        return_metadata=True, return_tensors="np", **options,
    )  # fmt: skip
    settings = load_video_settings(kimi, "kimi_k25")
    assert settings is not None
    settings = dataclasses.replace(settings, **changes)
    ours = expand_video(settings, frames, fps=rate,
                        tokens={"video_token": processor.video_token})  # fmt: skip
    for name in ("pixel_values_videos", "video_grid_thw"):
        assert tensor_record(ours.item[name]) == tensor_record(real[name]), name
    assert ours.replacement == processor.replace_video_token(real, 0)
