"""`vf-mm view` with videos: each clip a strip of evenly spaced frames (embedded once, as
images are) with its frame count and rate, and one ``<video controls>`` player per
distinct file a browser plays; checked as markup and in a real browser."""

from __future__ import annotations

import base64
import io
import json
import re
from html import unescape
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests._browser import file_url, run_chromium
from tests.results._clips import encode, frames
from vf_mm.report import STRIP_FRAMES, make_report
from vf_mm.report._videos import browser_mime, data_url_bytes, strip_indices
from vf_mm.results import ResultsWriter, read_results
from vf_mm.types import RolloutOutput
from vf_mm.videos import load_video

INJECT = "<script>document.documentElement.dataset.pwned='video'</script>"


def video(source, **keys) -> dict:
    return {"type": "video", "video": source, **keys}


@pytest.fixture
def run(tmp_path) -> dict:
    """A run: a raw clip (.mkv), an H.264 MP4 and a VP9 WebM (players), an MPEG-4 AVI (no
    player), all shown in both rollouts, plus a remote clip and one that did not load."""
    raw = frames(1, t=9)
    files = {}
    for name, ext in [("mp4", "mp4"), ("webm", "webm"), ("avi", "avi")]:
        path = tmp_path / f"clip.{ext}"
        path.write_bytes(encode(frames(2 + len(files)), ext))
        files[name] = path
    prompt = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What moves?"},
                video(raw, frame_rate=4.0, num_frames=4),
                video(str(files["mp4"])),
                video(str(files["webm"])),
                video(str(files["avi"])),
                {"type": "video_url", "video_url": {"url": "https://example.com/far.mp4"}},
            ],
        }
    ]
    outdir = tmp_path / "run"
    with ResultsWriter(outdir, metadata={"config": {"env_id": "clips"}}) as writer:
        for r in range(2):
            completion = [{"role": "assistant", "content": f"the ball {r}"}]
            writer.write(RolloutOutput(0, prompt, completion, reward=float(r)), rollout_index=r)
        gone = [{"role": "user", "content": [video(str(tmp_path / "gone.mp4"))]}]
        writer.write(RolloutOutput(1, gone, []), rollout_index=0)
    return {"outdir": outdir, "raw": raw, "files": files}


def css_images(html: str) -> dict[str, bytes]:
    """Embedded image assets by CSS class: the PNG bytes."""
    return {
        cls: base64.b64decode(b64)
        for cls, b64 in re.findall(
            r'\.(a\d+)\{background-image:url\("data:image/png;base64,([^"]+)"\)', html
        )
    }


def strips(html: str) -> list[list[str]]:
    """Each video figure's strip: its frames' asset classes, in order."""
    return [
        re.findall(r'class="img vframe (a\d+)', figure)
        for figure in re.findall(r'<figure class="video vidocc".*?</figure>', html, re.S)
    ]


def test_every_video_shows_as_a_strip_with_its_facts(run):
    report = make_report(run["outdir"])
    html = report.html
    captions = [unescape(re.sub(r"<[^>]+>", "", c))
                for c in re.findall(r"<figcaption>(.*?)</figcaption>", html)]  # fmt: skip
    assert captions[:4] == [
        "video · 9 frames · 4 fps · 32×24 · mkv · sampled with num_frames 4",  # noqa: RUF001
        "video · 8 frames · 10 fps · 32×24 · mp4▶ play",  # noqa: RUF001
        "video · 8 frames · 10 fps · 32×24 · webm▶ play",  # noqa: RUF001
        "video · 8 frames · 10 fps · 32×24 · avi",  # noqa: RUF001
    ]  # fmt: skip
    assert captions[4:] == captions[:4]  # the second rollout shows the same clips
    assert [len(s) for s in strips(html)] == [STRIP_FRAMES] * 8
    assert report.videos_embedded == 4
    assert "3 videos" not in html and "5 videos" in html  # the cards count their videos


def test_the_strip_holds_the_clips_own_frames_evenly_spaced(run):
    html = make_report(run["outdir"]).html
    pngs = css_images(html)
    first = strips(html)[0]
    wanted = strip_indices(9)
    assert wanted == [0, 2, 3, 5, 6, 8]
    for cls, index in zip(first, wanted, strict=True):
        with Image.open(io.BytesIO(pngs[cls])) as im:
            assert np.array_equal(np.asarray(im.convert("RGB")), run["raw"][index])  # lossless


def test_each_clip_is_embedded_once_however_often_it_is_shown(run):
    html = make_report(run["outdir"]).html
    all_strips = strips(html)
    assert all_strips[:4] == all_strips[4:]  # the same classes: the frames embedded once
    assert len(css_images(html)) == len({c for s in all_strips for c in s}) == 4 * STRIP_FRAMES
    players = re.findall(
        r'<video controls preload="metadata" src="data:(video/[a-z0-9]+);base64,([^"]+)"', html
    )
    assert [mime for mime, _ in players] == ["video/mp4", "video/webm"]  # once each, no AVI
    assert base64.b64decode(players[0][1]) == run["files"]["mp4"].read_bytes()
    assert base64.b64decode(players[1][1]) == run["files"]["webm"].read_bytes()
    assert html.count('href="#play-v1"') == 2 and html.count('id="play-v1"') == 1


def test_remote_and_missing_clips_are_placeholders_with_warnings(run):
    report = make_report(run["outdir"])
    html = report.html
    assert html.count("remote video (not embedded)") == 2
    assert 'href="https://example.com/far.mp4"' in html
    assert not re.search(r'src="https?:', html)  # nothing is fetched
    csp = unescape(re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', html)[1])
    assert "media-src data:" in csp and "default-src 'none'" in csp
    assert report.warnings == []  # a remote clip is no fault
    row = read_results(run["outdir"])[2]
    assert row["prompt"][0]["content"][0]["type"] == "unavailable"  # shown as its record
    assert "gone.mp4" in html


def test_damaged_video_assets_are_placeholders_never_fatal(tmp_path):
    outdir = tmp_path / "run"
    (outdir / "assets").mkdir(parents=True)
    (outdir / "assets" / "bad.mp4").write_bytes(b"\x00\x00\x00\x18ftypisom" + b"\x00" * 40)
    (outdir / "assets" / "png.mkv").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 40)
    url = "data:video/webm;base64," + base64.b64encode(encode(frames(5), "webm")).decode()
    parts = [
        {"type": "video_url", "video_url": {"url": "assets/bad.mp4"}},
        {"type": "video_url", "video_url": {"url": "assets/png.mkv"}},
        {"type": "video_url", "video_url": {"url": "assets/none.mp4"}},
        {"type": "video_url", "video_url": {"url": "../../etc/passwd"}},
        {"type": "video_url", "video_url": {"url": "data:video/mp4,notbase64"}},
        {"type": "video_url", "video_url": {"url": INJECT}},
        {"type": "video_url", "video_url": {"url": 7}},
        {"type": "video", "video": url, "frame_rate": "fast"},  # another tool's part
    ]
    row = {"example_id": 0, "rollout_index": 0, "prompt": [{"role": "user", "content": parts}],
           "completion": [], "reward": 1}  # fmt: skip
    (outdir / "results.jsonl").write_text(json.dumps(row) + "\n")
    report = make_report(outdir)
    html = report.html
    missing = (
        r'<span class="vidocc vid-missing"[^>]*><b>[^<]*</b><span>(.*?)</span><span>(.*?)</span>'
    )
    reasons = re.findall(missing, html)
    assert len(reasons) == 7
    text = " ".join(unescape(r) for _, r in reasons)
    for expected in ["unreadable video", "PNG image", "asset not found", "outside the run directory",
                     "not base64", "no video URL"]:  # fmt: skip
        assert expected in text
    assert INJECT not in html and "&lt;script&gt;" in html
    assert report.warnings[1:] == ["1 rollout(s) have warnings (missing or unreadable images or "
                               "videos); see their cards"]  # fmt: skip
    assert len(re.findall(r'<ul class="cardwarn">.*?</ul>', html, re.S)[0].split("<li>")) == 8
    assert report.videos_embedded == 1 and "webm" in html  # the data: URL one is shown


def test_strip_indices_are_even_and_include_both_ends():
    assert strip_indices(0) == []
    assert strip_indices(1) == [0]
    assert strip_indices(3) == [0, 1, 2]
    assert strip_indices(6) == list(range(6))
    assert strip_indices(100) == [0, 20, 40, 59, 79, 99]
    for count in range(1, 40):
        got = strip_indices(count)
        assert got[0] == 0 and got[-1] == count - 1 and got == sorted(set(got))
        assert len(got) == min(STRIP_FRAMES, count)


def test_which_files_a_browser_plays():
    clip = frames(6)
    assert browser_mime(encode(clip, "mp4")) == "video/mp4"  # H.264
    assert browser_mime(encode(clip, "webm")) == "video/webm"  # VP9
    for ext in ("mkv", "avi", "ts", "mov"):  # MPEG-4 part 2, MPEG-2, or not MP4/WebM
        assert browser_mime(encode(clip, ext)) is None
    assert browser_mime(b"not a video") is None
    assert data_url_bytes("data:video/mp4;base64,AAEC", max_bytes=10) == b"\x00\x01\x02"
    assert "not base64" in data_url_bytes("data:video/mp4,xyz", max_bytes=10)
    assert "over max_bytes" in data_url_bytes("data:video/mp4;base64," + "A" * 400, max_bytes=10)
    assert "image" in data_url_bytes("data:image/png;base64,AAEC", max_bytes=10)  # not a video


def test_a_file_without_a_rate_shows_the_parts(tmp_path):
    outdir = tmp_path / "run"
    with ResultsWriter(outdir, metadata={"config": {}}) as writer:
        prompt = [
            {"role": "user", "content": [video(frames(7)), video(frames(8), frame_rate=3.14159)]}
        ]
        writer.write(RolloutOutput(0, prompt, []), rollout_index=0)
    html = make_report(outdir).html
    assert "8 frames · frame rate unknown" in html and "8 frames · 3.142 fps" in html
    stored = read_results(outdir)[0]["prompt"][0]["content"][1]
    assert (
        load_video({**stored, "video_url": {"url": str(outdir / stored["video_url"]["url"])}}).fps
        == 3.14159
    )


def test_videos_in_headless_chromium(run, tmp_path):
    report = tmp_path / "report.html"
    report.write_text(make_report(run["outdir"]).html, encoding="utf-8")
    proc = run_chromium(
        "--dump-dom",
        "--virtual-time-budget=8000",
        "--autoplay-policy=no-user-gesture-required",
        url=file_url(report, "selftest"),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    m = re.search(r'<pre id="selftest">(.*?)</pre>', proc.stdout, re.S)
    assert m, f"the self-test did not report; chromium said: {proc.stderr[-2000:]}"
    result = json.loads(unescape(m.group(1)))
    assert result["videos"] == 2 * 5  # two rollouts of five clips (and an unavailable record)
    assert result["videos_missing"] == 0
    assert result["video_frames"] == result["video_frames_loaded"] == 8 * STRIP_FRAMES
    assert result["players"] == 2
    assert result["players_loaded"] == 2  # the browser reads both embedded files
    assert "pwned" not in re.search(r"<html[^>]*>", proc.stdout).group(0)


def test_the_cli_reports_a_run_with_videos(run, capsys):
    from vf_mm.cli import main

    assert main(["view", str(run["outdir"])]) == 0
    page = Path(run["outdir"] / "report.html").read_text(encoding="utf-8")
    assert page.count("<figure") == 8


def test_a_paged_report_links_the_clips_and_writes_their_strip_frames_once(run):
    from vf_mm.report import write_report

    written = write_report(run["outdir"], single_file=False, page_size=2)
    folder = run["outdir"] / "report"
    assert written.pages == 2 and written.videos == 4
    html = (folder / "index.html").read_text(encoding="utf-8")
    assert "data:" not in html  # nothing embedded
    srcs = re.findall(r'<img class="img vframe[^"]*" data-asset="[^"]+" src="([^"]+)"', html)
    assert len(srcs) == 8 * STRIP_FRAMES  # two rollouts, four clips each
    assert all(re.fullmatch(r"frames/[0-9a-f]{32}\.png", s) for s in srcs)
    frames_written = sorted(p.name for p in (folder / "frames").iterdir())
    assert len(frames_written) == len(set(srcs)) == 4 * STRIP_FRAMES  # each frame once
    first = strips_of_links(html)[0]
    for src, index in zip(first, strip_indices(9), strict=True):  # the clip's own frames
        with Image.open(folder / src) as im:
            assert np.array_equal(np.asarray(im.convert("RGB")), run["raw"][index])
    players = re.findall(r'<video controls preload="none" src="([^"]+)"></video>', html)
    assert len(players) == 2  # the MP4 and the WebM, once each on the page
    assert all(re.fullmatch(r"\.\./assets/[0-9a-f]{32}\.(mp4|webm)", p) for p in players)
    assert all((folder / p).resolve().is_file() for p in players)
    csp = unescape(re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', html)[1])
    assert "media-src 'self'" in csp and "img-src 'self'" in csp

    proc = run_chromium(
        "--dump-dom", "--virtual-time-budget=8000", url=file_url(folder / "index.html", "selftest")
    )
    m = re.search(r'<pre id="selftest">(.*?)</pre>', proc.stdout, re.S)
    assert m, f"the self-test did not report; chromium said: {proc.stderr[-2000:]}"
    result = json.loads(unescape(m.group(1)))
    assert result["video_frames"] == result["video_frames_loaded"] == 8 * STRIP_FRAMES
    assert result["players"] == result["players_loaded"] == 2  # the linked files play


def strips_of_links(html: str) -> list[list[str]]:
    """Each video figure's strip in a paged report: its frames' URLs, in order."""
    return [
        re.findall(r'class="img vframe[^"]*" data-asset="[^"]+" src="([^"]+)"', figure)
        for figure in re.findall(r'<figure class="video vidocc".*?</figure>', html, re.S)
    ]
