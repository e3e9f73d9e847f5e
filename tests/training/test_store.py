"""The image store behind ``ref`` groups: written once by content, read back only where
the operator allowed (local roots, allow-listed network stores), and pruned by age.

Network stores run on fsspec's in-process ``memory://`` filesystem: the same code path as
``s3://`` or ``gs://`` (fsspec's interface), with no network.
"""

from __future__ import annotations

import hashlib
import os
import time
import uuid

import pytest

from tests.training.test_images import (
    assert_bit_exact,
    encoded,
    items_of,
    noise,
    sample,
    wire,
)
from vf_mm.errors import ImageRefError
from vf_mm.training import (
    ImageProcessing,
    ImageRebuilder,
    ImageStore,
    PruneReport,
    pack_group,
    unpack_group,
)


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    from vf_mm.renderers import load_renderer
    from vf_mm.testing import build_tiny_vlm

    path = build_tiny_vlm(tmp_path_factory.mktemp("tiny") / "qwen", "qwen2_5_vl")
    return path, load_renderer(path, image_backend="pil")


@pytest.fixture
def memory_url():
    """A fresh prefix in fsspec's memory filesystem, removed afterwards."""
    import fsspec

    name = f"memory://vfmm-{uuid.uuid4().hex[:8]}/images"
    yield name
    fs = fsspec.filesystem("memory")
    root = name.removeprefix("memory://").split("/")[0]
    if fs.exists(f"/{root}"):
        fs.rm(f"/{root}", recursive=True)


def ref_frame(qwen, store):
    path, renderer = qwen
    outputs = [*sample(renderer, [noise(40)], n=1), *sample(renderer, [noise(41)], n=1)]
    processing = ImageProcessing.from_vision(renderer.vision)
    frame = wire(pack_group(outputs, images="ref", processing=processing, store=store))
    return outputs, frame, ImageProcessing.from_checkpoint(path, image_backend="pil")


# -- local stores -----------------------------------------------------------------------


def test_a_store_takes_a_directory_or_its_file_url(tmp_path):
    by_path = ImageStore(tmp_path / "a")
    by_url = ImageStore((tmp_path / "a").as_uri())
    assert by_path.url == by_url.url and by_path.is_local
    uri, sha = by_path.put(b"bytes")
    assert uri == by_url.uri(sha) and sha == hashlib.sha256(b"bytes").hexdigest()


def test_http_is_no_store(tmp_path):
    with pytest.raises(ValueError, match="cannot be https://"):
        ImageStore("https://example.com/images")
    with pytest.raises(ValueError, match="roots="):
        ImageRebuilder(object(), stores=[str(tmp_path)])  # a local directory goes in roots
    with pytest.raises(ValueError, match="cannot be http://"):
        ImageRebuilder(object(), stores=["http://10.0.0.1/images"])


def age(path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_prune_deletes_what_no_put_touched_for_that_long(tmp_path):
    store = ImageStore(tmp_path / "store")
    _, old = store.put(b"old image")
    _, fresh = store.put(b"fresh image")
    _, reshown = store.put(b"shown again")
    age(store.path(old), 7200)
    age(store.path(reshown), 7200)
    store.put(b"shown again")  # a new group shows it: its time is now
    leftover = store.path(old).parent / f".{old}.deadbeef.tmp"  # a killed writer's
    leftover.write_bytes(b"partial")
    age(leftover, 7200)
    foreign = tmp_path / "store" / "README"  # not the store's layout: never touched
    foreign.write_text("kept")
    age(foreign, 7200)

    assert store.prune(older_than_s=3600, dry_run=True) == PruneReport(2, 16, 2)
    assert store.path(old).exists()  # a dry run deletes nothing
    assert store.prune(older_than_s=3600) == PruneReport(2, 16, 2)
    assert not store.path(old).exists() and not leftover.exists()
    assert store.path(fresh).exists() and store.path(reshown).exists() and foreign.exists()
    assert store.prune(older_than_s=3600) == PruneReport(0, 0, 2)


def test_prune_refuses_bad_ages_and_object_stores(tmp_path, memory_url):
    with pytest.raises(ValueError, match="older_than_s"):
        ImageStore(tmp_path / "s").prune(older_than_s=-1)
    with pytest.raises(ValueError, match="lifecycle rule"):
        ImageStore(memory_url).prune(older_than_s=60)


def test_a_pruned_image_is_a_missing_reference_not_other_pixels(qwen, tmp_path):
    store = ImageStore(tmp_path / "store")
    _outputs, frame, trainer = ref_frame(qwen, store)
    for entry in frame["sources"].values():
        age(store.path(entry["sha256"]), 10)
    assert store.prune(older_than_s=5).deleted == 2
    with ImageRebuilder(trainer, roots=[store.root], on_missing="skip") as rebuilder:
        got = unpack_group(frame, images=rebuilder)
    assert all(r.error is not None and r.trajectory == [] for r in got)
    assert len(rebuilder.failures) == 2


# -- network stores (fsspec) ------------------------------------------------------------


def test_a_network_store_round_trips_bit_for_bit(qwen, memory_url):
    store = ImageStore(memory_url)
    assert not store.is_local and repr(store) == f"ImageStore({memory_url!r})"
    outputs, frame, trainer = ref_frame(qwen, store)
    for entry in frame["sources"].values():
        assert entry["uri"] == f"{memory_url}/{entry['sha256'][:2]}/{entry['sha256']}"
    with ImageRebuilder(trainer, stores=[memory_url + "/"]) as rebuilder:
        got = unpack_group(frame, images=rebuilder)
    assert_bit_exact(items_of(outputs), items_of(got))


def test_a_put_to_a_network_store_is_written_once(memory_url):
    import fsspec

    store = ImageStore(memory_url)
    uri, sha = store.put(b"x" * 10)
    fs = fsspec.filesystem("memory")
    before = fs.info(store.path(sha))
    assert store.put(b"x" * 10) == (uri, sha)
    assert fs.info(store.path(sha)) == before


def test_a_store_not_allow_listed_is_never_read(qwen, memory_url):
    _outputs, frame, trainer = ref_frame(qwen, ImageStore(memory_url))
    for stores in ([], [memory_url + "-other"], [memory_url.rsplit("/", 1)[0] + "/imag"]):
        with (
            ImageRebuilder(trainer, stores=stores) as rebuilder,
            pytest.raises(ImageRefError, match="no allow-listed store"),
        ):
            unpack_group(frame, images=rebuilder)


def test_a_reference_must_name_the_stores_own_layout(qwen, memory_url):
    """Under an allowed prefix, only ``<sha[:2]>/<sha>`` is read: not another key in the
    bucket, not a path that climbs out of the prefix."""
    import fsspec

    _outputs, frame, trainer = ref_frame(qwen, ImageStore(memory_url))
    entry = next(iter(frame["sources"].values()))
    sha = entry["sha256"]
    fsspec.filesystem("memory").pipe_file(
        memory_url.removeprefix("memory:/") + "/secret", b"not for frames"
    )
    for uri in (
        f"{memory_url}/secret",
        f"{memory_url}/{sha[:2]}/../../secret",
        f"{memory_url}/../images/{sha[:2]}/{sha}",
    ):
        entry["uri"] = uri
        with (
            ImageRebuilder(trainer, stores=[memory_url]) as rebuilder,
            pytest.raises(ImageRefError, match="no allow-listed store"),
        ):
            unpack_group(frame, images=rebuilder)


def test_a_missing_object_follows_the_policy(qwen, memory_url):
    import fsspec

    store = ImageStore(memory_url)
    outputs, frame, trainer = ref_frame(qwen, store)
    first = next(iter(frame["sources"].values()))
    fsspec.filesystem("memory").rm(store.path(first["sha256"]))
    with (
        ImageRebuilder(trainer, stores=[memory_url]) as rebuilder,
        pytest.raises(ImageRefError, match="no such object"),
    ):
        unpack_group(frame, images=rebuilder)
    with ImageRebuilder(trainer, stores=[memory_url], on_missing="skip") as rebuilder:
        lost, kept = unpack_group(frame, images=rebuilder)
    assert lost.trajectory == [] and lost.error.type == "ImageRefError"
    assert_bit_exact(items_of(outputs[1:]), items_of([kept]))


def test_a_changed_or_oversized_object_is_refused(qwen, memory_url):
    import fsspec

    from vf_mm.images import ImagePolicy

    store = ImageStore(memory_url)
    _outputs, frame, trainer = ref_frame(qwen, store)
    first = next(iter(frame["sources"].values()))
    fs = fsspec.filesystem("memory")
    fs.pipe_file(store.path(first["sha256"]), encoded(noise(99)))  # a valid image, other bytes
    with (
        ImageRebuilder(trainer, stores=[memory_url]) as rebuilder,
        pytest.raises(ImageRefError, match="do not match their sha256"),
    ):
        unpack_group(frame, images=rebuilder)
    small = ImagePolicy.dataset(max_bytes=100)
    rebuilder = ImageRebuilder(trainer, policy=small, stores=[memory_url])
    with rebuilder, pytest.raises(ImageRefError, match="over max_bytes=100"):
        unpack_group(frame, images=rebuilder)


def test_a_store_whose_driver_is_missing_says_so(tmp_path):
    with pytest.raises(ValueError, match="fsspec cannot open it"):
        ImageStore("nosuchprotocol://bucket/images")


# -- what the review of the store found ---------------------------------------------------


def test_a_policy_without_roots_reads_no_file_reference(qwen, tmp_path):
    """A policy for trusted code (local_roots=None) reads any path: given to a rebuilder
    (to raise max_bytes, say), it must not let a frame read files by name."""
    from vf_mm.images import ImagePolicy

    store = ImageStore(tmp_path / "store")
    _outputs, frame, trainer = ref_frame(qwen, store)
    rebuilder = ImageRebuilder(trainer, policy=ImagePolicy(max_bytes=64 << 20))
    with rebuilder, pytest.raises(ImageRefError, match="read only under named roots"):
        unpack_group(frame, images=rebuilder)


def test_roots_may_name_the_store_by_its_file_url(qwen, tmp_path):
    store = ImageStore(tmp_path / "store")
    outputs, frame, trainer = ref_frame(qwen, store)
    with ImageRebuilder(trainer, roots=[store.url]) as rebuilder:
        assert_bit_exact(items_of(outputs), items_of(unpack_group(frame, images=rebuilder)))
    with ImageRebuilder(trainer, roots=str(store.root)) as rebuilder:  # one root, bare
        assert_bit_exact(items_of(outputs), items_of(unpack_group(frame, images=rebuilder)))


@pytest.mark.parametrize("age", [float("nan"), float("inf"), True, "60", -1])
def test_prune_refuses_an_age_that_is_no_finite_number(tmp_path, age):
    with pytest.raises(ValueError, match="finite number"):
        ImageStore(tmp_path / "s").prune(older_than_s=age)


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("memory://", "path under its root"),
        ("memory:///", "path under its root"),
        ("memory://b//images", "segments"),
        ("memory://b/./images", "segments"),
        ("memory://b/x/../images", "segments"),
        ("memory://b/images?x=1", "query"),
    ],
)
def test_a_store_url_has_one_spelling(url, why):
    with pytest.raises(ValueError, match=why):
        ImageStore(url)
    with pytest.raises(ValueError, match=why):
        ImageRebuilder(object(), stores=[url])


def test_a_put_rewrites_a_file_cut_short_and_keeps_one_it_may_not_touch(tmp_path, monkeypatch):
    store = ImageStore(tmp_path / "store")
    _, sha = store.put(b"good bytes")
    store.path(sha).write_bytes(b"good")  # a crash elsewhere left it short
    store.put(b"good bytes")
    assert store.path(sha).read_bytes() == b"good bytes"

    def refuse(*args, **kwargs):
        raise PermissionError("another user's file")

    monkeypatch.setattr(os, "utime", refuse)
    assert store.put(b"good bytes") == (store.uri(sha), sha)  # there: used as it is


def test_a_put_racing_a_prune_keeps_its_file(tmp_path, monkeypatch):
    """prune looks at a file's age, then removes it: a put in between (its time
    refreshed, or the file written again) keeps the file the put handed out."""
    store = ImageStore(tmp_path / "store")
    for touched_before_the_rename in (True, False):
        _, sha = store.put(b"shown again")
        age(store.path(sha), 7200)
        rename = os.rename

        def racing(src, dst, rename=rename, before=touched_before_the_rename):
            if before:
                store.put(b"shown again")  # refreshes the time, then prune renames
                rename(src, dst)
            else:
                rename(src, dst)
                store.put(b"shown again")  # finds it gone: writes it again

        monkeypatch.setattr(os, "rename", racing)
        store.prune(older_than_s=3600)
        monkeypatch.setattr(os, "rename", rename)
        assert store.path(sha).read_bytes() == b"shown again", touched_before_the_rename
        assert not list(store.path(sha).parent.glob(".*.pruning"))


def test_leftovers_of_killed_writers_and_prunes_go_after_an_hour(tmp_path):
    store = ImageStore(tmp_path / "store")
    _, sha = store.put(b"x")
    folder = store.path(sha).parent
    fresh, stale = folder / f".{sha}.a.tmp", folder / f".{sha}.b.pruning"
    fresh.write_bytes(b"being written")
    stale.write_bytes(b"a prune died here")
    age(fresh, 120)
    age(stale, 7200)
    store.prune(older_than_s=60)  # a minute: the writer of a 2-minute-old temp may live
    assert fresh.exists() and not stale.exists() and store.path(sha).exists()
