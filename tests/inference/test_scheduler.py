"""The local backend's admission loop (``Scheduler``) over an engine of rows whose
forwards only move a clock: when requests that arrive while rows decode are admitted.

The scheduler reads ``time`` through its module; here that is a ``Clock`` the engine
advances by a prefill's or a decode step's cost, and requests arrive at given decode
steps (submitted by the engine as the step ends). So every test is exact and instant:
nothing depends on how busy the machine is."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass

import pytest

from vf_mm.inference import _scheduler
from vf_mm.inference._local_stats import LocalStats
from vf_mm.inference._rows import Pending, answer
from vf_mm.inference._scheduler import HOLD_STEPS, Scheduler, hold_s
from vf_mm.inference._types import GenerateRequest, SamplingParams


class Clock:
    """``time.perf_counter`` and ``time.monotonic`` of the scheduler: seconds that pass
    only when the engine says so (``advance``)."""

    def __init__(self) -> None:
        self.now = 1000.0
        self._lock = threading.Lock()

    def advance(self, seconds: float) -> None:
        with self._lock:
            self.now += seconds

    def perf_counter(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(_scheduler, "time", clock)
    return clock


@dataclass
class Row:
    pending: Pending
    left: int  # decode steps to go

    @property
    def done(self) -> bool:
        return self.left <= 0


class StepEngine:
    """A ``RowEngine`` whose prefill costs ``prefill_s`` whatever its rows (a GPU
    prefill's cost is mostly its launches) and whose decode step costs ``step_s``, on
    ``clock``. ``arrivals[k]`` are submitted when decode step ``k`` ends; ``room`` is the
    most rows it holds (the pool engine's KV arena: ``admit`` hands back the rest). It
    records each admission, and each ``prepare``, as (the requests' names, decode steps
    run before it)."""

    def __init__(
        self,
        clock: Clock,
        *,
        prefill_s: float,
        step_s: float,
        arrivals: dict[int, list[Pending]],
        room: int = 1000,
    ) -> None:
        self.clock, self.prefill_s, self.step_s = clock, prefill_s, step_s
        self.arrivals, self.room = arrivals, room
        self.scheduler: Scheduler | None = None
        self.rows: list[Row] = []
        self._new: list[Row] = []
        self.steps = 0
        self.admissions: list[tuple[list[str], int]] = []
        self.prepared: list[tuple[list[str], int]] = []

    def prepare(self, pendings: list[Pending]) -> None:
        assert self.rows, "prepared while a step runs"
        self.prepared.append(([p.request.request_id for p in pendings], self.steps))

    def admit(self, pendings: list[Pending]) -> list[Pending]:
        self.admissions.append(([p.request.request_id for p in pendings], self.steps))
        live = [p for p in pendings if not p.future.cancelled()]  # as ``RowBuilder.row``
        fits = max(0, self.room - len(self.rows))
        self._new = [Row(p, p.request.sampling.max_tokens) for p in live[:fits]]
        return live[fits:]

    def prefill(self) -> None:
        if self._new:
            self.clock.advance(self.prefill_s)
        self.rows += self._new
        self._new = []

    def decode(self) -> None:
        self.clock.advance(self.step_s)
        self.steps += 1
        for row in self.rows:
            row.left -= 1
        assert self.scheduler is not None
        for pending in self.arrivals.pop(self.steps, []):
            self.scheduler.submit(pending)

    def retire(self) -> None:
        for row in self.rows:
            if row.done:
                answer(row.pending, row.pending.request.request_id)
        self.rows = [r for r in self.rows if not r.done]

    def fail(self, exc: Exception) -> None:
        raise AssertionError(f"no forward fails here: {exc}")

    def drain(self) -> None:
        pass


def run(
    clock: Clock,
    requests: list[tuple[str, int, int]],
    *,
    prefill_s: float = 0.3,
    step_s: float = 0.01,
    max_batch: int,
    room: int = 1000,
    cancelled: tuple[str, ...] = (),
    hold_steps: int = HOLD_STEPS,
    prepared: list[tuple[list[str], int]] | None = None,
) -> list[tuple[list[str], int]]:
    """Run ``(name, arriving at decode step, steps to decode)`` requests (step 0: before
    any) to their answers; the engine's admissions (its ``prepare`` calls go into
    ``prepared``). A prefill costs 30 decode steps unless told otherwise; those
    ``cancelled`` have left before they arrive."""

    async def go() -> list[tuple[list[str], int]]:
        loop = asyncio.get_running_loop()
        arrivals: dict[int, list[Pending]] = {}
        waited = []
        for name, at, steps in requests:
            request = GenerateRequest(
                prompt_ids=[1], sampling=SamplingParams(max_tokens=steps), request_id=name
            )
            pending = Pending(request, loop.create_future(), loop)
            if name in cancelled:
                pending.future.cancel()
            else:
                waited.append(pending.future)
            arrivals.setdefault(at, []).append(pending)
        engine = StepEngine(clock, prefill_s=prefill_s, step_s=step_s, arrivals=arrivals, room=room)
        first = arrivals.pop(0)
        scheduler = engine.scheduler = Scheduler(
            engine, stats=LocalStats(), batch_window_s=0.0, max_batch=max_batch,
            hold_steps=hold_steps,
        )  # fmt: skip
        for pending in first:
            scheduler.submit(pending)
        answered = await asyncio.wait_for(asyncio.gather(*waited), 30)
        assert answered == [n for n, _, _ in requests if n not in cancelled]
        assert await asyncio.to_thread(scheduler.stop, 5)
        if prepared is not None:
            prepared.extend(engine.prepared)
        return engine.admissions

    return asyncio.run(go())


def test_requests_arriving_while_rows_decode_share_one_prefill_within_its_cost(clock):
    """A prefill costs 30 decode steps whatever its rows; B and C arrive 4 steps apart
    while A decodes: C comes within B's hold (capped at ``HOLD_STEPS`` steps), so one
    prefill takes both. (Held only two steps, B would be prefilled alone.)"""
    admissions = run(
        clock,
        [("a", 0, 60), ("b", 3, 10), ("c", 7, 10)],
        max_batch=8,
    )
    assert [names for names, _ in admissions] == [["a"], ["b", "c"]]


def test_held_requests_are_prepared_as_they_arrive_while_a_step_runs(clock):
    """B and C are held while A decodes: each is prepared in the step it arrives (the
    device computes the next step meanwhile), before the admission that takes both. A,
    arriving with nothing running, is admitted at once and never prepared."""
    prepared: list[tuple[list[str], int]] = []
    admissions = run(
        clock,
        [("a", 0, 60), ("b", 3, 10), ("c", 7, 10)],
        max_batch=8,
        prepared=prepared,
    )
    assert prepared == [(["b"], 3), (["c"], 7)]
    assert admissions[1] == (["b", "c"], 11)


def test_held_two_steps_where_a_prefill_costs_by_its_tokens(clock):
    """The batch engine (a CPU) holds arrivals two decode steps whatever a prefill took:
    B is prefilled alone at step 5, C after it."""
    admissions = run(
        clock,
        [("a", 0, 60), ("b", 3, 10), ("c", 7, 10)],
        max_batch=8,
        hold_steps=2,
    )
    assert [names for names, _ in admissions] == [["a"], ["b"], ["c"]]


def test_a_cpu_backend_holds_two_decode_steps(checkpoints):
    """``LocalBackend`` picks the hold by its engine: two steps for the batch engine (CPU);
    the pool engine (GPU) holds up to ``HOLD_STEPS``."""
    from vf_mm.inference import LocalBackend

    backend = LocalBackend(checkpoints("qwen2_5_vl"))
    try:
        assert backend.engine == "batch" and backend._scheduler.hold_steps == 2
    finally:
        asyncio.run(backend.aclose())


def test_a_batch_with_no_room_left_admits_its_arrivals_at_once(clock):
    """B and C fill the batch (max 3 with A): waiting longer cannot add anyone, so they
    are prefilled at the next step instead of after the hold (``HOLD_STEPS`` steps)."""
    admissions = run(
        clock,
        [("a", 0, 40), ("b", 3, 5), ("c", 3, 5)],
        max_batch=3,
    )
    assert admissions == [(["a"], 0), (["b", "c"], 3)]


def test_an_admission_that_ran_no_prefill_keeps_the_last_prefills_cost(clock):
    """B left before it arrived: its admission makes no row and runs no forward, so it
    says nothing about what a prefill costs. C and D, 4 steps apart, still share one
    prefill (timing B's empty prefill would hold C two steps and prefill it alone)."""
    admissions = run(
        clock,
        [("a", 0, 60), ("b", 3, 10), ("c", 20, 10), ("d", 24, 10)],
        max_batch=8,
        cancelled=("b",),
    )
    assert [names for names, _ in admissions] == [["a"], ["b"], ["c", "d"]]


@pytest.mark.parametrize(
    ("prefill_s", "expected"),
    [
        (0.0, 0.02),  # at least two decode steps
        (0.05, 0.05),  # the last prefill's duration
        (1.0, HOLD_STEPS * 0.01),  # at most HOLD_STEPS steps
    ],
)
def test_a_request_is_held_as_long_as_the_last_prefill_took_within_bounds(prefill_s, expected):
    assert hold_s(window_s=0.0, step_s=0.01, prefill_s=prefill_s) == pytest.approx(expected)
    assert hold_s(window_s=0.5, step_s=0.01, prefill_s=prefill_s) == 0.5  # the batch window


def test_requests_the_engine_has_no_room_for_run_as_soon_as_a_row_leaves(clock):
    """C fills the batch, but the engine (the pool engine's KV arena) holds two rows: C
    waits for a row to leave and is offered again at that very step (B's, the 12th),
    not once each hold (the 19th) and not in between (each offer refused again)."""
    admissions = run(
        clock,
        [("a", 0, 30), ("b", 0, 12), ("c", 3, 5)],
        max_batch=3,
        room=2,
    )
    assert admissions == [(["a", "b"], 0), (["c"], 3), (["c"], 12)]
