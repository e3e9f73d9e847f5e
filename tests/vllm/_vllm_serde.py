"""Run with .venv-vllm's python (imports vLLM): vLLM's own view of kwargs_data entries.

Reads JSON from stdin: {"decode": [b64, ...], "encode_hf": {"pixel_values": [dtype, shape,
b64 raw], "image_grid_thw": [...]}}. Writes JSON to stdout:
- "decoded": for each b64 entry, vLLM's decode_mm_kwargs_item result described per key
  (shape, dtype, sha256 of the raw bytes, field class and attributes) and whether vLLM's
  encoder re-encodes the decoded item to the very same bytes ("reencoded_equal").
- "encoded": vLLM's encoding of each image item that MultiModalKwargsItems.from_hf_inputs
  builds from the given batch with Qwen2-VL's field config (as the render route does);
  with "family": "kimi_k25" (the batch's grid named ``grid_thws``), each ``vision_chunk``
  item by Kimi-K2.5's field config.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import sys

import torch
from transformers import BatchFeature
from vllm.entrypoints.scale_out.token_in_token_out.mm_serde import (
    decode_mm_kwargs_item,
    encode_mm_kwargs_item,
)
from vllm.model_executor.models.qwen2_vl import _create_qwen2vl_field_factory
from vllm.multimodal.inputs import MultiModalKwargsItems


def _describe_field(field) -> dict:
    out = {"class": type(field).__name__}
    for f in dataclasses.fields(field):
        value = getattr(field, f.name)
        out[f.name] = repr(value)
    return out


def _describe(item) -> dict:
    out = {}
    for key, elem in item.items():
        t = elem.data
        assert isinstance(t, torch.Tensor), type(t)
        raw = t.contiguous().view(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        out[key] = {
            "shape": list(t.shape),
            "dtype": str(t.dtype).removeprefix("torch."),
            "sha256": hashlib.sha256(raw).hexdigest(),
            "field": _describe_field(elem.field),
        }
    return out


def main() -> None:
    req = json.load(sys.stdin)
    result: dict = {"decoded": [], "encoded": []}
    for b64 in req.get("decode", []):
        try:
            item = decode_mm_kwargs_item(b64)
        except Exception as exc:
            result["decoded"].append({"error": f"{type(exc).__name__}: {exc}"})
            continue
        desc = _describe(item)
        desc["__reencoded_equal__"] = encode_mm_kwargs_item(item) == b64
        result["decoded"].append(desc)
    hf = req.get("encode_hf")
    if hf:
        tensors = {}
        for key, (dtype, shape, raw) in hf.items():
            buf = bytearray(base64.b64decode(raw))
            tensors[key] = (
                torch.frombuffer(buf, dtype=torch.uint8).view(getattr(torch, dtype)).view(shape)
            )
        batch = BatchFeature(tensors)
        if req.get("family") == "kimi_k25":
            from vllm.model_executor.models.kimi_k25 import KimiK25MultiModalProcessor

            # the field config reads only the batch (no processor state)
            fields = KimiK25MultiModalProcessor._get_mm_fields_config(None, batch, {})
            modality = "vision_chunk"
        else:
            fields = _create_qwen2vl_field_factory(2)(batch)
            modality = "image"
        items = MultiModalKwargsItems.from_hf_inputs(batch, fields)
        result["encoded"] = [encode_mm_kwargs_item(item) for item in items[modality]]
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()
