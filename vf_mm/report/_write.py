"""``write_report``: the report of a run directory written to disk, as one file or as pages.

Which kind (``single_file``):

- ``None`` (the default) picks by size: a run whose rollouts shown fit on one page
  (``page_size``, 200 by default) is written as **one self-contained file**
  (``OUTDIR/report.html``: every image embedded once, no network, it can be mailed
  around), a longer one as a **paged report** (``OUTDIR/report/index.html`` and
  ``page-NNNN.html``, images linked from ``OUTDIR/assets/``). An ``output`` ending in
  ``.html`` asks for one file, whatever the size.
- ``True``: one file (``make_report``), whatever the size: it holds every card in memory
  while it is drawn, and a browser reads all of it before it shows anything.
- ``False``: pages, however short the run.

Why both: one file is the thing to send someone, and it is fast enough for a few hundred
rollouts; a paged report opens in the same time for 100 rollouts and for 100,000 (the
index is one page, its images load as they scroll into view), but it is a folder that
refers to the run's ``assets/`` by relative URLs, so it moves with the run directory.

Either is replaced atomically: the file is written to a temporary name and renamed over
the old one; the pages are written to a temporary folder beside the target, which then
takes the old folder's place (an existing folder is replaced only when it is empty or a
report ``vf-mm view`` wrote: ``FileExistsError`` otherwise, so ``-o ~/`` removes
nothing).
"""

from __future__ import annotations

import os
import shutil
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

from vf_mm.report._build import _render_single
from vf_mm.report._pages import INDEX_NAME, _write_pages
from vf_mm.report._run import _Run

#: rollouts per page of a paged report, and the most a default report writes as one file
PAGE_SIZE = 200
#: the default names inside OUTDIR: the single file, the paged report's folder
SINGLE_FILE_NAME = "report.html"
PAGES_DIR_NAME = "report"

_GENERATOR_MARK = b'<meta name="generator" content="vf-mm view">'


@dataclass
class WrittenReport:
    """What :func:`write_report` wrote: where to open it and a few counts for the CLI.

    Attributes:
        path: What to open: the single file, or the paged report's index.html.
        paged: Whether it is a paged report.
        pages: Pages written (1 for a single file).
        files: Files written.
        bytes: Bytes written, every file together.
        rollouts_total: Rollouts in the run.
        rollouts_shown: Rollouts shown.
        images: Single file: distinct images embedded; pages: image files linked.
        videos: Distinct videos shown.
        warnings: What was damaged, as shown in the report.
    """

    path: Path  # what to open: the single file, or the paged report's index.html
    paged: bool
    pages: int  # 1 for a single file
    files: int
    bytes: int  # written, every file together
    rollouts_total: int
    rollouts_shown: int
    images: int  # single file: distinct images embedded; pages: image files linked
    videos: int  # distinct videos shown
    warnings: list[str] = field(default_factory=list)


def write_report(
    outdir: str | Path,
    *,
    output: str | Path | None = None,
    single_file: bool | None = None,
    page_size: int = PAGE_SIZE,
    max_rollouts: int | None = None,
) -> WrittenReport:
    """Write the report of the run directory ``outdir`` (the module docstring: which kind).

    Args:
        outdir: The run directory.
        output: The single file's path (default ``OUTDIR/report.html``) or the paged
            report's folder (default ``OUTDIR/report``).
        single_file: One file (True), pages (False), or picked by size (None; see the
            module docstring).
        page_size: Rollouts per page.
        max_rollouts: Shows the first N rollouts (the summary still covers the whole run).

    Raises:
        FileNotFoundError: ``outdir`` is not a run directory.
        ValueError: A bad argument (a paged report asked for with an ``output`` ending in
            ``.html``).
        FileExistsError: ``output`` is a folder that is not a report.
    """
    root = Path(outdir)
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: not a directory (expected an eval run directory)")
    if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
        raise ValueError(f"page_size must be an int >= 1, got {page_size!r}")
    if max_rollouts is not None and max_rollouts < 0:
        raise ValueError(f"max_rollouts must be >= 0, got {max_rollouts}")
    wants_file = output is not None and Path(output).suffix.lower() in (".html", ".htm")
    if single_file is False and wants_file:
        raise ValueError(
            f"{output}: a paged report is a folder (index.html and its pages); "
            "give a folder, or ask for a single file"
        )

    run = _Run(root)
    survey = run.survey(max_rollouts=max_rollouts, page_size=page_size)
    single = single_file if single_file is not None else wants_file or survey.shown <= page_size
    if single:
        path = Path(output) if output is not None else root / SINGLE_FILE_NAME
        report = _render_single(run, survey, max_rollouts=max_rollouts)
        data = report.html.encode("utf-8")
        _replace_file(path, data)
        return WrittenReport(
            path, False, 1, 1, len(data), report.rollouts_total, report.rollouts_shown,
            report.images_embedded, report.videos_embedded, report.warnings,
        )  # fmt: skip

    folder = Path(output) if output is not None else root / PAGES_DIR_NAME
    _check_replaceable(folder, root)
    run_url = _relative_url(root, folder)
    tmp = folder.with_name(f".{folder.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        pages = _write_pages(
            run, survey, tmp, page_size=page_size, run_url=run_url, max_rollouts=max_rollouts
        )
        _replace_folder(folder, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return WrittenReport(
        folder / INDEX_NAME, True, pages.pages, pages.files, pages.bytes, survey.total,
        survey.shown, pages.images, pages.videos, pages.warnings,
    )  # fmt: skip


def _replace_file(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(data)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def _check_replaceable(folder: Path, root: Path) -> None:
    """Refuse a target the paged report must not replace: a file, the run directory or
    a folder holding it, a folder with something in it that is not a report."""
    resolved = folder.resolve()
    if root.resolve().is_relative_to(resolved):
        raise ValueError(f"{folder}: holds the run directory; choose another folder")
    if not folder.exists():
        return
    if not folder.is_dir():
        raise FileExistsError(f"{folder}: exists and is not a folder")
    if not any(folder.iterdir()):
        return
    try:
        with open(folder / INDEX_NAME, "rb") as f:
            head = f.read(4096)
    except OSError:
        head = b""
    if _GENERATOR_MARK not in head:
        raise FileExistsError(
            f"{folder}: a folder that is not a vf-mm report (no {INDEX_NAME} written by "
            "vf-mm view); choose another folder, or remove it"
        )


def _replace_folder(folder: Path, tmp: Path) -> None:
    """Put ``tmp`` where ``folder`` is: the old folder moves aside, the new one takes its
    name, then the old one is removed (a reader sees the old report or the new one)."""
    if not folder.exists():
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp.rename(folder)
        return
    old = folder.with_name(f".{folder.name}.old-{os.getpid()}")
    shutil.rmtree(old, ignore_errors=True)
    folder.rename(old)
    try:
        tmp.rename(folder)
    except BaseException:
        old.rename(folder)
        raise
    shutil.rmtree(old, ignore_errors=True)


def _relative_url(root: Path, folder: Path) -> str:
    """The URL of the run directory ``root`` relative to pages in ``folder`` (``"../"``
    for ``OUTDIR/report``), each segment percent-encoded; ``""`` when they are one."""
    try:
        rel = os.path.relpath(root.resolve(), folder.resolve())
    except ValueError as exc:  # another drive (Windows): no relative URL reaches it
        raise ValueError(f"{folder}: no relative URL from there reaches {root} ({exc})") from exc
    if rel == os.curdir:
        return ""
    return "".join(urllib.parse.quote(part) + "/" for part in Path(rel).parts)
