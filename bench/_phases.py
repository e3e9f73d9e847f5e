"""Where ``vf-mm serve``'s CPU goes, read from py-spy's collapsed stacks (``--format raw``).

Each sample (one thread's stack at one tick, idle threads left out by py-spy) is given
to one phase: the innermost frame that names a phase wins, so a JSON parse inside the
route counts as parsing, not as the route. Phases, by what the frames name:

  http           uvicorn and h11: reading the socket, parsing HTTP, writing the answer
  body parse     the request body's JSON and its validation (json, msgspec, pydantic)
  item decode    base64 + msgpack of ``kwargs_data`` into arrays, and the digest of it
  item check     the family's ``ItemChecker`` on decoded items
  features       placeholders against the pads, the item cache
  engine         the backend's ``generate`` (an instant scripted engine, or the local
                 engine's thread: its scheduling, the model's forward, torch under it)
  response       building and encoding the answer's JSON
  route          the rest of the generate route (its checks, sampling options)
  framework      starlette's routing and middleware, asyncio's loop, threads handing off

``python bench/_phases.py FILE.txt`` prints a file's split.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

# the local engine's modules (its thread's frames), and the scripted engine
ENGINE_MODULES = ("_scripted", "_local", "_local_model", "_batch_engine", "_pool", "_scheduler",
                  "_generate", "_kv", "_arena", "_packed", "_sampling", "_prefix_cache",
                  "_vision_cache", "_row_builder", "_rows")  # fmt: skip
# innermost match wins; each rule: (phase, substrings of a frame "func (file:line)")
RULES: list[tuple[str, tuple[str, ...]]] = [
    ("item check", ("_items.py",)),
    ("item decode", ("decode_kwargs_item", "_mm_kwargs.py", "sent_digest", "b64decode")),
    ("body parse", ("parse_body", "json/decoder.py", "model_validate", "pydantic", "_server_wire")),
    ("response", ("json/encoder.py", "render (starlette", "JSONResponse", "_token_logprob")),
    ("engine", tuple(f"inference/{m}.py" for m in ENGINE_MODULES)),
    ("features", ("_server_features.py", "ItemCache")),
    ("route", ("_server_generate.py", "_server_engine.py")),
    ("http", ("h11", "uvicorn/protocols")),
]
PHASES = [p for p, _ in RULES] + ["framework"]
# a thread waiting (py-spy may sample it as running while it wakes): not counted
IDLE = ("selectors.py", "Condition.wait", "Queue.get")


def phase_of(frames: list[str]) -> str:
    """The phase of one stack (outermost frame first)."""
    for frame in reversed(frames):
        for phase, needles in RULES:
            if any(n in frame for n in needles):
                return phase
    return "framework"


def split(path: Path) -> Counter[str]:
    """Samples per phase in one py-spy raw file."""
    out: Counter[str] = Counter()
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        if any(i in frames[-1] for i in IDLE):
            continue
        out[phase_of(frames)] += int(count)
    return out


def show(counts: Counter[str], *, ms_per_request: float | None = None) -> str:
    """A table of the split: each phase's share of the samples and, with
    ``ms_per_request`` (the process's CPU per request, measured apart), that share of it."""
    total = sum(counts.values()) or 1
    lines = [f"{'phase':<13}{'share':>8}" + (f"{'ms/req':>9}" if ms_per_request else "")]
    for phase in PHASES:
        n = counts.get(phase, 0)
        line = f"{phase:<13}{n / total:>8.0%}"
        if ms_per_request:
            line += f"{n / total * ms_per_request:>9.2f}"
        lines.append(line)
    lines.append(f"({total} samples)")
    return "\n".join(lines)


if __name__ == "__main__":
    for name in sys.argv[1:]:
        print(name)
        print(show(split(Path(name))))
