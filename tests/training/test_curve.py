"""CURVE on the trainer hop: the trainer takes groups only from workers in its allow-list,
a worker sends only to the trainer whose key it was given, a wrong key on either side
delivers nothing and says so where it can be acted on, and plain TCP off loopback needs
an explicit ``insecure=True``; meanwhile the rightful workers' groups go on arriving."""

from __future__ import annotations

import logging
import shutil
import stat
import threading

import pytest

from vf_mm.errors import TransportError
from vf_mm.training import GroupReceiver, GroupSender, write_key_pair


@pytest.fixture
def keys(tmp_path):
    """A trainer pair, two worker pairs (one allowed, one not), and the allow-list."""
    made = {name: write_key_pair(tmp_path / name, name) for name in ("trainer", "other-trainer", "worker", "intruder")}  # fmt: skip
    allow = tmp_path / "allow"
    allow.mkdir()
    shutil.copy(made["worker"][0], allow)
    return made, allow


def trainer(receiver):
    """Iterate ``receiver`` on a thread; its groups (or the error that ended it) in a list."""
    got: list = []

    def run():
        try:
            got.extend(receiver)
        except Exception as exc:
            got.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return got, thread


def test_key_files_are_a_pair_with_the_secret_kept_private(tmp_path):
    public, secret = write_key_pair(tmp_path / "k", "trainer")
    assert public.name == "trainer.key" and secret.name == "trainer.key_secret"
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert "secret-key" not in public.read_text() and "secret-key" in secret.read_text()
    with pytest.raises(FileExistsError, match="exists already"):
        write_key_pair(tmp_path / "k", "trainer")
    with pytest.raises(ValueError, match="plain file name"):
        write_key_pair(tmp_path / "k", "../escape")


def test_only_allowed_workers_deliver_and_the_trainer_reports_the_others(keys, caplog):
    made, allow = keys
    receiver = GroupReceiver("tcp://127.0.0.1:*", secret_key=made["trainer"][1], allow=allow,
                             senders=1, timeout_s=60)  # fmt: skip
    got, thread = trainer(receiver)
    caplog.set_level(logging.WARNING)
    intruder = GroupSender(receiver.endpoint, secret_key=made["intruder"][1],
                           trainer_key=made["trainer"][0], hwm=1, timeout_s=60)  # fmt: skip
    with pytest.raises(TransportError, match="not in the trainer's allow-list"), intruder:
        for i in range(5):
            intruder.send({"poison": i})
    # the rightful worker's groups arrive, all of them, meanwhile
    with GroupSender(receiver.endpoint, secret_key=made["worker"][1],
                     trainer_key=made["trainer"][0], timeout_s=60) as worker:  # fmt: skip
        for i in range(4):
            worker.send({"step": i})
    thread.join(60)
    receiver.close()
    assert got == [{"step": i} for i in range(4)]  # no poison: the intruder delivered 0
    assert receiver.refused >= 1
    assert "not in the allow-list" in caplog.text


def test_a_refused_sender_closes_at_once_even_when_told_to_wait_forever(keys):
    """A worker the trainer refused has nothing to wait for: its close sends no end marker
    (no connection would take it, and the send would block for the whole linger) and
    returns, with linger_s=None too."""
    made, allow = keys
    receiver = GroupReceiver("tcp://127.0.0.1:*", secret_key=made["trainer"][1], allow=allow,
                             senders=None, timeout_s=60)  # fmt: skip
    _, thread = trainer(receiver)
    intruder = GroupSender(receiver.endpoint, secret_key=made["intruder"][1],
                           trainer_key=made["trainer"][0], hwm=1, linger_s=None)  # fmt: skip
    with pytest.raises(TransportError, match="not in the trainer's allow-list"):
        for i in range(5):
            intruder.send({"poison": i})
    closing = threading.Thread(target=intruder.close, daemon=True)  # (a regression: stuck)
    closing.start()
    closing.join(30)  # a generous bound on the wait, not a timing claim
    alive = closing.is_alive()
    receiver.close()
    thread.join(10)
    assert not alive, "the refused sender's close waited on a trainer that refused it"
    assert intruder.closed and not intruder.delivered


def test_a_worker_never_sends_to_a_trainer_with_another_key(keys):
    made, allow = keys
    impostor = GroupReceiver("tcp://127.0.0.1:*", secret_key=made["other-trainer"][1],
                             allow=allow, senders=None, timeout_s=1)  # fmt: skip
    worker = GroupSender(impostor.endpoint, secret_key=made["worker"][1],
                         trainer_key=made["trainer"][0], hwm=1, timeout_s=60)  # fmt: skip
    with pytest.raises(TransportError, match=r"CURVE handshake .* failed"), worker:
        for i in range(5):
            worker.send({"step": i})
    from vf_mm.errors import ReceiveTimeout

    with pytest.raises(ReceiveTimeout):
        next(impostor)  # it got no group
    impostor.close()


@pytest.mark.parametrize("endpoint", ["tcp://*:0", "tcp://0.0.0.0:0", "tcp://trainer-host:5555"])
def test_plain_tcp_off_loopback_needs_insecure(endpoint):
    with pytest.raises(TransportError, match="insecure=True"):
        GroupReceiver(endpoint) if endpoint.startswith(
            "tcp://*"
        ) or "0.0.0.0" in endpoint else GroupSender(endpoint)


@pytest.mark.parametrize("endpoint", ["tcp://127.0.0.1:*", "tcp://localhost:*"])
def test_plain_tcp_on_loopback_and_insecure_elsewhere_are_allowed(endpoint, tmp_path):
    GroupReceiver(endpoint, timeout_s=1).close()
    GroupReceiver(f"ipc://{tmp_path}/s.sock", timeout_s=1).close()
    GroupReceiver("tcp://0.0.0.0:*", insecure=True, timeout_s=1).close()


def test_keys_that_do_not_fit_are_refused_before_anything_opens(keys, tmp_path):
    made, allow = keys
    with pytest.raises(ValueError, match="both"):
        GroupReceiver("tcp://127.0.0.1:*", secret_key=made["trainer"][1])
    with pytest.raises(ValueError, match="both"):
        GroupSender("tcp://127.0.0.1:1", secret_key=made["worker"][1])
    with pytest.raises(ValueError, match="not a stream file"):
        GroupSender(
            tmp_path / "f.vfmm", secret_key=made["worker"][1], trainer_key=made["trainer"][0]
        )
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(TransportError, match="holds no public key"):
        GroupReceiver("tcp://127.0.0.1:*", secret_key=made["trainer"][1], allow=empty)
    with pytest.raises(TransportError, match="no secret key"):
        GroupReceiver("tcp://127.0.0.1:*", secret_key=made["trainer"][0], allow=allow)
    with pytest.raises(TransportError, match=r"key file .*nope does not exist"):
        GroupSender(
            "tcp://127.0.0.1:1", secret_key=tmp_path / "nope", trainer_key=made["trainer"][0]
        )


@pytest.mark.parametrize(
    ("event", "in_a_row", "refuses"),
    [
        (0x4000, 1, True),  # the trainer's allow-list refused this worker's key: final
        (0x0800, 1, False),  # a trainer killed mid-handshake: it may answer the next one
        (0x2000, 2, False),
        (0x0800, 3, True),  # failing again at every reconnect: a wrong trainer key
        (0x2000, 3, True),
    ],
)
def test_only_an_explicit_or_repeated_handshake_failure_refuses_the_trainer(
    event, in_a_row, refuses
):
    from vf_mm.training._transport_zmq import handshake_refuses

    assert handshake_refuses(event, in_a_row) is refuses
