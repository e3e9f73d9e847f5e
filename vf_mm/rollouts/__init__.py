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

__all__ = [
    "ASSETS_DIR",
    "METADATA_FILE",
    "RESULTS_FILE",
    "RESULTS_FORMAT",
    "ROW_KEYS",
    "AssetStore",
    "EvalProgress",
    "ResultsWriter",
    "evaluate_to_dir",
    "pass_at_k",
    "read_metadata",
    "read_results",
    "summarize",
    "to_json_value",
]
