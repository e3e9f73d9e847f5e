"""``frames``: a benchmark environment in which every model turn brings one new encoded image.

Each turn the environment draws a frame (a precomputed backdrop, a few shapes placed by
a seed drawn for the rollout and the turn, the turn's number in text, so no two frames are equal
and no cache can serve one), encodes it and hands it over as a ``data:`` URL, as an
environment that receives screenshots or camera frames would:

  ``png448``   448x448 PNG (zlib level 1: what an environment that encodes fast picks)
  ``jpeg720``  1280x720 JPEG (quality 90)

The model's reply is not read (a scripted engine answers anything); the rollout runs
``max_turns`` model turns, so it has ``max_turns`` image turns (the first prompt's image,
then one per environment turn). Loaded by path: ``vf_mm.load_environment(<this file>)``.
"""

from __future__ import annotations

import base64
import functools
import io
import random
import secrets
from typing import Any

import numpy as np
from PIL import Image, ImageDraw

import vf_mm as vf
from vf_mm.types import Messages

KINDS = {"png448": ((448, 448), "PNG"), "jpeg720": ((1280, 720), "JPEG")}


def load_environment(
    kind: str = "png448", max_turns: int = 8, num_eval_examples: int = 256, **kwargs: Any
) -> FramesEnv:
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, not {kind!r}")
    rows = vf.LazyRows(num_eval_examples, functools.partial(_row, kind))
    rubric = vf.Rubric(funcs=[_turns])
    return FramesEnv(kind=kind, eval_dataset=rows, max_turns=max_turns, rubric=rubric, **kwargs)


class FramesEnv(vf.MultiTurnEnv):
    """Answers every model turn with a new frame of its ``kind``."""

    def __init__(self, *, kind: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.kind = kind

    async def setup_state(self, state: vf.State) -> None:
        state["frame_seed"] = secrets.randbits(48)  # never the same frame twice, in any run
        state["prompt"] = [self._frame_message(state, 0)]

    async def env_response(self, messages: Messages, state: vf.State) -> Messages:
        return [self._frame_message(state, state["turn"])]

    def _frame_message(self, state: vf.State, turn: int) -> dict[str, Any]:
        url = frame(self.kind, state["frame_seed"], turn)
        return {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": url}},
                {"type": "text", "text": f"Frame {turn}. What next?"},
            ],
        }


def _row(kind: str, index: int) -> dict[str, Any]:
    # the first frame is drawn per rollout (setup_state): rollouts of one row differ
    return {"prompt": [{"role": "user", "content": "Frame 0 follows."}], "info": {"row": index}}


def _turns(completion: Messages) -> float:
    return float(sum(m["role"] == "assistant" for m in completion))


@functools.cache
def _backdrop(size: tuple[int, int]) -> Image.Image:
    """A smooth colour field (what a rendered scene's large areas look like to a codec)."""
    w, h = size
    x = np.linspace(0, 1, w, dtype=np.float32)[None, :]
    y = np.linspace(0, 1, h, dtype=np.float32)[:, None]
    rgb = np.stack([x * 200 + y * 40, y * 180 + 30 + x * 0, (1 - x) * 120 + y * 90], axis=-1)
    return Image.fromarray(np.clip(rgb, 0, 255).astype(np.uint8))


def frame(kind: str, seed: int, turn: int) -> str:
    """The ``data:`` URL of rollout ``seed``'s frame at ``turn`` (unique per pair)."""
    size, fmt = KINDS[kind]
    image = _backdrop(size).copy()
    draw = ImageDraw.Draw(image)
    rng = random.Random(f"{seed}:{turn}")
    w, h = size
    for _ in range(6):
        x, y = rng.randrange(w - 80), rng.randrange(h - 80)
        r = rng.randrange(20, 80)
        colour = (rng.randrange(256), rng.randrange(256), rng.randrange(256))
        draw.ellipse((x, y, x + r, y + r), fill=colour, outline=(0, 0, 0))
    draw.text((8, 8), f"rollout {seed} turn {turn}", fill=(255, 255, 255))
    buffer = io.BytesIO()
    options = {"quality": 90} if fmt == "JPEG" else {"compress_level": 1}  # a fast encoder
    image.save(buffer, format=fmt, **options)
    mime = "png" if fmt == "PNG" else "jpeg"
    return f"data:image/{mime};base64,{base64.b64encode(buffer.getvalue()).decode()}"
