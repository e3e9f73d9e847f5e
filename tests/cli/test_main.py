"""`vf-mm demo` and `vf-mm inspect`: the Quickstart's main job and the stream summary."""

from __future__ import annotations

import os

import numpy as np
import pytest

from vf_mm.cli import main
from vf_mm.wire import read_stream, write_stream


def test_demo_writes_a_stream_that_reads_back(tmp_path, capsys):
    assert main(["demo", "-o", str(tmp_path), "-n", "3", "--images", "2"]) == 0
    items = list(read_stream(tmp_path / "rollouts.vfmm"))
    assert [item["example_id"] for item in items] == [0, 1, 2]
    assert items[0]["images"][0]["pixel_values"].shape == (256, 1176)
    out = capsys.readouterr().out
    assert "read and checked them bit for bit" in out
    assert "3 frames, 12 tensors" in out


def test_inspect_reports_a_torn_stream_and_fails(tmp_path, capsys):
    path = tmp_path / "s.vfmm"
    write_stream(path, [{"x": np.arange(10)}, {"x": np.arange(20)}])
    os.truncate(path, path.stat().st_size - 5)
    assert main(["inspect", str(path)]) == 1
    out = capsys.readouterr().out
    assert "TornFrameError" in out
    assert "frame 1" in out


def test_inspect_a_whole_stream_succeeds(tmp_path, capsys):
    path = tmp_path / "s.vfmm"
    write_stream(path, [{"x": np.arange(10)}])
    assert main(["inspect", str(path)]) == 0
    assert "1 frames, 1 tensors, 0.0 MB" in capsys.readouterr().out


def test_version_flag(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert "vf-mm 0.1.0" in capsys.readouterr().out


def test_inspect_says_how_a_group_stream_ends(tmp_path, capsys):
    from vf_mm.training import GroupSender

    path = tmp_path / "groups.vfs"
    with pytest.raises(RuntimeError), GroupSender(path) as sender:
        sender.send({"x": 1})
        raise RuntimeError("backend died")
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "1 frames" in out and "which says it stopped early" in out
    assert "'error': 'RuntimeError: backend died'" in out
    write_stream(path, [{"x": 1}])
    assert main(["inspect", str(path)]) == 0
    assert "no end marker after the last frame" in capsys.readouterr().out
