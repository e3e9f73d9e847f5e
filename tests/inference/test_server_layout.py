"""How ``vf-mm serve`` is built: each protocol's routes in a module of their own over one
shared engine, no class holding several, and a module docstring that names every route
the app serves (the first thing a reader of ``_server.py`` is told)."""

from __future__ import annotations

import ast
from pathlib import Path

from starlette.routing import Route

from vf_mm.inference import _server, create_app

INFERENCE = Path(_server.__file__).parent
MAX_CLASS_LINES = 400


def test_no_class_of_the_server_holds_more_than_one_protocol():
    sizes = {}
    for path in sorted(INFERENCE.glob("_server*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.ClassDef):
                sizes[f"{path.name}:{node.name}"] = node.end_lineno - node.lineno + 1
    assert sizes, "no classes found: the glob no longer matches the server's modules"
    too_big = {name: n for name, n in sizes.items() if n > MAX_CLASS_LINES}
    assert too_big == {}, f"split along the protocol seams (at most {MAX_CLASS_LINES} lines)"


def test_the_module_docstring_names_every_route_the_app_serves():
    app = create_app(object(), model_name="m")
    doc = _server.__doc__ or ""
    served = [
        f"``{method} {route.path.replace('{session_id}', '{id}')}``"
        for route in app.routes
        if isinstance(route, Route)
        for method in sorted((route.methods or set()) - {"HEAD"})
    ]
    assert len(served) == 7
    missing = [name for name in served if name not in doc]
    assert missing == [], "vf_mm/inference/_server.py's docstring omits routes it serves"
    assert "seven routes" in doc
