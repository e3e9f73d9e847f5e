"""The examples run, and GRPO on the tiny VLM learns (slow tier: python3 dev.py slow)."""

from __future__ import annotations

import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_grpo_tiny_raises_the_mean_reward(tmp_path):
    out = subprocess.run(
        [sys.executable, "examples/train_grpo_tiny.py", "--steps", "30", "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    match = re.search(r"first step ([\d.]+), last 5 steps ([\d.]+)", out.stdout)
    assert match, out.stdout[-2000:]
    first, last = map(float, match.groups())
    assert last > 2 * first and last > first + 0.15, out.stdout[-2000:]
    assert (tmp_path / "reward_curve.png").stat().st_size > 1000


def test_grpo_tiny_runs_one_step(tmp_path, monkeypatch, capsys):
    """The example file run as ``python examples/train_grpo_tiny.py ...`` runs it (as
    ``__main__``, with those arguments), here in this process: a fresh interpreter would
    only import torch again. The slow tier's test above runs it in a process of its own."""
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(sys, "argv", ["examples/train_grpo_tiny.py", "--steps", "1", "--rows",
                                      "2", "--group-size", "2", "--out", str(tmp_path)])  # fmt: skip
    runpy.run_path("examples/train_grpo_tiny.py", run_name="__main__")
    stdout = capsys.readouterr().out
    assert (tmp_path / "reward_curve.png").exists()
    # the step's row: step reward exact loss kl mkl max|d| s; the sampler and the policy
    # hold the same weights, so the trainer's logprobs are the sampler's (up to rounding)
    header, row = (line.split() for line in stdout.splitlines()[:2])
    assert header[5:7] == ["mkl", "max|d|"], stdout[-2000:]
    assert 0 <= float(row[5]) < 1e-6 and float(row[6]) < 1e-3, stdout[-2000:]
