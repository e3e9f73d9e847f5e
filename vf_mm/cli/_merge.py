"""``vf-mm merge OUTDIR SRC [SRC ...]``: the run directories of a sharded eval as one run.

    vf-mm eval ENV ... --shard 0/4 -o out/s0     # ... one per machine, up to --shard 3/4
    vf-mm merge out/all out/s0 out/s1 out/s2 out/s3
    vf-mm view out/all

Exit status: 0 merged, 1 refused (the message, in red, names the problem and the
directories: configs that differ, a shard twice or missing, rows in two shards, a bad
asset, an OUTDIR that is not empty; nothing is written then), 2 bad arguments.

A terminal over ``vf_mm.results.merge_runs``: everything the merge checks and writes is
there; this module parses the arguments and prints the summary table.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from vf_mm._text import shorten
from vf_mm.cli._common import summary_table
from vf_mm.cli._console import cli_console


def register(sub: Any) -> None:
    p = sub.add_parser(
        "merge",
        help="combine the run directories of a sharded eval (--shard i/N) into one",
        description="Combine the run directories that `vf-mm eval --shard i/N` wrote, one per "
        "shard, into OUTDIR: one ordinary run directory (results.jsonl, metadata.json with "
        "the aggregates over all rows, assets/ with each image and clip once) that vf-mm view "
        "reads like any other. The sources are only read. Refused (exit 1, nothing written): "
        "configs that differ in more than the shard, a shard given twice, different shard "
        "counts, one (example, rollout) in two sources, a missing shard (unless "
        "--allow-partial), an asset that does not match its hash, an OUTDIR that is not "
        "empty. Exit status: 0 merged, 1 refused, 2 arguments that do not parse.",
    )
    p.add_argument("outdir", type=Path, help="the merged run directory (new, or an empty folder)")
    p.add_argument(
        "sources",
        type=Path,
        nargs="+",
        metavar="SRC",
        help="a shard's run directory (vf-mm eval --shard i/N -o SRC); one per shard",
    )
    p.add_argument(
        "--allow-partial",
        action="store_true",
        help="merge even when some shards of i/N are missing (the merged metadata names them)",
    )
    p.set_defaults(run=run_merge)


def run_merge(args: argparse.Namespace, console: Console | None = None) -> int:
    from vf_mm.errors import ResultsError
    from vf_mm.results import merge_runs

    console = console or cli_console()
    try:
        merged = merge_runs(args.outdir, args.sources, allow_partial=args.allow_partial)
    except (ResultsError, OSError) as exc:  # MergeError, a corrupt source line, a disk error
        console.print(f"[red]vf-mm merge: {escape(str(exc))}[/red]")
        return 1
    for warning in merged.warnings:
        console.print(f"[yellow]warning:[/yellow] {escape(warning)}")
    config = merged.metadata.get("config") or {}
    title = " on ".join(
        escape(Path(str(config[k])).name if k == "model" else str(config[k]))
        for k in ("env_id", "model")
        if config.get(k) is not None
    )
    console.print(summary_table(f"merged {title}".rstrip(), _rows(merged)))
    where = escape(str(merged.outdir))
    console.print(f"results: {where}/results.jsonl  (view: vf-mm view {where})", soft_wrap=True)
    return 0


def _rows(merged: Any) -> list[tuple[Any, ...]]:
    agg = merged.aggregates
    reward = agg.get("reward") or {}
    rows: list[tuple[Any, ...]] = [("reward", reward.get("mean"), reward.get("std"))]
    rows += [(f"pass@{k}", value) for k, value in (agg.get("pass_at_k") or {}).items()]
    rows += [
        ("rows", merged.rows),
        ("examples", agg.get("examples", 0)),
        ("errors", agg.get("errors", 0)),
    ]
    rows += [
        (f"  {kind['count']} × {escape(name)}", escape(shorten(kind["first"], 60)))  # noqa: RUF001
        for name, kind in (agg.get("error_kinds") or {}).items()
    ]
    count = len(merged.shards) + len(merged.missing)
    rows.append(("shards", f"{len(merged.shards)} of {count}: {', '.join(merged.shards)}"))
    if merged.missing:
        rows.append(("missing shards", ", ".join(merged.missing)))
    rows.append(("assets", merged.assets))
    return rows
