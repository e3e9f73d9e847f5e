"""`vf-mm merge OUTDIR SRC...`: exit 0 with a summary, 1 refused (in red, naming the
problem), 2 bad arguments; the merged directory is one `vf-mm view` shows."""

from __future__ import annotations

import re

import pytest

from tests.results.test_merge import CONFIG, fingerprint, keys_of, make_run, make_shards
from vf_mm.cli import main
from vf_mm.results import read_metadata, read_results


def plain(text: str) -> str:
    """Printed text without colour codes or the terminal's line wrapping."""
    return " ".join(re.sub(r"\x1b\[[0-9;]*m", "", text).split())


@pytest.fixture
def colour(monkeypatch):
    """A colour terminal for what the command prints (rich reads FORCE_COLOR)."""
    monkeypatch.setenv("FORCE_COLOR", "1")
    monkeypatch.delenv("NO_COLOR", raising=False)


def test_merge_writes_the_run_and_prints_a_summary(tmp_path, capsys):
    shards = make_shards(tmp_path)
    before = fingerprint(*shards)
    out = tmp_path / "all"
    assert main(["merge", str(out), *map(str, shards)]) == 0
    printed = capsys.readouterr().out
    assert "merged vqa on tiny" in printed
    for cell in ("reward", "rows", "16", "errors", "shards", "4 of 4: 0/4, 1/4, 2/4, 3/4"):
        assert cell in printed, cell
    assert f"vf-mm view {out}" in printed
    assert len(read_results(out, bad_lines="raise")) == 16
    assert read_metadata(out)["config"]["merged_shards"] == ["0/4", "1/4", "2/4", "3/4"]
    assert fingerprint(*shards) == before
    # and vf-mm view shows it
    assert main(["view", str(out)]) == 0
    assert "16 rollouts" in plain(capsys.readouterr().out) and (out / "report.html").is_file()


def test_a_refusal_exits_1_in_red_and_names_the_problem(tmp_path, capsys, colour):
    shards = make_shards(tmp_path)
    other = make_run(tmp_path / "other", keys_of(1), shard="1/4", config={**CONFIG, "seed": 7})
    assert main(["merge", str(tmp_path / "all"), str(shards[0]), str(other)]) == 1
    printed = capsys.readouterr().out
    assert printed.startswith("\x1b[31m") and "\x1b[31m" in printed  # red
    assert plain(printed).startswith(f"vf-mm merge: {shards[0]} and {other} are not shards")
    assert "configs differ in seed" in plain(printed)
    assert not (tmp_path / "all").exists()


def test_a_missing_shard_needs_allow_partial(tmp_path, capsys):
    shards = make_shards(tmp_path, range(3))
    out = tmp_path / "all"
    assert main(["merge", str(out), *map(str, shards)]) == 1
    printed = plain(capsys.readouterr().out)
    assert "shard 3/4 of 4 is missing" in printed and "--allow-partial" in printed
    assert not out.exists()
    assert main(["merge", str(out), *map(str, shards), "--allow-partial"]) == 0
    printed = capsys.readouterr().out
    assert "3 of 4: 0/4, 1/4, 2/4" in printed and "missing shards" in printed
    assert read_metadata(out)["merge"]["missing"] == ["3/4"]


def test_an_outdir_in_use_exits_1(tmp_path, capsys):
    shards = make_shards(tmp_path)
    assert main(["merge", str(shards[0]), *map(str, shards[1:])]) == 1
    assert "is not empty" in plain(capsys.readouterr().out)


def test_a_torn_source_line_is_a_warning(tmp_path, capsys):
    shards = make_shards(tmp_path)
    with open(shards[2] / "results.jsonl", "ab") as f:
        f.write(b'{"example_id": 2')
    assert main(["merge", str(tmp_path / "all"), *map(str, shards)]) == 0
    printed = plain(capsys.readouterr().out)
    assert "warning:" in printed and "line 5 is a torn last line" in printed


@pytest.mark.parametrize(
    "argv",
    [
        ["merge"],
        ["merge", "out"],
        ["merge", "out", "s0", "--partial"],
        ["merge", "--nope", "a", "b"],
    ],
)
def test_bad_arguments_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_merge_is_listed_in_the_help(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0 and "merge" in capsys.readouterr().out
