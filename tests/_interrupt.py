"""Ctrl-C for CLI tests: a real SIGINT to a ``vf-mm`` process, sent on an event.

``gated_environment(folder)`` writes an environment whose first row is scored at once
and whose later rows are scored only once a gate file exists: run with ``-c 1``, the
process saves (or sends) the first row's group, then starts the second and touches
``<gate>.reached``, and waits. ``interrupt_at(args, event)`` starts ``vf-mm ARGS``, waits
for ``event`` (a file that appears) and sends SIGINT: the test waits on what the run
did, never on a clock, and knows exactly what was saved.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

_GATED = """
import asyncio
import os

import vf_mm as vf


def load_environment(gate: str, n: int = 3):
    async def gated(info) -> float:
        if info["wait"]:  # rows after the first are scored once the gate opens
            open(gate + ".reached", "w").close()
            while not os.path.exists(gate):
                await asyncio.sleep(0.02)
        return 1.0

    rows = [{"question": f"q{i}", "answer": "a", "info": {"wait": i > 0}} for i in range(n)]
    return vf.SingleTurnEnv(dataset=rows, rubric=vf.Rubric([gated]))
"""

#: a bound on the wait for the event (the model loads first), not a timing claim
_DEADLINE_S = 300.0


def gated_environment(folder: Path) -> tuple[Path, Path]:
    """The environment module's path, and its gate (a file that does not exist yet)."""
    module = folder / "gated.py"
    module.write_text(_GATED)
    return module, folder / "gate"


def interrupt_at(args: list[str], event: Path) -> subprocess.CompletedProcess[str]:
    """``vf-mm ARGS`` in a new process, SIGINT once ``event`` exists; what it printed.
    SIGINT starts at its default in the child, which a shell's background job (and so a
    test run started from one) would otherwise leave ignored."""
    code = "import sys; from vf_mm.cli import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + _DEADLINE_S
    while not event.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            out, err = proc.communicate()
            pytest.fail(f"the run ended or stalled before {event.name}: {err[-3000:]}{out[-1000:]}")
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=_DEADLINE_S)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
