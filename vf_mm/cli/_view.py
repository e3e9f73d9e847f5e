"""``vf-mm view OUTDIR``: the HTML report of an eval run (turns, images, rewards), as one
self-contained file or as pages (over ``report.write_report``)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from vf_mm.cli._console import cli_console


def _count(value: str) -> int:
    n = int(value)
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {n}")
    return n


def _positive(value: str) -> int:
    n = int(value)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {n}")
    return n


#: vf_mm.report._internal.PAGE_SIZE, spelled here so that building the parser imports no report code
PAGE_SIZE = 200


def register(sub: Any) -> None:
    view = sub.add_parser(
        "view",
        help="write the HTML report of an eval run directory (one file, or pages)",
        description="Write an HTML report of the run: its config, aggregates and metrics "
        "(over every rollout) and each rollout's turns, images and reward. A run that fits "
        f"on one page ({PAGE_SIZE} rollouts by default) becomes one self-contained file, "
        "OUTDIR/report.html (inline CSS/JS, images and video frames embedded once each: no "
        "network, it can be mailed around). A longer run becomes a paged report, "
        "OUTDIR/report/index.html (the summary, the list of pages and the first page) and "
        "page-0002.html, ...: images are linked from OUTDIR/assets/ and load as they "
        "scroll into view, so a run of any length opens in seconds; keep the folder inside "
        "the run directory (it links ../assets/). Either opens from file:// in any browser.",
    )
    view.add_argument("outdir", type=Path, help="eval run directory (results.jsonl, metadata.json)")
    view.add_argument(
        "-o",
        "--output",
        type=Path,
        default=None,
        help="the report's path: a file for one file (default OUTDIR/report.html; a path "
        "ending in .html asks for one file), a folder for pages (default OUTDIR/report)",
    )
    kind = view.add_mutually_exclusive_group()
    kind.add_argument(
        "--single-file",
        dest="single_file",
        action="store_const",
        const=True,
        default=None,
        help="one self-contained file whatever the run's length (slow to open past a few "
        "hundred rollouts)",
    )
    kind.add_argument(
        "--pages",
        dest="single_file",
        action="store_const",
        const=False,
        help="pages even for a run that fits on one",
    )
    view.add_argument(
        "--page-size",
        type=_positive,
        default=PAGE_SIZE,
        metavar="N",
        help=f"rollouts per page (default {PAGE_SIZE}); a run of at most N rollouts is "
        "written as one file unless --pages",
    )
    view.add_argument(
        "--max-rollouts",
        type=_count,
        default=None,
        metavar="N",
        help="show only the first N rollouts (aggregates still cover all of them)",
    )
    view.set_defaults(run=run_view)


def run_view(args: argparse.Namespace, console: Console | None = None) -> int:
    from vf_mm.report import write_report

    console = console or cli_console()
    try:
        written = write_report(
            args.outdir,
            output=args.output,
            single_file=args.single_file,
            page_size=args.page_size,
            max_rollouts=args.max_rollouts,
        )
    except (OSError, ValueError) as exc:  # not a run, a folder that is not a report, ...
        console.print(f"[red]vf-mm view:[/red] {escape(str(exc))}")
        return 1
    for warning in written.warnings:
        console.print(f"[yellow]warning:[/yellow] {escape(warning)}")
    shown = (
        f"{written.rollouts_shown} of {written.rollouts_total}"
        if written.rollouts_shown != written.rollouts_total
        else str(written.rollouts_total)
    )
    if not written.paged:
        console.print(
            f"wrote {escape(str(written.path))} ({written.bytes / 1024:,.0f} KiB: {shown} "
            f"rollouts, {written.images} distinct images, {written.videos} distinct videos)"
        )
        return 0
    console.print(
        f"wrote {escape(str(written.path.parent))}/ ({written.pages} "
        f"page{'' if written.pages == 1 else 's'}, "
        f"{written.files} files, {written.bytes / 2**20:,.1f} MiB: {shown} rollouts, "
        f"{written.images} image files linked, {written.videos} distinct videos); "
        f"open {escape(str(written.path))}"
    )
    return 0
