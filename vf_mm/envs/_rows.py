"""A dataset's rows, read one at a time: ``LazyRows``, ``iter_rows``, ``count_rows``.

A run pulls rows as it has room for them (``Environment.evaluate``), so what an
environment hands over may be any of:

- a list or tuple of row dicts, or a ``datasets.Dataset`` (map-style): sized, so a run
  knows its total and a seed can shuffle the order (by index: only the rows used are read);
- any other ``Sequence`` of rows, such as ``LazyRows``: sized, each row built when it is
  read (1M examples cost nothing until they are used);
- an iterable of rows without a length: a streaming ``datasets.IterableDataset``, a
  generator, any object with ``__iter__``. Its total is unknown (the progress shows a
  count and a rate); a generator is read once, so for an environment evaluated more than
  once pass a function that returns a new one (a generator function);
- a function of no arguments that returns such an iterable: called for every pass.

Nothing here needs ``len()`` of an unsized source or keeps the rows it has handed out:
the invariant is that memory for rows is what the caller holds, never the dataset's size.
A row that is not a dict is refused where it is read (``TypeError`` naming its position),
since checking an unsized source up front would read it all.

A row of a ``datasets.Dataset`` is decoded (its ``Image`` features to PIL images) when it
is read, so an image is decoded on its row's first use, not when the run starts.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

__all__ = ["LazyRows", "count_rows", "iter_rows", "is_sized"]


class LazyRows(Sequence[dict[str, Any]]):
    """A dataset of any size that costs memory only for the rows in use.

    Row ``i`` is ``make_row(i)``, built each time it is read and never kept. Slicing gives
    another ``LazyRows`` over the slice's indices.

    Args:
        length: How many rows (or the range of indices).
        make_row: Builds row ``i``; must be deterministic in ``i`` (a resumed run, or a
            second pass, reads a row again and must get the same example) and return a
            dict.
    """

    __slots__ = ("_indices", "_make_row")

    def __init__(self, length: int | range, make_row: Callable[[int], Mapping[str, Any]]) -> None:
        indices = length if isinstance(length, range) else range(_length(length))
        if not callable(make_row):
            raise TypeError(f"make_row must be a function of the index, not {make_row!r}")
        self._indices = indices
        self._make_row = make_row

    def __len__(self) -> int:
        return len(self._indices)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return LazyRows(self._indices[index], self._make_row)
        row = self._make_row(self._indices[index])  # IndexError past the end, as a list
        if not isinstance(row, Mapping):
            raise TypeError(
                f"LazyRows: make_row({self._indices[index]}) returned a "
                f"{type(row).__name__}, not a row dict"
            )
        return dict(row)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for i in range(len(self._indices)):
            yield self[i]

    def __repr__(self) -> str:
        name = getattr(self._make_row, "__qualname__", type(self._make_row).__name__)
        return f"LazyRows({len(self)} rows of {name})"


def _length(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"LazyRows needs a length >= 0 (an int or a range), got {value!r}")
    return value


def is_sized(dataset: Any) -> bool:
    """Whether ``dataset`` knows its length and reads a row by index without the others."""
    return (
        hasattr(dataset, "__len__")
        and hasattr(dataset, "__getitem__")
        and not callable(getattr(dataset, "keys", None))  # a dict is not a dataset of rows
    )


def count_rows(
    dataset: Any, n: int = -1, *, holds: Callable[[Any], bool] | None = None
) -> int | None:
    """How many rows ``iter_rows(dataset, n)`` yields, when known without reading them
    (a sized dataset); None for an iterable or a function (the run counts as it goes).

    ``holds``: count only the rows whose example id it holds (a shard). The ids are the
    rows' positions unless rows carry an ``example_id`` column, which is looked for in a
    ``datasets.Dataset``'s columns, in every row of a list or tuple, and in the first row
    of any other sequence (its rows are built to be read, not listed); where a row may
    name its own id and this cannot tell, None.
    """
    if dataset is None:
        return 0
    if not is_sized(dataset):
        return None
    total = len(dataset)
    total = total if n is None or n < 0 else min(n, total)
    if holds is None:
        return total
    if isinstance(dataset, (list, tuple)):
        return sum(1 for i, row in enumerate(dataset[:total]) if holds(row.get("example_id", i)))
    columns = getattr(dataset, "column_names", None)
    named = "example_id" in columns if columns is not None else (
        total > 0 and "example_id" in dataset[0]
    )  # fmt: skip
    return None if named else sum(1 for i in range(total) if holds(i))


def iter_rows(
    dataset: Any, n: int = -1, *, seed: int | None = None, name: str = "dataset"
) -> Iterator[dict[str, Any]]:
    """The first ``n`` rows of ``dataset`` (all when ``n`` < 0), each a new dict, read as
    the iterator is advanced (module docstring for the forms a dataset takes).

    ``seed`` shuffles a sized dataset's order before the first ``n`` are taken (only
    those rows are read); a ``datasets.IterableDataset`` is shuffled by its own
    ``shuffle(seed=...)`` (a buffer); any other unsized source cannot be shuffled
    without reading it whole, so ``seed`` is refused there (``ValueError``: shuffle it
    at the source).
    """
    limit = None if n is None or n < 0 else n
    if dataset is None:
        return iter(())
    if is_sized(dataset):
        if seed is None:
            count = len(dataset) if limit is None else min(limit, len(dataset))
            return _checked((dataset[i] for i in range(count)), name)
        order = list(range(len(dataset)))
        random.Random(seed).shuffle(order)
        return _checked((dataset[i] for i in order[:limit]), name)
    source = dataset() if callable(dataset) and not isinstance(dataset, Iterable) else dataset
    if not isinstance(source, Iterable) or isinstance(source, (str, bytes, Mapping)):
        raise TypeError(
            f"{name} must give rows (a list of dicts, a datasets.Dataset, an iterable of "
            f"dicts), not a {type(source).__name__}"
        )
    if seed is not None:
        shuffle = getattr(source, "shuffle", None)
        if not callable(shuffle):
            raise ValueError(
                f"{name} is streamed (it has no length), so seed cannot shuffle it without "
                "reading it whole; shuffle it at the source, or pass seed=None"
            )
        source = shuffle(seed=seed)
    return _checked(itertools.islice(source, limit), name)


def _checked(rows: Iterable[Any], name: str) -> Iterator[dict[str, Any]]:
    for position, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise TypeError(
                f"{name}: row {position} is a {type(row).__name__}, not a row dict (a "
                "dataset is a list or iterable of dicts with a 'question' or 'prompt')"
            )
        yield dict(row)
