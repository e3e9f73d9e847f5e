"""A real ``kill -9``: a writer SIGKILLed at random moments, resumed until it finishes.

The worker (``_kill_worker.py``) writes rollouts with images (PIL, data URLs, one image
shared by the rollouts of an example, some lines of ~600 kB) and fsyncs every line. Two
kinds of kill, alternating: after a random delay (from the process start, so it can land
in start-up, the repair of the file or the metadata write; or from the writer being
open), and at a randomly chosen syscall (the N-th ``os.write`` half-way through a line,
the N-th ``os.fsync``, the N-th ``os.replace``: mid-line, mid-asset, mid-metadata). After
every kill the file must read back with at most a torn last line, and a kill mid-line
must be cut away by the next open; at the end every (example, rollout) is there exactly
once and every referenced asset is a whole PNG of the right pixels.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from PIL import Image

from vf_mm.images import image_hash, load_image
from vf_mm.results import read_metadata, read_results

from ._kill_worker import make_output, noise_image, shared_image

WORKER = Path(__file__).with_name("_kill_worker.py")
NUM_EXAMPLES, ROLLOUTS = 40, 4
# how each round is killed; the N of a syscall kill is drawn at random
SCHEDULE = ["start", "write", "fsync", "open", "replace", "write", "start", "fsync", "write"]

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")


@pytest.fixture
def start():
    """Start the worker; any process still running when the test ends is killed."""
    procs: list[subprocess.Popen[str]] = []

    def _start(outdir: Path, *extra: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, str(WORKER), str(outdir), str(NUM_EXAMPLES), str(ROLLOUTS), *extra],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        procs.append(proc)
        return proc

    yield _start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def _truncated(out: str) -> int | None:
    """The bytes the worker's open cut off (its "open N" line), None if it never opened."""
    for line in out.splitlines():
        if line.startswith("open "):
            return int(line.split()[1])
    return None


def _asset_urls(messages: list[dict]) -> list[str]:
    return [
        part["image_url"]["url"]
        for message in messages
        if isinstance(message.get("content"), list)
        for part in message["content"]
        if part.get("type") == "image_url"
    ]


def test_kill_9_at_random_moments_then_resume(tmp_path, start):
    seed = int.from_bytes(os.urandom(4), "big")
    rng = random.Random(seed)
    outdir = tmp_path / "out"
    log: list[str] = []  # what happened, for the failure message
    torn_expected = False  # the previous kill was half-way through a line

    for how in SCHEDULE:
        first = ""
        if how in ("write", "fsync", "replace"):  # it kills itself at that call
            n = rng.randint(1, {"write": 12, "fsync": 40, "replace": 25}[how])
            proc = start(outdir, f"{how}:{n}")
            how = f"{how}:{n}"
        elif how == "open":  # after the writer is open: mid-asset or mid-line, mostly
            proc = start(outdir)
            first = proc.stdout.readline()  # "open N" ("" if it died or finished)
            time.sleep(rng.uniform(0.0, 0.25))
            proc.send_signal(signal.SIGKILL)
        else:  # from the start: start-up, the repair or the metadata write
            proc = start(outdir)
            time.sleep(rng.uniform(0.05, 0.6))
            proc.send_signal(signal.SIGKILL)
        out, err = proc.communicate(timeout=60)
        out = first + out
        truncated = _truncated(out)
        if torn_expected and truncated is not None:
            assert truncated > 0, f"seed {seed}: a torn line was not cut off; {log}"
        torn_expected = how.startswith("write") and proc.returncode == -signal.SIGKILL
        # whatever moment it died at, only the last line may be torn (read_results raises
        # for a corrupt line before the last, and for a repeated key)
        rows = read_results(outdir) if (outdir / "results.jsonl").exists() else []
        log.append(f"{how}: rc {proc.returncode}, its open cut {truncated}, {len(rows)} rows")

    proc = start(outdir)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, f"seed {seed}: {err}; {log}"
    assert out.splitlines()[-1] == "done"
    if torn_expected:
        assert _truncated(out), f"seed {seed}: a torn line was not cut off; {log}"

    rows = read_results(outdir, bad_lines="raise")
    keys = [(r["example_id"], r["rollout_index"]) for r in rows]
    expected = {(e, r) for e in range(NUM_EXAMPLES) for r in range(ROLLOUTS)}
    assert sorted(keys) == sorted(expected), f"seed {seed}: {log}"
    # the kills did interrupt runs part-way, and at least one was mid-line
    assert any(0 < int(entry.split(", ")[-1].split()[0]) < len(expected) for entry in log), log
    assert any(e.startswith("write") and "rc -9" in e for e in log), log

    checked: set[str] = set()
    for row in rows:
        e, r = row["example_id"], row["rollout_index"]
        prompt_urls, completion_urls = _asset_urls(row["prompt"]), _asset_urls(row["completion"])
        assert prompt_urls == [f"assets/{image_hash(shared_image(e))}.png"]
        assert completion_urls == [
            f"assets/{image_hash(noise_image(e * 1000 + r))}.png",
            f"assets/{image_hash(noise_image(e * 1000 + r + 500_000))}.png",
        ]
        assert row["completion"][0]["content"] == make_output(e, r).completion[0]["content"]
        for url in prompt_urls + completion_urls:
            if url in checked:
                continue
            path = outdir / url
            with Image.open(path) as image:
                image.load()  # a whole PNG, not a torn one
            assert image_hash(load_image(path)) == path.stem
            checked.add(url)

    names = [p.name for p in [*outdir.iterdir(), *(outdir / "assets").iterdir()]]
    assert not [n for n in names if n.startswith(".")], names  # no temporary files left
    assert len(list((outdir / "assets").iterdir())) == len(checked)
    metadata = read_metadata(outdir)
    assert metadata["results"]["count"] == len(expected)
    assert metadata["finished_at"] is not None
    print(f"seed {seed}: {log}")
