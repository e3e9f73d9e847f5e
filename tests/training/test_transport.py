"""The trainer hop: GroupSender / GroupReceiver over stream files and ZeroMQ (ipc://, tcp://)."""

from __future__ import annotations

import asyncio
import io
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import zmq

from vf_mm.errors import (
    BackPressureTimeout,
    CorruptFrameError,
    DecodeError,
    FrameTooLargeError,
    ReceiveTimeout,
    StreamEndedEarlyError,
    StreamError,
    StreamHeaderError,
    TornFrameError,
    TransportError,
)
from vf_mm.training import (
    GroupReceiver,
    GroupSender,
    read_groups,
)
from vf_mm.training._acks import ACK, ACK_MAGIC
from vf_mm.training._internal import is_endpoint
from vf_mm.wire import (
    FRAME_HEADER_SIZE,
    STREAM_HEADER_SIZE,
    FrameKind,
    StreamReader,
    frame_header,
    packb,
    parse_frame_header,
    read_stream,
    stream_header,
)

ROOT = Path(__file__).resolve().parents[2]
HEAD_BYTES = 32  # part 0: a stream header and a frame head


def head(message, kind: FrameKind = FrameKind.DATA) -> bytes:
    """Part 0 of a transport message, built with the public frame API only."""
    return stream_header() + frame_header(message, kind=kind)


def kind_of(part0: bytes) -> int:
    return parse_frame_header(part0[STREAM_HEADER_SIZE:]).kind


def group(i: int, size: int = 64) -> dict:
    rng = np.random.default_rng(i)
    return {
        "format": "test/1",
        "example_id": i,
        "rollouts": [{"reward": float(i), "ids": np.arange(5, dtype=np.int32) + i}],
        "images": {f"h{i}": {"pixel_values": rng.standard_normal((size, 8), dtype=np.float32)}},
    }


def assert_same(a: dict, b: dict) -> None:
    assert a["example_id"] == b["example_id"]
    assert a["rollouts"][0]["reward"] == b["rollouts"][0]["reward"]
    assert np.array_equal(a["rollouts"][0]["ids"], b["rollouts"][0]["ids"])
    (h,) = a["images"]
    assert np.array_equal(a["images"][h]["pixel_values"], b["images"][h]["pixel_values"])


@pytest.fixture
def ipc_dir():
    """A short directory for ipc:// sockets (their paths are limited to ~100 bytes)."""
    path = tempfile.mkdtemp(prefix="vfmm-", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def send_in_thread(endpoint: str, groups: list, **kwargs) -> threading.Thread:
    def run() -> None:
        with GroupSender(endpoint, **kwargs) as sender:
            for g in groups:
                sender.send(g)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


# -- files -----------------------------------------------------------------------------


def test_file_round_trip_and_torn_tail(tmp_path):
    path = tmp_path / "groups.vfs"
    sent = [group(i) for i in range(3)]
    sent[1]["rollouts"][0]["t"] = torch.arange(4, dtype=torch.bfloat16)
    with GroupSender(path) as sender:
        for g in sent:
            assert sender.send(g) > 0
    assert sender.sent == 3 and sender.endpoint is None
    got = list(read_groups(path))
    assert len(got) == 3
    for a, b in zip(sent, got, strict=True):
        assert_same(a, b)
    assert torch.equal(got[1]["rollouts"][0]["t"], sent[1]["rollouts"][0]["t"])
    assert len(list(read_stream(path))) == 3  # the groups; the end marker is no item
    assert list(read_groups(f"file://{path}"))[2]["example_id"] == 2

    end_marker = FRAME_HEADER_SIZE + len(packb({"sent": 3, "error": None}))
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(size - end_marker - 10)  # into the last group
    receiver = GroupReceiver(path)
    assert [g["example_id"] for g in (next(receiver), next(receiver))] == [0, 1]
    with pytest.raises(TornFrameError):
        next(receiver)
    receiver.close()


def test_a_file_ends_with_an_end_marker_that_tells_finished_from_cut_off(tmp_path):
    """A finished file's last frame is its end marker; a file cut off after a whole group
    (a writer killed -9) reads the same groups, and ``ended`` says it has none."""
    path = tmp_path / "groups.vfs"
    with GroupSender(path) as sender:
        sender.send(group(0))
        sender.send(group(1))
    with GroupReceiver(path) as receiver:
        assert [g["example_id"] for g in receiver] == [0, 1]
        assert receiver.ended and receiver.ends == [{"sent": 2, "error": None}]
    with StreamReader(path) as reader:  # the wire's reader: the marker is no item
        assert len(list(reader)) == 2 and reader.ended and reader.ends[0]["sent"] == 2
    end_marker = FRAME_HEADER_SIZE + len(packb({"sent": 2, "error": None}))
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size - end_marker)
    with GroupReceiver(path) as receiver:
        assert [g["example_id"] for g in receiver] == [0, 1]
        assert not receiver.ended and receiver.ends == []


def test_a_file_whose_writer_stopped_early_raises_after_its_last_group(tmp_path):
    """The reason an early stop gave (an exception, Ctrl-C, --max-errors) is the file's
    end marker; its reader raises it, typed, after every whole group."""
    path = tmp_path / "groups.vfs"
    with pytest.raises(RuntimeError), GroupSender(path) as sender:
        sender.send(group(0))
        raise RuntimeError("backend died")
    got = []
    with pytest.raises(StreamEndedEarlyError) as info:
        for g in read_groups(path):
            got.append(g["example_id"])
    assert got == [0]
    assert info.value.sent == 1 and info.value.reason == "RuntimeError: backend died"
    assert "stopped early after 1 groups (RuntimeError: backend died)" in str(info.value)
    receiver = GroupReceiver(path)
    next(receiver)
    with pytest.raises(StreamEndedEarlyError):
        next(receiver)
    assert receiver.ended and receiver.ends == [{"sent": 1, "error": "RuntimeError: backend died"}]
    receiver.close()
    assert [g["example_id"] for g in read_stream(path)] == [0]  # the wire reads it as before


def test_appending_after_an_end_marker_reads_every_group(tmp_path):
    path = tmp_path / "groups.vfs"
    with GroupSender(path) as sender:
        sender.send(group(0))
    with GroupSender(path, append=True) as sender:
        sender.send(group(1))
    with GroupReceiver(path) as receiver:
        assert [g["example_id"] for g in receiver] == [0, 1]
        assert receiver.ended and [e["sent"] for e in receiver.ends] == [1, 1]


def test_unsupported_scheme_and_closed_sender(tmp_path):
    assert is_endpoint("tcp://127.0.0.1:5555") and is_endpoint("ipc:///tmp/x")
    assert not is_endpoint(str(tmp_path / "x.vfs")) and not is_endpoint(tmp_path)
    with pytest.raises(TransportError, match="unsupported transport"):
        GroupSender("udp://127.0.0.1:9")
    sender = GroupSender(tmp_path / "x.vfs")
    sender.close()
    with pytest.raises(TransportError, match="closed"):
        sender.send({"a": 1})


# -- ZeroMQ ----------------------------------------------------------------------------


def test_zmq_message_layout_is_a_one_frame_stream(ipc_dir):
    """Part 0 + part 1 of a group message are a whole one-frame stream file; the sender
    waits for the receiver's acknowledgement of its end marker before it closes."""
    endpoint = f"ipc://{ipc_dir}/raw"
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.bind(endpoint)
    sender = GroupSender(endpoint, linger_s=10)
    sender.send(group(7))
    peer, *parts = router.recv_multipart()
    assert len(parts) == 2 and len(parts[0]) == HEAD_BYTES == STREAM_HEADER_SIZE + FRAME_HEADER_SIZE
    assert parts[0] == head(parts[1])  # exactly the public frame API's bytes
    assert kind_of(parts[0]) == FrameKind.DATA
    (item,) = StreamReader(io.BytesIO(parts[0] + parts[1]))
    assert_same(item, group(7))
    closing = threading.Thread(target=sender.close)
    closing.start()
    peer, end_head, end = router.recv_multipart()  # the end-of-stream marker
    assert end_head == head(end, FrameKind.END)
    assert kind_of(end_head) == FrameKind.END
    time.sleep(0.2)
    assert closing.is_alive()  # still waiting for the trainer to take everything
    router.send_multipart([peer, ACK.pack(ACK_MAGIC, 2)])
    closing.join(5)
    assert not closing.is_alive() and sender.delivered
    router.close(linger=0)
    ctx.term()


def test_ipc_round_trip_from_a_thread(ipc_dir):
    sent = [group(i, size=4096) for i in range(5)]
    with GroupReceiver(f"ipc://{ipc_dir}/g", timeout_s=10) as receiver:
        thread = send_in_thread(receiver.endpoint, sent)
        got = list(receiver)
        thread.join(10)
    assert len(got) == 5
    for a, b in zip(sent, got, strict=True):
        assert_same(a, b)
        assert b["images"][f"h{a['example_id']}"]["pixel_values"].flags.writeable
    assert receiver.ends == [{"sent": 5, "error": None}] and receiver.received == 5


SENDER_SCRIPT = """
import sys
import numpy as np
from vf_mm.training import GroupSender
with GroupSender(sys.argv[1]) as sender:
    for i in range(3):
        sender.send({"example_id": i, "x": np.full((512, 512), i, dtype=np.float32)})
"""


def test_tcp_round_trip_from_a_subprocess():
    with socket.socket() as s:  # a free port
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    endpoint = f"tcp://127.0.0.1:{port}"
    with GroupReceiver(endpoint, timeout_s=60) as receiver:
        proc = subprocess.Popen([sys.executable, "-c", SENDER_SCRIPT, endpoint], cwd=ROOT)
        got = list(receiver)
        assert proc.wait(60) == 0
    assert [g["example_id"] for g in got] == [0, 1, 2]
    for i, g in enumerate(got):
        assert g["x"].shape == (512, 512) and (g["x"] == i).all()
    assert receiver.ends == [{"sent": 3, "error": None}]


def test_sender_may_bind_and_receiver_connect():
    sender = GroupSender("tcp://127.0.0.1:*", bind=True)
    assert sender.endpoint.startswith("tcp://127.0.0.1:")
    with GroupReceiver(sender.endpoint, bind=False, timeout_s=10) as receiver:
        sender.send(group(1))
        assert_same(next(receiver), group(1))
        closing = threading.Thread(target=sender.close)
        closing.start()
        assert list(receiver) == [] and receiver.ends == [{"sent": 1, "error": None}]
        closing.join(10)
    assert sender.delivered


def test_binding_an_endpoint_in_use_is_a_clear_error():
    with GroupReceiver("tcp://127.0.0.1:*") as first, pytest.raises(TransportError, match="bind"):
        GroupReceiver(first.endpoint)


def test_back_pressure_blocks_the_sender_until_the_trainer_reads(ipc_dir):
    """hwm=2 and a trainer that does not read: sends stall after exactly 2 groups, stay
    stalled (nothing more is queued), and resume one for one as the trainer reads."""
    hwm, total = 2, 40
    completed = []
    payload = {"x": np.zeros(1 << 18, dtype=np.float32)}  # 1 MiB
    receiver = GroupReceiver(f"ipc://{ipc_dir}/bp", timeout_s=20)

    def produce() -> None:
        with GroupSender(receiver.endpoint, hwm=hwm) as sender:
            for i in range(total):
                sender.send({**payload, "i": i})
                completed.append(i)

    thread = threading.Thread(target=produce, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while len(completed) < hwm and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.5)
    assert len(completed) == hwm and thread.is_alive()  # blocked, not queueing more
    assert next(receiver)["i"] == 0  # the trainer takes one: exactly one more goes out
    deadline = time.monotonic() + 10
    while len(completed) < hwm + 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.3)
    assert len(completed) == hwm + 1
    got = [0] + [g["i"] for g in receiver]  # the trainer reads on: the sender finishes
    thread.join(10)
    assert not thread.is_alive()
    assert got == list(range(total)) and receiver.ends == [{"sent": total, "error": None}]
    receiver.close()


def test_send_timeout_raises_back_pressure_timeout(ipc_dir):
    sender = GroupSender(f"ipc://{ipc_dir}/nobody", hwm=1, timeout_s=0.2, linger_s=0.1)
    with pytest.raises(BackPressureTimeout, match="not taking them") as info:
        for i in range(10):
            sender.send(group(i))
    assert isinstance(info.value, TimeoutError) and info.value.sent <= 2
    sender.close()
    assert not sender.delivered  # nobody took the end marker either


def test_receive_timeout_raises(ipc_dir):
    with GroupReceiver(f"ipc://{ipc_dir}/quiet", timeout_s=0.2) as receiver:
        start = time.monotonic()
        with pytest.raises(ReceiveTimeout, match="no message") as info:
            next(receiver)
        assert isinstance(info.value, TimeoutError)
        assert time.monotonic() - start >= 0.15  # it waited its timeout, not less


def bad_messages() -> list[tuple[list[bytes], type]]:
    good = packb(group(1))
    good_head = head(good)
    flipped = bytearray(good)
    flipped[len(flipped) // 2] ^= 0xFF
    bad_magic = bytearray(good_head)
    bad_magic[1:5] = b"NOPE"
    unknown_kind = bytearray(good_head)
    unknown_kind[-4] = 9  # the frame head's u32 kind
    not_msgpack = b"\xc1\xc1\xc1"
    return [
        ([good_head, bytes(flipped)], CorruptFrameError),  # checksum
        ([good_head, bytes(good)[:-5]], CorruptFrameError),  # truncated
        ([good_head], CorruptFrameError),  # one part
        ([bytes(bad_magic), bytes(good)], StreamHeaderError),
        ([head(not_msgpack), not_msgpack], DecodeError),
        ([bytes(unknown_kind), bytes(good)], CorruptFrameError),  # unknown kind
        ([head(packb("another message")), bytes(good)], CorruptFrameError),  # not its head
        ([head(packb({"x": 1}), FrameKind.END), packb({"x": 1})], CorruptFrameError),  # no "sent"
    ]


def push_raw(endpoint: str, messages: list[list[bytes]]) -> None:
    """Send raw multipart messages from a DEALER that ignores acknowledgements."""
    ctx = zmq.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(endpoint)
    for parts in messages:
        dealer.send_multipart(parts)
    dealer.close(linger=5000)
    ctx.term()


def good_tail() -> list[list[bytes]]:
    """A good group, then an end marker."""
    good = packb(group(1))
    end = packb({"sent": 1, "error": None})
    return [
        [head(good), bytes(good)],
        [head(end, FrameKind.END), bytes(end)],
    ]


def test_a_corrupt_message_fails_that_group_not_the_receiver(ipc_dir):
    bad = bad_messages()
    with GroupReceiver(f"ipc://{ipc_dir}/bad", timeout_s=10) as receiver:
        push_raw(receiver.endpoint, [parts for parts, _ in bad] + good_tail())
        for index, (_, error) in enumerate(bad):
            with pytest.raises(error) as info:
                next(receiver)
            assert isinstance(info.value, (StreamError, DecodeError))
            assert f"message {index}" in str(info.value) + "".join(info.value.__notes__)
        assert_same(next(receiver), group(1))  # the receiver goes on
        assert list(receiver) == []
    assert receiver.received == 1 and receiver.index == len(bad) + 2


def test_corrupt_messages_can_be_skipped_and_recorded(ipc_dir):
    bad = bad_messages()
    with GroupReceiver(f"ipc://{ipc_dir}/skip", timeout_s=10, errors="skip") as receiver:
        push_raw(receiver.endpoint, [parts for parts, _ in bad] + good_tail())
        got = list(receiver)
    assert len(got) == 1 and got[0]["example_id"] == 1
    assert [type(e) for _, _, e in receiver.skipped] == [error for _, error in bad]
    assert [i for i, _, _ in receiver.skipped] == list(range(len(bad)))


def test_a_message_over_the_limit_is_refused_by_the_sender(ipc_dir):
    with GroupSender(f"ipc://{ipc_dir}/big", max_frame_bytes=1000, linger_s=0) as sender:
        with pytest.raises(FrameTooLargeError):
            sender.send(group(1, size=1000))
        assert sender.sent == 0


def test_many_senders_one_receiver(ipc_dir):
    senders, per_sender = 4, 10
    with GroupReceiver(f"ipc://{ipc_dir}/many", senders=senders, timeout_s=20) as receiver:
        threads = [
            send_in_thread(receiver.endpoint, [{"sender": s, "i": i} for i in range(per_sender)])
            for s in range(senders)
        ]
        got = list(receiver)
        for thread in threads:
            thread.join(10)
    assert len(got) == senders * per_sender
    for s in range(senders):  # each sender's groups arrive in its order
        assert [g["i"] for g in got if g["sender"] == s] == list(range(per_sender))
    assert sorted(e["sent"] for e in receiver.ends) == [per_sender] * senders


def test_asend_from_an_event_loop_keeps_order(ipc_dir):
    receiver = GroupReceiver(f"ipc://{ipc_dir}/async", timeout_s=10)
    got = []
    reading = threading.Thread(target=lambda: got.extend(g["example_id"] for g in receiver))
    reading.start()

    async def main() -> None:
        async with GroupSender(receiver.endpoint) as sender:
            sizes = await asyncio.gather(*(sender.asend(group(i)) for i in range(6)))
            assert all(n > 0 for n in sizes) and sender.sent == 6
        assert sender.delivered

    asyncio.run(main())
    reading.join(10)
    assert got == list(range(6))
    receiver.close()


def test_an_exception_in_the_with_block_goes_in_the_end_marker(ipc_dir):
    with GroupReceiver(f"ipc://{ipc_dir}/err", timeout_s=10) as receiver:
        got = []
        reading = threading.Thread(target=lambda: got.extend(g["example_id"] for g in receiver))
        reading.start()
        with pytest.raises(RuntimeError), GroupSender(receiver.endpoint) as sender:
            sender.send(group(0))
            raise RuntimeError("backend died")
        reading.join(10)
    assert got == [0] and sender.delivered
    assert receiver.ends == [{"sent": 1, "error": "RuntimeError: backend died"}]


def test_close_waits_for_the_trainer_then_gives_up_after_linger(ipc_dir):
    """A sender whose last groups the trainer has not taken yet waits for it on close;
    a trainer that never takes them costs linger_s, and delivered says so."""
    with GroupReceiver(f"ipc://{ipc_dir}/linger", timeout_s=10) as receiver:
        sender = GroupSender(receiver.endpoint, linger_s=0.3)
        sender.send(group(0))
        start = time.monotonic()
        sender.close()
        assert time.monotonic() - start >= 0.25 and not sender.delivered  # linger, not less
