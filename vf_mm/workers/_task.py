"""What goes to a worker and what comes back: ``WorkerSpec``, ``GroupTask``, ``GroupResult``.

Everything here crosses a process boundary (a pipe, or Ray's object store), so it is
plain data that pickles: a worker is told how to build its environment and client once
(``WorkerSpec``), then gets one example's group at a time (``GroupTask``: the row itself,
its example id and the rollout indices still to run) and answers with the scored rollouts
and its client's counts so far (``GroupResult``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vf_mm.client import ClientStats
from vf_mm.types import RolloutError, RolloutOutput


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """How a worker builds what it runs, in its own process.

    The worker needs the environment's rubric and rollout logic, while the rows come from
    the parent one group at a time.

    Attributes:
        env_id: The environment, loaded by ``vf_mm.load_environment(env_id,
            search_paths=env_dirs, **env_args)`` as the parent loaded it.
        make_client: Called once per worker to build its ``RendererClient`` (its own
            backend: a ``VLLMBackend`` to the same servers, or its own ``LocalBackend``); it
            must pickle (a module-level function, or a ``functools.partial`` of one).
        env_args: The environment's ``load_environment`` arguments.
        env_dirs: Folders searched for the environment.
    """

    env_id: str
    make_client: Callable[[], Any]
    env_args: Mapping[str, Any] = field(default_factory=dict)
    env_dirs: Sequence[str] = ()


@dataclass(slots=True)
class GroupTask:
    """One example's rollouts to run.

    Attributes:
        task_id: The task's id.
        row: The dataset row.
        example_id: The example's id.
        indices: Which of the ``rollouts_per_example`` to run (the others are done
            already, e.g. in a resumed run).
        rollouts_per_example: The group's size.
        sampling_args: Sampling over the environment's defaults.
        seed: Seeds sampling per rollout.
        attempts: Counts the workers that died while running it.
        assets_dir: A run directory on this machine's filesystem: the worker stores the
            group's images and videos in its ``assets/`` itself (``AssetStore``:
            content-addressed, each written once whoever writes it) and sends back
            messages that name them, so the parent neither encodes them nor unpickles
            them. None: the messages come back as they are.
    """

    task_id: int
    row: dict[str, Any]
    example_id: Any
    indices: tuple[int, ...]
    rollouts_per_example: int
    sampling_args: Mapping[str, Any] | None = None
    seed: int | None = None
    attempts: int = 0
    assets_dir: str | None = None


@dataclass(slots=True)
class GroupResult:
    """A worker's answer to one ``GroupTask``.

    Attributes:
        task_id: The task's id.
        outputs: ``(rollout_index, output)`` for each index of the task, scored together.
        stats: The worker's ``ClientStats`` so far (the parent sums the workers').
    """

    task_id: int
    outputs: list[tuple[int, RolloutOutput]]
    stats: ClientStats


def failed_group(task: GroupTask, error: RolloutError) -> list[tuple[int, RolloutOutput]]:
    """The task's rollouts as failures, each with ``error``: what a group that no worker
    could finish becomes (recorded, never dropped)."""
    info = task.row.get("info")
    return [
        (
            index,
            RolloutOutput(
                example_id=task.example_id,
                prompt=[],
                completion=[],
                answer=task.row.get("answer"),
                info=dict(info) if isinstance(info, Mapping) else {},
                error=error,
            ),
        )
        for index in task.indices
    ]


def add_stats(total: ClientStats, part: ClientStats) -> None:
    """Add one worker's counts to ``total`` (in place)."""
    total.turns += part.turns
    total.bridges += part.bridges
    total.renders += part.renders
    total.fallbacks.update(part.fallbacks)
    total.render_s += part.render_s
    total.backend_s += part.backend_s
    total.prompt_tokens += part.prompt_tokens
    total.completion_tokens += part.completion_tokens
