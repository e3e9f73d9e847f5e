"""``vf-mm keys NAME``: a CURVE key pair for the trainer hop (over ``training.write_key_pair``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def register(sub: Any) -> None:
    p = sub.add_parser(
        "keys",
        help="write a CURVE key pair for the trainer hop (trainer or worker)",
        description="Write NAME.key (the public key: give it out) and NAME.key_secret (keep "
        "it: mode 0600) into DIR. The trainer gets its own pair and a directory holding the "
        "workers' NAME.key files (its allow-list); each worker gets its own pair and the "
        "trainer's NAME.key. Existing files are never overwritten.",
    )
    p.add_argument("name", help="a file name for the pair, e.g. trainer or worker-3")
    p.add_argument("--dir", type=Path, default=Path("."), help="where to write (default .)")
    p.set_defaults(run=run_keys)


def run_keys(args: argparse.Namespace) -> int:
    from vf_mm.training import write_key_pair

    try:
        public, secret = write_key_pair(args.dir, args.name)
    except FileExistsError as exc:
        print(f"vf-mm keys: {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:
        print(f"vf-mm keys: {exc}", file=sys.stderr)
        return 2
    print(f"public key: {public}  (give it out: the trainer's allow-list, or every worker)")
    print(f"secret key: {secret}  (keep it here: mode 0600)")
    return 0
