"""A self-contained HTML report of an eval run directory (``vf-mm view OUTDIR``).

The run directory holds ``results.jsonl`` (one rollout a line), ``metadata.json`` (config
and aggregates) and ``assets/`` (images and videos by content hash). :func:`build_report` turns it
into **one** HTML file that can be mailed around:

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

Open the report with ``#selftest`` after its URL and it checks itself: it decodes every
embedded image and video frame, loads every player's metadata, and writes a JSON summary
into ``<pre id="selftest">`` (the tests read it from a headless browser).

Modules: ``_build`` (reading the run directory through ``vf_mm.results``, then
``make_report`` / ``build_report``), ``_assets`` (embedding images and videos), ``_videos``
(a video's strip frames, and which files a browser plays), ``_views`` (view models for the
template, and how numbers and text are formatted) and ``_html`` (the page template, CSS
and JS).
"""

from __future__ import annotations

from vf_mm.report._assets import ASSET_MAX_BYTES as ASSET_MAX_BYTES
from vf_mm.report._assets import FULL_MIN as FULL_MIN
from vf_mm.report._assets import THUMB_MAX_H as THUMB_MAX_H
from vf_mm.report._assets import THUMB_MAX_W as THUMB_MAX_W
from vf_mm.report._assets import THUMB_MIN as THUMB_MIN
from vf_mm.report._build import Report, build_report, make_report
from vf_mm.report._videos import STRIP_FRAMES as STRIP_FRAMES
from vf_mm.report._views import TEXT_MAX_CHARS as TEXT_MAX_CHARS
from vf_mm.report._views import TEXT_PREVIEW_CHARS as TEXT_PREVIEW_CHARS
from vf_mm.report._views import TEXT_PREVIEW_LINES as TEXT_PREVIEW_LINES

__all__ = ["Report", "build_report", "make_report"]
