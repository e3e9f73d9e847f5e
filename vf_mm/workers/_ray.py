"""``RayWorker``: one worker as a Ray actor, anywhere on a Ray cluster.

Ray places the actor, ships it the ``WorkerSpec`` and each ``GroupTask``, and brings the
``GroupResult`` back; vf_mm adds nothing of its own to that. The actor runs the same
``GroupRunner`` as a process worker, as an async actor (its groups run concurrently on
the actor's event loop). An actor that dies (its node lost, killed, out of memory) makes
Ray raise ``RayActorError`` on every call in flight: that is ``WorkerLostError`` here,
and the pool runs those groups again elsewhere.

Ray is an optional dependency (``pip install 'vf-mm[ray]'``); the cluster's Python must
have vf_mm and the environment installed (or ship them with a Ray ``runtime_env``).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from vf_mm.errors import MissingDependencyError, WorkerLostError, WorkerStartError
from vf_mm.types import RolloutError
from vf_mm.workers._task import GroupResult, GroupTask, WorkerSpec
from vf_mm.workers._worker import GroupRunner


def require_ray() -> Any:
    """The ``ray`` module; ``MissingDependencyError`` saying how to install it."""
    try:
        import ray
    except ImportError as exc:
        raise MissingDependencyError(
            "--ray (WorkerPool(transport='ray')) needs Ray: pip install 'vf-mm[ray]'"
        ) from exc
    return ray


class RayWorker:
    """A worker as a Ray actor. ``start`` (once), ``run`` tasks (many at once), ``close``.
    ``address``: the cluster (``ray.init``'s; None: the one this process is connected
    to, else a local one)."""

    def __init__(
        self,
        spec: WorkerSpec,
        *,
        name: str = "vf-mm-worker",
        address: str | None = None,
        start_timeout_s: float = 900.0,
    ) -> None:
        self.spec = spec
        self.name = name
        self.address = address
        self.start_timeout_s = start_timeout_s
        self._actor: Any = None
        self._lost: WorkerLostError | None = None

    @property
    def lost(self) -> WorkerLostError | None:
        return self._lost

    async def start(self) -> dict[str, Any]:
        ray = require_ray()
        if not ray.is_initialized():
            ray.init(address=self.address, ignore_reinit_error=True, log_to_driver=True)
        actor_class = ray.remote(_RayRunner)
        self._actor = actor_class.options(max_concurrency=1000).remote(self.spec)
        try:
            status, value = await asyncio.wait_for(
                _await(self._actor.ready.remote()), self.start_timeout_s
            )
        except TimeoutError:
            await self.close()
            raise WorkerStartError(
                f"{self.name}: the Ray actor was not ready within {self.start_timeout_s:.0f} s"
            ) from None
        except ray.exceptions.RayError as exc:
            await self.close()
            raise WorkerStartError(f"{self.name} could not start on Ray: {exc}") from exc
        if status != "ready":
            await self.close()
            raise WorkerStartError(f"{self.name} could not start: {value}")
        return value

    async def run(self, task: GroupTask) -> GroupResult | RolloutError:
        if self._lost is not None:
            raise self._lost
        ray = require_ray()
        try:
            return await _await(self._actor.run.remote(task))
        except ray.exceptions.RayActorError as exc:
            self._lost = WorkerLostError(f"{self.name}: its Ray actor died ({exc})")
            raise self._lost from None

    def kill(self) -> None:
        """Kill the actor outright: what a lost node looks like to the pool."""
        if self._actor is not None:
            require_ray().kill(self._actor, no_restart=True)

    async def close(self) -> None:
        if self._actor is None:
            return
        ray = require_ray()
        with contextlib.suppress(ray.exceptions.RayError, TimeoutError):
            await asyncio.wait_for(_await(self._actor.close.remote()), 10)
        ray.kill(self._actor, no_restart=True)
        self._actor = None


async def _await(ref: Any) -> Any:
    return await ref


class _RayRunner:
    """The actor: a ``GroupRunner`` (a failure to build one is reported by ``ready``,
    not raised from the constructor, so its message reaches the parent whole)."""

    def __init__(self, spec: WorkerSpec) -> None:
        self.runner: GroupRunner | None = None
        self.error: str | None = None
        try:
            self.runner = GroupRunner(spec)
        except BaseException as exc:
            self.error = f"{type(exc).__name__}: {exc}"

    async def ready(self) -> tuple[str, Any]:
        if self.runner is None:
            return ("fatal", self.error)
        return ("ready", self.runner.info)

    async def run(self, task: GroupTask) -> GroupResult | RolloutError:
        assert self.runner is not None
        try:
            return await self.runner.run(task)
        except Exception as exc:  # environment code outside any rollout: fail the group
            return RolloutError.from_exception(exc, where="worker")

    async def close(self) -> None:
        if self.runner is not None:
            await self.runner.close()
