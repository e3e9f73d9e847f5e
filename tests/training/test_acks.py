"""The ZeroMQ control messages: every hello and reply decodes to what was encoded, and
anything else is refused, never half-read (docs/formats/transport.md)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests._params import UNICODE
from vf_mm.training._acks import (
    ACK,
    HELLO,
    Hello,
    Reply,
    pack_answer,
    pack_count,
    pack_hello,
    pack_ids,
    unpack_hello,
    unpack_ids,
    unpack_reply,
)

ids = st.lists(st.text(UNICODE, min_size=1, max_size=40), max_size=8)
u32 = st.integers(0, 2**32 - 1)


@given(ids)
def test_an_id_list_round_trips(group_ids: list[str]) -> None:
    data = b"xx" + pack_ids(group_ids)
    assert unpack_ids(data, 2) == (group_ids, len(data))


@given(st.integers(0, 255), u32, ids)
def test_a_hello_round_trips(flags: int, request: int, held: list[str]) -> None:
    hello = Hello(flags, request, held)
    assert unpack_hello(pack_hello(hello)) == hello


def test_what_is_not_exactly_one_hello_is_none() -> None:
    good = pack_hello(Hello(1, 7, ["a", "b"]))
    assert unpack_hello(good + b"x") is None  # bytes after the id list
    assert unpack_hello(good[:-1]) is None  # an id cut short
    assert unpack_hello(b"\x00" + good[1:]) is None  # not the magic
    assert unpack_hello(good[: HELLO.size - 1]) is None


def test_a_count_decodes_as_a_reply_without_an_instance() -> None:
    reply = unpack_reply(pack_count(12))
    assert reply == Reply(12) and reply.instance is None
    assert len(pack_count(12)) == ACK.size


@given(st.integers(0, 2**64 - 1), st.integers(0, 255), u32, ids, ids)
def test_an_answer_round_trips(
    taken: int, flags: int, request: int, committed: list[str], missing: list[str]
) -> None:
    reply = Reply(taken, b"i" * 16, flags, request, committed, missing)
    assert unpack_reply(pack_answer(reply)) == reply


def test_a_malformed_reply_says_what_is_wrong() -> None:
    answer = pack_answer(Reply(1, b"i" * 16, 0, 0, ["a"], []))
    with pytest.raises(ValueError, match="bytes after the id lists"):
        unpack_reply(answer + b"!")
    with pytest.raises(ValueError, match="malformed"):
        unpack_reply(answer[:-3])
    with pytest.raises(ValueError, match="not a vf_mm receiver"):
        unpack_reply(b"HTTP/1.1 200 OK")
