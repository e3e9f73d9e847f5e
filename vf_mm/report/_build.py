"""``make_report``: the run directory in, one self-contained HTML page out.

The run directory is read through ``_run`` (``vf_mm.results``, the one reader, one row
at a time): damage becomes warnings shown on the page, and runs whose metadata holds no
aggregates (an interrupted run) get ``summarize`` of every row there. This is the
single-file mode of ``vf-mm view`` (``write_report`` picks it for a run that fits on
one page, or when asked): every image embedded once, so the file can be mailed around.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from markupsafe import Markup

from vf_mm.report._assets import _Assets
from vf_mm.report._html import _CSP, _CSS, _JS, _template
from vf_mm.report._run import _Run, _Survey
from vf_mm.report._views import _card


@dataclass
class Report:
    """What :func:`make_report` built: the HTML and a few counts for the CLI to print.

    Attributes:
        html: The page.
        rollouts_total: Rollouts in the run.
        rollouts_shown: Rollouts on the page.
        images_embedded: Distinct images embedded.
        warnings: What was damaged, as shown in the report.
        videos_embedded: Distinct videos shown (each as a strip; a player if playable).
    """

    html: str
    rollouts_total: int
    rollouts_shown: int
    images_embedded: int
    warnings: list[str] = field(default_factory=list)
    videos_embedded: int = 0  # distinct videos shown (each as a strip; a player if playable)


def make_report(outdir: str | Path, *, max_rollouts: int | None = None) -> Report:
    """The report on the run directory ``outdir``: its HTML, counts and warnings apart.

    The single file holds every card it shows in memory while it is drawn (it is one page:
    that is what it is for); the rows are read one at a time, and the aggregates are
    computed by streaming over the whole file (``_run``). Anything damaged besides a
    missing run is shown as a warning in the report.

    Args:
        outdir: The run directory.
        max_rollouts: Keeps the first N rollouts of ``results.jsonl`` (the aggregates still
            cover the whole file).

    Raises:
        FileNotFoundError: ``outdir`` is not a directory or holds neither
            ``results.jsonl`` nor ``metadata.json``.
    """
    root = Path(outdir)
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: not a directory (expected an eval run directory)")
    if max_rollouts is not None and max_rollouts < 0:
        raise ValueError(f"max_rollouts must be >= 0, got {max_rollouts}")

    run = _Run(root)
    survey = run.survey(max_rollouts=max_rollouts, page_size=_ONE_PAGE)
    return _render_single(run, survey, max_rollouts=max_rollouts)


def _render_single(run: _Run, survey: _Survey, *, max_rollouts: int | None) -> Report:
    """The single file of ``run``, given the pass over it that ``survey`` made."""
    warnings = list(run.warnings)
    assets = _Assets(run.root)
    rows = run.rows(limit=max_rollouts)
    cards = [_card(i, row, assets, survey.lo, survey.hi) for i, row in enumerate(rows)]
    flagged = sum(1 for c in cards if c["warnings"])
    if flagged:
        warnings.append(
            f"{flagged} rollout(s) have warnings (missing or unreadable images or videos); "
            "see their cards"
        )
    if max_rollouts is not None and survey.total > len(cards):
        warnings.append(
            f"showing the first {len(cards)} of {survey.total} rollouts "
            f"(--max-rollouts {max_rollouts})"
        )
    warnings.extend(survey.warnings)
    html = _template().render(
        **run.summary_context(survey),
        warnings=warnings,
        cards=cards,
        assets=assets.embedded(),
        videos=assets.videos(),
        asset_css=Markup(assets.css()),
        css=Markup(_CSS),
        js=Markup(_JS),
        csp=_CSP,
        pager=None,
        pages=[],
        summary=True,
        paged=False,
    )
    # a lone surrogate (legal in JSON, not in UTF-8) is shown as its escape, \ud800: the
    # file always writes, and the text shown is never silently another character
    html = html.encode("utf-8", "backslashreplace").decode("utf-8")
    return Report(
        html, survey.total, len(cards), len(assets.embedded()), warnings, len(assets.videos())
    )


#: the single file is one page, whatever its length
_ONE_PAGE = 1 << 62
