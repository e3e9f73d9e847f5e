"""Shards: one run split across independent processes or machines by example id.

``--shard i/N`` runs the examples whose id falls in shard ``i`` of ``N``. The split
depends on the example id alone (not on the order rows are read, nor on the machine), so
every shard of a run agrees on it, a shard run again takes the same examples, and
``vf-mm merge`` can put the shards back together. An integer id goes to shard
``id mod N`` (consecutive examples spread evenly); any other id by the CRC-32 of its
text.
"""

from __future__ import annotations

import itertools
import re
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Shard:
    """Shard ``index`` of ``count`` (``0 <= index < count``).

    Attributes:
        index: This shard's number, from 0.
        count: How many shards there are.
    """

    index: int
    count: int

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    def holds(self, example_id: Any) -> bool:
        """Whether the example with this id belongs to this shard.

        Args:
            example_id: The example's id.
        """
        return shard_of(example_id, self.count) == self.index

    def select(self, rows: Iterable[Any]) -> tuple[Iterator[Any], Iterator[Any]]:
        """The rows that this shard holds, and their ids.

        Two iterators over one pass of ``rows``, read in step (``evaluate`` takes a row and its
        id together), so a streamed dataset is read once and never listed.

        Args:
            rows: Dataset rows; a row's id is its ``example_id``, else its position.
        """
        pairs = (
            (row.get("example_id", position), row)
            for position, row in enumerate(rows)
            if self.holds(row.get("example_id", position))
        )
        by_row, by_id = itertools.tee(pairs)
        return (row for _, row in by_row), (example_id for example_id, _ in by_id)


def parse_shard(text: str) -> Shard:
    """``"i/N"`` as a ``Shard``.

    Args:
        text: The spec, ``"i/N"``.

    Raises:
        ValueError: Anything else, naming the mistake.
    """
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", str(text))
    if match is None:
        raise ValueError(f"{text!r} is not a shard: write i/N, e.g. 0/4")
    index, count = int(match.group(1)), int(match.group(2))
    if count < 1 or index >= count:
        raise ValueError(f"shard {text!r}: i/N needs N >= 1 and 0 <= i < N")
    return Shard(index, count)


def shard_of(example_id: Any, count: int) -> int:
    """The shard (of ``count``) an example id falls in.

    Args:
        example_id: The example's id.
        count: How many shards there are.
    """
    if isinstance(example_id, bool) or not isinstance(example_id, int):
        return zlib.crc32(str(example_id).encode("utf-8")) % count
    return example_id % count
