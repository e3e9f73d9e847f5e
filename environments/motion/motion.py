"""``motion``: questions about a short synthetic video, with tools that replay it.

Each example is a short clip (16 frames of 112x112 pixels at 4 fps by default) drawn with
PIL and numpy from a seed: a pale background, lightly cluttered with static marks, and a
few coloured objects. Nothing about the clip is stored but its description in ``info``
(objects, paths, on/off schedules): the frames are drawn again whenever a prompt or a
tool needs them. The question is of one of three kinds:

- ``direction``: a ball moves in a straight line: "Which way did the red ball move: left,
  right, up or down?";
- ``blinks``: a light (a disc, dark grey when off) blinks 1 to 5 times: "How many times
  did the yellow light blink?" (the answer counts its off -> on switches; it starts off);
- ``which_first``: two shapes appear at different times and stay: "Which appeared first:
  the red circle or the blue square?".

The model sees the clip in the first user message and may call two tools, each answered
with a video in the tool message: ``slow_replay(factor)`` draws the same motion again at a
``factor`` times finer time step, played at the same frame rate (so ``factor`` times
slower; frame ``factor * k`` of the replay is frame ``k`` of the clip), and
``zoom_clip(x, y, w, h)`` shows a region of every frame, enlarged. Bad arguments are
answered with an ``Error: ...`` string. The answer goes inside ``<answer>...</answer>``.

Reward: ``correct_answer`` (1.0; case, punctuation and filler words ignored, number words
count as digits: "Left." == "left", "three times" == "3"; for ``which_first`` the colour,
the shape or both name the shape). Metrics: ``tool_calls`` (tool calls made) and
``answer_format`` (the final message holds exactly one answer).
"""

from __future__ import annotations

import functools
import math
import random
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from PIL import Image, ImageDraw

import vf_mm as vf
from vf_mm.types import Messages
from vf_mm.videos import Video

COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30),
    "blue": (30, 70, 220),
    "green": (30, 150, 50),
    "orange": (240, 130, 20),
    "purple": (140, 50, 180),
    "magenta": (220, 40, 180),
    "cyan": (20, 170, 190),
    "yellow": (235, 200, 0),
}
LIGHT_OFF = (70, 70, 70)  # a light that is off is a dark grey disc, so its place shows
SHAPES = ("circle", "square", "triangle", "diamond")
DIRECTIONS = ("left", "right", "up", "down")
KINDS = ("direction", "blinks", "which_first")

PRESETS: dict[str, dict[str, Any]] = {
    "easy": dict(kinds=("direction", "blinks"), num_distractors=0, clutter=0, max_blinks=3,
                 min_phase_frames=2),
    "medium": dict(kinds=KINDS, num_distractors=0, clutter=6, max_blinks=5, min_phase_frames=1),
    "hard": dict(kinds=KINDS, num_distractors=2, clutter=20, max_blinks=5, min_phase_frames=1),
}  # fmt: skip

VIDEO_OPTIONS = ("fps", "num_frames", "min_pixels", "max_pixels", "do_sample_frames")

#: the default system prompt; ``{max_slow_factor}`` is filled in
SYSTEM_PROMPT = (
    "You answer questions about a short video clip. Two tools show it again: "
    "slow_replay(factor) replays the same motion factor times slower (factor 2 to "
    "{max_slow_factor}), and zoom_clip(x, y, w, h) shows a region of every frame enlarged "
    "(pixels of the frame, origin at the top-left corner). Call a tool by writing, e.g., "
    '<tool_call>{"name": "slow_replay", "arguments": {"factor": 2}}</tool_call>. When you '
    "know the answer, reply with it inside <answer></answer> tags, e.g. <answer>left</answer> "
    "or <answer>3</answer>."
)


def load_environment(
    num_examples: int = 200,
    num_eval_examples: int = 50,
    seed: int = 0,
    width: int = 112,
    height: int = 112,
    num_frames: int = 16,
    fps: float = 4.0,
    difficulty: str = "medium",
    kinds: Sequence[str] | None = None,
    num_distractors: int | None = None,
    clutter: int | None = None,
    max_blinks: int | None = None,
    min_phase_frames: int | None = None,
    max_slow_factor: int = 4,
    zoom_output_size: int = 224,
    video_options: Mapping[str, Any] | None = None,
    max_turns: int = 4,
    system_prompt: str | None = SYSTEM_PROMPT,
    **kwargs: Any,
) -> MotionEnv:
    """The ``motion`` environment.

    ``width`` x ``height`` pixels, ``num_frames`` frames at ``fps`` frames per second.
    ``difficulty``: ``easy`` | ``medium`` | ``hard`` (see ``PRESETS``); ``kinds``
    (``direction``, ``blinks``, ``which_first``), ``num_distractors`` (other balls, lights
    or shapes), ``clutter`` (static background marks), ``max_blinks`` (1..5) and
    ``min_phase_frames`` (the fewest frames a light stays on or off) override the preset.
    ``max_slow_factor``: the largest ``slow_replay`` factor; ``zoom_output_size``: a zoomed
    region is enlarged (up to 4x) until its longer side reaches this. ``video_options``:
    processing options put in every video part (e.g. ``{"fps": 4}``, or
    ``{"do_sample_frames": False}`` so a Qwen3-VL processor keeps every frame instead of
    sampling 2 fps). ``system_prompt``: ``{max_slow_factor}`` in it is filled in. Other
    keyword arguments go to ``ToolEnv`` (e.g. ``sampling_args``).
    """
    if difficulty not in PRESETS:
        raise ValueError(f"unknown difficulty {difficulty!r}; choose one of {', '.join(PRESETS)}")
    config = dict(PRESETS[difficulty])
    overrides = dict(kinds=kinds, num_distractors=num_distractors, clutter=clutter,
                     max_blinks=max_blinks, min_phase_frames=min_phase_frames)  # fmt: skip
    config.update({k: v for k, v in overrides.items() if v is not None})
    config.update(width=int(width), height=int(height), num_frames=int(num_frames), fps=fps)
    config["kinds"] = tuple(config["kinds"])
    _validate(config)
    return MotionEnv(
        dataset=build_dataset(num_examples, seed=seed, split="train", config=config),
        eval_dataset=build_dataset(num_eval_examples, seed=seed, split="eval", config=config),
        max_slow_factor=max_slow_factor,
        zoom_output_size=zoom_output_size,
        video_options=video_options,
        max_turns=max_turns,
        system_prompt=system_prompt
        and system_prompt.replace("{max_slow_factor}", str(max_slow_factor)),
        **kwargs,
    )


# -- the tools ------------------------------------------------------------------------------


def slow_clip(
    info: Mapping[str, Any], factor: Any, *, max_factor: int = 4
) -> tuple[Video, int, str] | str:
    """The clip ``info`` describes, drawn at a ``factor`` times finer time step and played at
    its own frame rate: ``(T - 1) * factor + 1`` frames, frame ``factor * k`` equal to the
    clip's frame ``k``. Returns (video, factor, note), or an error string for a bad factor."""
    number = _as_int(factor)
    if number is None or not 2 <= number <= max_factor:
        return f"Error: factor must be a whole number from 2 to {max_factor}, got {factor!r}"
    video = render_clip(info, factor=number)
    duration = info["num_frames"] / info["fps"]
    note = (
        f"Slow replay, {number}x slower: {video.num_frames} frames at {info['fps']:g} fps "
        f"({video.num_frames / info['fps']:.1f} s for the clip's {duration:.1f} s); frame "
        f"{number}k of the replay is frame k of the clip."
    )
    return video, number, note


def zoom_frames(
    video: Video, x: Any, y: Any, w: Any, h: Any, *, output_size: int = 224, max_scale: int = 4
) -> tuple[Video, tuple[int, int, int, int], str] | str:
    """The region (x, y, w, h) of every frame of ``video``, clipped to the frame and
    enlarged (nearest neighbour, at most ``max_scale`` times, until its longer side reaches
    ``output_size``): (video, clipped region, note), or an error string for bad arguments."""
    W, H = video.width, video.height
    values = {}
    for name, value in (("x", x), ("y", y), ("w", w), ("h", h)):
        number = _as_int(value)
        if number is None:
            return f"Error: {name} must be an integer number of pixels, got {value!r}"
        values[name] = number
    x, y, w, h = values["x"], values["y"], values["w"], values["h"]
    if w < 8 or h < 8:
        return f"Error: w and h must be at least 8 pixels, got w={w}, h={h}"
    left, top = max(0, x), max(0, y)
    right, bottom = min(W, x + w), min(H, y + h)
    if right - left < 1 or bottom - top < 1:
        return (
            f"Error: the region x={x}, y={y}, w={w}, h={h} lies outside the frames, which are "
            f"{W}x{H} pixels (x in 0..{W - 1}, y in 0..{H - 1})"
        )
    region = (left, top, right - left, bottom - top)
    scale = max(1, min(max_scale, output_size // max(region[2], region[3])))
    crop = video.frames[:, top:bottom, left:right]
    if scale > 1:
        crop = crop.repeat(scale, axis=1).repeat(scale, axis=2)
    zoomed = Video(_locked(np.ascontiguousarray(crop)), video.fps)
    note = f"Region x={left}, y={top}, w={region[2]}, h={region[3]} of every frame"
    if region != (x, y, w, h):
        note += f" (clipped to the {W}x{H} frame)"
    note += f", shown {scale}x enlarged" if scale > 1 else ""
    rate = f" at {video.fps:g} fps" if video.fps else ""
    return zoomed, region, f"{note}: {zoomed.num_frames} frames{rate}."


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


class MotionEnv(vf.ToolEnv):
    """A ``ToolEnv`` whose tools, ``slow_replay`` and ``zoom_clip``, act on the current
    rollout's clip (drawn again from the row's ``info``); the prompt's clip is drawn the
    same way when the row is formatted, so the dataset holds no frames."""

    def __init__(
        self,
        *,
        max_slow_factor: int = 4,
        zoom_output_size: int = 224,
        video_options: Mapping[str, Any] | None = None,
        parser: vf.Parser | None = None,
        rubric: vf.Rubric | None = None,
        **kwargs: Any,
    ) -> None:
        slow, size = _as_int(max_slow_factor), _as_int(zoom_output_size)
        if slow is None or slow < 2:
            raise ValueError(f"max_slow_factor must be an integer >= 2, got {max_slow_factor!r}")
        if size is None or size < 8:
            raise ValueError(f"zoom_output_size must be an integer >= 8, got {zoom_output_size!r}")
        self.max_slow_factor = slow
        self.zoom_output_size = size
        self.video_options = dict(video_options or {})
        unknown = sorted(set(self.video_options) - set(VIDEO_OPTIONS))
        if unknown:
            raise ValueError(f"video_options may set {', '.join(VIDEO_OPTIONS)}; not {unknown}")
        parser = parser or vf.XMLParser(["answer"], answer_field="answer")
        super().__init__(
            tools=[self.slow_replay, self.zoom_clip],
            parser=parser,
            rubric=rubric or make_rubric(parser),
            **kwargs,
        )

    def video_part(self, video: Video) -> dict[str, Any]:
        """A video content part for ``video``, with this environment's processing options."""
        return {"type": "video", "video": video, **self.video_options}

    def format_prompt(self, row: Mapping[str, Any]) -> Messages:
        """The row's prompt, its clip drawn from ``info`` as the ``video`` column."""
        return super().format_prompt({**row, "video": self.video_part(render_clip(row["info"]))})

    async def setup_state(self, state: vf.State) -> None:
        state["clip"] = render_clip(state["info"])
        state["replays"] = []  # what the tools showed: ["slow", factor] or ["zoom", x, y, w, h]
        state["tool_errors"] = 0

    async def call_tool(
        self, call: Mapping[str, Any], state: vf.State
    ) -> str | list[dict[str, Any]]:
        result = await super().call_tool(call, state)  # parses the arguments, runs the tool
        if isinstance(result, str) and result.startswith("Error"):
            state["tool_errors"] += 1
        return result

    def slow_replay(self, state: vf.State, factor: int) -> str | list[Any]:
        """Replay the clip slowed down: the same motion drawn at a finer time step.

        The replay puts factor - 1 new frames between each two frames of the clip and plays
        at the clip's frame rate, so it lasts factor times as long; frame factor*k of the
        replay is frame k of the clip.

        Args:
            factor: how many times slower, a whole number from 2 (at most 4 by default)
        """
        result = slow_clip(state["info"], factor, max_factor=self.max_slow_factor)
        if isinstance(result, str):
            return result
        video, factor, note = result
        state["replays"].append(["slow", factor])
        return [self.video_part(video), note]

    def zoom_clip(self, state: vf.State, x: int, y: int, w: int, h: int) -> str | list[Any]:
        """Show a region of every frame of the clip, enlarged.

        Coordinates are pixels of a frame, origin at the top-left corner; a region reaching
        past the frame's border is clipped to it.

        Args:
            x: left edge of the region
            y: top edge of the region
            w: width of the region (at least 8)
            h: height of the region (at least 8)
        """
        result = zoom_frames(state["clip"], x, y, w, h, output_size=self.zoom_output_size)
        if isinstance(result, str):
            return result
        video, region, note = result
        state["replays"].append(["zoom", *region])
        return [self.video_part(video), note]


# -- scoring --------------------------------------------------------------------------------

NUMBER_WORDS = {"zero": "0", "no": "0", "none": "0", "never": "0", "one": "1", "once": "1",
                "two": "2", "twice": "2", "three": "3", "thrice": "3", "four": "4", "five": "5",
                "six": "6", "seven": "7", "eight": "8", "nine": "9", "ten": "10"}  # fmt: skip
DIRECTION_WORDS = {
    **{d: d for d in DIRECTIONS},
    **{f"{d}ward": d for d in DIRECTIONS},
    **{f"{d}wards": d for d in DIRECTIONS},
    "upwards": "up",
    "downwards": "down",
}
FILLER = frozenset(
    "a an the it its is was has had did does to toward towards ball light shape moved moves "
    "moving move went goes blinked blinks blink blinking flashed flashes times time in".split()
)


def normalize_answer(text: Any) -> str:
    """Lower case words without punctuation or filler words, number words as digits and
    direction words plain ("Left." -> "left", "It moved to the LEFT" -> "left",
    "three times" -> "3", "Twice!" -> "2", "the Red circle" -> "red circle")."""
    if text is None:
        return ""
    words = re.findall(r"[a-z]+|[0-9]+", str(text).lower())
    words = [NUMBER_WORDS.get(w, DIRECTION_WORDS.get(w, w)) for w in words if w not in FILLER]
    return " ".join(str(int(w)) if w.isdigit() else w for w in words)


def answer_matches(guess: Any, answer: str, info: Mapping[str, Any]) -> bool:
    """Whether ``guess`` gives ``answer``. For ``which_first`` the guess must name the shape
    that appeared first by its colour, its shape or both, and name nothing of the other."""
    if guess is None:
        return False
    if info.get("kind") != "which_first":
        return normalize_answer(guess) == normalize_answer(answer)
    first, other = info["objects"][0], info["objects"][1]
    said = set(normalize_answer(guess).split())
    return bool(said & {first["colour"], first["shape"]}) and not (
        said & {other["colour"], other["shape"]}
    )


def correct_answer(completion: Messages, answer: str, info: dict, parser: vf.Parser) -> float:
    """1.0 when the parsed ``<answer>`` gives the expected answer (``answer_matches``)."""
    return 1.0 if answer_matches(parser.parse_answer(completion), answer, info) else 0.0


def tool_calls(completion: Messages) -> float:
    """Tool calls the model made."""
    return float(
        sum(len(m.get("tool_calls") or []) for m in completion if m.get("role") == "assistant")
    )


def make_rubric(parser: vf.Parser) -> vf.Rubric:
    def answer_format(completion: Messages, parser: vf.Parser) -> float:
        """1.0 when the final assistant message holds exactly one answer field. (Not
        ``parser.format_reward``: it also asks it of the turns that only call a tool.)"""
        last = next((m for m in reversed(completion) if m.get("role") == "assistant"), None)
        return 0.0 if last is None else parser.format_reward([last])

    rubric = vf.Rubric(funcs=[correct_answer], weights=[1.0], parser=parser)
    for metric in (tool_calls, answer_format):
        rubric.add_metric(metric)
    return rubric


# -- data -----------------------------------------------------------------------------------


def build_dataset(n: int, *, seed: int, split: str, config: Mapping[str, Any]) -> vf.LazyRows:
    """``n`` rows (``question``, ``answer``, ``info``), deterministic in (seed, split); the
    kinds take turns. The frames are not stored: ``render_clip(row["info"])`` draws them.
    Row ``i`` is ``make_example(seed, split, i, config)``, made when it is read."""
    return vf.LazyRows(n, functools.partial(make_example, seed, split, config=config))


def make_example(seed: int, split: str, index: int, config: Mapping[str, Any]) -> dict[str, Any]:
    """One row; the same (seed, split, index, config) always gives the same row.

    ``info["objects"]`` describes everything that moves or changes, drawn in reverse order
    (the first on top): each has a ``shape`` (``ball``, ``light`` or one of ``SHAPES``), a
    ``colour``, a ``size`` (radius in pixels), a straight path from ``start`` to ``end``
    (centre pixels at the first and last frame) and a ``schedule`` (per frame: 1 shown or
    lit, 0 hidden or dark). The first object is the one the question asks about (for
    ``which_first``, the one that appeared first; the second is the other one named).
    """
    rng = random.Random(f"motion:{seed}:{split}:{index}")
    kinds = config["kinds"]
    kind = kinds[index % len(kinds)]
    W, H, T = config["width"], config["height"], config["num_frames"]
    make = {"direction": _direction, "blinks": _blinks, "which_first": _which_first}[kind]
    objects, question, answer = make(rng, config)
    seconds = T / config["fps"]
    question += (
        f" The clip is {T} frames of {W}x{H} pixels at {config['fps']:g} fps ({seconds:.1f} s). "
        "slow_replay(factor) replays it slower; zoom_clip(x, y, w, h) shows a region of every "
        "frame enlarged. Answer inside <answer></answer>."
    )
    return {
        "question": question,
        "answer": answer,
        "info": {
            "kind": kind,
            "objects": objects,
            "background": [rng.randint(235, 250) for _ in range(3)],
            "clutter": config["clutter"],
            "clutter_seed": rng.getrandbits(31),
            "width": W,
            "height": H,
            "num_frames": T,
            "fps": float(config["fps"]),
            "split": split,
            "index": index,
        },
    }


def _object(
    shape: str,
    colour: str,
    size: int,
    start: Sequence[int],
    end: Sequence[int] | None = None,
    schedule: Sequence[int] = (),
) -> dict[str, Any]:
    """One entry of ``info["objects"]`` (a static object when ``end`` is None)."""
    end = start if end is None else end
    return {"shape": shape, "colour": colour, "size": size, "start": list(start),
            "end": list(end), "schedule": list(schedule)}  # fmt: skip


def _direction(rng: random.Random, config: Mapping[str, Any]) -> tuple[list[dict], str, str]:
    """A ball moving one way (the target) and ``num_distractors`` balls moving other ways."""
    W, H, T = config["width"], config["height"], config["num_frames"]
    r = max(3, round(min(W, H) * 0.08))
    colours = rng.sample(list(COLOURS), config["num_distractors"] + 1)
    target = rng.choice(DIRECTIONS)
    others = [d for d in DIRECTIONS if d != target]
    balls = []
    for i, colour in enumerate(colours):
        way = target if i == 0 else rng.choice(others)
        start, end = _straight_path(rng, way, W, H, r)
        balls.append(_object("ball", colour, r, start, end, [1] * T))
    question = f"Which way did the {colours[0]} ball move: left, right, up or down?"
    return balls, question, target


def _straight_path(
    rng: random.Random, way: str, W: int, H: int, r: int
) -> tuple[tuple[int, int], tuple[int, int]]:
    """A path inside the frame (a margin of ``r`` + 2), 45-70% of the frame long."""
    margin = r + 2
    along, across = (W, H) if way in ("left", "right") else (H, W)
    room = along - 2 * margin
    length = max(1, round(room * rng.uniform(0.45, 0.7)))
    a0 = rng.randint(margin, margin + room - length)
    a1 = a0 + length
    if way in ("left", "up"):
        a0, a1 = a1, a0
    c = rng.randint(margin, across - margin)
    if way in ("left", "right"):
        return (a0, c), (a1, c)
    return (c, a0), (c, a1)


def _blinks(rng: random.Random, config: Mapping[str, Any]) -> tuple[list[dict], str, str]:
    """A light blinking n times (the target) and ``num_distractors`` lights blinking other
    numbers of times, each at its own place."""
    W, H, T = config["width"], config["height"], config["num_frames"]
    r = max(4, round(min(W, H) * 0.1))
    colours = rng.sample(list(COLOURS), config["num_distractors"] + 1)
    counts = list(range(1, config["max_blinks"] + 1))
    n = rng.choice(counts)
    centres = _spread(rng, len(colours), W, H, r)
    lights = []
    for i, (colour, centre) in enumerate(zip(colours, centres, strict=True)):
        blinks = n if i == 0 else rng.choice([c for c in counts if c != n] or counts)
        schedule = _blink_schedule(rng, blinks, T, config["min_phase_frames"])
        lights.append(_object("light", colour, r, centre, schedule=schedule))
    question = (
        f"How many times did the {colours[0]} light blink (switch from off to on)? It is off "
        "at the start."
    )
    return lights, question, str(n)


def _blink_schedule(rng: random.Random, blinks: int, T: int, min_phase: int) -> list[int]:
    """Per frame 0 (off) or 1 (on): off, then ``blinks`` times on-then-off, each phase at
    least ``min_phase`` frames, the spare frames spread at random."""
    phases = [min_phase] * (2 * blinks + 1)
    for _ in range(T - sum(phases)):
        phases[rng.randrange(len(phases))] += 1
    return [i % 2 for i, length in enumerate(phases) for _ in range(length)]


def _which_first(rng: random.Random, config: Mapping[str, Any]) -> tuple[list[dict], str, str]:
    """Two shapes of different colours and kinds that appear two or more frames apart (the
    first appears after the first frame); ``num_distractors`` more appear at any time."""
    W, H, T = config["width"], config["height"], config["num_frames"]
    s = max(4, round(min(W, H) * 0.09))
    colours = rng.sample(list(COLOURS), config["num_distractors"] + 2)
    shapes = rng.sample(SHAPES, 2) + [rng.choice(SHAPES) for _ in range(config["num_distractors"])]
    first = rng.randint(1, T - 4)
    second = rng.randint(first + 2, T - 2)
    appear = [first, second] + [rng.randint(1, T - 2) for _ in range(config["num_distractors"])]
    centres = _spread(rng, len(colours), W, H, s)
    objects = [
        _object(shape, colour, s, centre, schedule=[int(f >= a) for f in range(T)])
        for shape, colour, centre, a in zip(shapes, colours, centres, appear, strict=True)
    ]
    named = [f"the {colours[0]} {shapes[0]}", f"the {colours[1]} {shapes[1]}"]
    rng.shuffle(named)
    question = (
        f"Two shapes appear one after the other. Which appeared first: {named[0]} or {named[1]}?"
    )
    return objects, question, f"{colours[0]} {shapes[0]}"


def _spread(rng: random.Random, n: int, W: int, H: int, r: int) -> list[tuple[int, int]]:
    """``n`` centres whose discs of radius ``r`` lie inside the frame, ``r`` or more apart."""
    margin = r + 2
    for _ in range(200):
        centres: list[tuple[int, int]] = []
        for _ in range(n):
            for _ in range(200):
                c = (rng.randint(margin, W - margin), rng.randint(margin, H - margin))
                if all(math.dist(c, o) >= 3 * r for o in centres):
                    centres.append(c)
                    break
        if len(centres) == n:
            return centres
    raise ValueError(f"cannot place {n} objects of radius {r} apart in a {W}x{H} frame")


# -- drawing --------------------------------------------------------------------------------


def render_clip(info: Mapping[str, Any], *, factor: int = 1) -> Video:
    """The clip ``info`` describes, as a ``Video`` at ``info["fps"]``. ``factor`` > 1 draws
    it at a ``factor`` times finer time step: ``(T - 1) * factor + 1`` frames, frame
    ``factor * k`` equal to frame ``k`` of the clip (positions move in between; an on/off
    schedule holds its frame's value)."""
    T, W, H = info["num_frames"], info["width"], info["height"]
    background = Image.new("RGB", (W, H), tuple(info["background"]))
    _clutter(random.Random(info["clutter_seed"]), ImageDraw.Draw(background), W, H, info["clutter"])
    span = (T - 1) * factor
    frames = np.empty((span + 1, H, W, 3), dtype=np.uint8)
    for i in range(span + 1):
        frame = background.copy()
        draw = ImageDraw.Draw(frame)
        for obj in reversed(info["objects"]):  # the first object on top
            on = obj["schedule"][i // factor]
            if not on and obj["shape"] != "light":
                continue
            (x0, y0), (x1, y1) = obj["start"], obj["end"]
            cx = x0 + round((x1 - x0) * i / span) if span else x0
            cy = y0 + round((y1 - y0) * i / span) if span else y0
            colour = COLOURS[obj["colour"]] if on else LIGHT_OFF
            _draw_shape(draw, obj["shape"], cx, cy, obj["size"], colour)
        frames[i] = np.asarray(frame)
    return Video(_locked(frames), float(info["fps"]))


def _locked(frames: np.ndarray) -> np.ndarray:
    """``frames`` (made here, shared with no one) read-only, so ``Video`` needs no copy."""
    frames.flags.writeable = False
    return frames


def _draw_shape(draw: ImageDraw.ImageDraw, shape: str, cx: int, cy: int, r: int,
                colour: tuple[int, int, int]) -> None:  # fmt: skip
    if shape in ("ball", "light", "circle"):
        draw.ellipse((cx - r, cy - r, cx + r, cy + r), fill=colour)
    elif shape == "square":
        draw.rectangle((cx - r, cy - r, cx + r, cy + r), fill=colour)
    elif shape == "triangle":
        draw.polygon([(cx, cy - r), (cx + r, cy + r), (cx - r, cy + r)], fill=colour)
    elif shape == "diamond":
        draw.polygon([(cx, cy - r), (cx + r, cy), (cx, cy + r), (cx - r, cy)], fill=colour)
    else:
        raise ValueError(f"unknown shape {shape!r}")


def _clutter(rng: random.Random, draw: ImageDraw.ImageDraw, W: int, H: int, n: int) -> None:
    """Pale rectangles, lines and dots (static: the same on every frame)."""
    for _ in range(n):
        choice = rng.random()
        tint = tuple(rng.randint(190, 230) for _ in range(3))
        x, y = rng.randint(0, W - 1), rng.randint(0, H - 1)
        if choice < 0.5:
            w, h = rng.randint(6, W // 3), rng.randint(6, H // 3)
            draw.rectangle((x, y, x + w, y + h), fill=tint)
        elif choice < 0.8:
            draw.line((x, y, rng.randint(0, W - 1), rng.randint(0, H - 1)), fill=tint, width=1)
        else:
            r = rng.randint(1, 3)
            draw.ellipse((x - r, y - r, x + r, y + r), fill=tint)


def _validate(config: Mapping[str, Any]) -> None:
    bad = [k for k in config["kinds"] if k not in KINDS]
    if bad or not config["kinds"]:
        raise ValueError(f"kinds must be among {KINDS}, got {bad or '()'}")
    if not 48 <= config["width"] <= 1024 or not 48 <= config["height"] <= 1024:
        raise ValueError("width and height must be 48 to 1024 px")
    fps = config["fps"]
    if isinstance(fps, bool) or not isinstance(fps, (int, float)) or not 0 < fps <= 60:
        raise ValueError(f"fps must be a number in (0, 60], got {fps!r}")
    if not 0 <= config["num_distractors"] <= 3:
        raise ValueError(f"num_distractors must be in 0..3, got {config['num_distractors']}")
    if config["clutter"] < 0:
        raise ValueError("clutter must be >= 0")
    if not 1 <= config["max_blinks"] <= 5:
        raise ValueError(f"max_blinks must be in 1..5, got {config['max_blinks']}")
    if config["min_phase_frames"] < 1:
        raise ValueError("min_phase_frames must be >= 1")
    T = config["num_frames"]
    least = (
        (2 * config["max_blinks"] + 1) * config["min_phase_frames"]
        if "blinks" in config["kinds"]
        else 8
    )
    if not max(8, least) <= T <= 256:
        raise ValueError(
            f"num_frames must be in {max(8, least)}..256 (blinks need (2 * max_blinks + 1) * "
            f"min_phase_frames frames), got {T}"
        )
