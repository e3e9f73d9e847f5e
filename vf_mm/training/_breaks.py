"""``history_break``: why a rollout's turns do not make one token sequence, in words.

A rollout's steps merge into one sample only while each turn's prompt tokens start with
the previous turn's prompt and completion tokens (``build_samples``). Where they do not,
either the environment changed the conversation (it rewrote, cut or compacted earlier
messages), or the conversation was kept and the chat template renders it otherwise than
the tokens the model saw and sampled. The second is the common one and is not the
environment's doing: a model that stops on a token the template does not close its
turns with (Qwen2.5-VL ending on ``<|endoftext|>`` where the template writes
``<|im_end|>``), a template that trims the model's leading whitespace (Gemma 4's) or
re-tokenizes its text, or one that renders an earlier turn's frame otherwise (Qwen3.5's
empty ``<think>`` block). Blaming the environment for those sends users looking in the
wrong place, so the first break is located at its token: whether it is inside a span the
model sampled (the template re-renders the model's own turn) or not, and, where the
steps carry their messages, whether the messages themselves were kept.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from vf_mm.training._samples import _extends, _steps


def history_break(rollout: Any, *, decode: Callable[[list[int]], str] | None = None) -> str | None:
    """Why the first turn of ``rollout`` whose prompt does not extend the turn before it
    breaks the token sequence; None when every turn extends the one before.

    The sentence names the first differing token position (in the later turn's prompt),
    the token the earlier turn had there and the one the later prompt has (decoded with
    ``decode``, e.g. a tokenizer's ``decode``, else as ids), the model turn or the span
    between turns it falls in, and the cause: inside a sampled span, the template
    re-renders the model's own turn (with the likely reason and the fix); outside, the
    environment rewrote the history when the messages changed, else the template renders
    the text around a turn otherwise.

    Args:
        rollout: What ``build_samples`` takes: an object or dict with ``trajectory`` /
            ``steps`` whose entries have token fields (and, optionally, their ``prompt``
            and ``completion`` messages).
        decode: Token ids to text, to show the two tokens.
    """
    steps = _steps(rollout)
    k = next((i for i in range(1, len(steps)) if not _extends(steps[i - 1], steps[i])), None)
    if k is None:
        return None
    head = steps[k - 1]["prompt_ids"] + steps[k - 1]["completion_ids"]
    new = steps[k]["prompt_ids"]
    p = next((i for i, (a, b) in enumerate(zip(head, new, strict=False)) if a != b), len(new))

    def show(ids: Sequence[int], i: int) -> str:
        if i >= len(ids):
            return "nothing (the sequence ends there)"
        text = f"{decode([ids[i]])!r} " if decode is not None else ""
        return f"{text}(id {ids[i]})"

    where = f"turn {k + 1}'s prompt differs from turn {k}'s tokens at position {p}: "
    tokens = f"turn {k} has {show(head, p)}, turn {k + 1}'s prompt {show(new, p)}"
    turn = _sampled_turn(steps[:k], p)
    if turn is not None:
        j, first, last = turn
        reason = _reason(head, new, p, first, last, decode)
        return (
            f"{where}inside model turn {j + 1}'s sampled tokens ({tokens}): the template "
            f"re-renders the model's own turn: {reason}"
        )
    changed = _changed_message(rollout, k)
    if changed is not None:
        return (
            f"{where}outside the model's sampled tokens ({tokens}), and {changed}: the "
            "environment rewrote the history"
        )
    span = _between(steps[:k], p)
    kept = "the messages were kept, so " if _has_messages(rollout, k) else ""
    return (
        f"{where}{span}, outside the model's sampled tokens ({tokens}): {kept}the template "
        "renders the text around a turn (a turn's opening or closing, its generation "
        "prompt) otherwise once later turns exist, or the environment rewrote the history; "
        "fix: a template that renders earlier turns as it prompted them"
    )


def _sampled_turn(steps: Sequence[dict[str, Any]], p: int) -> tuple[int, int, int] | None:
    """The turn (index) whose sampled span holds position ``p`` of the merged sequence,
    and that span's first and last sampled positions."""
    for j, step in enumerate(steps):
        begin = len(step["prompt_ids"])
        sampled = [begin + i for i, m in enumerate(step["completion_mask"]) if m]
        if p in sampled:
            return j, sampled[0], sampled[-1]
    return None


def _between(steps: Sequence[dict[str, Any]], p: int) -> str:
    """Where position ``p`` (not sampled) lies among the turns."""
    ends = [len(s["prompt_ids"]) + len(s["completion_ids"]) for s in steps]
    before = sum(1 for end in ends if end <= p)
    if before == 0:
        return "in the first prompt, before model turn 1"
    return f"after model turn {before} (the environment's messages and the next turn's opening)"


def _reason(
    head: Sequence[int],
    new: Sequence[int],
    p: int,
    first: int,
    last: int,
    decode: Callable[[list[int]], str] | None,
) -> str:
    """The likely reason a sampled token at ``p`` (of a span from ``first`` to ``last``)
    re-renders otherwise, with the fix."""
    if p == last:
        return (
            "the model ended its turn with a token the template does not close turns with "
            "(it stopped on an end token other than the template's); fix: stop tokens: make "
            "the template's turn end the sampler's stop token (sampling stop_token_ids, or "
            "the checkpoint's generation_config eos_token_id)"
        )
    sampled = decode([head[p]]) if decode is not None else None
    rendered = decode([new[p]]) if decode is not None and p < len(new) else None
    trimmed = rendered is None or not rendered[:1].isspace()
    if p == first and sampled is not None and sampled[:1].isspace() and trimmed:
        return (
            "the template trims the leading whitespace the model sampled; fix: a "
            "template that keeps the model's text verbatim, or train each turn as its "
            "own sequence (a trainer that takes several per rollout)"
        )
    return (
        "the template writes the model's text otherwise than it was sampled (it edits it, "
        "or its text re-tokenizes differently); fix: a template that keeps the model's "
        "text verbatim, or train each turn as its own sequence"
    )


def _messages(rollout: Any, i: int) -> tuple[list[Any], list[Any]] | None:
    """Step ``i``'s prompt and completion messages, when the rollout carries them."""
    raw = (
        rollout.get("steps") or rollout.get("trajectory")
        if isinstance(rollout, dict)
        else getattr(rollout, "trajectory", None)
    )
    if raw is None:
        return None
    step = raw[i]
    get = step.get if isinstance(step, dict) else lambda name: getattr(step, name, None)
    prompt, completion = get("prompt"), get("completion")
    if not prompt:
        return None
    return list(prompt), list(completion or [])


def _has_messages(rollout: Any, k: int) -> bool:
    return _messages(rollout, k - 1) is not None and _messages(rollout, k) is not None


def _changed_message(rollout: Any, k: int) -> str | None:
    """How turn ``k``'s prompt messages fail to extend turn ``k - 1``'s prompt and
    completion; None when they extend them or the rollout carries no messages."""
    earlier, later = _messages(rollout, k - 1), _messages(rollout, k)
    if earlier is None or later is None:
        return None
    history = earlier[0] + earlier[1]
    for i, message in enumerate(history):
        if i >= len(later[0]):
            return f"the prompt dropped messages from message {i} on"
        if not _same(message, later[0][i]):
            role = message.get("role", "?") if isinstance(message, dict) else "?"
            return f"message {i} (the {role}'s) changed"
    return None


def _same(a: Any, b: Any) -> bool:
    """Message equality; a comparison that cannot be made (arrays) counts as changed."""
    if a is b:
        return True
    try:
        return bool(a == b)
    except (ValueError, TypeError):
        return False
