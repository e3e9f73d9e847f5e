"""Write ``internvl_video.json``: what transformers' ``InternVLProcessor`` with its
``InternVLVideoProcessor`` (which needs torchvision) makes of conversations holding clips,
the goldens vf_mm's torch-only InternVL video processing (``vf_mm/models/_internvl_video.py``)
must reproduce in the default tier, which has no torchvision.

It runs where torchvision imports, in the torchvision tier's venv (``python3 dev.py
torchvision`` makes it):

    PYTHONPATH=. .venv-torchvision/bin/python tests/renderers/golden/internvl_video.py

Each case is a conversation (``conversation``) of seeded-noise clips that force resizes
and odd shapes (one 1x1 frame, 4x300 and 300x4 frames, odd frame counts, sampling by
``num_frames`` and by ``fps``, sampling off, two clips in a turn, a clip beside images, a
clip in a later turn). The reference is InternVL3's real template (``internvl3_hf.jinja``
with its recorded rewrite, ``templates.json``) rendered by ``apply_chat_template``, then
``processor(text=..., images=..., videos=..., video_metadata=...)`` with the clip's
options, the processor being ``AutoProcessor``'s for the tiny checkpoint
(``build_tiny_vlm``: its video settings come from the image config, as
``AutoVideoProcessor`` reads them), its images processed by the PIL backend (the
default tier's). Stored: the token ids, each model input as shape, dtype
and the sha256 of its bytes, and each clip's and image's sha256 (a failure then says
whether the inputs or the processing differ), with the versions it was written with.
``tests/renderers/test_internvl_video.py`` checks vf_mm's renderer against it.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from tests.renderers.golden._records import array_digest as digest
from tests.renderers.golden._records import parts_of, tensor_record, versions, write_golden

HERE = Path(__file__).parent
OUT = HERE / "internvl_video.json"

# (frames, height, width, frame rate, options) of each case's clips; a case's clips share
# their options (the processor's call takes one set for all)
CASES: list[dict[str, Any]] = [
    {"clips": [(1, 1, 1, 1.0)], "options": {}},
    {"clips": [(3, 4, 300, 10.0)], "options": {}},
    {"clips": [(2, 300, 4, None)], "options": {}},
    {"clips": [(7, 33, 45, 8.0)], "options": {"num_frames": 3}},
    {"clips": [(9, 20, 31, 6.0)], "options": {"fps": 2.0}},
    {"clips": [(5, 64, 48, 25.0)], "options": {"do_sample_frames": False}},
    # transformers stacks a call's clips: several in one call need one frame count
    {"clips": [(4, 50, 20, 4.0), (4, 20, 50, 4.0)], "options": {}, "images": 1},
    {"clips": [(6, 97, 41, 12.0)], "options": {"num_frames": 6}, "images": 2, "later": True},
    {"clips": [(11, 17, 90, 30.0)], "options": {"num_frames": 4}},
]


def clip(case: int, index: int) -> np.ndarray:
    frames, height, width, _ = CASES[case]["clips"][index]
    rng = np.random.default_rng(100 * case + index)
    return rng.integers(0, 256, (frames, height, width, 3), dtype=np.uint8)


def picture(case: int, index: int) -> Image.Image:
    size = ((50, 70), (13, 200))[index % 2]
    rng = np.random.default_rng(7000 + 10 * case + index)
    return Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8))


def conversation(case: int) -> list[dict[str, Any]]:
    """Case ``case``: its clips (with their frame rate and options) and images in one user
    turn, or, for a ``later`` case, in a second user turn after an answer."""
    spec = CASES[case]
    videos = [
        {"type": "video", "video": clip(case, i), **spec["options"],
         **({"frame_rate": rate} if rate is not None else {})}
        for i, (_, _, _, rate) in enumerate(spec["clips"])
    ]  # fmt: skip
    images = [{"type": "image", "image": picture(case, i)} for i in range(spec.get("images", 0))]
    parts = [videos[0], *images, *videos[1:], {"type": "text", "text": "What moved?"}]
    if not spec.get("later"):
        return [{"role": "user", "content": parts}]
    return [
        {"role": "user", "content": [{"type": "text", "text": "Watch."}]},
        {"role": "assistant", "content": "Ready."},
        {"role": "user", "content": parts},
    ]


def real_template() -> str:
    """InternVL3's stored real template with its recorded rewrite applied."""
    record = json.loads((HERE / "templates.json").read_text())["internvl"]
    text = (HERE / record["file"]).read_text()
    for old, new in record["rewrite"].items():
        text = text.replace(old, new)
    return text


def reference(processor: Any, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The processor's ids and inputs for ``messages`` (the clips' options given to its
    call, ``fps`` or ``num_frames`` turning sampling on, as ``apply_chat_template`` does)."""
    bare = [{**m, "content": m["content"] if isinstance(m["content"], str) else
             [{"type": p["type"]} if p["type"] != "text" else p for p in m["content"]]}
            for m in messages]  # fmt: skip
    text = processor.tokenizer.apply_chat_template(
        bare, chat_template=real_template(), tokenize=False, add_generation_prompt=True
    )
    videos = parts_of(messages, "video")
    options = {k: v for k, v in videos[0].items() if k not in ("type", "video", "frame_rate")}
    if ("fps" in options or "num_frames" in options) and "do_sample_frames" not in options:
        options["do_sample_frames"] = True
    metadata = [{"total_num_frames": len(p["video"]), "fps": p.get("frame_rate"),
                 "frames_indices": list(range(len(p["video"])))} for p in videos]  # fmt: skip
    images = [p["image"] for p in parts_of(messages, "image")] or None
    # the frames' layout is told: left to guess, the processor reads a 1x1 frame as
    # channels-first; its own merge of image and video tiles needs torch tensors
    return processor(text=text, images=images, videos=[p["video"] for p in videos],
                     video_metadata=metadata, return_tensors="pt",
                     videos_kwargs={"input_data_format": "channels_last", **options})  # fmt: skip


def main() -> None:
    import transformers
    from transformers import AutoProcessor, GotOcr2ImageProcessorPil

    from vf_mm.testing import build_tiny_vlm

    out: dict[str, Any] = {
        "written_by": "tests/renderers/golden/internvl_video.py",
        "versions": versions(),
        "cases": [],
    }  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        path = build_tiny_vlm(Path(tmp) / "internvl", "internvl")
        processor = AutoProcessor.from_pretrained(path)
        # images through the PIL backend, the default tier's (the clips' numbers are
        # the video processor's on every backend)
        processor.image_processor = GotOcr2ImageProcessorPil.from_pretrained(path)
        video = type(processor.video_processor)
        out["source"] = (
            f"transformers {transformers.__version__} {video.__module__}.{video.__name__}"
        )
        for case in range(len(CASES)):
            messages = conversation(case)
            ref = reference(processor, messages)
            out["cases"].append({
                "case": case,
                "clips": [digest(p["video"]) for p in parts_of(messages, "video")],
                "images": [digest(np.asarray(p["image"])) for p in parts_of(messages, "image")],
                "input_ids": ref["input_ids"][0].tolist(),
                "inputs": {"pixel_values": tensor_record(ref["pixel_values"].numpy())},
            })  # fmt: skip
    write_golden(OUT, out)


if __name__ == "__main__":
    main()
