"""The watchdog of spawned servers: stops their process groups when the parent is gone.

Run as a script (``python -I _watchdog.py GRACE_S``; standard library only, so it starts
fast and imports nothing of the parent's) in a session of its own, with its stdin the
read end of a pipe whose write end only the parent holds. The parent writes ``+PGID``
for each server group it starts and ``-PGID`` for each it has stopped itself. When the
pipe reads EOF the parent has closed it (a clean stop) or the kernel has, because the
parent died however it died (``kill -9`` included); either way the groups still
registered get SIGTERM, then SIGKILL after ``GRACE_S`` seconds. A changed parent pid
(checked every second) counts as EOF too: a child forked by the parent without exec
may hold the write end open after the parent is gone.

``group_alive`` and ``stop_groups`` are the parent's too (``_spawn``): one way to stop.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time
from collections.abc import Iterable

_POLL_S = 0.05


def group_alive(pgid: int) -> bool:
    """Whether process group ``pgid`` has a member that is not a zombie (a zombie holds
    no resources; where nobody reaps, as under some container inits, it stays)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    if not os.path.isdir("/proc"):
        return True
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            return True
    return False


def stop_groups(pgids: Iterable[int], grace_s: float) -> list[int]:
    """SIGTERM each group, SIGKILL those still alive after ``grace_s``; returns the groups
    that had to be killed."""
    groups = [g for g in pgids if _signal(g, signal.SIGTERM)]
    deadline = time.monotonic() + grace_s
    while groups and time.monotonic() < deadline:
        groups = [g for g in groups if group_alive(g)]
        if groups:
            time.sleep(_POLL_S)
    killed = [g for g in groups if group_alive(g) and _signal(g, signal.SIGKILL)]
    deadline = time.monotonic() + 10.0  # SIGKILL cannot be refused: only the exit is awaited
    while any(group_alive(g) for g in killed) and time.monotonic() < deadline:
        time.sleep(_POLL_S)
    return killed


def _signal(pgid: int, sig: int) -> bool:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def main(argv: list[str]) -> int:
    grace_s = float(argv[1]) if len(argv) > 1 else 30.0
    parent = os.getppid()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the parent's to handle
    groups: set[int] = set()
    fd = sys.stdin.fileno()
    pending = b""
    while True:
        ready, _, _ = select.select([fd], [], [], 1.0)
        if not ready:
            if os.getppid() != parent:
                break
            continue
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
            text = line.strip().decode()
            if text[:1] == "+":
                groups.add(int(text[1:]))
            elif text[:1] == "-":
                groups.discard(int(text[1:]))
    stop_groups(sorted(groups), grace_s)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
