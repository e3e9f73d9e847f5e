"""docs/environments.md: every code block runs, in order, as a reader would run it.

Python blocks run in one namespace (later blocks use what earlier ones defined); bash
blocks run line by line (`vf-mm ...` through the CLI's main, `pytest ...` in a fresh
process); a line that is neither fails the test, so the guide holds only runnable
commands. Everything runs in a temporary folder with the repo's environments on
VF_MM_ENV_PATH.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from vf_mm.cli import main

REPO = Path(__file__).resolve().parents[1]
GUIDE = REPO / "docs" / "environments.md"


def blocks(text: str) -> list[tuple[str, str, int]]:
    """``(language, code, line number)`` of every fenced block."""
    found = []
    for match in re.finditer(r"^```(\w*)\n(.*?)^```$", text, re.M | re.S):
        found.append((match.group(1), match.group(2), text.count("\n", 0, match.start()) + 1))
    return found


def run_command(line: str, where: str, cwd: Path) -> None:
    words = shlex.split(line, comments=True)
    if words[0] == "vf-mm":
        assert main(words[1:]) == 0, f"{where}: {line}"
    elif words[0] == "pytest":
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *words[1:]],
                              cwd=cwd, capture_output=True, text=True, env=env, timeout=600)  # fmt: skip
        assert done.returncode == 0, f"{where}: {line}\n{done.stdout}\n{done.stderr}"
        # every test ran and passed (a skip would hide a scaffold whose test cannot run)
        assert re.search(r"\b\d+ passed", done.stdout) and "skipped" not in done.stdout, (
            f"{where}: {line}\n{done.stdout}"
        )
    else:
        raise AssertionError(f"{where}: {line!r} is not a command this test can run")


def run_guide(guide: Path, tmp_path: Path, monkeypatch) -> list[tuple[str, str, int]]:
    """Run every python and bash block of ``guide`` in order, in ``tmp_path`` (``text``
    blocks are diagrams, not run); returns the blocks found. Shared by every guide's
    test (docs/training.md's too)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("VF_MM_ENV_PATH", str(REPO / "environments"))
    found = blocks(guide.read_text(encoding="utf-8"))
    assert {lang for lang, _, _ in found} <= {"python", "bash", "text"}
    namespace: dict = {"__name__": "guide"}
    for lang, code, line in found:
        where = f"docs/{guide.name}, block at line {line}"
        if lang == "python":
            exec(compile(code, where, "exec"), namespace)
        elif lang == "bash":
            for command in code.splitlines():
                if command.strip() and not command.lstrip().startswith("#"):
                    run_command(command, where, tmp_path)
    return found


def test_every_block_of_the_environments_guide_runs(tmp_path, monkeypatch):
    found = run_guide(GUIDE, tmp_path, monkeypatch)
    assert {lang for lang, _, _ in found} <= {"python", "bash"}
    assert sum(lang == "python" for lang, _, _ in found) >= 8


def test_the_readme_links_the_guide():
    assert "docs/environments.md" in (REPO / "README.md").read_text(encoding="utf-8")
