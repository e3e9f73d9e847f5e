"""Write ``gemma4_video.json``: what transformers' own ``Gemma4Processor`` with its
``Gemma4VideoProcessor`` (torchvision only) makes of conversations holding clips, the
goldens vf_mm's torch-only port (``vf_mm/models/_gemma4_video.py``) must reproduce in the
default tier, which has no torchvision.

It runs where torchvision imports, in the torchvision tier's venv (``python3 dev.py
torchvision`` makes it):

    PYTHONPATH=. .venv-torchvision/bin/python tests/renderers/golden/gemma4_video.py

Each case is a conversation at one template revision of the tiny Gemma 4 checkpoint
(``build_tiny_vlm(..., variant=...)``), with clips of seeded noise that force resizes
(1x1, 3x500 and 500x3 frames, odd sizes), odd frame counts (1, 7, 13, 33), timestamps
past a minute and at an unknown frame rate (24 fps), sampling off, by ``num_frames`` and
by the checkpoint's default (32 frames), two clips in a turn, clips beside images, a clip in a tool result (905e84b). (Sampling by ``fps`` is not reachable
in transformers 5.23 while the checkpoint sets ``num_frames``, as the released one does:
vf_mm refuses it by name.) The reference is the template's text (each clip and image one
placeholder part) given to the processor with the clips, their metadata
(``total_num_frames``, the part's ``frame_rate`` as ``fps``, ``frames_indices`` all
frames) and the case's options, the frames said to be channels-last (vf_mm's frames
always are; left to guess, transformers reads a 3x500 or 1x1 frame as channels-first),
images through the PIL image processor (the default tier's). Stored: the token ids, and every model input's
shape, dtype and sha256 of its bytes (``tv_ports.tensor_record``), with each clip's sha256,
so a failure says whether the inputs or the processing moved.
"""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from tests.renderers.golden._records import array_digest as clip_digest
from tests.renderers.golden._records import parts_of, tensor_record, versions, write_golden

HERE = Path(__file__).parent
OUT = HERE / "gemma4_video.json"
INPUTS = ("pixel_values_videos", "video_position_ids", "num_frames_per_video",
          "mm_token_type_ids", "pixel_values", "image_position_ids")  # fmt: skip

# name: (template revision, [(frames, height, width, frame rate)], options, layout)
Case = tuple[str, list[tuple[int, int, int, float | None]], dict[str, Any], str]
CASES: dict[str, Case] = {
    "unsampled": ("8995379", [(5, 40, 56, 4.0)], {"do_sample_frames": False}, "user"),
    # no frame rate: the processor's 24 fps puts frame 24 at 00:01
    "wide-num-frames": ("8995379", [(48, 3, 500, None)], {"num_frames": 2}, "user"),
    "two-clips-and-an-image": (
        "4742fe8",
        [(7, 33, 21, 8.0), (130, 97, 61, 1.0)],  # the second's frames at 00:00 to 01:37
        {"num_frames": 4},
        "user+image",
    ),
    "tool-result": (
        "905e84b",
        [(8, 20, 20, 2.0), (6, 30, 30, 2.0)],
        {"num_frames": 3},
        "user+tool",
    ),
    "one-pixel-frame-31b": ("31b", [(1, 1, 1, None)], {"do_sample_frames": False}, "user+image"),
    "checkpoint-defaults": ("b446025", [(33, 10, 12, 10.0)], {}, "user"),
    "tall-odd": ("6b7e72c", [(13, 500, 3, 30.0)], {"num_frames": 3}, "user"),
}


def clip(case: str, index: int) -> np.ndarray:
    frames, height, width, _ = CASES[case][1][index]
    seed = int(hashlib.sha256(f"{case}/{index}".encode()).hexdigest()[:8], 16)
    return np.random.default_rng(seed).integers(0, 256, (frames, height, width, 3), np.uint8)


def conversation(case: str) -> list[dict[str, Any]]:
    """Case ``case``'s messages: its clips (each a video part with its frame rate and the
    case's options) in a user turn, or the last one in a tool result, and an image after
    the first clip where the layout has one."""
    _, clips, options, layout = CASES[case]
    parts = [{"type": "video", "video": clip(case, i),
              **({"frame_rate": c[3]} if c[3] is not None else {}), **options}
             for i, c in enumerate(clips)]  # fmt: skip
    tool = parts.pop() if layout == "user+tool" else None
    if layout == "user+image":
        noise = np.random.default_rng(5).integers(0, 256, (50, 80, 3), dtype=np.uint8)
        parts.insert(1, {"type": "image", "image": Image.fromarray(noise)})
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": [*parts, {"type": "text", "text": "What moved?"}]}
    ]
    if tool is not None:
        call = {"id": "c1", "type": "function",
                "function": {"name": "replay", "arguments": {"speed": 2}}}  # fmt: skip
        messages += [
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "name": "replay",
             "content": [{"type": "text", "text": "slowed"}, tool]},
        ]  # fmt: skip
    return messages


def reference(processor: Any, case: str) -> Any:
    """The real processor's output for case ``case`` (the module docstring)."""
    messages = conversation(case)
    shown = [{**m, "content": [p if p["type"] == "text" else {"type": p["type"]}
                               for p in m["content"]]} for m in messages]  # fmt: skip
    text = processor.tokenizer.apply_chat_template(
        shown, tokenize=False, add_generation_prompt=True
    )
    videos = parts_of(messages, "video")
    options = CASES[case][2]
    metadata = [{"total_num_frames": len(v["video"]), "fps": v.get("frame_rate"),
                 "frames_indices": list(range(len(v["video"])))} for v in videos]  # fmt: skip
    images = [p["image"] for p in parts_of(messages, "image")]
    return processor(
        text=text, images=images or None, videos=[v["video"] for v in videos],
        video_metadata=metadata, input_data_format="channels_last", return_tensors="np",
        **options,
    )  # fmt: skip


def real_processor(path: Path) -> Any:
    """The checkpoint's ``Gemma4Processor`` with transformers' video processor and the PIL
    image processor (the one the default tier renders images with)."""
    from transformers import AutoProcessor

    from vf_mm.models import load_processor

    processor = AutoProcessor.from_pretrained(path)
    processor.image_processor = load_processor(path, image_backend="pil").image_processor
    return processor


def main() -> None:
    import transformers

    from vf_mm.testing import build_tiny_vlm

    out: dict[str, Any] = {
        "written_by": "tests/renderers/golden/gemma4_video.py",
        "source": f"transformers {transformers.__version__} Gemma4Processor with "
        "transformers.models.gemma4.video_processing_gemma4.Gemma4VideoProcessor",
        "versions": versions(),
        "cases": {},
    }  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        processors: dict[str, Any] = {}
        for case, (variant, *_) in CASES.items():
            if variant not in processors:
                path = build_tiny_vlm(Path(tmp) / variant, "gemma4", variant=variant)
                processors[variant] = real_processor(path)
            ref = reference(processors[variant], case)
            out["cases"][case] = {
                "clips": [clip_digest(v["video"]) for v in parts_of(conversation(case), "video")],
                "input_ids": ref["input_ids"][0].tolist(),
                "inputs": {k: tensor_record(ref[k]) for k in INPUTS if k in ref},
            }
    write_golden(OUT, out)


if __name__ == "__main__":
    main()
