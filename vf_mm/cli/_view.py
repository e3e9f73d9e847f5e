"""``vf-mm view OUTDIR``: a self-contained HTML report of an eval run (turns, images, rewards)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape


def _count(value: str) -> int:
    n = int(value)
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {n}")
    return n


def register(sub: Any) -> None:
    view = sub.add_parser(
        "view",
        help="write a self-contained HTML report of an eval run directory",
        description="Write one HTML file (inline CSS/JS, images and video frames embedded once each) showing the "
        "run config, aggregates and every rollout's turns, images and reward. Open it in any "
        "browser; it needs no network and can be mailed around.",
    )
    view.add_argument("outdir", type=Path, help="eval run directory (results.jsonl, metadata.json)")
    view.add_argument(
        "-o", "--output", type=Path, default=None, help="report path (default OUTDIR/report.html)"
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
    from vf_mm.report import make_report

    console = console or Console()
    try:
        report = make_report(args.outdir, max_rollouts=args.max_rollouts)
    except (FileNotFoundError, ValueError) as exc:
        console.print(f"[red]vf-mm view:[/red] {escape(str(exc))}")
        return 1
    out: Path = args.output if args.output is not None else args.outdir / "report.html"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(report.html, encoding="utf-8")
        tmp.replace(out)
    finally:
        tmp.unlink(missing_ok=True)
    for warning in report.warnings:
        console.print(f"[yellow]warning:[/yellow] {escape(warning)}")
    shown = (
        f"{report.rollouts_shown} of {report.rollouts_total}"
        if report.rollouts_shown != report.rollouts_total
        else str(report.rollouts_total)
    )
    console.print(
        f"wrote {escape(str(out))} ({len(report.html.encode()) / 1024:,.0f} KiB: {shown} rollouts, "
        f"{report.images_embedded} distinct images, {report.videos_embedded} distinct videos)"
    )
    return 0
