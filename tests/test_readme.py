"""README.md: its Quickstart is the two commands CI runs, and its Python example runs as
written (on the embedded tiny model, offline)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text(encoding="utf-8")


def test_the_readme_starts_with_the_two_quickstart_commands_ci_runs():
    first = re.search(r"^```bash\n(.*?)^```$", README, re.M | re.S)
    assert first is not None and README.index("## Quickstart") < first.start()
    commands = [line.split("#")[0].strip() for line in first.group(1).splitlines()]
    assert commands == ["python3 dev.py demo", "python3 dev.py test"]
    assert "python3 dev.py test" in (REPO / ".ci" / "run").read_text(encoding="utf-8")


def test_the_ten_line_example_runs(monkeypatch, capsys):
    monkeypatch.setenv("VF_MM_ENV_PATH", str(REPO / "environments"))
    python = re.findall(r"^```python\n(.*?)^```$", README, re.M | re.S)
    assert len(python) == 1 and len(python[0].strip().splitlines()) <= 12
    exec(compile(python[0], "README.md", "exec"), {"__name__": "readme"})
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 4 * 2 + 1  # a line per rollout, then the tokens of one
