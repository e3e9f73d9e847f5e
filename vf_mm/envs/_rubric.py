"""Rubric: reward functions that receive what they name, weighted into one reward.

A reward function declares the arguments it wants by name, from: ``prompt``,
``completion``, ``answer``, ``state``, ``info``, ``parser``, ``example_id``, ``task``
(and ``**kwargs`` for all of them); it may be async. The names are checked when the
function is added (``RewardFunctionError``): a typo such as ``answr`` fails when the
environment is built, not after every rollout of a run was generated. Its weight scales its part of the
reward; weight 0 makes it a *metric*: computed and reported, not rewarded. A group
reward function (``group=True``) sees the whole group of rollouts for one example at
once, each argument as a list (``prompts``, ``completions``, ``answers``, ``states``,
``infos``), and returns one number per rollout.

``answer`` and ``info`` are the dataset row's columns: a reward function that names one
the row lacks (or holds null) fails that rollout with ``MissingColumnError`` instead of
receiving a made-up ``None`` (a parser that finds no answer would "match" it), unless the
environment lists the column in ``optional_columns``.

A reward function that raises (or returns something that is not a finite number: None,
NaN, text such as ``"1.0"``) on one rollout fails that rollout, with the function named in its error; the group's other
rollouts are scored as usual. A group reward function's failure fails the group.

A rollout that failed (its ``state["error"]`` is set) is never passed to reward
functions: its reward is None (not a made-up 0) and its error is what is reported;
summaries count it as an error and a pass@k failure, and training skips it.
"""

from __future__ import annotations

import asyncio
import difflib
import inspect
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vf_mm.envs._parser import Parser
from vf_mm.errors import MissingColumnError, RewardFunctionError
from vf_mm.types import RolloutError

GROUP_ARGS = {"prompts": "prompt", "completions": "completion", "answers": "answer",
              "states": "state", "infos": "info", "example_ids": "example_id", "tasks": "task"}  # fmt: skip


@dataclass(slots=True)
class RewardFunc:
    func: Callable[..., Any]
    name: str  # the metric's key: the function's name, made unique within the rubric
    weight: float = 1.0
    group: bool = False


class Rubric:
    """Reward functions that receive what they name, weighted into one reward.

    See the module docstring for the arguments a reward function may name.

    Args:
        funcs: The reward functions (a single function is taken as a list of one).
        weights: One weight per function (default: 1.0 each); 0 makes it a metric.
        parser: The parser reward functions receive as ``parser`` (default: ``Parser()``).

    Raises:
        ValueError: ``weights`` and ``funcs`` differ in length.
        RewardFunctionError: A function asks for an argument the rubric does not supply,
            or is not callable.
    """

    def __init__(
        self,
        funcs: Sequence[Callable[..., Any]] = (),
        weights: Sequence[float] | None = None,
        *,
        parser: Parser | None = None,
    ) -> None:
        if weights is not None and len(weights) != len(funcs):
            raise ValueError(f"{len(funcs)} reward functions but {len(weights)} weights")
        self.parser = parser or Parser()
        self.funcs: list[RewardFunc] = []
        if callable(funcs):  # Rubric(f): one function, as Rubric([f])
            funcs = [funcs]
        for i, func in enumerate(funcs):
            self.add_reward_func(func, weight=1.0 if weights is None else weights[i])

    def add_reward_func(self, func: Callable[..., Any], *, weight: float = 1.0) -> None:
        """Add a reward function.

        Args:
            func: Takes the arguments it names (``prompt``, ``completion``, ``answer``, ...)
                and returns a number; may be async.
            weight: Its weight in the reward (0: a metric).

        Raises:
            RewardFunctionError: It asks for an argument the rubric does not supply.
        """
        self.funcs.append(RewardFunc(self._checked(func, False), self._name(func), weight))

    def add_metric(self, func: Callable[..., Any]) -> None:
        """Add a function that is reported but does not count toward the reward.

        Args:
            func: A reward function (weight 0).

        Raises:
            RewardFunctionError: It asks for an argument the rubric does not supply.
        """
        self.funcs.append(RewardFunc(self._checked(func, False), self._name(func), 0.0))

    def add_group_reward_func(self, func: Callable[..., Any], *, weight: float = 1.0) -> None:
        """Add a group reward function: it sees all of one example's rollouts at once.

        Args:
            func: Takes ``prompts``, ``completions``, ``answers``, ``states``, ``infos``, ...
                by name and returns one number per rollout.
            weight: Its weight in the reward (0: a metric).

        Raises:
            RewardFunctionError: It asks for an argument the rubric does not supply.
        """
        rf = RewardFunc(self._checked(func, True), self._name(func), weight, group=True)
        self.funcs.append(rf)

    def _supplied(self, *, group: bool = False) -> set[str]:
        """The argument names this rubric passes to a reward function (``group``: to a
        group reward function, in the plural)."""
        if group:
            return {*GROUP_ARGS, "parser"}
        return set(self._available({}))

    def _checked(self, func: Any, group: bool) -> Callable[..., Any]:
        """``func``, if every argument it requires is one the rubric supplies by name: the
        check scoring makes (``_select``), made before any rollout runs."""
        _require(_callable(func), self._supplied(group=group))
        return func

    def _name(self, func: Callable[..., Any]) -> str:
        """The metric key and error name of ``func``: its ``__name__``; a lambda's names its
        position in the rubric and its source line (every lambda is ``<lambda>``, and
        ``<lambda>_2`` would point nowhere)."""
        base = getattr(func, "__name__", type(func).__name__)
        code = getattr(func, "__code__", None)
        if base == "<lambda>" and code is not None:
            base = f"<lambda> #{len(self.funcs) + 1} (line {code.co_firstlineno})"
        taken = {rf.name for rf in self.funcs}
        name, n = base, 2
        while name in taken:
            name, n = f"{base}_{n}", n + 1
        return name

    async def score_group(
        self, states: Sequence[dict[str, Any]]
    ) -> list[tuple[float | None, dict[str, float]]]:
        """(reward, metrics) for each rollout of one example's group.

        A failed rollout is not scored (reward None); a function that raises or returns no
        finite number fails the rollout it was called for.

        Args:
            states: The group's finished states.
        """
        ok = [i for i, s in enumerate(states) if not s.get("error")]
        metrics: list[dict[str, float]] = [{} for _ in states]
        for rf in self.funcs:
            if rf.group:
                values = await _call(rf.func, self._group_kwargs(rf.func, [states[i] for i in ok]))
                values = list(values)
                if len(values) != len(ok):
                    raise ValueError(
                        f"group reward {rf.name} returned {len(values)} values for {len(ok)} rollouts"
                    )
                for i, value in zip(ok, values, strict=True):
                    metrics[i][rf.name] = _number(rf.name, value)
            else:  # a failure here is that rollout's own: its siblings are still scored
                results = await asyncio.gather(
                    *(self._score_one(rf, states[i]) for i in ok), return_exceptions=True
                )
                for i, value in zip(list(ok), results, strict=True):
                    if isinstance(value, Exception):
                        states[i]["error"] = RolloutError.from_exception(
                            value, where=f"reward function {rf.name}"
                        )
                        ok.remove(i)
                    elif isinstance(value, BaseException):
                        raise value
                    else:
                        metrics[i][rf.name] = value
        out: list[tuple[float | None, dict[str, float]]] = []
        for i, state in enumerate(states):
            if state.get("error"):
                out.append((None, {}))  # not scored: the error is the result
                continue
            reward = sum(rf.weight * metrics[i][rf.name] for rf in self.funcs if rf.weight)
            out.append((float(reward), metrics[i]))
        return out

    async def _score_one(self, rf: RewardFunc, state: dict[str, Any]) -> float:
        return _number(rf.name, await _call(rf.func, self._kwargs(rf.func, state)))

    async def score_rollout(self, state: dict[str, Any]) -> tuple[float | None, dict[str, float]]:
        """(reward, metrics) for one rollout (a group of one).

        Args:
            state: The rollout's finished state.
        """
        return (await self.score_group([state]))[0]

    def _kwargs(self, func: Callable[..., Any], state: dict[str, Any]) -> dict[str, Any]:
        kwargs = _select(func, self._available(state))
        return _check_columns(func, kwargs, [state])

    def _available(self, state: dict[str, Any]) -> dict[str, Any]:
        return {
            "prompt": state.get("prompt"),
            "completion": state.get("completion"),
            "answer": state.get("answer"),
            "state": state,
            "info": state.get("info", {}),
            "parser": self.parser,
            "example_id": state.get("example_id"),
            "task": state.get("task"),
        }

    def _group_kwargs(
        self, func: Callable[..., Any], states: list[dict[str, Any]]
    ) -> dict[str, Any]:
        each = [self._available(s) for s in states]
        available: dict[str, Any] = {
            plural: [a[single] for a in each] for plural, single in GROUP_ARGS.items()
        }
        available["parser"] = self.parser
        return _check_columns(func, _select(func, available), states)


def _callable(func: Any) -> Callable[..., Any]:
    if not callable(func):
        raise RewardFunctionError(
            f"a reward function must be callable, not a {type(func).__name__} ({func!r}); "
            "pass the function itself, not its name"
        )
    return func


def asked_columns(func: Callable[..., Any]) -> set[str]:
    """The dataset columns ``func`` names as parameters (``answer`` / ``answers``, ...)."""
    names = inspect.signature(func).parameters
    return {GROUP_ARGS.get(n, n) for n in names} & {"answer", "info"}


def _check_columns(
    func: Callable[..., Any], kwargs: dict[str, Any], states: Sequence[dict[str, Any]]
) -> dict[str, Any]:
    """Refuse to call ``func`` with a column some rollout's row lacks (state["missing_columns"]).

    A ``**kwargs`` function that does not name the column is called without it (no key,
    rather than a made-up None)."""
    asked = asked_columns(func)
    for state in states:
        for column in asked.intersection(state.get("missing_columns", ())):
            name = getattr(func, "__name__", repr(func))
            raise MissingColumnError(
                f"reward function {name} asks for {column!r}, but the dataset row of "
                f"example {state.get('example_id')!r} has no {column!r} column (or it is "
                f"null). Give every row one, or declare it optional by passing "
                f"optional_columns=[{column!r}] to the environment's constructor, and let "
                f"{name} handle None",
                column=column,
            )
    unasked = {c for state in states for c in state.get("missing_columns", ())}  # none asked
    return {k: v for k, v in kwargs.items() if GROUP_ARGS.get(k, k) not in unasked}


def _parameters(func: Callable[..., Any]) -> Mapping[str, inspect.Parameter]:
    try:
        return inspect.signature(func).parameters
    except (TypeError, ValueError) as exc:  # a builtin or extension without a signature
        raise RewardFunctionError(
            f"reward function {_func_name(func)}: its arguments cannot be read ({exc}); "
            "wrap it in a def that names the arguments it wants"
        ) from None


def _func_name(func: Callable[..., Any]) -> str:
    return str(getattr(func, "__name__", func))


def _require(func: Callable[..., Any], available: Iterable[str]) -> None:
    """Refuse ``func`` if it requires an argument that is not in ``available`` (names are
    passed by keyword, so a required positional-only parameter cannot be filled either).
    ``**kwargs`` functions take whatever is supplied; parameters with defaults keep them."""
    params = _parameters(func)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    required = {name: p for name, p in params.items() if p.default is inspect.Parameter.empty
                and p.kind is not inspect.Parameter.VAR_POSITIONAL}  # fmt: skip
    positional = [n for n, p in required.items() if p.kind is inspect.Parameter.POSITIONAL_ONLY]
    if positional:
        raise RewardFunctionError(
            f"reward function {_func_name(func)} takes {positional} only by position; the "
            "rubric passes arguments by name: drop the '/' from its signature"
        )
    missing = [name for name in required if name not in available]
    if missing:
        hints = [f"{m!r} -> {close[0]!r}" for m in missing
                 if (close := difflib.get_close_matches(m, sorted(available), n=1))]  # fmt: skip
        raise RewardFunctionError(
            f"reward function {_func_name(func)} asks for {missing}; "
            f"it can ask for {sorted(available)}"
            + (f" (did you mean {', '.join(hints)}?)" if hints else "")
        )


def _select(func: Callable[..., Any], available: dict[str, Any]) -> dict[str, Any]:
    _require(func, available)
    params = _parameters(func)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return dict(available)
    return {name: available[name] for name in params if name in available}


async def _call(func: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
    result = func(**kwargs)
    if inspect.isawaitable(result):
        result = await result
    return result


def _number(name: str, value: Any) -> float:
    """``value`` as a finite float: a number (numpy and 0-d torch ones too) or a bool. Text
    is refused even where ``float`` would read it: a reward function that returns
    ``"1.0"`` returns what it meant to compare, not a score."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (str, bytes, bytearray)):
        raise TypeError(
            f"reward function {name} returned {value!r} (a {type(value).__name__}), not a "
            "number: return a float (1.0 for right, 0.0 for wrong)"
        )
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"reward function {name} returned {value!r}, not a number") from None
    if not math.isfinite(number):
        raise ValueError(f"reward function {name} returned {number}, not a finite number")
    return number
