"""How the golden writers record what the real processors computed: a tensor as its
shape, dtype and the sha256 of its bytes (``tensor_record``, which the tests compare
against), and a golden file as indented JSON with each list of numbers on one line
(``write_golden``), so a diff of a regenerated golden reads by case."""

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


def write_golden(path: Path, out: dict[str, Any]) -> None:
    text = json.dumps(out, indent=1)
    text = re.sub(
        r"\[[-\d,\s]*\]", lambda m: re.sub(r"\s+", "", m.group()).replace(",", ", "), text
    )
    path.write_text(text + "\n")
    print(f"wrote {path}")
