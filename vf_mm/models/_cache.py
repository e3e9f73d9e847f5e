"""Artifacts built once per machine: under ``$VF_MM_CACHE`` (default ``~/.cache/vf_mm``).

A build writes into a temporary sibling directory and is renamed into place, so a
reader never sees a half-written artifact. Concurrent first uses (several test workers,
several ``vf-mm eval`` runs) take turns on a lock file beside it (``<name>.lock``): one
builds, the others wait for it and use its copy instead of building their own.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

from filelock import FileLock


def cache_dir() -> Path:
    """``$VF_MM_CACHE``, else ``~/.cache/vf_mm``."""
    return Path(os.environ.get("VF_MM_CACHE", Path.home() / ".cache" / "vf_mm"))


def build_once(name: str, build: Callable[[Path], object], *, marker: str) -> Path:
    """``cache_dir() / name``, made by ``build(directory)`` the first time; a directory
    there without ``marker`` (a file every build writes) is not a build and is replaced.
    The build holds ``<name>.lock`` there: a concurrent first use waits and reuses it."""
    path = cache_dir() / name
    if (path / marker).exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(path.with_name(f"{path.name}.lock")):
        if (path / marker).exists():  # built by another process while this one waited
            return path
        tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)  # an unfinished build of a dead process
        build(tmp)
        if path.exists():  # an unfinished leftover (no marker), from before the lock
            shutil.rmtree(path, ignore_errors=True)
        tmp.replace(path)
    return path
