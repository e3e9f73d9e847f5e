"""docs/training.md: every code block runs, in order, as a reader would run it (the
mechanism of tests/test_docs_environments.py: python blocks share one namespace, bash
lines run `vf-mm ...` through the CLI's main, in a temporary folder)."""

from __future__ import annotations

from tests.test_docs_environments import REPO, run_guide

GUIDE = REPO / "docs" / "training.md"


def test_every_block_of_the_training_guide_runs(tmp_path, monkeypatch):
    found = run_guide(GUIDE, tmp_path, monkeypatch)
    assert sum(lang == "python" for lang, _, _ in found) >= 8
    assert sum(lang == "bash" for lang, _, _ in found) >= 3


def test_the_readme_links_the_guide():
    assert "docs/training.md" in (REPO / "README.md").read_text(encoding="utf-8")
