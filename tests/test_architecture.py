"""The architecture holds: docs/architecture.md maps the real tree, imports point down its
layers, and no code reaches into another subpackage's private modules."""

from __future__ import annotations

import ast
import functools
import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
PACKAGE = ROOT / "vf_mm"
OUTSIDE = "../" + "shared"  # the team's notes beside a checkout (spelled so as not to match)


def _doc_block(heading: str) -> list[str]:
    """The lines of the first ```text block under ``## heading`` in docs/architecture.md."""
    text = DOC.read_text(encoding="utf-8")
    section = text.split(f"## {heading}\n", 1)[1]
    block = section.split("```text\n", 1)[1].split("```", 1)[0]
    return block.splitlines()


def _layers() -> dict[str, int]:
    """``{"wire": 1, ...}``: each package's or top-level module's layer, from the doc."""
    layers: dict[str, int] = {}
    for line in _doc_block("Layers"):
        match = re.fullmatch(r"layer (\d+)\s+(.+)", line.strip())
        assert match, f"docs/architecture.md: not a layer line: {line!r}"
        for name in match.group(2).split():
            layers[name] = int(match.group(1))
    return layers


def _mapped_paths() -> set[str]:
    """Every path the doc's map names (``vf_mm/wire/_encode.py``, ``vf_mm/wire/``, ...)."""
    paths: set[str] = set()
    stack: list[tuple[int, str]] = []
    for line in _doc_block("Map"):
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip(" "))
        name = line.split()[0]
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = (stack[-1][1] if stack else "") + name
        paths.add(path)
        if name.endswith("/"):
            stack.append((indent, path))
    return paths


def _python_files(*folders: str) -> list[Path]:
    files: list[Path] = []
    for folder in folders:
        files += sorted((ROOT / folder).rglob("*.py"))
    return [f for f in files if not any(p.startswith(".") for p in f.relative_to(ROOT).parts)]


@functools.cache
def _nodes(path: Path) -> tuple[ast.AST, ...]:
    """Every node of a file's syntax tree, parsed once for all the tests here."""
    return tuple(ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))))


def _imports(path: Path) -> list[tuple[int, str]]:
    """Every absolute ``vf_mm`` module a file imports (``from a import b`` counts ``a.b``:
    ``b`` may be a module), anywhere in the file, lazy imports included."""
    found: list[tuple[int, str]] = []
    for node in _nodes(path):
        if isinstance(node, ast.ImportFrom) and node.module == "vf_mm":
            for alias in node.names:  # a submodule, or a name the root re-exports
                is_module = (PACKAGE / alias.name).is_dir() or (
                    PACKAGE / f"{alias.name}.py"
                ).is_file()
                found.append((node.lineno, f"vf_mm.{alias.name}" if is_module else "vf_mm"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
    return [(line, name) for line, name in found if name.split(".")[0] == "vf_mm"]


def _home(path: Path) -> str | None:
    """The subpackage (``vf_mm.x``) whose private modules ``path`` may import: its own
    package for library code, the package a test folder mirrors for tests."""
    parts = path.relative_to(ROOT).parts
    if parts[0] == "vf_mm" and len(parts) > 2:
        return f"vf_mm.{parts[1]}"
    if parts[0] == "tests" and len(parts) > 2:
        return f"vf_mm.{_TESTED_BY.get(parts[1], parts[1])}"
    return None


#: test folders named for what they need rather than the package they test
_TESTED_BY = {"vllm": "inference"}


def _private_reach(name: str, home: str | None, *, library: bool = False) -> bool:
    """Whether importing ``name`` from ``home`` reaches into another package's private
    modules. Library code (``library``) may import a sibling's ``_internal`` module: the
    documented internal tier, what packages share that users need not see."""
    parts = name.split(".")
    if len(parts) < 3:  # vf_mm.x: a top-level module or package, public or the root's own
        return False
    if library and parts[2] == "_internal":
        return False
    private = any(p.startswith("_") and not p.startswith("__") for p in parts[2:])
    return private and ".".join(parts[:2]) != home


def test_no_code_imports_a_private_module_of_another_subpackage():
    offenders = sorted(
        {
            f"{path.relative_to(ROOT)}:{line}"
            for path in _python_files("vf_mm", "tests", "bench", "examples", "environments")
            for line, name in _imports(path)
            if _private_reach(name, _home(path), library=path.parts[len(ROOT.parts)] == "vf_mm")
        }
    )
    assert offenders == [], "use the subpackage's public names instead:\n" + "\n".join(offenders)


@pytest.mark.parametrize(
    ("name", "home", "reaches"),
    [
        ("vf_mm.wire._stream", "vf_mm.training", True),
        ("vf_mm.wire._stream.FRAME_HEADER", None, True),
        ("vf_mm.wire._stream", "vf_mm.wire", False),
        ("vf_mm.wire.packb", "vf_mm.training", False),
        ("vf_mm._text", "vf_mm.images", False),
        ("vf_mm.errors", None, False),
    ],
)
def test_what_counts_as_a_private_reach(name, home, reaches):
    assert _private_reach(name, home) is reaches


def test_only_library_code_reaches_the_internal_tier():
    assert not _private_reach("vf_mm.images._internal", "vf_mm.videos", library=True)
    assert _private_reach("vf_mm.images._internal", "vf_mm.videos")  # a test of videos
    assert _private_reach("vf_mm.images._source", "vf_mm.videos", library=True)


def test_the_architecture_map_names_every_module_and_nothing_else():
    modules = {str(p.relative_to(ROOT)) for p in PACKAGE.rglob("*.py") if p.name != "__init__.py"}
    packages = {f"{p.parent.relative_to(ROOT)}/" for p in PACKAGE.rglob("__init__.py")}
    real, mapped = modules | packages, _mapped_paths()
    assert sorted(real - mapped) == [], "modules missing from docs/architecture.md's map"
    assert sorted(mapped - real) == [], "docs/architecture.md maps modules that do not exist"


def test_every_package_has_a_layer():
    tops = {
        p.stem if p.is_file() else p.name
        for p in PACKAGE.iterdir()
        if p.is_dir() or p.suffix == ".py"
    }
    tops |= {"vf_mm"}  # py.typed and other data files are no packages
    tops = {t for t in tops if t != "__init__" and t != "__pycache__" and not t.startswith(".")}
    assert sorted(tops ^ set(_layers())) == []


def test_imports_point_down_the_layers():
    layers = _layers()
    upward = []
    for path in _python_files("vf_mm"):
        parts = path.relative_to(PACKAGE).parts
        if parts == ("__init__.py",):
            continue  # the root re-exports the public surface
        own = parts[0].removesuffix(".py")
        for line, name in _imports(path):
            target = name.split(".")[1] if "." in name else name  # "vf_mm": the root
            if target == own or target not in layers:
                continue
            if layers[target] >= layers[own]:
                upward.append(f"{path.relative_to(ROOT)}:{line}: {own} -> {target}")
    assert sorted(set(upward)) == [], "an import points up (or across) the layers"


def test_the_package_uses_absolute_imports_only():
    relative = [
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for path in _python_files("vf_mm")
        for node in _nodes(path)
        if isinstance(node, ast.ImportFrom) and node.level > 0
    ]
    assert relative == [], "the import checks above read absolute imports: write them so"


#: a class longer than this (lines of its body, AST) holds several concepts unless it says
#: in its docstring why it is one ("One concept: ...")
MAX_CLASS_LINES = 400


def test_every_long_class_says_why_it_is_one_concept():
    giants = [
        f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({size} lines)"
        for path in _python_files("vf_mm")
        for node in _nodes(path)
        if isinstance(node, ast.ClassDef)
        and (size := (node.end_lineno or node.lineno) - node.lineno + 1) > MAX_CLASS_LINES
        and "One concept:" not in (ast.get_docstring(node) or "")
    ]
    assert giants == [], (
        f"a class over {MAX_CLASS_LINES} lines: split it along its seams, or state in its "
        "docstring, in a sentence starting 'One concept:', why it is one"
    )


def test_nothing_in_the_project_points_outside_it():
    outside = []
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in {"outputs", "out"}]
        for name in files:
            path = Path(folder) / name
            rel = path.relative_to(ROOT)
            if path.suffix in {".py", ".md", ".sh", ".toml", ".txt", ".cfg", ".yaml", ".yml"}:
                outside += _points_outside(path, rel)
    assert outside == [], "a user's clone has no such folder: keep what matters in the project"


def _points_outside(path: Path, rel: Path) -> list[str]:
    text = path.read_text(encoding="utf-8", errors="replace")
    return [str(rel)] if OUTSIDE in text or re.search(r"\b(DESIGN|FACTS)\.md\b", text) else []
