"""The paged report: pages of ``page_size`` rollouts, each its own HTML file, and an index.

The folder it fills (``OUTDIR/report/`` by default; ``_write`` puts it in place)::

    index.html          the summary (run config, aggregates, metrics, warnings, the list of
                        every page) and the first page of rollouts
    page-0002.html      the second page: rollouts #200-#399 (0-based, in file order), ...
    frames/<hash>.png   the strip frames of the videos the pages show

Every rollout is on exactly one page, in file order; its card keeps the id it has in the
single file (``r<order>``), so ``page-0007.html#r1234`` names it. Pages link each other
with plain ``<a href>`` (first, prev, next, last, nearby pages, and the index's list of
all pages): separate files work from ``file://``, where a browser refuses ``fetch()`` of
local files. Images are the run's own files by relative URL, loaded lazily (``_links``),
under a CSP that allows nothing from the network (``_html._PAGED_CSP``).

Streaming invariant: the rows are read one at a time (``_run``), one page's cards are in
memory at a time, and each page's HTML goes to its file as the template yields it. Only
the first page's cards are held to the end: the index is written last, because what it
says about every page (rollouts with missing images, per page) is known only then. Why:
the report of a 100k-rollout run is written in the memory one page needs.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from markupsafe import Markup

from vf_mm.report._html import _CSS, _JS, _PAGED_CSP, _template
from vf_mm.report._links import FRAMES_DIR, _LinkedAssets
from vf_mm.report._run import _PageSummary, _Run, _Survey
from vf_mm.report._views import _card

#: the index is page 1; page n > 1 is PAGE_NAME.format(n)
INDEX_NAME = "index.html"
PAGE_NAME = "page-{:04d}.html"
#: pages linked on each side of the current one (first and last are always linked)
_NAV_SPAN = 3
#: pages named in the index's warning about rollouts with warnings, before "..."
_NAMED_PAGES = 10


def page_name(number: int) -> str:
    """The file name of page ``number`` (1-based): the index for page 1."""
    return INDEX_NAME if number == 1 else PAGE_NAME.format(number)


@dataclass
class _PagesWritten:
    """What ``_write_pages`` wrote, for the caller's counts."""

    pages: int
    files: int
    bytes: int
    images: int  # image files linked (read for their size)
    videos: int
    warnings: list[str]  # the index's


def _write_pages(
    run: _Run,
    survey: _Survey,
    folder: Path,
    *,
    page_size: int,
    run_url: str,
    max_rollouts: int | None,
) -> _PagesWritten:
    """Write ``run`` as pages into ``folder`` (an empty folder); ``run_url`` is the run
    directory's URL relative to ``folder`` (``"../"``)."""
    assets = _LinkedAssets(
        run.root, run_url=run_url, frames=folder / FRAMES_DIR, frames_url=f"{FRAMES_DIR}/"
    )
    pages = survey.pages or [_PageSummary(1, 0, -1, "", "")]  # an empty run: an index only
    count = len(pages)
    summary = run.summary_context(survey)
    rows = run.rows(limit=max_rollouts)
    flagged: dict[int, int] = {}  # page number -> rollouts with warnings
    first: dict[str, Any] | None = None
    files = written = 0
    for page in pages:
        chunk = itertools.islice(rows, page.last - page.first + 1)
        cards = [
            _card(order, row, assets, survey.lo, survey.hi)
            for order, row in zip(itertools.count(page.first), chunk, strict=False)
        ]
        page_assets, page_videos = assets.take_page()
        bad = sum(1 for c in cards if c["warnings"])
        if bad:
            flagged[page.number] = bad
        context = {
            **summary,
            "cards": cards,
            "assets": page_assets,
            "videos": page_videos,
            "pager": _pager(page, count) if count > 1 else None,
        }
        if page.number == 1:
            first = context  # the index is written last
            continue
        context["warnings"] = (
            [f"{bad} rollout(s) on this page have warnings (missing or unreadable images "
             "or videos); see their cards"]
            if bad
            else []
        )  # fmt: skip
        written += _render(folder / page_name(page.number), context, summary=False)
        files += 1

    assert first is not None
    warnings = list(run.warnings)
    if flagged:
        named = ", ".join(str(n) for n in list(flagged)[:_NAMED_PAGES])
        more = " ..." if len(flagged) > _NAMED_PAGES else ""
        warnings.append(
            f"{sum(flagged.values())} rollout(s) have warnings (missing or unreadable images "
            f"or videos); see their cards, on page(s) {named}{more}"
        )
    if max_rollouts is not None and survey.total > survey.shown:
        warnings.append(
            f"showing the first {survey.shown} of {survey.total} rollouts "
            f"(--max-rollouts {max_rollouts})"
        )
    warnings.extend(survey.warnings)
    first["warnings"] = warnings
    first["pages"] = (
        [
            {**vars(p), "url": page_name(p.number), "flagged": flagged.get(p.number, 0)}
            for p in pages
        ]
        if count > 1
        else []
    )
    first["page_size"] = page_size
    written += _render(folder / INDEX_NAME, first, summary=True)
    files += 1
    frames = folder / FRAMES_DIR
    if frames.is_dir():
        for file in frames.iterdir():
            written += file.stat().st_size
            files += 1
    return _PagesWritten(
        count, files, written, assets.images_resolved, assets.videos_resolved, warnings
    )


def _render(path: Path, context: dict[str, Any], *, summary: bool) -> int:
    """Write one page to ``path`` as the template yields it; its size in bytes."""
    full = {
        "pages": [],
        "page_size": 0,
        **context,
        "summary": summary,
        "paged": True,
        "asset_css": Markup(""),
        "css": Markup(_CSS),
        "js": Markup(_JS),
        "csp": _PAGED_CSP,
    }
    # a lone surrogate (legal in JSON, not in UTF-8) is shown as its escape, \ud800: the
    # file always writes, and the text shown is never silently another character
    with open(path, "w", encoding="utf-8", errors="backslashreplace", newline="\n") as f:
        for piece in _template().generate(**full):
            f.write(piece)
        return f.tell()


def _pager(page: _PageSummary, count: int) -> dict[str, Any]:
    """The navigation of page ``page`` among ``count``: first/prev/next/last, and the
    pages near it (``window``: ``(number, url)``, ``(0, "")`` for a gap)."""
    n = page.number
    near = sorted({1, count, *range(max(1, n - _NAV_SPAN), min(count, n + _NAV_SPAN) + 1)})
    window: list[tuple[int, str]] = []
    for number in near:
        if window and number > window[-1][0] + 1:
            window.append((0, ""))
        window.append((number, page_name(number)))
    return {
        "number": n,
        "count": count,
        "first": page.first,
        "last": page.last,
        "first_url": page_name(1),
        "last_url": page_name(count),
        "prev": page_name(n - 1) if n > 1 else "",
        "next": page_name(n + 1) if n < count else "",
        "window": window,
        "index_url": INDEX_NAME,
    }
