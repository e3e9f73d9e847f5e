"""The local backend's admission loop (``Scheduler``) over an engine of rows whose
forwards only sleep: when requests that arrive while rows decode are admitted."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import pytest

from vf_mm.inference._local_stats import LocalStats
from vf_mm.inference._rows import Pending, answer
from vf_mm.inference._scheduler import HOLD_STEPS, Scheduler, hold_s
from vf_mm.inference._types import GenerateRequest, SamplingParams


@dataclass
class Row:
    pending: Pending
    left: int  # decode steps to go

    @property
    def done(self) -> bool:
        return self.left <= 0


class SleepyEngine:
    """A ``RowEngine`` whose prefill takes ``prefill_s`` whatever its rows (a GPU
    prefill's cost is mostly its launches) and whose decode step takes ``step_s``. It
    records each admission as (the requests' names, decode steps run before it)."""

    def __init__(self, *, prefill_s: float, step_s: float) -> None:
        self.prefill_s, self.step_s = prefill_s, step_s
        self.rows: list[Row] = []
        self._new: list[Row] = []
        self.steps = 0
        self.admissions: list[tuple[list[str], int]] = []

    def admit(self, pendings: list[Pending]) -> list[Pending]:
        self.admissions.append(([p.request.request_id for p in pendings], self.steps))
        self._new = [Row(p, p.request.sampling.max_tokens) for p in pendings]
        return []

    def prefill(self) -> None:
        time.sleep(self.prefill_s)
        self.rows += self._new
        self._new = []

    def decode(self) -> None:
        time.sleep(self.step_s)
        self.steps += 1
        for row in self.rows:
            row.left -= 1

    def retire(self) -> None:
        for row in self.rows:
            if row.done:
                answer(row.pending, row.pending.request.request_id)
        self.rows = [r for r in self.rows if not r.done]

    def fail(self, exc: Exception) -> None:
        raise AssertionError(f"no forward fails here: {exc}")

    def drain(self) -> None:
        pass


async def run(engine: SleepyEngine, arrivals: list[tuple[str, float, int]], **options) -> None:
    """Submit each ``(name, after_s, steps)`` that long after the first, then await all."""
    scheduler = Scheduler(engine, stats=LocalStats(), batch_window_s=0.0, **options)
    loop = asyncio.get_running_loop()
    futures = []
    start = time.monotonic()
    for name, after_s, steps in arrivals:
        await asyncio.sleep(max(0.0, start + after_s - time.monotonic()))
        request = GenerateRequest(
            prompt_ids=[1], sampling=SamplingParams(max_tokens=steps), request_id=name
        )
        future = loop.create_future()
        scheduler.submit(Pending(request, future, loop))
        futures.append(future)
    await asyncio.wait_for(asyncio.gather(*futures), 30)
    assert scheduler.stop(5)


def test_requests_arriving_while_rows_decode_share_one_prefill_within_its_cost():
    """A prefill costs 0.3 s whatever its rows; B and C arrive 60 ms apart while A
    decodes: C comes within B's hold (the last prefill's duration), so one prefill takes
    both. (Held only two steps, B would be prefilled alone and C after it.)"""
    engine = SleepyEngine(prefill_s=0.3, step_s=0.01)
    arrivals = [("a", 0.0, 60), ("b", 0.35, 10), ("c", 0.41, 10)]
    asyncio.run(run(engine, arrivals, max_batch=8))
    assert [names for names, _ in engine.admissions] == [["a"], ["b", "c"]]


def test_a_batch_with_no_room_left_admits_its_arrivals_at_once():
    """B and C fill the batch (max 3 with A): waiting longer cannot add anyone, so they
    are prefilled at the next step instead of after the hold (a 0.3 s prefill would hold
    them 8 steps)."""
    engine = SleepyEngine(prefill_s=0.3, step_s=0.02)
    arrivals = [("a", 0.0, 40), ("b", 0.4, 5), ("c", 0.4, 5)]
    asyncio.run(run(engine, arrivals, max_batch=3))
    (first, _), (second, steps_before) = engine.admissions
    assert first == ["a"] and sorted(second) == ["b", "c"]
    arrived = engine.admissions  # steps A ran before B and C arrived: about 5
    assert steps_before <= 10, arrived


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
