"""``make_report`` / ``build_report``: the run directory in, one HTML page out."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from markupsafe import Markup

from vf_mm.report._assets import _Assets
from vf_mm.report._data import _read_run
from vf_mm.report._format import _number
from vf_mm.report._html import _CSP, _CSS, _JS, _template
from vf_mm.report._views import _card, _config_rows, _metric_rows, _result_rows


@dataclass
class Report:
    """What :func:`make_report` built: the HTML and a few counts for the CLI to print."""

    html: str
    rollouts_total: int
    rollouts_shown: int
    images_embedded: int
    warnings: list[str] = field(default_factory=list)


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
            f"{flagged} rollout(s) have warnings (missing or unreadable images); see their cards"
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
        asset_css=Markup(assets.css()),
        css=Markup(_CSS),
        js=Markup(_JS),
        csp=_CSP,
    )
    # lone surrogates (legal in JSON, not in UTF-8) become "?" so the file always writes
    html = html.encode("utf-8", "replace").decode("utf-8")
    return Report(html, total, len(rows), len(assets.embedded()), warnings)
