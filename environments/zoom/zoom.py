"""``zoom``: find a tiny detail in a large image with a zoom tool.

Each example is a large image (1024x768 by default, drawn with PIL from a seed) with
light clutter and a few small coloured boxes. The question asks what is inside the box
of one colour: a short code (digits and capitals, drawn with PIL's default font, about
8 px tall) or a tiny black symbol (circle, square, triangle or cross). The boxes' colours
are visible at a VLM processor's downscaled resolution; their contents are not. The
model calls ``zoom(x, y, w, h)``, which returns that region of the full-resolution image,
enlarged, as an image in the tool message, and answers inside ``<answer>...</answer>``.

Reward: ``correct_answer`` (1.0; case, spaces and punctuation ignored). Metrics:
``tool_calls`` (zoom calls made), ``zoomed_on_target`` (1.0 when a successful zoom
showed the whole target box) and ``answer_format`` (the final message has one answer).
"""

from __future__ import annotations

import functools
import json
import random
import re
from collections.abc import Mapping, Sequence
from typing import Any

from PIL import Image, ImageDraw, ImageFont

import vf_mm as vf
from vf_mm.types import Messages

BOX_COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30),
    "blue": (30, 70, 220),
    "green": (30, 150, 50),
    "orange": (240, 130, 20),
    "purple": (140, 50, 180),
    "magenta": (220, 40, 180),
    "cyan": (20, 170, 190),
    "brown": (130, 80, 30),
}
SYMBOLS = ("circle", "square", "triangle", "cross")
CODE_CHARS = "23456789ACDEFHJKLMNPRTUVWXY"  # no 0/O, 1/I, B/8, S/5 look-alikes at 8 px
KINDS = ("code", "symbol")

PRESETS: dict[str, dict[str, Any]] = {
    "easy": dict(kinds=("symbol",), code_length=3, num_distractors=0, clutter=10),
    "medium": dict(kinds=KINDS, code_length=4, num_distractors=3, clutter=40),
    "hard": dict(kinds=("code",), code_length=5, num_distractors=6, clutter=120),
}

SYSTEM_PROMPT = (
    "You answer questions about a large image. Small details are too small to read in the "
    "picture you are shown: call the zoom tool to see a region of the image at full "
    "resolution, as often as you need. When you know the answer, reply with it inside "
    "<answer></answer> tags, e.g. <answer>7K3P</answer>."
)


def load_environment(
    num_examples: int = 200,
    num_eval_examples: int = 50,
    seed: int = 0,
    width: int = 1024,
    height: int = 768,
    difficulty: str = "medium",
    kinds: Sequence[str] | None = None,
    code_length: int | None = None,
    num_distractors: int | None = None,
    clutter: int | None = None,
    overview_size: int | None = None,
    zoom_output_size: int = 448,
    max_turns: int = 5,
    system_prompt: str | None = SYSTEM_PROMPT,
    **kwargs: Any,
) -> ZoomEnv:
    """The ``zoom`` environment.

    ``difficulty``: ``easy`` | ``medium`` | ``hard`` (see ``PRESETS``); ``kinds`` (``code``,
    ``symbol``), ``code_length``, ``num_distractors`` (boxes of other colours) and
    ``clutter`` (background marks) override the preset. ``overview_size``: when set, the
    prompt shows the image downscaled so its longer side is this many pixels (for
    processors that would not downscale it themselves); ``zoom`` always crops the full
    image. ``zoom_output_size``: a crop is enlarged (up to 8x) until its longer side reaches
    this. Other keyword arguments go to ``ToolEnv`` (e.g. ``sampling_args``).
    """
    if difficulty not in PRESETS:
        raise ValueError(f"unknown difficulty {difficulty!r}; choose one of {', '.join(PRESETS)}")
    config = dict(PRESETS[difficulty])
    overrides = dict(kinds=kinds, code_length=code_length, num_distractors=num_distractors,
                     clutter=clutter)  # fmt: skip
    config.update({k: v for k, v in overrides.items() if v is not None})
    config.update(width=int(width), height=int(height), overview_size=overview_size)
    _validate(config)
    return ZoomEnv(
        dataset=build_dataset(num_examples, seed=seed, split="train", config=config),
        eval_dataset=build_dataset(num_eval_examples, seed=seed, split="eval", config=config),
        seed=seed,
        config=config,
        zoom_output_size=zoom_output_size,
        max_turns=max_turns,
        system_prompt=system_prompt,
        **kwargs,
    )


# -- the tool -------------------------------------------------------------------------------


def zoom(x: int, y: int, w: int, h: int) -> Image.Image:
    """Show a region of the full-resolution image, enlarged.

    Coordinates are pixels of the full image, origin at the top-left corner; a region
    reaching past the image's border is clipped to it.

    Args:
        x: left edge of the region
        y: top edge of the region
        w: width of the region (at least 4)
        h: height of the region (at least 4)
    """
    raise RuntimeError("zoom is only a schema: ZoomEnv.call_tool crops the rollout's image")


def crop_region(
    image: Image.Image,
    x: Any,
    y: Any,
    w: Any,
    h: Any,
    *,
    output_size: int = 448,
    max_scale: int = 8,
) -> tuple[Image.Image, tuple[int, int, int, int], str] | str:
    """``image``'s region (x, y, w, h), clipped to the image and enlarged (nearest
    neighbour, at most ``max_scale`` times, until its longer side reaches
    ``output_size``): (crop, clipped region, note), or an error string for bad arguments."""
    W, H = image.size
    values = {}
    for name, value in (("x", x), ("y", y), ("w", w), ("h", h)):
        number = _as_int(value)
        if number is None:
            return f"Error: {name} must be an integer number of pixels, got {value!r}"
        values[name] = number
    x, y, w, h = values["x"], values["y"], values["w"], values["h"]
    if w < 4 or h < 4:
        return f"Error: w and h must be at least 4 pixels, got w={w}, h={h}"
    left, top = max(0, x), max(0, y)
    right, bottom = min(W, x + w), min(H, y + h)
    if right - left < 1 or bottom - top < 1:
        return (
            f"Error: the region x={x}, y={y}, w={w}, h={h} lies outside the image, which is "
            f"{W}x{H} pixels (x in 0..{W - 1}, y in 0..{H - 1})"
        )
    region = (left, top, right - left, bottom - top)
    crop = image.crop((left, top, right, bottom))
    scale = max(1, min(max_scale, output_size // max(region[2], region[3])))
    if scale > 1:
        crop = crop.resize((region[2] * scale, region[3] * scale), Image.Resampling.NEAREST)
    note = f"Region x={left}, y={top}, w={region[2]}, h={region[3]}"
    if region != (x, y, w, h):
        note += f" (clipped to the {W}x{H} image)"
    note += f", shown {scale}x enlarged." if scale > 1 else "."
    return crop, region, note


def _as_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and re.fullmatch(r"\s*-?\d+\s*", value):
        return int(value)
    return None


class ZoomEnv(vf.ToolEnv):
    """A ``ToolEnv`` whose ``zoom`` tool crops the current rollout's full-resolution image
    (regenerated from the seed and the row's ``info``), so tools stay per rollout."""

    def __init__(self, *, seed: int, config: Mapping[str, Any], zoom_output_size: int = 448,
                 parser: vf.Parser | None = None, rubric: vf.Rubric | None = None,
                 **kwargs: Any) -> None:  # fmt: skip
        parser = parser or vf.XMLParser(["answer"], answer_field="answer")
        super().__init__(
            tools=[zoom], parser=parser, rubric=rubric or make_rubric(parser), **kwargs
        )
        self.seed = seed
        self.config = dict(config)
        self.zoom_output_size = zoom_output_size

    def full_image(self, info: Mapping[str, Any]) -> Image.Image:
        """The full-resolution image of the example ``info`` describes."""
        row = make_example(self.seed, info["split"], info["index"], self.config, full=True)
        return row["image"]

    async def setup_state(self, state: vf.State) -> None:
        state["zoom_image"] = self.full_image(state["info"])
        state["zooms"] = []  # the regions shown, as [x, y, w, h]
        state["tool_errors"] = 0

    async def call_tool(
        self, call: Mapping[str, Any], state: vf.State
    ) -> str | list[dict[str, Any]]:
        function = call.get("function") or {}
        if function.get("name") != "zoom":
            state["tool_errors"] += 1
            return await super().call_tool(call, state)  # the base names the known tools
        args = function.get("arguments") or {}
        try:
            args = json.loads(args) if isinstance(args, str) else args
        except json.JSONDecodeError as exc:
            args = f"Error: the arguments are not JSON ({exc.msg})"
        if isinstance(args, dict):
            missing = [k for k in ("x", "y", "w", "h") if k not in args]
            extra = sorted(set(args) - {"x", "y", "w", "h"})
            if missing or extra:
                args = f"Error: zoom takes x, y, w, h (integers); missing {missing}, unexpected {extra}"
        elif not isinstance(args, str):
            args = "Error: zoom's arguments must be a JSON object {x, y, w, h}"
        result = args if isinstance(args, str) else crop_region(
            state["zoom_image"], **args, output_size=self.zoom_output_size
        )  # fmt: skip
        if isinstance(result, str):
            state["tool_errors"] += 1
            return result
        crop, region, note = result
        state["zooms"].append(list(region))
        return [{"type": "image", "image": crop}, {"type": "text", "text": note}]


# -- scoring --------------------------------------------------------------------------------


def normalize_answer(text: Any) -> str:
    """Upper case, no leading article, spaces or punctuation; symbol names singular
    ("a Circle." -> "CIRCLE", "crosses" -> "CROSS", "plus" -> "CROSS", " a 7k-3p " -> "A7K3P")."""
    if text is None:
        return ""
    text = str(text).strip()
    plain = re.sub(r"[^A-Za-z0-9]", "", text).upper()
    # an article goes only before a symbol's name: a code may start with "A"
    bare = re.sub(r"[^A-Za-z0-9]", "", re.sub(r"^(?:a|an|the)\s+", "", text, flags=re.I)).upper()
    bare = SYNONYMS.get(bare, bare)
    return bare if bare.lower() in SYMBOLS else SYNONYMS.get(plain, plain)


SYNONYMS = {**{f"{s.upper()}S": s.upper() for s in SYMBOLS}, "CROSSES": "CROSS", "PLUS": "CROSS"}


def correct_answer(completion: Messages, answer: str, parser: vf.Parser) -> float:
    """1.0 when the parsed ``<answer>`` equals the expected answer after normalisation."""
    guess = parser.parse_answer(completion)
    return 1.0 if guess is not None and normalize_answer(guess) == normalize_answer(answer) else 0.0


def tool_calls(completion: Messages) -> float:
    """Tool calls the model made."""
    return float(
        sum(len(m.get("tool_calls") or []) for m in completion if m.get("role") == "assistant")
    )


def zoomed_on_target(state: vf.State, info: dict) -> float:
    """1.0 when some successful zoom showed the whole target box."""
    tx, ty, tw, th = info["target_box"]
    return float(
        any(
            x <= tx and y <= ty and x + w >= tx + tw and y + h >= ty + th
            for x, y, w, h in state.get("zooms", [])
        )
    )


def make_rubric(parser: vf.Parser) -> vf.Rubric:
    def answer_format(completion: Messages, parser: vf.Parser) -> float:
        """1.0 when the final assistant message holds exactly one answer field. (Not
        ``parser.format_reward``: it also asks it of the turns that only call a tool.)"""
        last = next((m for m in reversed(completion) if m.get("role") == "assistant"), None)
        return 0.0 if last is None else parser.format_reward([last])

    rubric = vf.Rubric(funcs=[correct_answer], weights=[1.0], parser=parser)
    for metric in (tool_calls, zoomed_on_target, answer_format):
        rubric.add_metric(metric)
    return rubric


# -- data -----------------------------------------------------------------------------------


def build_dataset(n: int, *, seed: int, split: str, config: Mapping[str, Any]) -> vf.LazyRows:
    """``n`` rows (``question``, ``answer``, ``image``, ``info``), deterministic in (seed, split):
    row ``i`` is ``make_example(seed, split, i, config)``, drawn when it is read (a run
    reads rows as it goes)."""
    return vf.LazyRows(n, functools.partial(make_example, seed, split, config=config))


def make_example(seed: int, split: str, index: int, config: Mapping[str, Any], *,
                 full: bool = False) -> dict[str, Any]:  # fmt: skip
    """One row; the same (seed, split, index, config) always gives the same row. ``full``:
    the image at full resolution even when the config asks for an overview."""
    rng = random.Random(f"zoom:{seed}:{split}:{index}")
    W, H = config["width"], config["height"]
    kind = rng.choice(tuple(config["kinds"]))
    colours = rng.sample(list(BOX_COLOURS), config["num_distractors"] + 1)
    font = ImageFont.load_default()

    contents = []
    for _ in colours:
        if kind == "code":
            contents.append("".join(rng.choice(CODE_CHARS) for _ in range(config["code_length"])))
        else:
            contents.append(rng.choice(SYMBOLS))
    if kind == "code":
        sizes = [_text_size(font, text) for text in contents]
        sizes = [(w + 8, h + 8) for w, h in sizes]
    else:
        sizes = [(16, 16)] * len(contents)
    boxes = _place_boxes(rng, sizes, W, H)

    image = Image.new("RGB", (W, H), tuple(rng.randint(235, 250) for _ in range(3)))
    draw = ImageDraw.Draw(image)
    _clutter(rng, draw, W, H, config["clutter"], avoid=boxes)
    for colour, content, (x, y, w, h) in zip(colours, contents, boxes, strict=True):
        draw.rectangle(
            (x, y, x + w - 1, y + h - 1), fill=(255, 255, 255), outline=BOX_COLOURS[colour], width=2
        )
        if kind == "code":
            left, top, _, _ = font.getbbox(content)
            draw.text((x + 4 - left, y + 4 - top), content, fill=(0, 0, 0), font=font)
        else:
            _symbol(draw, content, x + w // 2, y + h // 2, 4)
    if config.get("overview_size") and not full:
        scale = config["overview_size"] / max(W, H)
        image = image.resize(
            (max(1, round(W * scale)), max(1, round(H * scale))), Image.Resampling.BILINEAR
        )

    target = colours[0]
    if kind == "code":
        question = f"What is the code written inside the small {target} box?"
    else:
        question = (
            f"What symbol is drawn inside the small {target} box: a circle, a square, a triangle "
            "or a cross?"
        )
    shown = (
        f" (you see it downscaled to {image.width}x{image.height})" if image.size != (W, H) else ""
    )
    question += (
        f" The image is {W}x{H} pixels{shown}; zoom(x, y, w, h) shows any region of it at full "
        "resolution, in full-image pixel coordinates."
    )
    return {
        "question": question,
        "answer": contents[0],
        "image": image,
        "info": {
            "kind": kind,
            "target_colour": target,
            "target_box": list(boxes[0]),
            "boxes": [
                {"colour": c, "box": list(b), "content": t}
                for c, b, t in zip(colours, boxes, contents, strict=True)
            ],
            "width": W,
            "height": H,
            "split": split,
            "index": index,
        },
    }


def _text_size(font: Any, text: str) -> tuple[int, int]:
    left, top, right, bottom = font.getbbox(text)
    return right - left, bottom - top


def _place_boxes(
    rng: random.Random, sizes: Sequence[tuple[int, int]], W: int, H: int
) -> list[tuple[int, int, int, int]]:
    margin, gap = 12, 40
    for _ in range(100):
        boxes: list[tuple[int, int, int, int]] = []
        for w, h in sizes:
            for _ in range(500):
                x, y = rng.randint(margin, W - w - margin), rng.randint(margin, H - h - margin)
                if all(x + w + gap <= a or a + c + gap <= x or y + h + gap <= b or b + d + gap <= y
                       for a, b, c, d in boxes):  # fmt: skip
                    boxes.append((x, y, w, h))
                    break
            else:
                break
        if len(boxes) == len(sizes):
            return boxes
    raise ValueError(f"cannot place {len(sizes)} boxes in a {W}x{H} image")


def _clutter(rng: random.Random, draw: ImageDraw.ImageDraw, W: int, H: int, n: int,
             avoid: Sequence[tuple[int, int, int, int]]) -> None:  # fmt: skip
    """Pale rectangles, grey lines and dots; nothing drawn over the boxes (drawn later)."""
    for _ in range(n):
        choice = rng.random()
        tint = tuple(rng.randint(190, 235) for _ in range(3))
        x, y = rng.randint(0, W - 1), rng.randint(0, H - 1)
        if choice < 0.5:
            w, h = rng.randint(20, 160), rng.randint(20, 120)
            draw.rectangle((x, y, x + w, y + h), fill=tint)
        elif choice < 0.8:
            draw.line(
                (x, y, rng.randint(0, W - 1), rng.randint(0, H - 1)),
                fill=tint,
                width=rng.randint(1, 3),
            )
        else:
            r = rng.randint(2, 5)
            draw.ellipse((x - r, y - r, x + r, y + r), fill=tint)


def _symbol(draw: ImageDraw.ImageDraw, name: str, cx: int, cy: int, r: int) -> None:
    black = (0, 0, 0)
    if name == "circle":
        draw.ellipse((cx - r, cy - r, cx + r, cy + r), fill=black)
    elif name == "square":
        draw.rectangle((cx - r + 1, cy - r + 1, cx + r - 1, cy + r - 1), fill=black)
    elif name == "triangle":
        draw.polygon([(cx, cy - r), (cx + r, cy + r - 1), (cx - r, cy + r - 1)], fill=black)
    else:
        draw.line((cx - r, cy, cx + r, cy), fill=black, width=2)
        draw.line((cx, cy - r, cx, cy + r), fill=black, width=2)


def _validate(config: Mapping[str, Any]) -> None:
    bad = [k for k in config["kinds"] if k not in KINDS]
    if bad or not config["kinds"]:
        raise ValueError(f"kinds must be among {KINDS}, got {bad or '()'}")
    if not 1 <= config["code_length"] <= 12:
        raise ValueError(f"code_length must be in 1..12, got {config['code_length']}")
    if not 0 <= config["num_distractors"] < len(BOX_COLOURS):
        raise ValueError(f"num_distractors must be in 0..{len(BOX_COLOURS) - 1}")
    if config["width"] < 128 or config["height"] < 128:
        raise ValueError("width and height must be at least 128 px")
    if config["clutter"] < 0:
        raise ValueError("clutter must be >= 0")
    if config["overview_size"] is not None and config["overview_size"] < 32:
        raise ValueError("overview_size must be at least 32 px")
