"""Every ``from vf_mm... import name`` in the repository's scripts, benches, examples,
tests and the docs' snippets names something that exists: lint cannot see a name a
package stopped exporting, and benches and tier-only tests do not run in the default
tier."""

from __future__ import annotations

import ast
import importlib
import re
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("vf_mm", "vf_mm_verifiers", "tests", "bench", "examples", "environments")


def _sources() -> list[tuple[str, str]]:
    found = [
        (str(path.relative_to(ROOT)), path.read_text())
        for folder in FOLDERS
        for path in sorted((ROOT / folder).rglob("*.py"))
    ]
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for i, block in enumerate(re.findall(r"```python\n(.*?)```", page.read_text(), re.S)):
            # a snippet inside a list item is indented with it
            found.append((f"{page.relative_to(ROOT)} (snippet {i})", textwrap.dedent(block)))
    return found


def _missing(module: str, name: str) -> bool:
    try:
        package = importlib.import_module(module)
    except ImportError:  # an optional tier's package (trl, verifiers): its own tier checks it
        return False
    if hasattr(package, name):
        return False
    try:
        importlib.import_module(f"{module}.{name}")
    except ImportError:
        return True
    return False


def test_every_vf_mm_name_imported_exists():
    missing = [
        f"{where}:{node.lineno}: {node.module}.{alias.name}"
        for where, text in _sources()
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.ImportFrom) and node.level == 0
        and (node.module or "").split(".")[0] == "vf_mm"
        for alias in node.names
        if alias.name != "*" and _missing(node.module, alias.name)
    ]  # fmt: skip
    assert missing == []
