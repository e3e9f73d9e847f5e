"""The book of group ids a receiver keeps: one dedup rule for files and ZeroMQ."""

from __future__ import annotations

from pathlib import Path

from vf_mm.training._commits import Commits, Seen


def test_a_group_is_handed_out_once_and_duplicates_are_counted() -> None:
    book = Commits(None, window=10)
    assert book.arrive("g1", b"w1") is Seen.NEW
    book.hand_out("g1", b"w1")
    assert book.arrive("g1", b"w2") is Seen.IN_USE  # w2 hears of it at the commit
    assert book.duplicates == 1
    count, by_peer = book.commit()
    assert count == 1 and by_peer == {b"w1": ["g1"], b"w2": ["g1"]}
    assert book.arrive("g1", b"w3") is Seen.COMMITTED
    assert book.duplicates == 2 and book.committed == 1
    assert book.commit() == (0, {})


def test_a_file_group_has_no_sender_to_tell() -> None:
    book = Commits(None, window=10)
    book.hand_out("g1", None)
    assert book.commit() == (1, {})


def test_reconcile_names_what_a_sender_must_send_again() -> None:
    book = Commits(None, window=10)
    book.hand_out("done", b"w1")
    book.commit()
    book.hand_out("out", b"w1")
    committed, missing = book.reconcile(b"w2", ["done", "out", "lost"])
    assert (committed, missing) == (["done"], ["lost"])
    assert book.commit()[1] == {b"w1": ["out"], b"w2": ["out"]}


def test_committed_ids_survive_in_the_ledger(tmp_path: Path) -> None:
    book = Commits(tmp_path / "ledger", window=None)
    book.hand_out("g1", None)
    book.commit()
    book.close()
    again = Commits(tmp_path / "ledger", window=None)
    assert again.recovered == 1 and again.arrive("g1", None) is Seen.COMMITTED
    again.close()
