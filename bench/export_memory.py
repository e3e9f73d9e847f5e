"""Memory of exporting a run directory against its length: peak RSS of ``to_dataset`` and
of writing the result as Parquet, for runs of N = 200, 2000, ... rollouts, side by side,
streamed (``vf_mm.results.to_dataset`` now: rows read one at a time and written to Arrow
files on disk in batches) and in memory ("all", the baseline: every row read, every
record built with its images' bytes, then one ``datasets.Dataset.from_dict`` of them
all, built here with public names).

Each run is built offline the way ``bench/memory.py`` builds one: ``evaluate_to_dir`` of
an environment (``zoom`` by default: a 1024x768 picture per rollout) with the scripted
backend, one rollout per example, so every rollout has its own image. Each export runs
in a fresh subprocess (its own peak). Printed per export: the run's asset bytes, RSS
once vf_mm and datasets are imported ("base"); while the dataset is built, the peak
RSS, the peak beyond the base, the peak of anonymous memory beyond the base's ("anon+":
what the process itself holds, without file pages mapped) and seconds; while it is
written with ``to_parquet``, the peak RSS ("write pk": it counts the pages of the
memory-mapped Arrow files as they are read, which the kernel drops at will) and anon+
("w anon+"). All in MB.

    python bench/export_memory.py [--sizes 200,2000] [--modes all,streamed]
                                  [--env zoom] [-c 32]

What streamed must show: its peak beyond the base does not grow with the run, where the
in-memory build's grows with the rows and their image bytes; writing the Parquet file
adds a bounded amount (datasets writes it in row groups).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(_ROOT / "bench"))

from memory import IMAGE_CACHE_MB, make_client, print_growth  # noqa: E402

_PAGE = os.sysconf("SC_PAGE_SIZE")


def resident_mb() -> tuple[float, float]:
    """This process's resident set now and its anonymous part (resident less what is
    shared: file pages mapped, as the Arrow files a dataset memory-maps), in MB."""
    with open("/proc/self/statm") as f:
        fields = f.read().split()
    resident, shared = int(fields[1]) * _PAGE / 1e6, int(fields[2]) * _PAGE / 1e6
    return resident, resident - shared


class Peaks:
    """The highest resident set and anonymous memory seen, sampled every ``every_s`` in
    a thread (``bench/memory.py``'s ``PeakSampler``, with the anonymous part: file pages
    mapped are the kernel's to drop, the anonymous ones are what the export holds)."""

    def __init__(self, every_s: float = 0.02) -> None:
        self.rss, self.anon = resident_mb()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(every_s,), daemon=True)

    def _sample(self) -> None:
        rss, anon = resident_mb()
        self.rss, self.anon = max(self.rss, rss), max(self.anon, anon)

    def _run(self, every_s: float) -> None:
        while not self._stop.wait(every_s):
            self._sample()

    def __enter__(self) -> Peaks:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()


async def build(n: int, env_id: str, concurrency: int, outdir: Path) -> None:
    """A run directory of ``n`` rollouts of ``env_id``, one per example (scripted)."""
    import vf_mm
    from vf_mm.results import evaluate_to_dir

    env = vf_mm.load_environment(
        env_id, search_paths=[str(_ROOT / "environments")], num_eval_examples=n
    )
    client = make_client("scripted", IMAGE_CACHE_MB << 20)
    await evaluate_to_dir(
        env,
        client,
        outdir,
        metadata={"config": {"bench": "export_memory", "n": n, "env": env_id}},
        num_examples=n,
        rollouts_per_example=1,
        concurrency=concurrency,
        sampling_args={"max_tokens": 8},
        seed=0,
    )
    await client.backend.aclose()


def in_memory(outdir: Path):
    """The dataset built the way that holds the whole run: every row (``read_results``),
    every record with its assets' bytes (each image checked against its name, as
    ``to_dataset`` does), then one ``from_dict``. The same columns and features."""
    import datasets

    from vf_mm.images import image_hash, load_image
    from vf_mm.results import ROW_KEYS, read_results

    json_columns = ("prompt", "completion", "answer", "info", "metrics", "error", "timing")

    def text_of(value):
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))

    rows = read_results(outdir)
    records = []
    for row in rows:
        record = {k: row.get(k) for k in ("example_id", "rollout_index", "reward")}
        record.update({k: text_of(row.get(k)) if row.get(k) is not None else None
                       for k in json_columns})  # fmt: skip
        record.update({k: row.get(k) for k in ("num_turns", "prompt_tokens", "completion_tokens")})
        extra = {k: v for k, v in row.items() if k not in ROW_KEYS}
        record["extra"] = text_of(extra) if extra else None
        images, urls, videos = [], [], []
        for name in ("prompt", "completion"):
            for message in row.get(name) or ():
                content = message.get("content")
                for part in content if isinstance(content, list) else ():
                    url = (part.get("image_url") or {}).get("url", "")
                    if part.get("type") == "image_url" and url.startswith("assets/"):
                        data = (outdir / url).read_bytes()
                        assert image_hash(load_image(data)) == Path(url).stem
                        images.append({"bytes": data, "path": url})
                        urls.append(url)
                    elif part.get("type") == "video_url":
                        url = part["video_url"]["url"]
                        rate = part.get("frame_rate")
                        data = (outdir / url).read_bytes()
                        videos.append({"url": url, "frame_rate": rate, "bytes": data})
        record["images"], record["image_urls"], record["videos"] = images, urls, videos
        records.append(record)
    text = datasets.Value("string")
    number = datasets.Value("int64")
    features = datasets.Features(
        {
            "example_id": number if all(isinstance(r["example_id"], int) for r in rows) else text,
            "rollout_index": number,
            **dict.fromkeys(("prompt", "completion", "answer", "info"), text),
            "reward": datasets.Value("float64"),
            "metrics": text,
            "error": text,
            **dict.fromkeys(("num_turns", "prompt_tokens", "completion_tokens"), number),
            "timing": text,
            "extra": text,
            "images": datasets.List(datasets.Image()),
            "image_urls": datasets.List(text),
            "videos": datasets.List(
                {
                    "url": text,
                    "frame_rate": datasets.Value("float64"),
                    "bytes": datasets.Value("binary"),
                }
            ),
        }
    )
    order = [*ROW_KEYS, "extra", "images", "image_urls", "videos"]
    columns = {name: [record[name] for record in records] for name in order}
    return datasets.Dataset.from_dict(columns, features=features)


def child(outdir: Path, mode: str, scratch: Path) -> dict:
    import datasets  # imported before the base is taken, in both modes
    import pyarrow  # noqa: F401

    from vf_mm.results import to_dataset

    datasets.disable_progress_bars()
    base, base_anon = resident_mb()
    start = time.perf_counter()
    with Peaks() as built:
        if mode == "all":
            dataset = in_memory(outdir)
        else:
            dataset = to_dataset(outdir, cache_dir=scratch / "cache")
    build_s = time.perf_counter() - start
    with Peaks() as written:
        dataset.to_parquet(str(scratch / "results.parquet"))
    return {
        "mode": mode,
        "rows": dataset.num_rows,
        "base": base,
        "base_anon": base_anon,
        "peak": built.rss,
        "peak_anon": built.anon,
        "write_peak": written.rss,
        "write_anon": written.anon,
        "seconds": build_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="200,2000")
    parser.add_argument("--modes", default="all,streamed")
    parser.add_argument("--env", default="zoom")
    parser.add_argument("-c", "--concurrency", type=int, default=32)
    parser.add_argument("--build", nargs=2, metavar=("N", "DIR"), help=argparse.SUPPRESS)
    parser.add_argument(
        "--child", nargs=3, metavar=("DIR", "MODE", "SCRATCH"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.build:
        asyncio.run(build(int(args.build[0]), args.env, args.concurrency, Path(args.build[1])))
        return
    if args.child:
        outdir, mode, scratch = Path(args.child[0]), args.child[1], Path(args.child[2])
        print(json.dumps(child(outdir, mode, scratch)))
        return

    from _machine import cpu_name

    print(f"# {cpu_name()}, {os.cpu_count()} cores; env {args.env}, scripted backend")
    print(f"{'mode':<9}{'rollouts':>9}{'assets':>8}{'base':>6}{'peak':>6}{'beyond':>8}"
          f"{'anon+':>7}{'build s':>8}{'write pk':>9}{'w anon+':>8}   (MB)")  # fmt: skip
    results: dict[tuple[str, int], dict] = {}
    with tempfile.TemporaryDirectory(prefix="vfmm-bench-export-") as tmp:
        for n in (int(x) for x in args.sizes.split(",")):
            run = Path(tmp) / f"run-{n}"
            subprocess.run(
                [sys.executable, __file__, "--build", str(n), str(run), "--env", args.env,
                 "-c", str(args.concurrency)],
                check=True, cwd=_ROOT, capture_output=True,
            )  # fmt: skip
            assets = sum(p.stat().st_size for p in (run / "assets").iterdir()) / 1e6
            for mode in args.modes.split(","):
                scratch = Path(tmp) / f"export-{n}-{mode}"
                scratch.mkdir()
                out = subprocess.run(
                    [sys.executable, __file__, "--child", str(run), mode, str(scratch)],
                    capture_output=True, text=True, check=True, cwd=_ROOT,
                )  # fmt: skip
                r = json.loads(out.stdout.strip().splitlines()[-1])
                results[(r["mode"], n)] = r
                print(
                    f"{mode:<9}{r['rows']:>9}{assets:>8.1f}{r['base']:>6.0f}{r['peak']:>6.0f}"
                    f"{r['peak'] - r['base']:>8.0f}{r['peak_anon'] - r['base_anon']:>7.0f}"
                    f"{r['seconds']:>8.1f}{r['write_peak']:>9.0f}"
                    f"{r['write_anon'] - r['base_anon']:>8.0f}",
                    flush=True,
                )
    print_growth(results, args.modes.split(","))


if __name__ == "__main__":
    main()
