"""Client factories for the workers' tests: module-level, so a ``WorkerSpec`` holding a
``functools.partial`` of one pickles into a spawned worker process."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import vf_mm as vf
from vf_mm.renderers import load_renderer
from vf_mm.testing import ScriptedBackend


def _example(request) -> str:
    first = next(m for m in request.messages if m["role"] == "user")
    text = " ".join(p["text"] for p in first["content"] if p.get("type") == "text")
    return text.split("q", 1)[1].rstrip(".") if "q" in text else ""


def scripted(checkpoint: str, *, die_once_on: str | None = None, marker: str | None = None,
             always_die_on: str | None = None, fail_start: bool = False,
             vary_after: str | None = None) -> vf.RendererClient:  # fmt: skip
    """A ``RendererClient`` whose backend answers "yes", except that it kills its own
    process (SIGKILL, as a crash would) on the example named ``die_once_on`` the first
    time any worker meets it (``marker`` records that across processes), and on
    ``always_die_on`` every time. ``vary_after`` (a marker path): every worker but the
    first to start processes images with another ``max_pixels``."""
    if fail_start:
        raise RuntimeError("this worker's client cannot be built (a test's own failure)")
    if vary_after is not None and not _first_time(Path(vary_after)):
        renderer = load_renderer(checkpoint, processor_kwargs={"max_pixels": 28 * 28 * 16})
    else:
        renderer = load_renderer(checkpoint)

    def reply(request) -> str:
        example = _example(request)
        if example == always_die_on or (
            example == die_once_on and marker and _first_time(Path(marker))
        ):
            os.kill(os.getpid(), signal.SIGKILL)
        return "yes"

    return vf.RendererClient(ScriptedBackend(renderer, reply), renderer)


def _first_time(marker: Path) -> bool:
    try:
        marker.touch(exist_ok=False)
    except FileExistsError:
        return False
    return True


def where_started(path: str, name: str) -> object:
    """No client at all (a worker needs none to start): writes ``name``'s value in the
    worker's environment (or ``-`` where unset) and the worker's parent pid to ``path``."""
    Path(path).write_text(f"{os.environ.get(name, '-')} {os.getppid()}")
    return object()
