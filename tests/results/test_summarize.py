"""summarize / pass_at_k against hand-computed values."""

from __future__ import annotations

import itertools
import math

import pytest

from vf_mm.results import pass_at_k, summarize


def row(example_id, reward, *, error=None, metrics=None, turns=1, tokens=(10, 5)):
    return {
        "example_id": example_id,
        "rollout_index": 0,
        "reward": reward,
        "error": error,
        "metrics": metrics or {},
        "num_turns": turns,
        "prompt_tokens": tokens[0] if tokens else None,
        "completion_tokens": tokens[1] if tokens else None,
    }


# example 0: 2 of 4 succeed; example 1: 1 of 4; example 2: none (one rollout errored)
ROWS = [
    *(row(0, r) for r in (1.0, 0.0, 1.0, 0.0)),
    *(row(1, r) for r in (0.0, 0.0, 0.0, 1.0)),
    row(2, None, error="timeout", tokens=None, turns=0),
    *(row(2, r) for r in (0.0, 0.0, 0.0)),
]


def test_pass_at_k_by_hand():
    summary = summarize(ROWS, k_values=(1, 2, 4))
    # pass@1 = mean(c/n) = (2/4 + 1/4 + 0) / 3
    assert summary["pass_at_k"]["1"] == pytest.approx(0.25)
    # pass@2: 1 - C(n-c,2)/C(4,2): ex0 1 - 1/6, ex1 1 - 3/6, ex2 0 -> (5/6 + 1/2) / 3 = 4/9
    assert summary["pass_at_k"]["2"] == pytest.approx(4 / 9)
    # pass@4: ex0 and ex1 have a success among all 4, ex2 none -> 2/3
    assert summary["pass_at_k"]["4"] == pytest.approx(2 / 3)
    assert summary["pass_threshold"] == 1.0


def test_default_k_values_are_powers_of_two_up_to_the_fewest_rollouts():
    assert list(summarize(ROWS)["pass_at_k"]) == ["1", "2", "4"]
    assert list(summarize(ROWS[:3])["pass_at_k"]) == ["1", "2"]  # 3 rollouts of example 0
    assert summarize([])["pass_at_k"] == {"1": None}


def test_k_larger_than_an_examples_rollouts_skips_that_example():
    rows = [row(0, 1.0), row(0, 0.0), row(1, 0.0)]  # example 1 has one rollout only
    summary = summarize(rows, k_values=(1, 2, 3))
    assert summary["pass_at_k"]["1"] == pytest.approx((0.5 + 0.0) / 2)
    assert summary["pass_at_k"]["2"] == pytest.approx(1.0)  # example 0 only
    assert summary["pass_at_k"]["3"] is None
    with pytest.raises(ValueError, match="k_values"):
        summarize(rows, k_values=(0,))


def test_threshold():
    rows = [row(0, 0.6), row(0, 0.4)]
    assert summarize(rows, k_values=(1,))["pass_at_k"]["1"] == 0.0
    assert summarize(rows, k_values=(1,), threshold=0.5)["pass_at_k"]["1"] == 0.5


def test_counts_reward_metrics_tokens_and_turns():
    rows = [
        row(0, 1.0, metrics={"len": 1.0, "fmt": 1.0}, turns=2, tokens=(100, 20)),
        row(0, 0.5, metrics={"len": 3.0}, turns=4, tokens=(50, 10)),
        row(1, None, error="boom", metrics={"len": None}, turns=1, tokens=None),
    ]
    summary = summarize(rows)
    assert summary["count"] == 3 and summary["examples"] == 2
    assert summary["errors"] == 1
    assert summary["reward"] == {"mean": 0.75, "std": 0.25, "count": 2}
    assert summary["metrics"] == {
        "fmt": {"mean": 1.0, "std": 0.0, "count": 1},
        "len": {"mean": 2.0, "std": 1.0, "count": 2},
    }
    assert summary["tokens"] == {"prompt": 150, "completion": 30, "rows_without_tokens": 1}
    assert summary["mean_turns"] == pytest.approx(7 / 3)


def test_truncated_rollouts_are_counted_and_scored_like_others():
    """A rollout that ran out of context is a scored row marked truncated (older files
    have no such key: not truncated)."""
    cut = {**row(0, 0.5, turns=9), "truncated": True}
    summary = summarize([cut, {**row(0, 1.0), "truncated": False}, row(1, 0.0)])
    assert summary["truncated"] == 1 and summary["errors"] == 0
    assert summary["reward"]["count"] == 3
    assert summarize(ROWS)["truncated"] == 0


def test_errors_counted_in_the_hand_example():
    summary = summarize(ROWS)
    assert summary["errors"] == 1
    assert summary["reward"]["count"] == 11
    assert summary["reward"]["mean"] == pytest.approx(3 / 11)
    assert summary["tokens"]["rows_without_tokens"] == 1


def test_std_of_one_element_is_zero():
    summary = summarize([row(0, 0.7, metrics={"m": 2.0})])
    assert summary["reward"] == {"mean": 0.7, "std": 0.0, "count": 1}
    assert summary["metrics"]["m"]["std"] == 0.0


def test_empty():
    summary = summarize([])
    assert summary["count"] == 0 and summary["errors"] == 0
    assert summary["reward"] == {"mean": None, "std": None, "count": 0}
    assert summary["mean_turns"] is None


@pytest.mark.parametrize("n", range(1, 7))
def test_pass_at_k_matches_enumeration(n):
    for c in range(n + 1):
        outcomes = [True] * c + [False] * (n - c)
        for k in range(1, n + 1):
            subsets = list(itertools.combinations(outcomes, k))
            expected = sum(any(s) for s in subsets) / len(subsets)
            assert math.isclose(pass_at_k(n, c, k), expected), (n, c, k)
    with pytest.raises(ValueError):
        pass_at_k(n, 0, n + 1)


def test_errors_are_counted_by_type_whatever_form_the_file_holds():
    rows = [
        row(0, None, error={"type": "ImageFetchError", "message": "gone", "where": "turn 1"}),
        row(1, None, error={"type": "ImageFetchError", "message": "also gone", "where": "turn 2"}),
        row(2, None, error="ImageFetchError: one-line form (results format 1)"),
        row(3, None, error="no type prefix"),
        row(4, None, error={"unexpected": "shape"}),  # another tool's file: counted, not lost
        row(5, 1.0),
    ]
    kinds = summarize(rows)["error_kinds"]
    assert kinds["ImageFetchError"] == {"count": 3, "first": "gone"}
    assert kinds["Error"]["count"] == 2 and next(iter(kinds)) == "ImageFetchError"


def test_a_failed_rollouts_metrics_are_kept_in_its_row_but_not_averaged():
    rows = [
        row(0, 1.0, metrics={"correct": 1.0}),
        row(
            1,
            None,
            error={"type": "ResultsError", "message": "m", "where": "storing"},
            metrics={"correct": 0.0},
        ),
    ]
    assert summarize(rows)["metrics"] == {"correct": {"mean": 1.0, "std": 0.0, "count": 1}}


def test_rows_may_be_a_stream_read_once():
    assert summarize(row for row in ROWS) == summarize(ROWS)  # a generator: one pass, none kept


def test_unscored_rows_are_no_outcome_for_pass_at_k():
    """A recorded session nobody scored has neither a reward nor an error: it is not a
    failure. pass@k counts only scored rows (an errored row is a failure, as before)."""
    unscored = [{"example_id": e, "reward": None, "error": None} for e in ("a", "b")]
    summary = summarize(unscored)
    assert summary["pass_at_k"] == {"1": None} and summary["examples"] == 2
    mixed = [
        *unscored,
        {"example_id": "a", "reward": 1.0, "error": None},
        {"example_id": "c", "reward": None, "error": {"type": "X", "message": "m"}},
    ]
    summary = summarize(mixed)
    assert summary["examples"] == 3
    assert summary["pass_at_k"] == {"1": 0.5}  # a: 1 of 1 scored; c: its error fails it
