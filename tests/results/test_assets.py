"""AssetStore: content-addressed image files and JSON-ready copies of messages."""

from __future__ import annotations

import base64
import copy
import io
import math
import os

import numpy as np
import pytest
from PIL import Image

from vf_mm.errors import ImageDecodeError, ResultsError
from vf_mm.images import image_hash
from vf_mm.results import AssetStore, to_json_value


def gradient(width: int = 20, height: int = 10, shift: int = 0) -> Image.Image:
    y, x = np.mgrid[0:height, 0:width]
    rgb = np.stack([x * 12 + shift, y * 25, (x + y) % 256], axis=-1).astype(np.uint8)
    return Image.fromarray(rgb, "RGB")


def png(image: Image.Image, fmt: str = "PNG") -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt)
    return buffer.getvalue()


def data_url(image: Image.Image) -> str:
    return "data:image/png;base64," + base64.b64encode(png(image)).decode()


def user(*parts: dict) -> dict:
    return {"role": "user", "content": list(parts)}


def asset_url(image: Image.Image) -> str:
    return f"assets/{image_hash(image)}.png"


def visible_files(store: AssetStore) -> list[str]:
    return sorted(os.listdir(store.dir))


@pytest.fixture
def store(tmp_path):
    return AssetStore(tmp_path)


def test_pil_image_becomes_an_asset_reference(store, tmp_path):
    image = gradient()
    out = store.to_jsonable([user({"type": "image", "image": image})])
    assert out == [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": asset_url(image)}}]}
    ]
    path = tmp_path / asset_url(image)
    with Image.open(path) as stored:
        assert stored.format == "PNG"
        assert stored.convert("RGB").tobytes() == image.tobytes()  # lossless


def test_bytes_and_data_url_and_pil_of_the_same_pixels_are_one_asset(store):
    image = gradient()
    out = store.to_jsonable(
        [
            user(
                {"type": "image", "image": png(image)},
                {"type": "image", "image": png(image, "BMP")},
                {"type": "image_url", "image_url": {"url": data_url(image)}},
            ),
            {"role": "tool", "tool_call_id": "t", "content": [{"type": "image", "image": image}]},
        ]
    )
    urls = [part["image_url"]["url"] for m in out for part in m["content"]]
    assert urls == [asset_url(image)] * 4
    assert visible_files(store) == [f"{image_hash(image)}.png"]
    assert store.written == 1


def _chunked(image: Image.Image, kind: bytes, data: bytes) -> bytes:
    """``image`` as a PNG with one more chunk before its pixels."""
    import struct
    import zlib

    raw = png(image)
    at = 8 + 25  # signature, IHDR
    chunk = struct.pack(">I", len(data)) + kind + data
    chunk += struct.pack(">I", zlib.crc32(kind + data))
    return raw[:at] + chunk + raw[at:]


def _stored(store: AssetStore, source) -> tuple[bytes, Image.Image]:
    """The asset file's bytes, and what a plain decoder (no conversion) makes of them."""
    url = store.add(source)
    data = (store.root / url).read_bytes()
    with Image.open(io.BytesIO(data)) as shown:
        shown.load()
        return data, shown.copy()


def test_a_plain_png_source_is_stored_as_its_own_bytes(store, tmp_path):
    """The parent's asset cost: a PNG that shows exactly the image the model saw (8-bit
    RGB, nothing to convert) is written as it came, not decoded into a new PNG."""
    from vf_mm.images import encode_png, load_image

    image = gradient(shift=40)
    source = encode_png(image, compress_level=1)  # as png_data_url writes it
    assert source != encode_png(image, compress_level=6)  # what re-encoding would write
    path = tmp_path / "plain.png"
    path.write_bytes(source)
    url = "data:image/png;base64," + base64.b64encode(source).decode()
    for given in (url, source, str(path)):
        data, shown = _stored(AssetStore(tmp_path / "run"), given)
        assert data == source
        assert shown.mode == "RGB" and shown.tobytes() == load_image(given).tobytes()


@pytest.mark.parametrize(
    "make",
    [
        lambda im: png(im.convert("RGBA")),  # alpha: composited onto white
        lambda im: png(im.convert("P")),  # palette
        lambda im: png(im.convert("L")),  # grey
        lambda im: png(im, "JPEG"),  # not a PNG
        lambda im: _chunked(im, b"gAMA", (45455).to_bytes(4, "big")),  # a viewer applies it
        lambda im: _chunked(im, b"tRNS", bytes(6)),  # black is transparent: composited
    ],
    ids=["rgba", "palette", "grey", "jpeg", "gama", "trns"],
)
def test_any_other_source_is_encoded_again_and_shows_what_the_model_saw(store, make):
    from vf_mm.images import load_image

    source = make(gradient(shift=60))
    data, shown = _stored(store, source)
    assert data != source
    assert shown.mode == "RGB" and shown.tobytes() == load_image(source).tobytes()
    assert not shown.info  # nothing a viewer would apply


def test_same_image_in_two_calls_and_two_stores_is_written_once(tmp_path):
    image = gradient()
    first = AssetStore(tmp_path)
    first.to_jsonable([user({"type": "image", "image": image})])
    path = tmp_path / asset_url(image)
    before = path.stat()
    first.to_jsonable([user({"type": "image", "image": image.copy()})])
    second = AssetStore(tmp_path)
    second.to_jsonable([user({"type": "image", "image": png(image)})])
    assert (first.written, second.written) == (1, 0)
    after = path.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def test_a_pre_existing_asset_is_never_rewritten(store):
    image = gradient()
    (store.dir / f"{image_hash(image)}.png").write_bytes(b"sentinel, not rewritten")
    out = store.to_jsonable([user({"type": "image", "image": image})])
    assert out[0]["content"][0]["image_url"]["url"] == asset_url(image)
    assert (store.dir / f"{image_hash(image)}.png").read_bytes() == b"sentinel, not rewritten"
    assert store.written == 0


def test_assets_are_written_atomically_no_temp_files_left(store, monkeypatch):
    images = [gradient(shift=s) for s in range(5)]
    store.to_jsonable([user(*({"type": "image", "image": i} for i in images))])
    assert visible_files(store) == sorted(f"{image_hash(i)}.png" for i in images)

    # a failure while encoding leaves neither a temp file nor a partial asset
    def broken_save(self, fp, *args, **kwargs):
        fp.write(b"\x89PNG half")
        raise OSError("disk full")

    monkeypatch.setattr(Image.Image, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        store.add(gradient(shift=99))
    assert visible_files(store) == sorted(f"{image_hash(i)}.png" for i in images)


def test_replace_is_the_only_way_an_asset_appears(store, monkeypatch):
    """The final name is only ever created by os.replace of a complete, fsynced file."""
    seen = []
    real_replace = os.replace

    def spy(src, dst):
        with open(src, "rb") as f:
            seen.append((os.path.basename(src), os.path.basename(dst), f.read()))
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    image = gradient()
    store.add(image)
    [(src, dst, data)] = seen
    assert dst == f"{image_hash(image)}.png"
    assert src.startswith(".") and src != dst  # a temporary name in the same folder
    assert data == (store.dir / dst).read_bytes()
    with Image.open(io.BytesIO(data)) as decoded:
        decoded.load()


def test_remove_temp_files_deletes_only_ours(store):
    (store.dir / ".abc.png.tmp-xyz").write_bytes(b"partial")
    (store.dir / "keep.txt").write_bytes(b"x")
    assert store.remove_temp_files() == 1
    assert visible_files(store) == ["keep.txt"]


def test_http_urls_are_kept_as_given_and_never_fetched(store):
    # the default policy has no network: a fetch would raise UnsafeImageSourceError
    url = "https://example.com/cat.png?sig=abc"
    out = store.to_jsonable(
        [
            user(
                {"type": "image_url", "image_url": {"url": url, "detail": "high"}},
                {"type": "image_url", "image_url": "http://example.com/dog.png"},
                {"type": "image", "image": url},
                {"type": "image", "url": url},
            )
        ]
    )
    assert out[0]["content"] == [
        {"type": "image_url", "image_url": {"url": url, "detail": "high"}},
        {"type": "image_url", "image_url": {"url": "http://example.com/dog.png"}},
        {"type": "image_url", "image_url": {"url": url}},
        {"type": "image_url", "image_url": {"url": url}},
    ]
    assert visible_files(store) == []


def test_detail_and_extra_part_keys_are_kept(store):
    image = gradient()
    out = store.to_jsonable(
        [
            user(
                {"type": "image_url", "image_url": {"url": data_url(image), "detail": "low"}},
                {"type": "image", "image": image, "max_pixels": 1024},
            )
        ]
    )
    assert out[0]["content"] == [
        {"type": "image_url", "image_url": {"url": asset_url(image), "detail": "low"}},
        {"type": "image_url", "image_url": {"url": asset_url(image)}, "max_pixels": 1024},
    ]


def test_local_path_images_are_stored(store, tmp_path):
    image = gradient()
    path = tmp_path / "pic.png"
    path.write_bytes(png(image))
    out = store.to_jsonable([user({"type": "image", "image": path})])
    assert out[0]["content"][0]["image_url"]["url"] == asset_url(image)


def test_tool_calls_reasoning_and_other_fields_are_kept(store):
    messages = [
        {"role": "system", "content": "be brief", "name": "sys"},
        user({"type": "text", "text": "zoom in ✓"}),
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": "think",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "zoom", "arguments": "{"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "name": "zoom", "content": "done"},
    ]
    assert store.to_jsonable(messages) == messages


def test_input_is_never_mutated_and_output_shares_nothing(store):
    image = gradient()
    tool_calls = [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    messages = [
        user({"type": "image", "image": image}, {"type": "text", "text": "hi"}),
        {
            "role": "assistant",
            "content": [{"type": "image_url", "image_url": {"url": data_url(image)}}],
            "tool_calls": tool_calls,
        },
    ]
    snapshot = copy.deepcopy(messages)
    pixels = image.tobytes()
    out = store.to_jsonable(messages)
    assert messages == snapshot
    assert messages[0]["content"][0]["image"] is image and image.tobytes() == pixels
    out[1]["tool_calls"][0]["function"]["name"] = "changed"
    out[0]["content"][1]["text"] = "changed"
    assert messages == snapshot


def test_output_converts_again_to_itself(store):
    image = gradient()
    once = store.to_jsonable([user({"type": "image", "image": image})])
    assert store.to_jsonable(once) == once


@pytest.mark.parametrize(
    ("message", "field", "kind"),
    [
        ({"role": "user", "content": "x", "audio": b"\x00\x01"}, "'audio'", "bytes"),
        (
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "c", "function": {"arguments": np.zeros(3)}}],
            },
            "'tool_calls[0].function.arguments'",
            "tensor or array",
        ),
        (user({"type": "text", "text": "x", "score": math.nan}), "'score'", "NaN"),
        ({"role": "user", "content": "x", "meta": {1: "a"}}, "'meta'", "key"),
        ({"role": "user", "content": "x", "tags": {"a", "b"}}, "'tags'", "set"),
        ({"role": "user", "content": b"raw"}, "'content'", "str, a list of parts or None"),
    ],
)
def test_non_json_values_are_refused_naming_message_and_field(store, message, field, kind):
    messages = [{"role": "system", "content": "s"}, message]
    with pytest.raises(ResultsError) as caught:
        store.to_jsonable(messages)
    text = str(caught.value)
    assert "message 1" in text and field in text and kind in text


def test_a_torch_tensor_is_refused(store):
    import torch

    with pytest.raises(ResultsError, match=r"message 0, field 'extra'.*tensor"):
        store.to_jsonable([{"role": "user", "content": "x", "extra": torch.ones(2)}])


def test_an_undecodable_image_names_its_place(store):
    with pytest.raises(ImageDecodeError) as caught:
        store.to_jsonable([user({"type": "text", "text": "a"}, {"type": "image", "image": b"no"})])
    assert caught.value.where == "message 0, part 1"
    assert visible_files(store) == []


def test_to_json_value_converts_numpy_scalars_and_tuples():
    value = {"a": (1, np.int64(2)), "b": np.float32(0.5), "c": None, "d": True}
    assert to_json_value(value, "x") == {"a": [1, 2], "b": 0.5, "c": None, "d": True}
    with pytest.raises(ResultsError, match=r"x, field 'a\[1\]'.*inf"):
        to_json_value({"a": [0, math.inf]}, "x")


def test_what_the_store_remembers_is_bounded_and_a_forgotten_asset_is_found_on_disk(tmp_path):
    small = AssetStore(tmp_path, known_bytes=3 * 160)  # one remembered hash per kind
    urls = [small.add(gradient(shift=i)) for i in range(3)]
    assert len(small._known) == 1  # the run's length does not grow it
    assert small.add(gradient(shift=0)) == urls[0] and small.written == 3  # never written twice
    assert urls[0].removeprefix("assets/").removesuffix(".png") in small
