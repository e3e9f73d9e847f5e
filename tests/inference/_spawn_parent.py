"""A parent of spawned fake vLLM servers, for the tests that end it from outside.

    python _spawn_parent.py LOG_DIR N

Starts N ``_fake_vllm.py`` servers with ``VLLMServers`` (in a ``with`` block), waits
until they are healthy, prints one JSON line naming every process it caused
(``servers``, their ``children``, the ``watchdog``), then sleeps until it is ended:
SIGINT runs the block's exit, ``kill -9`` leaves the cleanup to the watchdog.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from vf_mm.inference import VLLMServers  # noqa: E402

FAKE = Path(__file__).with_name("_fake_vllm.py")


def main() -> None:
    log_dir, n = Path(sys.argv[1]), int(sys.argv[2])
    command = [sys.executable, str(FAKE)]
    with VLLMServers("fake", n, command=command, gpus_per_server=0, log_dir=log_dir) as servers:
        children = [
            int(line.split()[-1])
            for path in servers.log_paths
            for line in path.read_text().splitlines()
            if line.startswith("child pid")
        ]
        watchdog = servers._watchdog.pid  # type: ignore[union-attr]
        print(json.dumps({"servers": servers.pids, "children": children, "watchdog": watchdog}))
        sys.stdout.flush()
        while True:
            time.sleep(3600)


if __name__ == "__main__":
    main()
