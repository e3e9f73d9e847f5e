"""Tiny checkpoints (built once per test session, offline) and a conversation generator."""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from vf_mm.models import load_processor
from vf_mm.renderers import load_renderer
from vf_mm.testing import FAMILIES, build_tiny_vlm, chat_template


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("tiny")
    return {family: build_tiny_vlm(root / family, family) for family in FAMILIES}


@pytest.fixture(scope="session")
def kimi_k25_checkpoint(tmp_path_factory) -> Path:
    """The tiny Kimi-K2.5 checkpoint, built once for its image and video tests (they read
    it, never write it)."""
    return build_tiny_vlm(tmp_path_factory.mktemp("kimi_k25") / "m", "kimi_k25")


@pytest.fixture(scope="session")
def glm46v_checkpoint(tmp_path_factory) -> Path:
    """The tiny GLM-4.6V checkpoint, built once for its tests (they read it, never write it)."""
    return build_tiny_vlm(tmp_path_factory.mktemp("glm46v") / "m", "glm46v")


@pytest.fixture(scope="session")
def gemma4_variants(tmp_path_factory):
    """A tiny Gemma 4 checkpoint per template variant, by name (one build, the template
    swapped: the tests that take it use the tokenizer and processors, not the weights)."""
    root = tmp_path_factory.mktemp("gemma4")
    base = build_tiny_vlm(root / "base", "gemma4")
    paths: dict[str, Path] = {}

    def get(variant: str) -> Path:
        if variant not in paths:
            path = Path(shutil.copytree(base, root / variant))
            (path / "chat_template.jinja").write_text(chat_template("gemma4", variant))
            paths[variant] = path
        return paths[variant]

    return get


@pytest.fixture(scope="session", params=FAMILIES)
def family(request) -> str:
    return request.param


@pytest.fixture(scope="session")
def renderer_and_processor(checkpoints, family):
    return load_renderer(checkpoints[family]), load_processor(checkpoints[family])


def random_image(rng: random.Random, *, min_side: int = 28, max_w: int = 1280, max_h: int = 720):
    w, h = rng.randint(min_side, max_w), rng.randint(min_side, max_h)
    arr = np.random.default_rng(rng.randrange(2**32)).integers(0, 256, (h, w, 3), dtype=np.uint8)
    return Image.fromarray(arr)


def image_part(rng: random.Random, pool: list) -> dict[str, Any]:
    """A fresh image, or (1 in 4) one already used in the conversation."""
    if pool and rng.random() < 0.25:
        img = rng.choice(pool)
    else:
        img = random_image(rng)
        pool.append(img)
    return {"type": "image", "image": img}


def content(rng: random.Random, pool: list, max_images: int, words: str) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = [image_part(rng, pool) for _ in range(rng.randint(0, max_images))]
    parts.insert(rng.randint(0, len(parts)), {"type": "text", "text": words})
    return parts


def conversation(seed: int, *, max_turns: int = 8) -> list[dict[str, Any]]:
    """1..max_turns user turns with 0-3 images each, assistant replies, tool results with
    images, sometimes a system message with an image; ends with a user or tool turn."""
    rng = random.Random(seed)
    pool: list = []
    msgs: list[dict[str, Any]] = []
    if rng.random() < 0.5:
        msgs.append({"role": "system", "content": content(rng, pool, 1, "You count shapes.")})
    for turn in range(rng.randint(1, max_turns)):
        msgs.append(
            {"role": "user", "content": content(rng, pool, 3, f"How many circles in {turn}?")}
        )
        if rng.random() < 0.3:
            msgs.append(
                {
                    "role": "assistant",
                    "content": '<tool_call>\n{"name": "zoom", "arguments": {"x": 1}}\n</tool_call>',
                }
            )
            msgs.append(
                {"role": "tool", "tool_call_id": "c0", "content": content(rng, pool, 2, "zoomed")}
            )
        msgs.append({"role": "assistant", "content": f"There are {rng.randint(0, 9)} circles."})
    msgs.pop()  # end on the user / tool turn the model answers next
    return msgs
