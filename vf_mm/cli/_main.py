"""Entry point of ``vf-mm``: parses arguments and dispatches to one module per command."""

from __future__ import annotations

import argparse
import sys

from vf_mm import __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vf-mm", description=__doc__)
    parser.add_argument("--version", action="version", version=f"vf-mm {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    from vf_mm.cli import _serve, _stream

    _stream.register(sub)
    _serve.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
