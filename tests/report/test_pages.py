"""The paged report: every rollout on exactly one page, in order; pages that link each
other; the summary on the index, over the whole run; images linked from the run's
assets, lazily, under a CSP with no network source; and a real browser opening it from
file://."""

from __future__ import annotations

import base64
import hashlib
import json
import re
from html import unescape
from pathlib import Path

import pytest

from tests._browser import file_url, run_chromium
from tests.report._runs import Page, card_orders, write_run
from vf_mm.report import write_report
from vf_mm.report._internal import page_name
from vf_mm.report._pages import _pager
from vf_mm.report._run import _PageSummary

ASSET_SRC = re.compile(r"\.\./assets/[0-9a-f]{32}\.png")


def pages_of(folder: Path) -> list[Path]:
    """The report's pages in page order: the index, then page-0002.html, ..."""
    rest = sorted(folder.glob("page-*.html"))
    return [folder / "index.html", *rest]


@pytest.fixture
def paged(tmp_path):
    root = tmp_path / "run"
    rows = write_run(root, 23, error_every=7)
    written = write_report(root, page_size=5)
    return {"root": root, "rows": rows, "written": written, "folder": root / "report"}


def test_every_rollout_is_on_exactly_one_page_in_file_order(paged):
    written, folder, rows = paged["written"], paged["folder"], paged["rows"]
    assert written.paged and written.path == folder / "index.html"
    assert written.pages == 5 and written.rollouts_total == written.rollouts_shown == 23
    files = pages_of(folder)
    assert [f.name for f in files] == [page_name(n) for n in range(1, 6)]
    assert [f.name for f in files] == [
        "index.html",
        "page-0002.html",
        "page-0003.html",
        "page-0004.html",
        "page-0005.html",
    ]
    orders = [card_orders(Page.of(f)) for f in files]
    assert [len(o) for o in orders] == [5, 5, 5, 5, 3]
    assert [i for page in orders for i in page] == list(range(23))  # each once, in order
    examples = [
        a["data-example"] for f in files for a in Page.of(f).having("card", "article")
    ]  # the card is the row's: its example id, in file order
    assert examples == [str(row["example_id"]) for row in rows]
    for f in files:  # each rollout's text is on its page only
        text = Page.of(f).all_text
        shown = {int(i) for i in re.findall(r"rollout (\d+): what colour\?", text)}
        assert shown == set(card_orders(Page.of(f)))


def test_links_between_pages_resolve_to_files_that_exist(paged):
    folder = paged["folder"]
    files = pages_of(folder)
    for number, file in enumerate(files, start=1):
        page = Page.of(file)
        hrefs = [a["href"] for a in page.tags("a") if a.get("href")]
        local = [h for h in hrefs if not h.startswith(("#", "http://", "https://"))]
        assert local, file.name
        for href in local:
            target = (folder / href.split("#")[0]).resolve()
            assert target.is_file(), f"{file.name}: {href}"
            assert target.is_relative_to(folder.resolve())
        navs = page.tags("nav")
        assert len(navs) == 2  # above and below the cards

        def nav(cls, page=page):
            return [a["href"] for a in page.having(cls, "a")]

        if number > 1:
            assert nav("first") == ["index.html"] * 2
            assert nav("prev") == [page_name(number - 1)] * 2
        else:
            assert not nav("first") and not nav("prev")
        if number < len(files):
            assert nav("next") == [page_name(number + 1)] * 2
            assert nav("last") == [page_name(len(files))] * 2
        else:
            assert not nav("next") and not nav("last")
        assert nav("all") == ["index.html#pages"] * 2
        current = [t for t, a in page.elements if t == "b" and a.get("aria-current") == "page"]
        assert len(current) == 2
    # the index lists every page, in order
    html = files[0].read_text(encoding="utf-8")
    listed = re.search(r'<section class="panel pagelist" id="pages">(.*?)</section>', html, re.S)
    assert listed
    assert re.findall(r'href="([^"]+)"', listed.group(1)) == [f.name for f in files]


def test_the_navigation_window_names_near_pages_and_gaps():
    page = _PageSummary(10, 1800, 1999, "900", "999")
    pager = _pager(page, 40)
    assert [n for n, _ in pager["window"]] == [1, 0, 7, 8, 9, 10, 11, 12, 13, 0, 40]
    assert pager["prev"] == "page-0009.html" and pager["next"] == "page-0011.html"
    assert pager["first_url"] == "index.html" and pager["last_url"] == "page-0040.html"
    first = _pager(_PageSummary(1, 0, 199, "0", "99"), 3)
    assert [n for n, _ in first["window"]] == [1, 2, 3] and first["prev"] == ""


def test_the_summary_is_on_the_index_and_covers_the_whole_run(tmp_path):
    root = tmp_path / "run"
    write_run(root, 23, error_every=7, finish=False)  # no stored aggregates: computed
    written = write_report(root, page_size=5, max_rollouts=12)
    files = pages_of(root / "report")
    assert len(files) == 3  # 12 rollouts shown, 5 a page
    index = Page.of(files[0])
    kinds = [(t, (a.get("class") or "").split()) for t, a in index.elements]
    panels = [i for i, (t, c) in enumerate(kinds) if t == "section" and "panel" in c]
    cards = [i for i, (t, c) in enumerate(kinds) if t == "article" and "card" in c]
    assert len(panels) == 3 and max(panels) < min(cards)  # run, results, pages: at the top
    aggregates = dict(
        re.findall(r"<tr><th>([^<]+)</th><td class=\"num\">([^<]*)</td></tr>", files[0].read_text())
    )
    assert aggregates["count"] == "23"  # every rollout, not the 12 shown
    assert aggregates["errors"] == "4 of 23"  # 0, 7, 14, 21
    assert "computed from results.jsonl" in index.all_text
    assert "showing the first 12 of 23 rollouts" in index.all_text
    assert any("showing the first 12 of 23" in w for w in written.warnings)
    for other in files[1:]:  # the other pages: their cards, no summary
        page = Page.of(other)
        assert not [a for t, a in page.elements if a.get("id") in ("aggregates", "pages")]
        assert "page" in page.all_text and "summary & all pages" in page.all_text

    # a finished run: the stored aggregates, the same numbers
    finished = tmp_path / "finished"
    write_run(finished, 23, error_every=7)
    write_report(finished, page_size=5)
    text = (finished / "report" / "index.html").read_text()
    assert '<tr><th>count</th><td class="num">23</td></tr>' in text
    assert "computed from results.jsonl" not in text


def test_images_are_linked_relative_lazy_and_confined_under_a_csp_without_network(paged):
    root, folder = paged["root"], paged["folder"]
    for file in pages_of(folder):
        page = Page.of(file)
        imgs = page.tags("img")
        assert imgs, file.name
        for img in imgs:
            assert ASSET_SRC.fullmatch(img["src"] or ""), img["src"]
            assert img["loading"] == "lazy"
            target = (folder / img["src"]).resolve()
            assert target.is_file() and target.is_relative_to((root / "assets").resolve())
        thumbs = [a for a in imgs if "imgocc" in (a.get("class") or "")]
        assert all(a.get("width") and a.get("height") for a in thumbs)  # laid out before load
        # one lightbox per distinct image on the page, not per run
        distinct = {a["src"] for a in thumbs}
        assert len(page.having("lightbox")) == len(distinct) <= 3
        assert "data:image" not in file.read_text()  # nothing embedded

        csp = page.csp
        directives = dict(d.strip().split(" ", 1) for d in csp.split(";"))
        assert directives["default-src"] == "'none'"
        assert directives["img-src"] == "'self'" and directives["media-src"] == "'self'"
        assert not re.search(r"https?:|\*|data:|blob:|file:", csp)  # no network source
        digest = base64.b64encode(hashlib.sha256("".join(page.script_text).encode()).digest())
        assert directives["script-src"] == f"'sha256-{digest.decode()}'"
        assert len(page.tags("script")) == 1


def test_a_torn_results_line_is_reported_as_a_warning(tmp_path):
    root = tmp_path / "run"
    write_run(root, 12, finish=False)
    with open(root / "results.jsonl", "ab") as f:
        f.write(b'{"example_id": 6, "rollout_index": 0, "prompt": [{"ro')  # a writer killed
    written = write_report(root, page_size=5)
    assert written.paged and written.rollouts_total == 12
    (torn,) = [w for w in written.warnings if "torn" in w]
    assert "line 13" in torn
    index = Page.of(root / "report" / "index.html")
    assert torn in index.all_text
    assert [i for f in pages_of(root / "report") for i in card_orders(Page.of(f))] == list(
        range(12)
    )


def test_a_missing_asset_is_a_placeholder_on_its_page_and_counted_on_the_index(tmp_path):
    root = tmp_path / "run"
    rows = write_run(root, 12, distinct=3)
    gone = rows[7]["prompt"][0]["content"][1]["image_url"]["url"]
    (root / gone).unlink()  # rollouts 1, 4, 7, 10 show it
    written = write_report(root, page_size=5)
    (flagged,) = [w for w in written.warnings if "have warnings" in w]
    assert flagged.startswith("4 rollout(s)") and "page(s) 1, 2, 3" in flagged
    page = Page.of(root / "report" / "page-0002.html")  # rollouts 5..9: 7 shows it
    assert len(page.having("img-missing")) == 1
    assert "asset not found" in page.all_text
    assert "1 rollout(s) on this page have warnings" in page.all_text


# ------------------------------------------------------------------------------------------
# a real browser, from file://


def selftest(path: Path) -> dict:
    proc = run_chromium(
        "--dump-dom",
        "--virtual-time-budget=5000",
        "--run-all-compositor-stages-before-draw",
        url=file_url(path, "selftest"),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    found = re.search(r'<pre id="selftest">(.*?)</pre>', proc.stdout, re.S)
    assert found, f"the self-test did not report; chromium said: {proc.stderr[-2000:]}"
    return json.loads(unescape(found.group(1)))


def test_the_index_and_a_page_open_from_file_urls_and_their_images_load(tmp_path):
    root = tmp_path / "run"
    write_run(root, 9, distinct=3, error_every=4)
    write_report(root, page_size=4)
    folder = root / "report"
    for name, cards in (("index.html", 4), ("page-0002.html", 4), ("page-0003.html", 1)):
        result = selftest(folder / name)
        assert result["cards"] == cards, name
        assert result["images"] == cards and result["missing"] == 0
        assert result["loaded"] == result["images"], name  # every linked image decodes
        assert result["lazy"] == cards  # and each is lazy
    # the errors-only filter works on a page
    assert selftest(folder / "index.html")["errors_only"] == ["r0"]
