"""Write ``glm46v_video.json``: what transformers' ``Glm46VProcessor`` with its
``Glm46VVideoProcessor`` (which needs torchvision) makes of conversations holding clips,
the goldens vf_mm's torch-only GLM-4.6V video processing (``vf_mm/models/_glm46v_video.py``)
must reproduce in the default tier, which has no torchvision.

It runs where torchvision imports, in the torchvision tier's venv (``python3 dev.py
torchvision`` makes it):

    PYTHONPATH=. .venv-torchvision/bin/python tests/renderers/golden/glm46v_video.py

Each case is a conversation (``conversation``) of seeded-noise clips that force resizes,
odd shapes and each branch of the processor's sampler: a 1x1 frame, 4x300 and 300x4
frames, clips shorter than the sampler's frame budget (stretched by ``linspace``) and
longer (stepped at its rate), as many frames kept as the clip has but not the same ones
(the last dropped, the one before repeated), timestamps off whole seconds (30 and 7 fps), an odd frame
count kept whole (``do_sample_frames`` off, the rate unknown), two clips in a turn beside an
image, a clip in a tool result, a clip in a later turn with images. The reference is
GLM-4.6V's real template (``glm46v.jinja``) rendered by ``apply_chat_template``, then
``processor(text=..., images=..., videos=..., video_metadata=...)`` with the clip's
options; a clip's metadata is what transformers' own video loaders report (frame count,
rate, every frame's index, and the duration as count over rate). The processor is
``AutoProcessor``'s for the tiny checkpoint (``build_tiny_vlm``), its images processed by
the PIL backend (the default tier's). Stored: the token ids, ``mm_token_type_ids``, each
model input as shape, dtype and the sha256 of its bytes, and each clip's and image's
sha256, with the versions it was written with. ``tests/renderers/test_glm46v_video.py``
checks vf_mm's renderer against it.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from tests.renderers.golden._records import array_digest as digest
from tests.renderers.golden._records import parts_of, tensor_record, versions, write_golden

HERE = Path(__file__).parent
OUT = HERE / "glm46v_video.json"

# (frames, height, width, frame rate) of each case's clips; a case's clips share their
# options (the processor's call takes one set for all); "where": the role of the message
# holding them; "images": images beside them; "later": in a second user turn
CASES: list[dict[str, Any]] = [
    {"clips": [(1, 1, 1, 1.0)], "options": {}},
    {"clips": [(3, 4, 300, 10.0)], "options": {}},
    {"clips": [(2, 300, 4, None)], "options": {"do_sample_frames": False}},
    {"clips": [(40, 33, 45, 30.0)], "options": {}},
    {"clips": [(9, 20, 31, 7.0)], "options": {}},
    {"clips": [(5, 64, 48, 25.0)], "options": {"do_sample_frames": False}},
    {"clips": [(6, 50, 20, 4.0), (6, 50, 20, 4.0)], "options": {}, "images": 1},
    {"clips": [(120, 16, 24, 2.0)], "options": {}},
    {"clips": [(14, 97, 41, 12.0)], "options": {}, "images": 2, "later": True},
    {"clips": [(8, 30, 30, 3.0)], "options": {}, "where": "tool"},
    # as many frames kept as the clip has, but not the same ones: the sampler drops the
    # last and repeats the one before it to an even count
    {"clips": [(8, 22, 26, 6.0)], "options": {}},
    {"clips": [(2, 20, 20, 12.0)], "options": {}},
]


def clip(case: int, index: int) -> np.ndarray:
    frames, height, width, _ = CASES[case]["clips"][index]
    rng = np.random.default_rng(300 * case + index)
    return rng.integers(0, 256, (frames, height, width, 3), dtype=np.uint8)


def picture(case: int, index: int) -> Image.Image:
    size = ((50, 70), (13, 200))[index % 2]
    rng = np.random.default_rng(9000 + 10 * case + index)
    return Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8))


def conversation(case: int) -> list[dict[str, Any]]:
    """Case ``case``: its clips (with their frame rate and options) and images in one
    message (a user turn, a tool result, or a second user turn after an answer)."""
    spec = CASES[case]
    videos = [
        {"type": "video", "video": clip(case, i), **spec["options"],
         **({"frame_rate": rate} if rate is not None else {})}
        for i, (_, _, _, rate) in enumerate(spec["clips"])
    ]  # fmt: skip
    images = [{"type": "image", "image": picture(case, i)} for i in range(spec.get("images", 0))]
    parts = [videos[0], *images, *videos[1:], {"type": "text", "text": "What moved?"}]
    if spec.get("where") == "tool":
        call = {"type": "function", "id": "c1",
                "function": {"name": "film", "arguments": {"where": "door"}}}  # fmt: skip
        return [
            {"role": "user", "content": "Film the door."},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": parts},
        ]
    if not spec.get("later"):
        return [{"role": "user", "content": parts}]
    return [
        {"role": "user", "content": [{"type": "text", "text": "Watch."}]},
        {"role": "assistant", "content": "Ready."},
        {"role": "user", "content": parts},
    ]


def metadata(part: dict[str, Any]) -> dict[str, Any]:
    """A clip's metadata as transformers' video loaders report it."""
    total, rate = len(part["video"]), part.get("frame_rate")
    out = {"total_num_frames": total, "fps": rate, "frames_indices": list(range(total))}
    if rate is not None:
        out["duration"] = total / rate
    return out


def reference(processor: Any, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The processor's ids and inputs for ``messages`` (the clips' options given to its
    call)."""
    bare = [{**m, "content": m["content"] if isinstance(m["content"], str) else
             [{"type": p["type"]} if p["type"] != "text" else p for p in m["content"]]}
            for m in messages]  # fmt: skip
    text = processor.tokenizer.apply_chat_template(
        bare, chat_template=(HERE / "glm46v.jinja").read_text(), tokenize=False,
        add_generation_prompt=True,
    )  # fmt: skip
    videos = parts_of(messages, "video")
    options = {k: v for k, v in videos[0].items() if k not in ("type", "video", "frame_rate")}
    images = [p["image"] for p in parts_of(messages, "image")] or None
    return processor(text=text, images=images, videos=[p["video"] for p in videos],
                     video_metadata=[metadata(p) for p in videos], return_tensors="pt",
                     videos_kwargs={"input_data_format": "channels_last", **options})  # fmt: skip


def main() -> None:
    import transformers
    from transformers import AutoProcessor, Glm46VImageProcessorPil

    from vf_mm.testing import build_tiny_vlm

    out: dict[str, Any] = {
        "written_by": "tests/renderers/golden/glm46v_video.py",
        "versions": versions(),
        "cases": [],
    }  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        path = build_tiny_vlm(Path(tmp) / "glm46v", "glm46v")
        processor = AutoProcessor.from_pretrained(path)
        processor.image_processor = Glm46VImageProcessorPil.from_pretrained(path)
        video = type(processor.video_processor)
        out["source"] = (
            f"transformers {transformers.__version__} {video.__module__}.{video.__name__}"
        )
        for case in range(len(CASES)):
            messages = conversation(case)
            ref = reference(processor, messages)
            inputs = {name: tensor_record(ref[name].numpy()) for name in
                      ("pixel_values_videos", "video_grid_thw", "pixel_values", "image_grid_thw")
                      if name in ref}  # fmt: skip
            out["cases"].append({
                "case": case,
                "clips": [digest(p["video"]) for p in parts_of(messages, "video")],
                "images": [digest(np.asarray(p["image"])) for p in parts_of(messages, "image")],
                "input_ids": ref["input_ids"][0].tolist(),
                "mm_token_type_ids": ref["mm_token_type_ids"][0].tolist(),
                "inputs": inputs,
            })  # fmt: skip
    write_golden(OUT, out)


if __name__ == "__main__":
    main()
