"""Exactly-once delivery, piece by piece: group ids in frames, acknowledgement after use,
groups sent again to a trainer that restarted, deduplication with and without a ledger,
the ledger's crash safety and its lock, and the run ids stream_rollouts gives groups.

(tests/training/test_fan_in.py proves the whole: four worker processes, one trainer,
both killed mid-run and restarted.)
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
import threading
import time

import numpy as np
import pytest
import zmq

import vf_mm as vf
from vf_mm.errors import BackPressureTimeout, CorruptFrameError, GroupFrameError, LedgerError
from vf_mm.testing import ScriptedChatBackend
from vf_mm.training import (
    MAX_GROUP_ID_BYTES,
    GroupReceiver,
    GroupSender,
    pack_group,
    read_groups,
    read_ledger,
    run_id_for,
    stream_rollouts,
    unpack_group,
)
from vf_mm.training._acks import ANSWER, ANSWER_MAGIC, HELLO, HELLO_MAGIC
from vf_mm.training._ledger import LEDGER_FORMAT, Ledger
from vf_mm.types import (
    MultiModalData,
    PlaceholderRange,
    ResponseTokens,
    RolloutOutput,
    TrajectoryStep,
)
from vf_mm.wire import packb, unpackb, write_stream

# -- helpers ---------------------------------------------------------------------------


def rollouts(example_id: int, n: int = 2) -> list[RolloutOutput]:
    """``n`` rollouts of one example that share one image (real tensors)."""
    rng = np.random.default_rng(example_id)
    item = {
        "pixel_values": rng.standard_normal((8, 12), dtype=np.float32),
        "image_grid_thw": np.array([[1, 2, 4]], dtype=np.int64),
    }
    mm = MultiModalData(
        {"image": [f"{example_id:032x}"]}, {"image": [PlaceholderRange(1, 2)]}, {"image": [item]}
    )
    out = []
    for r in range(n):
        tokens = ResponseTokens(
            prompt_ids=[1, 5, 5, 2],
            completion_ids=[7, 8 + r],
            completion_logprobs=[-0.5, -0.25],
            completion_mask=[1, 1],
            finish_reason="stop",
            multi_modal_data=mm,
        )
        step = TrajectoryStep(prompt=[], completion=[], tokens=tokens)
        out.append(RolloutOutput(example_id, [], [], trajectory=[step], reward=float(r)))
    return out


def group(i: int, run: str = "run") -> dict:
    """A small group with an id: its payload says which it is."""
    return {"group_id": f"{run}/{i}", "i": i, "x": np.full((4, 4), i, dtype=np.float32)}


def wait_until(predicate, what: str, timeout_s: float = 30.0) -> None:
    """Poll ``predicate`` until it holds; fail (saying ``what``) after a generous timeout."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


@pytest.fixture
def ipc_dir():
    """A short directory for ipc:// sockets (their paths are limited to ~100 bytes)."""
    path = tempfile.mkdtemp(prefix="vfmm-", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)


# -- group ids in frames ---------------------------------------------------------------


def test_pack_group_puts_the_group_id_in_the_frame():
    frame = pack_group(rollouts(3), group_id="run-a/3")
    assert frame["group_id"] == "run-a/3" and frame["example_id"] == 3
    got = unpack_group(unpackb(packb(frame)))
    assert [r.group_id for r in got] == ["run-a/3", "run-a/3"]
    assert np.array_equal(
        got[0].trajectory[0].tokens.multi_modal_data.mm_items["image"][0]["pixel_values"],
        np.random.default_rng(3).standard_normal((8, 12), dtype=np.float32),
    )


def test_a_frame_without_an_id_is_as_before_and_decodes_with_none():
    frame = pack_group(rollouts(1))
    assert "group_id" not in frame  # the old layout, byte for byte
    assert set(frame) == {"format", "example_id", "images", "rollouts"}
    assert [r.group_id for r in unpack_group(unpackb(packb(frame)))] == [None, None]


def test_group_ids_are_checked():
    with pytest.raises(TypeError, match="must be a str"):
        pack_group(rollouts(1), group_id=7)
    with pytest.raises(ValueError, match="1 to 1024 UTF-8 bytes"):
        pack_group(rollouts(1), group_id="")
    with pytest.raises(ValueError, match="1 to 1024 UTF-8 bytes, got 1026"):
        pack_group(rollouts(1), group_id="é" * 513)  # 2 bytes each
    assert pack_group(rollouts(1), group_id="é" * 512)["group_id"] == "é" * 512
    assert MAX_GROUP_ID_BYTES == 1024
    frame = unpackb(packb(pack_group(rollouts(1))))
    frame["group_id"] = 5
    with pytest.raises(GroupFrameError, match="'group_id' must be a string"):
        unpack_group(frame)


def test_the_sender_sends_a_groups_id_beside_it(ipc_dir):
    """A group with an id is three parts: the one-frame stream (head, payload) and the id;
    the id comes from the group's group_id field or the group_id keyword."""
    endpoint = f"ipc://{ipc_dir}/raw"
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.bind(endpoint)
    sender = GroupSender(endpoint, linger_s=0)
    sender.send(pack_group(rollouts(2), group_id="run/2"))
    sender.send({"x": 1}, group_id="run/kw")
    sender.send_message(packb({"y": 2}), group_id="run/raw")
    with pytest.raises(ValueError, match="the group's 'group_id' is 'run/3'"):
        sender.send(group(3), group_id="run/other")
    parts = [router.recv_multipart()[1:] for _ in range(3)]
    assert [len(p) for p in parts] == [3, 3, 3]
    assert [p[2] for p in parts] == [b"run/2", b"run/kw", b"run/raw"]
    assert unpackb(parts[0][1])["group_id"] == "run/2"
    assert sender.pending == 3  # held until the trainer commits them
    sender.close()
    router.close(linger=0)
    ctx.term()


# -- acknowledged after use ------------------------------------------------------------


def test_a_group_is_acknowledged_when_the_trainer_is_done_with_it(ipc_dir):
    """Taken is not done: the sender holds a group (and its credit) until the trainer
    asks for the next one, or commits."""
    with GroupReceiver(f"ipc://{ipc_dir}/use", timeout_s=10, senders=None) as receiver:
        sender = GroupSender(receiver.endpoint, hwm=8, linger_s=10)
        for i in range(3):
            sender.send(group(i))
        assert next(receiver)["i"] == 0 and receiver.group_id == "run/0"
        assert sender.pending == 3  # taken, not committed: nothing acknowledged
        assert next(receiver)["i"] == 1  # asking for the next commits the one before
        wait_until(lambda: sender.pending == 2, "group 0's acknowledgement")
        assert receiver.commit() == 1 and receiver.commit() == 0  # explicitly: group 1
        wait_until(lambda: sender.pending == 1, "group 1's acknowledgement")
        assert receiver.committed == 2
        sender.linger_s = 0
        sender.close()


def test_without_autocommit_only_commit_frees_the_window(ipc_dir):
    """hwm=2 and a trainer that took both groups but has not committed them: no credit,
    so a third send times out; after commit() it goes through."""
    with GroupReceiver(
        f"ipc://{ipc_dir}/manual", timeout_s=10, senders=None, autocommit=False
    ) as receiver:
        sender = GroupSender(receiver.endpoint, hwm=2, timeout_s=0.3, linger_s=10)
        sender.send(group(0))
        sender.send(group(1))
        assert [next(receiver)["i"], next(receiver)["i"]] == [0, 1]
        with pytest.raises(BackPressureTimeout):
            sender.send(group(2))  # both taken, neither committed: the window is full
        assert sender.pending == 2 and receiver.commit() == 2
        sender.timeout_s = 30
        sender.send(group(2))  # waits for the commit's acknowledgements, then goes
        assert next(receiver)["i"] == 2 and receiver.commit() == 1
        wait_until(lambda: sender.pending == 0, "group 2's acknowledgement")
        sender.linger_s = 0
        sender.close()


def test_a_changed_timeout_or_linger_is_the_one_the_sender_uses(ipc_dir):
    """``linger_s`` and ``timeout_s`` are settable (``vf-mm rollout`` shortens the linger
    when a run stops early): the ZeroMQ channel uses the new values, not the ones given
    at construction."""
    with GroupReceiver(
        f"ipc://{ipc_dir}/settings", timeout_s=10, senders=None, autocommit=False
    ) as receiver:
        sender = GroupSender(receiver.endpoint, hwm=1, timeout_s=60, linger_s=60)
        sender.send(group(0))
        assert next(receiver)["i"] == 0  # taken, never committed: the window stays full
        sender.timeout_s = 0.05
        with pytest.raises(BackPressureTimeout, match=r"in 0\.05 s"):
            sender.send(group(1))
        sender.linger_s = 0.05
        assert sender.linger_s == sender.timeout_s == 0.05
        sender.close()  # group 0 is never acknowledged: it gives up after the new linger
        assert not sender.delivered


def test_groups_without_ids_are_acknowledged_when_taken(ipc_dir):
    with GroupReceiver(f"ipc://{ipc_dir}/plain", timeout_s=10, autocommit=False) as receiver:
        sender = GroupSender(receiver.endpoint, hwm=8, linger_s=10)
        sender.send({"i": 0})
        assert next(receiver) == {"i": 0} and receiver.group_id is None
        wait_until(lambda: sender.pending == 0, "the count acknowledgement")
        closing = threading.Thread(target=sender.close)
        closing.start()
        assert list(receiver) == []
        closing.join(10)
    assert sender.delivered and receiver.ends == [{"sent": 1, "error": None}]


# -- a trainer that restarts -----------------------------------------------------------


def test_a_restarted_trainer_gets_every_unacknowledged_group_again(ipc_dir, tmp_path):
    """The first trainer commits group 0, holds group 1 and has 2, 3 queued when it dies.
    The sender, connected again to the second, sends again what it lost, and the second
    hands out 1, 2, 3, 4 once each; group 0 is in the ledger and not sent again."""
    endpoint, ledger = f"ipc://{ipc_dir}/restart", tmp_path / "ledger"
    first = GroupReceiver(endpoint, ledger=ledger, timeout_s=10)
    sender = GroupSender(endpoint, hwm=4, linger_s=30)
    for i in range(4):
        sender.send(group(i))
    assert [next(first)["i"], next(first)["i"]] == [0, 1]  # 0 committed, 1 in use
    first.close()  # dies: 1 uncommitted, 2 and 3 lost with its queue
    second = GroupReceiver(endpoint, ledger=ledger, timeout_s=10)
    assert second.recovered == 1 and second.instance != first.instance
    closing = threading.Thread(target=lambda: (sender.send(group(4)), sender.close()))
    closing.start()
    got = [g["i"] for g in second]
    closing.join(30)
    assert sorted(got) == [1, 2, 3, 4] and second.duplicates == 0
    assert 1 <= sender.resent <= 4  # 1 at least (taken by the first); 2-4 if they reached it
    assert sender.delivered and sender.pending == 0
    assert read_ledger(ledger) == ["run/0"] + [f"run/{i}" for i in got]
    second.close()


def test_a_trainer_restarted_while_the_sender_waits_for_credit(ipc_dir, tmp_path):
    """The sender's window is full of groups the dead trainer had taken: it must say
    hello to the new trainer (nothing else would reach it) and send them again."""
    endpoint, ledger = f"ipc://{ipc_dir}/credit", tmp_path / "ledger"
    first = GroupReceiver(endpoint, ledger=ledger, timeout_s=10, senders=None)
    sent = []

    def produce() -> None:
        with GroupSender(endpoint, hwm=2, linger_s=30) as sender:
            for i in range(6):
                sender.send(group(i))
                sent.append(i)
        sent.append(("resent", sender.resent, sender.delivered))

    thread = threading.Thread(target=produce, daemon=True)
    thread.start()
    assert next(first)["i"] == 0
    wait_until(lambda: len(sent) >= 2, "the window to fill")
    first.close()  # 0 uncommitted, 1 queued: the sender's window (hwm=2) is full
    second = GroupReceiver(endpoint, ledger=ledger, timeout_s=10)
    got = [g["i"] for g in second]
    thread.join(30)
    assert sorted(got) == list(range(6))
    assert sent[-1][0] == "resent" and sent[-1][1] >= 1 and sent[-1][2]
    assert read_ledger(ledger) == [f"run/{i}" for i in range(6)]
    second.close()


def test_what_a_new_trainer_misses_is_sent_again_in_the_order_first_sent(ipc_dir):
    """Played by raw sockets: a trainer takes three groups and dies; on the connection to
    the next one the sender says hello naming the three; that one answers 1 committed and
    2, 0 missing; the sender sends 0 then 2 (its order, not the answer's) and forgets 1."""
    endpoint = f"ipc://{ipc_dir}/order"
    ctx = zmq.Context()
    old = ctx.socket(zmq.ROUTER)
    old.bind(endpoint)
    sender = GroupSender(endpoint, linger_s=0)
    for i in range(3):
        sender.send(group(i))
    assert [old.recv_multipart()[3] for _ in range(3)] == [b"run/0", b"run/1", b"run/2"]
    old.close(linger=0)
    new = ctx.socket(zmq.ROUTER)
    new.bind(endpoint)
    wait_until(lambda: sender.pending and new.poll(0), "the sender's hello")
    peer, hello = new.recv_multipart()
    magic, flags, request = HELLO.unpack_from(hello)
    assert (magic, flags) == (HELLO_MAGIC, 0)
    assert hello[HELLO.size :] == struct_ids([b"run/0", b"run/1", b"run/2"])
    answer = ANSWER.pack(ANSWER_MAGIC, b"\x01" * 16, 0, 0, request)
    new.send_multipart([peer, answer + struct_ids([b"run/1"]) + struct_ids([b"run/2", b"run/0"])])
    wait_until(lambda: sender.pending == 2 and new.poll(0), "the groups sent again")
    again = [new.recv_multipart() for _ in range(2)]
    assert [m[3] for m in again] == [b"run/0", b"run/2"] and sender.resent == 2
    assert unpackb(again[1][2])["i"] == 2  # the group itself, as first sent
    sender.close()
    new.close(linger=0)
    ctx.term()


def test_a_hello_is_answered_with_what_to_send_again(ipc_dir, tmp_path):
    """The wire form: a hello naming held ids gets an answer saying which are committed
    and which are missing (the receiver's instance in it)."""
    endpoint, ledger = f"ipc://{ipc_dir}/hello", tmp_path / "ledger"
    earlier = Ledger(ledger, window=None)  # a trainer's earlier life committed run/0
    earlier.commit(["run/0"])
    earlier.close()
    with GroupReceiver(endpoint, ledger=ledger, timeout_s=10, senders=None) as receiver:
        ctx = zmq.Context()
        dealer = ctx.socket(zmq.DEALER)
        dealer.connect(endpoint)
        ids = [b"run/0", b"run/1"]
        body = struct_ids(ids)
        dealer.send(HELLO.pack(HELLO_MAGIC, 0, 7) + body)
        dealer.send_multipart([b"\x00"])  # a bad message after it, so next() returns
        with pytest.raises(CorruptFrameError, match="message 0 has 1 parts"):
            next(receiver)
        answer = dealer.recv()
        magic, instance, taken, flags, request = ANSWER.unpack_from(answer)
        assert magic == ANSWER_MAGIC and instance.hex() == receiver.instance
        assert (taken, flags, request) == (0, 0, 7)
        assert answer[ANSWER.size :] == struct_ids([b"run/0"]) + struct_ids([b"run/1"])
        dealer.close(linger=0)
        ctx.term()


def struct_ids(ids: list[bytes]) -> bytes:
    out = len(ids).to_bytes(4, "little")
    for i in ids:
        out += len(i).to_bytes(2, "little") + i
    return out


# -- deduplication ---------------------------------------------------------------------


def test_a_restarted_worker_is_deduplicated_without_a_ledger(ipc_dir):
    """A worker restarted with the same arguments sends everything again: the receiver
    hands out only what it has not had, and both workers' windows drain."""
    with GroupReceiver(f"ipc://{ipc_dir}/worker", timeout_s=10, senders=2) as receiver:
        first = GroupSender(receiver.endpoint, linger_s=30)
        for i in range(3):
            first.send(group(i))
        got = [next(receiver)["i"] for _ in range(3)]
        closing = threading.Thread(target=first.close)
        closing.start()
        again = GroupSender(receiver.endpoint, linger_s=30)
        resend = threading.Thread(
            target=lambda: ([again.send(group(i)) for i in range(5)], again.close())
        )
        resend.start()
        got += [g["i"] for g in receiver]
        closing.join(30)
        resend.join(30)
    assert got == [0, 1, 2, 3, 4] and receiver.duplicates == 3
    assert first.delivered and again.delivered


def test_a_duplicate_of_a_group_in_use_is_acknowledged_when_it_is_committed(ipc_dir):
    with GroupReceiver(
        f"ipc://{ipc_dir}/inuse", timeout_s=10, senders=None, autocommit=False
    ) as receiver:
        a = GroupSender(receiver.endpoint, linger_s=0)
        b = GroupSender(receiver.endpoint, linger_s=0)
        a.send(group(0))
        assert next(receiver)["i"] == 0  # in use
        b.send(group(0))
        b.send(group(1))
        assert next(receiver)["i"] == 1 and receiver.duplicates == 1
        assert a.pending == 1 and b.pending == 2  # nothing committed yet
        assert receiver.commit() == 2
        wait_until(lambda: a.pending == 0 and b.pending == 0, "both senders' acknowledgements")
        a.close()
        b.close()


def test_a_ledger_deduplicates_across_receivers(ipc_dir, tmp_path):
    endpoint, ledger = f"ipc://{ipc_dir}/ledger", tmp_path / "ledger"
    with GroupReceiver(endpoint, ledger=ledger, timeout_s=10, senders=None) as first:
        sender = GroupSender(endpoint, linger_s=0)
        sender.send(group(0))
        sender.send(group(1))
        assert [next(first)["i"], next(first)["i"]] == [0, 1]
        assert first.commit() == 1  # group 1 (group 0 went when group 1 was asked for)
        sender.close()
    assert read_ledger(ledger) == ["run/0", "run/1"]
    with GroupReceiver(endpoint, ledger=ledger, timeout_s=10) as second:
        assert second.recovered == 2
        got: list[int] = []
        reading = threading.Thread(target=lambda: got.extend(g["i"] for g in second))
        reading.start()
        with GroupSender(endpoint, linger_s=30) as sender:  # a worker that redoes it all
            for i in range(4):
                sender.send(group(i))
        reading.join(30)
    assert got == [2, 3] and second.duplicates == 2 and sender.delivered
    assert read_ledger(ledger) == [f"run/{i}" for i in range(4)]


def test_a_file_source_is_deduplicated_and_the_window_bounds_memory(tmp_path):
    """Without a ledger the receiver remembers its newest dedup_window ids: an id older
    than that is taken again (what bounds its memory), a recent one is skipped."""
    path = tmp_path / "groups.vfs"
    write_stream(path, [group(i) for i in (0, 1, 2, 2, 0)])
    with GroupReceiver(path, dedup_window=2) as receiver:
        assert [g["i"] for g in receiver] == [0, 1, 2, 0]
    assert receiver.duplicates == 1
    with GroupReceiver(path, dedup_window=None) as receiver:
        assert [g["i"] for g in receiver] == [0, 1, 2]
    with GroupReceiver(path, ledger=tmp_path / "ledger") as receiver:
        assert [g["i"] for g in receiver] == [0, 1, 2]
    with GroupReceiver(path, ledger=tmp_path / "ledger") as receiver:  # a restart: all done
        assert list(receiver) == [] and receiver.recovered == 3 and receiver.duplicates == 5
    assert list(read_groups(path, raw=True)) and len(list(read_groups(path))) == 3
    with pytest.raises(ValueError, match="raw file receiver"):
        GroupReceiver(path, raw=True, ledger=tmp_path / "ledger")


# -- the ledger ------------------------------------------------------------------------


def test_a_torn_last_line_is_dropped_and_cut_off(tmp_path):
    path = tmp_path / "ledger"
    ledger = Ledger(path, window=None)
    ledger.commit(["run/0", "run/1"])
    ledger.close()
    assert path.read_text().splitlines() == [
        json.dumps({"format": LEDGER_FORMAT}),
        '"run/0"',
        '"run/1"',
    ]
    whole = path.stat().st_size
    with open(path, "ab") as f:
        f.write(b'"run/2')  # killed mid-commit: never acknowledged
    assert read_ledger(path) == ["run/0", "run/1"]
    ledger = Ledger(path, window=None)
    assert ledger.recovered == 2 and ledger.truncated_bytes == 6 and "run/2" not in ledger
    assert path.stat().st_size == whole
    ledger.commit(["run/2"])
    ledger.close()
    assert read_ledger(path) == ["run/0", "run/1", "run/2"]


def test_a_corrupt_ledger_is_refused(tmp_path):
    path = tmp_path / "ledger"
    path.write_text(json.dumps({"format": LEDGER_FORMAT}) + '\n"run/0"\nnot json\n"run/1"\n')
    with pytest.raises(LedgerError, match="line 3") as info:
        Ledger(path, window=None)
    assert info.value.line == 3 and info.value.path == str(path)
    (tmp_path / "other").write_text('{"format": "vf_mm.results/1"}\n')
    with pytest.raises(LedgerError, match="not a group ledger"):
        GroupReceiver(tmp_path / "groups.vfs", ledger=tmp_path / "other")
    torn_header = tmp_path / "new"
    torn_header.write_bytes(b'{"form')  # killed while it was being made
    fresh = Ledger(torn_header, window=None)
    assert fresh.recovered == 0 and fresh.truncated_bytes == 6
    fresh.close()
    assert read_ledger(torn_header) == []


def test_a_ledger_is_held_by_one_receiver(tmp_path):
    path = tmp_path / "groups.vfs"
    write_stream(path, [group(0)])
    first = GroupReceiver(path, ledger=tmp_path / "ledger")
    with pytest.raises(LedgerError, match="held by another GroupReceiver"):
        GroupReceiver(path, ledger=tmp_path / "ledger")
    first.close()
    GroupReceiver(path, ledger=tmp_path / "ledger").close()  # free again


# -- run ids ---------------------------------------------------------------------------


def shapes_env(**kwargs) -> vf.SingleTurnEnv:
    rows = [{"question": f"{i} + 1?", "answer": str(i + 1)} for i in range(3)]
    return vf.SingleTurnEnv(dataset=rows, rubric=vf.Rubric([lambda completion: 1.0]), **kwargs)


class Collect:
    def __init__(self) -> None:
        self.groups: list[dict] = []

    async def asend(self, group) -> int:
        self.groups.append(group)
        return 1


def run_ids(sender: Collect) -> set[str]:
    return {g["group_id"].rsplit("/", 1)[0] for g in sender.groups}


def test_stream_rollouts_gives_each_group_an_id():
    client = vf.RendererClient(ScriptedChatBackend(["2"]))
    sender = Collect()
    progress = asyncio.run(stream_rollouts(shapes_env(), client, sender, rollouts_per_example=2))
    assert sorted(g["group_id"] for g in sender.groups) == [
        f"{progress.run_id}/{i}" for i in range(3)
    ]
    assert progress.run_id.startswith("SingleTurnEnv-")
    assert unpack_group(sender.groups[0])[0].group_id == sender.groups[0]["group_id"]
    again = Collect()  # a restarted worker: the same arguments, the same ids
    asyncio.run(stream_rollouts(shapes_env(), client, again, rollouts_per_example=2))
    assert run_ids(again) == {progress.run_id}
    named = Collect()
    asyncio.run(stream_rollouts(shapes_env(), client, named, run_id="epoch-2"))
    assert sorted(g["group_id"] for g in named.groups) == [f"epoch-2/{i}" for i in range(3)]
    with pytest.raises(ValueError, match="run_id"):
        asyncio.run(stream_rollouts(shapes_env(), client, Collect(), run_id=""))


def test_the_derived_run_id_follows_what_defines_the_groups():
    env = shapes_env()
    rows = env.get_dataset()

    def rid(env=env, rows=rows, **kwargs):
        return run_id_for(env, rows, **{"rollouts_per_example": 2, "seed": 1, **kwargs})

    base = rid()
    assert base == rid(shapes_env(), shapes_env().get_dataset())  # another process, same args
    changed = {
        rid(rollouts_per_example=4),
        rid(seed=2),
        rid(sampling_args={"temperature": 0.5}),
        rid(rows=rows[:2]),
        rid(rows=[{**rows[0], "answer": "9"}, *rows[1:]]),
        rid(shapes_env(env_id="other")),
    }
    assert base not in changed and len(changed) == 6
    # the sampling that counts is the environment's merged with the call's
    warm = shapes_env(sampling_args={"temperature": 0.5})
    assert rid(warm) == rid(sampling_args={"temperature": 0.5})
    # a value JSON cannot hold counts by its type
    assert run_id_for(env, [{"image": object()}]) == run_id_for(env, [{"image": object()}])
