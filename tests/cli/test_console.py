"""``cli_console``: what a command prints keeps a long path on one line, whatever the
terminal's width, so it can be copied or read from a pipe whole."""

from __future__ import annotations

import io

from vf_mm.cli._console import cli_console


def test_a_long_path_is_printed_whole_on_a_narrow_terminal():
    console = cli_console()
    console.file = io.StringIO()
    console.width = 40
    path = "/tmp/" + "a-very-long-folder-name/" * 6 + "report.html"
    console.print(f"wrote {path} (93 KiB: 5 rollouts)")
    assert path in console.file.getvalue().splitlines()[0]


def test_it_writes_to_stderr_when_asked():
    assert cli_console(stderr=True).stderr and not cli_console().stderr
