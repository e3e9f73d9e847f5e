"""Reading the run directory: ``metadata.json`` and ``results.jsonl``, damage reported as
warnings; aggregates computed from the rows for runs whose metadata has none."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vf_mm.report._format import _number

#: per-file warnings about bad results.jsonl lines listed before "and N more"
_MAX_LINE_WARNINGS = 5


def _read_metadata(path: Path, warnings: list[str]) -> dict[str, Any]:
    if not path.is_file():
        warnings.append(
            "metadata.json is missing: no run config; aggregates computed from results.jsonl"
        )
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8", errors="replace"))
    except (OSError, ValueError) as exc:
        warnings.append(f"metadata.json could not be read ({exc}); ignored")
        return {}
    if not isinstance(data, dict):
        warnings.append("metadata.json is not a JSON object; ignored")
        return {}
    return data


@dataclass
class _Stats:
    """Aggregates over every rollout of results.jsonl, for runs whose metadata has none."""

    total: int = 0
    errors: int = 0
    rewards: list[float] = field(default_factory=list)
    metrics: dict[str, list[float]] = field(default_factory=dict)
    turns: list[float] = field(default_factory=list)

    def add(self, row: dict[str, Any]) -> None:
        self.total += 1
        self.errors += bool(row.get("error"))
        reward = _number(row.get("reward"))
        if reward is not None and math.isfinite(reward):
            self.rewards.append(reward)
        metrics = row.get("metrics")
        if isinstance(metrics, dict):
            for name, value in metrics.items():
                v = _number(value)
                if v is not None and math.isfinite(v):
                    self.metrics.setdefault(str(name), []).append(v)
        turns = _number(row.get("num_turns"))
        if turns is not None and math.isfinite(turns):
            self.turns.append(turns)

    def summary(self) -> dict[str, Any]:
        if not self.total:
            return {}
        out: dict[str, Any] = {"count": self.total, "errors": self.errors}
        if self.rewards:
            out["reward"] = _mean_std(self.rewards)
        if self.metrics:
            out["metrics"] = {k: _mean_std(v) for k, v in self.metrics.items()}
        if self.turns:
            out["mean_turns"] = sum(self.turns) / len(self.turns)
        return out


def _mean_std(values: list[float]) -> dict[str, float]:
    mean = sum(values) / len(values)
    return {"mean": mean, "std": math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))}


def _read_results(
    path: Path, max_rollouts: int | None, warnings: list[str]
) -> tuple[list[dict[str, Any]], _Stats]:
    stats = _Stats()
    rows: list[dict[str, Any]] = []
    if not path.is_file():
        warnings.append("results.jsonl is missing: no rollouts to show")
        return rows, stats
    bad: list[str] = []
    with path.open("r", encoding="utf-8", errors="replace") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as exc:
                torn = "" if line.endswith("\n") else " (a torn last line: interrupted run?)"
                bad.append(f"results.jsonl line {lineno}: not valid JSON ({exc}){torn}; skipped")
                continue
            if not isinstance(row, dict):
                bad.append(f"results.jsonl line {lineno}: not a JSON object; skipped")
                continue
            stats.add(row)
            if max_rollouts is None or len(rows) < max_rollouts:
                rows.append(row)
    warnings.extend(bad[:_MAX_LINE_WARNINGS])
    if len(bad) > _MAX_LINE_WARNINGS:
        warnings.append(f"... and {len(bad) - _MAX_LINE_WARNINGS} more unreadable lines")
    return rows, stats
