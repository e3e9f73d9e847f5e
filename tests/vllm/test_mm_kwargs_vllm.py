"""Our kwargs_data entries read by vLLM's OWN decoder, and vLLM's entries read by ours.

vLLM runs in a subprocess (tests/vllm/_vllm_serde.py under .venv-vllm's python), so
this module never imports vLLM.
"""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
from pathlib import Path

import msgpack
import numpy as np
import pytest
import torch

from vf_mm.inference._internal import (
    decode_kwargs_item,
    encode_kwargs_item,
)

pytestmark = pytest.mark.vllm

HELPER = Path(__file__).with_name("_vllm_serde.py")


def _run_vllm(python: str, request: dict) -> dict:
    proc = subprocess.run(
        [python, str(HELPER)],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, f"vLLM helper failed:\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout)


def _sha(t) -> str:
    if isinstance(t, torch.Tensor):
        raw = t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()
    else:
        raw = np.ascontiguousarray(t).tobytes()
    return hashlib.sha256(raw).hexdigest()


def _items() -> list[dict]:
    g = torch.Generator().manual_seed(0)
    items = []
    for n, dtype in [(64, torch.float32), (256, torch.float32), (16, torch.bfloat16),
                     (36, torch.float16), (4, torch.float32)]:  # fmt: skip
        side = round(n**0.5)
        items.append(
            {
                "pixel_values": torch.randn(n, 1176, generator=g).to(dtype),
                "image_grid_thw": torch.tensor([[1, side, side]]),
            }
        )
    # numpy input, as the renderer produces it (read-only float32)
    pv = np.random.default_rng(1).standard_normal((16, 1176)).astype(np.float32)
    pv.flags.writeable = False
    items.append({"pixel_values": pv, "image_grid_thw": np.array([[1, 4, 4]], dtype=np.int64)})
    return items


def test_vllm_decodes_our_entries(vllm_py: str) -> None:
    items = _items()
    encoded = [encode_kwargs_item(item) for item in items]
    result = _run_vllm(vllm_py, {"decode": encoded})
    assert len(result["decoded"]) == len(items)
    for item, seen in zip(items, result["decoded"], strict=True):
        assert "error" not in seen, seen
        # vLLM's encoder writes the item it decoded back to our exact bytes
        assert seen.pop("__reencoded_equal__") is True
        assert set(seen) == {"pixel_values", "image_grid_thw"}
        pv, grid = item["pixel_values"], item["image_grid_thw"]
        assert seen["pixel_values"]["shape"] == list(pv.shape)
        assert seen["pixel_values"]["dtype"] == str(pv.dtype).removeprefix("torch.")
        assert seen["pixel_values"]["sha256"] == _sha(pv)
        assert seen["pixel_values"]["field"] == {
            "class": "MultiModalFlatField",
            "keep_on_cpu": "False",
            "slices": f"[[slice(0, {pv.shape[0]}, None)]]",
            "dim": "0",
        }
        # a batched element is one row: (3,) int64
        assert seen["image_grid_thw"]["shape"] == [3]
        assert seen["image_grid_thw"]["dtype"] == "int64"
        assert seen["image_grid_thw"]["sha256"] == _sha(np.asarray(grid, dtype=np.int64)[0])
        assert seen["image_grid_thw"]["field"] == {
            "class": "MultiModalBatchedField",
            "keep_on_cpu": "True",
        }


def test_vllm_refuses_garbage_we_refuse(vllm_py: str) -> None:
    """Sanity: the helper reports vLLM decode errors rather than crashing."""
    bad = base64.b64encode(b"\x93\x01\x02").decode()
    result = _run_vllm(vllm_py, {"decode": [bad]})
    assert "error" in result["decoded"][0]


def test_we_decode_vllm_entries(vllm_py: str) -> None:
    """vLLM's encoding of a two-image batch, split into items by Qwen2-VL's field config
    (MultiModalKwargsItems.from_hf_inputs, as its render route does), read by ours."""
    rng = np.random.default_rng(2)
    pv = rng.standard_normal((64 + 16, 1176)).astype(np.float32)
    grid = np.array([[1, 8, 8], [1, 4, 4]], dtype=np.int64)

    def wire(a: np.ndarray) -> list:
        return [str(a.dtype), list(a.shape), base64.b64encode(a.tobytes()).decode()]

    result = _run_vllm(
        vllm_py, {"encode_hf": {"pixel_values": wire(pv), "image_grid_thw": wire(grid)}}
    )
    first, second = (decode_kwargs_item(e) for e in result["encoded"])
    assert np.array_equal(first["pixel_values"], pv[:64])
    assert np.array_equal(second["pixel_values"], pv[64:])
    assert first["image_grid_thw"].tolist() == [[1, 8, 8]]
    assert second["image_grid_thw"].tolist() == [[1, 4, 4]]
    # the same layout as ours, except that vLLM writes the whole batch's slices into
    # each item's flat field (informational on the generate side); ours: the item's own
    theirs = _unpack(result["encoded"][0])
    ours = _unpack(encode_kwargs_item({k: first[k] for k in first}))
    assert theirs["pixel_values"]["field"][1].pop("slices") == [[[0, 64, None]], [[64, 80, None]]]
    assert ours["pixel_values"]["field"][1].pop("slices") == [[[0, 64, None]]]
    assert theirs == ours


def _unpack(entry: str) -> dict:
    return msgpack.unpackb(base64.b64decode(entry), ext_hook=lambda code, data: (code, data))


def test_kimi_k25s_items_are_vllms_own_vision_chunk_entries(vllm_py: str) -> None:
    """Kimi-K2.5's items as vf_mm sends them (``modality="vision_chunk"``, transformers'
    ``image_grid_thw`` as vLLM's ``grid_thws``) are the entries vLLM writes itself from
    the same batch by its Kimi-K2.5 field config, byte for byte apart from the flat
    field's batch-wide slices (informational on the generate side)."""
    rng = np.random.default_rng(3)
    pv = rng.standard_normal((8 + 4, 3, 14, 14)).astype(np.float32)
    grid = np.array([[1, 2, 4], [1, 2, 2]], dtype=np.int64)

    def wire(a: np.ndarray) -> list:
        return [str(a.dtype), list(a.shape), base64.b64encode(a.tobytes()).decode()]

    result = _run_vllm(vllm_py, {"family": "kimi_k25",
                                 "encode_hf": {"pixel_values": wire(pv), "grid_thws": wire(grid)}})  # fmt: skip
    ours = [
        encode_kwargs_item({"pixel_values": pv[:8], "image_grid_thw": grid[:1]}, modality="vision_chunk"),
        encode_kwargs_item({"pixel_values": pv[8:], "image_grid_thw": grid[1:]}, modality="vision_chunk"),
    ]  # fmt: skip
    for theirs, mine in zip(result["encoded"], ours, strict=True):
        a, b = _unpack(theirs), _unpack(mine)
        a["pixel_values"]["field"][1].pop("slices")
        b["pixel_values"]["field"][1].pop("slices")
        assert a == b
