"""``VisionSpec``'s image cache: a repeated source is served without decoding, equal to
what a miss computes; nothing stale, nothing across policies or processing options;
read-only arrays; one cache for a pool."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from PIL import Image

from vf_mm.errors import ImageDecodeError, ImageTooLargeError, UnsafeImageSourceError
from vf_mm.images import ImagePolicy, encode_png, image_hash, png_data_url
from vf_mm.renderers import ImageCache, RendererPool, load_renderer

FAMILY = "qwen2_5_vl"


def picture(seed: int, size: int = 56) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8))


def url_part(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


def same_inputs(a, b) -> bool:
    return (
        a.hash == b.hash
        and a.tokens == b.tokens
        and a.item.keys() == b.item.keys()
        and all(np.array_equal(a.item[k], b.item[k]) for k in a.item)
    )


@pytest.fixture
def settled(monkeypatch):
    """The clock an hour ahead: files look settled (a file changed within the last
    seconds gets no source key, see ``vf_mm.images.source_key``), so they are keyed."""
    now = time.time_ns
    monkeypatch.setattr(time, "time_ns", lambda: now() + 3600 * 10**9)


@pytest.fixture
def renderer(checkpoints):
    return load_renderer(checkpoints[FAMILY])


def test_a_repeated_data_url_is_a_hit_equal_to_the_miss_and_not_decoded(
    renderer, checkpoints, monkeypatch
):
    vision = renderer.vision
    url = png_data_url(picture(0))
    miss = vision.process(url_part(url), where="w")
    assert (vision.misses, vision.hits) == (1, 0)
    # nothing is decoded or hashed on a hit: break both and look again, with an equal
    # string that is another object (as each JSON-decoded copy of a prompt holds)
    import vf_mm.renderers._vision as module

    monkeypatch.setattr(module, "load_image", None)
    monkeypatch.setattr(module, "image_hash", None)
    hit = vision.process(url_part((url + " ")[:-1]), where="w")
    assert hit is miss
    assert (vision.misses, vision.hits) == (1, 1)
    monkeypatch.undo()
    # and a miss elsewhere computes the same inputs
    fresh = load_renderer(checkpoints[FAMILY]).vision.process(url_part(url), where="w")
    assert fresh is not miss and same_inputs(fresh, miss)
    assert miss.hash == image_hash(picture(0))  # the identity is still the pixels


def test_equal_pixels_from_two_sources_share_one_entry(renderer, tmp_path, settled):
    vision = renderer.vision
    path = tmp_path / "a.png"
    path.write_bytes(encode_png(picture(1)))
    from_url = vision.process(url_part(png_data_url(picture(1))), where="w")
    from_file = vision.process({"type": "image", "image": str(path)}, where="w")
    from_pil = vision.process({"type": "image", "image": picture(1)}, where="w")
    assert from_file is from_url and from_pil is from_url
    assert vision.misses == 1 and len(vision.cache) == 1


def test_a_changed_file_is_a_miss(renderer, tmp_path, settled):
    vision = renderer.vision
    path = tmp_path / "board.png"
    path.write_bytes(encode_png(picture(2)))
    part = {"type": "image", "image": str(path)}
    first = vision.process(part, where="w")
    assert vision.process(part, where="w") is first  # unchanged: a hit
    before = path.stat()
    time.sleep(0.05)  # past the file system's timestamp tick (what RACY_S guards in real use)
    path.write_bytes(encode_png(picture(3)))  # same path, new content
    after = path.stat()
    assert (after.st_ctime_ns, after.st_ino) != (before.st_ctime_ns, before.st_ino)
    second = vision.process(part, where="w")
    assert second.hash == image_hash(picture(3)) != first.hash
    assert vision.misses == 2


def test_a_file_written_just_now_is_read_every_time(renderer, tmp_path):
    """Without settling, a file has no source key: it is decoded and found by pixels."""
    vision = renderer.vision
    path = tmp_path / "board.png"
    path.write_bytes(encode_png(picture(2)))
    part = {"type": "image", "image": str(path)}
    first = vision.process(part, where="w")
    path.write_bytes(encode_png(picture(3)))
    assert vision.process(part, where="w").hash == image_hash(picture(3)) != first.hash


def test_a_pil_image_mutated_in_place_is_never_served_stale(renderer):
    vision = renderer.vision
    image = picture(4)
    part = {"type": "image", "image": image}
    before = vision.process(part, where="w")
    assert vision.process(part, where="w") is before  # unchanged pixels: a hit
    image.paste((255, 0, 0), (0, 0, 28, 28))  # same object, new pixels
    after = vision.process(part, where="w")
    assert after.hash == image_hash(image) != before.hash
    assert not np.array_equal(after.item["pixel_values"], before.item["pixel_values"])
    array = np.asarray(picture(5)).copy()
    first = vision.process({"type": "image", "image": array}, where="w")
    array[:8] = 0
    assert vision.process({"type": "image", "image": array}, where="w").hash != first.hash


def test_cached_arrays_are_read_only(renderer):
    processed = renderer.vision.process(url_part(png_data_url(picture(6))), where="w")
    for array in processed.item.values():
        assert not array.flags.writeable
        with pytest.raises(ValueError, match="read-only"):
            array[...] = 0


def test_different_processing_options_never_share_entries(checkpoints):
    cache = ImageCache()
    plain = load_renderer(checkpoints[FAMILY], image_cache=cache).vision
    raw = load_renderer(
        checkpoints[FAMILY], image_cache=cache, processor_kwargs={"do_normalize": False}
    ).vision
    assert plain.namespace != raw.namespace
    part = url_part(png_data_url(picture(7)))
    a, b = plain.process(part, where="w"), raw.process(part, where="w")
    assert a.hash == b.hash  # the same image ...
    assert not np.array_equal(a.item["pixel_values"], b.item["pixel_values"])  # ... not its inputs
    assert (plain.misses, raw.misses, len(cache)) == (1, 1, 2)
    # renderers that process alike agree on the namespace, and so share entries
    twin = load_renderer(checkpoints[FAMILY], image_cache=cache).vision
    assert twin.namespace == plain.namespace
    assert twin.process(part, where="w") is a and twin.misses == 0


def test_a_stricter_policy_is_never_served_from_a_looser_ones_entries(
    checkpoints, tmp_path, settled
):
    cache = ImageCache()
    loose = load_renderer(checkpoints[FAMILY], image_cache=cache).vision
    path = tmp_path / "secret.png"
    path.write_bytes(encode_png(picture(8)))
    url = png_data_url(picture(9, size=112))
    loose.process({"type": "image", "image": str(path)}, where="w")
    loose.process(url_part(url), where="w")
    elsewhere = tmp_path / "data"
    elsewhere.mkdir()
    for policy, source, error in [
        (ImagePolicy.dataset(roots=[elsewhere]), str(path), UnsafeImageSourceError),
        (ImagePolicy.dataset(), str(path), UnsafeImageSourceError),
        (ImagePolicy(max_bytes=1000), url, ImageTooLargeError),
        (ImagePolicy(max_pixels=100), url, ImageTooLargeError),
        (ImagePolicy(formats=("JPEG",)), url, ImageDecodeError),
    ]:
        strict = load_renderer(checkpoints[FAMILY], image_cache=cache, image_policy=policy)
        with pytest.raises(error) as raised:
            strict.vision.process({"type": "image", "image": source}, where="message 0, part 0")
        assert raised.value.where == "message 0, part 0"
        assert strict.vision.hits == 0


def test_a_corrupt_data_url_raises_naming_its_place_and_is_never_cached(renderer):
    good = png_data_url(picture(10))
    renderer.render([{"role": "user", "content": [url_part(good)]}])
    for bad, says in [
        (good[:-7] + "*" + good[-6:], "not valid base64"),
        (good[:-2], "not valid base64"),
        (good[:40] + "é" + good[41:], "non-ASCII"),
        ("data:image/png;base64," + good[200:], "not valid base64|corrupt|not an image"),
    ]:
        messages = [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "yes"},
            {"role": "user", "content": [{"type": "text", "text": "see"}, url_part(bad)]},
        ]
        for _ in range(2):  # the second time too: a failure is not cached
            with pytest.raises(ImageDecodeError, match=says) as raised:
                renderer.render(messages)
            assert raised.value.where == "message 2, part 1"
            assert "message 2, part 1" in str(raised.value)


def test_a_pool_shares_one_cache_and_processes_a_group_image_once(checkpoints):
    pool = RendererPool(lambda: load_renderer(checkpoints[FAMILY]), size=3)
    caches = {id(r.vision.cache) for r in pool.renderers}
    assert len(caches) == 1
    url = png_data_url(picture(11))
    prompt = [{"role": "user", "content": [url_part(url), {"type": "text", "text": "go"}]}]
    gate = threading.Barrier(8)
    results = []

    def rollout():
        gate.wait()
        # each rollout holds its own copy of the prompt's string, as after JSON decoding
        copy = [{"role": "user", "content": [url_part((url + " ")[:-1]), prompt[0]["content"][1]]}]
        results.append(pool.render(copy))

    threads = [threading.Thread(target=rollout) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(r.vision.misses for r in pool.renderers) == 1
    assert len({r.token_ids == results[0].token_ids for r in results}) == 1
    items = [r.multi_modal_data.mm_items["image"][0] for r in results]
    assert all(item is items[0] for item in items)


def test_a_renderer_built_with_a_cache_keeps_it_in_a_pool(checkpoints):
    shared = ImageCache(max_bytes=1 << 20)
    pool = RendererPool(lambda: load_renderer(checkpoints[FAMILY], image_cache=shared), size=2)
    assert all(r.vision.cache is shared for r in pool.renderers)
    with pytest.raises(TypeError, match="ImageCache"):
        load_renderer(checkpoints[FAMILY], image_cache={})


def test_the_cache_is_bounded_in_bytes(checkpoints):
    probe = load_renderer(checkpoints[FAMILY]).vision
    processed = probe.process(url_part(png_data_url(picture(12))), where="w")
    per_image = probe.cache.nbytes  # its arrays, tokens and text, its data URL key
    assert per_image > processed.nbytes > processed.item["pixel_values"].nbytes
    budget = 2 * per_image + per_image // 2  # room for two images, not three
    vision = load_renderer(checkpoints[FAMILY], cache_bytes=budget).vision
    parts = [url_part(png_data_url(picture(20 + i))) for i in range(3)]
    for part in parts:
        vision.process(part, where="w")
    assert len(vision.cache) == 2 and vision.cache.nbytes <= budget
    vision.process(parts[0], where="w")  # evicted (least recently used): processed again
    assert vision.misses == 4
    vision.process(parts[2], where="w")  # still held
    assert vision.misses == 4


def test_videos_share_the_cache_with_images(renderer):
    """``process_video`` keys its clips by ``video_mm_hash`` in the same cache."""
    frames = np.stack([np.asarray(picture(30 + i)) for i in range(4)])
    part = {"type": "video", "video": frames, "frame_rate": 2.0}
    first = renderer.vision.process_video(part, where="w")
    assert renderer.vision.process_video(part, where="w") is first
    assert first.modality == "video" and (renderer.vision.namespace, first.hash) in (
        renderer.vision.cache
    )
