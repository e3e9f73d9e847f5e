"""``ProcessWorker``: one worker in a subprocess of this machine, over a pipe.

The child is forked from a preloaded forkserver, or spawned (``_start.py``: either way
none of this process's threads, locks or CUDA state), installs this process's
environment as it was at the start, builds a ``GroupRunner`` and answers
``("ready", info)`` or ``("fatal", message)``. Then it runs every task it is sent on its own event loop,
several at once, and answers each with ``("done", GroupResult)`` or
``("failed", task_id, RolloutError)`` (the group's rollouts then fail with that error,
e.g. a result that does not pickle). Both ends read their pipe on a thread of their own,
so neither event loop blocks on the other.

A child that dies (killed, out of memory, a crash in native code) closes its end of the
pipe: the parent's reader sees the end of file and fails every task in flight on it with
``WorkerLostError``. A parent that dies closes the other end: the child sees it and
exits, so no worker outlives its run.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
from typing import Any

from vf_mm.errors import WorkerLostError, WorkerStartError
from vf_mm.types import RolloutError
from vf_mm.workers._start import START_METHODS, check_start_method, worker_context
from vf_mm.workers._task import GroupResult, GroupTask, WorkerSpec
from vf_mm.workers._worker import GroupRunner


class ProcessWorker:
    """A worker process. ``start`` (once), ``run`` tasks (many at once), ``close``.

    Args:
        spec: How the worker builds its environment and client.
        name: The process's name.
        threads: Torch threads in the process.
        start_timeout_s: How long the process may take to build its environment and
            client before ``start`` fails.
        start_method: One of ``START_METHODS``: ``"forkserver"`` (forked from a server
            that imported torch, transformers and vf_mm once) or ``"spawn"`` (a fresh
            interpreter for each worker); see ``_start.py`` for when the first spawns
            anyway.
    """

    def __init__(
        self,
        spec: WorkerSpec,
        *,
        name: str = "vf-mm-worker",
        threads: int | None = None,
        start_timeout_s: float = 900.0,
        start_method: str = START_METHODS[0],
    ) -> None:
        check_start_method(start_method)
        self.start_method = start_method
        self.spec = spec
        self.name = name
        self.threads = threads
        self.start_timeout_s = start_timeout_s
        self._process: Any = None
        self._conn: Any = None
        self._send_lock = threading.Lock()
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lost: WorkerLostError | None = None

    @property
    def lost(self) -> WorkerLostError | None:
        """Why the worker is gone (None while it runs)."""
        return self._lost

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    async def start(self) -> dict[str, Any]:
        """Start the child and wait until it has built its environment and client;
        ``WorkerStartError`` with the child's own error if it cannot."""
        self._loop = asyncio.get_running_loop()
        context: Any = worker_context(self.start_method)  # its Process: typeshed has none
        ours, theirs = context.Pipe()
        self._process = context.Process(
            target=_child_main,
            args=(theirs, self.spec, self.threads, dict(os.environ)),
            name=self.name,
        )
        # on a thread: start() writes the pickled spec into a pipe the child reads only
        # once it runs, so a large spec (a tokenizer) would hold this loop, and every
        # other worker's start, until this child is up
        await asyncio.to_thread(self._process.start)
        theirs.close()  # the child's end lives in the child only: its death is our EOF
        self._conn = ours
        first = await asyncio.to_thread(self._first_message)
        if first[0] != "ready":
            await self.close()
            raise WorkerStartError(f"{self.name} could not start: {first[1]}")
        threading.Thread(target=self._read, name=f"{self.name}-reader", daemon=True).start()
        return first[1]

    def _first_message(self) -> tuple[str, Any]:
        try:
            if not self._conn.poll(self.start_timeout_s):
                return ("fatal", f"no answer within {self.start_timeout_s:.0f} s")
            return self._conn.recv()
        except (EOFError, OSError):
            self._process.join(5)
            return ("fatal", f"it exited with code {self._process.exitcode} while starting")

    async def run(self, task: GroupTask) -> GroupResult | RolloutError:
        """The task's result, or the error its group failed with inside the worker.

        Args:
            task: One example's rollouts.

        Raises:
            WorkerLostError: The worker dies first.
        """
        if self._lost is not None:
            raise self._lost
        assert self._loop is not None, "start() the worker first"
        future: asyncio.Future[Any] = self._loop.create_future()
        self._pending[task.task_id] = future
        try:
            await asyncio.to_thread(self._send, ("task", task))
        except (OSError, EOFError, ValueError):
            self._pending.pop(task.task_id, None)
            raise self._lost or WorkerLostError(f"{self.name}: its pipe is closed") from None
        try:
            return await future
        finally:
            self._pending.pop(task.task_id, None)

    def _send(self, message: Any) -> None:
        with self._send_lock:
            self._conn.send(message)

    def _read(self) -> None:
        """The reader thread: hand each answer to its task's future; at the end of the
        pipe, fail every task in flight."""
        loop = self._loop
        assert loop is not None
        while True:
            try:
                message = self._conn.recv()
            except (EOFError, OSError):
                break
            if message[0] == "done":
                _notify(loop, self._resolve, message[1].task_id, message[1])
            elif message[0] == "failed":
                _notify(loop, self._resolve, message[1], message[2])
        self._process.join(5)
        code = self._process.exitcode
        lost = WorkerLostError(
            f"{self.name} (pid {self._process.pid}) "
            + ("stopped" if code is None else f"exited with code {code}")
        )
        _notify(loop, self._fail_all, lost)

    def _resolve(self, task_id: int, value: Any) -> None:
        future = self._pending.get(task_id)
        if future is not None and not future.done():
            future.set_result(value)

    def _fail_all(self, lost: WorkerLostError) -> None:
        self._lost = lost
        for future in self._pending.values():
            if not future.done():
                future.set_exception(lost)

    def kill(self) -> None:
        """Kill the child outright (SIGKILL): what a crash looks like to the pool."""
        if self._process is not None and self._process.is_alive():
            self._process.kill()

    async def close(self) -> None:
        """Ask the child to stop, then make sure it has: it gets a few seconds to close
        its backend, then it is killed."""
        if self._process is None:
            return
        with contextlib.suppress(OSError, EOFError, ValueError):
            await asyncio.to_thread(self._send, ("stop",))
        await asyncio.to_thread(self._process.join, 10)
        if self._process.is_alive():
            self._process.kill()
            await asyncio.to_thread(self._process.join, 5)
        self._conn.close()


def _notify(loop: asyncio.AbstractEventLoop, callback: Any, *args: Any) -> None:
    """Run ``callback`` on ``loop`` from the reader thread; nothing when the loop has closed
    (the pool's run is over: no one waits for the answer any more)."""
    with contextlib.suppress(RuntimeError):  # "Event loop is closed"
        loop.call_soon_threadsafe(callback, *args)


# -- the child ------------------------------------------------------------------------------


def _child_main(conn: Any, spec: WorkerSpec, threads: int | None, env: dict[str, str]) -> None:
    """The worker process's entry point. It first takes the parent's environment as it was
    at the start (a forked worker has the forkserver's otherwise). Ctrl-C in a terminal
    reaches the whole process group: the child ignores it and lets the parent stop it (or
    the pipe's end does)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ.clear()
    os.environ.update(env)
    if threads is not None:
        import torch

        torch.set_num_threads(max(1, threads))
    asyncio.run(_serve(conn, spec))


async def _serve(conn: Any, spec: WorkerSpec) -> None:
    loop = asyncio.get_running_loop()
    try:
        runner = GroupRunner(spec)
    except BaseException as exc:  # the parent reports it; every worker would fail alike
        conn.send(("fatal", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", runner.info))
    inbox: asyncio.Queue[Any] = asyncio.Queue()

    def read() -> None:
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):  # the parent is gone: stop
                message = ("stop",)
            loop.call_soon_threadsafe(inbox.put_nowait, message)
            if message[0] == "stop":
                return

    threading.Thread(target=read, name="vf-mm-worker-reader", daemon=True).start()
    lock = threading.Lock()

    def send(message: Any) -> None:
        with lock:
            conn.send(message)

    async def run(task: GroupTask) -> None:
        try:
            message: Any = ("done", await runner.run(task))
        except Exception as exc:  # environment code outside any rollout: fail the group
            message = ("failed", task.task_id, RolloutError.from_exception(exc, where="worker"))
        try:
            await asyncio.to_thread(send, message)
        except (OSError, EOFError):
            return  # the parent is gone
        except Exception as exc:  # a result that does not pickle: say so, lose nothing
            error = RolloutError.from_exception(exc, where="sending the group to the parent")
            await asyncio.to_thread(send, ("failed", task.task_id, error))

    running: set[asyncio.Task[None]] = set()
    while True:
        message = await inbox.get()
        if message[0] == "stop":
            break
        job = asyncio.create_task(run(message[1]))
        running.add(job)
        job.add_done_callback(running.discard)
    for job in running:
        job.cancel()
    await runner.close()
