"""``load_environment``: vf_mm's environments, and other frameworks' wrapped as vf_mm ones.

This is ``vf_mm.load_environment`` (what ``vf-mm eval``, ``vf-mm rollout`` and rollout
workers call): ``vf_mm.envs._internal.load_environment_with`` with this package's adapters, so an
environment module whose ``load_environment`` returns a verifiers environment is found
by id or path like any other and comes back as a ``VerifiersEnv``. The lookup lives in
``vf_mm.envs``; the adapters live here, above it, and are handed down.

verifiers' ``Environment`` installs SIGINT and SIGTERM handlers when it is constructed
(its teardown, then the default action). The process is vf_mm's: a worker ignores
Ctrl-C (its parent stops it) and ``vf-mm serve`` drains on SIGTERM. So handlers that
verifiers' code put in place while the environment was built are put back as they were;
verifiers' ``atexit`` teardown still runs when the process exits.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from vf_mm.adapters._verifiers import adapt_verifiers
from vf_mm.envs import Environment
from vf_mm.envs._internal import (
    Adapter,
    load_environment_with,
)

#: what ``load_environment`` wraps, tried in order
ADAPTERS: tuple[Adapter, ...] = (adapt_verifiers,)
_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def load_environment(
    env_id: str, *, search_paths: Sequence[str | Path] | None = None, **env_args: Any
) -> Environment:
    """The environment ``env_id`` names, built with ``env_args``.

    A vf_mm ``Environment`` comes back as is, a verifiers classic environment as a
    ``VerifiersEnv``.

    Args:
        env_id: An id or a path (see ``vf_mm.envs`` for where ids are looked up).
        search_paths: Folders holding ``<env_id>/`` environments, searched first (the
            CLI's ``--env-dir``, in order).
        **env_args: The keyword arguments of the environment's ``load_environment``.

    Raises:
        EnvironmentNotFoundError: No installed package or folder for the id.
        EnvironmentArgsError: ``env_args`` it does not take, or a required one missing.
        EnvironmentLoadError: Its module fails to import, or ``load_environment`` raises.
        UnsupportedEnvironmentError: Another framework's environment vf_mm cannot run.
    """
    with _signals_kept():
        return load_environment_with(
            env_id, adapters=ADAPTERS, search_paths=search_paths, env_args=env_args
        )


@contextmanager
def _signals_kept() -> Iterator[None]:
    """Put back the SIGINT / SIGTERM handlers that verifiers' code replaced inside."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread has handlers to set (verifiers' own code would fail)
        return
    saved = {sig: signal.getsignal(sig) for sig in _SIGNALS}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            if _from_verifiers(signal.getsignal(sig)):
                signal.signal(sig, handler)


def _from_verifiers(handler: Any) -> bool:
    return (getattr(handler, "__module__", "") or "").split(".")[0] == "verifiers"
