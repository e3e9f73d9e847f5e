"""PrefixCache: the longest cached prefix of a prompt, with images in the key; ByteLRU:
a byte budget, least recently used out first."""

from __future__ import annotations

import pytest

from vf_mm.inference._prefix_cache import BLOCK, ByteLRU, MediaSpan, PrefixCache

IMG = 99  # an image pad id


def ids(n: int, start: int = 0) -> list[int]:
    return list(range(start, start + n))


def with_image(prefix: int, key: str, length: int = 8, suffix: int = 20):
    tokens = ids(prefix) + [IMG] * length + ids(suffix, 1000)
    return tokens, (MediaSpan(prefix, prefix + length, key),)


def test_finds_the_longest_cached_prefix():
    cache = PrefixCache(1 << 20)
    cache.insert(ids(40), (), "short", 10)
    cache.insert(ids(100), (), "long", 10)
    match = cache.lookup(ids(70) + [-1] * 5, (), limit=74)
    assert match.entry.state == "long" and match.length == 70


def test_matches_into_a_partial_block():
    cache = PrefixCache(1 << 20)
    cache.insert(ids(BLOCK + 5), (), "s", 10)
    assert cache.lookup([*ids(BLOCK + 3), -1], (), limit=100).length == BLOCK + 3


def test_never_reuses_past_the_limit():
    """A prompt's last token is always computed (its logits start the completion)."""
    cache = PrefixCache(1 << 20)
    cache.insert(ids(64), (), "s", 10)
    assert cache.lookup(ids(48), (), limit=47).length == 47


def test_a_miss_when_the_first_block_differs():
    cache = PrefixCache(1 << 20)
    cache.insert(ids(64), (), "s", 10)
    match = cache.lookup([-1, *ids(63, 1)], (), limit=63)
    assert match.entry is None and match.length == 0


def test_the_same_ids_with_another_image_share_nothing_from_the_image_on():
    cache = PrefixCache(1 << 20)
    tokens, spans = with_image(3 * BLOCK + 4, "image:a")
    cache.insert(tokens, spans, "a", 10)
    other_tokens, other_spans = with_image(3 * BLOCK + 4, "image:b")
    assert other_tokens == tokens
    assert cache.lookup(other_tokens, other_spans, limit=len(tokens) - 1).length == 3 * BLOCK + 4
    same = cache.lookup(tokens, spans, limit=len(tokens) - 1)
    assert same.length == len(tokens) - 1


def test_a_match_never_ends_inside_an_image():
    cache = PrefixCache(1 << 20)
    tokens, spans = with_image(BLOCK + 2, "image:a", length=20)
    cache.insert(tokens, spans, "a", 10)
    # the new prompt stops sharing in the middle of the image's pads (a shorter image)
    cut = tokens[: BLOCK + 12] + [-1] * 10
    span = (MediaSpan(BLOCK + 2, BLOCK + 22, "image:a"),)
    assert cache.lookup(cut, span, limit=len(cut) - 1).length == BLOCK + 2


def test_an_exact_entry_is_used_whole_or_not_at_all():
    cache = PrefixCache(1 << 20)
    cache.insert(ids(40), (), "recurrent", 10, exact=True)
    assert cache.lookup(ids(50), (), limit=49).length == 40
    assert cache.lookup(ids(35) + [-1] * 10, (), limit=44).length == 0


def test_an_entry_extended_by_its_own_continuation_is_replaced():
    cache = PrefixCache(1 << 20)
    cache.insert(ids(40), (), "turn 1", 10)
    first = cache.lookup(ids(60), (), limit=59)
    cache.insert(ids(70), (), "turn 2", 10, replaces=first.entry)
    assert len(cache) == 1 and cache.nbytes == 10
    # a different continuation keeps the entry it started from
    second = cache.lookup(ids(80), (), limit=79)
    cache.insert(ids(60) + [-5] * 20, (), "branch", 10, replaces=second.entry)
    assert len(cache) == 2


def test_the_least_recently_used_entry_is_evicted_first():
    cache = PrefixCache(30)
    cache.insert(ids(32), (), "a", 10)
    cache.insert(ids(32, 500), (), "b", 10)
    cache.insert(ids(32, 900), (), "c", 10)
    cache.lookup(ids(32), (), limit=31)  # "a" is now the most recently used
    cache.insert(ids(32, 2000), (), "d", 10)
    assert cache.lookup(ids(32, 500), (), limit=31).entry is None
    assert cache.lookup(ids(32), (), limit=31).entry.state == "a"
    assert cache.nbytes == 30


def test_an_entry_larger_than_the_budget_is_not_kept():
    cache = PrefixCache(30)
    cache.insert(ids(32), (), "a", 10)
    cache.insert(ids(32, 500), (), "huge", 31)
    assert len(cache) == 1 and cache.lookup(ids(32, 500), (), limit=31).entry is None


def test_clear_forgets_everything():
    cache = PrefixCache(100)
    cache.insert(ids(32), (), "a", 10)
    cache.clear()
    assert len(cache) == 0 and cache.nbytes == 0
    assert cache.lookup(ids(32), (), limit=31).entry is None


def test_byte_lru_refuses_a_negative_budget():
    with pytest.raises(ValueError, match=">= 0"):
        ByteLRU(-1)


def test_byte_lru_get_refreshes_and_put_reports_evictions():
    lru = ByteLRU(20)
    lru.put("a", 1, 10)
    lru.put("b", 2, 10)
    assert lru.get("a") == 1
    assert lru.put("c", 3, 10) == ["b"]
    assert lru.peek("b") is None and lru.nbytes == 20


def test_byte_lru_keeps_the_new_value_when_it_evicts():
    evicted = []
    lru = ByteLRU(20, on_evict=lambda key, value: evicted.append((key, value)))
    lru.put("a", 1, 10)
    lru.put("b", 2, 10)
    lru.put("c", 3, 15)  # evicts a and b
    assert lru.peek("c") == 3
    assert evicted == [("a", 1), ("b", 2)]


def test_every_entry_that_leaves_is_reported():
    """The pool engine's entries hold ranges of its KV arena: each one that leaves the
    cache (evicted, replaced, dropped, too large, cleared) must be reported once."""
    gone: list[str] = []
    cache = PrefixCache(30, on_drop=lambda entry: gone.append(entry.state))
    cache.insert(ids(32), (), "a", 10)
    cache.insert(ids(32, 500), (), "b", 10)
    cache.insert(ids(32, 900), (), "huge", 31)  # never kept
    first = cache.lookup(ids(48), (), limit=47)
    cache.insert(ids(60), (), "a2", 10, replaces=first.entry)  # replaces a
    cache.insert(ids(32, 2000), (), "c", 10)
    cache.insert(ids(32, 3000), (), "d", 10)  # evicts b, the least recently used
    assert cache.evict_one(keep=cache.lookup(ids(32, 2000), (), limit=31).entry)
    cache.drop(cache.lookup(ids(32, 2000), (), limit=31).entry)
    cache.insert(ids(32, 4000), (), "e", 10)
    cache.clear()
    assert sorted(gone) == sorted(["huge", "a", "b", "a2", "c", "d", "e"])
    assert len(gone) == len(set(gone))
