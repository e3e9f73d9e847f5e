"""Artifacts built once per machine: under ``$VF_MM_CACHE`` (default ``~/.cache/vf_mm``).

A build writes into a temporary sibling directory and is renamed into place, so a
reader never sees a half-written artifact, and concurrent first uses (several test
workers, several ``vf-mm eval`` runs) each build, one rename wins and the others
use the winner's copy.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path


def cache_dir() -> Path:
    """``$VF_MM_CACHE``, else ``~/.cache/vf_mm``."""
    return Path(os.environ.get("VF_MM_CACHE", Path.home() / ".cache" / "vf_mm"))


def build_once(name: str, build: Callable[[Path], object], *, marker: str) -> Path:
    """``cache_dir() / name``, made by ``build(directory)`` the first time; a directory
    there without ``marker`` (a file every build writes) is not a build and is replaced."""
    path = cache_dir() / name
    if (path / marker).exists():
        return path
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    build(tmp)
    try:
        tmp.replace(path)
    except OSError:  # the name is taken: another process's build, or an unfinished leftover
        if (path / marker).exists():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            shutil.rmtree(path, ignore_errors=True)
            tmp.replace(path)
    return path
