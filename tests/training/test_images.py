"""Image modes on the trainer wire: ``encoded`` and ``ref`` groups rebuilt on the trainer
side bit for bit, on every vision family, from every kind of source; and every way a
rebuild can go wrong is a typed error for that one group, never other pixels.

The sampler side is the real renderer (tiny checkpoints built offline) behind a scripted
backend; each group goes through the real wire (``packb`` / ``unpackb``).
"""

from __future__ import annotations

import asyncio
import base64
import io
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vf_mm import RendererClient
from vf_mm.errors import (
    GroupFrameError,
    ImageRebuildError,
    ImageRefError,
    ProcessingMismatchError,
)
from vf_mm.images import image_hash, load_image
from vf_mm.models import VISION_FAMILIES, family_info
from vf_mm.renderers import load_renderer
from vf_mm.testing import ScriptedBackend, build_tiny_vlm
from vf_mm.training import (
    GROUP_FORMAT,
    ImageProcessing,
    ImageRebuilder,
    ImageStore,
    inputs_hash,
    pack_group,
    read_groups,
    unpack_group,
)
from vf_mm.training._internal import GROUP_FORMAT_BY_SOURCE
from vf_mm.types import RolloutOutput
from vf_mm.wire import packb, unpackb, write_stream

# -- images of every kind the decoder converts -----------------------------------------


def noise(seed: int, size=(40, 30), mode: str = "RGB") -> Image.Image:
    rng = np.random.default_rng(seed)
    bands = {"RGB": 3, "RGBA": 4, "LA": 2, "L": 1}[mode]
    shape = (size[1], size[0], bands) if bands > 1 else (size[1], size[0])
    return Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), mode)


def encoded(image: Image.Image, fmt: str = "PNG", **save) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **save)
    return buffer.getvalue()


def palette_with_transparency(seed: int = 5) -> Image.Image:
    image = noise(seed).convert("P", palette=Image.Palette.ADAPTIVE, colors=16)
    image.info["transparency"] = 3
    return image


def rotated_jpeg() -> bytes:
    """A JPEG whose EXIF says "rotate 90° clockwise to view": decoded upright."""
    exif = Image.Exif()
    exif[0x0112] = 6
    return encoded(noise(6, (48, 32)), "JPEG", exif=exif, quality=90)


def sources(tmp_path: Path) -> list[object]:
    """One image of each kind: PIL images in modes L, RGBA, P, LA (sent as PNGs of their
    decoded pixels), encoded bytes in those modes (sent as they are), an EXIF-rotated
    JPEG, a data: URL and a file path."""
    file = tmp_path / "on_disk.png"
    file.write_bytes(encoded(noise(7)))
    data_url = "data:image/png;base64," + base64.b64encode(encoded(noise(8, mode="LA"))).decode()
    return [
        noise(1, mode="L"),
        noise(2, mode="RGBA"),
        palette_with_transparency(),
        noise(3, mode="LA"),
        encoded(noise(4, mode="L")),
        encoded(noise(9, mode="RGBA")),
        encoded(palette_with_transparency(16)),
        encoded(noise(10, mode="LA")),
        rotated_jpeg(),
        data_url,
        str(file),
    ]


def image_part(source: object) -> dict:
    if isinstance(source, str) and source.startswith("data:"):
        return {"type": "image_url", "image_url": {"url": source}}
    return {"type": "image", "image": source}


def sample(renderer, images: list[object], *, example_id: int = 0, n: int = 1) -> list:
    """``n`` one-turn rollouts of a prompt that shows ``images``, rendered for real."""
    client = RendererClient(ScriptedBackend(renderer, ["ok"]), renderer)
    prompt = [
        {"role": "user", "content": [*map(image_part, images), {"type": "text", "text": "?"}]}
    ]

    async def one():
        turn = await client.generate(prompt)
        return RolloutOutput(
            example_id=example_id, prompt=prompt, completion=[turn.message],
            trajectory=[turn.step(prompt)], reward=1.0,
        )  # fmt: skip

    return [asyncio.run(one()) for _ in range(n)]


def items_of(rollouts) -> list[dict]:
    return [
        item
        for r in rollouts
        for step in r.trajectory
        for item in step.tokens.multi_modal_data.mm_items["image"]
    ]


def assert_bit_exact(sent: list[dict], got: list[dict]) -> None:
    assert len(sent) == len(got)
    for a, b in zip(sent, got, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            x, y = np.asarray(a[key]), np.asarray(b[key])
            assert x.dtype == y.dtype and x.shape == y.shape, key
            assert x.tobytes() == y.tobytes(), key


def wire(frame: dict) -> dict:
    return unpackb(packb(frame))


# -- every family, every kind of source ---------------------------------------------


def backend(family: str) -> str:
    """PIL, or for the families whose image processor transformers has only for
    torchvision (LFM2-VL, Kimi-K2.5) ``"auto"``: vf_mm's torch-only port where torchvision
    does not import."""
    return "pil" if family_info(family).pil_backend else "auto"


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    return {f: build_tiny_vlm(root / f, f) for f in VISION_FAMILIES}


@pytest.fixture(scope="module")
def qwen(checkpoints):
    path = checkpoints["qwen2_5_vl"]
    return path, load_renderer(path, image_backend="pil")


@pytest.mark.parametrize("family", VISION_FAMILIES)
@pytest.mark.parametrize("mode", ["encoded", "ref"])
def test_every_family_rebuilds_every_source_bit_for_bit(family, mode, checkpoints, tmp_path):
    path = checkpoints[family]
    renderer = load_renderer(path, image_backend=backend(family))
    outputs = sample(renderer, sources(tmp_path), n=2)
    store = ImageStore(tmp_path / "store")
    frame = wire(pack_group(outputs, images=mode, processing=ImageProcessing.from_vision(renderer.vision), store=store))  # fmt: skip
    assert frame["format"] == GROUP_FORMAT_BY_SOURCE and frame["image_mode"] == mode
    assert frame["images"] == {}  # every image travels as bytes, none as tensors
    assert len(frame["sources"]) == len(sources(tmp_path))
    # the trainer loads its own processing, as the sampler loaded its renderer
    trainer = ImageProcessing.from_checkpoint(path, image_backend=backend(family))
    with ImageRebuilder(trainer, roots=[store.root]) as rebuilder:
        got = unpack_group(frame, images=rebuilder)
        assert rebuilder.rebuilt == len(frame["sources"])
    assert_bit_exact(items_of(outputs), items_of(got))
    # the decoded EXIF-rotated JPEG is upright: 32 x 48
    assert load_image(rotated_jpeg()).size == (32, 48)


def test_bytes_as_received_pixels_as_lossless_png(qwen, tmp_path):
    _path, renderer = qwen
    jpeg, picture = rotated_jpeg(), noise(11)
    (output,) = sample(renderer, [jpeg, picture])
    frame = pack_group([output], images="encoded", processing=ImageProcessing.from_vision(renderer.vision))  # fmt: skip
    by_hash = frame["sources"]
    assert by_hash[image_hash(load_image(jpeg))]["data"] == jpeg  # EXIF and all, as received
    png = by_hash[image_hash(load_image(picture))]
    assert png["format"] == "PNG" and image_hash(load_image(png["data"])) == image_hash(picture)
    # at most 1.1x the distinct encoded bytes
    distinct = sum(e["size"] for e in by_hash.values())
    assert len(packb(frame)) <= 1.1 * distinct + 4096


def test_tensors_stays_the_default_and_old_frames_decode(qwen):
    _path, renderer = qwen
    outputs = sample(renderer, [noise(12)], n=2)
    frame = pack_group(outputs)
    assert frame["format"] == GROUP_FORMAT and "sources" not in frame
    assert packb(frame) == packb(pack_group(outputs, images="tensors"))
    assert_bit_exact(items_of(outputs), items_of(unpack_group(wire(frame))))


def test_an_encoded_frame_without_a_rebuilder_is_refused(qwen):
    _path, renderer = qwen
    outputs = sample(renderer, [noise(13)])
    frame = wire(pack_group(outputs, images="encoded", processing=ImageProcessing.from_vision(renderer.vision)))  # fmt: skip
    with pytest.raises(GroupFrameError, match="pass unpack_group"):
        unpack_group(frame)


def test_modes_need_their_arguments(qwen):
    _path, renderer = qwen
    outputs = sample(renderer, [noise(14)])
    with pytest.raises(ValueError, match="processing="):
        pack_group(outputs, images="encoded")
    with pytest.raises(ValueError, match="store="):
        pack_group(outputs, images="ref", processing=ImageProcessing.from_vision(renderer.vision))
    with pytest.raises(ValueError, match="images must be one of"):
        pack_group(outputs, images="pixels")


def test_a_data_url_becomes_an_image_ref_once_its_bytes_travel(qwen):
    _path, renderer = qwen
    url = "data:image/png;base64," + base64.b64encode(encoded(noise(15))).decode()
    outputs = sample(renderer, [url], n=3)
    frame = pack_group(outputs, images="encoded", processing=ImageProcessing.from_vision(renderer.vision))  # fmt: skip
    (h,) = frame["sources"]
    for rollout in frame["rollouts"]:
        assert rollout["prompt"][0]["content"][0] == {"type": "image_ref", "hash": h}


# -- the rebuilder: cache, pool, typed errors -----------------------------------------


@pytest.fixture
def group(qwen):
    """An encoded group of two images shown by two rollouts, and its processing."""
    path, renderer = qwen
    outputs = sample(renderer, [noise(20), noise(21)], n=2)
    processing = ImageProcessing.from_vision(renderer.vision)
    return outputs, wire(pack_group(outputs, images="encoded", processing=processing)), path


def test_rebuilds_are_cached_by_hash_and_run_off_the_callers_thread(group):
    outputs, frame, path = group
    with ImageRebuilder(ImageProcessing.from_checkpoint(path, image_backend="pil")) as rebuilder:
        first = rebuilder.submit(frame).result()
        second = unpack_group(frame, images=rebuilder)
        assert (rebuilder.rebuilt, rebuilder.cache_hits) == (2, 2)
    assert_bit_exact(items_of(outputs), items_of(first))
    a, b = items_of(first)[0], items_of(second)[0]
    assert a is b and not a["pixel_values"].flags.writeable


def test_a_config_that_differs_is_named_before_any_image_is_read(group):
    _outputs, frame, path = group
    frame["processing"]["config"]["image_processor"]["max_pixels"] = 1234
    with (
        ImageRebuilder(ImageProcessing.from_checkpoint(path, image_backend="pil")) as rebuilder,
        pytest.raises(ProcessingMismatchError, match="config") as caught,
    ):
        unpack_group(frame, images=rebuilder)
    assert rebuilder.rebuilt == 0
    assert "config" in caught.value.differs and "max_pixels" in str(caught.value)


def test_a_backend_that_differs_is_named(group):
    _outputs, frame, path = group
    frame["processing"]["backend"] = "torchvision"
    with (
        ImageRebuilder(ImageProcessing.from_checkpoint(path, image_backend="pil")) as rebuilder,
        pytest.raises(ProcessingMismatchError, match="backend") as caught,
    ):
        unpack_group(frame, images=rebuilder)
    assert caught.value.differs == ("backend",)


def test_the_trainers_own_config_differing_is_named(group, checkpoints):
    """The trainer loaded another checkpoint's processing (Qwen2-VL's, not Qwen2.5-VL's)."""
    _outputs, frame, _path = group
    other = ImageProcessing.from_checkpoint(checkpoints["gemma3"], image_backend="pil")
    with ImageRebuilder(other) as rebuilder, pytest.raises(ProcessingMismatchError) as caught:
        unpack_group(frame, images=rebuilder)
    assert "config" in caught.value.differs


def test_versions_that_differ_pass_when_every_hash_matches_and_are_named_when_not(group):
    outputs, frame, path = group
    frame["processing"]["versions"]["transformers"] = "0.0.1"
    trainer = ImageProcessing.from_checkpoint(path, image_backend="pil")
    with ImageRebuilder(trainer) as rebuilder:
        assert_bit_exact(items_of(outputs), items_of(unpack_group(frame, images=rebuilder)))
        assert "transformers" in rebuilder.version_differences
    h = next(iter(frame["sources"]))
    frame["sources"][h]["inputs"] = "0" * 32  # the sampler's tensors were other ones
    with ImageRebuilder(trainer) as rebuilder, pytest.raises(ProcessingMismatchError) as caught:
        unpack_group(frame, images=rebuilder)
    assert caught.value.differs == ("versions",) and caught.value.image_hash == h
    assert "transformers" in str(caught.value)


def test_inputs_that_differ_with_nothing_else_differing_say_so(group):
    _outputs, frame, path = group
    h = next(iter(frame["sources"]))
    frame["sources"][h]["inputs"] = "0" * 32
    trainer = ImageProcessing.from_checkpoint(path, image_backend="pil")
    with ImageRebuilder(trainer) as rebuilder, pytest.raises(ProcessingMismatchError) as caught:
        unpack_group(frame, images=rebuilder)
    assert caught.value.differs == () and "all match" in str(caught.value)


def test_a_corrupt_encoded_image_fails_its_group_only(group, tmp_path):
    outputs, frame, path = group
    bad = wire(frame)
    h = next(iter(bad["sources"]))
    bad["sources"][h]["data"] = bytes(bad["sources"][h]["data"])[:200]  # truncated
    stream = tmp_path / "groups.vfs"
    write_stream(stream, [bad, frame])
    trainer = ImageProcessing.from_checkpoint(path, image_backend="pil")
    results = []
    with ImageRebuilder(trainer) as rebuilder:
        for got in read_groups(stream):
            try:
                results.append(unpack_group(got, images=rebuilder))
            except ImageRebuildError as exc:
                results.append(exc)
    assert isinstance(results[0], ImageRefError) and results[0].image_hash == h
    assert_bit_exact(items_of(outputs), items_of(results[1]))


def test_other_pixels_under_an_images_hash_are_refused(group):
    _outputs, frame, path = group
    first, second = list(frame["sources"])
    frame["sources"][first]["data"] = frame["sources"][second]["data"]  # decodes fine
    trainer = ImageProcessing.from_checkpoint(path, image_backend="pil")
    with ImageRebuilder(trainer) as rebuilder, pytest.raises(ImageRefError, match="other pixels"):
        unpack_group(frame, images=rebuilder)


# -- ref mode: the store, the guard, the policy --------------------------------------


@pytest.fixture
def ref_group(qwen, tmp_path):
    path, renderer = qwen
    store = ImageStore(tmp_path / "store")
    outputs = [
        *sample(renderer, [noise(30)], n=1),  # rollout 0 shows image A
        *sample(renderer, [noise(31)], n=1),  # rollout 1 shows image B
    ]
    processing = ImageProcessing.from_vision(renderer.vision)
    frame = wire(pack_group(outputs, images="ref", processing=processing, store=store))
    trainer = ImageProcessing.from_checkpoint(path, image_backend="pil")
    return outputs, frame, store, trainer


def test_the_store_holds_each_image_once_named_by_its_sha256(ref_group):
    _outputs, frame, store, _trainer = ref_group
    for entry in frame["sources"].values():
        assert entry["uri"] == store.uri(entry["sha256"]) and "data" not in entry
        assert Path(store.path(entry["sha256"])).stat().st_size == entry["size"]
    assert len(packb(frame)) < 4096  # no pixels, no bytes: references only


def uri_path(frame: dict, index: int) -> Path:
    entry = list(frame["sources"].values())[index]
    return Path(entry["uri"].removeprefix("file://"))


def test_a_missing_reference_fails_the_group(ref_group):
    _outputs, frame, store, trainer = ref_group
    os.remove(uri_path(frame, 0))
    with (
        ImageRebuilder(trainer, roots=[store.root]) as rebuilder,
        pytest.raises(ImageRefError, match="no such file"),
    ):
        unpack_group(frame, images=rebuilder)


def test_a_missing_reference_skips_only_the_rollouts_that_show_it(ref_group):
    outputs, frame, store, trainer = ref_group
    os.remove(uri_path(frame, 0))
    with ImageRebuilder(trainer, roots=[store.root], on_missing="skip") as rebuilder:
        lost, kept = unpack_group(frame, images=rebuilder)
        (failure,) = rebuilder.failures
    assert lost.trajectory == [] and lost.error.type == "ImageRefError"
    assert kept.error is None and len(kept.trajectory) == 1
    assert_bit_exact(items_of(outputs[1:]), items_of([kept]))
    assert failure.image_hash == next(iter(frame["sources"]))


def test_bytes_that_do_not_match_their_sha256_are_refused(ref_group):
    _outputs, frame, store, trainer = ref_group
    uri_path(frame, 0).write_bytes(encoded(noise(99)))  # another valid image, same name
    with (
        ImageRebuilder(trainer, roots=[store.root]) as rebuilder,
        pytest.raises(ImageRefError, match="sha256"),
    ):
        unpack_group(frame, images=rebuilder)


def test_a_reference_outside_the_roots_is_never_read(ref_group, tmp_path):
    _outputs, frame, _store, trainer = ref_group
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    with (
        ImageRebuilder(trainer, roots=[elsewhere]) as rebuilder,
        pytest.raises(ImageRefError, match="outside"),
    ):
        unpack_group(frame, images=rebuilder)
    with (
        ImageRebuilder(trainer) as rebuilder,
        pytest.raises(ImageRefError, match="roots="),
    ):  # no roots named: no local file at all
        unpack_group(frame, images=rebuilder)


def test_only_file_references_are_read(ref_group):
    _outputs, frame, store, trainer = ref_group
    next(iter(frame["sources"].values()))["uri"] = "http://169.254.169.254/latest"
    with (
        ImageRebuilder(trainer, roots=[store.root]) as rebuilder,
        pytest.raises(ImageRefError, match="only file://"),
    ):
        unpack_group(frame, images=rebuilder)


def test_inputs_hash_is_bit_exact():
    a = {"pixel_values": np.zeros((2, 3), np.float32), "grid": np.array([[1, 2, 2]])}
    assert inputs_hash(a) == inputs_hash({k: v.copy() for k, v in reversed(a.items())})
    assert inputs_hash(a) != inputs_hash({**a, "pixel_values": np.zeros((3, 2), np.float32)})
    assert inputs_hash(a) != inputs_hash({**a, "pixel_values": np.zeros((2, 3), np.float64)})
    b = {**a, "pixel_values": a["pixel_values"].copy()}
    b["pixel_values"][0, 0] = -0.0  # equal as floats, other bits
    assert inputs_hash(a) != inputs_hash(b)
