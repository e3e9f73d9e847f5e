"""``load_environment(env_id, **env_args)``: find an environment and build it.

``env_id`` is an id or a path. A path (it names an existing file or folder, or holds a
``/``) is loaded directly: a module file ``path/to/my_env.py``, or an environment folder
``path/to/my-env/`` holding ``my_env.py`` or a package ``my_env/`` (as the example
environments are laid out), or a folder that is itself a package (``__init__.py``).

An id is looked for, in order:

1. installed packages that declare an entry point in the ``vf_mm.environments`` group
   (``[project.entry-points."vf_mm.environments"] my-env = "my_env:load_environment"``);
2. ``<root>/<env_id>/`` (dashes or underscores) for each root: ``search_paths`` (the CLI's
   ``--env-dir``, in order), then the folders in ``$VF_MM_ENV_PATH`` (``os.pathsep``
   separated), then ``./environments`` and vf_mm's own checkout's ``environments/``;
3. an importable module named ``env_id`` with a ``load_environment`` function.

When nothing matches, the error lists every place it looked and the environments it
found there. ``load_environment_with(env_id, adapters=...)`` also accepts what another
framework's ``load_environment`` returns (a verifiers environment), wrapped by the first
adapter that knows it: ``vf_mm.load_environment`` passes ``vf_mm.adapters``' own.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import importlib.util
import inspect
import os
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from vf_mm._text import shorten
from vf_mm.envs._env import Environment
from vf_mm.envs._messages import did_you_mean
from vf_mm.errors import EnvironmentArgsError, EnvironmentLoadError, EnvironmentNotFoundError
from vf_mm.types import RolloutError

ENTRY_POINT_GROUP = "vf_mm.environments"
#: folders to look for environments in, before ./environments (os.pathsep separated)
ENV_PATH_VAR = "VF_MM_ENV_PATH"


#: turns what another framework's ``load_environment`` returned into a vf_mm Environment:
#: ``adapter(obj, env_id)`` (``env_id`` as a run names it) gives the Environment, or None
#: when ``obj`` is not of the framework it knows
Adapter = Callable[[Any, str], "Environment | None"]


def load_environment(
    env_id: str, *, search_paths: Sequence[str | Path] | None = None, **env_args: Any
) -> Environment:
    return load_environment_with(env_id, adapters=(), search_paths=search_paths, env_args=env_args)


def load_environment_with(
    env_id: str,
    *,
    adapters: Sequence[Adapter],
    search_paths: Sequence[str | Path] | None = None,
    env_args: dict[str, Any] | None = None,
) -> Environment:
    """``load_environment``, where what the found function returns may also be another
    framework's environment: the first of ``adapters`` that knows it wraps it (the
    adapters live above this package, ``vf_mm.adapters``, and are passed in, so loading
    never imports upward). Anything no adapter knows is refused as before."""
    env_args = dict(env_args or {})
    factory = _find(env_id, search_paths)
    _check_env_args(env_id, factory, env_args)
    try:
        env = factory(**env_args)
    except Exception as exc:
        refused = _refused_keyword(env_id, factory, env_args, exc)
        if refused is not None:
            raise refused from exc
        raise _load_error(env_id, f"load_environment({_args_text(env_args)}) raised", exc) from exc
    if not isinstance(env, Environment):
        for adapter in adapters:
            adapted = adapter(env, _display_id(env_id))
            if adapted is not None:
                return adapted
        raise EnvironmentNotFoundError(
            f"{env_id}: load_environment returned a {type(env).__name__}, not a vf_mm Environment"
        )
    if env.env_id == type(env).__name__:  # named after how it was found
        env.env_id = _display_id(env_id)
    return env


def _named_parameters(factory: Any) -> list[inspect.Parameter] | None:
    """The parameters ``factory`` takes by keyword, or None when it takes any (``**kwargs``
    is then reported separately) or cannot be introspected."""
    try:
        return [
            p
            for p in inspect.signature(factory).parameters.values()
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        ]
    except (TypeError, ValueError):  # a builtin or a callable without a signature
        return None


def _takes_any_keyword(factory: Any) -> bool:
    try:
        kinds = [p.kind for p in inspect.signature(factory).parameters.values()]
    except (TypeError, ValueError):
        return True
    return inspect.Parameter.VAR_KEYWORD in kinds


def _check_env_args(env_id: str, factory: Any, env_args: dict[str, Any]) -> None:
    """Refuse, before the call, a keyword ``load_environment`` does not name (when it
    takes no ``**kwargs``) and a required keyword not given: ``EnvironmentArgsError``
    naming it, the nearest accepted one and all of them."""
    params = _named_parameters(factory)
    if params is None:
        return
    names = [p.name for p in params]
    if not _takes_any_keyword(factory):
        for key in env_args:
            if key not in names:
                raise _args_error(env_id, key, "unknown", names)
    for p in params:
        if p.default is p.empty and p.name not in env_args:
            raise _args_error(env_id, p.name, "missing", names)


def _refused_keyword(
    env_id: str, factory: Any, env_args: dict[str, Any], exc: BaseException
) -> EnvironmentArgsError | None:
    """For a ``load_environment(**kwargs)`` that passed an env arg on to a callable that
    does not take it (the ``TypeError`` Python raises for an unexpected keyword): the
    ``EnvironmentArgsError`` naming it; None for any other failure."""
    if not isinstance(exc, TypeError):
        return None
    match = re.fullmatch(r"(\S+)\(\) got an unexpected keyword argument '(\w+)'", str(exc))
    params = _named_parameters(factory)
    if match is None or match.group(2) not in env_args or params is None:
        return None
    names = [p.name for p in params]
    if match.group(2) in names:  # the environment's own code passed it wrongly: its bug
        return None
    return _args_error(env_id, match.group(2), "unknown", names, passes_on=f"{match.group(1)}()")


def _args_error(
    env_id: str, name: str, kind: str, accepted: list[str], *, passes_on: str | None = None
) -> EnvironmentArgsError:
    close = difflib.get_close_matches(name, accepted, n=1) if kind == "unknown" else []
    suggestion = close[0] if close else None
    takes = ", ".join(accepted) if accepted else "no named arguments"
    if passes_on is not None:
        takes += f", and keywords it passes on to {passes_on}, which does not take {name!r}"
    what = (
        f"takes no argument {name!r}" + (f" (did you mean {suggestion!r}?)" if suggestion else "")
        if kind == "unknown"
        else f"needs the argument {name!r}"
    )
    return EnvironmentArgsError(
        f"{env_id}: load_environment {what}; it takes: {takes}",
        name=name,
        kind=kind,
        accepted=list(accepted),
        suggestion=suggestion,
        passes_on=passes_on,
    )


def _load_error(env_id: str, what: str, exc: BaseException) -> EnvironmentLoadError:
    """``"<env_id>: <what> <Type>: <message> (at file:line in func)"``."""
    return EnvironmentLoadError(f"{env_id}: {what} {RolloutError.from_exception(exc)}")


def _args_text(env_args: dict[str, Any]) -> str:
    return shorten(", ".join(f"{k}={v!r}" for k, v in env_args.items()), 200)


def _display_id(env_id: str) -> str:
    """The id of an environment given by id (as is) or by path (its folder or module name)."""
    path = Path(env_id)
    if path.exists() or "/" in env_id or env_id.endswith(".py"):
        resolved = path.resolve()
        return resolved.stem if resolved.suffix == ".py" else resolved.name
    return env_id


def list_environments(search_paths: Sequence[str | Path] | None = None) -> list[str]:
    """Ids of the installed environments and of those in ``environments/``.

    Args:
        search_paths: Folders searched first (as for ``load_environment``).
    """
    found = {ep.name for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}
    for root in _roots(search_paths):
        if root.is_dir():
            found.update(p.name for p in root.iterdir() if p.is_dir() and _module_file(p, p.name))
    return sorted(found)


def _find(env_id: str, search_paths: Sequence[str | Path] | None) -> Any:
    path = Path(env_id)
    if path.exists() or "/" in env_id or env_id.endswith(".py"):
        return _load_path(path, env_id)
    wanted = {env_id, env_id.replace("-", "_"), env_id.replace("_", "-")}
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in wanted:
            try:
                return ep.load()
            except Exception as exc:  # the installed package's own code failed
                raise _load_error(
                    env_id, f"loading the installed entry point {ep.value!r} failed:", exc
                ) from exc
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
    except Exception as exc:
        if not (isinstance(exc, ModuleNotFoundError) and exc.name == module_name):
            # the module exists, and its own code (or something it imports) failed
            raise _load_error(env_id, f"importing module {module_name!r} failed:", exc) from exc
        module = None
    if module is not None and hasattr(module, "load_environment"):
        return module.load_environment
    places = [f"  entry points in group {ENTRY_POINT_GROUP!r}: {_installed() or 'none'}"]
    places += [f"  {root}/: {_found_in(root)}" for root in _roots(search_paths)]
    places.append(f"  an importable module {module_name!r}: none with load_environment")
    known = [ep.name for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)]
    for root in _roots(search_paths):
        if root.is_dir():
            known += [p.name for p in root.iterdir() if p.is_dir() and _module_file(p, p.name)]
    close = did_you_mean(env_id, tuple(sorted(set(known))))
    raise EnvironmentNotFoundError(
        f"no environment {env_id!r}"
        + (f" ({close})" if close else "")
        + ". Looked in:\n"
        + "\n".join(places)
        + "\n"
        "Pass a path (vf-mm eval ./path/to/env), add a folder with --env-dir or "
        "VF_MM_ENV_PATH, or install the environment (pip install -e environments/<id>)."
    )


def _installed() -> str:
    return ", ".join(
        sorted(ep.name for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP))
    )


def _found_in(root: Path) -> str:
    if not root.is_dir():
        return "no such folder"
    names = sorted(p.name for p in root.iterdir() if p.is_dir() and _module_file(p, p.name))
    return ", ".join(names) if names else "no environments"


def _load_path(path: Path, env_id: str) -> Any:
    """An environment named by a path: a module file, an environment folder, a package."""
    if path.is_file():
        if path.suffix != ".py":
            raise EnvironmentNotFoundError(f"{path}: not a Python module (.py)")
        return _load_from(path.resolve(), path.stem)
    if path.is_dir():
        name = path.resolve().name
        source = _module_file(path, name) or (
            path / "__init__.py" if (path / "__init__.py").is_file() else None
        )
        if source is not None:
            return _load_from(source.resolve(), name)
        held = sorted(p.name + ("/" if p.is_dir() else "") for p in path.iterdir())
        raise EnvironmentNotFoundError(
            f"{path}: an environment folder holds {name.replace('-', '_')}.py, a package "
            f"{name.replace('-', '_')}/ or an __init__.py; this one holds: "
            f"{', '.join(held[:20]) or 'nothing'}"
            + (f" and {len(held) - 20} more" if len(held) > 20 else "")
        )
    raise EnvironmentNotFoundError(f"{env_id}: no such file or folder")


def _roots(search_paths: Sequence[str | Path] | None) -> list[Path]:
    roots = [Path(p) for p in search_paths or ()]
    roots += [Path(p) for p in os.environ.get(ENV_PATH_VAR, "").split(os.pathsep) if p]
    roots.append(Path.cwd() / "environments")
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
        try:
            spec.loader.exec_module(module)
        except Exception as exc:  # never leave a half-run module behind for the next try
            del sys.modules[module_name]
            raise _load_error(env_id, f"importing {source} failed:", exc) from exc
    if not hasattr(module, "load_environment"):
        raise EnvironmentNotFoundError(f"{source} has no load_environment function ({env_id})")
    return module.load_environment
