"""The soak test (slow tier): a long eval of distinct images keeps a flat memory, survives a
``kill -9`` at 60% (``resume`` completes the rest, each rollout exactly once), and the
reader, the summary and the report take the whole run.

Scaled to finish in minutes on two cores: ``VF_MM_SOAK_EXAMPLES`` examples (default 3000,
two rollouts each, one distinct 224x224 image per example) with the scripted backend, and
a run of the embedded tiny model a tenth that size (with 16 MB cache bounds, so that its
caches fill early in a run that short). The issue's full size is
``VF_MM_SOAK_EXAMPLES=10000`` (20k rollouts). Memory is the process's RSS, sampled every
250 stored rollouts by the child (``_soak.py``); the dataset is lazy (``LazyRows``), so it
costs nothing and is not subtracted.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from vf_mm.report import make_report
from vf_mm.results import iter_results, read_results, summarize

CHILD = Path(__file__).with_name("_soak.py")
EXAMPLES = int(os.environ.get("VF_MM_SOAK_EXAMPLES", "3000"))
ROLLOUTS = 2

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="reads RSS from /proc"),
]


def run_child(outdir: Path, examples: int, *extra: str) -> tuple[int, list[dict]]:
    proc = subprocess.run(
        [sys.executable, str(CHILD), str(outdir), "--examples", str(examples),
         "--rollouts", str(ROLLOUTS), *extra],
        capture_output=True, text=True, timeout=1800, check=False,
    )  # fmt: skip
    samples = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode not in (0, -signal.SIGKILL):
        raise AssertionError(f"the soak child failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc.returncode, samples


def flat_after_warm_up(samples: list[dict], warm: int) -> tuple[float, float]:
    """(RSS at ``warm`` rollouts, the most after it), from a child's samples."""
    at = next(s["rss"] for s in samples if s.get("done", 0) >= warm)
    after = max(s["rss"] for s in samples if s.get("done", 0) >= warm or "end" in s)
    print(f"RSS at {warm} rollouts: {at:.0f} MB; most after: {after:.0f} MB")
    return at, after


def test_a_long_eval_is_flat_in_memory_survives_kill_9_and_reads_back(tmp_path):
    outdir = tmp_path / "run"
    total = EXAMPLES * ROLLOUTS
    kill_at = int(total * 0.6)
    code, first = run_child(outdir, EXAMPLES, "--kill-at", str(kill_at))
    assert code == -signal.SIGKILL  # killed itself at 60%, no clean shutdown
    stored = len(read_results(outdir))  # at most a torn last line, left out
    assert kill_at <= stored < total

    code, second = run_child(outdir, EXAMPLES, "--resume")
    assert code == 0 and second[-1]["end"] == total
    rows = read_results(outdir, bad_lines="raise")
    keys = [(r["example_id"], r["rollout_index"]) for r in rows]
    assert len(keys) == len(set(keys)) == total  # the rest exactly once, nothing lost
    assert set(keys) == {(e, i) for e in range(EXAMPLES) for i in range(ROLLOUTS)}

    # flat after warm-up: within 10% of the RSS at 1k rollouts, before and after the kill
    at, after = flat_after_warm_up(first, 1000)
    assert after <= 1.10 * at
    resumed = [s for s in second if s.get("done", 0) >= kill_at + 1000 or "end" in s]
    assert max(s["rss"] for s in resumed) <= 1.10 * at

    summary = summarize(iter_results(outdir))
    assert summary["count"] == total and summary["examples"] == EXAMPLES
    report = make_report(outdir)
    assert report.rollouts_total == total


def test_an_eval_of_the_tiny_model_is_flat_in_memory(tmp_path):
    # small bounds (16 MB of images, of KV), so the caches are full within the first
    # third of a run short enough for the tiny model: flatness after that is the point
    examples = max(150, EXAMPLES // 10)
    code, samples = run_child(
        tmp_path / "tiny", examples, "--engine", "local", "--every", "50", "--cache-mb", "16"
    )
    assert code == 0 and samples[-1]["end"] == examples * ROLLOUTS
    at, after = flat_after_warm_up(samples, examples * ROLLOUTS // 3)
    assert after <= 1.10 * at
