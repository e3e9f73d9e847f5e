"""Public docstrings list their parameters in one style: Google ``Args:``, each parameter once.

The API reference (mkdocs.yml: mkdocstrings, ``docstring_style: google``) renders a
parameter table only from an ``Args:`` section; a parameter described in prose or in a
bullet list is missing from it, and one renamed in the code but not in its docstring
leaves a stale row. This walks the ``__all__`` of every module a ``:::`` line of
docs/reference/ renders, the way the reference does (griffe, statically: the optional
integrations import libraries the default tier does not install), and checks, for each
public function, each class's constructor and each public method with parameters, that
its docstring's ``Args:`` names exactly them.

Rules (what counts as documented):
- ``self`` / ``cls`` are never listed; ``*args`` / ``**kwargs`` may be, need not be;
- a dataclass may list its fields under ``Attributes:`` instead of ``Args:`` (the
  constructor takes exactly its fields, and the reference renders either as a table);
- a class whose constructor is inherited from a public class is checked at that class
  (an error's leaf does not repeat its base's parameters); Enums, Protocols, TypedDicts
  and NamedTuples have no constructor to document;
- a method with no docstring at all passes only where it implements a method of the same
  name that a public base class or Protocol documents (``LocalBackend.generate`` is
  ``Backend.generate``); every other public callable with parameters needs a docstring.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from pathlib import Path

import griffe
import pytest

ROOT = Path(__file__).resolve().parents[1]

# The public modules: each module the API reference renders (``::: name`` in
# docs/reference/*.md), and the public ones it reaches only through a package.
REFERENCE = ROOT / "docs" / "reference"
EXTRA_MODULES = ("vf_mm.cli", "vf_mm.wire.dtypes")


def _public_modules() -> list[str]:
    rendered = re.findall(
        r"^::: (\S+)$",
        "\n".join(page.read_text(encoding="utf-8") for page in sorted(REFERENCE.glob("*.md"))),
        flags=re.MULTILINE,
    )
    return list(dict.fromkeys([*rendered, *EXTRA_MODULES]))


_NO_CONSTRUCTOR_BASES = {"Enum", "IntEnum", "StrEnum", "Protocol", "TypedDict", "NamedTuple"}
_VARIADIC = {"variadic positional", "variadic keyword"}


def _load() -> griffe.Module:
    logging.getLogger("griffe").setLevel(logging.ERROR)  # warnings belong to mkdocs --strict
    return griffe.load(
        "vf_mm",
        search_paths=[str(ROOT)],
        docstring_parser="google",
        resolve_aliases=True,
        resolve_external=False,
    )


def _sections(obj: griffe.Object) -> dict[str, list[str]] | None:
    """``{"parameters": [...], "attributes": [...]}``: the names each section lists."""
    if obj.docstring is None:
        return None
    found: dict[str, list[str]] = {}
    for section in obj.docstring.parsed:
        if section.kind.value in ("parameters", "attributes"):
            found.setdefault(section.kind.value, []).extend(item.name for item in section.value)
    return found


def _problem(
    obj: griffe.Object, parameters: griffe.Parameters, *, fields_ok: bool = False
) -> str | None:
    """Why ``obj``'s docstring does not document ``parameters``, or None when it does."""
    names = [p.name for p in parameters if p.kind.value not in _VARIADIC]
    names = [n for n in names if n not in ("self", "cls")]
    variadic = {p.name for p in parameters if p.kind.value in _VARIADIC}
    sections = _sections(obj)
    if sections is None:
        return f"no docstring (parameters: {', '.join(names)})" if names else None
    listed = sections.get("parameters")
    if listed is None and fields_ok and "attributes" in sections:
        missing = [n for n in names if n not in sections["attributes"]]
        return f"Attributes: lacks fields {missing}" if missing else None
    if listed is None:
        return f"no Args: section (parameters: {', '.join(names)})" if names else None
    bare = [n.lstrip("*") for n in listed]
    missing = [n for n in names if n not in bare]
    extra = [n for n in bare if n not in names and n not in variadic]
    twice = sorted({n for n in bare if bare.count(n) > 1})
    if not (missing or extra or twice):
        return None
    parts = [f"missing {missing}"] * bool(missing) + [f"extra {extra}"] * bool(extra)
    return "Args: " + ", ".join(parts + [f"listed twice {twice}"] * bool(twice))


def _documented_elsewhere(method: griffe.Function, protocols: dict[str, set[str]]) -> bool:
    """True when a base class or a public Protocol documents a method of this name."""
    cls = method.parent
    assert isinstance(cls, griffe.Class)
    try:
        bases = cls.mro()
    except Exception:  # an external base griffe cannot follow
        bases = []
    for base in bases:
        found = base.members.get(method.name)
        if found is not None and not found.is_alias and found.docstring is not None:
            return True
    return any(method.name in names for names in protocols.values())


def _public_objects(package: griffe.Module) -> Iterator[griffe.Object]:
    seen: set[str] = set()
    for path in _public_modules():
        module = package if path == "vf_mm" else package.modules_collection[path]
        if module.exports is None:
            names = [
                n for n, m in module.members.items() if not n.startswith("_") and not m.is_alias
            ]
        else:
            names = [n if isinstance(n, str) else n.name for n in module.exports]
        for name in names:
            obj = module[name]
            obj = obj.final_target if obj.is_alias else obj
            if obj.path not in seen and (obj.is_function or obj.is_class):
                seen.add(obj.path)
                yield obj


def _problems(package: griffe.Module) -> dict[str, str]:
    """``{object path: problem}`` for every public callable whose docstring fails."""
    objects = list(_public_objects(package))
    classes = [o for o in objects if isinstance(o, griffe.Class)]
    public = {c.path for c in classes}
    protocols = {
        c.path: {n for n, m in c.members.items() if not m.is_alias and m.docstring is not None}
        for c in classes
        if any(str(b).split(".")[-1] == "Protocol" for b in c.bases)
    }
    problems: dict[str, str] = {}
    for obj in objects:
        if isinstance(obj, griffe.Function):
            if (problem := _problem(obj, obj.parameters)) is not None:
                problems[obj.path] = problem
            continue
        assert isinstance(obj, griffe.Class)
        if not {str(b).split(".")[-1] for b in obj.bases} & _NO_CONSTRUCTOR_BASES:
            own = "__init__" in obj.members or "dataclass" in obj.labels
            owner = next((b for b in obj.mro() if "__init__" in b.members), None)
            if own or owner is None or owner.path not in public:
                problem = _problem(obj, obj.parameters, fields_ok="dataclass" in obj.labels)
                if problem is not None:
                    problems[f"{obj.path}()"] = problem
        for name, member in obj.members.items():
            if name.startswith("_") or member.is_alias or not isinstance(member, griffe.Function):
                continue
            if "property" in member.labels:
                continue
            if member.docstring is None and _documented_elsewhere(member, protocols):
                continue
            if (problem := _problem(member, member.parameters)) is not None:
                problems[member.path] = problem
    return problems


@pytest.fixture(scope="module")
def package() -> griffe.Module:
    return _load()


def test_public_docstrings_list_exactly_their_parameters(package):
    problems = _problems(package)
    assert not problems, "docstrings whose Args: does not match the signature:\n" + "\n".join(
        f"  {path}: {problem}" for path, problem in sorted(problems.items())
    )


_BROKEN = '''
class Thing:
    """A thing.

    Args:
        size: how big.
        colour: a parameter the signature lost.
    """

    def __init__(self, size: int, *, weight: float) -> None: ...

    def grow(self, by: int) -> None:
        """Grow it, parameters in prose: ``by`` is the step."""


def make(size: int, *args: int, **kwargs: int) -> Thing:
    """Make one.

    Args:
        size: how big.
        size: twice.
        **kwargs: passed on.
    """
'''


def test_the_check_names_missing_extra_and_repeated_parameters():
    """A broken docstring fails the check, naming the object and the names (the check
    itself can fail)."""
    logging.getLogger("griffe").setLevel(logging.ERROR)
    with griffe.temporary_visited_module(_BROKEN, docstring_parser="google") as module:
        thing, make = module["Thing"], module["make"]
        assert _problem(thing, thing.parameters) == "Args: missing ['weight'], extra ['colour']"
        grow = thing.members["grow"]
        assert _problem(grow, grow.parameters) == "no Args: section (parameters: by)"
        assert _problem(make, make.parameters) == "Args: listed twice ['size']"
