"""``load_environment(env_id, **env_args)``: find an environment and build it.

Where it looks, in order:

1. installed packages that declare an entry point in the ``vf_mm.environments`` group
   (``[project.entry-points."vf_mm.environments"] my-env = "my_env:load_environment"``);
2. ``environments/<env_id>/`` under the current directory, then under vf_mm's own
   checkout (an editable install), or in ``search_paths``: a module
   ``<env_id>.py`` (dashes as underscores) or a package of that name inside it, as the
   example environments are laid out, so a working tree runs without installing;
3. an importable module named ``env_id`` with a ``load_environment`` function.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vf_mm.envs._env import Environment
from vf_mm.errors import EnvironmentNotFoundError

ENTRY_POINT_GROUP = "vf_mm.environments"


def load_environment(
    env_id: str, *, search_paths: Sequence[str | Path] | None = None, **env_args: Any
) -> Environment:
    factory = _find(env_id, search_paths)
    env = factory(**env_args)
    if not isinstance(env, Environment):
        raise EnvironmentNotFoundError(
            f"{env_id}: load_environment returned a {type(env).__name__}, not a vf_mm Environment"
        )
    if env.env_id == type(env).__name__:
        env.env_id = env_id
    return env


def list_environments(search_paths: Sequence[str | Path] | None = None) -> list[str]:
    """Ids of the installed environments and of those in ``environments/``."""
    found = {ep.name for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}
    for root in _roots(search_paths):
        if root.is_dir():
            found.update(p.name for p in root.iterdir() if p.is_dir() and _module_file(p, p.name))
    return sorted(found)


def _find(env_id: str, search_paths: Sequence[str | Path] | None) -> Any:
    wanted = {env_id, env_id.replace("-", "_"), env_id.replace("_", "-")}
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in wanted:
            return ep.load()
    searched = []
    for root in _roots(search_paths):
        for name in wanted:
            folder = root / name
            searched.append(str(folder))
            source = _module_file(folder, name) if folder.is_dir() else None
            if source is not None:
                return _load_from(source, env_id)
    module_name = env_id.replace("-", "_")
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        module = None
    if module is not None and hasattr(module, "load_environment"):
        return module.load_environment
    raise EnvironmentNotFoundError(
        f"no environment {env_id!r}: no entry point in group {ENTRY_POINT_GROUP!r}, none of "
        f"{', '.join(searched)}, no importable module {module_name!r} with load_environment; "
        f"available: {', '.join(list_environments(search_paths)) or 'none'}"
    )


def _roots(search_paths: Sequence[str | Path] | None) -> list[Path]:
    if search_paths:
        return [Path(p) for p in search_paths]
    roots = [Path.cwd() / "environments"]
    checkout = Path(__file__).resolve().parents[2] / "environments"  # vf_mm's own working tree
    if checkout.is_dir() and checkout not in roots:
        roots.append(checkout)
    return roots


def _module_file(folder: Path, name: str) -> Path | None:
    module = name.replace("-", "_")
    for candidate in (folder / f"{module}.py", folder / module / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _load_from(source: Path, env_id: str) -> Any:
    # a private module name: environments/zoom must not shadow (or be shadowed by) an
    # unrelated installed module called "zoom"
    stem = source.parent.name if source.name == "__init__.py" else source.stem
    module_name = f"_vf_mm_env_{stem}"
    if module_name in sys.modules and getattr(sys.modules[module_name], "__file__", None) == str(
        source
    ):
        module = sys.modules[module_name]
    else:
        spec = importlib.util.spec_from_file_location(
            module_name,
            source,
            submodule_search_locations=[str(source.parent)]
            if source.name == "__init__.py"
            else None,
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
    if not hasattr(module, "load_environment"):
        raise EnvironmentNotFoundError(f"{source} has no load_environment function ({env_id})")
    return module.load_environment
