"""``shapes``: single-turn visual questions about coloured shapes on a plain background.

Each example is an image (drawn with PIL from a seed, no files) holding a few circles,
squares and triangles in a few colours, and one question about it: how many shapes of
a colour and kind there are, what colour the only shape of a kind is, or what shape
the only shape of a colour is (and, on request, a yes/no question: is there a ...).
The model answers inside ``<answer>...</answer>``; the reward is exact-match
correctness after normalisation (case, whitespace, articles, plurals, numbers written
as words). ``format_reward`` is reported as a metric.

``difficulty="easy"`` asks only "How many circles are there?" about 1 to 3 big red
circles, so the answer is one of three digits: a policy can earn reward from the answer
format and distribution alone, which a tiny model learns in minutes.
"""

from __future__ import annotations

import functools
import random
import re
from collections.abc import Sequence
from typing import Any

from PIL import Image, ImageDraw

import vf_mm as vf

COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "green": (40, 160, 60),
    "blue": (40, 80, 220),
    "yellow": (230, 190, 20),
    "purple": (140, 60, 180),
    "orange": (245, 130, 30),
}
SHAPES = ("circle", "square", "triangle")
QUESTION_TYPES = ("count", "colour", "shape", "exists")

# Per difficulty: how many shapes, which colours and kinds, which questions, the range
# of answers to a counting question, shape radius as a fraction of the image side.
PRESETS: dict[str, dict[str, Any]] = {
    "easy": dict(
        min_shapes=1, max_shapes=3, colours=("red",), shapes=("circle",),
        question_types=("count",), count_range=(1, 3), radius=(0.10, 0.14),
    ),
    "medium": dict(
        min_shapes=3, max_shapes=6, colours=("red", "green", "blue", "yellow"), shapes=SHAPES,
        question_types=("count", "colour", "shape"), count_range=(0, 3), radius=(0.06, 0.10),
    ),
    "hard": dict(
        min_shapes=5, max_shapes=10, colours=tuple(COLOURS), shapes=SHAPES,
        question_types=("count", "colour", "shape"), count_range=(0, 4), radius=(0.04, 0.075),
    ),
}  # fmt: skip

SYSTEM_PROMPT = (
    "Look at the image and answer the question. Put only the final answer inside "
    "<answer></answer> tags: a number written as digits, a colour or a shape, e.g. "
    "<answer>2</answer>."
)

NUMBER_WORDS = {
    w: i
    for i, w in enumerate(
        "zero one two three four five six seven eight nine ten eleven twelve".split()
    )
}


def load_environment(
    num_examples: int = 200,
    num_eval_examples: int = 50,
    seed: int = 0,
    image_size: int | Sequence[int] = 224,
    difficulty: str = "medium",
    question_types: Sequence[str] | None = None,
    min_shapes: int | None = None,
    max_shapes: int | None = None,
    colours: Sequence[str] | None = None,
    system_prompt: str | None = SYSTEM_PROMPT,
    **kwargs: Any,
) -> vf.SingleTurnEnv:
    """The ``shapes`` environment.

    ``difficulty``: ``easy`` | ``medium`` | ``hard`` (see ``PRESETS``); ``question_types``,
    ``min_shapes``, ``max_shapes`` and ``colours`` override the preset. ``image_size``: an
    int (square) or ``(width, height)``. Other keyword arguments go to ``SingleTurnEnv``
    (e.g. ``sampling_args``).
    """
    config = make_config(
        difficulty,
        image_size=image_size,
        question_types=question_types,
        min_shapes=min_shapes,
        max_shapes=max_shapes,
        colours=colours,
    )
    parser = vf.XMLParser(["answer"], answer_field="answer")
    rubric = vf.Rubric(funcs=[correct_answer], weights=[1.0], parser=parser)
    rubric.add_metric(parser.format_reward)
    return vf.SingleTurnEnv(
        dataset=build_dataset(num_examples, seed=seed, split="train", config=config),
        eval_dataset=build_dataset(num_eval_examples, seed=seed, split="eval", config=config),
        system_prompt=system_prompt,
        parser=parser,
        rubric=rubric,
        **kwargs,
    )


# -- scoring ------------------------------------------------------------------------------


def normalize_answer(text: Any) -> str:
    """Lower case, single spaces, no surrounding punctuation or article; numbers as digits;
    shapes singular ("Circles" -> "circle", "Three" -> "3", " the Red. " -> "red")."""
    if text is None:
        return ""
    t = re.sub(r"\s+", " ", str(text).strip().lower()).strip(" .,;:!?\"'`")
    t = re.sub(r"^(the|a|an) ", "", t)
    if t in NUMBER_WORDS:
        return str(NUMBER_WORDS[t])
    if t.isdigit():
        return str(int(t))
    if t.endswith("s") and t[:-1] in SHAPES:
        return t[:-1]
    return {"grey": "gray", "color": "colour"}.get(t, t)


def correct_answer(completion: Any, answer: str, parser: vf.Parser) -> float:
    """1.0 when the parsed ``<answer>`` equals the expected answer after normalisation."""
    guess = parser.parse_answer(completion)
    return 1.0 if guess is not None and normalize_answer(guess) == normalize_answer(answer) else 0.0


# -- data ---------------------------------------------------------------------------------


def make_config(
    difficulty: str = "medium",
    *,
    image_size: int | Sequence[int] = 224,
    question_types: Sequence[str] | None = None,
    min_shapes: int | None = None,
    max_shapes: int | None = None,
    colours: Sequence[str] | None = None,
) -> dict[str, Any]:
    if difficulty not in PRESETS:
        raise ValueError(f"unknown difficulty {difficulty!r}; choose one of {', '.join(PRESETS)}")
    config = dict(PRESETS[difficulty])
    if question_types is not None:
        config["question_types"] = tuple(question_types)
    if min_shapes is not None:
        config["min_shapes"] = min_shapes
    if max_shapes is not None:
        config["max_shapes"] = max_shapes
    if colours is not None:
        config["colours"] = tuple(colours)
    width, height = (image_size, image_size) if isinstance(image_size, int) else image_size
    config["size"] = (int(width), int(height))
    bad = [q for q in config["question_types"] if q not in QUESTION_TYPES]
    if bad or not config["question_types"]:
        raise ValueError(f"question_types must be among {QUESTION_TYPES}, got {bad or '()'}")
    bad = [c for c in config["colours"] if c not in COLOURS]
    if bad or not config["colours"]:
        raise ValueError(f"colours must be among {tuple(COLOURS)}, got {bad or '()'}")
    if not 1 <= config["min_shapes"] <= config["max_shapes"] <= 20:
        raise ValueError("need 1 <= min_shapes <= max_shapes <= 20")
    if min(config["size"]) < 32:
        raise ValueError(f"image_size must be at least 32 px, got {config['size']}")
    return config


def build_dataset(n: int, *, seed: int, split: str, config: dict[str, Any]) -> vf.LazyRows:
    """``n`` rows (``question``, ``answer``, ``image``, ``info``), deterministic in (seed, split):
    row ``i`` is ``make_example(seed, split, i, config)``, drawn when it is read (a run
    reads rows as it goes, so a million examples cost nothing until they are used)."""
    return vf.LazyRows(n, functools.partial(make_example, seed, split, config=config))


def make_example(seed: int, split: str, index: int, config: dict[str, Any]) -> dict[str, Any]:
    """One row; the same (seed, split, index, config) always gives the same row."""
    rng = random.Random(f"shapes:{seed}:{split}:{index}")
    qtype = rng.choice(config["question_types"])
    items, question, answer = _scene(rng, qtype, config)
    width, height = config["size"]
    placed = _place(rng, len(items), width, height, config["radius"])
    shapes = [
        {"shape": shape, "colour": colour, "x": x, "y": y, "r": r}
        for (shape, colour), (x, y, r) in zip(items, placed, strict=True)
    ]
    background = (255, 255, 255) if len(config["colours"]) == 1 else _pale(rng)
    return {
        "question": question,
        "answer": answer,
        "image": render(shapes, (width, height), background),
        "info": {"question_type": qtype, "split": split, "index": index, "shapes": shapes},
    }


def render(
    shapes: Sequence[dict[str, Any]],
    size: tuple[int, int],
    background: tuple[int, int, int] = (255, 255, 255),
) -> Image.Image:
    """Draw ``shapes`` (dicts with shape, colour, x, y, r) on a ``size`` RGB image."""
    image = Image.new("RGB", size, background)
    draw = ImageDraw.Draw(image)
    for s in shapes:
        x, y, r, fill = s["x"], s["y"], s["r"], COLOURS[s["colour"]]
        if s["shape"] == "circle":
            draw.ellipse((x - r, y - r, x + r, y + r), fill=fill)
        elif s["shape"] == "square":
            h = round(r * 0.85)
            draw.rectangle((x - h, y - h, x + h, y + h), fill=fill)
        else:
            draw.polygon(
                [
                    (x, y - r),
                    (x + round(r * 0.94), y + r * 0.7),
                    (x - round(r * 0.94), y + r * 0.7),
                ],
                fill=fill,
            )
    return image


def _scene(rng: random.Random, qtype: str, config: dict[str, Any]) -> tuple[list, str, str]:
    """The (shape, colour) items of a scene, and its question and answer."""
    colours, kinds = list(config["colours"]), list(config["shapes"])
    combos = [(s, c) for s in kinds for c in colours]
    n = rng.randint(config["min_shapes"], config["max_shapes"])
    if qtype in ("count", "exists"):
        target = rng.choice(combos)
        others = [c for c in combos if c != target]
        low, high = config["count_range"] if qtype == "count" else (0, 1)
        if not others:  # one kind of shape in one colour: every shape is a target
            low = max(low, config["min_shapes"], 1)
            n = k = rng.randint(low, max(low, min(high, config["max_shapes"])))
        else:
            k = rng.randint(min(low, n), min(high, n))
        items = [target] * k + [rng.choice(others) for _ in range(n - k)]
        shape, colour = target
        if qtype == "count":
            if len(colours) == 1:
                question = f"How many {shape}s are there?"
            else:
                question = f"How many {colour} {shape}s are there?"
            answer = str(k)
        else:
            question = f"Is there a {colour} {shape} in the image? Answer yes or no."
            answer = "yes" if k else "no"
    elif qtype == "colour":  # exactly one shape of the asked kind
        shape = rng.choice(kinds)
        colour = rng.choice(colours)
        other_kinds = [s for s in kinds if s != shape]
        rest = (
            [(rng.choice(other_kinds), rng.choice(colours)) for _ in range(n - 1)]
            if other_kinds
            else []
        )
        items = [(shape, colour), *rest]
        question, answer = f"What colour is the {shape}?", colour
    else:  # "shape": exactly one shape of the asked colour
        shape = rng.choice(kinds)
        colour = rng.choice(colours)
        other_colours = [c for c in colours if c != colour]
        rest = (
            [(rng.choice(kinds), rng.choice(other_colours)) for _ in range(n - 1)]
            if other_colours
            else []
        )
        items = [(shape, colour), *rest]
        question, answer = f"What shape is the {colour} one?", shape
    rng.shuffle(items)
    return items, question, answer


def _place(
    rng: random.Random, n: int, width: int, height: int, radius: tuple[float, float]
) -> list[tuple[int, int, int]]:
    """``n`` non-overlapping (x, y, r) discs inside the image; shrinks them if crowded."""
    side = min(width, height)
    low, high = radius
    for _ in range(50):
        placed: list[tuple[int, int, int]] = []
        for _ in range(n):
            for _ in range(200):
                r = max(4, round(rng.uniform(low, high) * side))
                x = rng.randint(r + 2, width - r - 3)
                y = rng.randint(r + 2, height - r - 3)
                if all((x - a) ** 2 + (y - b) ** 2 > (r + c + 4) ** 2 for a, b, c in placed):
                    placed.append((x, y, r))
                    break
            else:
                break
        if len(placed) == n:
            return placed
        low, high = low * 0.85, high * 0.85
    raise ValueError(f"cannot fit {n} shapes in a {width}x{height} image")


def _pale(rng: random.Random) -> tuple[int, int, int]:
    return (rng.randint(228, 250), rng.randint(228, 250), rng.randint(228, 250))
