"""A real headless browser for tests: chromium, which ``python3 dev.py test`` installs.

``chromium()`` returns the browser's path, and fails the test (never skips it) when there
is none. ``run_chromium(...)`` runs it headless with everything that would reach the
network off.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

_CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")

_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
    "--mute-audio",
)


def _find() -> str | None:
    if os.path.exists("/usr/bin/chromium"):
        return "/usr/bin/chromium"
    for name in _CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    return None


def chromium() -> str:
    """The path of a chromium binary. A missing browser fails the test, saying how to get
    one: ``python3 dev.py test`` installs it (Debian's package) before the tests run."""
    path = _find()
    if path is None:
        pytest.fail(
            "no headless browser: run the tests through `python3 dev.py test`, which installs "
            "Debian's chromium, or install chromium (or google-chrome) yourself"
        )
    return path


def run_chromium(
    *args: str, url: str, timeout: float = 60.0, window: str = "1280,2000"
) -> subprocess.CompletedProcess[str]:
    """Run headless chromium on ``url`` with ``args`` (``--dump-dom``, ``--screenshot=...``)."""
    binary = chromium()
    with tempfile.TemporaryDirectory(prefix="vfmm-chromium-") as profile:
        cmd = [
            binary,
            *_FLAGS,
            f"--user-data-dir={profile}",
            f"--window-size={window}",
            *args,
            url,
        ]
        # chromium writes crash dumps and caches under HOME: keep them in the profile dir
        env = {**os.environ, "HOME": profile, "XDG_CONFIG_HOME": profile, "XDG_CACHE_HOME": profile}
        return subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, env=env, check=False
        )


def file_url(path: Path, fragment: str = "") -> str:
    return path.resolve().as_uri() + (f"#{fragment}" if fragment else "")
