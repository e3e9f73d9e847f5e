"""A self-contained HTML report of an eval run directory (``vf-mm view OUTDIR``).

The run directory holds ``results.jsonl`` (one rollout a line), ``metadata.json`` (config
and aggregates) and ``assets/`` (images by content hash). :func:`build_report` turns it
into **one** HTML file that can be mailed around:

- no network: CSS and JS are inline, images are embedded as ``data:`` URIs, and a
  Content-Security-Policy allows nothing else (remote ``http(s)`` images become links);
- each distinct image is embedded **once**, as a CSS class; every use of it refers to the
  class, so a picture repeated over turns and rollouts costs its bytes a single time;
- every string from the run (model text, tool arguments, ids, errors) goes through
  jinja2's autoescape, and the one script is pinned by its hash in the CSP, so text a
  model wrote can never run as markup or script;
- it reads without JS (file order, ``<details>`` for long text, ``:target`` lightboxes);
  with JS, cards sort by reward and filter by error / example id.

Damaged input is reported, never fatal: a missing ``metadata.json``, an empty or torn
``results.jsonl``, a missing or unreadable asset (a placeholder and a warning on its
card), null or non-finite rewards, huge text (truncated behind "show more").

Open the report with ``#selftest`` after its URL and it checks itself: it decodes every
embedded image and writes a JSON summary into ``<pre id="selftest">`` (the tests read it
from a headless browser).
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import io
import json
import math
import re
import urllib.parse
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
from markupsafe import Markup

__all__ = ["Report", "build_report", "make_report"]

#: text longer than this (characters or lines) shows a preview and a "show more"
TEXT_PREVIEW_CHARS = 2000
TEXT_PREVIEW_LINES = 40
#: text past this many characters is left out of the report (and the count said)
TEXT_MAX_CHARS = 200_000
#: assets bigger than this are not embedded (a placeholder says so)
ASSET_MAX_BYTES = 32 * 1024 * 1024
#: thumbnails fit this box; tiny images are scaled up to MIN on their long side
THUMB_MAX_W, THUMB_MAX_H, THUMB_MIN = 320, 240, 64
#: the enlarged view shows at least this many pixels on the long side (viewport permitting)
FULL_MIN = 640
#: per-file warnings about bad results.jsonl lines listed before "and N more"
_MAX_LINE_WARNINGS = 5

_BROWSER_MIME = {
    "PNG": "image/png",
    "JPEG": "image/jpeg",
    "GIF": "image/gif",
    "WEBP": "image/webp",
    "BMP": "image/bmp",
}
_ROLES = {"system", "developer", "user", "assistant", "tool"}
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
_DATA_URL = re.compile(r"^data:([\w.+-]+/[\w.+-]+)?((?:;[^,;]*)*?)(;base64)?,(.*)$", re.S)


@dataclass
class Report:
    """What :func:`make_report` built: the HTML and a few counts for the CLI to print."""

    html: str
    rollouts_total: int
    rollouts_shown: int
    images_embedded: int
    warnings: list[str] = field(default_factory=list)


def build_report(outdir: str | Path, *, max_rollouts: int | None = None) -> str:
    """The HTML text of the report on the run directory ``outdir``.

    ``max_rollouts`` keeps the first N rollouts of ``results.jsonl`` (the aggregates still
    cover the whole file). Raises ``FileNotFoundError`` when ``outdir`` is not a directory or
    holds neither ``results.jsonl`` nor ``metadata.json``; anything else damaged is shown
    as a warning in the report.
    """
    return make_report(outdir, max_rollouts=max_rollouts).html


def make_report(outdir: str | Path, *, max_rollouts: int | None = None) -> Report:
    """:func:`build_report`, with the counts and warnings kept apart for the caller."""
    root = Path(outdir)
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: not a directory (expected an eval run directory)")
    results_path, meta_path = root / "results.jsonl", root / "metadata.json"
    if not results_path.is_file() and not meta_path.is_file():
        raise FileNotFoundError(
            f"{root}: holds neither results.jsonl nor metadata.json; is it an eval run directory?"
        )
    if max_rollouts is not None and max_rollouts < 0:
        raise ValueError(f"max_rollouts must be >= 0, got {max_rollouts}")

    warnings: list[str] = []
    metadata = _read_metadata(meta_path, warnings)
    rows, stats = _read_results(results_path, max_rollouts, warnings)
    assets = _Assets(root)
    rewards = [r for r in (_number(row.get("reward")) for row in rows) if r is not None]
    finite = [r for r in rewards if math.isfinite(r)]
    lo, hi = min([0.0, *finite]), max([1.0, *finite])
    cards = [_card(i, row, assets, lo, hi) for i, row in enumerate(rows)]
    flagged = sum(1 for c in cards if c["warnings"])
    if flagged:
        warnings.append(
            f"{flagged} rollout(s) have warnings (missing or unreadable images); see their cards"
        )
    if max_rollouts is not None and stats.total > len(rows):
        warnings.append(
            f"showing the first {len(rows)} of {stats.total} rollouts (--max-rollouts {max_rollouts})"
        )

    config = metadata.get("config") if isinstance(metadata.get("config"), dict) else {}
    results = metadata.get("results") if isinstance(metadata.get("results"), dict) else None
    title = " · ".join(str(config[k]) for k in ("env_id", "model") if config.get(k) is not None)
    html = _template().render(
        title=title or root.resolve().name,
        outdir=str(root),
        config_rows=_config_rows(metadata, config),
        result_rows=_result_rows(results if results is not None else stats.summary()),
        results_computed=results is None and stats.total > 0,
        metric_rows=_metric_rows(results if results is not None else stats.summary()),
        interrupted=bool(metadata) and metadata.get("finished_at", "absent") is None,
        warnings=warnings,
        cards=cards,
        total=stats.total,
        assets=assets.embedded(),
        asset_css=Markup(assets.css()),
        css=Markup(_CSS),
        js=Markup(_JS),
        csp=_CSP,
    )
    # lone surrogates (legal in JSON, not in UTF-8) become "?" so the file always writes
    html = html.encode("utf-8", "replace").decode("utf-8")
    return Report(html, stats.total, len(rows), len(assets.embedded()), warnings)


# ------------------------------------------------------------------------------------------
# reading the run directory


def _read_metadata(path: Path, warnings: list[str]) -> dict[str, Any]:
    if not path.is_file():
        warnings.append(
            "metadata.json is missing: no run config; aggregates computed from results.jsonl"
        )
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8", errors="replace"))
    except (OSError, ValueError) as exc:
        warnings.append(f"metadata.json could not be read ({exc}); ignored")
        return {}
    if not isinstance(data, dict):
        warnings.append("metadata.json is not a JSON object; ignored")
        return {}
    return data


@dataclass
class _Stats:
    """Aggregates over every rollout of results.jsonl, for runs whose metadata has none."""

    total: int = 0
    errors: int = 0
    rewards: list[float] = field(default_factory=list)
    metrics: dict[str, list[float]] = field(default_factory=dict)
    turns: list[float] = field(default_factory=list)

    def add(self, row: dict[str, Any]) -> None:
        self.total += 1
        self.errors += bool(row.get("error"))
        reward = _number(row.get("reward"))
        if reward is not None and math.isfinite(reward):
            self.rewards.append(reward)
        metrics = row.get("metrics")
        if isinstance(metrics, dict):
            for name, value in metrics.items():
                v = _number(value)
                if v is not None and math.isfinite(v):
                    self.metrics.setdefault(str(name), []).append(v)
        turns = _number(row.get("num_turns"))
        if turns is not None and math.isfinite(turns):
            self.turns.append(turns)

    def summary(self) -> dict[str, Any]:
        if not self.total:
            return {}
        out: dict[str, Any] = {"count": self.total, "errors": self.errors}
        if self.rewards:
            out["reward"] = _mean_std(self.rewards)
        if self.metrics:
            out["metrics"] = {k: _mean_std(v) for k, v in self.metrics.items()}
        if self.turns:
            out["mean_turns"] = sum(self.turns) / len(self.turns)
        return out


def _mean_std(values: list[float]) -> dict[str, float]:
    mean = sum(values) / len(values)
    return {"mean": mean, "std": math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))}


def _read_results(
    path: Path, max_rollouts: int | None, warnings: list[str]
) -> tuple[list[dict[str, Any]], _Stats]:
    stats = _Stats()
    rows: list[dict[str, Any]] = []
    if not path.is_file():
        warnings.append("results.jsonl is missing: no rollouts to show")
        return rows, stats
    bad: list[str] = []
    with path.open("r", encoding="utf-8", errors="replace") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as exc:
                torn = "" if line.endswith("\n") else " (a torn last line: interrupted run?)"
                bad.append(f"results.jsonl line {lineno}: not valid JSON ({exc}){torn}; skipped")
                continue
            if not isinstance(row, dict):
                bad.append(f"results.jsonl line {lineno}: not a JSON object; skipped")
                continue
            stats.add(row)
            if max_rollouts is None or len(rows) < max_rollouts:
                rows.append(row)
    warnings.extend(bad[:_MAX_LINE_WARNINGS])
    if len(bad) > _MAX_LINE_WARNINGS:
        warnings.append(f"... and {len(bad) - _MAX_LINE_WARNINGS} more unreadable lines")
    return rows, stats


# ------------------------------------------------------------------------------------------
# images: each distinct one embedded once, as a CSS class


@dataclass
class _Asset:
    cls: str
    mime: str
    b64: str
    width: int
    height: int
    digest: str

    @property
    def full_style(self) -> str:
        w, h = self.width, self.height
        scale = max(1.0, FULL_MIN / max(w, h))
        return f"width:min({round(w * scale)}px,94vw,calc(86vh * {w} / {h}));aspect-ratio:{w} / {h}"

    @property
    def full_pixelated(self) -> bool:
        return max(self.width, self.height) < FULL_MIN


class _Assets:
    """Resolves image references to embedded assets (deduplicated by content)."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        self._by_ref: dict[str, _Asset | str] = {}  # reference -> asset, or why it failed
        self._by_digest: dict[str, _Asset] = {}

    def embedded(self) -> list[_Asset]:
        return list(self._by_digest.values())

    def css(self) -> str:
        # only our class names, a MIME type from a fixed table and base64: nothing to escape
        return "\n".join(
            f'.{a.cls}{{background-image:url("data:{a.mime};base64,{a.b64}")}}'
            for a in self._by_digest.values()
        )

    def view(self, ref: Any) -> dict[str, Any]:
        """What to draw for an image reference: an embedded asset, a remote link or a placeholder."""
        if not isinstance(ref, str) or not ref.strip():
            return {"type": "missing", "ref": _short(repr(ref)), "reason": "no image URL"}
        ref = ref.strip()
        if ref.lower().startswith(("http://", "https://")):
            return {"type": "remote", "url": ref}
        if ref not in self._by_ref:
            self._by_ref[ref] = self._load(ref)
        got = self._by_ref[ref]
        if isinstance(got, str):
            return {"type": "missing", "ref": _short(ref), "reason": got}
        tw, th, pix = _fit(got.width, got.height)
        return {"type": "asset", "asset": got, "w": tw, "h": th, "pixelated": pix}

    def _load(self, ref: str) -> _Asset | str:
        if ref.lower().startswith("data:"):
            data_or_err = _decode_data_url(ref)
        else:
            data_or_err = self._read_local(ref)
        if isinstance(data_or_err, str):
            return data_or_err
        data = data_or_err
        digest = hashlib.sha256(data).hexdigest()
        if digest in self._by_digest:
            return self._by_digest[digest]
        try:
            from PIL import Image

            with Image.open(io.BytesIO(data)) as im:
                im.load()
                width, height, fmt = im.width, im.height, im.format
                mime = _BROWSER_MIME.get(fmt or "")
                if mime is None:  # a format browsers do not show: convert it to PNG
                    buf = io.BytesIO()
                    im.save(buf, format="PNG")
                    data, mime = buf.getvalue(), "image/png"
        except Exception as exc:  # any decoder failure means: unreadable, show a placeholder
            return f"unreadable image ({type(exc).__name__}: {_short(str(exc), 120)})"
        if width < 1 or height < 1:
            return "empty image (0 pixels)"
        asset = _Asset(
            cls=f"a{len(self._by_digest)}",
            mime=mime,
            b64=base64.b64encode(data).decode("ascii"),
            width=width,
            height=height,
            digest=digest[:12],
        )
        self._by_digest[digest] = asset
        return asset

    def _read_local(self, ref: str) -> bytes | str:
        if ref.lower().startswith("file://"):
            rel = urllib.parse.unquote(urllib.parse.urlparse(ref).path)
        elif _SCHEME.match(ref) and not re.match(r"^[a-zA-Z]:[\\/]", ref):
            return f"unsupported URL scheme {ref.split(':', 1)[0]!r}"
        else:
            rel = ref
        try:
            path = (self.root / rel).resolve()
        except (OSError, RuntimeError, ValueError) as exc:
            return f"bad path ({exc})"
        if not path.is_relative_to(self.root):
            return "outside the run directory; not embedded"
        try:
            size = path.stat().st_size
            if size > ASSET_MAX_BYTES:
                return f"too large to embed ({size / 2**20:.1f} MiB)"
            return path.read_bytes()
        except FileNotFoundError:
            return "asset not found"
        except OSError as exc:
            return f"could not read it ({exc.strerror or exc})"


def _decode_data_url(ref: str) -> bytes | str:
    m = _DATA_URL.match(ref)
    if m is None:
        return "malformed data: URL"
    if not m.group(3):
        return "data: URL is not base64"
    try:
        return base64.b64decode(re.sub(r"\s+", "", urllib.parse.unquote(m.group(4))), validate=True)
    except (binascii.Error, ValueError):
        return "data: URL with invalid base64"


def _fit(w: int, h: int) -> tuple[int, int, bool]:
    scale = min(1.0, THUMB_MAX_W / w, THUMB_MAX_H / h)
    if max(w, h) * scale < THUMB_MIN:
        scale = THUMB_MIN / max(w, h)
    return max(1, round(w * scale)), max(1, round(h * scale)), scale > 1


# ------------------------------------------------------------------------------------------
# view models: plain dicts and strings; the template escapes every string


def _number(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, int | float):
        return None
    try:
        return float(x)
    except OverflowError:
        return math.inf if x > 0 else -math.inf


def _fmt(x: Any) -> str:
    if x is None:
        return "—"
    if isinstance(x, bool):
        return str(x).lower()
    if isinstance(x, int):
        return f"{x:,}" if abs(x) >= 10_000 else str(x)
    if isinstance(x, float):
        if math.isnan(x):
            return "NaN"
        if math.isinf(x):
            return "∞" if x > 0 else "-∞"
        if x.is_integer() and abs(x) < 1e15:
            return str(int(x))
        return f"{x:.4g}"
    if isinstance(x, str):
        return x
    return _json(x, indent=None)


def _fmt_stat(x: Any) -> str:
    if isinstance(x, dict) and "mean" in x:
        std = f" ± {_fmt(x['std'])}" if x.get("std") is not None else ""
        return f"{_fmt(x['mean'])}{std}"
    if isinstance(x, dict):
        return ", ".join(f"{k}: {_fmt_stat(v)}" for k, v in x.items())
    return _fmt(x)


def _json(x: Any, indent: int | None = 2) -> str:
    try:
        return json.dumps(x, indent=indent, ensure_ascii=False, default=repr)
    except (TypeError, ValueError):
        return repr(x)


def _plural(n: Any, word: str) -> str:
    return f"{n} {word}" if str(n) == "1" else f"{n} {word}s"


def _short(s: str, n: int = 200) -> str:
    return s if len(s) <= n else s[: n - 1] + "…"


def _text(s: Any) -> dict[str, Any]:
    """A text block: ``head`` always shown, ``tail`` behind "show more", ``omitted`` dropped."""
    s = s if isinstance(s, str) else _json(s)
    total = len(s)
    omitted = max(0, total - TEXT_MAX_CHARS)
    s = s[:TEXT_MAX_CHARS]
    cut = min(len(s), TEXT_PREVIEW_CHARS)
    newline = -1
    for _ in range(TEXT_PREVIEW_LINES):
        newline = s.find("\n", newline + 1)
        if newline < 0:
            break
    if newline >= 0:
        cut = min(cut, newline + 1)
    if cut >= len(s) - 200 and not omitted:  # not worth a fold for the last few characters
        cut = len(s)
    elif s[cut - 1] != "\n":  # end the preview at a line break or a space near the limit
        at = s.rfind("\n", cut - 300, cut)
        at = at if at > 0 else s.rfind(" ", cut - 80, cut)
        cut = at + 1 if at > 0 else cut
    return {"head": s[:cut], "tail": s[cut:], "omitted": omitted, "total": total}


def _part_views(content: Any, assets: _Assets) -> list[dict[str, Any]]:
    if content is None:
        return []
    if isinstance(content, str):
        return [{"kind": "text", "text": _text(content)}] if content else []
    if not isinstance(content, list):
        return [{"kind": "json", "text": _text(_json(content))}]
    views: list[dict[str, Any]] = []
    for part in content:
        if isinstance(part, str):
            views.append({"kind": "text", "text": _text(part)})
            continue
        if not isinstance(part, dict):
            views.append({"kind": "json", "text": _text(_json(part))})
            continue
        kind = part.get("type")
        if kind in ("text", "input_text", "output_text") and isinstance(part.get("text"), str):
            views.append({"kind": "text", "text": _text(part["text"])})
        elif kind in ("image_url", "input_image", "image"):
            ref = part.get("image_url", part.get("image"))
            if isinstance(ref, dict):
                ref = ref.get("url")
            views.append({"kind": "image", **assets.view(ref)})
        else:
            views.append({"kind": "json", "text": _text(_json(part))})
    return views


def _tool_call_view(call: Any) -> dict[str, Any]:
    if not isinstance(call, dict):
        return {"name": "?", "id": "", "args": _text(_json(call)), "invalid": True}
    fn = call.get("function") if isinstance(call.get("function"), dict) else call
    name, args = fn.get("name", "?"), fn.get("arguments")
    invalid = False
    if isinstance(args, str):
        try:
            args = _json(json.loads(args))
        except ValueError:
            invalid = True
    elif args is not None:
        args = _json(args)
    return {
        "name": _fmt(name),
        "id": _fmt(call.get("id") or ""),
        "args": _text(args if args is not None else ""),
        "invalid": invalid,
    }


def _messages(messages: Any, assets: _Assets, default_role: str) -> list[dict[str, Any]]:
    """Message views; a bare string (completion-format environments) is one message."""
    if messages is None:
        return []
    if isinstance(messages, str | dict):
        messages = [
            messages if isinstance(messages, dict) else {"role": default_role, "content": messages}
        ]
    if not isinstance(messages, list):
        messages = [{"role": default_role, "content": _json(messages)}]
    views = []
    for msg in messages:
        if not isinstance(msg, dict):
            msg = {"role": "?", "content": msg if isinstance(msg, str) else _json(msg)}
        role = str(msg.get("role", "?"))
        calls = msg.get("tool_calls")
        reasoning = msg.get("reasoning_content") or msg.get("reasoning")
        views.append(
            {
                "role": role,
                "role_class": role if role in _ROLES else "other",
                "name": _fmt(msg["name"]) if msg.get("name") else "",
                "tool_call_id": _fmt(msg["tool_call_id"]) if msg.get("tool_call_id") else "",
                "parts": _part_views(msg.get("content"), assets),
                "tool_calls": [_tool_call_view(c) for c in calls]
                if isinstance(calls, list)
                else [],
                "reasoning": _text(reasoning) if reasoning else None,
                "turn": None,
            }
        )
    return views


def _reward_view(reward: Any, lo: float, hi: float) -> dict[str, str]:
    r = _number(reward)
    if r is None:
        text = "no reward" if reward is None else _short(_fmt(reward), 24)
        return {"text": text, "class": "none", "style": "", "sort": ""}
    if not math.isfinite(r):
        return {"text": _fmt(r), "class": "nonfinite", "style": "", "sort": ""}
    t = (r - lo) / (hi - lo) if hi > lo else 1.0
    return {
        "text": _fmt(r),
        "class": "ok",
        "style": f"background:hsl({round(120 * t)} 62% 38%)",
        "sort": repr(r),
    }


def _card(i: int, row: dict[str, Any], assets: _Assets, lo: float, hi: float) -> dict[str, Any]:
    prompt = _messages(row.get("prompt"), assets, "user")
    completion = _messages(row.get("completion"), assets, "assistant")
    warnings = []
    images = 0
    for msg in prompt + completion:
        for part in msg["parts"]:
            if part["kind"] != "image":
                continue
            images += 1
            if "reason" in part:
                warnings.append(f"image {part['ref']}: {part['reason']} (placeholder shown)")
    turn = 0
    for msg in completion:
        if msg["role"] == "assistant":
            turn += 1
            msg["turn"] = turn
    metrics = row.get("metrics") if isinstance(row.get("metrics"), dict) else {}
    timing = row.get("timing") if isinstance(row.get("timing"), dict) else {}
    error = row.get("error")
    tokens = [
        f"{_fmt(row[k])} {label}"
        for k, label in (("prompt_tokens", "prompt"), ("completion_tokens", "completion"))
        if row.get(k) is not None
    ]
    info = row.get("info")
    answer = row.get("answer")
    return {
        "order": i,
        "dom_id": f"r{i}",
        "example_id": _fmt(row.get("example_id")) if "example_id" in row else "?",
        "rollout_index": _fmt(row.get("rollout_index")) if "rollout_index" in row else "",
        "reward": _reward_view(row.get("reward"), lo, hi),
        "metrics": [(str(k), _fmt(v)) for k, v in metrics.items()],
        "error": _text(error if isinstance(error, str) else _json(error)) if error else None,
        "answer": _text(answer) if answer not in (None, "") else None,
        "info": _text(_json(info)) if info not in (None, {}, []) else None,
        "num_turns": _fmt(row["num_turns"]) if row.get("num_turns") is not None else "",
        "tokens": " + ".join(tokens),
        "timing": [(str(k), _fmt(v)) for k, v in timing.items()],
        "prompt": prompt,
        "completion": completion,
        "images": images,
        "warnings": warnings,
    }


_CONFIG_FIRST = (
    "env_id",
    "env_args",
    "model",
    "backend",
    "num_examples",
    "rollouts_per_example",
    "sampling_args",
)


def _config_rows(metadata: dict[str, Any], config: dict[str, Any]) -> list[tuple[str, Any]]:
    rows: list[tuple[str, Any]] = []
    keys = [k for k in _CONFIG_FIRST if k in config] + [k for k in config if k not in _CONFIG_FIRST]
    for k in keys:
        v = config[k]
        rows.append((k, _text(_json(v)) if isinstance(v, dict | list) else _fmt(v)))
    for k in ("started_at", "finished_at", "vf_mm_version"):
        if k in metadata:
            v = metadata[k]
            if k == "finished_at" and v is None:
                v = "— (not finished: interrupted or still running)"
            rows.append((k, _fmt(v)))
    duration = _duration(metadata.get("started_at"), metadata.get("finished_at"))
    if duration:
        rows.append(("duration", duration))
    for k, v in metadata.items():
        if k not in ("config", "results", "started_at", "finished_at", "vf_mm_version"):
            rows.append((k, _text(_json(v)) if isinstance(v, dict | list) else _fmt(v)))
    return rows


def _duration(start: Any, end: Any) -> str:
    def parse(x: Any) -> float | None:
        if isinstance(x, int | float) and not isinstance(x, bool):
            return float(x)
        if isinstance(x, str):
            try:
                return datetime.fromisoformat(x.replace("Z", "+00:00")).timestamp()
            except ValueError:
                return None
        return None

    a, b = parse(start), parse(end)
    if a is None or b is None or b < a:
        return ""
    s = b - a
    return f"{s:.1f} s" if s < 120 else f"{int(s // 60)} min {int(s % 60)} s"


def _result_rows(results: dict[str, Any]) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    for k, v in results.items():
        if k == "metrics":
            continue
        if k == "pass_at_k" and isinstance(v, dict):
            rows.extend((f"pass@{kk}", _fmt(vv)) for kk, vv in v.items())
        elif k == "tokens" and isinstance(v, dict):
            rows.extend((f"tokens: {kk}", _fmt_stat(vv)) for kk, vv in v.items())
        elif k == "errors" and isinstance(results.get("count"), int) and isinstance(v, int):
            rows.append(("errors", f"{v} of {results['count']}"))
        else:
            rows.append((k, _fmt_stat(v)))
    return rows


def _metric_rows(results: dict[str, Any]) -> list[tuple[str, str, str]]:
    metrics = results.get("metrics")
    if not isinstance(metrics, dict):
        return []
    rows = []
    for name, v in metrics.items():
        if isinstance(v, dict):
            rows.append((str(name), _fmt(v.get("mean")), _fmt(v.get("std"))))
        else:
            rows.append((str(name), _fmt(v), ""))
    return rows


# ------------------------------------------------------------------------------------------
# page: template, CSS, JS (all inline; the script is pinned by its hash in the CSP)

_CSS = """
:root{--fg:#1d2330;--muted:#5f6b7a;--line:#dde2ea;--bg:#f4f6f9;--card:#fff;--err:#b42318;
--errbg:#fdecea;--warn:#8a5a00;--warnbg:#fff6db;--code:#f6f8fa}
*{box-sizing:border-box}
body{margin:0;font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:var(--fg);
background:var(--bg)}
main{max-width:1180px;margin:0 auto;padding:16px 20px 80px}
h1{font-size:20px;margin:4px 0 2px}
h2{font-size:15px;margin:0}
.sub{color:var(--muted);margin-bottom:12px;word-break:break-all}
.badge{display:inline-block;padding:1px 8px;border-radius:10px;font-size:12px;font-weight:600}
.badge.interrupted{background:var(--warnbg);color:var(--warn);border:1px solid #f0d48a}
.panels{display:grid;grid-template-columns:repeat(auto-fit,minmax(330px,1fr));gap:12px}
.panel{background:var(--card);border:1px solid var(--line);border-radius:8px;padding:10px 12px}
.panel h3{margin:0 0 6px;font-size:13px;text-transform:uppercase;letter-spacing:.04em;
color:var(--muted)}
table.kv{border-collapse:collapse;width:100%}
table.kv th,table.kv td{text-align:left;vertical-align:top;padding:3px 8px 3px 0;
border-top:1px solid var(--line)}
table.kv tr:first-child th,table.kv tr:first-child td{border-top:0}
table.kv th{font-weight:600;white-space:nowrap;color:var(--muted);width:1%}
table.kv td.num{font-variant-numeric:tabular-nums}
.warnings{background:var(--warnbg);color:var(--warn);border:1px solid #f0d48a;border-radius:8px;
padding:8px 12px 8px 28px;margin:12px 0}
.warnings li{margin:2px 0;word-break:break-word}
.controls{position:sticky;top:0;z-index:5;display:flex;flex-wrap:wrap;gap:14px;align-items:center;
background:var(--bg);padding:10px 0;border-bottom:1px solid var(--line);margin:14px 0 10px}
.controls[hidden]{display:none}
.controls label{display:flex;gap:6px;align-items:center}
.controls input[type=text]{width:170px;padding:3px 6px}
.controls .count{margin-left:auto;color:var(--muted)}
.card{background:var(--card);border:1px solid var(--line);border-radius:8px;margin:12px 0;
padding:10px 14px;scroll-margin-top:56px}
.card.has-error{border-color:#f1aca5;box-shadow:inset 4px 0 0 var(--err)}
.card[hidden]{display:none}
.card>header{display:flex;gap:10px;align-items:center;flex-wrap:wrap}
.card>header .meta{color:var(--muted)}
.card>header .anchor{margin-left:auto;color:var(--muted);text-decoration:none}
.reward{min-width:54px;text-align:center;color:#fff;border-radius:6px;padding:2px 8px;
font-weight:700;font-variant-numeric:tabular-nums}
.reward.none{background:#8d96a3}
.reward.nonfinite{background:#6b3fa0}
.chips{display:flex;flex-wrap:wrap;gap:6px;margin:8px 0 0;padding:0}
.chips li{list-style:none;background:var(--code);border:1px solid var(--line);border-radius:12px;
padding:0 8px;font-size:12.5px}
.chips b{font-weight:600;color:var(--muted)}
.error{background:var(--errbg);color:var(--err);border:1px solid #f1aca5;border-radius:6px;
padding:6px 10px;margin:8px 0}
.error>b{display:block}
.cardwarn{background:var(--warnbg);color:var(--warn);border-radius:6px;padding:4px 10px 4px 26px;
margin:8px 0}
.field{margin:8px 0}
.field>b{color:var(--muted);font-weight:600;margin-right:6px}
.text{white-space:pre-wrap;word-break:break-word;margin:0;font:inherit}
.mono,.text.mono{font:12.5px/1.45 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
pre.text,.field .text{background:var(--code);border:1px solid var(--line);border-radius:6px;
padding:6px 8px}
details.more>summary{cursor:pointer;color:#1a5fb4;font-size:12.5px;list-style:none;margin:2px 0}
details.more>summary::before{content:"▸ "}
details.more[open]>summary::before{content:"▾ "}
details.more[open]>summary .closed{display:none}
details.more:not([open])>summary .opened{display:none}
.omitted{color:var(--muted);font-style:italic}
details.block{margin:8px 0}
details.block>summary{cursor:pointer;color:var(--muted);font-weight:600}
.turns{margin-top:8px;display:flex;flex-direction:column;gap:6px}
.sep{color:var(--muted);font-size:12px;text-transform:uppercase;letter-spacing:.05em;
border-top:1px dashed var(--line);padding-top:4px;margin-top:4px}
.msg{border:1px solid var(--line);border-left-width:4px;border-radius:6px;padding:6px 10px;
background:#fff}
.msg .role{font-size:11.5px;font-weight:700;text-transform:uppercase;letter-spacing:.05em;
margin-bottom:3px}
.msg .role small{font-weight:400;text-transform:none;letter-spacing:0;color:var(--muted);
margin-left:6px}
.msg.system{border-left-color:#8d96a3;background:#fafbfc}.msg.system .role{color:#5f6b7a}
.msg.developer{border-left-color:#8d96a3;background:#fafbfc}.msg.developer .role{color:#5f6b7a}
.msg.user{border-left-color:#3b82f6}.msg.user .role{color:#1d4ed8}
.msg.assistant{border-left-color:#16a34a;background:#f7fcf8}.msg.assistant .role{color:#15803d}
.msg.tool{border-left-color:#d97706;background:#fffaf2}.msg.tool .role{color:#b45309}
.msg.other{border-left-color:#a855f7}.msg.other .role{color:#7e22ce}
.parts{display:flex;flex-direction:column;gap:6px}
.images{display:flex;flex-wrap:wrap;gap:8px;align-items:flex-start}
.thumb{display:inline-block;border:1px solid var(--line);border-radius:4px;line-height:0;
background:repeating-conic-gradient(#eee 0 25%,#fff 0 50%) 0 0/16px 16px}
.img{display:inline-block;background-size:contain;background-repeat:no-repeat;
background-position:center}
.img.pix{image-rendering:pixelated}
.img-missing,.img-remote{display:inline-flex;flex-direction:column;justify-content:center;gap:2px;
min-width:160px;min-height:90px;padding:8px;border:2px dashed #d0a14a;border-radius:6px;
background:var(--warnbg);color:var(--warn);font-size:12px;word-break:break-all;max-width:320px}
.img-remote{border-color:#9aa5b4;background:#f3f5f8;color:var(--muted)}
.toolcall{border:1px solid #c7e3cf;background:#fff;border-radius:6px;padding:4px 8px}
.toolcall .fn{font-weight:700;font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
.toolcall .id{color:var(--muted);font-size:12px;margin-left:6px}
.toolcall .bad{color:var(--err);font-size:12px;margin-left:6px}
details.reasoning{border:1px dashed #b9c2ce;border-radius:6px;padding:3px 8px;background:#fbfbfd}
details.reasoning>summary{cursor:pointer;color:var(--muted);font-style:italic}
.empty{color:var(--muted);font-style:italic}
.lightbox{display:none;position:fixed;inset:0;z-index:50;background:rgba(15,20,30,.86);
align-items:center;justify-content:center;flex-direction:column;gap:8px}
.lightbox:target,.lightbox.open{display:flex}
.lightbox .lb-close{position:absolute;inset:0;cursor:zoom-out}
.lightbox .img{position:relative;background-color:#fff;pointer-events:none}
.lightbox .cap{position:relative;color:#dfe5ee;font-size:12px;pointer-events:none}
#selftest{display:none}
"""

_JS = r"""
(function () {
  "use strict";
  var list = document.getElementById("cards");
  var cards = Array.prototype.slice.call(document.querySelectorAll("#cards > article.card"));
  var controls = document.getElementById("controls");
  var sortSel = document.getElementById("sort");
  var errOnly = document.getElementById("errors-only");
  var exFilter = document.getElementById("example-filter");
  var countEl = document.getElementById("shown-count");
  controls.hidden = false;

  function reward(c) {
    var v = c.getAttribute("data-reward");
    return v === "" ? null : parseFloat(v);
  }
  function order(c) { return +c.getAttribute("data-order"); }
  function sortCards(mode) {
    var s = cards.slice();
    if (mode === "asc" || mode === "desc") {
      var sign = mode === "asc" ? 1 : -1;
      s.sort(function (a, b) {
        var x = reward(a), y = reward(b);
        if (x === null || y === null) {
          if (x === null && y === null) return order(a) - order(b);
          return x === null ? 1 : -1;  // no / non-finite reward: always last
        }
        return sign * (x - y) || order(a) - order(b);
      });
    } else {
      s.sort(function (a, b) { return order(a) - order(b); });
    }
    s.forEach(function (c) { list.appendChild(c); });
  }
  function filterCards() {
    var ids = exFilter.value.split(",").map(function (x) { return x.trim(); })
      .filter(function (x) { return x !== ""; });
    var shown = 0;
    cards.forEach(function (c) {
      var ok = (!errOnly.checked || c.hasAttribute("data-error")) &&
        (ids.length === 0 || ids.indexOf(c.getAttribute("data-example")) >= 0);
      c.hidden = !ok;
      if (ok) shown++;
    });
    countEl.textContent = shown + " of " + cards.length + " rollouts shown";
  }
  sortSel.addEventListener("change", function () { sortCards(sortSel.value); });
  errOnly.addEventListener("change", filterCards);
  exFilter.addEventListener("input", filterCards);
  filterCards();

  // lightbox: open without touching the URL (the :target fallback works without JS)
  function closeAll() {
    document.querySelectorAll(".lightbox.open").forEach(function (b) { b.classList.remove("open"); });
  }
  document.addEventListener("click", function (e) {
    var a = e.target.closest("a.thumb");
    if (a) {
      var box = document.getElementById(a.getAttribute("href").slice(1));
      if (box) { e.preventDefault(); closeAll(); box.classList.add("open"); }
      return;
    }
    if (e.target.closest(".lightbox.open")) { e.preventDefault(); closeAll(); }
  });
  document.addEventListener("keydown", function (e) { if (e.key === "Escape") closeAll(); });

  // #selftest: decode every image shown in the cards, exercise sort and filter, report
  if (location.hash !== "#selftest") return;
  var decoded = {};
  function decodes(url) {
    if (!(url in decoded)) {
      decoded[url] = new Promise(function (resolve) {
        var im = new Image();
        im.onload = function () { resolve(im.naturalWidth); };
        im.onerror = function () { resolve(0); };
        im.src = url;
      });
    }
    return decoded[url];
  }
  var occ = Array.prototype.slice.call(document.querySelectorAll("#cards .imgocc"));
  var jobs = occ.filter(function (el) { return el.hasAttribute("data-asset"); }).map(function (el) {
    var m = /^url\("?(.*?)"?\)$/.exec(getComputedStyle(el).backgroundImage);
    return m ? decodes(m[1]) : Promise.resolve(0);
  });
  Promise.all(jobs).then(function (widths) {
    function ids() { return cards.filter(function (c) { return !c.hidden; })
      .map(function (c) { return c.id; }); }
    function domOrder() { return Array.prototype.map.call(list.children, function (c) { return c.id; }); }
    sortCards("desc"); var desc = domOrder();
    sortCards("asc"); var asc = domOrder();
    sortCards("file");
    errOnly.checked = true; filterCards(); var errors = ids();
    errOnly.checked = false; filterCards();
    var out = document.createElement("pre");
    out.id = "selftest";
    out.textContent = JSON.stringify({
      images: occ.length,
      loaded: widths.filter(function (w) { return w > 0; }).length,
      missing: document.querySelectorAll("#cards .img-missing").length,
      remote: document.querySelectorAll("#cards .img-remote").length,
      cards: cards.length,
      sorted_desc: desc, sorted_asc: asc, errors_only: errors
    });
    document.body.appendChild(out);
  });
})();
"""

_CSP = (
    "default-src 'none'; img-src data:; style-src 'unsafe-inline'; "
    f"script-src 'sha256-{base64.b64encode(hashlib.sha256(_JS.encode()).digest()).decode()}'; "
    "base-uri 'none'; form-action 'none'"
)

_TEMPLATE = r"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{{ csp }}">
<meta name="referrer" content="no-referrer">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="vf-mm view">
<title>{{ title }} — vf-mm report</title>
<style>{{ css }}</style>
<style id="asset-css">
{{ asset_css }}
</style>
</head>
<body>
{%- macro text(t, cls="") -%}
<div class="text {{ cls }}">{{ t.head }}{% if t.tail %}<details class="more"><summary><span class="closed">show more ({{ "{:,}".format(t.tail|length) }} more characters)</span><span class="opened">show less</span></summary>{{ t.tail }}</details>{% endif %}{% if t.omitted %}<span class="omitted"> [… {{ "{:,}".format(t.omitted) }} more characters not included in this report]</span>{% endif %}</div>
{%- endmacro -%}
{%- macro message(m) -%}
<div class="msg {{ m.role_class }}">
<div class="role">{{ m.role }}{% if m.turn %}<small>turn {{ m.turn }}</small>{% endif %}{% if m.name %}<small>{{ m.name }}</small>{% endif %}{% if m.tool_call_id %}<small>↩ {{ m.tool_call_id }}</small>{% endif %}</div>
<div class="parts">
{% if m.reasoning %}<details class="reasoning"><summary>reasoning ({{ "{:,}".format(m.reasoning.total) }} characters)</summary>{{ text(m.reasoning) }}</details>{% endif %}
{% set ns = namespace(open=false) %}
{% for p in m.parts %}
{% if p.kind == "image" %}{% if not ns.open %}<div class="images">{% set ns.open = true %}{% endif %}
{% if p.type == "asset" %}<a class="thumb" href="#view-{{ p.asset.cls }}" title="{{ p.asset.width }}&times;{{ p.asset.height }}: click to enlarge"><span class="img imgocc {{ p.asset.cls }}{% if p.pixelated %} pix{% endif %}" data-asset="{{ p.asset.cls }}" role="img" aria-label="image {{ p.asset.width }}&times;{{ p.asset.height }}" style="width:{{ p.w }}px;height:{{ p.h }}px"></span></a>
{% elif p.type == "remote" %}<span class="imgocc img-remote"><b>remote image (not embedded)</b><a href="{{ p.url }}" rel="noreferrer noopener" target="_blank">{{ p.url }}</a></span>
{% else %}<span class="imgocc img-missing" role="img" aria-label="missing image"><b>⚠ image unavailable</b><span>{{ p.ref }}</span><span>{{ p.reason }}</span></span>
{% endif %}
{% else %}{% if ns.open %}</div>{% set ns.open = false %}{% endif %}
{% if p.kind == "text" %}{{ text(p.text) }}{% else %}{{ text(p.text, "mono") }}{% endif %}
{% endif %}
{% endfor %}
{% if ns.open %}</div>{% endif %}
{% for c in m.tool_calls %}
<div class="toolcall"><span class="fn">{{ c.name }}</span>{% if c.id %}<span class="id">{{ c.id }}</span>{% endif %}{% if c.invalid %}<span class="bad">arguments are not valid JSON</span>{% endif %}{{ text(c.args, "mono") }}</div>
{% endfor %}
{% if not m.parts and not m.tool_calls and not m.reasoning %}<span class="empty">(empty)</span>{% endif %}
</div>
</div>
{%- endmacro %}
<main>
<h1>{{ title }}</h1>
<div class="sub">{{ outdir }}{% if interrupted %} <span class="badge interrupted">unfinished run</span>{% endif %}</div>
<div class="panels">
<section class="panel"><h3>Run</h3>
{% if config_rows %}<table class="kv">{% for k, v in config_rows %}<tr><th>{{ k }}</th><td>{% if v is mapping %}{{ text(v, "mono") }}{% else %}{{ v }}{% endif %}</td></tr>{% endfor %}</table>
{% else %}<p class="empty">no run config (metadata.json missing or empty)</p>{% endif %}
</section>
<section class="panel"><h3>Results{% if results_computed %} <small>(computed from results.jsonl)</small>{% endif %}</h3>
{% if result_rows %}<table class="kv" id="aggregates">{% for k, v in result_rows %}<tr><th>{{ k }}</th><td class="num">{{ v }}</td></tr>{% endfor %}</table>
{% else %}<p class="empty">no aggregates</p>{% endif %}
{% if metric_rows %}<h3 style="margin-top:10px">Metrics</h3><table class="kv" id="metrics"><tr><th>metric</th><th>mean</th><th>std</th></tr>{% for n, mean, std in metric_rows %}<tr><td>{{ n }}</td><td class="num">{{ mean }}</td><td class="num">{{ std }}</td></tr>{% endfor %}</table>{% endif %}
</section>
</div>
{% if warnings %}<ul class="warnings" id="warnings">{% for w in warnings %}<li>{{ w }}</li>{% endfor %}</ul>{% endif %}
<div class="controls" id="controls" hidden>
<label>sort <select id="sort"><option value="file">file order</option><option value="desc">reward: high → low</option><option value="asc">reward: low → high</option></select></label>
<label><input type="checkbox" id="errors-only"> errors only</label>
<label>example id <input type="text" id="example-filter" placeholder="e.g. 3, 7"></label>
<span class="count" id="shown-count"></span>
</div>
<div id="cards">
{% for c in cards %}
<article class="card{% if c.error %} has-error{% endif %}" id="{{ c.dom_id }}" data-order="{{ c.order }}" data-reward="{{ c.reward.sort }}" data-example="{{ c.example_id }}"{% if c.error %} data-error{% endif %}>
<header><span class="reward {{ c.reward.class }}"{% if c.reward.style %} style="{{ c.reward.style }}"{% endif %} title="reward">{{ c.reward.text }}</span>
<h2>example {{ c.example_id }}{% if c.rollout_index %} · rollout {{ c.rollout_index }}{% endif %}</h2>
<span class="meta">{% if c.num_turns %}{{ c.num_turns|plural("turn") }}{% endif %}{% if c.tokens %} · {{ c.tokens }} tokens{% endif %}{% if c.images %} · {{ c.images|plural("image") }}{% endif %}</span>
<a class="anchor" href="#{{ c.dom_id }}">#{{ c.order }}</a></header>
{% if c.metrics %}<ul class="chips">{% for k, v in c.metrics %}<li><b>{{ k }}</b> {{ v }}</li>{% endfor %}</ul>{% endif %}
{% if c.error %}<div class="error"><b>error</b>{{ text(c.error, "mono") }}</div>{% endif %}
{% if c.warnings %}<ul class="cardwarn">{% for w in c.warnings %}<li>{{ w }}</li>{% endfor %}</ul>{% endif %}
{% if c.answer %}<div class="field"><b>answer</b>{{ text(c.answer, "mono") }}</div>{% endif %}
{% if c.info or c.timing %}<details class="block"><summary>info{% if c.timing %} &amp; timing{% endif %}</summary>
{% if c.timing %}<ul class="chips">{% for k, v in c.timing %}<li><b>{{ k }}</b> {{ v }}</li>{% endfor %}</ul>{% endif %}
{% if c.info %}<div class="field">{{ text(c.info, "mono") }}</div>{% endif %}
</details>{% endif %}
<div class="turns">
{% if c.prompt %}<details class="block" open><summary>prompt ({{ c.prompt|length|plural("message") }})</summary><div class="turns">
{% for m in c.prompt %}{{ message(m) }}
{% endfor %}</div></details>{% endif %}
<div class="sep">completion</div>
{% for m in c.completion %}{{ message(m) }}
{% else %}<p class="empty">(no completion)</p>
{% endfor %}
</div>
</article>
{% else %}
<p class="empty" id="no-rollouts">No rollouts{% if total %} shown{% else %} in results.jsonl{% endif %}.</p>
{% endfor %}
</div>
</main>
{% for a in assets %}
<div class="lightbox" id="view-{{ a.cls }}" role="dialog" aria-label="image {{ a.width }}&times;{{ a.height }}"><a class="lb-close" href="#close" aria-label="close"></a><span class="img {{ a.cls }}{% if a.full_pixelated %} pix{% endif %}" style="{{ a.full_style }}"></span><div class="cap">{{ a.width }}&times;{{ a.height }} · {{ a.mime }} · sha256 {{ a.digest }}… · click or Esc to close</div></div>
{% endfor %}
<script>{{ js }}</script>
</body>
</html>
"""


@functools.cache
def _template() -> jinja2.Template:
    env = jinja2.Environment(
        autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True
    )
    env.filters["plural"] = _plural
    return env.from_string(_TEMPLATE)
