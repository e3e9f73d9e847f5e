"""``--shard i/N``: a split by example id that every machine computes alike."""

from __future__ import annotations

import pytest

from vf_mm.workers import Shard, parse_shard, shard_of


@pytest.mark.parametrize("text", ["0/4", " 3 / 4 ", "0/1"])
def test_parse_shard(text):
    shard = parse_shard(text)
    assert str(shard) == text.replace(" ", "") and 0 <= shard.index < shard.count


@pytest.mark.parametrize("text", ["4/4", "1/0", "-1/4", "1", "a/b", "1/2/3", ""])
def test_a_shard_that_is_not_one_is_refused_naming_it(text):
    with pytest.raises(ValueError, match="shard"):
        parse_shard(text)


@pytest.mark.parametrize("ids", [list(range(100)), [f"task-{i}" for i in range(100)]])
def test_shards_cover_every_example_once(ids):
    shards = [Shard(i, 4) for i in range(4)]
    held = [[e for e in ids if s.holds(e)] for s in shards]
    assert sorted(e for part in held for e in part) == sorted(ids)
    assert all(len(part) >= 10 for part in held)  # no shard left (nearly) empty


def test_the_split_depends_on_the_id_alone():
    assert [shard_of(i, 4) for i in range(8)] == [0, 1, 2, 3, 0, 1, 2, 3]
    # a text id's shard is fixed by its bytes (CRC-32), the same in every process
    assert shard_of("task-7", 5) == 549217498 % 5 == 3
    assert shard_of(True, 2) == shard_of("True", 2)  # a bool is not the integer 1
