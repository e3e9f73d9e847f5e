"""``vf-mm export OUTDIR --to parquet|hf DIR``: an eval run directory as a Hugging Face dataset.

    vf-mm export outputs/run --to parquet out/run-parquet   # out/run-parquet/results.parquet
    vf-mm export outputs/run --to hf out/run-hf              # datasets.load_from_disk(...)

One row per rollout, messages as JSON text, images as ``datasets.Image`` (the columns and
why: ``vf_mm.results.to_dataset``). ``--to parquet`` writes ``DIR/results.parquet`` with
``Dataset.to_parquet`` (read it back with ``Dataset.from_parquet``); ``--to hf`` writes
``DIR`` with ``Dataset.save_to_disk`` (``datasets.load_from_disk``).

DIR must be new or empty: an export never mixes with other files. ``--overwrite``
replaces a DIR that holds a previous export of the same form (and nothing else); a DIR
holding anything else is refused even then, so a mistyped path never costs a folder.
The export is written into a hidden folder beside DIR and renamed into place, so an
interrupted export leaves the old DIR (or none), never half a dataset. The rows are
read one at a time and written as Arrow files to another hidden folder beside DIR (on
DIR's disk, not in ``/tmp``, which may be RAM), removed when the command ends: memory
stays bounded however long the run (``to_dataset``).

Exit status: 0 exported, 1 refused (the message, in red, says why: OUTDIR is not a run
or holds no rollouts yet (``datasets`` cannot load an empty save back), DIR is not empty,
an asset is missing or changed, ``--tokens`` on a run that stores no token ids), 2 bad
arguments. A thin layer over ``vf_mm.results.to_dataset``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import shutil
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from vf_mm.cli._console import cli_console

FORMATS = ("parquet", "hf")
PARQUET_FILE = "results.parquet"


class _Target(argparse.Action):
    """``--to FORMAT DIR``: refuses an unknown FORMAT as a usage error (exit 2)."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option: Any = None) -> None:
        form, folder = values
        if form not in FORMATS:
            parser.error(f"--to: FORMAT must be one of {', '.join(FORMATS)}, not {form!r}")
        namespace.format = form
        namespace.dest_dir = Path(folder)


def register(sub: Any) -> None:
    p = sub.add_parser(
        "export",
        help="write an eval run directory as a Hugging Face dataset (Parquet or save_to_disk)",
        description="Write the rollouts of the run directory OUTDIR as a datasets.Dataset: one "
        "row per rollout (example_id, rollout_index, prompt and completion messages as JSON "
        "text, answer, info, reward, metrics, error, num_turns, token counts, timing), each "
        "row's images as datasets.Image in the order its messages refer to them (image_urls "
        "lines them up) and its clips as bytes. --to parquet DIR writes DIR/results.parquet "
        "(Dataset.from_parquet reads it), --to hf DIR writes DIR with save_to_disk "
        "(datasets.load_from_disk reads it). DIR must be new or empty (--overwrite replaces a "
        "previous export). Exit status: 0 exported, 1 refused, 2 arguments that do not parse.",
    )
    p.add_argument("outdir", type=Path, help="the eval run directory (results.jsonl, assets/)")
    p.add_argument(
        "--to",
        nargs=2,
        metavar=("FORMAT", "DIR"),
        action=_Target,
        required=True,
        help="parquet (DIR/results.parquet) or hf (save_to_disk into DIR)",
    )
    p.add_argument(
        "--tokens",
        action="store_true",
        help="each turn's token ids, logprobs and masks: refused, with the reason, for a run "
        "directory (results.jsonl stores token counts only; every export has those)",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace DIR when it holds a previous export (a DIR holding other files is "
        "still refused)",
    )
    p.add_argument(
        "--bad-lines",
        choices=("raise", "torn-tail", "skip"),
        default="torn-tail",
        help="what a bad line of results.jsonl does, as the reader says: raise, leave out a "
        "torn last line only (default), or leave out every bad line",
    )
    p.add_argument(
        "--skip-bad-assets",
        action="store_true",
        help="export a missing or changed image or clip as null (with a warning) instead of "
        "refusing",
    )
    p.set_defaults(run=run_export)


def run_export(args: argparse.Namespace, console: Console | None = None) -> int:
    from vf_mm.errors import ResultsError, VfMmError
    from vf_mm.results import to_dataset

    console = console or cli_console()
    target: Path = args.dest_dir
    cache = _cache_beside(target)
    try:
        _check_target(target, args.format, overwrite=args.overwrite)
        dataset = to_dataset(
            args.outdir,
            tokens=args.tokens,
            bad_lines=args.bad_lines,
            bad_assets="skip" if args.skip_bad_assets else "raise",
            cache_dir=cache,
        )
        if dataset.num_rows == 0:  # datasets cannot load an empty save back
            raise ResultsError(
                f"{args.outdir} holds no rollouts yet: nothing to export", path=str(args.outdir)
            )
        _publish(dataset, target, args.format)
        rows = dataset.num_rows
        images, videos = (_listed(dataset, name) for name in ("images", "videos"))
    except (VfMmError, OSError) as exc:
        console.print(f"[red]vf-mm export: {escape(str(exc))}[/red]")
        return 1
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    where = escape(str(target))
    read = (
        f"datasets.Dataset.from_parquet('{escape(str(target / PARQUET_FILE))}')"
        if args.format == "parquet"
        else f"datasets.load_from_disk('{where}')"
    )
    console.print(
        f"exported {rows} rollouts ({images} images, {videos} videos) from "
        f"{escape(str(args.outdir))} to {where}; read it with {read}",
        soft_wrap=True,
    )
    return 0


def _cache_beside(target: Path) -> Path:
    """Where ``to_dataset`` writes its Arrow files for this export: a hidden folder
    beside ``target`` (beside its nearest existing ancestor while the target's folder
    does not exist yet), so the rows go to the disk the export goes to, never to a
    temporary folder that may be RAM (a tmpfs ``/tmp``). Not created here (``to_dataset``
    creates it when it writes), and removed when the command ends, whatever happened:
    what is published is a copy (``to_parquet`` / ``save_to_disk``)."""
    base = target.parent
    while not base.is_dir() and base != base.parent:
        base = base.parent
    name = target.name or "export"
    return base / f".{name}.tmp-cache-{secrets.token_hex(4)}"


def _listed(dataset: Any, column: str) -> int:
    """The entries of a list column that hold something, counted in Arrow (no bytes
    copied): an image or clip left out with ``--skip-bad-assets`` is a null, not an
    export."""
    import pyarrow.compute as pc

    return int(pc.count(pc.list_flatten(dataset.data.column(column))).as_py() or 0)


def _is_export(folder: Path, form: str) -> bool:
    """Whether ``folder`` holds an export of this form and nothing else."""
    names = {entry.name for entry in os.scandir(folder)}
    if form == "parquet":
        return names == {PARQUET_FILE}
    arrow = {n for n in names if n.startswith("data-") and n.endswith(".arrow")}
    # cache-*.arrow: what datasets' map / filter leave beside a dataset loaded from disk
    cache = {n for n in names if n.startswith("cache-") and n.endswith(".arrow")}
    return bool(arrow) and names == {"dataset_info.json", "state.json", *arrow, *cache}


def _check_target(target: Path, form: str, *, overwrite: bool) -> None:
    """DIR is new, empty, or (with ``overwrite``) a previous export of this form."""
    from vf_mm.errors import ResultsError

    if not target.exists() and not target.is_symlink():
        return
    if not target.is_dir() or target.is_symlink():
        raise ResultsError(f"{target} exists and is not a folder", path=str(target))
    with os.scandir(target) as entries:
        if not any(True for _ in entries):
            return
    if not overwrite:
        raise ResultsError(
            f"{target} exists and is not empty: choose a new DIR, or pass --overwrite to "
            "replace a previous export",
            path=str(target),
        )
    if not _is_export(target, form):
        what = (
            "a Parquet export (results.parquet only)"
            if form == "parquet"
            else "a save_to_disk export (dataset_info.json, state.json, *.arrow only)"
        )
        raise ResultsError(
            f"{target} is not {what}; --overwrite replaces a previous export only, never "
            "other files: choose a new DIR (or remove it yourself)",
            path=str(target),
        )


def _publish(dataset: Any, target: Path, form: str) -> None:
    """Write the export beside ``target`` in a hidden folder, then rename it into place
    (a previous export is moved aside first and deleted after)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    token = secrets.token_hex(4)
    staging = target.parent / f".{target.name}.tmp-export-{token}"
    old = target.parent / f".{target.name}.old-export-{token}"
    moved = False
    try:
        if form == "parquet":
            staging.mkdir()
            dataset.to_parquet(str(staging / PARQUET_FILE))
        else:
            dataset.save_to_disk(str(staging))
        if target.exists() and any(True for _ in os.scandir(target)):
            target.rename(old)
            moved = True
        os.replace(staging, target)  # onto a missing or empty folder
    except BaseException:
        if moved:  # put the previous export back
            with contextlib.suppress(OSError):
                old.rename(target)
        raise
    finally:
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(staging)
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(old)
