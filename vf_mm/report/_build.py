"""``make_report`` / ``build_report``: the run directory in, one HTML page out.

The run directory is read through ``vf_mm.results`` (the one reader): damage becomes
warnings shown on the page, and runs whose metadata holds no aggregates (an interrupted
run) get ``summarize`` of the rows that are there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from markupsafe import Markup

from vf_mm.errors import ResultsError
from vf_mm.report._assets import _Assets
from vf_mm.report._html import _CSP, _CSS, _JS, _template
from vf_mm.report._views import _card, _config_rows, _metric_rows, _number, _result_rows
from vf_mm.results import METADATA_FILE, RESULTS_FILE, read_metadata, scan_results, summarize


@dataclass
class Report:
    """What :func:`make_report` built: the HTML and a few counts for the CLI to print."""

    html: str
    rollouts_total: int
    rollouts_shown: int
    images_embedded: int
    warnings: list[str] = field(default_factory=list)
    videos_embedded: int = 0  # distinct videos shown (each as a strip; a player if playable)


def build_report(outdir: str | Path, *, max_rollouts: int | None = None) -> str:
    """The HTML text of the report on the run directory ``outdir``.

    ``max_rollouts`` keeps the first N rollouts of ``results.jsonl`` (the aggregates still
    cover the whole file). Raises ``FileNotFoundError`` when ``outdir`` is not a directory or
    holds neither ``results.jsonl`` nor ``metadata.json``; anything else damaged is shown
    as a warning in the report.
    """
    return make_report(outdir, max_rollouts=max_rollouts).html


def make_report(outdir: str | Path, *, max_rollouts: int | None = None) -> Report:
    """:func:`build_report`, with the counts and warnings kept apart for the caller."""
    root = Path(outdir)
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: not a directory (expected an eval run directory)")
    if max_rollouts is not None and max_rollouts < 0:
        raise ValueError(f"max_rollouts must be >= 0, got {max_rollouts}")

    run = _read_run(root)
    metadata, warnings, total = run.metadata, run.warnings, len(run.rows)
    rows = run.rows if max_rollouts is None else run.rows[:max_rollouts]
    assets = _Assets(root)
    rewards = [r for r in (_number(row.get("reward")) for row in rows) if r is not None]
    finite = [r for r in rewards if math.isfinite(r)]
    lo, hi = min([0.0, *finite]), max([1.0, *finite])
    cards = [_card(i, row, assets, lo, hi) for i, row in enumerate(rows)]
    flagged = sum(1 for c in cards if c["warnings"])
    if flagged:
        warnings.append(
            f"{flagged} rollout(s) have warnings (missing or unreadable images or videos); "
            "see their cards"
        )
    if max_rollouts is not None and total > len(rows):
        warnings.append(
            f"showing the first {len(rows)} of {total} rollouts (--max-rollouts {max_rollouts})"
        )

    config = metadata.get("config") if isinstance(metadata.get("config"), dict) else {}
    results = run.aggregates
    shown = results if results is not None else run.computed()
    title = " · ".join(str(config[k]) for k in ("env_id", "model") if config.get(k) is not None)
    html = _template().render(
        title=title or root.resolve().name,
        outdir=str(root),
        config_rows=_config_rows(metadata, config),
        result_rows=_result_rows(shown),
        results_computed=results is None and total > 0,
        metric_rows=_metric_rows(shown),
        interrupted=bool(metadata) and metadata.get("finished_at", "absent") is None,
        warnings=warnings,
        cards=cards,
        total=total,
        assets=assets.embedded(),
        videos=assets.videos(),
        asset_css=Markup(assets.css()),
        css=Markup(_CSS),
        js=Markup(_JS),
        csp=_CSP,
    )
    # lone surrogates (legal in JSON, not in UTF-8) become "?" so the file always writes
    html = html.encode("utf-8", "replace").decode("utf-8")
    return Report(html, total, len(rows), len(assets.embedded()), warnings, len(assets.videos()))


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
        """``summarize`` of the rows, over the values that are finite numbers: a value that
        is not (NaN, text, in a file another tool wrote or a person edited) is left out of
        the aggregates, and a warning says how many were."""
        if not self.rows:
            return {}
        left_out = [0]
        rows = [_summable(row, left_out) for row in self.rows]
        if left_out[0]:
            self.warnings.append(
                f"{left_out[0]} value(s) in {RESULTS_FILE} are not finite numbers "
                "(reward, metrics, turns or tokens); the aggregates leave them out"
            )
        return summarize(rows)


def _summable(row: dict[str, Any], left_out: list[int]) -> dict[str, Any]:
    """``row`` with every numeric field that is not a finite number set to None (metrics:
    dropped), counting them in ``left_out[0]``."""

    def finite(value: Any) -> float | None:
        number = _number(value)
        if value is not None and (number is None or not math.isfinite(number)):
            left_out[0] += 1
            return None
        return number

    out = dict(row)
    for key in ("reward", "num_turns", "prompt_tokens", "completion_tokens"):
        out[key] = finite(row.get(key))
    metrics = row.get("metrics")
    kept = {}
    if isinstance(metrics, dict):
        kept = {k: v for k, v in ((k, finite(v)) for k, v in metrics.items()) if v is not None}
    out["metrics"] = kept
    return out


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
