"""The evaluation results store: ``results.jsonl`` + ``metadata.json`` + ``assets/``.

Layout of an OUTDIR (what ``vf-mm eval -o OUTDIR`` writes and ``vf-mm view`` reads)::

    OUTDIR/
      metadata.json    the run: the caller's metadata (``config``: env id, env args, model,
                       sampling args, num examples, rollouts per example, ...) plus
                       ``results_format``, ``started_at``, ``finished_at`` (null until
                       ``finalize``) and ``results`` (``summarize`` aggregates, null until
                       ``finalize``); always replaced atomically
      results.jsonl    one JSON object per line, one line per (example_id, rollout_index)
      assets/<hash>.png  each distinct image once (see ``_assets.py``)

One line of ``results.jsonl`` (``ROW_KEYS``, then the caller's ``extra`` keys)::

    {"example_id": int | str, "rollout_index": int,
     "prompt": [message, ...], "completion": [message, ...],      # images as asset refs
     "answer": JSON, "info": {...}, "reward": float | null, "metrics": {name: float | null},
     "error": str | null, "num_turns": int, "prompt_tokens": int | null,
     "completion_tokens": int | null, "timing": {...}, ...extra}

Crash safety (a ``kill -9`` at any moment, then ``resume=True``):

- a line is appended with one ``write()`` on an ``O_APPEND`` file (a loop only if the
  kernel takes part of it), so a killed writer leaves at most one torn line: the last.
  Opening with ``resume=True`` truncates it away (``truncated_bytes``, and a log warning);
  a corrupt line anywhere else is an error naming its line number, never skipped.
- the assets a line refers to are written (atomically) before the line.
- ``metadata.json`` is written at the start (``finished_at: null``) and by ``finalize``,
  each time to a temporary file that is fsynced and renamed over it.
- ``done`` is read back from the file, and ``write`` refuses a key already in it, so each
  (example, rollout) is in the file once. An OUTDIR is locked (``flock``) by its writer:
  a second writer on the same OUTDIR is refused.
- ``os.fsync`` of ``results.jsonl`` (after the assets folder) every ``fsync_every`` lines
  and on ``close``/``finalize``: a killed *process* loses nothing the kernel has; fsync is
  for power loss.

Numbers: JSON has no NaN or infinity, so a NaN/inf reward, metric or any other value is
refused with ``ResultsError`` (record a failed score as ``None``/null instead): a results
file that other JSON readers cannot parse is worse than a loud error.

The code is split by concept: ``_format.py`` (file names, row keys, one line's encoding),
``_writer.py`` (``ResultsWriter``), ``_reader.py`` (``read_results``, ``read_metadata``,
torn lines) and ``_summary.py`` (``summarize``, ``pass_at_k``); this module re-exports
their public names.
"""

from __future__ import annotations

from vf_mm.rollouts._format import METADATA_FILE, RESULTS_FILE, RESULTS_FORMAT, ROW_KEYS
from vf_mm.rollouts._reader import read_metadata, read_results
from vf_mm.rollouts._summary import pass_at_k, summarize
from vf_mm.rollouts._writer import ResultsWriter

__all__ = [
    "METADATA_FILE",
    "RESULTS_FILE",
    "RESULTS_FORMAT",
    "ROW_KEYS",
    "ResultsWriter",
    "pass_at_k",
    "read_metadata",
    "read_results",
    "summarize",
]
