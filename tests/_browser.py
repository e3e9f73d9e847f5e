"""A real headless browser for tests: Debian's chromium, installed on first use if missing.

``chromium()`` returns the browser's path. When it is not installed it runs
``apt-get update`` and ``apt-get install -y chromium`` (as root, or through passwordless
sudo) once per session; only when that is impossible does it skip the test, saying why.
``run_chromium(...)`` runs it headless with everything that would reach the network off.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

_CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
_INSTALL_TIMEOUT_S = 600

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


@functools.cache
def _install() -> str | None:
    """Try to apt-get install chromium; return why it failed, or None on success."""
    if shutil.which("apt-get") is None:
        return "chromium is not installed and there is no apt-get to install it"
    if os.geteuid() == 0:
        prefix: list[str] = []
    elif (
        shutil.which("sudo")
        and subprocess.run(["sudo", "-n", "true"], capture_output=True, check=False).returncode == 0
    ):
        prefix = ["sudo", "-n"]
    else:
        return "chromium is not installed and installing it needs root (no passwordless sudo)"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update"], ["apt-get", "install", "-y", "chromium"]):
        try:
            proc = subprocess.run(
                prefix + cmd,
                capture_output=True,
                text=True,
                env=env,
                timeout=_INSTALL_TIMEOUT_S,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"`{' '.join(cmd)}` failed: {exc}"
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            return f"`{' '.join(cmd)}` exited {proc.returncode}: {' | '.join(tail)}"
    return None


def chromium() -> str:
    """The path of a chromium binary, installing Debian's package if needed (else skip)."""
    path = _find()
    if path is None:
        why = _install()
        path = _find()
        if path is None:
            pytest.skip(f"no headless browser: {why or 'chromium not found after installing'}")
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
