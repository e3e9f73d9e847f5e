"""The local backend's worker: one thread that takes queued requests and runs them.

Requests are queued from the event loop (``submit``); the model never runs on the loop.
When idle, the worker takes the first waiting request and whatever else arrives within
``batch_window_s`` (up to ``max_batch``). Then:

- an engine of rows (``RowEngine``: the batch engine, the pool engine) runs them by
  **continuous batching**: while rows decode, requests that arrive join the running
  batch, and a row that finishes leaves it and is answered at once. A request that
  arrives while rows decode is held (``hold_s``) until it has waited as long as the last
  prefill took (at least two decode steps, at most ``HOLD_STEPS``), or until nothing
  else runs or the batch has no room left, so that requests arriving close together
  share one prefill: on a GPU a prefill's cost is mostly fixed (one forward's kernel
  launches, whatever its number of rows), so a held request waits at most about what a
  second prefill would stall every running row, and the others decode meanwhile. On a
  CPU a prefill's cost grows with its tokens, so sharing one saves little: the batch
  engine passes ``hold_steps=2`` and holds two decode steps. A request the engine has
  no room for (the pool engine's KV arena) is offered again as soon as a row leaves.
  While held, a request's row is prepared (its images, prefix match and positions) as
  the device runs a decode step, so that admission mostly places rows and the device
  waits less for it. One admission loop (``_episode``) serves both engines; each engine
  says how it prepares, places, prefills, decodes and retires rows.
- ``GenerateEngine`` (Hugging Face ``generate``) runs each batch whole.

``between_batches`` holds the worker for a weight swap or a cache clear: it takes in no
new request and, once its running rows are done, waits until the block ends. No request
ever sees two versions of the weights.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

import torch

from vf_mm.inference._generate import GenerateEngine
from vf_mm.inference._local_model import LocalModel
from vf_mm.inference._local_stats import LocalStats
from vf_mm.inference._prefix_cache import PrefixCache
from vf_mm.inference._row_builder import RowBuilder
from vf_mm.inference._rows import Pending, Row
from vf_mm.inference._vision_cache import VisionCache


@dataclass(frozen=True, slots=True)
class RowParts:
    """What an engine of rows works with, shared with the backend: the model, rows from
    ``builder``, finished rows' state kept in ``prefix`` (when ``prefix_cache``), new
    images' inputs from ``vision``, forwards counted in ``stats``."""

    model: LocalModel
    builder: RowBuilder
    prefix: PrefixCache
    vision: VisionCache
    stats: LocalStats
    prefix_cache: bool


class RowEngine(Protocol):
    """What the admission loop asks of an engine that runs rows. Every call runs on the
    worker thread; ``fail`` is called when any other call raised."""

    rows: list[Row]  # the running batch (a done row may stay until ``retire``)

    def prepare(self, pendings: list[Pending]) -> None:
        """Do the CPU work of ``pendings``' rows ahead (``RowBuilder.prepare``): the loop
        calls it for requests held while a decode step runs on the device."""
        ...

    def admit(self, pendings: list[Pending]) -> list[Pending]:
        """Make rows for ``pendings`` (a request that cannot run is answered alone);
        returns those that must wait for room, in order."""
        ...

    def prefill(self) -> None:
        """Run the rows ``admit`` made up to their first token; they join ``rows``."""
        ...

    def decode(self) -> None:
        """One step: every running row samples its next token."""
        ...

    def retire(self) -> None:
        """Answer the rows that finished (or whose caller left), keep their state in
        the prefix cache, and take them out of ``rows``."""
        ...

    def fail(self, exc: Exception) -> None:
        """A call raised ``exc``: every row not answered yet gets its error, and the
        engine holds no rows after (its memory given back)."""
        ...

    def drain(self) -> None:
        """No row is left: finish any work still in flight (the loop ends)."""
        ...


#: the longest a request that arrives while rows decode is held, in decode steps
HOLD_STEPS = 8


def hold_s(
    *, window_s: float, step_s: float, prefill_s: float, max_steps: int = HOLD_STEPS
) -> float:
    """How long a request arriving while rows decode waits for others to share its
    prefill: the last prefill's duration, at least two decode steps (and the batch
    window), at most ``max_steps`` steps."""
    return max(window_s, 2 * step_s, min(prefill_s, max_steps * step_s))


class Scheduler:
    """Runs ``engine`` on a worker thread over the requests ``submit`` queues, counting
    into ``stats`` (module docstring). ``hold_steps``: the most decode steps an arrival
    is held for others to share its prefill (``hold_s``)."""

    def __init__(
        self,
        engine: RowEngine | GenerateEngine,
        *,
        stats: LocalStats,
        batch_window_s: float,
        max_batch: int,
        hold_steps: int = HOLD_STEPS,
    ) -> None:
        self._engine = engine
        self.hold_steps = hold_steps
        self._stats = stats
        self.batch_window_s = batch_window_s
        self.max_batch = max_batch
        self._queue: queue.SimpleQueue[Pending | None] = queue.SimpleQueue()
        self._weights_lock = threading.Lock()
        self._swap = threading.Condition()
        self._swaps_waiting = 0
        self._worker = threading.Thread(target=self._run, name="vf_mm-local-backend", daemon=True)
        self._worker.start()

    def submit(self, pending: Pending) -> None:
        """Queue a request; the worker answers its future."""
        self._queue.put(pending)

    def stop(self, timeout_s: float) -> bool:
        """Stop the worker once the requests queued and running are done (blocks up to
        ``timeout_s``). Returns whether it has stopped."""
        self._queue.put(None)
        self._worker.join(timeout_s)
        return not self._worker.is_alive()

    @contextlib.contextmanager
    def between_batches(self) -> Iterator[None]:
        """Hold the worker between batches: it takes in no new request and, once its
        running rows are done, waits until this block ends."""
        with self._swap:
            self._swaps_waiting += 1
        try:
            with self._weights_lock:
                yield
        finally:
            with self._swap:
                self._swaps_waiting -= 1
                self._swap.notify_all()

    # -- the worker thread ------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch, stop = self._collect([first], self.max_batch, wait=True)
            with self._swap:
                while self._swaps_waiting:
                    self._swap.wait()
            # no autograd anywhere in here: a graph would chain every step through the KV
            # tensors written in place, and cached entries would keep it all alive
            with self._weights_lock, torch.inference_mode():
                if isinstance(self._engine, GenerateEngine):
                    self._whole(self._engine, batch)
                else:
                    stop = self._episode(self._engine, batch) or stop
            if stop:
                return

    def _collect(
        self, batch: list[Pending], room: int, *, wait: bool
    ) -> tuple[list[Pending], bool]:
        """More requests for ``batch``, up to ``room`` in all: those arriving within the
        batch window (``wait``) or those already queued. Returns them and whether the
        backend is closing."""
        deadline = time.monotonic() + (self.batch_window_s if wait else 0.0)
        while len(batch) < room:
            timeout = deadline - time.monotonic()
            try:
                item = self._queue.get(timeout=timeout) if timeout > 0 else self._queue.get_nowait()
            except queue.Empty:
                break
            if item is None:
                return batch, True
            batch.append(item)
        return batch, False

    def _whole(self, engine: GenerateEngine, batch: list[Pending]) -> None:
        """One batch run whole, its requests answered together."""
        batch = [p for p in batch if not p.future.cancelled()]
        if not batch:
            return
        started = time.perf_counter()
        self._stats.batches_run += 1
        engine.run(batch)
        self._stats.busy_s += time.perf_counter() - started

    def _episode(self, engine: RowEngine, admit: list[Pending]) -> bool:
        """Run rows until none is left, taking in new requests as they come (unless a
        weight swap waits). Returns whether the backend is closing.

        Requests that arrive while rows decode are held (``hold_s``, or until nothing
        else runs or the batch has no room left), then admitted together. One the engine
        has no room for (the pool engine's KV arena) is first in line, offered again as
        soon as a row leaves: only a row that leaves gives room back, so an offer before
        is refused again, and one after waits for nothing."""
        stats = self._stats
        closing = False
        held: list[Pending] = []
        held_since = 0.0
        blocked: int | None = None  # rows running when the engine had no room for held
        step_s = 0.0  # a recent decode step's duration
        prefill_s = 0.0  # the last prefill's that ran rows (one of none costs nothing)
        while True:
            started = time.perf_counter()
            try:
                if admit:
                    stats.batches_run += 1
                    waiting = engine.admit(admit)
                    admit = []
                    held = waiting + held  # no room yet: first in line at the next admission
                    prefill, before = time.perf_counter(), len(engine.rows)
                    engine.prefill()
                    if len(engine.rows) > before:  # a prefill of no row ran no forward
                        prefill_s = time.perf_counter() - prefill
                    blocked = len(engine.rows) if waiting else None
                engine.retire()
                if engine.rows:
                    step = time.perf_counter()
                    engine.decode()
                    step_s = time.perf_counter() - step
                    engine.retire()
            except Exception as exc:  # a failed forward fails the rows in it, never the worker
                engine.fail(exc)
            stats.busy_s += time.perf_counter() - started
            stats.running_rows = sum(not r.done for r in engine.rows)
            if not closing and not self._swaps_waiting:
                room = self.max_batch - len(engine.rows) - len(held)
                more, closing = self._collect([], room, wait=False)
                if more and not held:
                    held_since = time.monotonic()
                held += more
                if more and engine.rows:  # the device runs a step: make their rows now
                    engine.prepare(more)
            if not engine.rows and not held:
                engine.drain()
                return closing
            if not held:
                continue
            if blocked is not None:  # the engine had no room: a row that left gave some
                ready = len(engine.rows) < blocked
            else:  # the batch has no room for more arrivals: holding gains nothing
                full = len(engine.rows) + len(held) >= self.max_batch
                hold = hold_s(window_s=self.batch_window_s, step_s=step_s, prefill_s=prefill_s,
                              max_steps=self.hold_steps)  # fmt: skip
                ready = full or time.monotonic() - held_since >= hold
            if not engine.rows or ready:
                admit, held = held, []
