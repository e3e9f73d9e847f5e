"""``write_report`` and ``vf-mm view``: one file for a run that fits on a page (or when
asked), pages otherwise; where each goes; replaced atomically, never over a folder that
is not a report."""

from __future__ import annotations

import re

import pytest

from tests.report._runs import Page, card_orders, write_run
from vf_mm.cli import main
from vf_mm.report import (
    make_report,
    write_report,
)
from vf_mm.report._internal import PAGE_SIZE


@pytest.fixture
def small(tmp_path):
    root = tmp_path / "small"
    write_run(root, 6)
    return root


@pytest.fixture
def big(tmp_path):
    root = tmp_path / "big"
    write_run(root, 11, error_every=5)
    return root


def test_a_run_that_fits_on_a_page_is_one_self_contained_file_as_before(small):
    written = write_report(small)
    assert not written.paged and written.path == small / "report.html"
    assert written.pages == written.files == 1
    html = written.path.read_text(encoding="utf-8")
    assert html == make_report(small).html  # the single file, unchanged
    assert written.bytes == len(html.encode())
    page = Page(html)
    assert not page.tags("img") and not page.tags("nav")  # embedded, one page
    assert "img-src data:" in page.csp
    assert written.images == 3 and written.rollouts_total == 6
    assert not (small / "report").exists()


def test_a_longer_run_is_paged_and_either_kind_can_be_asked_for(big, small, tmp_path):
    written = write_report(big, page_size=4)
    assert written.paged and written.pages == 3 and written.path == big / "report" / "index.html"
    assert not (big / "report.html").exists()
    files = sorted(p.name for p in (big / "report").iterdir())
    assert files == ["index.html", "page-0002.html", "page-0003.html"]
    assert written.files == 3 and written.bytes == sum(
        p.stat().st_size for p in (big / "report").iterdir()
    )

    one = write_report(big, page_size=4, single_file=True)  # --single-file
    assert not one.paged and one.path == big / "report.html"
    assert card_orders(Page.of(one.path)) == list(range(11))

    paged = write_report(small, single_file=False)  # --pages on a short run: one page
    assert paged.paged and paged.pages == 1
    index = Page.of(paged.path)
    assert card_orders(index) == list(range(6)) and not index.tags("nav")
    assert index.tags("img")

    html = write_report(big, page_size=4, output=tmp_path / "mail.html")  # a file asked for
    assert not html.paged and (tmp_path / "mail.html").is_file()
    with pytest.raises(ValueError, match="a paged report is a folder"):
        write_report(big, output=tmp_path / "x.html", single_file=False)
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="page_size"):
            write_report(big, page_size=bad)
    with pytest.raises(FileNotFoundError):
        write_report(tmp_path / "nowhere")


def test_pages_elsewhere_link_back_to_the_runs_assets(big, tmp_path):
    out = tmp_path / "reports" / "big pages"
    written = write_report(big, page_size=4, output=out)
    assert written.path == out / "index.html"
    srcs = [a["src"] for a in Page.of(written.path).tags("img")]
    assert srcs and all(re.fullmatch(r"\.\./\.\./big/assets/[0-9a-f]{32}\.png", s) for s in srcs)
    assert all((out / s).resolve().is_file() for s in srcs)


def test_a_report_is_replaced_whole_and_nothing_else_is(big, tmp_path):
    write_report(big, page_size=2)  # 6 pages
    assert len(list((big / "report").glob("page-*.html"))) == 5
    write_report(big, page_size=4)  # 3 pages: no stale page of the old report is left
    assert sorted(p.name for p in (big / "report").iterdir()) == [
        "index.html",
        "page-0002.html",
        "page-0003.html",
    ]
    assert not [p for p in big.iterdir() if p.name.startswith(".report")]  # no temporaries

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="not a vf-mm report"):
        write_report(big, page_size=4, output=mine)
    assert (mine / "notes.txt").read_text() == "keep me"
    with pytest.raises(ValueError, match="holds the run directory"):
        write_report(big, page_size=4, output=big)
    with pytest.raises(ValueError, match="holds the run directory"):
        write_report(big, page_size=4, output=tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert write_report(big, page_size=4, output=empty).paged


def said(capsys) -> str:
    """What the command printed, without the terminal's line wrapping (or any space)."""
    return "".join(capsys.readouterr().out.split())


def test_vf_mm_view_writes_pages_or_one_file(big, small, capsys, tmp_path):
    with pytest.raises(SystemExit):
        main(["view", "--help"])
    assert f"(default{PAGE_SIZE})" in said(capsys)  # the CLI's default is the library's
    assert main(["view", str(big), "--page-size", "4"]) == 0
    out = said(capsys)
    assert "3pages" in out and "11rollouts" in out and "report/index.html" in out
    assert (big / "report" / "page-0003.html").is_file()

    assert main(["view", str(big), "--single-file"]) == 0
    assert "report.html" in capsys.readouterr().out and (big / "report.html").is_file()

    assert main(["view", str(small), "--pages"]) == 0
    assert "(1page," in said(capsys)

    assert main(["view", str(big), "--page-size", "4", "--max-rollouts", "5"]) == 0
    out = said(capsys)
    assert "5of11rollouts" in out and "2pages" in out

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "x").write_text("")
    assert main(["view", str(big), "--pages", "-o", str(mine)]) == 1
    assert "notavf-mmreport" in said(capsys)

    for bad in (["--single-file", "--pages"], ["--page-size", "0"]):
        with pytest.raises(SystemExit):
            main(["view", str(big), *bad])
