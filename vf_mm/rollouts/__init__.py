"""Evaluation results: ``OUTDIR/results.jsonl``, ``OUTDIR/metadata.json``, ``OUTDIR/assets/``.

``ResultsWriter(outdir, metadata={...}, resume=False)`` appends one JSON line per
(example, rollout) with ``write(output, rollout_index=r)``; images in the messages are
stored once each as ``assets/<hash>.png`` (``AssetStore``) and the lines hold
``{"type": "image_url", "image_url": {"url": "assets/<hash>.png"}}`` references, never
base64 pixels. A run killed at any moment resumes with ``resume=True``: a torn last
line is cut off, ``done`` says what is already there, and each (example, rollout) ends up
in the file exactly once. ``finalize(aggregates)`` stores ``summarize`` results in
metadata.json. ``read_results(outdir)`` / ``read_metadata(outdir)`` read a run back.

The file formats are documented in ``vf_mm/rollouts/_results.py`` (module docstring).

For training, ``pack_group(outputs, advantages=...)`` makes one wire frame per example's
group of rollouts, each distinct image's tensors once (by content hash), steps referring
to them by hash and position; ``unpack_group(frame)`` rebuilds ``TrainingRollout`` s whose
steps' ``MultiModalData`` equal the renderer's. Schema: ``vf_mm/rollouts/_sidecar.py``.
"""

from __future__ import annotations

from vf_mm.rollouts._assets import ASSETS_DIR, AssetStore, to_json_value
from vf_mm.rollouts._results import (
    METADATA_FILE,
    RESULTS_FILE,
    RESULTS_FORMAT,
    ROW_KEYS,
    ResultsWriter,
    pass_at_k,
    read_metadata,
    read_results,
    summarize,
)
from vf_mm.rollouts._runner import EvalProgress, evaluate_to_dir
from vf_mm.rollouts._sidecar import GROUP_FORMAT, TrainingRollout, pack_group, unpack_group

__all__ = [
    "ASSETS_DIR",
    "GROUP_FORMAT",
    "METADATA_FILE",
    "RESULTS_FILE",
    "RESULTS_FORMAT",
    "ROW_KEYS",
    "AssetStore",
    "EvalProgress",
    "ResultsWriter",
    "TrainingRollout",
    "evaluate_to_dir",
    "pack_group",
    "pass_at_k",
    "read_metadata",
    "read_results",
    "summarize",
    "to_json_value",
    "unpack_group",
]
