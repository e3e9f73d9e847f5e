"""``WorkerPool``: an environment's groups run in W workers, results back in this process.

Rendering, image processing and environment code are CPU work under one GIL; a run that
drives many servers needs more than one process for them. The pool starts W workers
(``ProcessWorker`` on this machine, or ``RayWorker`` actors on a Ray cluster), sends
them one example's group at a time (the row itself, so a worker needs no dataset) and
hands every scored rollout to ``on_result`` here, in this process: one results directory
or one trainer stream, whoever ran it.

Guarantees:

- **Exactly once per (example, rollout).** A rollout is handed to ``on_result`` once;
  a repeat (which only a worker lost after answering could cause) is dropped.
- **A dead worker loses only its own groups in flight**: they run again on another
  worker, and the dead one is replaced (up to ``max_restarts`` times per worker). A
  group that two workers died on is recorded as failed with ``WorkerLostError``: it may
  be what kills them, and it must not take the run with it.
- **A worker that cannot start stops the run** (``WorkerStartError`` with the worker's
  own message): every worker would fail the same way.
- Each worker runs up to ``ceil(concurrency / (workers * rollouts_per_example))``
  groups at once, so about ``concurrency`` rollouts run in all.

Ray and multiprocessing do the distributing; the pool only keeps the groups in flight:
rows are read one at a time as a driver frees up, so a run of any length holds only
what is running (and the groups waiting to run again after a worker died).
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import logging
import math
import os
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from typing import Any

from vf_mm.client import ClientStats
from vf_mm.errors import WorkerLostError, WorkerStartError
from vf_mm.types import RolloutError, RolloutOutput
from vf_mm.workers._process import ProcessWorker
from vf_mm.workers._start import START_METHODS, check_start_method
from vf_mm.workers._task import GroupResult, GroupTask, WorkerSpec, add_stats, failed_group

logger = logging.getLogger(__name__)

TRANSPORTS = ("process", "ray")
_NO_ID = object()


class WorkerPool:
    """W workers that run an environment's groups.

    Use as ``async with``, or call ``start`` and ``aclose``.

    Args:
        spec: How each worker builds its environment and client.
        workers: How many workers (>= 1).
        transport: ``"process"`` (subprocesses of this machine) or ``"ray"`` (actors on
            the Ray cluster at ``ray_address``; needs the optional ``ray`` package).
        ray_address: The Ray cluster; None starts or joins a local one.
        max_restarts: How many times a dead worker is replaced, per worker.
        threads: Torch threads per process worker (default: this machine's cores shared
            among the workers).
        start_timeout_s: How long a worker may take to build its environment and client.
        start_method: How a process worker starts: ``"forkserver"`` (forked from a server
            that imported torch, transformers and vf_mm once: fast) or ``"spawn"`` (a
            fresh interpreter each).

    Raises:
        ValueError: ``workers`` under 1, an unknown ``transport`` or ``start_method``.
    """

    def __init__(
        self,
        spec: WorkerSpec,
        workers: int,
        *,
        transport: str = "process",
        ray_address: str | None = None,
        max_restarts: int = 3,
        threads: int | None = None,
        start_timeout_s: float = 900.0,
        start_method: str = START_METHODS[0],
    ) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        if transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {TRANSPORTS}, not {transport!r}")
        check_start_method(start_method)
        self.start_method = start_method
        self.spec = spec
        self.size = workers
        self.transport = transport
        self.ray_address = ray_address
        self.max_restarts = max_restarts
        self.threads = threads if threads is not None else max(1, (os.cpu_count() or 1) // workers)
        self.start_timeout_s = start_timeout_s
        self.restarts = 0  # workers replaced after dying
        self.lost_groups = 0  # groups sent again because their worker died
        self._workers: list[Any] = []
        self._info: dict[str, Any] = {}
        self._stats: dict[tuple[int, int], ClientStats] = {}  # (slot, incarnation) -> latest
        self._generation = [0] * workers
        self._ready = [asyncio.Event() for _ in range(workers)]  # cleared while replacing
        self._dead: set[int] = set()  # slots out of restarts
        self._task_ids = itertools.count()

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self) -> WorkerPool:
        """Start every worker (concurrently) and wait until all are ready.
        ``MissingDependencyError`` at once for ``transport="ray"`` without Ray."""
        if self.transport == "ray":
            from vf_mm.workers._ray import require_ray

            require_ray()
        self._workers = [self._new_worker(slot) for slot in range(self.size)]
        results = await asyncio.gather(*(w.start() for w in self._workers), return_exceptions=True)
        failures = [r for r in results if isinstance(r, BaseException)]
        if failures:
            await self.aclose()
            first = failures[0]
            if isinstance(first, WorkerStartError):
                raise first
            raise WorkerStartError(f"a worker could not start: {first}") from first
        self._info = results[0]  # type: ignore[assignment]
        for slot, info in enumerate(results[1:], start=1):
            differs = _differs(self._info, info)  # type: ignore[arg-type]
            if differs:
                await self.aclose()
                raise WorkerStartError(f"worker {slot} differs from worker 0: {differs}")
        for ready in self._ready:
            ready.set()
        return self

    def _new_worker(self, slot: int) -> Any:
        name = f"vf-mm-worker-{slot}"
        if self.transport == "ray":
            from vf_mm.workers._ray import RayWorker

            return RayWorker(
                self.spec, name=name, address=self.ray_address, start_timeout_s=self.start_timeout_s
            )
        return ProcessWorker(
            self.spec,
            name=name,
            threads=self.threads,
            start_timeout_s=self.start_timeout_s,
            start_method=self.start_method,
        )

    async def aclose(self) -> None:
        await asyncio.gather(*(w.close() for w in self._workers), return_exceptions=True)
        self._workers = []

    async def __aenter__(self) -> WorkerPool:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    @property
    def workers(self) -> list[Any]:
        """The live worker handles, by slot (a replaced worker's successor in its slot)."""
        return list(self._workers)

    # -- what the parent needs to know ----------------------------------------------------

    @property
    def media_rules(self) -> tuple[Any, Any]:
        """``(image_policy, video_limits)`` the workers' renderers read media under, as
        ``RendererClient.media_rules``: results are stored and groups packed under them."""
        return tuple(self._info.get("media_rules") or (None, None))

    @property
    def image_processing(self) -> dict[str, Any] | None:
        """The workers' renderers' image processing, described as a group frame records it
        (``ImageProcessing.description``); None for a renderer without vision."""
        return self._info.get("image_processing")

    @property
    def stats(self) -> ClientStats:
        """Every worker's ``ClientStats`` summed (a dead worker's last counts included)."""
        total = ClientStats()
        for part in self._stats.values():
            add_stats(total, part)
        return total

    # -- running groups -------------------------------------------------------------------

    async def evaluate(
        self,
        env: Any,
        *,
        rows: Iterable[Mapping[str, Any]],
        example_ids: Iterable[Any] | None = None,
        rollouts_per_example: int = 1,
        concurrency: int = 32,
        sampling_args: Mapping[str, Any] | None = None,
        seed: int | None = None,
        skip: set[tuple[Any, int]] | frozenset[tuple[Any, int]] | None = None,
        on_result: Callable[[RolloutOutput, int], Awaitable[None] | None] | None = None,
        keep_outputs: bool | None = None,
        assets_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        """``Environment.evaluate``'s contract, run in the workers.

        A group that two workers died on is recorded as failed with ``WorkerLostError``, not
        raised. Each example's group is scored together, and each scored rollout goes to
        ``on_result(output, index)`` as its group finishes. A row becomes a group only when a
        driver has room for it, so the groups held here are those in flight and those waiting
        to run again after a worker died, never the whole run.

        Args:
            env: The parent's copy of the environment (the workers load their own from the
                spec); only its rows travel.
            rows: Any iterable, a generator included, read as workers free up.
            example_ids: Names the rows, in step with them (default: a row's ``example_id``,
                else its position).
            rollouts_per_example: Rollouts per row (a group).
            concurrency: The most rollouts running at once, over all workers.
            sampling_args: Sampling over the environment's defaults.
            seed: Seeds sampling per rollout.
            skip: ``(example_id, rollout_index)`` pairs already done.
            on_result: Called with each scored rollout and its index.
            keep_outputs: Accepted for the shared signature; outputs are never kept, and
                ``True`` is refused: use ``on_result``.
            assets_dir: A run directory (``evaluate_to_dir``'s): process workers store
                their rollouts' images and videos in its ``assets/`` themselves and send
                back messages naming them (``GroupTask.assets_dir``), so this process does
                not encode them; Ray actors, which may run on other machines, do not.

        Raises:
            WorkerStartError: A worker cannot start (every worker would fail the same way).
            ValueError: ``keep_outputs=True``, or fewer ``example_ids`` than rows.
        """
        if not self._workers:
            raise RuntimeError("start() the pool first")
        if keep_outputs:
            raise ValueError("WorkerPool.evaluate keeps no outputs: collect them in on_result")
        skip = skip or frozenset()
        stored_in = (
            str(assets_dir) if assets_dir is not None and self.transport == "process" else None
        )
        ids: Iterator[Any] = iter(example_ids) if example_ids is not None else itertools.count()
        source = enumerate(rows)
        retry: asyncio.Queue[GroupTask] = asyncio.Queue()  # groups whose worker died
        remaining = 0  # groups pulled and not yet delivered
        exhausted = False
        finished = asyncio.Event()

        def pull() -> GroupTask | None:
            """The next row's group to run (rows whose rollouts are all done are passed
            over), or None at the end of the rows."""
            nonlocal remaining, exhausted
            for position, row in source:
                example_id = next(ids, _NO_ID)
                if example_id is _NO_ID:
                    raise ValueError(f"fewer example_ids than rows (row {position} has none)")
                if example_ids is None:
                    example_id = row.get("example_id", example_id)
                indices = tuple(
                    i for i in range(rollouts_per_example) if (example_id, i) not in skip
                )
                if indices:
                    remaining += 1
                    return GroupTask(next(self._task_ids), dict(row), example_id, indices,
                                     rollouts_per_example, sampling_args, seed,
                                     assets_dir=stored_in)  # fmt: skip
            exhausted = True
            if remaining == 0:
                finished.set()
            return None

        async def take() -> GroupTask:
            if not retry.empty():
                return retry.get_nowait()
            task = None if exhausted else pull()
            if task is not None:
                return task
            return await retry.get()  # the rows are done: only a lost group can come

        delivered: set[tuple[Any, int]] = set()
        per_worker = max(1, math.ceil(concurrency / (self.size * rollouts_per_example)))

        async def deliver(task: GroupTask, outputs: list[tuple[int, RolloutOutput]]) -> None:
            nonlocal remaining
            for index, output in sorted(outputs, key=lambda pair: pair[0]):
                if (task.example_id, index) in delivered:
                    continue  # never twice
                delivered.add((task.example_id, index))
                result = on_result(output, index) if on_result is not None else None
                if inspect.isawaitable(result):
                    await result
            remaining -= 1
            if remaining == 0 and exhausted:
                finished.set()

        async def drive(slot: int) -> None:
            while True:
                await self._ready[slot].wait()
                if slot in self._dead:
                    return
                task = await take()
                worker = self._workers[slot]
                generation = self._generation[slot]
                if worker.lost is not None:  # it died before this task reached it
                    retry.put_nowait(task)
                    if not await self._replace(slot, generation):
                        return
                    continue
                try:
                    answer = await worker.run(task)
                except WorkerLostError as lost:
                    task.attempts += 1
                    self.lost_groups += 1
                    if task.attempts >= 2:
                        error = RolloutError.from_exception(lost, where="worker")
                        error = RolloutError(
                            error.type,
                            f"two workers died running this group; the last: {lost}",
                            error.where,
                        )
                        await deliver(task, failed_group(task, error))
                    else:
                        retry.put_nowait(task)  # another worker takes it
                    if not await self._replace(slot, generation):
                        return  # this slot is done; the others go on
                    continue
                if isinstance(answer, GroupResult):
                    self._stats[(slot, generation)] = answer.stats
                    await deliver(task, answer.outputs)
                else:  # the group failed inside the worker, outside any one rollout
                    await deliver(task, failed_group(task, answer))

        drivers = [
            asyncio.create_task(drive(slot)) for slot in range(self.size) for _ in range(per_worker)
        ]
        waiter = asyncio.create_task(finished.wait())
        try:
            while not finished.is_set():
                alive = [d for d in drivers if not d.done()]
                if not alive:  # every worker is gone for good: fail what is left
                    error = RolloutError(
                        "WorkerLostError", "no worker is left to run this group", "worker"
                    )
                    while not retry.empty() or not exhausted:
                        left = retry.get_nowait() if not retry.empty() else pull()
                        if left is not None:
                            await deliver(left, failed_group(left, error))
                    break
                await asyncio.wait([waiter, *alive], return_when=asyncio.FIRST_COMPLETED)
                for d in drivers:  # an error in the pool's own code: raise it
                    if d.done() and not d.cancelled() and d.exception() is not None:
                        raise d.exception()  # type: ignore[misc]
        finally:
            waiter.cancel()
            for d in drivers:
                d.cancel()
            await asyncio.gather(*drivers, return_exceptions=True)

    async def _replace(self, slot: int, generation: int) -> bool:
        """Replace the dead worker in ``slot`` (once, whichever of its drivers gets here
        first); False when the slot has used up its restarts or the new one fails."""
        if self._generation[slot] != generation:  # another driver of this slot did it
            await self._ready[slot].wait()
            return slot not in self._dead
        self._generation[slot] += 1
        self._ready[slot].clear()
        try:
            if self._generation[slot] > self.max_restarts:
                self._dead.add(slot)
                return False
            old = self._workers[slot]
            self._workers[slot] = worker = self._new_worker(slot)
            await old.close()
            try:
                info = await worker.start()
            except WorkerStartError:
                self._dead.add(slot)
                return False
            differs = _differs(self._info, info)
            if differs:  # a replacement that would process otherwise takes no group
                logger.warning("vf-mm-worker-%d is not replaced: %s", slot, differs)
                self._dead.add(slot)
                await worker.close()
                return False
            self.restarts += 1
            return True
        finally:
            self._ready[slot].set()


def _differs(first: dict[str, Any], other: dict[str, Any]) -> str | None:
    """What ``other`` worker's info has that ``first``'s has not (None: the same): the
    rules media are read under and the image processing (its config, backend and library
    versions). Every group of a run is packed and described as worker 0's: a worker that
    reads or processes images otherwise would make tensors its frames do not describe."""
    for key, what in (("media_rules", "media rules"), ("image_processing", "image processing")):
        if first.get(key) != other.get(key):
            return (
                f"its {what} ({_short(other.get(key))}) are not worker 0's "
                f"({_short(first.get(key))}); every worker of a run needs the same checkpoint, "
                "options and library versions"
            )
    return None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 200 else text[:200] + "..."
