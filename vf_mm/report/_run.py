"""The run directory as the report reads it: streamed, one row at a time.

Invariant: nothing here holds more than one row of ``results.jsonl`` at a time. What
grows with the run is what ``vf_mm.results.summarize`` keeps (8 bytes per number, two
counts per example id), the line numbers of bad lines, and a few numbers per page of a
paged report. Why: a report of a 100k-rollout run must not need the run in memory (its
rows as Python objects are gigabytes); it needs them one page at a time.

Reading goes through ``vf_mm.results`` (the one reader): ``scan_results(bad_lines="skip",
schema="lenient", keep_rows=False)`` judges every line first (what the report has
always shown: any JSON object, NaN allowed, every bad line left out and warned about, a
torn last line named as such) and keeps no row; ``_Run.rows`` then reads the file again
and yields the lines that scan kept, in file order. ``_Run.survey`` is one such pass: it
counts the rows, finds the reward range the cards are coloured by, sums up each page,
and, when ``metadata.json`` holds no aggregates (an interrupted run), computes them
with ``summarize`` over the whole file, however many rollouts the report shows.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vf_mm._text import shorten
from vf_mm.errors import ResultsError
from vf_mm.report._views import _config_rows, _fmt, _metric_rows, _number, _result_rows
from vf_mm.results import METADATA_FILE, RESULTS_FILE, read_metadata, scan_results, summarize

#: per-file warnings about bad results.jsonl lines listed before "and N more"
_MAX_LINE_WARNINGS = 5


@dataclass
class _PageSummary:
    """One page of a paged report, as the index lists it (known before it is drawn)."""

    number: int
    first: int  # order (0-based position among the rows shown) of its first rollout
    last: int
    first_example: str
    last_example: str
    errors: int = 0


@dataclass
class _Survey:
    """What one streamed pass over the rows found (``_Run.survey``)."""

    total: int  # rows in results.jsonl
    shown: int  # rows the report shows (max_rollouts)
    lo: float  # the reward range the cards are coloured by (0..1 widened by the rewards shown)
    hi: float
    aggregates: dict[str, Any]  # stored in metadata.json, else computed over every row
    computed: bool  # aggregates were computed from results.jsonl
    pages: list[_PageSummary] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # found by this pass


class _Run:
    """An eval run directory opened for the report: its metadata, what is wrong with it
    (``warnings``), and its rows on demand. Raises ``FileNotFoundError`` only when
    ``root`` holds neither file of a run directory."""

    def __init__(self, root: Path) -> None:
        results_path, meta_path = root / RESULTS_FILE, root / METADATA_FILE
        if not results_path.is_file() and not meta_path.is_file():
            raise FileNotFoundError(
                f"{root}: holds neither {RESULTS_FILE} nor {METADATA_FILE}; "
                "is it an eval run directory?"
            )
        self.root = root
        self.warnings: list[str] = []
        self.metadata: dict[str, Any] = {}
        try:
            self.metadata = read_metadata(root)
        except FileNotFoundError:
            self.warnings.append(
                f"{METADATA_FILE} is missing: no run config; aggregates computed from "
                f"{RESULTS_FILE}"
            )
        except (OSError, ResultsError) as exc:
            self.warnings.append(f"{METADATA_FILE} could not be read ({exc}); ignored")
        self._file: Path | None = None
        self._bad: set[int] = set()  # line numbers the reader left out
        self._size = 0  # bytes the reader judged: lines appended later are not read
        try:
            scan = scan_results(results_path, bad_lines="skip", schema="lenient", keep_rows=False)
        except FileNotFoundError:
            self.warnings.append(f"{RESULTS_FILE} is missing: no rollouts to show")
            return
        self._file, self._size = scan.path, scan.size
        self._bad = {b.line for b in scan.bad_lines}
        bad = [
            f"{RESULTS_FILE} line {b.line}: {b.reason}"
            + (" (a torn last line: interrupted run?)" if b.torn else "")
            + "; skipped"
            for b in scan.bad_lines[: _MAX_LINE_WARNINGS + 1]
        ]
        self.warnings.extend(bad[:_MAX_LINE_WARNINGS])
        if len(scan.bad_lines) > _MAX_LINE_WARNINGS:
            more = len(scan.bad_lines) - _MAX_LINE_WARNINGS
            self.warnings.append(f"... and {more} more unreadable lines")

    @property
    def config(self) -> dict[str, Any]:
        config = self.metadata.get("config")
        return config if isinstance(config, dict) else {}

    @property
    def stored_aggregates(self) -> dict[str, Any] | None:
        """The aggregates ``metadata.json`` holds (a finished run), else None."""
        results = self.metadata.get("results")
        return results if isinstance(results, dict) else None

    @property
    def title(self) -> str:
        config = self.config
        title = " · ".join(str(config[k]) for k in ("env_id", "model") if config.get(k) is not None)
        return title or self.root.resolve().name

    def rows(self, *, limit: int | None = None) -> Iterator[dict[str, Any]]:
        """The rows the reader kept, in file order, one at a time (the first ``limit``)."""
        if self._file is None or limit == 0:
            return
        count = offset = 0
        with open(self._file, "rb") as f:
            for number, raw in enumerate(f, start=1):
                offset += len(raw)
                if offset > self._size:
                    return  # written after the scan (a run still being written)
                if number in self._bad or not raw.strip():
                    continue
                try:  # the scan parsed this very line as an object (schema="lenient")
                    row = json.loads(raw.decode("utf-8", errors="replace"))
                except ValueError:
                    row = None
                if not isinstance(row, dict):  # the file changed under us: leave it out
                    continue
                yield row
                count += 1
                if limit is not None and count >= limit:
                    return

    def survey(self, *, max_rollouts: int | None, page_size: int) -> _Survey:
        """One pass over every row: counts, the reward range of the rows shown, each
        page's range (pages of ``page_size`` rows shown) and the aggregates (stored, or
        ``summarize`` of every row, over the values that are finite numbers)."""
        stored = self.stored_aggregates
        tally = _Tally(max_rollouts, page_size)
        warnings: list[str] = []
        if stored is not None:
            for row in self.rows():
                tally.add(row)
            aggregates, computed = stored, False
        else:
            left_out = [0]
            summable = (_summable(tally.add(row), left_out) for row in self.rows())
            aggregates = summarize(summable)
            if tally.total == 0:
                aggregates = {}
            computed = tally.total > 0
            if left_out[0]:
                warnings.append(
                    f"{left_out[0]} value(s) in {RESULTS_FILE} are not finite numbers "
                    "(reward, metrics, turns or tokens); the aggregates leave them out"
                )
        return _Survey(
            total=tally.total,
            shown=tally.shown,
            lo=tally.lo,
            hi=tally.hi,
            aggregates=aggregates,
            computed=computed,
            pages=tally.pages,
            warnings=warnings,
        )

    def summary_context(self, survey: _Survey) -> dict[str, Any]:
        """What the top of the report shows (the template's names): title, config,
        aggregates, metrics, whether the run finished."""
        metadata = self.metadata
        return {
            "title": self.title,
            "outdir": str(self.root),
            "config_rows": _config_rows(metadata, self.config),
            "result_rows": _result_rows(survey.aggregates),
            "results_computed": survey.computed,
            "metric_rows": _metric_rows(survey.aggregates),
            "interrupted": bool(metadata) and metadata.get("finished_at", "absent") is None,
            "total": survey.total,
        }


class _Tally:
    """The running counts of ``_Run.survey``: one row at a time, nothing kept per row."""

    def __init__(self, max_rollouts: int | None, page_size: int) -> None:
        self.max_rollouts, self.page_size = max_rollouts, page_size
        self.total = self.shown = 0
        self.lo, self.hi = 0.0, 1.0
        self.pages: list[_PageSummary] = []

    def add(self, row: dict[str, Any]) -> dict[str, Any]:
        order = self.total
        self.total += 1
        if self.max_rollouts is not None and order >= self.max_rollouts:
            return row
        self.shown += 1
        reward = _number(row.get("reward"))
        if reward is not None and math.isfinite(reward):
            self.lo, self.hi = min(self.lo, reward), max(self.hi, reward)
        example = shorten(_fmt(row.get("example_id")) if "example_id" in row else "?", 40)
        if order % self.page_size == 0:
            number = len(self.pages) + 1
            self.pages.append(_PageSummary(number, order, order, example, example))
        page = self.pages[-1]
        page.last, page.last_example = order, example
        page.errors += row.get("error") is not None
        return row


def _summable(row: dict[str, Any], left_out: list[int]) -> dict[str, Any]:
    """``row`` with every numeric field that is not a finite number set to None (metrics:
    dropped), counting them in ``left_out[0]``; an example id that is not a number or a
    string (a file another tool wrote) becomes its JSON text, so it can be counted."""

    def finite(value: Any) -> float | None:
        number = _number(value)
        if value is not None and (number is None or not math.isfinite(number)):
            left_out[0] += 1
            return None
        return number

    out = dict(row)
    for key in ("reward", "num_turns", "prompt_tokens", "completion_tokens"):
        out[key] = finite(row.get(key))
    metrics = row.get("metrics")
    kept = {}
    if isinstance(metrics, dict):
        kept = {k: v for k, v in ((k, finite(v)) for k, v in metrics.items()) if v is not None}
    out["metrics"] = kept
    example = row.get("example_id")
    if not isinstance(example, int | float | str | None):
        out["example_id"] = json.dumps(example, sort_keys=True, default=repr)
    return out
