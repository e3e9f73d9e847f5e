"""Every test marked for a tier is in a path that tier's job runs: a marked test outside
them is deselected by the default run and never collected by its tier's (LFM2.5-VL's
image parity tests sat so, written and never run)."""

from __future__ import annotations

import functools
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TIERS = ("vllm", "ray", "verifiers", "trl", "verifiers1")


@functools.cache
def collected_files() -> dict[Path, str]:
    return {f: f.read_text(encoding="utf-8") for f in sorted((ROOT / "tests").rglob("*.py"))}


def job_paths(tier: str) -> list[Path]:
    spec = importlib.util.spec_from_file_location("vf_mm_dev", ROOT / "dev.py")
    assert spec is not None and spec.loader is not None
    dev = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dev)
    (command,) = [c for c in dev.JOBS[tier] if "pytest" in map(str, c)]
    return [ROOT / str(a) for a in command if str(a).startswith("tests")]


@pytest.mark.parametrize("tier", TIERS)
def test_every_marked_test_is_in_its_tiers_job(tier):
    marked = re.compile(rf"\bpytest\.mark\.{tier}\b|\bmark\.{tier}\b[,)]")
    paths = job_paths(tier)
    outside = [
        str(f.relative_to(ROOT))
        for f, text in collected_files().items()
        if marked.search(text) and not any(f == p or p in f.parents for p in paths)
    ]
    assert not outside, f"marked {tier} but not run by `python3 dev.py {tier}`: {outside}"
