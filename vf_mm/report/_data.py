"""The run directory as the report sees it: read through ``vf_mm.results`` (the one reader),
damage turned into warnings shown on the page, aggregates from ``summarize`` for runs
whose metadata has none (an interrupted run)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vf_mm.errors import ResultsError
from vf_mm.results import (
    METADATA_FILE,
    RESULTS_FILE,
    read_metadata,
    scan_results,
    summarize,
)

#: per-file warnings about bad results.jsonl lines listed before "and N more"
_MAX_LINE_WARNINGS = 5


@dataclass
class _RunData:
    metadata: dict[str, Any]
    rows: list[dict[str, Any]]  # every whole row, in file order
    warnings: list[str] = field(default_factory=list)

    @property
    def aggregates(self) -> dict[str, Any] | None:
        """The stored aggregates, else None (the page then shows ``computed``)."""
        results = self.metadata.get("results")
        return results if isinstance(results, dict) else None

    def computed(self) -> dict[str, Any]:
        """``summarize`` of the rows; a row it cannot sum (a hand-edited file) is a warning."""
        try:
            return summarize(self.rows) if self.rows else {}
        except (TypeError, ValueError) as exc:
            self.warnings.append(f"aggregates could not be computed from {RESULTS_FILE}: {exc}")
            return {}


def _read_run(root: Path) -> _RunData:
    """What the report shows of ``root``; raises ``FileNotFoundError`` only when it holds
    neither file of a run directory."""
    results_path, meta_path = root / RESULTS_FILE, root / METADATA_FILE
    if not results_path.is_file() and not meta_path.is_file():
        raise FileNotFoundError(
            f"{root}: holds neither {RESULTS_FILE} nor {METADATA_FILE}; "
            "is it an eval run directory?"
        )
    warnings: list[str] = []
    metadata: dict[str, Any] = {}
    try:
        metadata = read_metadata(root)
    except FileNotFoundError:
        warnings.append(
            f"{METADATA_FILE} is missing: no run config; aggregates computed from {RESULTS_FILE}"
        )
    except (OSError, ResultsError) as exc:
        warnings.append(f"{METADATA_FILE} could not be read ({exc}); ignored")
    rows: list[dict[str, Any]] = []
    try:
        scan = scan_results(results_path, bad_lines="skip", schema="lenient")
    except FileNotFoundError:
        warnings.append(f"{RESULTS_FILE} is missing: no rollouts to show")
    else:
        rows = scan.rows
        bad = [
            f"{RESULTS_FILE} line {b.line}: {b.reason}"
            + (" (a torn last line: interrupted run?)" if b.torn else "")
            + "; skipped"
            for b in scan.bad_lines
        ]
        warnings.extend(bad[:_MAX_LINE_WARNINGS])
        if len(bad) > _MAX_LINE_WARNINGS:
            warnings.append(f"... and {len(bad) - _MAX_LINE_WARNINGS} more unreadable lines")
    return _RunData(metadata, rows, warnings)
