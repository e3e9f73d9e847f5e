"""A small verifiers tool environment whose tool returns images, and its native vf_mm twin.

The verifiers environment is written as a verifiers user writes one (verifiers 0.3.x):
a ``vf.ToolEnv`` over a ``datasets.Dataset`` of chat prompts, a tool that answers with
content parts (an ``image_url`` part holding a PNG ``data:`` URL, and text: what a
verifiers tool message may hold), a ``vf.Rubric``. ``vf-mm eval`` loads this file by
path (``load_environment``). ``native_twin()`` does the same thing with vf_mm's
``ToolEnv`` (its tool returns a PIL image and text), and ``policy`` is a scripted model
that calls the tool twice, then answers: the same replies for both.

Imported only by the verifiers tier (it imports verifiers).
"""

from __future__ import annotations

import re

import verifiers as vf
from datasets import Dataset
from PIL import Image, ImageDraw

import vf_mm
from vf_mm.images import png_data_url
from vf_mm.renderers import format_tool_calls

QUESTION = "How many dots? Use draw to compare; answer inside <answer></answer>."


def dots(n: int) -> Image.Image:
    """A white picture with n black dots on a row."""
    image = Image.new("RGB", (80, 32), "white")
    draw = ImageDraw.Draw(image)
    for i in range(n):
        draw.ellipse((4 + i * 14, 11, 14 + i * 14, 21), fill="black")
    return image


def prompt(n: int) -> list[dict]:
    """Every content a list of parts: Arrow cannot hold a str beside a list in one column."""
    return [
        {"role": "system", "content": [{"type": "text", "text": "Count carefully."}]},
        {"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": png_data_url(dots(n))}},
            {"type": "text", "text": QUESTION},
        ]},
    ]  # fmt: skip


def draw(count: int) -> list[dict]:
    """Draw a reference picture with that many dots.

    Args:
        count: how many dots to draw
    """
    return [
        {"type": "image_url", "image_url": {"url": png_data_url(dots(count))}},
        {"type": "text", "text": f"{count} dots"},
    ]


def answered(text: str) -> str | None:
    found = re.findall(r"<answer>(.*?)</answer>", text or "")
    return found[-1].strip() if found else None


def correct(completion, answer) -> float:
    """1.0 when the last message's <answer> is the row's answer."""
    return float(answered(completion[-1].content) == answer)


def rows(counts=(2, 3, 4)) -> list[dict]:
    return [{"prompt": prompt(n), "answer": str(n)} for n in counts]


def load_environment(counts=(2, 3, 4), **kwargs) -> vf.ToolEnv:
    return vf.ToolEnv(
        tools=[draw],
        dataset=Dataset.from_list(rows(counts)),
        rubric=vf.Rubric(funcs=[correct]),
        max_turns=4,
        **kwargs,
    )


def native_draw(count: int):
    """Draw a reference picture with that many dots.

    Args:
        count: how many dots to draw
    """
    return [dots(count), f"{count} dots"]


native_draw.__name__ = "draw"


def native_correct(completion, answer) -> float:
    return float(answered(completion[-1]["content"]) == answer)


def native_twin(counts=(2, 3, 4), *, tools=None) -> vf_mm.ToolEnv:
    """The same environment written for vf_mm. ``tools``: the tool schemas to show the
    model (default: vf_mm's own, from the signature; a template that renders tools needs
    the very schema verifiers sends to give the same tokens)."""
    env = vf_mm.ToolEnv(
        tools=[native_draw],
        dataset=rows(counts),
        rubric=vf_mm.Rubric([native_correct]),
        max_turns=4,
    )
    if tools is not None:
        env.tools = tools
    return env


def policy(request) -> str:
    """The scripted model: draw 1 dot, then 2, then answer 2 (right for the first row)."""
    shown = sum(m["role"] == "tool" for m in request.messages)
    if shown < 2:
        return format_tool_calls([("draw", {"count": shown + 1})])
    return "<answer>2</answer>"
