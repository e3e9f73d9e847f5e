"""``source_key``: a source's identity without decoding it, and no key where none is safe."""

from __future__ import annotations

import base64
import os
import time

import numpy as np
import pytest

from vf_mm.images import (
    ImagePolicy,
    source_key,
)
from vf_mm.images._internal import SourceKey
from vf_mm.images._key import RACY_S

from ._make import gradient, png_bytes

URL = "data:image/png;base64," + base64.b64encode(png_bytes()).decode()


@pytest.fixture
def settled(monkeypatch):
    """Look up keys as if ``RACY_S`` + 1 seconds had passed since every file was written
    (a file changed within ``RACY_S`` gets no key; waiting would only make tests slow)."""
    import vf_mm.images._key as module

    now = time.time_ns
    monkeypatch.setattr(module.time, "time_ns", lambda: now() + int((RACY_S + 1) * 1e9))


def changed(data: bytes) -> bytes:
    """``data`` with one byte changed: another file of the same size."""
    out = bytearray(data)
    out[len(out) // 2] ^= 0xFF
    return bytes(out)


def test_equal_data_urls_share_a_key_whatever_the_object():
    copy = (URL + " ")[:-1]  # an equal string, another object (as JSON decoding makes)
    assert copy is not URL
    assert source_key(URL) == source_key(copy)
    assert hash(source_key(URL)) == hash(source_key(copy))
    # and through every content-part form
    parts = [
        {"type": "image_url", "image_url": {"url": copy}},
        {"type": "image_url", "image_url": copy},
        {"type": "image", "image": copy},
        {"type": "image", "url": copy},
    ]
    assert {source_key(p) for p in parts} == {source_key(URL)}


def test_different_data_urls_never_share_a_key():
    other = "data:image/png;base64," + base64.b64encode(png_bytes(gradient(17, 12))).decode()
    relabelled = URL.replace("image/png", "image/jpeg", 1)  # same payload, other header
    assert len({source_key(URL), source_key(other), source_key(relabelled)}) == 3


def test_a_key_is_compared_in_full_not_by_its_sampled_hash():
    """The hash samples the payload; two payloads that differ only between the samples
    hash alike but are different keys (a collision costs a comparison, never an image)."""
    text = "data:image/png;base64," + "A" * 100_000
    step = len(text) // 256
    at = next(i for i in range(2000, len(text) - 2000) if i % step)  # not a sampled index
    changed = text[:at] + "B" + text[at + 1 :]
    a, b = SourceKey("data_url", text), SourceKey("data_url", changed)
    assert hash(a) == hash(b)
    assert a != b


def test_bytes_have_a_key_and_mutable_buffers_do_not():
    data = png_bytes()
    assert source_key(data) == source_key(bytes(bytearray(data)))
    assert source_key(bytearray(data)) is None
    assert source_key(memoryview(data)) is None


def test_mutable_and_remote_sources_have_no_key():
    image = gradient()
    assert source_key(image) is None  # PIL: mutable in place, no version to check
    assert source_key(np.asarray(image)) is None
    assert source_key({"type": "image", "image": image}) is None
    assert source_key("https://example.com/a.png", policy=ImagePolicy.trusted()) is None


def test_a_file_is_keyed_by_its_identity_and_a_rewrite_changes_it(tmp_path, settled):
    path = tmp_path / "a.png"
    path.write_bytes(png_bytes())
    key = source_key(path)
    assert key is not None
    assert source_key(str(path)) == key == source_key(path.as_uri())
    assert source_key({"type": "image", "path": str(path)}) == key
    # same path, new content of the same size, the old mtime put back: ctime still moves
    before = path.stat()
    path.write_bytes(changed(png_bytes()))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    if after.st_ctime_ns == before.st_ctime_ns:
        pytest.skip("this file system's ctime did not move within the test")
    assert source_key(path) not in (None, key)


def test_a_file_replaced_by_another_changes_its_key(tmp_path, settled):
    path = tmp_path / "a.png"
    path.write_bytes(png_bytes())
    key = source_key(path)
    other = tmp_path / "b.png"
    other.write_bytes(changed(png_bytes()))
    os.replace(other, path)  # a new inode under the old name
    assert source_key(path) not in (None, key)


def test_a_file_changed_just_now_gets_no_key(tmp_path):
    """Within ``RACY_S`` of a change, two versions written within one timestamp tick
    could share a key: such a file is found by its pixels until it settles."""
    path = tmp_path / "a.png"
    path.write_bytes(png_bytes())
    old = time.time() - 3600
    os.utime(path, (old, old))  # an old mtime does not help: utime moved the ctime
    assert source_key(path) is None


def test_the_guard_runs_first_and_refused_or_unreadable_paths_get_no_key(tmp_path, settled):
    inside = tmp_path / "in"
    inside.mkdir()
    outside = tmp_path / "out.png"
    outside.write_bytes(png_bytes())
    link = inside / "link.png"
    link.symlink_to(outside)
    confined = ImagePolicy.dataset(roots=[inside])
    assert source_key(outside) is not None  # any path under the default policy
    assert source_key(outside, policy=confined) is None  # outside the roots
    assert source_key(link, policy=confined) is None  # a symlink out of the roots
    assert source_key(outside, policy=ImagePolicy.dataset()) is None  # no local files
    assert source_key(tmp_path / "missing.png") is None
    assert source_key(tmp_path) is None  # a directory
    assert source_key("ftp://example.com/a.png") is None  # load_image names the refusal
    assert source_key({"type": "image"}) is None
    assert source_key(42) is None


def test_a_key_holds_its_source_and_says_what_that_costs():
    key = source_key(URL)
    assert key.value is URL  # a reference, not a copy
    assert key.nbytes >= len(URL)
    assert "data_url" in repr(key) and "base64" not in repr(key)  # no payload in reprs
