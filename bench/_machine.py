"""The processor a benchmark ran on, for the line every benchmark prints first.

``platform.processor()`` is empty on most Linux builds, so the model name comes from
``/proc/cpuinfo`` where there is one (figures from two machines are not comparable, and
the line says which machine made them).
"""

from __future__ import annotations

import platform


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what ``platform`` knows."""
    try:
        with open("/proc/cpuinfo") as f:
            return next(
                line.split(":", 1)[1].strip() for line in f if line.startswith("model name")
            )
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()
