"""How a worker process is started: forked from a preloaded server, or spawned.

A worker needs torch, transformers and vf_mm. ``spawn`` starts a fresh interpreter that
imports them again for every worker (several seconds each, more on a busy machine).
``forkserver`` (the default) imports them once, in a server process started with the
first pool of this process, and forks each worker from it, so the next workers start in
a fraction of a second. The server is itself a fresh interpreter: a worker inherits none
of this process's threads, locks or CUDA state, as with ``spawn``.

What a forked worker sees is what a spawned one would:

- **The environment** (``os.environ``): this process's at the worker's start. The worker
  receives it and installs it before anything of its own runs (``_process.py``).
- **The working directory and ``sys.path``**: this process's at the worker's start
  (multiprocessing's preparation data, as with ``spawn``).
- **What the preloaded modules read when imported** (``HF_HOME``, ``OMP_NUM_THREADS``,
  ...) was read in the server, with the environment it started with. So a pool started
  after this process's environment, ``sys.path`` or working directory changed spawns
  its workers (``uses_server``), and they read it afresh.
- **CUDA** is not initialised by importing the preloaded modules (a test checks it): a
  forked worker may use a GPU as a spawned one does.
- **stdout and stderr** are the server's: the ones this process had when its first pool
  started (a process that redirects its own descriptors later should use ``spawn``).

``start_method="spawn"`` always spawns; where the platform has no forkserver (Windows),
every worker is spawned. multiprocessing's forkserver is one per process: if something
else started it before the first pool, the pool forks from that server as it is (without
vf_mm's preload), and still spawns whenever the environment it knows of has changed.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.context
import multiprocessing.forkserver
import os
import sys
import threading
from typing import Any

#: the ways to start a worker process, the first the default
START_METHODS = ("forkserver", "spawn")

#: imported once in the forkserver: what every worker imports before it can build its
#: environment and client (transformers' processing modules are most of a renderer's
#: load; none of these initialises CUDA when imported)
PRELOAD = (
    "torch",
    "transformers",
    "transformers.processing_utils",
    "transformers.image_processing_utils",
    "vf_mm",
    "vf_mm.workers._worker",
    "vf_mm.workers._process",
)

#: variables that name the moment rather than configure anything (pytest sets one per
#: test phase): a change in them alone does not make a pool spawn
_VOLATILE = frozenset({"PYTEST_CURRENT_TEST"})

_lock = threading.Lock()
_server_state: tuple[Any, ...] | None = None  # what the server started with, once started


def check_start_method(start_method: str) -> None:
    """``ValueError`` naming the choices if ``start_method`` is not one of them."""
    if start_method not in START_METHODS:
        raise ValueError(f"start_method must be one of {START_METHODS}, not {start_method!r}")


def worker_context(start_method: str) -> multiprocessing.context.BaseContext:
    """The multiprocessing context a worker is started with now: the preloaded forkserver
    where ``start_method`` asks for it and ``uses_server`` allows it, else ``spawn``."""
    check_start_method(start_method)
    if start_method == "forkserver" and uses_server():
        return multiprocessing.get_context("forkserver")
    return multiprocessing.get_context("spawn")


def uses_server() -> bool:
    """Whether a worker started now may be forked from the forkserver: the platform has
    one, and this process's environment, ``sys.path`` and working directory are those the
    server started with (it is started here, preloaded, the first time)."""
    global _server_state
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return False
    state = _state()
    with _lock:
        if _server_state is None:
            if not _server_running():
                multiprocessing.forkserver.set_forkserver_preload(list(PRELOAD))
            multiprocessing.forkserver.ensure_running()
            _server_state = state
        return state == _server_state


def _state() -> tuple[Any, ...]:
    env = tuple(sorted((k, v) for k, v in os.environ.items() if k not in _VOLATILE))
    return env, tuple(sys.path), os.getcwd()


def _server_running() -> bool:
    """Whether something else started this process's forkserver already (multiprocessing
    has no public way to ask: its pid, None until started)."""
    server = getattr(multiprocessing.forkserver, "_forkserver", None)
    return getattr(server, "_forkserver_pid", None) is not None
