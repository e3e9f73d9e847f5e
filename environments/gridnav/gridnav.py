"""``gridnav``: multi-turn visual navigation in a small grid world.

The model sees a rendered grid (blue circle: the agent, green square: the goal, dark
cells: walls) and answers each turn with one move, ``<move>up</move>`` (``down``,
``left``, ``right``). The environment applies it and answers with a freshly rendered
image of the new state and a short note ("moved up", "hit a wall", "invalid move"),
so images accumulate turn by turn. The rollout ends when the agent reaches the goal
or after ``max_turns`` model turns.

Scoring replays the moves of the completion on the layout kept in ``info`` (so the
last model turn counts too, although no environment turn follows it):
``reached_goal`` (weight 1.0), ``partial_progress`` (weight 0.2: the share of the
shortest-path distance closed, only when the goal was not reached, so reaching it is
worth exactly 1.0), and metrics ``moves``, ``invalid_moves``, ``wall_hits``,
``optimal_moves`` and ``format_reward``.
"""

from __future__ import annotations

import functools
import random
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from PIL import Image, ImageDraw

import vf_mm as vf
from vf_mm.types import Messages

MOVES: dict[str, tuple[int, int]] = {
    "up": (-1, 0),
    "down": (1, 0),
    "left": (0, -1),
    "right": (0, 1),
}

PRESETS: dict[str, dict[str, int]] = {
    "easy": dict(size=3, num_walls=0, min_distance=1, max_distance=2, max_turns=4),
    "medium": dict(size=5, num_walls=4, min_distance=3, max_distance=6, max_turns=8),
    "hard": dict(size=6, num_walls=8, min_distance=5, max_distance=9, max_turns=12),
}

SYSTEM_PROMPT = (
    "You control the blue circle in a grid world shown as an image. Reach the green "
    "square. Dark grey cells are walls and the grid's border cannot be crossed. Each turn, "
    "reply with exactly one move: <move>up</move>, <move>down</move>, <move>left</move> "
    "or <move>right</move>."
)

WHITE, GRID, WALL = (255, 255, 255), (200, 200, 200), (70, 70, 70)
AGENT, GOAL = (40, 80, 220), (40, 170, 60)

Cell = tuple[int, int]


def load_environment(
    num_examples: int = 200,
    num_eval_examples: int = 50,
    seed: int = 0,
    difficulty: str = "medium",
    size: int | None = None,
    num_walls: int | None = None,
    min_distance: int | None = None,
    max_distance: int | None = None,
    max_turns: int | None = None,
    cell_size: int = 32,
    text_hint: bool = False,
    system_prompt: str | None = SYSTEM_PROMPT,
    **kwargs: Any,
) -> GridNavEnv:
    """The ``gridnav`` environment.

    ``difficulty``: ``easy`` | ``medium`` | ``hard`` (see ``PRESETS``); ``size`` (grid side),
    ``num_walls``, ``min_distance`` / ``max_distance`` (shortest path from start to goal)
    and ``max_turns`` override the preset. ``cell_size``: pixels per cell. ``text_hint``:
    also state the positions in the text (for text-only models). Other keyword arguments go
    to ``MultiTurnEnv`` (e.g. ``sampling_args``).
    """
    if difficulty not in PRESETS:
        raise ValueError(f"unknown difficulty {difficulty!r}; choose one of {', '.join(PRESETS)}")
    config = dict(PRESETS[difficulty])
    overrides = dict(size=size, num_walls=num_walls, min_distance=min_distance,
                     max_distance=max_distance, max_turns=max_turns)  # fmt: skip
    config.update({k: v for k, v in overrides.items() if v is not None})
    config["cell_size"] = cell_size
    _validate(config)
    return GridNavEnv(
        dataset=build_dataset(
            num_examples, seed=seed, split="train", config=config, text_hint=text_hint
        ),
        eval_dataset=build_dataset(
            num_eval_examples, seed=seed, split="eval", config=config, text_hint=text_hint
        ),
        max_turns=config["max_turns"],
        system_prompt=system_prompt,
        **kwargs,
    )


class GridNavEnv(vf.MultiTurnEnv):
    """Applies one ``<move>`` per model turn and shows the new state as an image."""

    def __init__(self, *, parser: vf.Parser | None = None, rubric: vf.Rubric | None = None,
                 **kwargs: Any) -> None:  # fmt: skip
        parser = parser or vf.XMLParser(["move"], answer_field="move")
        super().__init__(parser=parser, rubric=rubric or make_rubric(parser), **kwargs)

    async def setup_state(self, state: vf.State) -> None:
        state["position"] = tuple(state["info"]["start"])
        state["moves"] = state["invalid_moves"] = state["wall_hits"] = 0
        state["reached_goal"] = False

    async def env_response(self, messages: Messages, state: vf.State) -> Messages:
        layout = Layout.from_info(state["info"])
        move = parse_move(self.parser, messages[-1])
        outcome, state["position"] = step(layout, state["position"], move)
        if outcome == "invalid":
            state["invalid_moves"] += 1
            note = (
                "Invalid move: reply with exactly one of <move>up</move>, <move>down</move>, "
                "<move>left</move> or <move>right</move>."
            )
        else:
            state["moves"] += 1
            if outcome == "wall":
                state["wall_hits"] += 1
                note = f"You tried to move {move} but hit a wall; you did not move."
            else:
                note = f"You moved {move}."
        if state["position"] == layout.goal:
            state["reached_goal"] = True
            state["done"] = True
            return [{"role": "user", "content": f"{note} You reached the goal!"}]
        left = self.max_turns - state["turn"]
        image = render(layout, state["position"], cell_size=state["info"]["cell_size"])
        text = f"{note} {left} move{'s' if left != 1 else ''} left. Your move?"
        return [
            {
                "role": "user",
                "content": [{"type": "image", "image": image}, {"type": "text", "text": text}],
            }
        ]


# -- the world ------------------------------------------------------------------------------


class Layout:
    """A grid: side ``size``, ``walls`` (cells), ``start`` and ``goal``; cells are (row, col)."""

    def __init__(self, size: int, walls: Iterable[Sequence[int]], start: Sequence[int],
                 goal: Sequence[int]) -> None:  # fmt: skip
        self.size = int(size)
        self.walls = frozenset((int(r), int(c)) for r, c in walls)
        self.start: Cell = (int(start[0]), int(start[1]))
        self.goal: Cell = (int(goal[0]), int(goal[1]))

    @classmethod
    def from_info(cls, info: Mapping[str, Any]) -> Layout:
        return cls(info["size"], info["walls"] or [], info["start"], info["goal"])

    def free(self, cell: Cell) -> bool:
        r, c = cell
        return 0 <= r < self.size and 0 <= c < self.size and cell not in self.walls

    def distances(self, source: Cell) -> dict[Cell, int]:
        """Shortest-path lengths from ``source`` to every reachable cell (BFS)."""
        dist = {source: 0}
        queue = deque([source])
        while queue:
            r, c = queue.popleft()
            for dr, dc in MOVES.values():
                nxt = (r + dr, c + dc)
                if self.free(nxt) and nxt not in dist:
                    dist[nxt] = dist[(r, c)] + 1
                    queue.append(nxt)
        return dist

    def shortest_path(self, source: Cell | None = None) -> list[str]:
        """The moves of one shortest path from ``source`` (default: start) to the goal."""
        to_goal = self.distances(self.goal)
        cell = source or self.start
        if cell not in to_goal:
            raise ValueError(f"the goal cannot be reached from {cell}")
        path = []
        while cell != self.goal:
            for name, (dr, dc) in MOVES.items():
                nxt = (cell[0] + dr, cell[1] + dc)
                if to_goal.get(nxt, -1) == to_goal[cell] - 1:
                    path.append(name)
                    cell = nxt
                    break
        return path


def step(layout: Layout, position: Cell, move: str | None) -> tuple[str, Cell]:
    """Apply ``move``: ("moved" | "wall" | "invalid", new position)."""
    if move not in MOVES:
        return "invalid", position
    dr, dc = MOVES[move]
    nxt = (position[0] + dr, position[1] + dc)
    return ("moved", nxt) if layout.free(nxt) else ("wall", position)


def parse_move(parser: vf.Parser, message: Mapping[str, Any]) -> str | None:
    """The move in one assistant message (lower case), or None."""
    if message.get("role") != "assistant":
        return None
    move = parser.parse_answer([dict(message)])
    return move.strip().lower() if isinstance(move, str) else None


def replay(layout: Layout, completion: Messages, parser: vf.Parser) -> dict[str, Any]:
    """Play the completion's assistant moves from the start, stopping at the goal."""
    position = layout.start
    out = {"moves": 0, "invalid_moves": 0, "wall_hits": 0, "reached_goal": False}
    for message in completion:
        if message.get("role") != "assistant" or out["reached_goal"]:
            continue
        outcome, position = step(layout, position, parse_move(parser, message))
        if outcome == "invalid":
            out["invalid_moves"] += 1
        else:
            out["moves"] += 1
            out["wall_hits"] += outcome == "wall"
        out["reached_goal"] = position == layout.goal
    out["position"] = position
    return out


def render(layout: Layout, position: Sequence[int], *, cell_size: int = 32) -> Image.Image:
    """The grid as an RGB image of side ``size * cell_size`` pixels."""
    side = layout.size * cell_size
    image = Image.new("RGB", (side, side), WHITE)
    draw = ImageDraw.Draw(image)
    pad = max(2, cell_size // 6)
    for r, c in layout.walls:
        draw.rectangle(_box(r, c, cell_size, 0), fill=WALL)
    for i in range(layout.size + 1):
        x = min(i * cell_size, side - 1)
        draw.line((x, 0, x, side - 1), fill=GRID)
        draw.line((0, x, side - 1, x), fill=GRID)
    draw.rectangle(_box(*layout.goal, cell_size, pad), fill=GOAL)
    draw.ellipse(_box(int(position[0]), int(position[1]), cell_size, pad + 1), fill=AGENT)
    return image


def _box(r: int, c: int, cell: int, pad: int) -> tuple[int, int, int, int]:
    return (c * cell + pad, r * cell + pad, (c + 1) * cell - pad, (r + 1) * cell - pad)


# -- data -----------------------------------------------------------------------------------


def build_dataset(n: int, *, seed: int, split: str, config: dict[str, int],
                  text_hint: bool = False) -> vf.LazyRows:  # fmt: skip
    """``n`` rows (``question``, ``image``, ``info`` with the layout), deterministic in
    (seed, split, config): row ``i`` is ``make_example(seed, split, i, config)``, drawn
    when it is read (a run reads rows as it goes); row 0 is drawn once here, as a check."""
    rows = vf.LazyRows(
        n, functools.partial(make_example, seed, split, config=config, text_hint=text_hint)
    )
    if n:
        rows[0]  # a config no layout fits is refused here, not by the first rollout
    return rows


def make_example(seed: int, split: str, index: int, config: Mapping[str, int], *,
                 text_hint: bool = False) -> dict[str, Any]:  # fmt: skip
    rng = random.Random(f"gridnav:{seed}:{split}:{index}")
    layout = make_layout(rng, config)
    path = layout.shortest_path()
    question = f"Move the blue circle to the green square. You have {config['max_turns']} moves."
    if text_hint:
        question += (
            f" The grid has {layout.size} rows and {layout.size} columns, numbered from 0 at the "
            f"top left (row, column). You are at {layout.start}, the goal is at {layout.goal}"
            + (
                f", walls are at {', '.join(map(str, sorted(layout.walls)))}."
                if layout.walls
                else "."
            )
        )
    return {
        "question": question + " Your move?",
        "answer": " ".join(path),  # one shortest path, for reference
        "image": render(layout, layout.start, cell_size=config["cell_size"]),
        "info": {
            "size": layout.size,
            "walls": [list(w) for w in sorted(layout.walls)],
            "start": list(layout.start),
            "goal": list(layout.goal),
            "optimal_moves": len(path),
            "cell_size": config["cell_size"],
            "split": split,
            "index": index,
        },
    }


def make_layout(rng: random.Random, config: Mapping[str, int]) -> Layout:
    """A random layout whose goal is ``min_distance..max_distance`` moves from the start."""
    size = config["size"]
    cells = [(r, c) for r in range(size) for c in range(size)]
    for _ in range(2000):
        chosen = rng.sample(cells, config["num_walls"] + 2)
        start, goal, walls = chosen[0], chosen[1], chosen[2:]
        layout = Layout(size, walls, start, goal)
        d = layout.distances(start).get(goal)
        if d is not None and config["min_distance"] <= d <= config["max_distance"]:
            return layout
    raise ValueError(f"no layout satisfies {dict(config)} (tried 2000): loosen the distances")


def _validate(config: Mapping[str, int]) -> None:
    size = config["size"]
    if not 2 <= size <= 20:
        raise ValueError(f"size must be in 2..20, got {size}")
    if not 0 <= config["num_walls"] <= size * size - 2:
        raise ValueError(f"num_walls must be in 0..{size * size - 2}, got {config['num_walls']}")
    if not 1 <= config["min_distance"] <= config["max_distance"]:
        raise ValueError("need 1 <= min_distance <= max_distance")
    if config["max_turns"] < 1:
        raise ValueError(f"max_turns must be >= 1, got {config['max_turns']}")
    if config["cell_size"] < 8:
        raise ValueError(f"cell_size must be >= 8 px, got {config['cell_size']}")


# -- scoring --------------------------------------------------------------------------------


def make_rubric(parser: vf.Parser) -> vf.Rubric:
    def reached_goal(completion: Messages, info: dict, parser: vf.Parser) -> float:
        """1.0 when the moves reach the goal."""
        return float(replay(Layout.from_info(info), completion, parser)["reached_goal"])

    def partial_progress(completion: Messages, info: dict, parser: vf.Parser) -> float:
        """Share of the start's shortest-path distance closed, when the goal was not reached."""
        layout = Layout.from_info(info)
        result = replay(layout, completion, parser)
        if result["reached_goal"]:
            return 0.0
        to_goal = layout.distances(layout.goal)
        start, end = to_goal[layout.start], to_goal.get(result["position"], to_goal[layout.start])
        return max(0.0, (start - end) / start)

    def moves(completion: Messages, info: dict, parser: vf.Parser) -> float:
        return replay(Layout.from_info(info), completion, parser)["moves"]

    def invalid_moves(completion: Messages, info: dict, parser: vf.Parser) -> float:
        return replay(Layout.from_info(info), completion, parser)["invalid_moves"]

    def wall_hits(completion: Messages, info: dict, parser: vf.Parser) -> float:
        return replay(Layout.from_info(info), completion, parser)["wall_hits"]

    def optimal_moves(info: dict) -> float:
        return info["optimal_moves"]

    rubric = vf.Rubric(funcs=[reached_goal, partial_progress], weights=[1.0, 0.2], parser=parser)
    for metric in (moves, invalid_moves, wall_hits, optimal_moves, parser.format_reward):
        rubric.add_metric(metric)
    return rubric
