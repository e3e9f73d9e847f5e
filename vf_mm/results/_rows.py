"""A rollout as one ``results.jsonl`` row: ``build_row``.

The row's keys and meaning are the results format (``_format.py``). A rollout's content
that cannot be stored as it is (an image or a video that does not load, a value JSON
cannot hold, in its messages, answer or info) does not lose the rollout: the row is
built again in record mode, those values replaced by ``unavailable`` records saying
why, its ``error`` set and its reward null. What the caller got wrong (a malformed
reward, metrics or ``extra``) raises ``ResultsError`` instead: that is a bug to fix,
not content to record.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vf_mm._json import to_json_value
from vf_mm.errors import ImageError, ResultsError, VideoError
from vf_mm.results._asset_messages import unavailable
from vf_mm.results._assets import AssetStore
from vf_mm.results._format import ROW_KEYS, Key, _number
from vf_mm.types import RolloutError, RolloutOutput


def build_row(
    output: RolloutOutput,
    key: Key,
    extra: Mapping[str, Any] | None,
    *,
    assets: AssetStore,
) -> dict[str, Any]:
    """The row for ``output`` under ``key``, its images and videos stored in ``assets``
    first; in record mode when its content cannot be stored as it is (module docstring).
    Raises ``ResultsError`` for malformed metrics, reward or error, or ``extra`` keys
    that clash with ``ROW_KEYS``."""
    try:
        return _row(output, key, extra, assets=assets)
    except _ContentError as exc:
        return _row(output, key, extra, assets=assets, failure=exc.cause)


def _row(
    output: RolloutOutput,
    key: Key,
    extra: Mapping[str, Any] | None,
    *,
    assets: AssetStore,
    failure: BaseException | None = None,
) -> dict[str, Any]:
    """The row for ``output``; ``failure`` (why the content could not be stored as it
    is) builds it in record mode, with that as the error when the rollout had none."""
    where = f"example {key[0]!r} rollout {key[1]}"
    record = failure is not None
    prompt = _messages(assets, output.prompt, f"{where}, prompt", record=record)
    completion = _messages(assets, output.completion, f"{where}, completion", record=record)
    metrics = output.metrics if output.metrics is not None else {}
    if not isinstance(metrics, Mapping):
        raise ResultsError(f"{where}, field 'metrics': must be a dict of numbers")
    for name in metrics:
        if not isinstance(name, str):
            raise ResultsError(f"{where}, field 'metrics': key {name!r} is not a str")
    error = output.error
    try:
        error = RolloutError.from_value(error)
    except TypeError as exc:
        raise ResultsError(f"{where}, field 'error': {exc}") from None
    if failure is not None and error is None:
        error = RolloutError.from_exception(failure, where="storing the rollout")
    answer, info = (
        (_stored(output.answer, where, "answer"), _stored(output.info, where, "info"))
        if record
        else (_json(output.answer, where, "answer"), _json(output.info, where, "info"))
    )
    num_turns, prompt_tokens, completion_tokens = _turns_and_tokens(output)
    row: dict[str, Any] = {
        "example_id": key[0],
        "rollout_index": key[1],
        "prompt": prompt,
        "completion": completion,
        "answer": answer,
        "info": info if info is not None else {},
        "reward": None if record else _number(output.reward, where, "reward"),
        "metrics": {k: _number(v, where, f"metrics.{k}") for k, v in metrics.items()},
        "error": error.to_dict() if error is not None else None,
        "truncated": bool(getattr(output, "truncated", False)),
        "num_turns": num_turns,
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "timing": to_json_value(
            output.timing if output.timing is not None else {}, where, "timing"
        ),
    }
    if extra:
        if not isinstance(extra, Mapping):
            raise ResultsError(f"{where}: extra must be a dict, not {type(extra).__name__}")
        for name, value in extra.items():
            if not isinstance(name, str):
                raise ResultsError(f"{where}: extra key {name!r} is not a str")
            if name in row:
                raise ResultsError(
                    f"{where}: extra key {name!r} clashes with a results.jsonl field "
                    f"({', '.join(ROW_KEYS)})"
                )
            row[name] = to_json_value(value, where, name)
    return row


def _messages(
    assets: AssetStore, messages: Any, where: str, *, record: bool
) -> list[dict[str, Any]]:
    if messages is None:
        return []
    if record:
        return assets.to_jsonable(messages, where=where, on_error="record")
    try:
        return assets.to_jsonable(messages, where=where)
    except (ImageError, VideoError) as exc:
        if exc.where is None:
            exc.where = where
        raise _ContentError(exc) from exc
    except ResultsError as exc:
        raise _ContentError(exc) from exc


def _json(value: Any, where: str, path: str) -> Any:
    try:
        return to_json_value(value, where, path)
    except ResultsError as exc:
        raise _ContentError(exc) from exc


def _stored(value: Any, where: str, path: str) -> Any:
    """``value`` as JSON, or an ``unavailable`` record of why it is not."""
    try:
        return to_json_value(value, where, path)
    except ResultsError as exc:
        return unavailable(value, exc)


def _turns_and_tokens(output: RolloutOutput) -> tuple[int, int | None, int | None]:
    """``num_turns`` = trajectory steps (or assistant messages when there is no
    trajectory); token counts = sums over the steps' prompt and completion ids, None when
    there is no trajectory or a step has no tokens (an API backend)."""
    steps = output.trajectory or []
    if steps:
        num_turns = len(steps)
    else:
        num_turns = sum(
            1
            for m in output.completion or []
            if isinstance(m, Mapping) and m.get("role") == "assistant"
        )
    if not steps or any(step.tokens is None for step in steps):
        return num_turns, None, None
    tokens = [step.tokens for step in steps if step.tokens is not None]  # all of them: checked
    prompt_tokens = sum(len(t.prompt_ids) for t in tokens)
    completion_tokens = sum(len(t.completion_ids) for t in tokens)
    return num_turns, prompt_tokens, completion_tokens


class _ContentError(Exception):
    """A rollout's content that cannot be stored as it is: ``build_row`` builds the row
    again in record mode."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause
