"""Aggregates of results rows: ``summarize`` and the unbiased ``pass_at_k`` estimate.

The file format is documented in ``_format.py`` (module docstring).
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from vf_mm.types import RolloutError


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k estimate: ``1 - C(n - c, k) / C(n, k)`` (Chen et al. 2021).

    Args:
        n: Samples.
        c: Samples that succeeded.
        k: The k of pass@k; needs ``1 <= k <= n``.

    Raises:
        ValueError: Not ``0 <= c <= n`` and ``1 <= k <= n``.
    """
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def error_kind(error: Any) -> tuple[str, str]:
    """``(kind, message)`` of a row's error: ``{"type": "ImageFetchError", "message": "no such
    file", ...}`` or the one-line ``"ImageFetchError: no such file"`` give
    ``("ImageFetchError", "no such file")``; a string without a type prefix is ``"Error"``."""
    try:
        record = RolloutError.from_value(error)
    except TypeError:
        record = RolloutError.from_value(str(error))
    assert record is not None
    return record.type, record.message


def _mean_std(values: Sequence[float]) -> dict[str, Any]:
    if not values:
        return {"mean": None, "std": None, "count": 0}
    mean = math.fsum(values) / len(values)
    variance = math.fsum((v - mean) ** 2 for v in values) / len(values)
    return {"mean": mean, "std": math.sqrt(variance), "count": len(values)}


def summarize(
    rows: Iterable[Mapping[str, Any]],
    *,
    k_values: Iterable[int] | None = None,
    threshold: float = 1.0,
) -> dict[str, Any]:
    """Aggregates of results rows, for metadata.json and summary tables.

    The aggregates::

        {"count": rows, "examples": distinct example ids, "errors": rows with an error,
         "truncated": rows that ran out of context (scored on what they had),
         "error_kinds": {kind: {"count": n, "first": message}},  # most frequent first
         "reward": {"mean", "std", "count"},            # over rows whose reward is not null
         "metrics": {name: {"mean", "std", "count"}},   # over rows without an error that have it
         "pass_at_k": {"1": p, ...}, "pass_threshold": threshold,
         "tokens": {"prompt": total, "completion": total, "rows_without_tokens": n},
         "mean_turns": float | null}

    ``std`` is the population standard deviation (0.0 for one value). pass@k is the
    unbiased estimator per example, averaged over the examples with at least k scored
    rollouts (null when none has). A row with neither a reward nor an error (a recorded
    session nobody scored) is no outcome at all: counting it as a failure would report
    pass@k 0.0 for a run that was never scored.

    Args:
        rows: Any iterable (``iter_results`` streams a run's file): it is read once and
            no row is kept.
        k_values: The k of pass@k; defaults to 1, 2, 4, ... up to the fewest rollouts any
            example has.
        threshold: Success is reward >= ``threshold``; a null reward, as an errored
            rollout has, is a failure.

    Raises:
        ValueError: A k that is not an int >= 1.
    """
    # one pass, holding per row only 8 bytes per number (the exact two-pass mean and std
    # need them) and per example two counts: rows may be a stream of any length
    count = 0
    rewards = array("d")
    metrics: dict[str, array[float]] = {}
    outcomes: dict[Any, list[int]] = {}  # example id -> [scored rollouts, successes]
    examples: set[Any] = set()  # examples seen with unscored rows only (so far)
    turns = array("d")
    prompt_tokens = completion_tokens = without_tokens = errors = truncated = 0
    error_kinds: dict[str, dict[str, Any]] = {}
    for row in rows:
        count += 1
        truncated += row.get("truncated") is True
        reward = row.get("reward")
        if reward is not None:
            rewards.append(float(reward))
        if row.get("error") is not None:
            errors += 1
            kind, message = error_kind(row["error"])
            entry = error_kinds.setdefault(kind, {"count": 0, "first": message})
            entry["count"] += 1
        # a failed rollout's metrics (kept in its row) are not averaged, like its reward
        for name, value in (row.get("metrics") or {}).items() if row.get("error") is None else ():
            if value is not None:
                metrics.setdefault(name, array("d")).append(float(value))
        if reward is not None or row.get("error") is not None:  # unscored: no outcome
            outcome = outcomes.setdefault(row.get("example_id"), [0, 0])
            outcome[0] += 1
            outcome[1] += reward is not None and float(reward) >= threshold
        else:
            examples.add(row.get("example_id"))
        if row.get("num_turns") is not None:
            turns.append(float(row["num_turns"]))
        if row.get("prompt_tokens") is None or row.get("completion_tokens") is None:
            without_tokens += 1
        else:
            prompt_tokens += int(row["prompt_tokens"])
            completion_tokens += int(row["completion_tokens"])

    fewest = min((n for n, _ in outcomes.values()), default=1)
    if k_values is None:
        ks = [1]
        while ks[-1] * 2 <= fewest:
            ks.append(ks[-1] * 2)
    else:
        ks = sorted(set(k_values))
        for k in ks:
            if not isinstance(k, int) or isinstance(k, bool) or k < 1:
                raise ValueError(f"k_values must be ints >= 1, got {k!r}")
    pass_k: dict[str, float | None] = {}
    for k in ks:
        estimates = [pass_at_k(n, c, k) for n, c in outcomes.values() if n >= k]
        pass_k[str(k)] = math.fsum(estimates) / len(estimates) if estimates else None

    return {
        "count": count,
        "examples": len(examples | set(outcomes)),
        "errors": errors,
        "truncated": truncated,
        "error_kinds": dict(sorted(error_kinds.items(), key=lambda kv: -kv[1]["count"])),
        "reward": _mean_std(rewards),
        "metrics": {name: _mean_std(values) for name, values in sorted(metrics.items())},
        "pass_at_k": pass_k,
        "pass_threshold": threshold,
        "tokens": {
            "prompt": prompt_tokens,
            "completion": completion_tokens,
            "rows_without_tokens": without_tokens,
        },
        "mean_turns": math.fsum(turns) / len(turns) if turns else None,
    }
