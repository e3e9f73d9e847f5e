"""Suite-wide setup: caches stay inside pytest's temporary directory."""

from __future__ import annotations

import os
import signal
import sys

import pytest

# One torch thread per process: the default tier runs two pytest workers on two cores
# (dev.py), so a second intra-op thread has no core of its own and only spins against the
# other worker. Measured on 2 cores: the GRPO example's one step took 24.8 CPU-s with
# torch's default threads and 11.3 with one. Set here, before this process or any child it
# starts (CLI runs, servers, workers: they inherit the environment) imports torch; an
# OMP_NUM_THREADS already set is kept.
os.environ.setdefault("OMP_NUM_THREADS", "1")
if "torch" in sys.modules:  # imported before this file (a plugin): set it directly too
    sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


def _interrupt(signum: int, frame: object) -> None:
    """Ctrl-C as Python's default handler answers it."""
    raise KeyboardInterrupt


# Ctrl-C still raises KeyboardInterrupt, through a handler of the suite's own instead of
# signal.default_int_handler: over the default one, CPython 3.11's asyncio.run installs a
# handler and, leaving, checks it with signal.getsignal, which formats that handler (the
# run's main task, result and all) into a ValueError it drops. A test's result carries
# images and tensors: ~7 CPU-s of repr in four test files alone. (A child process starts
# with the default handler again: exec resets a handled signal.)
if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
    signal.signal(signal.SIGINT, _interrupt)


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory):
    """vf_mm's cache (the converted real Qwen vocabulary, the tiny checkpoints of
    ``cached_tiny_vlm``) goes to this run's temp dir, not ~. Under pytest-xdist the workers'
    temp dirs (``popen-gwN``) share one parent, this run's own: the cache goes there, so
    what one worker built (the vocabulary takes ~5 CPU-s) the other reuses; ``build_once``
    locks a first build, so a worker that needs it meanwhile waits instead of building too."""
    saved = os.environ.get("VF_MM_CACHE")
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent
    (root / "vf_mm_cache").mkdir(exist_ok=True)
    os.environ["VF_MM_CACHE"] = str(root / "vf_mm_cache")
    yield
    if saved is None:
        os.environ.pop("VF_MM_CACHE", None)
    else:
        os.environ["VF_MM_CACHE"] = saved
