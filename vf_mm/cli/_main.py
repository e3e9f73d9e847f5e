"""The ``vf-mm`` command line: one module per command, each a thin layer over library code."""

from __future__ import annotations

import argparse
import sys

from vf_mm import __version__
from vf_mm.errors import VfMmError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vf-mm",
        description="Multimodal, multi-turn RL environments: evaluate a model on an "
        "environment, stream rollouts to a trainer, serve a checkpoint, and look at the "
        "results.",
        epilog="Start with `vf-mm eval shapes` (the embedded tiny model, no download), then "
        "`vf-mm view outputs/<run>`; `vf-mm init NAME` starts an environment of your own. "
        "`vf-mm COMMAND --help` explains each command.",
    )
    parser.add_argument("--version", action="version", version=f"vf-mm {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    from vf_mm.cli import _eval, _export, _init, _keys, _merge, _rollout, _serve, _stream, _view

    _init.register(sub)
    _eval.register(sub)
    _rollout.register(sub)
    _stream.register(sub)
    _serve.register(sub)
    _view.register(sub)
    _merge.register(sub)
    _export.register(sub)
    _keys.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the ``vf-mm`` command line; returns its exit status.

    Args:
        argv: The arguments (default: ``sys.argv[1:]``).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    server_args: list[str] = []
    if "--" in argv:  # what follows goes to the vLLM servers --spawn starts
        cut = argv.index("--")
        argv, server_args = argv[:cut], argv[cut + 1 :]
    parser = build_parser()
    args = parser.parse_args(argv)
    if server_args and not hasattr(args, "spawn"):
        parser.error(f"vf-mm {args.command} takes no arguments after --")
    args.server_args = server_args
    try:
        return int(args.run(args) or 0)
    except VfMmError as exc:  # a refusal we can explain: no traceback
        print(f"vf-mm {args.command}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
