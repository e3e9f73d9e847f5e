"""The HTML report of an eval run directory (``vf-mm view OUTDIR``): one file, or pages.

The run directory holds ``results.jsonl`` (one rollout a line), ``metadata.json`` (config
and aggregates) and ``assets/`` (images and videos by content hash).
:func:`write_report` writes its report to disk, as one of two kinds (``_write``'s
docstring says which it picks; by default, one file for a run that fits on one page of
``PAGE_SIZE`` rollouts, pages for a longer one):

**Pages** (``OUTDIR/report/index.html``, ``page-0002.html``, ...): the summary (config,
aggregates over the whole run, metrics, errors, the list of pages) and the first page on
the index, ``PAGE_SIZE`` rollouts a page, each page its own file linked to the others
(first, prev, next, last, nearby pages): it works from ``file://``. Images are the run's
own ``assets/<hash>.<ext>`` files by relative URL (``../assets/...``), loaded lazily;
a reference that is not exactly such a file is shown as text, never as an image source,
and the CSP allows images only from ``'self'``. It is written streaming: one page in
memory at a time, the rows read one at a time (``_pages``, ``_links``, ``_run``).

**One file** (:func:`make_report` returns it, ``write_report``
writes it as ``OUTDIR/report.html``), that can be mailed around:

- no network: CSS and JS are inline, images and videos are embedded as ``data:`` URIs,
  and a Content-Security-Policy allows nothing else (remote ``http(s)`` images and videos
  become links);
- each distinct image is embedded **once**, as a CSS class; every use of it refers to the
  class, so a picture repeated over turns and rollouts costs its bytes a single time;
- a video shows as a strip of evenly spaced frames (small PNGs, embedded as images are)
  with its frame count, frame rate and size; a file a browser plays (MP4 or WebM of
  H.264, VP8, VP9 or AV1) is embedded once more, whole, in one ``<video controls>``
  player that every use of it opens;
- every string from the run (model text, tool arguments, ids, errors) goes through
  jinja2's autoescape, and the one script is pinned by its hash in the CSP, so text a
  model wrote can never run as markup or script;
- it reads without JS (file order, ``<details>`` for long text, ``:target`` lightboxes);
  with JS, cards sort by reward and filter by error / example id.

Damaged input is reported, never fatal: a missing ``metadata.json``, an empty or torn
``results.jsonl``, a missing or unreadable image or video (a placeholder and a warning on
its card), null or non-finite rewards, huge text (truncated behind "show more").

Open the report (either kind, any page) with ``#selftest`` after its URL and it checks
itself: it decodes every image and video frame its cards show (embedded, or linked and
loaded there and then), loads every player's metadata, and writes a JSON summary into
``<pre id="selftest">`` (the tests read it from a headless browser).

Both kinds share the summary, the cards, the template and its escaping.

Modules: ``_write`` (``write_report``: which kind, where, replaced atomically), ``_run``
(the run directory read through ``vf_mm.results`` one row at a time, and the pass that
sums it up), ``_build`` (``make_report``: the single file),
``_pages`` (the paged report), ``_assets`` (embedding images and videos), ``_links``
(linking them, confined to the run's ``assets/``), ``_videos`` (a video's strip frames,
and which files a browser plays), ``_views`` (view models for the template, and how
numbers and text are formatted) and ``_html`` (the page template, CSS, JS and the CSPs).
"""

from __future__ import annotations

from vf_mm.report._assets import ASSET_MAX_BYTES as ASSET_MAX_BYTES
from vf_mm.report._assets import FULL_MIN as FULL_MIN
from vf_mm.report._assets import THUMB_MAX_H as THUMB_MAX_H
from vf_mm.report._assets import THUMB_MAX_W as THUMB_MAX_W
from vf_mm.report._assets import THUMB_MIN as THUMB_MIN
from vf_mm.report._build import Report, make_report
from vf_mm.report._links import MEMO_ENTRIES as MEMO_ENTRIES
from vf_mm.report._videos import STRIP_FRAMES as STRIP_FRAMES
from vf_mm.report._views import TEXT_MAX_CHARS as TEXT_MAX_CHARS
from vf_mm.report._views import TEXT_PREVIEW_CHARS as TEXT_PREVIEW_CHARS
from vf_mm.report._views import TEXT_PREVIEW_LINES as TEXT_PREVIEW_LINES
from vf_mm.report._write import (
    WrittenReport,
    write_report,
)

__all__ = [
    "Report",
    "WrittenReport",
    "make_report",
    "write_report",
]
