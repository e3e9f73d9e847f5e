"""What a receiver knows of the groups with ids: committed (in the ledger), handed out and
not committed yet, and which senders wait to hear of each. One book for both transports,
so a file and a ZeroMQ endpoint deduplicate by the same rule: a group whose id is
committed, or handed out and not committed, is never handed to the trainer again.

A *peer* is a ZeroMQ sender's routing id; a file has none (``None``), and nothing is
acknowledged to it.
"""

from __future__ import annotations

import enum
import os

from vf_mm.training._ledger import Ledger


class Seen(enum.Enum):
    """What the book knows of a group id that arrives."""

    NEW = "new"  # hand it out
    COMMITTED = "committed"  # a duplicate of a committed group: acknowledge it now
    IN_USE = "in use"  # a duplicate of one handed out: acknowledge it when that is committed


class Commits:
    """The ids committed (``ledger`` file, or the newest ``window`` in memory) and those
    handed out and not committed. ``duplicates`` counts the groups skipped as either,
    ``committed`` the ids committed through this book, ``recovered`` the ids the ledger
    held when it opened."""

    def __init__(self, ledger: str | os.PathLike[str] | None, *, window: int | None) -> None:
        self._ledger = Ledger(ledger, window=window)
        # handed out, not committed: group id -> the senders to acknowledge it to
        self._in_use: dict[str, list[bytes]] = {}
        self.duplicates = 0
        self.committed = 0

    @property
    def recovered(self) -> int:
        return self._ledger.recovered

    def arrive(self, group_id: str, peer: bytes | None) -> Seen:
        """Note a group with an id from ``peer``; a duplicate is counted, and a peer that
        sent a duplicate of one handed out is acknowledged when it is committed."""
        if group_id in self._ledger:
            self.duplicates += 1
            return Seen.COMMITTED
        waiting = self._in_use.get(group_id)
        if waiting is None:
            return Seen.NEW
        self.duplicates += 1
        if peer is not None and peer not in waiting:
            waiting.append(peer)
        return Seen.IN_USE

    def hand_out(self, group_id: str, peer: bytes | None) -> None:
        self._in_use[group_id] = [] if peer is None else [peer]

    def reconcile(self, peer: bytes, ids: list[str]) -> tuple[list[str], list[str]]:
        """(committed, missing) of the ids a sender holds; ids handed out will be
        acknowledged to it when committed."""
        committed, missing = [], []
        for group_id in ids:
            if group_id in self._ledger:
                committed.append(group_id)
            elif group_id in self._in_use:
                if peer not in self._in_use[group_id]:
                    self._in_use[group_id].append(peer)
            else:
                missing.append(group_id)
        return committed, missing

    def commit(self) -> tuple[int, dict[bytes, list[str]]]:
        """Commit every id handed out: recorded in the ledger first (durably), then
        returned with the senders to tell, by sender."""
        if not self._in_use:
            return 0, {}
        ids = list(self._in_use)
        self._ledger.commit(ids)
        by_peer: dict[bytes, list[str]] = {}
        for group_id, peers in self._in_use.items():
            for peer in peers:
                by_peer.setdefault(peer, []).append(group_id)
        self._in_use.clear()
        self.committed += len(ids)
        return len(ids), by_peer

    def close(self) -> None:
        self._ledger.close()
