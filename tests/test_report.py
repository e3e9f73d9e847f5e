"""`vf-mm view`: the self-contained HTML report, checked as markup and in a real browser."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import re
import shutil
from html import unescape
from html.parser import HTMLParser
from pathlib import Path

import pytest
from PIL import Image, ImageDraw

from tests._browser import file_url, run_chromium
from vf_mm.cli import main
from vf_mm.report import TEXT_MAX_CHARS, TEXT_PREVIEW_CHARS, make_report

INJECT_SCRIPT = "<script>document.documentElement.dataset.pwned='script'</script>"
INJECT_IMG = "<img src=x onerror=\"document.documentElement.dataset.pwned='img'\">"
HUGE = "".join(f"line {i}: " + "lorem ipsum " * 8 + "\n" for i in range(600))


# ------------------------------------------------------------------------------------------
# a fake run directory


def _png(root: Path, size: tuple[int, int], colour: tuple[int, int, int]) -> str:
    im = Image.new("RGB", size, colour)
    draw = ImageDraw.Draw(im)
    w, h = size
    draw.rectangle([w // 4, h // 4, 3 * w // 4, 3 * h // 4], fill=(255, 255, 255))
    draw.line([0, 0, w - 1, h - 1], fill=(0, 0, 0), width=max(1, w // 32))
    buf = io.BytesIO()
    im.save(buf, format="PNG")
    data = buf.getvalue()
    name = f"assets/{hashlib.sha256(data).hexdigest()[:16]}.png"
    (root / name).write_bytes(data)
    return name


def _img(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


def _txt(text: str) -> dict:
    return {"type": "text", "text": text}


def make_run(root: Path, *, metadata: bool = True) -> dict:
    """A run directory: 5 rollouts over 3 examples, 3 distinct PNGs used 6 times."""
    (root / "assets").mkdir(parents=True)
    red = _png(root, (256, 192), (220, 30, 30))
    blue = _png(root, (480, 320), (30, 60, 220))
    tiny = _png(root, (8, 8), (20, 160, 60))
    system = {"role": "system", "content": "You are a careful visual assistant."}
    prompt0 = [system, {"role": "user", "content": [_txt("What shape is here?"), _img(red)]}]
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "zoom", "arguments": json.dumps({"x": 10, "y": 20, "factor": 2})},
    }
    rows = [
        {  # multi-turn with a tool call, reasoning and an image in the tool result
            "example_id": 0,
            "rollout_index": 0,
            "prompt": prompt0,
            "completion": [
                {
                    "role": "assistant",
                    "content": "Let me zoom in.",
                    "reasoning_content": "The picture is small; zooming helps.",
                    "tool_calls": [call],
                },
                {
                    "role": "tool",
                    "tool_call_id": "call_1",
                    "content": [_txt("zoomed:"), _img(blue)],
                },
                {"role": "assistant", "content": "A white square on red. Answer: square"},
            ],
            "answer": "square",
            "info": {"difficulty": "easy"},
            "reward": 1.0,
            "metrics": {"correct": 1.0, "format": 1.0},
            "error": None,
            "num_turns": 2,
            "prompt_tokens": 812,
            "completion_tokens": 64,
            "timing": {"generation_ms": 1234.5, "scoring_ms": 3.25},
        },
        {  # injection attempts in model text, a tool name and the answer
            "example_id": 0,
            "rollout_index": 1,
            "prompt": prompt0,
            "completion": [
                {
                    "role": "assistant",
                    "content": [_txt(INJECT_SCRIPT), _txt(INJECT_IMG), _img(red)],
                    "tool_calls": [
                        {
                            "id": "x",
                            "type": "function",
                            "function": {"name": "<b>evil</b>", "arguments": "{not json"},
                        }
                    ],
                }
            ],
            "answer": INJECT_IMG,
            "info": {},
            "reward": 0.0,
            "metrics": {"correct": 0.0, "format": 0.0},
            "error": None,
            "num_turns": 1,
            "prompt_tokens": 812,
            "completion_tokens": 30,
            "timing": {},
        },
        {  # an error rollout: no reward, no completion
            "example_id": 1,
            "rollout_index": 0,
            "prompt": [{"role": "user", "content": [_txt("Count the dots."), _img(tiny)]}],
            "completion": [],
            "answer": 3,
            "info": {},
            "reward": None,
            "metrics": {},
            "error": {
                "type": "BackendUnavailableError",
                "message": "connection refused <b>not bold</b>",
                "where": "turn 1: model",
            },
            "num_turns": 0,
            "prompt_tokens": None,
            "completion_tokens": None,
            "timing": {},
        },
        {  # a missing asset, a remote image, a NaN reward and a huge message
            "example_id": 1,
            "rollout_index": 1,
            "prompt": [
                {
                    "role": "user",
                    "content": [
                        _txt("Count the dots."),
                        _img("assets/0000deadbeef0000.png"),
                        _img("https://example.com/remote.png"),
                    ],
                }
            ],
            "completion": [{"role": "assistant", "content": HUGE}],
            "answer": 3,
            "info": {},
            "reward": float("nan"),
            "metrics": {"correct": 0.0},
            "error": None,
            "num_turns": 1,
            "prompt_tokens": 100,
            "completion_tokens": 9000,
            "timing": {},
        },
        {  # a string example id and a mid reward
            "example_id": "ex-<2>",
            "rollout_index": 0,
            "prompt": [{"role": "user", "content": [_img(tiny), _txt("Colour?")]}],
            "completion": [{"role": "assistant", "content": "green"}],
            "answer": "green",
            "info": {},
            "reward": 0.5,
            "metrics": {"correct": 0.5},
            "error": None,
            "num_turns": 1,
            "prompt_tokens": 50,
            "completion_tokens": 2,
            "timing": {},
        },
    ]
    with (root / "results.jsonl").open("w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")  # NaN is written as JSON's NaN extension
    if metadata:
        meta = {
            "config": {
                "env_id": "vision-shapes",
                "env_args": {"split": "test"},
                "model": "tiny-qwen-vl",
                "backend": "local",
                "num_examples": 3,
                "rollouts_per_example": 2,
                "sampling_args": {"temperature": 0.7, "max_tokens": 256},
            },
            "started_at": "2025-01-01T10:00:00+00:00",
            "finished_at": "2025-01-01T10:02:30+00:00",
            "vf_mm_version": "0.1.0",
            "results": {
                "count": 5,
                "errors": 1,
                "reward": {"mean": 0.375, "std": 0.41},
                "metrics": {"correct": {"mean": 0.375, "std": 0.41}},
                "pass_at_k": {"1": 0.375, "2": 0.5},
                "tokens": {"prompt": {"mean": 443.5}, "completion": {"mean": 2274}},
                "mean_turns": 1.0,
            },
        }
        (root / "metadata.json").write_text(json.dumps(meta))
    images = sum(
        1
        for row in rows
        for msg in row["prompt"] + row["completion"]
        if isinstance(msg["content"], list)
        for part in msg["content"]
        if part["type"] == "image_url"
    )
    return {"rows": rows, "images": images, "assets": {"red": red, "blue": blue, "tiny": tiny}}


@pytest.fixture
def run(tmp_path):
    outdir = tmp_path / "run"
    info = make_run(outdir)
    info["outdir"] = outdir
    return info


# ------------------------------------------------------------------------------------------
# markup checks with html.parser


_VOID = frozenset({"meta", "link", "br", "img", "input", "hr", "source", "wbr"})


class Page(HTMLParser):
    """Elements (tag, attrs) and text, as a browser's parser sees them."""

    def __init__(self, html: str) -> None:
        super().__init__(convert_charrefs=True)
        self.elements: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []
        self.script_text: list[str] = []
        self._stack: list[str] = []
        self.feed(html)
        self.close()

    def handle_starttag(self, tag, attrs):
        self.elements.append((tag, dict(attrs)))
        if tag not in _VOID:
            self._stack.append(tag)

    def handle_endtag(self, tag):
        if tag in self._stack:
            while self._stack.pop() != tag:
                pass

    def handle_data(self, data):
        if self._stack and self._stack[-1] == "script":
            self.script_text.append(data)
        else:
            self.text.append(data)

    def having(self, cls: str, tag: str | None = None) -> list[dict[str, str | None]]:
        return [
            a
            for t, a in self.elements
            if (tag is None or t == tag) and cls in (a.get("class") or "").split()
        ]

    @property
    def all_text(self) -> str:
        return "".join(self.text)


def test_report_structure_images_and_escaping(run):
    html = make_report(run["outdir"]).html
    page = Page(html)

    cards = page.having("card", "article")
    assert [c["id"] for c in cards] == ["r0", "r1", "r2", "r3", "r4"]
    assert [c["data-example"] for c in cards] == ["0", "0", "1", "1", "ex-<2>"]
    assert [c["data-reward"] for c in cards] == ["1.0", "0.0", "", "", "0.5"]
    assert "has-error" in cards[2]["class"] and "data-error" in cards[2]
    assert "BackendUnavailableError: connection refused <b>not bold</b> (turn 1: model)" in (
        page.all_text
    )  # the error as one line: type, message, where
    assert all("data-error" not in c for i, c in enumerate(cards) if i != 2)

    # every image use is drawn; 3 distinct PNGs are embedded once each
    assert len(page.having("imgocc")) == run["images"] == 8
    assert len(page.having("img-missing")) == 1
    assert len(page.having("img-remote")) == 1
    assert len(page.having("lightbox")) == 3
    for name in run["assets"].values():
        b64 = base64.b64encode((run["outdir"] / name).read_bytes()).decode()
        assert html.count(b64) == 1
    assert "example.com" not in "".join(
        s for s in re.findall(r"url\([^)]*\)", html)
    )  # remote images are links only, never fetched

    # model text arrives as text, never as markup: one script (ours), no handlers, no <img>
    assert [t for t, _ in page.elements].count("script") == 1
    assert not [t for t, _ in page.elements if t == "img"]
    assert not [a for _, a in page.elements for k in a if k.lower().startswith("on")]
    assert INJECT_SCRIPT in page.all_text and INJECT_IMG in page.all_text
    assert "<b>evil</b>" in page.all_text and "<b>not bold</b>" in page.all_text
    assert "&lt;script&gt;document.documentElement" in html
    assert "&lt;img src=x onerror=" in html
    assert "document.documentElement.dataset.pwned" not in "".join(page.script_text)

    # CSP: nothing from the network, and only the script whose hash it names may run
    (csp,) = [
        a["content"] for t, a in page.elements if a.get("http-equiv") == "Content-Security-Policy"
    ]
    assert "default-src 'none'" in csp and "img-src data:" in csp
    digest = base64.b64encode(hashlib.sha256("".join(page.script_text).encode()).digest())
    assert f"'sha256-{digest.decode()}'" in csp

    # card contents
    text = page.all_text
    assert "zoom" in text and '"factor": 2' in text  # tool call: name + pretty JSON arguments
    assert "arguments are not valid JSON" in text
    assert "The picture is small; zooming helps." in text
    assert len(page.having("reasoning", "details")) == 1
    assert "BackendUnavailableError: connection refused" in text
    assert "asset not found (placeholder shown)" in text
    rewards = page.having("reward", "span")
    assert [r["class"].split()[1] for r in rewards] == ["ok", "ok", "none", "nonfinite", "ok"]
    assert "hsl(120" in rewards[0]["style"] and "hsl(0 " in rewards[1]["style"]

    # the huge message: a preview, the rest behind "show more", nothing lost
    assert len(page.having("more", "details")) >= 1
    unfolded = re.sub(r"show more \([\d,]+ more characters\)show less", "", text)
    assert HUGE.strip() in unfolded  # every character is there, preview + fold
    assert HUGE[: TEXT_PREVIEW_CHARS // 2] in text

    # header: config and aggregates
    for needle in (
        "vision-shapes",
        "tiny-qwen-vl",
        "pass@2",
        "0.375 ± 0.41",
        "2 min 30 s",
        "1 of 5",
    ):
        assert needle in text, needle
    assert "temperature" in text


def test_injection_through_ids_and_metadata_is_escaped(tmp_path):
    root = tmp_path / "run"
    make_run(root)
    meta = json.loads((root / "metadata.json").read_text())
    meta["config"]["model"] = INJECT_SCRIPT
    meta["config"]["env_id"] = '"><svg onload=alert(1)>'
    (root / "metadata.json").write_text(json.dumps(meta))
    row = {
        "example_id": '"><script>alert(1)</script>',
        "reward": 1,
        "prompt": "p",
        "completion": "c",
    }
    with (root / "results.jsonl").open("a") as f:
        f.write(json.dumps(row) + "\n")
    page = Page(make_report(root).html)
    assert [t for t, _ in page.elements].count("script") == 1
    assert not [t for t, _ in page.elements if t == "svg"]
    assert page.having("card", "article")[-1]["data-example"] == row["example_id"]
    assert INJECT_SCRIPT in page.all_text


def test_missing_metadata_empty_and_torn_results(tmp_path):
    root = tmp_path / "run"
    make_run(root, metadata=False)
    lines = (root / "results.jsonl").read_text().splitlines(keepends=True)
    (root / "results.jsonl").write_text("".join(lines[:3]) + lines[3][:50])  # torn last line
    report = make_report(root)
    page = Page(report.html)
    assert len(page.having("card", "article")) == 3
    assert any("metadata.json is missing" in w for w in report.warnings)
    assert any("line 4" in w and "torn" in w for w in report.warnings)
    assert "computed from results.jsonl" in page.all_text
    assert "0.5 ± 0.5" in page.all_text  # rewards 1, 0 (null skipped)

    (root / "results.jsonl").write_text("")
    page = Page(make_report(root).html)
    assert not page.having("card", "article")
    assert "No rollouts in results.jsonl." in page.all_text

    with pytest.raises(FileNotFoundError):
        make_report(tmp_path / "nope")
    with pytest.raises(FileNotFoundError):
        make_report(tmp_path)  # a directory, but not a run directory


def test_odd_values_do_not_crash(tmp_path):
    root = tmp_path / "run"
    (root / "assets").mkdir(parents=True)
    secret = tmp_path / "secret.png"
    Image.new("RGB", (4, 4)).save(secret)
    (root / "assets" / "bad.png").write_bytes(b"not a png")
    rows = [
        {"reward": float("inf"), "prompt": "plain prompt", "completion": "plain completion"},
        {"reward": "high", "metrics": {"m": None}, "completion": [{"role": "assistant"}]},
        {"example_id": 7, "prompt": [{"role": "user", "content": [_img("../secret.png")]}]},
        {"prompt": [{"role": "user", "content": [_img("assets/bad.png"), _img(None), 5]}]},
        {"prompt": [{"role": "user", "content": [_img("javascript:alert(1)")]}]},
        {"prompt": [{"role": "user", "content": "\ud800 lone surrogate"}], "reward": 10**400},
        {"completion": [{"role": "assistant", "content": "x" * (TEXT_MAX_CHARS + 5000)}]},
    ]
    data_url = "data:image/png;base64," + base64.b64encode(secret.read_bytes()).decode()
    rows.append({"prompt": [{"role": "user", "content": [_img(data_url)]}], "reward": -2.5})
    (root / "results.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n[1, 2]\n")
    report = make_report(root)
    page = Page(report.html)
    assert len(page.having("card", "article")) == len(rows)
    text = page.all_text
    assert "outside the run directory" in text
    assert "unreadable image" in text
    assert "unsupported URL scheme 'javascript'" in text
    assert "no image URL" in text
    assert "∞" in text and "plain completion" in text
    assert "5,000 more characters not included in this report" in text
    assert len(page.having("img-missing")) == 4
    assert report.images_embedded == 1  # the data: URL
    assert any("line 9: a JSON list, not an object" in w for w in report.warnings)
    report.html.encode("utf-8")  # the lone surrogate is shown as its escape, not as "?"
    assert "\\ud800 lone surrogate" in text


def test_cli_writes_the_report(run, capsys):
    outdir = run["outdir"]
    assert main(["view", str(outdir)]) == 0
    html = (outdir / "report.html").read_text(encoding="utf-8")
    assert len(Page(html).having("card", "article")) == 5
    assert "report.html" in capsys.readouterr().out

    out = outdir.parent / "elsewhere" / "small.html"
    assert main(["view", str(outdir), "-o", str(out), "--max-rollouts", "2"]) == 0
    page = Page(out.read_text(encoding="utf-8"))
    assert len(page.having("card", "article")) == 2
    assert "showing the first 2 of 5 rollouts" in page.all_text
    assert "2 of 5 rollouts" in capsys.readouterr().out

    assert main(["view", str(outdir.parent / "missing")]) == 1
    assert "not a directory" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["view", str(outdir), "--max-rollouts", "-1"])


# ------------------------------------------------------------------------------------------
# a real browser: every image decodes, the JS sorts and filters, nothing injected runs


def test_report_in_headless_chromium(run, tmp_path):
    report = run["outdir"] / "report.html"
    assert main(["view", str(run["outdir"])]) == 0

    proc = run_chromium(
        "--dump-dom",
        "--virtual-time-budget=5000",
        "--run-all-compositor-stages-before-draw",
        url=file_url(report, "selftest"),
    )
    dom = proc.stdout
    assert proc.returncode == 0, proc.stderr[-2000:]
    m = re.search(r'<pre id="selftest">(.*?)</pre>', dom, re.S)
    assert m, f"the self-test did not report; chromium said: {proc.stderr[-2000:]}"
    result = json.loads(unescape(m.group(1)))
    assert result["images"] == run["images"] == 8
    assert result["missing"] == 1 and result["remote"] == 1
    assert result["loaded"] == result["images"] - 2  # every embedded image decoded
    assert result["cards"] == 5
    assert result["sorted_desc"] == ["r0", "r4", "r1", "r2", "r3"]  # no/NaN reward last
    assert result["sorted_asc"] == ["r1", "r4", "r0", "r2", "r3"]
    assert result["errors_only"] == ["r2"]
    html_tag = re.search(r"<html[^>]*>", dom).group(0)
    assert "pwned" not in html_tag  # neither injected script nor onerror handler ran
    assert '<div class="controls" id="controls">' in dom  # JS ran and showed the controls

    # without JS (the page's one script cut out; --dump-dom itself needs JS): file order,
    # the controls (useless then) stay hidden, the report still reads
    nojs = tmp_path / "nojs.html"
    nojs.write_text(re.sub(r"<script>.*?</script>", "", report.read_text(), flags=re.S))
    proc = run_chromium("--dump-dom", url=file_url(nojs))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert '<div class="controls" id="controls" hidden="">' in proc.stdout
    assert re.findall(r'<article class="card[^"]*" id="(r\d)"', proc.stdout) == [
        "r0",
        "r1",
        "r2",
        "r3",
        "r4",
    ]

    shot = tmp_path / "report.png"
    proc = run_chromium(f"--screenshot={shot}", url=file_url(report))
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = shot.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 20_000
    with Image.open(shot) as im:
        assert im.size == (1280, 2000)
        rgb = im.convert("RGB")
        colours = rgb.getcolors(maxcolors=1 << 20) or []
    assert len(colours) > 50  # a rendered page, not a blank one
    assert any(c == (220, 30, 30) and n > 500 for n, c in colours)  # the red asset is visible
    if os.environ.get("VF_MM_SCREENSHOT_DIR"):
        shutil.copy(shot, Path(os.environ["VF_MM_SCREENSHOT_DIR"]) / "report.png")


def test_a_file_another_tool_wrote_is_shown_and_summed_over_its_numbers(tmp_path):
    root = tmp_path / "run"
    root.mkdir()
    lines = [
        '{"example_id": 0, "reward": 1.0, "metrics": {"m": 1}}',
        '{"example_id": 1, "reward": NaN, "metrics": {"m": "n/a"}}',
        '{"example_id": 2, "reward": "high"}',
        '{"example_id": 3, "reward": 0.0, "metrics": {"m": 0}}',  # no newline at the end
    ]
    (root / "results.jsonl").write_text("\n".join(lines))
    report = make_report(root)
    assert report.rollouts_total == 4  # the whole last line is shown, not taken for torn
    assert any("3 value(s)" in w and "not finite numbers" in w for w in report.warnings)
    text = Page(report.html).all_text
    assert "0.5 ± 0.5" in text  # the reward over the two numbers, not NaN
    assert "NaN ± NaN" not in text
