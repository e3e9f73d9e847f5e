"""``VfMMTaskset``: a vf_mm environment's dataset as a verifiers v1 taskset, one task per row.

verifiers 0.4 loads a taskset by id, the name of an installed package exporting a
``Taskset`` subclass through ``__all__``; the package ``vf_mm_verifiers`` (shipped with
vf-mm) exports this one and ``VfMMHarness``, so verifiers' own loader finds both::

    [env.taskset]                   # verifiers' EnvConfig; prime-rl's [orchestrator.env]
    id = "vf-mm-verifiers"
    env = "gridnav"                 # the vf_mm environment (vf_mm.load_environment)
    env_args = {difficulty = "easy", max_turns = 2}
    num_examples = 64               # -1: the whole dataset

A task holds the environment's id, its arguments and the row's index (``TaskData`` is
what verifiers records on every trace: a row's images stay in the process, read again by
index where the rollout runs). Its reward is the environment's own rubric, computed by
the harness on the rollout it ran (``trace.info["vf_mm"]``): verifiers scores each trace
alone, so a rubric with group reward functions is refused when the taskset loads.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Mapping
from typing import Any, Literal

import verifiers.v1 as vf
from pydantic import Field

from vf_mm.errors import UnsupportedEnvironmentError

#: where the harness leaves the rollout's result on the trace (``trace.info[INFO_KEY]``)
INFO_KEY = "vf_mm"


class VfMMTasksetConfig(vf.TasksetConfig):
    """``env``: the vf_mm environment id; ``env_args`` its ``load_environment`` keywords;
    ``split``: its ``"train"`` (``get_dataset``) or ``"eval"`` rows; ``num_examples``: how
    many rows (-1: all)."""

    env: str = ""
    env_args: dict[str, Any] = Field(default_factory=dict)
    split: Literal["train", "eval"] = "train"
    num_examples: int = -1


class VfMMTaskData(vf.TaskData):
    """One row of a vf_mm environment: which environment (``env``, ``env_args``), which
    split, and the row's index in it (``example_id``). ``prompt`` is the row's prompt as
    text, for verifiers to show; the rollout starts from the row itself."""

    env: str
    env_args: dict[str, Any] = Field(default_factory=dict)
    split: Literal["train", "eval"] = "train"
    example_id: int
    num_examples: int = -1


class VfMMTask(vf.Task[VfMMTaskData, vf.State, vf.TaskConfig]):
    """A row of a vf_mm environment; its reward and metrics are the environment rubric's,
    which the harness computed on the rollout."""

    @property
    def key(self) -> str:
        return f"{self.data.env}/{self.data.split}/{self.data.example_id}"

    @vf.reward
    async def reward(self, trace: vf.Trace) -> float:
        """The environment rubric's reward, as the harness stored it.

        Args:
            trace: The task's trace.
        """
        return float(_result(trace)["reward"])

    @vf.metric
    async def metrics(self, trace: vf.Trace) -> dict[str, float]:
        """The environment rubric's metrics, as the harness stored them (``vf_mm/<name>``).

        Args:
            trace: The task's trace.
        """
        return {f"vf_mm/{k}": float(v) for k, v in _result(trace)["metrics"].items()}


class VfMMTaskset(vf.Taskset[VfMMTask, VfMMTasksetConfig]):
    """The rows of the vf_mm environment ``config.env`` (see the module docstring)."""

    def load(self) -> Iterator[VfMMTask]:
        config = self.config
        if not config.env:
            raise ValueError(
                "vf-mm-verifiers needs the vf_mm environment: --env.taskset.env ID "
                "(and --env.taskset.env-args '{...}' for its load_environment keywords)"
            )
        loaded = environment(config.env, config.env_args)
        rows = environment_rows(config.env, config.env_args, config.split, config.num_examples)
        for i, row in enumerate(rows):
            data = VfMMTaskData(
                prompt=_prompt_text(loaded, row, i),
                env=config.env,
                env_args=dict(config.env_args),
                split=config.split,
                example_id=i,
                num_examples=config.num_examples,
            )
            yield VfMMTask(data, config.task)


_LOCK = threading.Lock()
_ENVS: dict[str, Any] = {}
_ROWS: dict[tuple[str, str, int], list[dict[str, Any]]] = {}


def environment(env: str, env_args: Mapping[str, Any]) -> Any:
    """The vf_mm environment ``env`` with ``env_args``, loaded once per process; one whose
    rubric has group reward functions is refused (verifiers scores each trace alone)."""
    key = json.dumps([env, dict(env_args)], sort_keys=True, default=str)
    with _LOCK:
        loaded = _ENVS.get(key)
    if loaded is not None:
        return loaded
    import vf_mm

    loaded = vf_mm.load_environment(env, **dict(env_args))
    group = [rf.name for rf in getattr(loaded.rubric, "funcs", ()) if rf.group]
    if group:
        raise UnsupportedEnvironmentError(
            f"vf_mm environment {env!r}: its rubric has group reward functions "
            f"({', '.join(group)}), which score a group of rollouts together; verifiers v1 "
            "scores each trace alone, so they cannot run there (train it with vf_mm's own "
            "loop, or make them per-rollout)"
        )
    with _LOCK:
        return _ENVS.setdefault(key, loaded)


def environment_rows(
    env: str, env_args: Mapping[str, Any], split: str, num_examples: int
) -> list[dict[str, Any]]:
    """The first ``num_examples`` rows of the environment's ``split`` (all: -1), read once
    per process (the taskset lists them, the harness runs them by index)."""
    loaded = environment(env, env_args)
    key = (json.dumps([env, dict(env_args)], sort_keys=True, default=str), split, num_examples)
    with _LOCK:
        rows = _ROWS.get(key)
    if rows is None:
        read = loaded.get_eval_dataset if split == "eval" else loaded.get_dataset
        rows = list(read(num_examples))
        with _LOCK:
            rows = _ROWS.setdefault(key, rows)
    return rows


def _prompt_text(env: Any, row: Mapping[str, Any], index: int) -> str:
    """The row's prompt as text (what verifiers shows and records; the rollout itself
    starts from the row, images included): its messages' text parts, one per line."""
    try:
        messages = env.format_prompt(row)
    except Exception:  # the rollout reports a prompt it cannot make, with its stage
        messages = []
    lines = []
    for message in messages:
        content = message.get("content")
        parts = content if isinstance(content, list) else [{"type": "text", "text": content}]
        for part in parts:
            if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                lines.append(part["text"])
            elif isinstance(part, Mapping):
                lines.append(f"[{part.get('type')}]")
    return "\n".join(lines) or f"row {index}"


def _result(trace: vf.Trace) -> dict[str, Any]:
    result = trace.info.get(INFO_KEY)
    if not isinstance(result, dict) or result.get("reward") is None:
        raise ValueError(
            "the trace has no vf_mm result: the vf_mm harness (vf-mm-verifiers) runs the "
            "rollout and scores it; pair the taskset with it (the default harness)"
        )
    return result
