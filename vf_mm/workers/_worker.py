"""``GroupRunner``: the inside of a worker, whatever carries it (a process, a Ray actor).

It loads the environment and builds the client once, then runs one example's group at
a time through ``Environment.evaluate`` (so rollouts, seeds and scoring are exactly what
an in-process run does), several groups at once on its own event loop. The transports
(``_process.py``, ``_ray.py``) only move tasks in and results out.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from vf_mm.adapters import load_environment  # as vf_mm.load_environment: verifiers' too
from vf_mm.results import AssetStore
from vf_mm.training import ImageProcessing
from vf_mm.workers._task import GroupResult, GroupTask, WorkerSpec


class GroupRunner:
    """A worker's environment and client; ``run`` one group, ``close`` at the end."""

    def __init__(self, spec: WorkerSpec) -> None:
        self.env = load_environment(
            spec.env_id, search_paths=list(spec.env_dirs), **dict(spec.env_args)
        )
        self.client = spec.make_client()
        self._store: AssetStore | None = None

    @property
    def info(self) -> dict[str, Any]:
        """What the parent learns once the worker is up: the rules its renderer reads
        media under (the parent stores and packs the rollouts under the same ones), and
        the description of its image processing (a group sent with its images encoded
        records the processing that made its tensors: this renderer's, not one the
        parent would load itself)."""
        rules = getattr(self.client, "media_rules", (None, None))
        vision = getattr(self.client, "vision", None)
        processing = None if vision is None else ImageProcessing.from_vision(vision).description
        return {"media_rules": rules, "image_processing": processing}

    async def run(self, task: GroupTask) -> GroupResult:
        outputs: list[tuple[int, Any]] = []
        skip = {
            (task.example_id, i) for i in range(task.rollouts_per_example) if i not in task.indices
        }
        await self.env.evaluate(
            self.client,
            rows=[task.row],
            example_ids=[task.example_id],
            rollouts_per_example=task.rollouts_per_example,
            concurrency=max(1, len(task.indices)),
            sampling_args=task.sampling_args,
            seed=task.seed,
            skip=skip,
            on_result=lambda output, index: outputs.append((index, output)),
        )
        if task.assets_dir is not None:
            store = self._assets(task.assets_dir)
            outputs = [(index, _stored_media(output, store)) for index, output in outputs]
            store.sync()  # the files are durable before the parent writes rows naming them
        return GroupResult(task.task_id, outputs, copy.deepcopy(self.client.stats))

    def _assets(self, outdir: str) -> AssetStore:
        """The worker's store for ``outdir``, reading media under its renderer's rules
        (those the parent's writer reads them under: ``media_rules``)."""
        if self._store is None or str(self._store.root) != outdir:
            policy, video_limits = getattr(self.client, "media_rules", (None, None))
            self._store = AssetStore(outdir, policy=policy, video_limits=video_limits)
        return self._store

    async def close(self) -> None:
        backend = getattr(self.client, "backend", None)
        if backend is not None:
            await backend.aclose()


def _stored_media(output: Any, store: AssetStore) -> Any:
    """``output`` with its prompt's and completion's images and videos stored in
    ``store`` and named by their asset URLs (what the parent's writer would write, and
    keeps as it is: an asset of its store). Content the store refuses leaves the output
    as it was, for the parent's writer to record as it always does."""
    try:
        prompt = store.to_jsonable(output.prompt or [])
        completion = store.to_jsonable(output.completion or [])
    except Exception:  # the parent's writer decides (it records what it cannot store)
        return output
    return dataclasses.replace(output, prompt=prompt, completion=completion)
