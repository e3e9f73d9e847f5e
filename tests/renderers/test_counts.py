"""``CountedLists``: a returned token list's counts are found again for that very list
only, never for an equal list, one changed since, or one at a reused address."""

from __future__ import annotations

import gc

from vf_mm.renderers._counts import CountedLists

GROUP = (7,)


def test_only_the_very_list_of_its_length_is_found():
    counted = CountedLists()
    ids = [1, 7, 7]
    counted.remember(ids, {GROUP: 2})
    assert counted.get(ids) == {GROUP: 2}
    assert counted.get(list(ids)) is None  # equal, but another list: scanned
    assert counted.get(tuple(ids)) is None
    ids.append(7)
    assert counted.get(ids) is None  # changed since: scanned again


def test_a_list_at_a_freed_lists_address_is_not_taken_for_it():
    """The memo holds what it remembers, so no other list can take its address while the
    entry lives; once dropped (the bound), a new list at any address is unknown."""
    counted = CountedLists(max_tokens=3)
    first = [7, 7, 7]
    counted.remember(first, {GROUP: 3})
    address = id(first)
    del first
    gc.collect()
    assert all(id([7, 7, 7]) != address for _ in range(100))  # still held by the entry
    counted.remember([1, 1], {GROUP: 0})  # past the bound: the first entry goes
    gc.collect()
    lists = [[7, 7, 7] for _ in range(100)]
    assert all(counted.get(each) is None for each in lists)


def test_the_least_recently_used_go_first_past_the_bound():
    counted = CountedLists(max_tokens=4)
    a, b, c = [7, 7], [7], [1, 7]
    counted.remember(a, {GROUP: 2})
    counted.remember(b, {GROUP: 1})
    assert counted.get(a) == {GROUP: 2}  # a used last: b goes first
    counted.remember(c, {GROUP: 1})
    assert counted.get(b) is None and counted.get(a) == {GROUP: 2} and counted.get(c) == {GROUP: 1}
    counted.remember([7] * 5, {GROUP: 5})  # longer than the bound: not kept, nothing dropped
    assert counted.get(a) == {GROUP: 2}
