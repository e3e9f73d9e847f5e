"""``ImageCache``: bounded in bytes (least recently used first), aliases that die with
their entry, one computation per key however many threads miss it at once."""

from __future__ import annotations

import threading
import time

import pytest

from vf_mm.renderers import ImageCache
from vf_mm.renderers._cache import _ENTRY_OVERHEAD

COST = 1000  # what each test entry says it costs
SLOT = COST + _ENTRY_OVERHEAD  # what the cache counts for it


def test_the_byte_bound_evicts_the_least_recently_used():
    cache = ImageCache(max_bytes=3 * SLOT)
    for key in "abc":
        cache.put(key, key.upper(), COST)
    assert cache.nbytes == 3 * SLOT
    assert cache.get("a") == "A"  # a is now the most recently used
    cache.put("d", "D", COST)
    assert "b" not in cache  # b was the least recently used
    assert [cache.get(k) for k in "acd"] == ["A", "C", "D"]
    assert len(cache) == 3 and cache.nbytes <= cache.max_bytes


def test_large_entries_push_out_as_many_small_ones_as_their_bytes_need():
    cache = ImageCache(max_bytes=4 * SLOT)
    for key in "abcd":
        cache.put(key, key, COST)
    cache.put("big", "BIG", 2 * SLOT)  # costs two slots and its own overhead
    assert [k for k in "abcd" if k in cache] == ["d"]
    assert cache.get("big") == "BIG"


def test_an_entry_larger_than_the_bound_is_returned_but_not_kept():
    cache = ImageCache(max_bytes=SLOT)
    cache.put("a", "A", COST)
    assert cache.put("huge", "H", 10 * COST) == "H"
    assert "huge" not in cache and cache.get("a") == "A"  # nothing was evicted for it
    assert ImageCache(max_bytes=0).put("a", "A", 1) == "A"


def test_the_first_writer_wins():
    cache = ImageCache()
    first, second = object(), object()
    assert cache.put("k", first, COST) is first
    assert cache.put("k", second, COST) is first  # every caller shares one object


def test_an_alias_leads_to_its_entry_is_counted_with_it_and_dies_with_it():
    cache = ImageCache(max_bytes=3 * SLOT + 500 + _ENTRY_OVERHEAD)
    cache.put("a", "A", COST)
    assert cache.alias("source of a", "a", 500)
    assert cache.get("source of a") == "A"
    assert cache.nbytes == SLOT + 500 + _ENTRY_OVERHEAD
    assert not cache.alias("source of z", "z")  # no entry, no alias
    for key in "bcd":  # a is evicted, and its alias with it
        cache.put(key, key, COST)
    assert "a" not in cache and "source of a" not in cache
    assert cache.get("source of a") is None
    assert cache.nbytes == 3 * SLOT


def test_a_hit_through_an_alias_marks_the_entry_recently_used():
    cache = ImageCache(max_bytes=2 * SLOT + _ENTRY_OVERHEAD)
    cache.put("a", "A", COST)
    cache.alias("alias", "a")
    cache.put("b", "B", COST)
    cache.get("alias")
    cache.put("c", "C", COST)
    assert "a" in cache and "b" not in cache


def test_concurrent_misses_of_one_key_compute_it_once():
    cache = ImageCache()
    calls = []
    gate = threading.Barrier(8)

    def compute():
        calls.append(1)
        time.sleep(0.05)  # long enough for the other seven to miss and wait
        return "value", COST

    results = []

    def worker():
        gate.wait()
        results.append(cache.compute("k", compute))

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1
    assert sorted(computed for _, computed in results) == [False] * 7 + [True]
    assert {value for value, _ in results} == {"value"}
    assert not cache._flights  # nothing left behind


def test_a_failed_computation_leaves_the_key_to_the_next_caller():
    cache = ImageCache()

    def fail():
        raise RuntimeError("decoder broke")

    with pytest.raises(RuntimeError):
        cache.compute("k", fail)
    assert "k" not in cache and not cache._flights
    assert cache.compute("k", lambda: ("v", COST)) == ("v", True)


@pytest.mark.parametrize("bad", [-1, 1.5, True, "1GB"])
def test_the_bound_must_be_a_byte_count(bad):
    with pytest.raises(ValueError, match="max_bytes"):
        ImageCache(max_bytes=bad)
