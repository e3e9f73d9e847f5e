"""An evaluation run directory: ``OUTDIR/results.jsonl``, ``OUTDIR/metadata.json``, ``OUTDIR/assets/``.

Everything that writes, reads or sums up a run directory lives here, and everything else
(``vf-mm eval``, ``vf-mm view``, users' notebooks) goes through these names:

- ``ResultsWriter(outdir, metadata={...}, resume=False)`` appends one JSON line per
  (example, rollout) with ``write(output, rollout_index=r)``. Images in the messages are
  stored once each as ``assets/<hash>.png`` (``AssetStore``) and the lines hold
  ``{"type": "image_url", "image_url": {"url": "assets/<hash>.png"}}`` references, never
  base64 pixels; videos likewise as ``assets/<hash>.<ext>`` (``{"type": "video_url",
  "video_url": {"url": ...}, "frame_rate": ...}``: an encoded clip as its own bytes, raw
  frames losslessly), so that ``vf_mm.videos.load_video`` of a stored part gives the
  clip the model saw. A run killed at any moment resumes with ``resume=True``.
- ``read_results(outdir, bad_lines=...)`` is **the** reader: it says what to do with a bad
  line (``"raise"``, ``"torn-tail"`` — the default: only a torn last line is left out —
  or ``"skip"``) and ``scan_results`` returns the rows together with what was wrong;
  ``iter_results`` yields the same rows one at a time (a run of any length).
  ``read_metadata(outdir)`` reads ``metadata.json``.
- ``summarize(rows)`` computes the aggregates stored in metadata.json and shown by the
  CLI and the report; ``pass_at_k`` is its unbiased estimator.
- ``merge_runs(outdir, sources, allow_partial=False)`` combines the run directories of
  one sharded evaluation (``vf-mm eval --shard i/N``) into one run directory, refusing
  (``vf_mm.errors.MergeError``) sources that are not the shards of one run; it returns
  a ``MergeResult``.
- ``to_dataset(outdir, tokens=False, ...)`` returns the run as a ``datasets.Dataset``
  (one row per rollout; messages and other free-form values as JSON text that gives
  them back exactly, images as ``datasets.Image`` lined up with their references by
  ``image_urls``, clips as their files' bytes); a missing or changed asset raises
  ``vf_mm.errors.AssetError``. ``vf-mm export`` writes it as Parquet or with
  ``save_to_disk``.
- ``evaluate_to_dir(env, client, outdir, ...)`` runs an environment's evaluation into a
  run directory (what ``vf-mm eval`` does, without the terminal), reporting
  ``EvalProgress``.

The file formats are documented in ``vf_mm/results/_format.py`` (module docstring).
"""

from __future__ import annotations

from vf_mm.results._assets import ASSETS_DIR, AssetStore, to_json_value
from vf_mm.results._dataset import to_dataset
from vf_mm.results._format import (
    METADATA_FILE,
    RESULTS_FILE,
    ROW_KEYS,
)
from vf_mm.results._merge import MergeResult, merge_runs
from vf_mm.results._reader import (
    BadLine,
    ResultsScan,
    iter_results,
    read_metadata,
    read_results,
    scan_results,
)
from vf_mm.results._runner import EvalProgress, evaluate_to_dir
from vf_mm.results._summary import pass_at_k, summarize
from vf_mm.results._writer import ResultsWriter

__all__ = [
    "ASSETS_DIR",
    "METADATA_FILE",
    "RESULTS_FILE",
    "ROW_KEYS",
    "AssetStore",
    "BadLine",
    "EvalProgress",
    "MergeResult",
    "ResultsScan",
    "ResultsWriter",
    "evaluate_to_dir",
    "iter_results",
    "merge_runs",
    "pass_at_k",
    "read_metadata",
    "read_results",
    "scan_results",
    "summarize",
    "to_dataset",
    "to_json_value",
]
