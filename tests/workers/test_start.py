"""How a worker process starts (``_start.py``): forked from the preloaded forkserver by
default, with its parent's environment at its start; spawned where the parent's
environment, ``sys.path`` or working directory changed since the server started, or
when asked; and the preload itself never initialises CUDA."""

from __future__ import annotations

import asyncio
import functools
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.workers import _clients
from vf_mm.workers import ProcessWorker, WorkerPool, WorkerSpec, _start

ENV = str(Path(__file__).with_name("_env.py"))
MARK = "VF_MM_TEST_START_MARK"


def started(tmp_path: Path, **options) -> tuple[str, int]:
    """Start and stop one worker; the value of ``MARK`` it saw and its parent's pid."""
    out = tmp_path / "seen"
    spec = WorkerSpec(ENV, functools.partial(_clients.where_started, str(out), MARK))

    async def main() -> None:
        worker = ProcessWorker(spec, threads=1, **options)
        await worker.start()
        await worker.close()

    asyncio.run(main())
    value, parent = out.read_text().split()
    return value, int(parent)


def test_a_forked_worker_has_its_parents_environment_of_the_moment(tmp_path, monkeypatch):
    assert _start.uses_server()  # the server runs, with the environment of its start
    # a variable the server never had, and whose change alone keeps the server in use:
    # the worker still sees it, because it installs its parent's environment first
    monkeypatch.setattr(_start, "_VOLATILE", _start._VOLATILE | {MARK})
    monkeypatch.setenv(MARK, "set-after-the-server-started")
    value, parent = started(tmp_path)
    assert parent != os.getpid()  # forked by the server, not spawned by this process
    assert value == "set-after-the-server-started"


def test_a_changed_environment_path_or_directory_spawns_afresh(tmp_path, monkeypatch):
    """What the preloaded modules read when imported was read with the server's
    environment: after a change, workers are spawned and read it afresh."""
    assert _start.uses_server()
    with monkeypatch.context() as patch:
        patch.setenv(MARK, "1")
        assert _start.worker_context("forkserver").get_start_method() == "spawn"
        assert started(tmp_path) == ("1", os.getpid())  # spawned by this process
    assert _start.uses_server()
    with monkeypatch.context() as patch:
        patch.syspath_prepend(str(tmp_path))
        assert not _start.uses_server()
    with monkeypatch.context() as patch:
        patch.chdir(tmp_path)
        assert not _start.uses_server()
    assert _start.uses_server()


def test_spawn_is_there_when_asked_for():
    assert _start.uses_server()
    assert _start.worker_context("spawn").get_start_method() == "spawn"
    assert _start.worker_context("forkserver").get_start_method() == "forkserver"


def test_an_unknown_start_method_is_refused_naming_the_choices():
    spec = WorkerSpec(ENV, functools.partial(_clients.where_started, "-", MARK))
    with pytest.raises(ValueError, match=r"start_method must be one of \('forkserver', 'spawn'\)"):
        WorkerPool(spec, 1, start_method="fork")
    with pytest.raises(ValueError, match="start_method must be one of"):
        ProcessWorker(spec, start_method="fork")


CUDA_CHECK = """
import sys
import torch

calls = []
torch.cuda._lazy_init = lambda *a, **k: calls.append("torch.cuda._lazy_init")
torch.cuda.init = lambda *a, **k: calls.append("torch.cuda.init")
for name in sys.argv[1:]:
    __import__(name)
print(calls, torch.cuda.is_initialized())
"""


def test_the_forkservers_preload_does_not_initialise_cuda():
    """A process forked after CUDA was initialised cannot use CUDA: the server's imports
    must leave it alone, so that a worker may use a GPU as a spawned one does."""
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run([sys.executable, "-c", CUDA_CHECK, *_start.PRELOAD], cwd=root,
                            capture_output=True, text=True, check=True)  # fmt: skip
    assert result.stdout.split() == ["[]", "False"], result.stdout + result.stderr
