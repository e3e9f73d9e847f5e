"""How the golden writers record what the real processors computed: a tensor as its
shape, dtype and the sha256 of its bytes (``tensor_record``, which the tests compare
against), an input clip or image as the sha256 of its shape and bytes (``array_digest``:
a failure then says whether the inputs or the processing differ), the versions a golden
was written with (``versions``), and a golden file as indented JSON with each list of
numbers on one line (``write_golden``), so a diff of a regenerated golden reads by case.
``parts_of`` picks a conversation's parts of one type, in order."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import numpy as np


def tensor_record(value: Any) -> dict[str, Any]:
    array = np.ascontiguousarray(np.asarray(value))
    return {"shape": list(array.shape), "dtype": array.dtype.str,
            "sha256": hashlib.sha256(array.tobytes()).hexdigest()}  # fmt: skip


def array_digest(array: np.ndarray) -> str:
    array = np.ascontiguousarray(array)
    return hashlib.sha256(repr(array.shape).encode() + array.tobytes()).hexdigest()


def parts_of(messages: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [p for m in messages if isinstance(m["content"], list) for p in m["content"]
            if p.get("type") == kind]  # fmt: skip


def versions() -> dict[str, str]:
    """The versions that computed a golden (torchvision's processors' numbers depend on
    them, and on the CPU's vector units)."""
    import torch
    import torchvision
    import transformers

    return {"torch": torch.__version__, "torchvision": torchvision.__version__,
            "transformers": transformers.__version__, "numpy": np.__version__,
            "cpu_capability": torch.backends.cpu.get_cpu_capability()}  # fmt: skip


def write_golden(path: Path, out: dict[str, Any]) -> None:
    text = json.dumps(out, indent=1)
    text = re.sub(
        r"\[[-\d,\s]*\]", lambda m: re.sub(r"\s+", "", m.group()).replace(",", ", "), text
    )
    path.write_text(text + "\n")
    print(f"wrote {path}")
