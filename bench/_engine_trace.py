"""A timeline of the embedded engine's worker: when requests reach its queue, and when
each admission, prefill, decode step and retirement ran (with how many rows), so a run's
time can be split into the engine computing, the engine idle with nothing to run, and
requests waiting in the queue while it computed.

``install()`` wraps the scheduler's and the row engines' methods in place (their
behaviour is unchanged: each wrapper records ``time.perf_counter()`` around the call) and
returns the ``Trace`` they write into. ``serve_main(path, argv)`` runs ``vf-mm serve``
with a trace installed and writes it to ``path`` as JSON when the server exits, for a
server that runs in its own process (``perf_counter`` is CLOCK_MONOTONIC on Linux, so
the times compare across processes). ``summary(events)`` reads a trace.

    python bench/_engine_trace.py TRACE.json     # print a trace's summary
"""

from __future__ import annotations

import atexit
import functools
import json
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from vf_mm.cli import main
from vf_mm.inference import LocalBackend

#: the event each wrapped call writes when it returns
DONE = {"admit": "admitted", "prefill": "prefilled", "decode": "decoded", "retire": "retired"}


class Trace:
    """Events ``(time, kind, count)``, appended from any thread. ``count``: the rows the
    call took or left (per kind, see ``install``)."""

    def __init__(self) -> None:
        self.events: list[tuple[float, str, int]] = []
        self.on = True
        self._lock = threading.Lock()

    def add(self, kind: str, count: int, at: float | None = None) -> None:
        if self.on:
            with self._lock:
                self.events.append((time.perf_counter() if at is None else at, kind, count))

    def clear(self) -> None:
        with self._lock:
            self.events = []


def install() -> Trace:
    """Trace every ``LocalBackend`` built from now on: its scheduler's ``submit`` and its
    row engine's ``admit`` / ``prefill`` / ``decode`` / ``retire`` (each instance's, so
    nothing but the backends' own parts is touched). Kinds: ``submit`` (1), ``admit`` /
    ``admitted`` (requests offered, at the call's start and end), ``prefill`` /
    ``prefilled`` and ``decode`` / ``decoded`` (rows running, at start and end),
    ``retired`` (rows left running). The generate engine (no rows) is not traced."""
    trace = Trace()
    build = LocalBackend.__init__

    @functools.wraps(build)
    def traced_build(self: LocalBackend, *args: Any, **kwargs: Any) -> None:
        build(self, *args, **kwargs)
        scheduler = self._scheduler
        submit = scheduler.submit

        def traced_submit(pending: Any) -> None:
            trace.add("submit", 1)
            submit(pending)

        scheduler.submit = traced_submit  # type: ignore[method-assign]
        engine = scheduler._engine
        if hasattr(engine, "rows"):
            around(engine, "admit", len)
            around(engine, "prefill", lambda: len(engine._new))
            around(engine, "decode", lambda: len(engine.rows))
            around(engine, "retire", lambda: len(engine.rows))

    def around(engine: Any, name: str, count: Any) -> None:
        inner = getattr(engine, name)

        def traced(*args: Any) -> Any:
            start = time.perf_counter()
            before = count(*args)
            out = inner(*args)
            trace.add(name, before, at=start)
            trace.add(DONE[name], len(engine.rows))
            return out

        setattr(engine, name, traced)

    LocalBackend.__init__ = traced_build  # type: ignore[method-assign]
    return trace


def serve_main(path: Path, argv: list[str]) -> None:
    """``vf-mm serve ARGV`` with a trace written to ``path`` when it exits."""
    trace = install()
    atexit.register(lambda: path.write_text(json.dumps(trace.events)))
    # uvicorn re-raises the SIGTERM that stopped it once it has shut down: exit through
    # SystemExit then, so that atexit writes the trace
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    sys.argv = ["vf-mm", "serve", *argv]
    main()


def summary(events: list[tuple[float, str, int]], start: float, end: float) -> dict[str, float]:
    """Where the engine's time went between ``start`` and ``end``.

    ``decode_s`` / ``prefill_s`` / ``admit_s``: inside those calls; ``empty_s``: no row
    running and none admitted (the engine waits for requests); ``other_s``: the rest of
    the loop (retire, collecting, the GIL). ``queue_ms``: a request's mean time from the
    queue to the start of the admission that took it (requests taken in order);
    ``admissions`` and ``rows_per_admission``; ``steps`` and ``rows_per_step``."""
    inside = [e for e in events if start <= e[0] <= end]
    spent = {"decode": 0.0, "prefill": 0.0, "admit": 0.0}
    opened: dict[str, float] = {}
    running = 0
    empty = 0.0
    empty_since: float | None = start
    submits: list[float] = []
    waits: list[float] = []
    steps = step_rows = admissions = admitted = 0
    for t, kind, n in inside:
        if kind == "submit":
            submits.append(t)
        elif kind in spent:
            opened[kind] = t
            if kind == "admit":
                if empty_since is not None:
                    empty += t - empty_since
                    empty_since = None
                admissions += 1
                admitted += n
                waits += [t - s for s in submits[:n]]
                del submits[:n]
            if kind == "decode":
                steps += 1
                step_rows += n
        elif kind in ("admitted", "prefilled", "decoded"):
            base = next(k for k, v in DONE.items() if v == kind)
            if base in opened:
                spent[base] += t - opened.pop(base)
        elif kind == "retired":
            running = n
            if running == 0 and empty_since is None:
                empty_since = t
    if empty_since is not None:
        empty += end - empty_since
    wall = end - start
    busy = sum(spent.values()) + empty
    return {
        "wall_s": wall,
        "decode_s": spent["decode"],
        "prefill_s": spent["prefill"],
        "admit_s": spent["admit"],
        "empty_s": empty,
        "other_s": wall - busy,
        "queue_ms": 1e3 * sum(waits) / max(len(waits), 1),
        "admissions": admissions,
        "rows_per_admission": admitted / max(admissions, 1),
        "steps": steps,
        "rows_per_step": step_rows / max(steps, 1),
    }


def show(name: str, s: dict[str, float]) -> str:
    wall = s["wall_s"]
    parts = ", ".join(
        f"{k[:-2]} {s[k]:.2f} s ({s[k] / wall:.0%})"
        for k in ("decode_s", "prefill_s", "admit_s", "empty_s", "other_s")
    )
    return (
        f"{name}: {wall:.2f} s: {parts}; a request queues {s['queue_ms']:.0f} ms; "
        f"{s['admissions']:.0f} admissions of {s['rows_per_admission']:.1f} rows; "
        f"{s['steps']:.0f} steps of {s['rows_per_step']:.1f} rows"
    )


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "serve":
        serve_main(Path(sys.argv[2]), sys.argv[3:])
    else:
        events = [tuple(e) for e in json.loads(Path(sys.argv[1]).read_text())]
        print(show(sys.argv[1], summary(events, events[0][0], events[-1][0])))  # type: ignore[arg-type]
