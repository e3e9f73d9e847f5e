"""How the local backend is built: the parts behind ``LocalBackend`` (the model, the
scheduler, the engines, the caches) each a class of its own, none over 400 lines, and
its counters one ``LocalStats`` record that the backend shows as read-only attributes."""

from __future__ import annotations

import ast
from dataclasses import fields
from pathlib import Path

from vf_mm.inference import LocalBackend, _local
from vf_mm.inference._local_stats import LocalStats

INFERENCE = Path(_local.__file__).parent
# the modules of the local backend (docs/architecture.md's map says what each holds)
LOCAL = [
    "_local.py", "_local_model.py", "_local_stats.py", "_scheduler.py", "_row_builder.py",
    "_rows.py", "_batch_engine.py", "_generate.py", "_pool.py", "_vision_cache.py",
    "_prefix_cache.py", "_kv.py", "_arena.py", "_packed.py",
]  # fmt: skip
MAX_CLASS_LINES = 400


def test_no_class_of_the_local_backend_holds_more_than_one_concept():
    sizes = {}
    for name in LOCAL:
        for node in ast.parse((INFERENCE / name).read_text(encoding="utf-8")).body:
            if isinstance(node, ast.ClassDef):
                sizes[f"{name}:{node.name}"] = node.end_lineno - node.lineno + 1
    assert "_local.py:LocalBackend" in sizes
    too_big = {name: n for name, n in sizes.items() if n > MAX_CLASS_LINES}
    assert too_big == {}, f"one concept per class (at most {MAX_CLASS_LINES} lines)"


def test_every_counter_is_a_read_only_attribute_of_the_backend():
    """``/metrics`` and the benches read the counters by name off the backend; only the
    worker writes them, into the one record."""
    names = [f.name for f in fields(LocalStats)]
    assert {"prefix_cache_queries", "prefix_cache_hits", "batches_run"} <= set(names)
    for name in names:
        attribute = getattr(LocalBackend, name, None)
        assert isinstance(attribute, property), name
        assert attribute.fset is None, f"{name} is writable"
