"""The paged report's security rule: a page shows an image only by a URL the report built
to a file inside the run's ``assets/``; every other reference a row holds is text."""

from __future__ import annotations

import base64
import io
import json
import re

import pytest
from PIL import Image

from tests.report._runs import Page, write_run
from vf_mm.report import _links as links
from vf_mm.report import write_report
from vf_mm.report._links import _LinkedAssets

HEX = "0123456789abcdef0123456789abcdef"


def png(colour=(200, 0, 0), size=(20, 10), fmt="PNG") -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, colour).save(buf, format=fmt)
    return buf.getvalue()


def img_part(url) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


@pytest.fixture
def hostile(tmp_path):
    """A run whose rows name images every way but the one the store writes."""
    root = tmp_path / "run"
    (root / "assets").mkdir(parents=True)
    secret = tmp_path / "secret.png"
    secret.write_bytes(png((0, 0, 200)))
    good = f"assets/{HEX}.png"
    (root / good).write_bytes(png())
    (root / "assets" / f"{'1' * 32}.png").symlink_to(secret)  # a link out of assets/
    (root / "assets" / f"{'2' * 32}.png").write_bytes(b"not an image at all")
    (root / "assets" / f"{'3' * 32}.png").write_bytes(png(fmt="TIFF"))  # not for browsers
    (root / "inside.png").write_bytes(png())  # in the run directory, outside assets/
    data_url = "data:image/png;base64," + base64.b64encode(png()).decode()
    refs = {
        "good": good,
        "dotdot": "../secret.png",
        "dotdot_in_assets": f"assets/../../{secret.name}",
        "absolute": str(secret),
        "file_url": secret.as_uri(),
        "data_url": data_url,
        "javascript": "javascript:alert(1)",
        "upper_hex": f"assets/{HEX.upper()}.png",
        "svg": f"assets/{HEX}.svg",
        "query": f"{good}?x=1",
        "fragment": f"{good}#x",
        "dot_slash": f"./{good}",
        "backslash": f"assets\\{HEX}.png",
        "symlink_out": f"assets/{'1' * 32}.png",
        "not_image": f"assets/{'2' * 32}.png",
        "tiff": f"assets/{'3' * 32}.png",
        "missing": f"assets/{'4' * 32}.png",
        "outside_assets": "inside.png",
        "none": None,
    }
    rows = [
        {
            "example_id": i,
            "rollout_index": 0,
            "prompt": [
                {"role": "user", "content": [{"type": "text", "text": name}, img_part(ref)]}
            ],
            "completion": [{"role": "assistant", "content": "ok"}],
            "reward": 1.0,
        }
        for i, (name, ref) in enumerate(refs.items())
    ]
    rows.append(
        {
            "example_id": 99,
            "rollout_index": 0,
            "prompt": [{"role": "user", "content": [img_part("https://example.com/far.png")]}],
            "reward": 0.0,
        }
    )
    (root / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {"root": root, "refs": refs, "secret": secret, "rows": rows}


def test_only_the_runs_own_asset_files_become_image_sources(hostile):
    root = hostile["root"]
    written = write_report(root, single_file=False, page_size=100)
    html = (root / "report" / "index.html").read_text(encoding="utf-8")
    page = Page(html)
    srcs = {a["src"] for a in page.tags("img")}
    assert srcs == {f"../assets/{HEX}.png"}  # one file: the good one, by our own URL
    for _, attrs in page.elements:  # no other attribute names a file or URL of the rows
        for key in ("src", "href", "poster", "srcset"):
            value = attrs.get(key) or ""
            assert hostile["secret"].name not in value and "javascript:" not in value
            assert "data:" not in value and not value.startswith("file:")
    # every other reference is text, with why
    missing = page.having("img-missing")
    assert len(missing) == len(hostile["refs"]) - 1
    text = page.all_text
    assert "an inline data: URL; a paged report links only the run's image files" in text
    assert "a 'javascript' URL, not one of the run's assets; shown as text" in text
    assert "a 'file' URL, not one of the run's assets" in text
    assert "not one of the run's assets (assets/<hash>.<ext>)" in text
    assert "outside the run's assets/ folder (a link out of it); not shown" in text
    assert "unreadable image" in text
    assert "a TIFF image, which browsers do not show" in text
    assert "asset not found" in text
    assert "no image URL" in text
    # an http(s) image is a link, never fetched
    (remote,) = page.having("img-remote")
    assert [a["href"] for a in page.tags("a") if "example.com" in (a.get("href") or "")] == [
        "https://example.com/far.png"
    ]
    assert remote is not None
    assert written.images == 3  # files opened for their size: good, not_image, tiff


def test_a_symlinked_assets_folder_is_followed_but_a_link_out_of_it_is_not(tmp_path):
    root = tmp_path / "run"
    elsewhere = tmp_path / "store"
    elsewhere.mkdir()
    root.mkdir()
    (root / "assets").symlink_to(elsewhere)  # assets/ itself lives elsewhere: fine
    (elsewhere / f"{HEX}.png").write_bytes(png())
    row = {
        "example_id": 0,
        "rollout_index": 0,
        "prompt": [{"role": "user", "content": [img_part(f"assets/{HEX}.png")]}],
    }
    (root / "results.jsonl").write_text(json.dumps(row) + "\n")
    write_report(root, single_file=False)
    page = Page.of(root / "report" / "index.html")
    assert [a["src"] for a in page.tags("img") if "imgocc" in (a.get("class") or "")] == [
        f"../assets/{HEX}.png"
    ]


def test_the_memo_of_resolved_references_is_bounded(tmp_path, monkeypatch):
    root = tmp_path / "run"
    rows = write_run(root, 10, distinct=5)
    monkeypatch.setattr(links, "MEMO_ENTRIES", 2)
    assets = _LinkedAssets(root, run_url="../", frames=tmp_path / "frames", frames_url="frames/")
    refs = [row["prompt"][0]["content"][1]["image_url"]["url"] for row in rows]
    views = [assets.view(ref) for ref in refs]
    assert len(assets._memo) == 2
    assert assets.images_resolved == 10  # 5 distinct, each forgotten before it came back
    assert all(
        v["type"] == "asset" and v["asset"].src == "../" + r
        for v, r in zip(views, refs, strict=True)
    )
    shown, _ = assets.take_page()
    assert len(shown) == 5 and assets.take_page() == ([], [])  # per page, then forgotten
    # what a reference resolved to does not depend on what the memo forgot
    again = [assets.view(ref)["asset"] for ref in refs]
    assert [(a.width, a.height) for a in again] == [
        (v["asset"].width, v["asset"].height) for v in views
    ]


def test_the_single_file_still_embeds_what_it_embedded(hostile):
    """Single-file mode is unchanged: a data: URL is embedded, a path out of the run is not."""
    from vf_mm.report import make_report

    report = make_report(hostile["root"])
    page = Page(report.html)
    assert not page.tags("img")
    assert report.images_embedded >= 2  # the good file and the data: URL
    assert "outside the run directory; not embedded" in page.all_text
    urls = re.findall(r"url\(\"?([^\")]*)", report.html)
    assert urls and all(u.startswith("data:image/") for u in urls)
