"""What ``vf-mm eval --workers W`` costs outside its rollouts: start to first rollout, and exit.

The checkpoint is a tiny Qwen2.5-VL with the real 150k Qwen2 vocabulary
(``build_tiny_vlm(path, "qwen2_5_vl", vocab="qwen")``): its tokenizer loads as slowly as
the real model's, and the weights are too small to matter. ``vf-mm serve`` serves it (on
``--device``); then, for each W and each code tree (``--trees``: e.g. main beside this
checkout, each put first on ``PYTHONPATH``), one

    vf-mm eval gridnav -m CKPT --backend vllm -b URL --workers W -n W -r 1 -S '{"max_tokens": 4}'

as a user runs it, a subprocess timed from its start:

  first      seconds to the first rollout in results.jsonl (the parent's imports and
             checks, the pool's start: every worker's environment and client)
  total      seconds to the process's exit
  rollouts   the run's own time_s (metadata.json: the results store's opening to the last
             row), so total - rollouts is the start and exit around them
  cpu        CPU seconds (user + system) of the whole eval: its process, the forkserver and
             every worker (this process is their subreaper, so each is reaped here and
             counted): on a shared machine, steadier than the wall clock

Each figure is the median of ``--repeats`` runs. The server and the eval share the
machine's cores: say how many (``os.cpu_count()`` is printed).

    python bench/worker_start.py [--workers 1,4,8] [--trees before=/work/main,after=.]
                                 [--device cpu] [--repeats 1] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from _machine import cpu_name
from gpu_fed import CLI, server

from vf_mm.testing import build_tiny_vlm

ROOT = Path(__file__).resolve().parents[1]


def become_subreaper() -> None:
    """Orphaned descendants (the eval's forkserver, once the eval exits) become this
    process's children, so their CPU time is counted when they are reaped here."""
    PR_SET_CHILD_SUBREAPER = 36
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def reap_orphans(keep: int, deadline_s: float = 30.0) -> None:
    """Wait for every child of this process but ``keep`` (the server) to exit."""
    me, end = os.getpid(), time.monotonic() + deadline_s
    while time.monotonic() < end:
        children = []
        for entry in os.listdir("/proc"):
            if entry.isdigit() and int(entry) != keep:
                try:
                    stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                if int(stat[1]) == me:
                    children.append(int(entry))
        if not children:
            return
        for pid in children:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
        time.sleep(0.05)


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed_eval(
    tree: Path, ckpt: Path, url: str, workers: int, outdir: Path, server_pid: int
) -> dict[str, float]:
    """One ``vf-mm eval`` of ``tree``'s vf_mm: seconds to its first rollout, to its exit,
    and the CPU seconds of all its processes."""
    command = [*CLI, "eval", "gridnav", "-m", str(ckpt), "--backend", "vllm", "-b", url,
               "--workers", str(workers), "-n", str(workers), "-r", "1",
               "-S", json.dumps({"max_tokens": 4}), "-o", str(outdir)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(tree)}
    results, first = outdir / "results.jsonl", [0.0]
    cpu0 = children_cpu_s()
    start = time.perf_counter()
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)  # fmt: skip

    def watch() -> None:
        while process.poll() is None and not first[0]:
            if results.exists() and results.stat().st_size > 0:
                first[0] = time.perf_counter() - start
            time.sleep(0.01)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    out, _ = process.communicate()
    total = time.perf_counter() - start
    watcher.join()
    reap_orphans(server_pid)
    cpu = children_cpu_s() - cpu0
    if process.returncode != 0:
        raise RuntimeError(f"vf-mm eval ({tree}) exited {process.returncode}: {out}")
    time_s = json.loads((outdir / "metadata.json").read_text())["results"]["time_s"]
    return {"first": first[0] or total, "total": total, "rollouts": time_s, "cpu": cpu}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workers", default="1,4,8")
    parser.add_argument(
        "--trees",
        default=f"this={ROOT}",
        help="NAME=PATH,...: the vf_mm code trees to time, side by side",
    )
    parser.add_argument("--device", default="cpu", help="where vf-mm serve runs the model")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None, help="also write the numbers as JSON")
    args = parser.parse_args()
    args.dtype = "float32" if args.device == "cpu" else "bfloat16"
    trees = dict(item.split("=", 1) for item in args.trees.split(","))
    counts = [int(w) for w in args.workers.split(",")]
    print(f"{cpu_name()}, {os.cpu_count()} cores | Python {platform.python_version()}")
    print("vf-mm eval gridnav --backend vllm --workers W, W rollouts of 4 tokens; tiny "
          "Qwen2.5-VL, real Qwen2 vocabulary; seconds, median of "
          f"{args.repeats}\n")  # fmt: skip
    print(f"{'tree':>8}{'W':>4}{'first':>9}{'total':>9}{'rollouts':>10}{'outside':>9}{'cpu':>8}")
    table: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = build_tiny_vlm(Path(tmp) / "qwen", "qwen2_5_vl", vocab="qwen")
        become_subreaper()
        with server(ckpt, args, Path(tmp) / "serve.log") as (url, server_pid):
            for w in counts:
                for name, tree in trees.items():
                    runs = [
                        timed_eval(
                            Path(tree).resolve(),
                            ckpt,
                            url,
                            w,
                            Path(tmp) / f"{name}-{w}-{i}",
                            server_pid,
                        )
                        for i in range(args.repeats)
                    ]
                    row = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
                    row["outside"] = row["total"] - row["rollouts"]
                    table.setdefault(name, {})[str(w)] = row
                    print(f"{name:>8}{w:>4}{row['first']:>9.1f}{row['total']:>9.1f}"
                          f"{row['rollouts']:>10.1f}{row['outside']:>9.1f}{row['cpu']:>8.1f}",
                          flush=True)  # fmt: skip
    if args.out:
        args.out.write_text(json.dumps({"cores": os.cpu_count(), "runs": table}, indent=2))


if __name__ == "__main__":
    main()
