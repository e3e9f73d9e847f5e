"""What the page shows of each value: view models (plain dicts and strings; the template
escapes every string) and the formatting of numbers, JSON and long text."""

from __future__ import annotations

import json
import math
from datetime import datetime
from typing import Any

from vf_mm._text import shorten
from vf_mm.report._assets import AssetViews
from vf_mm.types import RolloutError

_ROLES = {"system", "developer", "user", "assistant", "tool"}

#: text longer than this (characters or lines) shows a preview and a "show more"
TEXT_PREVIEW_CHARS = 2000
TEXT_PREVIEW_LINES = 40
#: text past this many characters is left out of the report (and the count said)
TEXT_MAX_CHARS = 200_000


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


def _part_views(content: Any, assets: AssetViews) -> list[dict[str, Any]]:
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
        elif kind in ("video_url", "video"):
            ref = part.get("video_url", part.get("video", part.get("url", part.get("path"))))
            if isinstance(ref, dict):
                ref = ref.get("url")
            view = assets.video_view(ref, frame_rate=part.get("frame_rate"))
            views.append({"kind": "video", **view, **_video_caption(view, part)})
        else:
            views.append({"kind": "json", "text": _text(_json(part))})
    return views


def _video_caption(view: dict[str, Any], part: dict[str, Any]) -> dict[str, Any]:
    """What the caption under a video's strip says: frames, rate, size, container, and
    the part's processing options (how the model sampled it)."""
    options = [
        f"{key} {_fmt(part[key])}"
        for key in ("fps", "num_frames", "min_pixels", "max_pixels", "do_sample_frames")
        if key in part
    ]
    if view["type"] != "asset":
        return {"options": ", ".join(options)}
    video = view["video"]
    size = f"{video.width}×{video.height}"  # noqa: RUF001
    facts = [_plural(video.num_frames, "frame"), video.rate_text, size, video.container]
    return {"caption": " · ".join(facts), "options": ", ".join(options)}


def _tool_call_view(call: Any) -> dict[str, Any]:
    if not isinstance(call, dict):
        return {"name": "?", "id": "", "args": _text(_json(call)), "invalid": True}
    inner = call.get("function")
    fn: dict[str, Any] = inner if isinstance(inner, dict) else call
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


def _messages(messages: Any, assets: AssetViews, default_role: str) -> list[dict[str, Any]]:
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
        text = "no reward" if reward is None else shorten(_fmt(reward), 24)
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


def _card(i: int, row: dict[str, Any], assets: AssetViews, lo: float, hi: float) -> dict[str, Any]:
    prompt = _messages(row.get("prompt"), assets, "user")
    completion = _messages(row.get("completion"), assets, "assistant")
    warnings = []
    images = videos = 0
    for msg in prompt + completion:
        for part in msg["parts"]:
            if part["kind"] not in ("image", "video"):
                continue
            if part["kind"] == "image":
                images += 1
            else:
                videos += 1
            if "reason" in part:
                warnings.append(
                    f"{part['kind']} {part['ref']}: {part['reason']} (placeholder shown)"
                )
    turn = 0
    for msg in completion:
        if msg["role"] == "assistant":
            turn += 1
            msg["turn"] = turn
    metrics: dict[str, Any] = row["metrics"] if isinstance(row.get("metrics"), dict) else {}
    timing: dict[str, Any] = row["timing"] if isinstance(row.get("timing"), dict) else {}
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
        "error": _text(_error_line(error)) if error else None,
        "answer": _text(answer) if answer not in (None, "") else None,
        "info": _text(_json(info)) if info not in (None, {}, []) else None,
        "num_turns": _fmt(row["num_turns"]) if row.get("num_turns") is not None else "",
        "tokens": " + ".join(tokens),
        "timing": [(str(k), _fmt(v)) for k, v in timing.items()],
        "prompt": prompt,
        "completion": completion,
        "images": images,
        "videos": videos,
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
            rows.extend(
                (f"tokens: {kk}", _fmt_stat(vv))
                for kk, vv in v.items()
                if not (kk == "rows_without_tokens" and vv == 0)
            )
        elif k == "error_kinds" and isinstance(v, dict):
            rows.extend(
                (f"{kind.get('count')} × {name}", shorten(str(kind.get("first", "")), 200))  # noqa: RUF001
                for name, kind in v.items()
                if isinstance(kind, dict)
            )
        elif k == "pass_threshold":
            rows.append(("pass@k counts rewards ≥", _fmt(v)))
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


def _error_line(error: Any) -> str:
    """A row's error as one line (``"Type: message (where)"``); a value that is not an error
    record (a file another tool wrote) as its JSON."""
    try:
        return str(RolloutError.from_value(error))
    except TypeError:
        return error if isinstance(error, str) else _json(error)
