"""`vf-mm view` on long runs: the paged report against the single file, written and opened.

For each size N a synthetic run directory is written (``results.jsonl`` rows in the
documented format, ``metadata.json`` of an unfinished run so the summary is computed
from the file, and ``--distinct`` distinct 224x224 PNG assets in ``assets/``, each row
showing two of them over a two-turn rollout, one rollout in 97 an error). Then:

- ``vf-mm view OUTDIR`` (the paged report: ``OUTDIR/report/index.html`` + pages) is run
  in a subprocess: its wall time and peak RSS (``wait4``), the files and bytes written,
  the size of the index and of a middle page;
- headless chromium (the tests' flags, ``tests/_browser.py``) opens the index and the
  middle page from ``file://``, in a 1280x2000 frame of a probe page that notes the time
  of the frame's load event (DOM parsed, styles applied, the images in view loaded; the
  page under test keeps its own CSP): that time ("load s"), and the wall time of the
  whole headless ``--dump-dom`` run ("wall s": start-up and exit included; about:blank's
  is printed first), medians of ``--repeat`` runs;
- for the sizes up to ``--single-max`` (3000 by default), the same for
  ``vf-mm view --single-file`` (the old report: one file, every image embedded), side by
  side.

    python bench/report.py [--sizes 3000,100000] [--distinct 300] [--repeat 3]
                           [--single-max 3000] [--keep DIR]

The target (the issue): a 100k-rollout report opens in a browser in under 5 s.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(_ROOT))

from bench._machine import cpu_name  # noqa: E402
from tests._browser import file_url, run_chromium  # noqa: E402

#: the vf-mm command, with this interpreter
VF_MM = [sys.executable, "-c", "import sys; from vf_mm.cli import main; sys.exit(main())"]


def make_run(root: Path, n: int, *, distinct: int = 300, seed: int = 0) -> None:
    """A run directory of ``n`` rollouts (4 per example) over ``distinct`` PNG assets,
    written directly in the results format (no model, no environment)."""
    from PIL import Image, ImageDraw

    rng = random.Random(seed)
    (root / "assets").mkdir(parents=True, exist_ok=True)
    noise = Image.effect_noise((224, 224), 10).convert("RGB")
    names = []
    for _ in range(distinct):
        im = Image.new("RGB", (224, 224), tuple(rng.randrange(256) for _ in range(3)))
        draw = ImageDraw.Draw(im)
        for _ in range(6):
            x, y, r = rng.randrange(200), rng.randrange(200), rng.randrange(8, 40)
            draw.ellipse([x, y, x + r, y + r], fill=tuple(rng.randrange(256) for _ in range(3)))
        buf = io.BytesIO()
        Image.blend(im, noise, 0.015).save(buf, format="PNG")
        data = buf.getvalue()
        name = f"assets/{hashlib.sha256(data).hexdigest()[:32]}.png"
        (root / name).write_bytes(data)
        names.append(name)

    def image() -> dict:
        return {"type": "image_url", "image_url": {"url": rng.choice(names)}}

    with open(root / "results.jsonl", "w") as f:
        for i in range(n):
            example, rollout = divmod(i, 4)
            failed = i % 97 == 13
            completion = [
                {
                    "role": "assistant",
                    "content": "<think>Up, then right.</think><answer>up</answer>",
                },
                {"role": "user", "content": [{"type": "text", "text": "You moved up."}, image()]},
                {"role": "assistant", "content": "<answer>right</answer>"},
            ]
            row = {
                "example_id": example,
                "rollout_index": rollout,
                "prompt": [
                    {"role": "system", "content": "You navigate a grid. Answer with a move."},
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": f"Example {example}: where is the goal?"},
                            image(),
                        ],
                    },
                ],
                "completion": [] if failed else completion,
                "answer": "right",
                "info": {"seed": i},
                "reward": None if failed else rng.choice([0.0, 0.5, 1.0]),
                "metrics": {} if failed else {"correct": rng.choice([0.0, 1.0]), "format": 1.0},
                "error": {
                    "type": "BackendUnavailableError",
                    "message": "connection refused",
                    "where": "turn 1: model",
                }
                if failed
                else None,
                "num_turns": 0 if failed else 2,
                "prompt_tokens": None if failed else 600,
                "completion_tokens": None if failed else 40,
                "timing": {"generation_ms": round(rng.uniform(100, 900), 1)},
            }
            f.write(json.dumps(row) + "\n")
    metadata = {
        "config": {"env_id": "synthetic", "model": "none", "rollouts_per_example": 4},
        "started_at": "2025-01-01T00:00:00+00:00",
        "finished_at": None,
        "results": None,
    }
    (root / "metadata.json").write_text(json.dumps(metadata))


def run_view(args: list[str]) -> tuple[float, float, str]:
    """``vf-mm view ARGS`` in a subprocess: wall seconds, peak RSS in MB, its output."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        [*VF_MM, "view", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=_ROOT
    )
    assert proc.stdout is not None
    out = proc.stdout.read().decode()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"vf-mm view {' '.join(args)} failed:\n{out}")
    return wall, usage.ru_maxrss / 1024, " ".join(out.split())


#: a page that opens the page under test in a 1280x2000 frame and writes, at the frame's
#: load event, the milliseconds since its own navigation began (the page under test keeps
#: its own CSP: the frame's script is not in it)
_PROBE = """<!DOCTYPE html><html><body style="margin:0"><pre id="t">pending</pre>
<iframe id="f" style="width:1280px;height:2000px;border:0"></iframe>
<script>
var f = document.getElementById("f");
f.onload = function () { document.getElementById("t").textContent = performance.now(); };
f.src = decodeURIComponent(location.hash.slice(1));
</script></body></html>
"""


def open_times(url: str, repeat: int, probe: Path) -> tuple[float, float]:
    """Median seconds, over ``repeat`` runs of headless chromium, until the page at
    ``url`` fired its load event (in the page: DOM parsed, styles and the images in view
    loaded), and of the whole ``--dump-dom`` run (the browser's start-up included)."""
    loads, walls = [], []
    for _ in range(repeat):
        start = time.perf_counter()
        proc = run_chromium(
            "--dump-dom", url=f"{file_url(probe)}#{urllib.parse.quote(url)}", timeout=600
        )
        walls.append(time.perf_counter() - start)
        assert proc.returncode == 0, proc.stderr[-2000:]
        found = re.search(r'<pre id="t">([\d.]+)</pre>', proc.stdout)
        assert found, f"the page did not load: {proc.stderr[-2000:]}"
        loads.append(float(found.group(1)) / 1000)
    return statistics.median(loads), statistics.median(walls)


def folder_size(folder: Path) -> tuple[int, int]:
    files = [f for f in folder.rglob("*") if f.is_file()]
    return len(files), sum(f.stat().st_size for f in files)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="3000,100000")
    parser.add_argument("--distinct", type=int, default=300)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--single-max", type=int, default=3000)
    parser.add_argument("--keep", type=Path, default=None, help="write the runs here, keep them")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]

    base = args.keep or Path(tempfile.mkdtemp(prefix="vfmm-bench-report-"))
    base.mkdir(parents=True, exist_ok=True)
    probe = base / "probe.html"
    probe.write_text(_PROBE)
    _, blank = open_times("about:blank", args.repeat, probe)
    print(f"cpu: {cpu_name()} ({os.cpu_count()} cores); headless chromium on about:blank: "
          f"{blank:.2f} s (its start-up and exit)")  # fmt: skip
    header = (
        f"{'rollouts':>9} {'mode':<12} {'write s':>8} {'peak MB':>8} {'files':>6} "
        f"{'total MB':>9} {'opened':<15} {'page MB':>8} {'load s':>7} {'wall s':>7}"
    )
    print(header)
    print("-" * len(header))
    try:
        for n in sizes:
            root = base / f"run-{n}"
            shutil.rmtree(root, ignore_errors=True)
            start = time.perf_counter()
            make_run(root, n, distinct=args.distinct)
            made = time.perf_counter() - start
            size_mb = (root / "results.jsonl").stat().st_size / 1e6
            assets_mb = folder_size(root / "assets")[1] / 1e6
            print(f"# {n:,} rollouts: results.jsonl {size_mb:.1f} MB, {args.distinct} distinct "
                  f"images ({assets_mb:.1f} MB), made in {made:.1f} s")  # fmt: skip

            wall, peak, _ = run_view([str(root), "--pages"])
            folder = root / "report"
            files, total = folder_size(folder)
            pages = sorted(folder.glob("page-*.html"))
            middle = pages[len(pages) // 2] if pages else folder / "index.html"
            for name, page in (("index.html", folder / "index.html"), (middle.name, middle)):
                load, whole = open_times(file_url(page), args.repeat, probe)
                print(
                    f"{n:>9,} {'pages':<12} {wall:>8.2f} {peak:>8.0f} {files:>6} "
                    f"{total / 1e6:>9.1f} {name:<15} {page.stat().st_size / 1e6:>8.2f} "
                    f"{load:>7.2f} {whole:>7.2f}"
                )
            if n <= args.single_max:
                wall, peak, _ = run_view([str(root), "--single-file"])
                page = root / "report.html"
                load, whole = open_times(file_url(page), args.repeat, probe)
                size = page.stat().st_size / 1e6
                print(
                    f"{n:>9,} {'single file':<12} {wall:>8.2f} {peak:>8.0f} {1:>6} "
                    f"{size:>9.1f} {'report.html':<15} {size:>8.2f} {load:>7.2f} {whole:>7.2f}"
                )
    finally:
        if args.keep is None:
            shutil.rmtree(base, ignore_errors=True)
    print(
        "write s: vf-mm view's wall time (a subprocess: Python start-up included); peak MB: "
        "its peak RSS; load s: until the page's load event in headless chromium, from "
        "file://; wall s: the whole headless run (start-up, load, DOM dump); medians"
    )


if __name__ == "__main__":
    main()
