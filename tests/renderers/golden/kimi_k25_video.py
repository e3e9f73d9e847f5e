"""Write ``kimi_k25_video.json``: what transformers' own ``Kimi_K25Processor`` with its
``Kimi_K25VideoProcessor`` (torchvision only) makes of conversations holding clips, the
goldens vf_mm's torch-only port (``vf_mm/models/_kimi_k25_video.py``) must reproduce in
the default tier, which has no torchvision.

It runs where torchvision imports, in the torchvision tier's venv (``python3 dev.py
torchvision`` makes it):

    PYTHONPATH=. .venv-torchvision/bin/python tests/renderers/golden/kimi_k25_video.py

Each case is a conversation for the tiny Kimi-K2.5 checkpoint (``build_tiny_vlm``: at most
64 patches of 14 and 16 a side), with clips of seeded noise that force resizes and padding
(1x1... 3x500, 500x3, 300x250 frames), odd frame counts (1, 5, 9, 13, 130: chunks of 4
and a shorter last one), timestamps past a minute and at an unknown frame rate (24 fps),
sampling off, by ``fps`` and by the checkpoint's default (2 fps), two clips in a turn and
clips beside an image. (Sampling by ``num_frames`` is not reachable in transformers 5.23
while the checkpoint sets ``fps``, as the class's default does: the processor passes both
to its sampler, which refuses the pair; vf_mm refuses it by name.) The reference is the real template's text
(``golden/kimi_k25.jinja``, each clip and image one placeholder part) given to the
processor with the clips, their metadata (``total_num_frames``, the part's ``frame_rate``
as ``fps``, ``frames_indices`` all frames) and the case's options, the frames said to be
channels-last (vf_mm's frames always are). Stored: the token ids and every model input's
shape, dtype and sha256 of its bytes (``_records.tensor_record``), with each clip's
sha256, so a failure says whether the inputs or the processing moved.
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
OUT = HERE / "kimi_k25_video.json"
REAL_TEMPLATE = (HERE / "kimi_k25.jinja").read_text()
INPUTS = ("pixel_values_videos", "video_grid_thw", "pixel_values", "image_grid_thw")

# name: ([(frames, height, width, frame rate)], options, with an image after the first clip)
Case = tuple[list[tuple[int, int, int, float | None]], dict[str, Any], bool]
CASES: dict[str, Case] = {
    "unsampled": ([(5, 40, 56, 4.0)], {"do_sample_frames": False}, False),
    "checkpoint-rate": ([(13, 30, 40, 4.0)], {}, False),  # 2 fps: 6 frames, chunks 4 + 2
    "wide-no-rate": ([(9, 3, 500, None)], {"do_sample_frames": False}, False),
    "one-tall-frame": ([(1, 500, 3, None)], {"do_sample_frames": False}, False),
    "past-a-minute": ([(130, 20, 20, 1.0)], {"fps": 0.1}, False),  # 13 frames to 02:00
    "by-fps-large": ([(7, 300, 250, 10.0)], {"fps": 5}, False),
    "two-clips-and-an-image": ([(6, 33, 21, 8.0), (4, 1, 1, 2.0)], {"fps": 2}, True),
}


def clip(case: str, index: int) -> np.ndarray:
    frames, height, width, _ = CASES[case][0][index]
    seed = int(hashlib.sha256(f"kimi/{case}/{index}".encode()).hexdigest()[:8], 16)
    return np.random.default_rng(seed).integers(0, 256, (frames, height, width, 3), np.uint8)


def conversation(case: str) -> list[dict[str, Any]]:
    """Case ``case``'s messages: its clips (each a video part with its frame rate and the
    case's options) in one user turn, and an image after the first clip where it has one."""
    clips, options, image = CASES[case]
    parts: list[dict[str, Any]] = [
        {"type": "video", "video": clip(case, i),
         **({"frame_rate": c[3]} if c[3] is not None else {}), **options}
        for i, c in enumerate(clips)
    ]  # fmt: skip
    if image:
        noise = np.random.default_rng(5).integers(0, 256, (50, 80, 3), dtype=np.uint8)
        parts.insert(1, {"type": "image", "image": Image.fromarray(noise)})
    return [{"role": "user", "content": [*parts, {"type": "text", "text": "What moved?"}]}]


def reference(processor: Any, case: str) -> Any:
    """The real processor's output for case ``case`` (the module docstring)."""
    messages = conversation(case)
    shown = [{**m, "content": [p if p["type"] == "text" else {"type": p["type"]}
                               for p in m["content"]]} for m in messages]  # fmt: skip
    text = processor.tokenizer.apply_chat_template(
        shown, tokenize=False, add_generation_prompt=True, chat_template=REAL_TEMPLATE
    )
    videos = parts_of(messages, "video")
    metadata = [{"total_num_frames": len(v["video"]), "fps": v.get("frame_rate"),
                 "frames_indices": list(range(len(v["video"])))} for v in videos]  # fmt: skip
    images = [p["image"] for p in parts_of(messages, "image")]
    return processor(
        text=text, images=images or None, videos=[v["video"] for v in videos],
        video_metadata=metadata, input_data_format="channels_last", return_tensors="np",
        **CASES[case][1],
    )  # fmt: skip


def real_processor(path: Path) -> Any:
    """The checkpoint's ``Kimi_K25Processor`` with transformers' (torchvision) image and
    video processors."""
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(path)


def main() -> None:
    import transformers

    from vf_mm.testing import build_tiny_vlm

    out: dict[str, Any] = {
        "written_by": "tests/renderers/golden/kimi_k25_video.py",
        "source": f"transformers {transformers.__version__} Kimi_K25Processor with "
        "transformers.models.kimi_k25.video_processing_kimi_k25.Kimi_K25VideoProcessor",
        "versions": versions(),
        "cases": {},
    }  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        processor = real_processor(build_tiny_vlm(Path(tmp) / "m", "kimi_k25"))
        for case in CASES:
            ref = reference(processor, case)
            out["cases"][case] = {
                "clips": [clip_digest(v["video"]) for v in parts_of(conversation(case), "video")],
                "input_ids": ref["input_ids"][0].tolist(),
                "inputs": {k: tensor_record(ref[k]) for k in INPUTS if k in ref},
            }
    write_golden(OUT, out)


if __name__ == "__main__":
    main()
