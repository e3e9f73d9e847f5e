"""``vf-mm init NAME [--multi-turn | --tools] [--family F]``: a new environment folder that
already works, its test checking it on the family the author targets."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from vf_mm.cli._console import cli_console
from vf_mm.errors import UnsupportedModelError
from vf_mm.models import VISION_FAMILIES, family_info


def register(sub: Any) -> None:
    init = sub.add_parser(
        "init",
        help="create environments/NAME: a working environment to edit",
        description="Write environments/NAME/ with a module defining load_environment (a small "
        "task on synthetic images), a pyproject with the vf_mm.environments entry point, a "
        "test that runs check_environment, and a README. `vf-mm eval NAME` and `pytest "
        "environments/NAME` pass right away. Default: a single-turn environment.",
    )
    init.add_argument("name", help="environment id (letters, digits, '-', '_')")
    kind = init.add_mutually_exclusive_group()
    kind.add_argument(
        "--multi-turn",
        dest="kind",
        action="store_const",
        const="multi-turn",
        help="a MultiTurnEnv: a new image each turn, state, a stop condition, finish_state",
    )
    kind.add_argument(
        "--tools",
        dest="kind",
        action="store_const",
        const="tools",
        help="a ToolEnv whose tool returns an image into the tool message",
    )
    init.add_argument(
        "--dir",
        type=Path,
        default=Path("environments"),
        help="folder to create NAME in (default: ./environments, where vf-mm eval looks)",
    )
    init.add_argument(
        "--family",
        type=family_argument,
        default="qwen2_5_vl",
        metavar="F",
        help=f"the model family you target (a model_type: {', '.join(VISION_FAMILIES)}); the "
        "test runs check_environment on its tiny checkpoint (default: qwen2_5_vl)",
    )
    init.set_defaults(run=run_init, kind="single-turn")


def family_argument(text: str) -> str:
    """``text`` if it names a vision family; otherwise a usage error naming the nearest."""
    try:
        family_info(text)
    except UnsupportedModelError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def run_init(args: argparse.Namespace, console: Console | None = None) -> int:
    from vf_mm.envs import scaffold_environment

    console = console or cli_console()
    try:
        files = scaffold_environment(
            args.name, kind=args.kind, directory=args.dir, family=args.family
        )
    except (ValueError, FileExistsError) as exc:
        console.print(f"[red]vf-mm init:[/red] {escape(str(exc))}")
        return 1
    folder = files[0].parent
    console.print(f"Created {escape(str(folder))}/ ({args.kind}, checked on {args.family}):")
    for path in files:
        console.print(f"  {escape(str(path.relative_to(folder)))}")
    where = "" if args.dir == Path("environments") else f" --env-dir {escape(str(args.dir))}"
    console.print(
        f"Next: [bold]vf-mm eval {escape(args.name)}{where}[/bold] and "
        f"[bold]pytest {escape(str(folder))}[/bold]; then edit "
        f"{escape(files[0].name)}. The guide: docs/environments.md."
    )
    return 0
