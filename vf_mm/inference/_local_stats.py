"""What the local backend has done: one record of its counters.

Every part of ``LocalBackend`` (the scheduler, the engines, the row builder, the vision
cache) counts into one ``LocalStats``, so a count has one home however many parts
touch it; the backend shows each field as a read-only attribute of the same name
(what ``vf-mm serve``'s ``/metrics`` and the benches read).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class LocalStats:
    """The local backend's counters (the worker thread writes them; read them, don't
    write them). ``prefix_cache_queries`` / ``prefix_cache_hits`` have vLLM's meaning:
    prompt tokens looked up in the prefix cache, and of those, tokens found cached."""

    weights_version: int = 0  # weight swaps (load_weights)
    batches_run: int = 0  # admissions: groups of requests started together
    busy_s: float = 0.0  # wall time the worker spent generating (model time)
    running_rows: int = 0  # requests being generated right now (a gauge)
    prefills_run: int = 0  # prefill forwards (a group of rows' new tokens each)
    steps_run: int = 0  # decode forwards (one token for every running row each)
    prefix_cache_queries: int = 0  # prompt tokens looked up in the prefix cache
    prefix_cache_hits: int = 0  # of those, tokens found cached (not computed again)
    vision_cache_queries: int = 0  # images whose tower output was looked up
    vision_cache_hits: int = 0  # of those, found (the tower did not run)
    requests_answered: int = 0  # requests answered (or failed) by the engine
    request_s: float = 0.0  # their time from the engine's queue to their answer, summed
