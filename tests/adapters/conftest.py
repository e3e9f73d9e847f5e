"""The verifiers tier's fixtures: verifiers itself, and the test environment module.

Nothing here imports verifiers at collection: the default tier, where it is not
installed, deselects the tier's tests without ever importing it.
"""

from __future__ import annotations

import importlib
import signal
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _signal_handlers_restored():
    """verifiers' ``Environment`` installs SIGINT / SIGTERM handlers in the process that
    builds one: pytest's own come back after each test."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


@pytest.fixture(scope="session")
def vf():
    """verifiers, with its classic API loaded. (``tests`` is a package, so no test folder
    such as ``tests/renderers`` shadows the ``renderers`` package verifiers imports.)"""
    verifiers = pytest.importorskip("verifiers")
    for name in ("Environment", "ToolEnv", "Rubric", "OpenAIChatCompletionsClient"):
        getattr(verifiers, name)  # the classic API loads lazily: load it now
    return verifiers


@pytest.fixture(scope="session")
def dots_env(vf):
    """``tests/adapters/dots_env.py``: the verifiers tool environment whose tool returns
    images, its native twin and the scripted model."""
    return importlib.import_module("tests.adapters.dots_env")


@pytest.fixture(scope="session")
def dots_env_path() -> Path:
    return Path(__file__).resolve().parent / "dots_env.py"
