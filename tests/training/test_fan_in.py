"""Fan-in to one trainer, exactly once: four worker processes stream groups (with ids and
real tensors) over tcp:// to one trainer process that commits them to a ledger. The
trainer is killed (SIGKILL) mid-run, holding a group it took and others queued, and
restarted on the same endpoint and ledger; one worker is killed mid-run and restarted
with the same arguments, so it sends all its groups again. Every group id reaches the
trainer's processing exactly once, counted over both of its lives (its own output and
its ledger), and none is lost.

The kills happen at points the processes announce (a file each), never after a delay;
every wait is on a file or a process, with a generous timeout.

This file is also the processes' program: ``python test_fan_in.py trainer|sender ...``.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
SENDERS = 4
PER_SENDER = 25  # groups per worker: examples s * 25 .. s * 25 + 24
HWM = 3  # each worker's window
TRAINER_PAUSE = 12  # after 12 groups the first trainer takes one of workers 1-3's, announces,
# and is killed: the worker that sent it lives on, so it must send it again
WORKER_PAUSE = 15  # worker 0 sends its 15th group, announces, and is killed
RUN = "fan-in"
ALL_IDS = [f"{RUN}/{e}" for e in range(SENDERS * PER_SENDER)]


def rollouts(example_id: int):
    """Two rollouts of one example sharing one image: real tensors, made from the id."""
    from vf_mm.types import (
        MultiModalData,
        PlaceholderRange,
        ResponseTokens,
        RolloutOutput,
        TrajectoryStep,
    )

    rng = np.random.default_rng(example_id)
    item = {
        "pixel_values": rng.standard_normal((16, 12), dtype=np.float32),
        "image_grid_thw": np.array([[1, 4, 4]], dtype=np.int64),
    }
    mm = MultiModalData(
        {"image": [f"{example_id:032x}"]}, {"image": [PlaceholderRange(1, 4)]}, {"image": [item]}
    )
    out = []
    for r in range(2):
        tokens = ResponseTokens(
            prompt_ids=[1, 9, 9, 9, 9, 2],
            completion_ids=[example_id, r],
            completion_logprobs=[-0.5, -0.25],
            completion_mask=[1, 1],
            finish_reason="stop",
            multi_modal_data=mm,
        )
        step = TrajectoryStep(prompt=[], completion=[], tokens=tokens)
        out.append(RolloutOutput(example_id, [], [], trajectory=[step], reward=float(r)))
    return out


# -- the processes -----------------------------------------------------------------------


def run_trainer(endpoint: str, ledger: str, out: str, pause_after: int | None) -> None:
    """Commit every group to the ledger, writing each id it processed to ``out`` (fsync'd)
    before asking for the next. With ``pause_after``: after that many, take the next group
    a worker other than 0 sent (worker 0 is killed later, and its report with it), announce
    ``out.paused`` and wait to be killed (that group is taken, not committed)."""
    from vf_mm.training import GroupReceiver, unpack_group

    receiver = GroupReceiver(
        endpoint, senders=SENDERS, ledger=ledger, timeout_s=120, tensors="numpy"
    )
    processed = 0
    with open(out, "a", encoding="utf-8") as log:
        for frame in receiver:
            group_id = receiver.group_id
            example = int(group_id.rsplit("/", 1)[1])
            got = unpack_group(frame)
            assert [r.group_id for r in got] == [group_id, group_id] == [frame["group_id"]] * 2
            expected = rollouts(example)[0].trajectory[0].tokens.multi_modal_data
            pixels = got[0].trajectory[0].tokens.multi_modal_data.mm_items["image"][0]
            assert np.array_equal(
                pixels["pixel_values"], expected.mm_items["image"][0]["pixel_values"]
            )
            assert got[1].trajectory[0].tokens.completion_ids == [example, 1]
            if pause_after is not None and processed >= pause_after and example >= PER_SENDER:
                Path(out + ".paused").touch()
                time.sleep(3600)
            log.write(group_id + "\n")
            log.flush()
            os.fsync(log.fileno())
            processed += 1
    stats = {
        "duplicates": receiver.duplicates,
        "recovered": receiver.recovered,
        "committed": receiver.committed,
        "ends": len(receiver.ends),
    }
    receiver.close()
    Path(out + ".stats").write_text(json.dumps(stats))


def run_sender(endpoint: str, index: int, folder: str) -> None:
    """Send this worker's range (ids ``fan-in/<example>``), then close and report. Waits
    for ``go`` before sending; ``FAN_IN_PAUSE_AFTER`` (not an argument: a restart runs
    with the same arguments) makes it announce and wait to be killed after that many."""
    from vf_mm.training import GroupSender, pack_group

    pause = int(os.environ.get("FAN_IN_PAUSE_AFTER", "0"))
    with GroupSender(endpoint, hwm=HWM, linger_s=120) as sender:
        Path(folder, f"sender-{index}.{os.getpid()}.ready").touch()
        while not Path(folder, "go").exists():
            time.sleep(0.01)
        first = index * PER_SENDER
        for k, example in enumerate(range(first, first + PER_SENDER), start=1):
            sender.send(pack_group(rollouts(example), group_id=f"{RUN}/{example}"))
            if k == pause:
                Path(folder, f"sender-{index}.paused").touch()
                time.sleep(3600)
    report = {"sent": sender.sent, "resent": sender.resent, "delivered": sender.delivered}
    print(json.dumps(report), flush=True)
    sys.exit(0 if sender.delivered else 3)


# -- the test --------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(*args: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, __file__, *args],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for(what: str, predicate, procs: list[subprocess.Popen], timeout_s: float = 60) -> None:
    """Poll until ``predicate`` holds; fail with every process's stderr on a timeout or
    when a process that should be running has died."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        dead = [p for p in procs if p.poll() not in (None, 0, -signal.SIGKILL)]
        if dead or time.monotonic() > deadline:
            logs = "\n".join(f"--- {p.args[2:]} rc={p.poll()}\n{stderr_of(p)}" for p in procs)
            raise AssertionError(
                f"waiting for {what}: " + ("a process died" if dead else "timed out") + "\n" + logs
            )
        time.sleep(0.02)


def stderr_of(proc: subprocess.Popen) -> str:
    if proc.poll() is None:
        return "(running)"
    return (proc.stderr.read() if proc.stderr else "")[-3000:]


def kill(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)


@pytest.mark.timeout(180)
def test_many_workers_one_trainer_exactly_once_across_kills(tmp_path):
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    folder, ledger = str(tmp_path), str(tmp_path / "ledger")
    out1, out2 = str(tmp_path / "trainer-1.ids"), str(tmp_path / "trainer-2.ids")
    procs: list[subprocess.Popen] = []
    try:
        trainer1 = start("trainer", endpoint, ledger, out1, str(TRAINER_PAUSE))
        senders = [
            start(
                "sender",
                endpoint,
                str(i),
                folder,
                env={"FAN_IN_PAUSE_AFTER": str(WORKER_PAUSE)} if i == 0 else None,
            )
            for i in range(SENDERS)
        ]
        procs += [trainer1, *senders]
        ready = lambda: len(list(tmp_path.glob("sender-*.ready"))) == SENDERS  # noqa: E731
        wait_for("the workers to connect", ready, procs)
        (tmp_path / "go").touch()  # all four start together

        # the trainer: killed holding a group of a worker that lives on, others queued behind
        wait_for("the first trainer's pause", lambda: Path(out1 + ".paused").exists(), procs)
        kill(trainer1)
        trainer2 = start("trainer", endpoint, ledger, out2, "")
        procs.append(trainer2)

        # worker 0: killed after its 15th send (at least 12 of its groups committed)
        wait_for("worker 0's pause", lambda: (tmp_path / "sender-0.paused").exists(), procs)
        kill(senders[0])
        restarted = start("sender", endpoint, "0", folder)  # the same arguments
        procs.append(restarted)

        trainer2.wait(120)
        assert trainer2.returncode == 0, stderr_of(trainer2)
        reports = []
        for proc in [*senders[1:], restarted]:
            proc.wait(60)
            assert proc.returncode == 0, stderr_of(proc)
            reports.append(json.loads(proc.stdout.read().strip().splitlines()[-1]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                kill(proc)

    from vf_mm.training import read_ledger

    first = Path(out1).read_text().splitlines()
    second = Path(out2).read_text().splitlines()
    processed = collections.Counter(first + second)
    assert sorted(processed) == sorted(ALL_IDS), "a group was lost or invented"
    assert set(processed.values()) == {1}, [g for g, n in processed.items() if n > 1]
    committed = read_ledger(ledger)
    assert sorted(committed) == sorted(ALL_IDS) and len(committed) == len(ALL_IDS)
    assert committed[: len(first)] == first  # the first life committed what it processed
    assert len(first) >= TRAINER_PAUSE

    stats = json.loads(Path(out2 + ".stats").read_text())
    assert stats["recovered"] == len(first) and stats["committed"] == len(second)
    assert stats["ends"] == SENDERS
    # worker 0's restart sent its committed groups again: the trainer dropped them
    assert stats["duplicates"] >= WORKER_PAUSE - HWM
    assert all(r["delivered"] and r["sent"] == PER_SENDER for r in reports)
    # the workers that lived through the trainer's death sent it what it had lost
    assert sum(r["resent"] for r in reports[:-1]) >= 1


if __name__ == "__main__":
    role, *rest = sys.argv[1:]
    if role == "trainer":
        endpoint, ledger, out, pause = rest
        run_trainer(endpoint, ledger, out, int(pause) if pause else None)
    else:
        endpoint, index, folder = rest
        run_sender(endpoint, int(index), folder)
