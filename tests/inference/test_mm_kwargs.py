"""kwargs_data entries: vLLM's msgpack encoding of one MultiModalKwargsItem, in base64.

The format is checked against vLLM's own decoder in tests/vllm/test_mm_kwargs_vllm.py;
here: round trips, the exact layout, and refusals of malformed input.
"""

from __future__ import annotations

import base64

import msgpack
import numpy as np
import pytest
import torch

from vf_mm.errors import DecodeError, EncodeError
from vf_mm.inference._internal import (
    decode_kwargs_item,
    encode_kwargs_item,
)


def _item(n: int = 256, dim: int = 1176, dtype=np.float32, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    pv = rng.standard_normal((n, dim)).astype(dtype)
    side = round(n**0.5)
    return {"pixel_values": pv, "image_grid_thw": np.array([[1, side, side]], dtype=np.int64)}


def _bits(a) -> bytes:
    if isinstance(a, torch.Tensor):
        return a.contiguous().view(torch.uint8).numpy().tobytes()
    return np.ascontiguousarray(a).tobytes()


@pytest.mark.parametrize("n", [4, 64, 256])
def test_round_trip_numpy_float32(n: int) -> None:
    item = _item(n)
    out = decode_kwargs_item(encode_kwargs_item(item))
    assert set(out) == {"pixel_values", "image_grid_thw"}
    assert out["pixel_values"].dtype == np.float32
    assert out["pixel_values"].shape == item["pixel_values"].shape
    assert _bits(out["pixel_values"]) == _bits(item["pixel_values"])
    assert out["image_grid_thw"].shape == (1, 3)
    assert out["image_grid_thw"].dtype == np.int64
    assert out["image_grid_thw"].tolist() == item["image_grid_thw"].tolist()
    assert not out["pixel_values"].flags.writeable


def test_round_trip_special_floats_bit_exact() -> None:
    pv = np.array([[np.nan, -0.0, np.inf, -np.inf, 1e-45, 3.4e38]], dtype=np.float32)
    pv = np.repeat(pv, 4, axis=0)
    out = decode_kwargs_item(
        encode_kwargs_item({"pixel_values": pv, "image_grid_thw": np.array([[1, 2, 2]])})
    )
    assert _bits(out["pixel_values"]) == _bits(pv)


def test_round_trip_torch_float32_and_bfloat16() -> None:
    g = torch.tensor([[1, 8, 8]])
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        pv = torch.randn(64, 1176, generator=torch.Generator().manual_seed(1)).to(dtype)
        data = encode_kwargs_item({"pixel_values": pv, "image_grid_thw": g})
        out = decode_kwargs_item(data, tensors="torch")
        assert out["pixel_values"].dtype == dtype
        assert torch.equal(out["pixel_values"], pv)
        assert _bits(out["pixel_values"]) == _bits(pv)
        assert out["image_grid_thw"].tolist() == [[1, 8, 8]]
        # numpy view of the same bits (bfloat16 via ml_dtypes)
        arr = decode_kwargs_item(data)["pixel_values"]
        assert str(arr.dtype) == str(dtype).removeprefix("torch.")
        assert arr.tobytes() == _bits(pv)


def test_numpy_bfloat16_via_ml_dtypes() -> None:
    import ml_dtypes

    pv = _item(16)["pixel_values"].astype(ml_dtypes.bfloat16)
    data = encode_kwargs_item({"pixel_values": pv, "image_grid_thw": np.array([[1, 4, 4]])})
    out = decode_kwargs_item(data)
    assert out["pixel_values"].dtype == pv.dtype
    assert _bits(out["pixel_values"]) == _bits(pv)
    # same bytes as from the equivalent torch tensor
    t = torch.from_numpy(pv.view(np.uint16).astype(np.int32)).to(torch.int16).view(torch.bfloat16)
    assert data == encode_kwargs_item(
        {"pixel_values": t, "image_grid_thw": torch.tensor([[1, 4, 4]])}
    )


def test_numpy_and_torch_inputs_encode_identically() -> None:
    item = _item(64)
    as_torch = {k: torch.from_numpy(v.copy()) for k, v in item.items()}
    assert encode_kwargs_item(item) == encode_kwargs_item(as_torch)


def test_read_only_and_non_contiguous_inputs() -> None:
    item = _item(64)
    pv = item["pixel_values"]
    pv.flags.writeable = False
    wide = np.asfortranarray(pv)  # same values, column-major memory
    assert encode_kwargs_item({**item, "pixel_values": wide}) == encode_kwargs_item(item)
    strided = torch.from_numpy(np.ascontiguousarray(pv.T)).T  # non-contiguous view
    assert encode_kwargs_item({**item, "pixel_values": strided}) == encode_kwargs_item(item)
    big_endian = pv.astype(">f4")
    assert encode_kwargs_item({**item, "pixel_values": big_endian}) == encode_kwargs_item(item)


def test_grid_thw_as_row_or_flat() -> None:
    item = _item(64)
    flat = {**item, "image_grid_thw": item["image_grid_thw"].reshape(3)}
    assert encode_kwargs_item(flat) == encode_kwargs_item(item)


def test_exact_layout() -> None:
    """The structure vLLM 0.32's MsgpackEncoder writes for a Qwen-VL image item."""
    pv = np.arange(8, dtype=np.float32).reshape(2, 4)
    raw = base64.b64decode(
        encode_kwargs_item({"pixel_values": pv, "image_grid_thw": np.array([[1, 2, 4]])})
    )
    exts = []

    def hook(code, data):
        exts.append(code)
        return bytes(data)

    obj = msgpack.unpackb(raw, ext_hook=hook)
    assert exts == [3, 3]
    assert obj == {
        "pixel_values": {
            "data": ["float32", [2, 4], pv.tobytes()],
            "field": ["flat", {"keep_on_cpu": False, "slices": [[[0, 2, None]]], "dim": 0}],
        },
        "image_grid_thw": {
            "data": ["int64", [3], np.array([1, 2, 4], dtype=np.int64).tobytes()],
            "field": ["batched", {"keep_on_cpu": True}],
        },
    }


def test_ext_header_sizes() -> None:
    """fixext / ext8 / ext16 / ext32 headers, as msgspec picks them."""
    for n in (1, 2, 3, 4, 8, 16, 17, 64, 255, 256, 65535 // 4 + 1):
        pv = np.zeros((n, 1), dtype=np.float32) if n > 1 else np.zeros((1, 1), np.int8)
        pv = pv.astype(np.int8) if n in (1, 2, 3) else pv
        data = encode_kwargs_item({"pixel_values": pv})
        out = decode_kwargs_item(data)
        assert _bits(out["pixel_values"]) == _bits(pv)


def test_video_item() -> None:
    pv = np.ones((8, 1176), dtype=np.float32)
    item = {"pixel_values_videos": pv, "video_grid_thw": np.array([[2, 2, 2]])}
    out = decode_kwargs_item(encode_kwargs_item(item, modality="video"))
    assert _bits(out["pixel_values_videos"]) == _bits(pv)
    with pytest.raises(EncodeError, match="modality"):
        encode_kwargs_item(item)


@pytest.mark.parametrize(
    ("item", "match"),
    [
        ({}, "empty"),
        ({"pixel_values": [[1.0]]}, "numpy array or a torch tensor"),
        ({"bogus": np.zeros(3)}, "unknown multi-modal kwarg"),
        ({"pixel_values": np.float32(1.0)}, "numpy array or a torch tensor"),
        ({"pixel_values": np.zeros((), np.float32)}, "scalar"),
        ({"image_grid_thw": np.zeros((2, 3), np.int64)}, "leading axis of 1"),
        ({"pixel_values": np.zeros((2, 2), dtype=object)}, "cannot be put on the wire"),
    ],
)
def test_encode_refusals(item, match: str) -> None:
    with pytest.raises(EncodeError, match=match):
        encode_kwargs_item(item)


def _b64(obj) -> str:
    return base64.b64encode(msgpack.packb(obj)).decode()


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ("not base64!!", "not valid base64"),
        ("QUJ", "not valid base64"),
        ("é", "non-ASCII"),
        (base64.b64encode(b"\xc1\xc1\xc1").decode(), "not a msgpack-encoded"),
        (base64.b64encode(b"\x82\xa1a").decode(), "not a msgpack-encoded"),  # truncated
        (_b64([1, 2, 3]), "non-empty map"),
        (_b64({}), "non-empty map"),
        (_b64({"pixel_values": 1}), "'data' and 'field'"),
        (_b64({"pixel_values": {"data": None, "field": ["flat", {}]}}), "no data"),
        (_b64({"pixel_values": {"data": [1, 2, 3], "field": ["nope", {}]}}), "bad field"),
        (
            _b64({"pixel_values": {"data": ["float32", [2], b"12345678"], "field": ["flat", {}]}}),
            "ext type 3",
        ),
        (
            _b64({"pixel_values": {"data": ["float32", [2], 1], "field": ["flat", {}]}}),
            "out-of-band",
        ),
        (
            base64.b64encode(
                msgpack.packb(
                    {
                        "pixel_values": {
                            "data": ["float32", [3], msgpack.ExtType(3, b"12345678")],
                            "field": ["flat", {}],
                        }
                    }
                )
            ).decode(),
            "do not hold",
        ),
        (
            base64.b64encode(
                msgpack.packb(
                    {
                        "pixel_values": {
                            "data": ["floaty", [2], msgpack.ExtType(3, b"12345678")],
                            "field": ["flat", {}],
                        }
                    }
                )
            ).decode(),
            "unknown tensor dtype",
        ),
        (
            base64.b64encode(
                msgpack.packb(
                    {
                        "pixel_values": {
                            "data": ["float32", [-2], msgpack.ExtType(3, b"12345678")],
                            "field": ["flat", {}],
                        }
                    }
                )
            ).decode(),
            "bad shape",
        ),
        (
            base64.b64encode(msgpack.packb({"x": msgpack.ExtType(1, b"pickle!")})).decode(),
            "extension type 1",
        ),
    ],
)
def test_decode_refusals(data: str, match: str) -> None:
    with pytest.raises(DecodeError, match=match) as info:
        decode_kwargs_item(data)
    assert isinstance(info.value, ValueError)


def test_decode_every_truncation_is_refused() -> None:
    raw = base64.b64decode(encode_kwargs_item(_item(4, 12)))
    for cut in range(0, len(raw), 7):
        with pytest.raises(DecodeError):
            decode_kwargs_item(base64.b64encode(raw[:cut]).decode())


def test_a_llava_onevision_item_is_encoded_with_its_own_layout():
    """LLaVA-OneVision's tiles and image size are batched elements (one image's tiles are
    one element); its batch_num_images is transformers-only and is not sent."""
    rng = np.random.default_rng(0)
    item = {
        "pixel_values": rng.standard_normal((1, 5, 3, 32, 32), dtype=np.float32),
        "image_sizes": np.array([[40, 50]], dtype=np.int64),
        "batch_num_images": np.array([1], dtype=np.int64),
    }
    decoded = decode_kwargs_item(encode_kwargs_item(item))
    assert set(decoded) == {"pixel_values", "image_sizes"}
    assert np.array_equal(decoded["pixel_values"], item["pixel_values"])
    assert np.array_equal(decoded["image_sizes"], item["image_sizes"])
    raw = msgpack.unpackb(base64.b64decode(encode_kwargs_item(item)), raw=False,
                          ext_hook=lambda code, data: (code, len(data)))  # fmt: skip
    assert raw["pixel_values"]["field"] == ["batched", {"keep_on_cpu": False}]
    assert raw["pixel_values"]["data"][1] == [5, 3, 32, 32]
    assert raw["image_sizes"]["field"] == ["batched", {"keep_on_cpu": True}]


@pytest.mark.parametrize(
    "text",
    ["QR==", "QUI=", "QUJD", "QQ=", "Q===", "=QQQ", "QQ==QQ==", "QU JD", "QU\nJD", "QU-_", ""],
)
def test_base64_is_read_as_base64_validate_reads_it(text: str) -> None:
    """The fast decoder takes exactly what ``base64.b64decode(validate=True)`` takes, to
    the same bytes, and refuses the rest with base64's own message (strings and bytes)."""
    from vf_mm.inference._mm_kwargs import _b64decode

    try:
        want: bytes | str = base64.b64decode(text, validate=True)
    except ValueError as exc:
        want = str(exc)
    for data in (text, text.encode()):
        try:
            got: bytes | str = _b64decode(data)
        except ValueError as exc:
            got = str(exc)
        assert got == want, data


def test_decoded_arrays_are_read_only_views_of_one_copy() -> None:
    """Each tensor is a read-only view of the bytes msgpack handed over (no second copy)."""
    item = _item(4, 12)
    out = decode_kwargs_item(encode_kwargs_item(item))
    pixels = out["pixel_values"]
    assert not pixels.flags.writeable and not pixels.flags.owndata
    root = pixels
    while isinstance(root, np.ndarray) and root.base is not None:
        root = root.base
    assert type(root) is bytes and len(root) == pixels.nbytes
    np.testing.assert_array_equal(pixels, item["pixel_values"])


def test_encode_features_is_the_features_field_a_generate_request_sends() -> None:
    """``encode_features`` (what ``vf_mm.integrations.verifiers`` posts through renderers'
    client) is the ``features`` of ``encode_request`` for the same data, every item inline;
    data a prompt of that length cannot carry is refused."""
    import json

    from vf_mm.errors import MultiModalDataError
    from vf_mm.inference import GenerateRequest, SamplingParams, encode_features
    from vf_mm.inference._vllm_protocol import encode_request
    from vf_mm.types import MultiModalData, PlaceholderRange

    item = {"pixel_values": np.arange(8, dtype=np.float32).reshape(2, 4),
            "image_grid_thw": np.array([[1, 2, 1]], dtype=np.int64)}  # fmt: skip
    mmd = MultiModalData({"image": ["h0"]}, {"image": [PlaceholderRange(2, 1)]}, {"image": [item]})
    request = GenerateRequest(
        prompt_ids=[1, 2, 9, 3], sampling=SamplingParams(), multi_modal_data=mmd
    )
    sent = json.loads(
        encode_request(request, model=None, image_policy=None, send_kwargs_data=True).body
    )
    assert encode_features(mmd, num_tokens=4) == sent["features"]
    assert sent["features"]["kwargs_data"]["image"] == [encode_kwargs_item(item)]
    with pytest.raises(MultiModalDataError):
        encode_features(mmd, num_tokens=2)  # the placeholder lies past the prompt
