"""The report reads a run one row at a time: the same rows the reader keeps, the summary
of the whole file, and a memory that does not grow with the run."""

from __future__ import annotations

import json
import math
import tracemalloc

from tests.report._runs import write_run
from vf_mm.report import write_report
from vf_mm.report._run import _Run
from vf_mm.results import read_results, scan_results, summarize


def test_rows_are_the_rows_the_reader_keeps_in_file_order(tmp_path):
    root = tmp_path / "run"
    root.mkdir()
    lines = [
        '{"example_id": 0, "reward": 1.0}',
        "not json",
        "",
        '{"example_id": 1, "reward": NaN, "note": "caf\\u00e9"}',
        "[1, 2]",
        '{"example_id": 0, "reward": 0.5}',  # a repeat: shown, as the lenient reader keeps it
        '{"example_id": 2, "reward": 0.0, "x": "' + "\u00e9" + '"}',
        '{"example_id": 3, "rew',  # torn
    ]
    (root / "results.jsonl").write_bytes(("\n".join(lines)).encode())
    run = _Run(root)
    expected = scan_results(root, bad_lines="skip", schema="lenient").rows
    got = list(run.rows())
    assert [r["example_id"] for r in got] == [0, 1, 0, 2]
    assert json.dumps(got) == json.dumps(expected)  # NaN included
    assert list(run.rows(limit=2)) == got[:2] and list(run.rows(limit=0)) == []
    assert [w.split(":")[0] for w in run.warnings] == [
        "metadata.json is missing",
        "results.jsonl line 2",
        "results.jsonl line 5",
        "results.jsonl line 8",
    ]
    assert "torn last line" in run.warnings[-1]


def test_lines_written_after_the_scan_are_not_read(tmp_path):
    root = tmp_path / "run"
    write_run(root, 4)
    run = _Run(root)
    with open(root / "results.jsonl", "a") as f:  # a run still being written
        f.write(json.dumps({"example_id": 9, "rollout_index": 0}) + "\n")
    assert len(list(run.rows())) == 4


def test_the_survey_sums_up_the_whole_file_whatever_is_shown(tmp_path):
    root = tmp_path / "run"
    write_run(root, 30, error_every=4, finish=False)
    run = _Run(root)
    survey = run.survey(max_rollouts=7, page_size=3)
    assert survey.total == 30 and survey.shown == 7 and survey.computed
    whole = summarize(read_results(root))
    assert survey.aggregates["count"] == whole["count"] == 30
    assert survey.aggregates["errors"] == whole["errors"] == 8
    assert math.isclose(survey.aggregates["reward"]["mean"], whole["reward"]["mean"])
    assert survey.aggregates["pass_at_k"] == whole["pass_at_k"]
    assert [(p.number, p.first, p.last, p.errors) for p in survey.pages] == [
        (1, 0, 2, 1),  # rollout 0 failed
        (2, 3, 5, 1),  # 4
        (3, 6, 6, 0),
    ]
    assert [(p.first_example, p.last_example) for p in survey.pages] == [
        ("0", "1"),
        ("1", "2"),
        ("3", "3"),
    ]
    # a finished run: the stored aggregates, over the same rows
    done = tmp_path / "done"
    write_run(done, 30, error_every=4)
    stored = _Run(done).survey(max_rollouts=None, page_size=10)
    assert not stored.computed and stored.aggregates["count"] == 30
    assert len(stored.pages) == 3


def _peak_bytes(root, page_size: int) -> int:
    tracemalloc.start()
    try:
        write_report(root, single_file=False, page_size=page_size)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_writing_pages_holds_one_page_not_the_run(tmp_path):
    """Eight times the rollouts, at the same page size: about the same peak memory (the
    rows are streamed, one page is drawn at a time)."""
    small, large = tmp_path / "small", tmp_path / "large"
    for root, n in ((small, 150), (large, 1200)):
        root.mkdir()
        row = {
            "rollout_index": 0,
            "prompt": [{"role": "user", "content": "x" * 400}],
            "completion": [{"role": "assistant", "content": "y" * 400}],
            "reward": 1.0,
            "metrics": {"m": 0.5},
        }
        with open(root / "results.jsonl", "w") as f:
            for i in range(n):
                f.write(json.dumps({"example_id": i, **row}) + "\n")
    _peak_bytes(small, 30)  # warm: the template compiled, imports done
    a, b = _peak_bytes(small, 30), _peak_bytes(large, 30)
    assert b < 1.5 * a, (a, b)
