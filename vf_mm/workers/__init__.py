"""Rollout workers: an environment's groups run in several processes (or Ray actors), and
runs split into shards across machines.

``WorkerPool(spec, W)`` starts W workers, each building its own environment and client
from a ``WorkerSpec``; ``pool.evaluate(env, rows=..., on_result=...)`` runs the groups in
them with ``Environment.evaluate``'s contract, every scored rollout handed back to this
process exactly once. ``vf_mm.results.evaluate_to_dir`` and
``vf_mm.training.stream_rollouts`` take a pool as ``workers=``; ``vf-mm eval`` /
``vf-mm rollout`` build one with ``--workers W`` (``--ray [ADDRESS]`` for Ray actors).

``Shard`` / ``parse_shard``: ``--shard i/N``, a deterministic split by example id.
"""

from vf_mm._shard import Shard, parse_shard, shard_of
from vf_mm.workers._pool import TRANSPORTS, WorkerPool
from vf_mm.workers._process import ProcessWorker
from vf_mm.workers._task import GroupResult, GroupTask, WorkerSpec

__all__ = [
    "TRANSPORTS",
    "GroupResult",
    "GroupTask",
    "ProcessWorker",
    "Shard",
    "WorkerPool",
    "WorkerSpec",
    "parse_shard",
    "shard_of",
]
