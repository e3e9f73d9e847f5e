"""The one reader of a run directory: what each ``bad_lines`` / ``schema`` choice does."""

from __future__ import annotations

import json
import math

import pytest

from vf_mm.errors import ResultsError
from vf_mm.results import RESULTS_FILE, BadLine, iter_results, read_results, scan_results


def row(example_id, rollout_index=0, **extra):
    return {"example_id": example_id, "rollout_index": rollout_index, **extra}


def write(tmp_path, *lines: bytes | dict) -> None:
    data = b"".join(
        line if isinstance(line, bytes) else json.dumps(line).encode() + b"\n" for line in lines
    )
    (tmp_path / RESULTS_FILE).write_bytes(data)


def test_whole_file_reads_the_same_under_every_choice(tmp_path):
    write(tmp_path, row(0), row(0, 1), row("a"))
    for bad_lines in ("raise", "torn-tail", "skip"):
        scan = scan_results(tmp_path, bad_lines=bad_lines)
        assert [(r["example_id"], r["rollout_index"]) for r in scan.rows] == [
            (0, 0),
            (0, 1),
            ("a", 0),
        ]
        assert scan.bad_lines == [] and scan.torn_tail is None
        assert scan.end == scan.size == (tmp_path / RESULTS_FILE).stat().st_size
        assert scan.keys == {(0, 0): 1, (0, 1): 2, ("a", 0): 3}


def test_a_torn_last_line_is_left_out_by_default_and_says_where(tmp_path, caplog):
    write(tmp_path, row(0), row(1), b'{"example_id": 2, "rollo')
    scan = scan_results(tmp_path)
    assert [r["example_id"] for r in scan.rows] == [0, 1]
    torn = scan.torn_tail
    assert torn == BadLine(3, scan.end, torn.reason, True)
    assert "cut off mid-write" in torn.reason
    assert scan.size - scan.end == len(b'{"example_id": 2, "rollo')
    assert caplog.text == ""  # the scan's caller reports (a resuming writer truncates it)
    read_results(tmp_path)
    assert "torn" in caplog.text  # read_results warns
    with pytest.raises(ResultsError, match="line 3 is torn") as info:
        read_results(tmp_path, bad_lines="raise")
    assert info.value.line == 3


def test_a_corrupt_middle_line_raises_unless_skipping(tmp_path):
    write(tmp_path, row(0), b"not json\n", row(1))
    with pytest.raises(ResultsError, match=r"line 2 is corrupt .*not the last line"):
        read_results(tmp_path)
    with pytest.raises(ResultsError, match="line 2 is corrupt"):
        read_results(tmp_path, bad_lines="raise")
    scan = scan_results(tmp_path, bad_lines="skip")
    assert [r["example_id"] for r in scan.rows] == [0, 1]
    (bad,) = scan.bad_lines
    assert bad.line == 2 and "not JSON" in bad.reason and not bad.torn
    assert scan.torn_tail is None  # a skipped middle line is not what resume truncates


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (b"[1, 2]\n", "a JSON list, not an object"),
        (b'{"rollout_index": 0}\n', "no 'example_id' key"),
        (b'{"example_id": 1.5, "rollout_index": 0}\n', "example_id must be"),
        (b'{"example_id": 1, "rollout_index": -1}\n', "rollout_index must be"),
        (b'{"example_id": 1, "rollout_index": 0, "reward": NaN}\n', "NaN is not JSON"),
        (b'{"example_id": 1, "rollout_index": 0, "t": "\xff"}\n', "not UTF-8"),
    ],
)
def test_what_a_strict_row_is(tmp_path, line, reason):
    write(tmp_path, row(0), line, row(2))
    scan = scan_results(tmp_path, bad_lines="skip")
    assert [r["example_id"] for r in scan.rows] == [0, 2]
    assert reason in scan.bad_lines[0].reason


def test_a_repeated_key_is_never_taken_for_a_torn_tail(tmp_path):
    write(tmp_path, row(0), row(1), row(0))
    for bad_lines in ("raise", "torn-tail"):
        with pytest.raises(ResultsError, match="line 3 repeats example 0 rollout 0 of line 1"):
            read_results(tmp_path, bad_lines=bad_lines)
    scan = scan_results(tmp_path, bad_lines="skip")
    assert [r["example_id"] for r in scan.rows] == [0, 1]
    assert "repeats example 0" in scan.bad_lines[0].reason


def test_lenient_rows_are_any_json_object(tmp_path):
    write(
        tmp_path,
        {"reward": 1},  # no keys: another tool's file
        b'{"example_id": 0, "reward": NaN}\n',
        b"\n",  # blank lines are nothing
        row(0),
        row(0),  # repeats are kept
        b'{"t": "\xff"}\n',
        b"[1]\n",
    )
    scan = scan_results(tmp_path, bad_lines="skip", schema="lenient")
    assert len(scan.rows) == 5
    assert math.isnan(scan.rows[1]["reward"])
    assert scan.rows[4]["t"] == "\ufffd"
    write(tmp_path, row(0), b'{"example_id": 1}')  # a whole last line without its newline
    assert len(scan_results(tmp_path, bad_lines="skip", schema="lenient").rows) == 2
    assert [b.line for b in scan.bad_lines] == [7]
    assert scan.keys == {}  # lenient rows are not indexed by key


def test_keep_rows_false_keeps_only_the_keys(tmp_path):
    write(tmp_path, row(0), row(1))
    scan = scan_results(tmp_path, keep_rows=False)
    assert scan.rows == [] and set(scan.keys) == {(0, 0), (1, 0)}


def test_the_path_may_be_the_outdir_or_the_file_and_must_exist(tmp_path):
    write(tmp_path, row(0))
    assert read_results(tmp_path) == read_results(tmp_path / RESULTS_FILE)
    with pytest.raises(FileNotFoundError):
        read_results(tmp_path / "nowhere")


def test_unknown_choices_are_refused(tmp_path):
    write(tmp_path, row(0))
    with pytest.raises(ValueError, match="bad_lines"):
        scan_results(tmp_path, bad_lines="ignore")
    with pytest.raises(ValueError, match="schema"):
        scan_results(tmp_path, schema="loose")


def test_a_failed_rollout_may_be_retried_and_the_last_record_counts(tmp_path):
    write(
        tmp_path,
        row(0, error="ImageFetchError: gone"),
        row(1),
        row(0, reward=1.0),  # the retry
        row(2, error="RuntimeError: x"),
    )
    for bad_lines in ("raise", "torn-tail"):
        scan = scan_results(tmp_path, bad_lines=bad_lines)
        assert [(r["example_id"], r.get("reward")) for r in scan.rows] == [
            (1, None),
            (0, 1.0),
            (2, None),
        ]
        assert scan.keys[(0, 0)] == 3 and scan.failed == {(2, 0)} and scan.retries == 1


def test_a_retry_of_a_rollout_that_did_not_fail_is_refused(tmp_path):
    write(tmp_path, row(0, error="E: x"), row(0), row(0))
    with pytest.raises(ResultsError, match="line 3 repeats example 0 rollout 0 of line 2"):
        read_results(tmp_path)


def test_iter_results_streams_the_rows_read_results_reads(tmp_path, caplog):
    write(
        tmp_path,
        row(0, error="ImageFetchError: gone"),
        row(1),
        row(0, reward=1.0),  # the retry: read in the place of its line
        row(2),
        b'{"example_id": 3, "rollo',  # torn tail: left out, with the same warning
    )
    streamed = iter_results(tmp_path)
    assert not isinstance(streamed, list)  # one row at a time, never the whole file
    assert list(streamed) == read_results(tmp_path)
    assert "torn" in caplog.text
    with pytest.raises(ResultsError, match="line 5 is torn"):
        iter_results(tmp_path, bad_lines="raise")


def test_iter_results_refuses_a_file_rewritten_between_its_passes(tmp_path):
    """The keys come from the first pass: a file rewritten before the second (a writer
    only appends) is refused, never read as fewer rows than the run has."""
    write(tmp_path, row(0), row(1), row(2))
    streamed = iter_results(tmp_path)  # the first pass has run
    write(tmp_path, row(0), row(1))
    with pytest.raises(ResultsError, match="changed while it was read: 3 rollouts on the first"):
        list(streamed)
