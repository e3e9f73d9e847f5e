"""The pinned lock file installs everything pyproject.toml declares (CI installs only the
lock, then vf_mm with --no-deps: a dependency missing from the lock breaks a fresh clone
even while a developer's older .venv still has it)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].strip().lower().replace("_", "-")


def test_every_declared_dependency_is_pinned_in_the_lock():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = {_name(r) for r in project["dependencies"]}
    declared |= {_name(r) for r in project["optional-dependencies"]["dev"]}
    pinned = {
        _name(line) for line in (ROOT / "requirements" / "lock.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }  # fmt: skip
    assert declared - pinned == set()


def test_lock_pins_exact_versions_and_no_torchvision():
    lines = [
        line for line in (ROOT / "requirements" / "lock.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]  # fmt: skip
    assert all(re.fullmatch(r"[A-Za-z0-9_.\-]+==[A-Za-z0-9_.+\-]+", line) for line in lines), lines
    assert not any(line.lower().startswith("torchvision") for line in lines)
    assert "torch==2.13.0" in lines


def test_the_package_says_it_is_typed():
    """PEP 561: without py.typed in the wheel, users' type checkers ignore vf_mm's types."""
    assert (ROOT / "vf_mm" / "py.typed").is_file()
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "py.typed" in setuptools["package-data"]["vf_mm"]
