"""Reading local files: regular files only, bounded, no hanging, no late symlinks."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from vf_mm.errors import ImageFetchError, ImageTooLargeError, UnsafeImageSourceError
from vf_mm.images._local import read_local_file


def test_reads_a_regular_file(tmp_path: Path):
    path = tmp_path / "a.bin"
    path.write_bytes(b"abc" * 1000)
    assert read_local_file(path, max_bytes=3000, confined=False) == b"abc" * 1000


def test_a_file_over_max_bytes_is_refused(tmp_path: Path):
    path = tmp_path / "a.bin"
    path.write_bytes(b"x" * 101)
    with pytest.raises(ImageTooLargeError, match="101 bytes"):
        read_local_file(path, max_bytes=100, confined=False)


def test_a_directory_is_a_fetch_error(tmp_path: Path):
    with pytest.raises(ImageFetchError, match="directory"):
        read_local_file(tmp_path, max_bytes=100, confined=False)


def test_a_missing_file(tmp_path: Path):
    with pytest.raises(ImageFetchError, match="no such file"):
        read_local_file(tmp_path / "nope", max_bytes=100, confined=False)


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="needs /dev/zero")
def test_a_device_is_refused_not_read_forever():
    with pytest.raises(UnsafeImageSourceError, match="regular file"):
        read_local_file(Path("/dev/zero"), max_bytes=100, confined=False)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_fifo_is_refused_without_blocking(tmp_path: Path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(UnsafeImageSourceError, match="regular file"):
        read_local_file(fifo, max_bytes=100, confined=False)


@pytest.mark.skipif(not hasattr(os, "O_NOFOLLOW"), reason="needs O_NOFOLLOW")
def test_a_symlink_is_not_followed_when_confined(tmp_path: Path):
    """``check_local_path`` hands over a resolved path; if a symlink appears there
    afterwards (a swap between check and open), the confined read refuses it."""
    target = tmp_path / "secret"
    target.write_bytes(b"secret")
    link = tmp_path / "link"
    link.symlink_to(target)
    with pytest.raises(UnsafeImageSourceError, match="symlink"):
        read_local_file(link, max_bytes=100, confined=True)
    assert read_local_file(link, max_bytes=100, confined=False) == b"secret"
