"""``scaffold_environment``: a new environment folder that works before it is edited.

``vf-mm init NAME [--multi-turn | --tools] [--family F]`` writes ``environments/NAME/``
with a pyproject (the ``vf_mm.environments`` entry point), a module with
``load_environment``, a test that runs ``check_environment`` on family ``F``'s tiny
checkpoint (default ``qwen2_5_vl``) and a README. Each kind is a small, complete task
on synthetic images made in code (no download), so ``vf-mm eval NAME`` and ``pytest
environments/NAME`` pass at once and the author edits a working example:

- ``single-turn``: name the colour of a square;
- ``multi-turn``: a new square each turn, ``state``, a stop condition and ``finish_state``;
- ``tools``: a tool that returns an image (a corner of the picture) into the tool message.
"""

from __future__ import annotations

import importlib.util
import keyword
import re
from pathlib import Path
from typing import Literal

KINDS = ("single-turn", "multi-turn", "tools")
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]*\Z")

_COMMON = '''

from __future__ import annotations
__TYPING__
import vf_mm as vf
from PIL import Image

COLOURS = {
    "red": (220, 40, 40),
    "green": (40, 170, 70),
    "blue": (40, 80, 220),
    "yellow": (235, 200, 30),
}


def square(colour: str, size: int = 64) -> Image.Image:
    """A plain square of one colour: the synthetic image every row is made of."""
    return Image.new("RGB", (size, size), COLOURS[colour])


def colour_at(i: int) -> str:
    return list(COLOURS)[i % len(COLOURS)]
'''

_SINGLE = '''"""__NAME__: a single-turn vf_mm environment.

Each row shows the model a coloured square and asks for its colour. Replace the rows,
the prompt and the reward function with your task.
"""
__COMMON__
def make_rows(n: int, offset: int = 0) -> list[dict]:
    return [
        {
            "question": "What colour is this square? Answer inside <answer></answer>.",
            "image": square(colour_at(i)),
            "answer": colour_at(i),
        }
        for i in range(offset, offset + n)
    ]


def correct(completion, answer, parser) -> float:
    """1.0 when the model's last <answer> is the colour."""
    guess = parser.parse_answer(completion)
    return float(guess is not None and guess.strip().lower() == answer)


def load_environment(num_examples: int = 20, num_eval_examples: int = 8, **kwargs):
    parser = vf.XMLParser(["answer"])
    rubric = vf.Rubric([correct, parser.format_reward], [1.0, 0.0], parser=parser)
    return vf.SingleTurnEnv(
        dataset=make_rows(num_examples),  # the train split (vf-mm rollout)
        eval_dataset=make_rows(num_eval_examples, offset=num_examples),  # vf-mm eval
        parser=parser,
        rubric=rubric,
        **kwargs,
    )
'''

_MULTI = '''"""__NAME__: a multi-turn vf_mm environment with a new image every turn.

Each turn shows the model one more coloured square; it names each colour. The row's
``info`` holds the sequence; ``state`` keeps what was named; the rollout stops once
every square was shown, and ``finish_state`` records the last answer (the last model
turn gets no ``env_response``).
"""
__COMMON__
PARSER = vf.XMLParser(["answer"])
ASK = "What colour is this square? Answer inside <answer></answer>."


def make_rows(n: int, offset: int = 0, length: int = 3) -> list[dict]:
    rows = []
    for i in range(offset, offset + n):
        colours = [colour_at(i + k) for k in range(length)]
        first = square(colours[0])
        rows.append({"question": ASK, "image": first, "info": {"colours": colours}})
    return rows


class __CLASS__(vf.MultiTurnEnv):
    def setup_state(self, state):
        state["colours"] = list(state["info"]["colours"])
        state["named"] = []

    async def env_response(self, messages, state):
        state["named"].append(PARSER.parse_answer(messages[-1:]))
        shown = state["colours"][state["turn"]]  # one square per model turn so far
        image = {"type": "image", "image": square(shown)}
        return [{"role": "user", "content": [image, {"type": "text", "text": ASK}]}]

    @vf.stop
    def all_shown(self, state):
        return state["turn"] >= len(state["colours"])

    def finish_state(self, state):
        state["named"].append(PARSER.parse_answer(state["completion"][-1:]))


def accuracy(state) -> float:
    """The share of squares the model named right."""
    pairs = zip(state["named"], state["colours"], strict=False)  # may end early
    right = [(named or "").strip().lower() == colour for named, colour in pairs]
    return sum(right) / len(state["colours"])


def load_environment(num_examples: int = 20, num_eval_examples: int = 8, **kwargs):
    return __CLASS__(
        dataset=make_rows(num_examples),
        eval_dataset=make_rows(num_eval_examples, offset=num_examples),
        parser=PARSER,
        rubric=vf.Rubric([accuracy], parser=PARSER),
        max_turns=5,
        **kwargs,
    )
'''

_TOOLS = '''"""__NAME__: a vf_mm tool environment whose tool returns an image.

The picture is four coloured squares in a 2x2 grid, shown small; the model asks the
``look`` tool for one corner, which comes back as a larger image in the tool message,
and answers the colour of the top-left square. ``look`` receives the rollout's
``state`` (the environment passes it; the model never sees or sets it).
"""
__COMMON__
CORNERS = {
    "top-left": (0, 0),
    "top-right": (1, 0),
    "bottom-left": (0, 1),
    "bottom-right": (1, 1),
}


def grid(colours: list[str], cell: int = 48) -> Image.Image:
    image = Image.new("RGB", (2 * cell, 2 * cell))
    for colour, (x, y) in zip(colours, CORNERS.values(), strict=True):
        image.paste(square(colour, cell), (x * cell, y * cell))
    return image


def make_rows(n: int, offset: int = 0) -> list[dict]:
    rows = []
    for i in range(offset, offset + n):
        colours = [colour_at(i + k) for k in range(4)]
        row = {
            "question": "What colour is the top-left square? Use the look tool to "
            "see a corner up close, then answer inside <answer></answer>.",
            "image": grid(colours).resize((32, 32)),
            "answer": colours[0],
            "info": {"colours": colours},
        }
        rows.append(row)
    return rows


Corner = Literal["top-left", "top-right", "bottom-left", "bottom-right"]


def look(state, corner: Corner):
    """Show one corner of the picture, larger.

    Args:
        corner: which corner to show
    """
    x, y = CORNERS[corner]
    big = grid(state["info"]["colours"])
    crop = big.crop((x * 48, y * 48, x * 48 + 48, y * 48 + 48))
    return [crop, f"the {corner} corner"]


def correct(completion, answer, parser) -> float:
    guess = parser.parse_answer(completion)
    return float(guess is not None and guess.strip().lower() == answer)


def load_environment(num_examples: int = 20, num_eval_examples: int = 8, **kwargs):
    parser = vf.XMLParser(["answer"])
    return vf.ToolEnv(
        tools=[look],
        dataset=make_rows(num_examples),
        eval_dataset=make_rows(num_eval_examples, offset=num_examples),
        parser=parser,
        rubric=vf.Rubric([correct], parser=parser),
        max_turns=4,
        **kwargs,
    )
'''

_TEST = '''"""Tests of the __NAME__ environment: `pytest environments/__NAME__`."""

from __future__ import annotations

from pathlib import Path

import vf_mm as vf
__IMPORTS__
ENV_DIR = Path(__file__).resolve().parents[1]
# the model family you train and evaluate (vf_mm.models.VISION_FAMILIES): the checks
# render with its tiny offline checkpoint, so what its template refuses is found here
FAMILY = "__FAMILY__"


def test_check_environment_passes():
    env = vf.load_environment(str(ENV_DIR))
    # raises, listing every problem, if one is found
    report = vf.check_environment(env, family=FAMILY)
    assert report["rows"] > 0 and report["images"] > 0


def test_a_right_answer_scores_1_and_a_wrong_one_0():
    env = vf.load_environment(str(ENV_DIR), num_eval_examples=1)
    row = env.get_eval_dataset()[0]  # what check_environment runs with num_examples=1
__RIGHT__
    for replies, reward in ((right, 1.0), (["<answer>purple</answer>"], 0.0)):
        report = vf.check_environment(
            env, num_examples=1, replies=replies, family=FAMILY
        )
        assert report["rewards"] == [reward, reward], replies
'''

_README = """# __NAME__

A vf_mm environment (__KIND__), made by `vf-mm init`. Edit `__MODULE__.py`: the rows,
the prompt, the reward functions.

```bash
vf-mm eval __NAME____ENVDIR__    # the embedded tiny model; -m MODEL for a real one
pytest __FOLDER__    # check_environment on a tiny __FAMILY__ and the reward, offline
pip install -e __FOLDER__   # install it (entry point vf_mm.environments)
```
"""

_PYPROJECT = """[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "vf-mm-env-__NAME__"
version = "0.1.0"
description = "__NAME__: a vf_mm environment"
readme = "README.md"
requires-python = ">=3.11"
dependencies = ["vf-mm", "pillow>=10.1"]

[project.entry-points."vf_mm.environments"]
__NAME__ = "__MODULE__:load_environment"

[tool.setuptools]
py-modules = ["__MODULE__"]
"""

# what the test sends as a right answer, per kind: replies used in turn, or a policy
_RIGHT = {
    "single-turn": ("", '    right = ["<answer>" + row["answer"] + "</answer>"]'),
    "multi-turn": (
        "",
        '    right = ["<answer>" + c + "</answer>" for c in row["info"]["colours"]]',
    ),
    "tools": (
        "from vf_mm.models import family_info\nfrom vf_mm.renderers import format_tool_calls\n",
        """
    def right(request):  # look at the top-left corner, then answer
        if any(m["role"] == "tool" for m in request.messages):
            return "<answer>" + row["answer"] + "</answer>"
        call = ("look", {"corner": "top-left"})  # in the family's tool-call format
        return format_tool_calls([call], tool_format=family_info(FAMILY).tool_format)
""",
    ),
}


def scaffold_environment(
    name: str,
    *,
    kind: Literal["single-turn", "multi-turn", "tools"] = "single-turn",
    directory: str | Path = "environments",
    family: str = "qwen2_5_vl",
) -> list[Path]:
    """Write ``directory/name/`` (module, pyproject, test, README) and return the files.

    Args:
        name: The environment's id.
        kind: The template to start from.
        directory: Where the environment's folder goes.
        family: A ``model_type``: the family the author targets; the written test checks
            the environment with its template and processor.

    Raises:
        ValueError: Nothing written: a name that is not a valid id, or whose module would
            shadow an importable module (``json``, ``test``, ``vf_mm``...), ``tools`` for a
            family whose template has no tool role (Gemma 3).
        UnsupportedModelError: An unknown family (naming the nearest).
        FileExistsError: The folder exists.
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {list(KINDS)}, not {kind!r}")
    from vf_mm.models import family_info

    info = family_info(family)
    if kind == "tools" and not info.tool_role:
        raise ValueError(
            f"{info.label}'s chat template has no tool role (it refuses a 'tool' message), so "
            "every rollout of a tool environment would fail on it: scaffold --multi-turn and "
            "answer the model's requests with user messages from env_response"
        )
    if not _NAME.match(name):
        raise ValueError(
            f"{name!r} is not an environment name: use letters, digits, '-' and '_', "
            "starting with a letter"
        )
    module = name.replace("-", "_")
    if keyword.iskeyword(module):
        raise ValueError(f"{name!r} is a Python keyword, which cannot name a module")
    if importlib.util.find_spec(module) is not None:
        raise ValueError(
            f"a module named {module!r} is already importable; an environment module of "
            "that name would shadow it (or be shadowed): choose another name"
        )
    folder = Path(directory) / name
    if folder.exists():
        raise FileExistsError(f"{folder} already exists: nothing was written")
    source = {"single-turn": _SINGLE, "multi-turn": _MULTI, "tools": _TOOLS}[kind]
    cls = "".join(part.capitalize() for part in re.split(r"[-_]", name) if part) + "Env"
    files = {
        f"{module}.py": source.replace("__COMMON__", "\n" + _COMMON.strip("\n") + "\n\n").replace(
            "__TYPING__", "\nfrom typing import Literal\n" if kind == "tools" else ""
        ),
        "pyproject.toml": _PYPROJECT,
        "README.md": _README,
        f"tests/test_{module}.py": _TEST.replace("__IMPORTS__", _RIGHT[kind][0]).replace(
            "__RIGHT__", _RIGHT[kind][1]
        ),
    }
    written = []
    for relative, text in files.items():
        path = folder / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        envdir = "" if Path(directory) == Path("environments") else f" --env-dir {directory}"
        for token, value in (("__ENVDIR__", envdir), ("__FOLDER__", str(folder)),
                             ("__NAME__", name), ("__MODULE__", module), ("__CLASS__", cls),
                             ("__KIND__", kind), ("__FAMILY__", family)):  # fmt: skip
            text = text.replace(token, value)
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written
