"""What ``check_environment`` asks of a rubric: mistakes that score wrong without an error.

A reward function that raises, or returns None or NaN, fails its rollout loudly. These
do not, so they are looked for on purpose:

- **an answer that is not text** (``"answer": 2``) against a reward function that
  compares parsed text: parsers return strings, ``"2" != 2``, and every rollout scores 0.
  Each reward function that asks for ``answer`` is *probed*: called, outside any
  rollout, on a completion that is the answer's own text, against the row's answer and
  against that answer as a string. Scoring the string higher proves the mistake (a
  problem); scoring the right reply above a wrong one proves the function handles the
  type (nothing to say); anything else (it raised, it scores both alike) is a warning,
  since the probe cannot tell;
- **a parameter with a default whose name is a near miss** of one the rubric supplies
  (``answr=None``): it keeps its default on every rollout (a warning);
- **a reward that cannot tell replies apart**: rollouts whose final replies differ all
  scored the same (a warning).
"""

from __future__ import annotations

import asyncio
import copy
import difflib
import inspect
import numbers
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from vf_mm.envs._parser import Parser, ThinkParser, XMLParser
from vf_mm.envs._rubric import RewardFunc, Rubric, _call, _number, asked_columns
from vf_mm.types import text_of


def answer_findings(
    rubric: Rubric, rows: Sequence[Mapping[str, Any]], *, task: str
) -> tuple[list[str], list[str]]:
    """``(problems, warnings)`` about rows whose ``answer`` is a number or a bool, for
    each reward function that asks for ``answer`` (see the module docstring)."""
    askers = [rf for rf in rubric.funcs if "answer" in asked_columns(rf.func)]
    proven: dict[tuple[str, str], list[tuple[int, Any, float, float]]] = {}
    unsure: dict[tuple[str, str], list[tuple[int, Any]]] = {}
    for i, row in enumerate(rows):
        answer = row.get("answer")
        if not isinstance(answer, numbers.Number):
            continue
        text, kind = str(answer), type(answer).__name__
        for rf in askers:
            typed = _probe(rubric, rf, row, task, reply=text, answer=answer)
            as_text = _probe(rubric, rf, row, task, reply=text, answer=text)
            rejected = _probe(rubric, rf, row, task, reply=_wrong(answer), answer=answer)
            if typed is not None and as_text is not None and as_text > typed:
                proven.setdefault((rf.name, kind), []).append((i, answer, typed, as_text))
            elif typed is None or rejected is None or typed <= rejected:
                unsure.setdefault((rf.name, kind), []).append((i, answer))
    problems = [
        f"{_rows(found)}: the answer {found[0][1]!r} (type {kind}) is not a string, and reward "
        f"function {name} scores the reply {str(found[0][1])!r} {found[0][2]} against it but "
        f"{found[0][3]} against the string {str(found[0][1])!r}: parsers return text, so a "
        f"right answer never scores. Store answers as strings (str(answer)), or convert the "
        f"parsed text in {name}"
        for (name, kind), found in proven.items()
    ]
    warnings = [
        f"{_rows(found)}: the answer {found[0][1]!r} (type {kind}) is not a string, and reward "
        f"function {name} asks for it: parsers return text ({str(found[0][1])!r} != "
        f"{found[0][1]!r}), so unless {name} converts the parsed text a right answer never "
        "scores (the check could not tell whether it does); store answers as strings"
        for (name, kind), found in unsure.items()
    ]
    return problems, warnings


def unsupplied_defaults(rubric: Rubric) -> list[str]:
    """Warnings for parameters with defaults named like an argument the rubric supplies
    (``answr`` for ``answer``, ``states`` in a function that is not a group one): the
    rubric passes only the names it knows, so the default is used on every rollout."""
    found = []
    for rf in rubric.funcs:
        supplied = rubric._supplied(group=rf.group)
        for name, param in inspect.signature(rf.func).parameters.items():
            if param.default is inspect.Parameter.empty or name in supplied:
                continue
            if param.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
                continue
            close = difflib.get_close_matches(name, sorted(supplied), n=1, cutoff=0.8)
            if close:
                found.append(
                    f"reward function {rf.name}: its parameter {name!r} is not an argument "
                    f"the rubric supplies, so it keeps its default {param.default!r} on every "
                    f"rollout (did you mean {close[0]!r}?)"
                )
    return found


def constant_reward(outputs: Iterable[Any]) -> list[str]:
    """A warning when rollouts whose final replies differ all got the same reward."""
    scored = [out for out in outputs if not out.error and out.reward is not None]
    replies = {_final_reply(out.completion) for out in scored}
    rewards = {out.reward for out in scored}
    if len(replies) < 2 or len(rewards) != 1:
        return []
    return [
        f"every rollout scored {rewards.pop()}, though their final replies differ "
        f"({len(replies)} distinct): a reward that cannot tell replies apart teaches "
        "nothing; check it with replies= holding a right and a wrong answer"
    ]


# -- the pieces ----------------------------------------------------------------------


class _Echo(Parser):
    """A parser that reads ``text`` from any completion: what a right reply parses to."""

    def __init__(self, text: str) -> None:
        self.text = text

    def parse(self, text: str) -> Any:
        return self.text

    def parse_answer(self, completion: Any) -> str | None:
        return self.text


def _wrong(answer: Any) -> str:
    """A reply that is not ``answer`` (a number or a bool)."""
    return str(not answer) if isinstance(answer, bool) else str(answer + 1)


def _written(parser: Parser, text: str) -> str:
    """What a model writes for ``parser`` to read ``text`` (tags for an ``XMLParser``),
    for a reward function that parses with a parser of its own."""
    if isinstance(parser, ThinkParser):
        return _written(parser.inner, text)
    if isinstance(parser, XMLParser):
        return f"<{parser.answer_field}>{text}</{parser.answer_field}>"
    return text


def _probe(
    rubric: Rubric, rf: RewardFunc, row: Mapping[str, Any], task: str, *, reply: str, answer: Any
) -> float | None:
    """``rf``'s score for a completion whose answer is ``reply``, against ``answer``; None
    when it raises or returns no number (the probe then says nothing)."""
    probe = copy.copy(rubric)
    probe.parser = _Echo(reply)
    completion = [{"role": "assistant", "content": _written(rubric.parser, reply)}]
    state = {"prompt": [], "completion": completion, "answer": answer,
             "info": dict(info) if isinstance(info := row.get("info"), Mapping) else {},
             "example_id": 0, "task": task,
             "turn": 1, "trajectory": [], "error": None}  # fmt: skip

    async def score() -> float:
        if rf.group:
            values = await _call(rf.func, probe._group_kwargs(rf.func, [state]))
            return _number(rf.name, next(iter(values)))
        return await probe._score_one(rf, state)

    try:
        return asyncio.run(score())
    except Exception:
        return None


def _rows(found: Sequence[tuple[Any, ...]]) -> str:
    """``row 3`` or ``rows 0, 1, 2``: the rows (their first entries) a finding is about."""
    return f"row{'s' if len(found) > 1 else ''} {', '.join(str(f[0]) for f in found)}"


def _final_reply(completion: Sequence[Mapping[str, Any]]) -> str:
    texts = [text_of(m) for m in completion if m.get("role") == "assistant"]
    return texts[-1] if texts else ""
