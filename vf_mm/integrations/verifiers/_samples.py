"""``trace_samples`` / ``branch_sample``: a verifiers v1 trace as vf_mm training ``Sample``s.

verifiers 0.4 flattens a trace itself: each ``trace.branches`` entry (a root-to-leaf
path of its message graph) is one training sequence, its ``token_ids``, ``sampled_mask``
(the loss mask), ``logprobs`` and ``mm_token_type_ids`` concatenated from the path's
nodes. That is what prime-rl's orchestrator trains on, and this function takes it as it
is. What verifiers 0.4 does not carry is the images' model inputs: its train client
sends images to the server as raw ``content_parts``, and the trace keeps only their URLs
in the messages. ``branch_sample`` processes them again with vf_mm's renderer (the
processing the server applied, for ``vf-mm serve``; cached by content), in message order,
and places each on the next run of its pad token in the branch's ids, checking the run's
length is the image's token count.

A trace whose history was rendered again (a template that rewrites earlier turns, a
compaction) has several branches, which may share nodes. ``trace_samples`` trains a
sampled node once, in the first branch that holds it (later ones keep its tokens as
context, mask 0, as prime-rl's orchestrator does), and leaves out a branch with nothing
left to train, as vf_mm's ``build_samples`` starts a new sample where a turn does not
extend the last.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from vf_mm.errors import TrajectoryError
from vf_mm.training import Sample
from vf_mm.types import PlaceholderRange


def trace_samples(trace: Any, renderer: Any, *, advantage: float = 0.0) -> list[Sample]:
    """The training samples of a verifiers ``Trace``: one per branch with tokens to train.

    See the module docstring.

    Args:
        trace: The trace.
        renderer: As for ``branch_sample``.
        advantage: Goes on every trained token.
    """
    trained: set[int] = set()
    samples = []
    for branch in trace.branches:
        mask: list[bool] = []
        for node in branch.nodes:
            sampled = node.sampled and any(node.mask)
            if sampled and id(node) in trained:
                mask += [False] * len(node.mask)
                continue
            if sampled:
                trained.add(id(node))
            mask += list(node.mask)
        if any(mask):
            samples.append(branch_sample(branch, renderer, advantage=advantage, mask=mask))
    return samples


def branch_sample(
    branch: Any,
    renderer: Any,
    *,
    advantage: float = 0.0,
    mask: Sequence[bool] | None = None,
) -> Sample:
    """The training sample of a verifiers ``Branch`` (see the module docstring).

    Args:
        branch: The branch.
        renderer: The ``VfMMRenderer`` the run rendered with (or any object with its
            ``renderer``, a vf_mm renderer).
        advantage: Goes on every trained token.
        mask: The tokens to train (default the branch's ``sampled_mask``); logprobs are
            kept on them only.
    """
    inner = getattr(renderer, "renderer", renderer)
    vision = inner.vision if inner.is_multimodal else None
    ids = np.asarray(branch.token_ids, dtype=np.int64)
    mask_array = np.asarray(branch.sampled_mask if mask is None else mask, dtype=np.int8)
    if mask_array.shape != ids.shape:
        raise TrajectoryError(
            f"verifiers branch {branch.index}: a mask of {mask_array.shape[0]} tokens for "
            f"{ids.shape[0]} tokens"
        )
    logprobs = np.where(mask_array == 1, np.asarray(branch.logprobs, dtype=np.float32), 0)
    # verifiers 0.4.0's Branch has them; the newer one prime-rl pins (a60a606) has not, and
    # prime-rl maps the branch's ids through the renderer's ``mm_token_type_id_map`` itself
    types = getattr(branch, "mm_token_type_ids", None)
    type_map = getattr(renderer, "mm_token_type_id_map", None)
    if types is None and type_map:
        types = [type_map.get(int(t), 0) for t in ids]
    sample = Sample(
        input_ids=ids,
        loss_mask=mask_array,
        logprobs=logprobs.astype(np.float32),
        advantages=(mask_array * np.float32(advantage)).astype(np.float32),
        mm_token_type_ids=np.asarray(types if types is not None else [0] * len(ids), dtype=np.int8),
        source=f"verifiers branch {branch.index}",
    )
    parts = [
        (i, j, part)
        for i, message in enumerate(branch.messages)
        for j, part in enumerate(message.content if isinstance(message.content, list) else ())
        if getattr(part, "type", None) == "image_url"
    ]
    if not parts:
        return sample
    if vision is None:
        raise TrajectoryError(
            f"{sample.source}: it holds images, but the renderer is a text model's"
        )
    pad = int(vision.image_token_id)
    runs = _runs(ids, pad)
    if len(runs) != len(parts):
        raise TrajectoryError(
            f"{sample.source}: {len(parts)} image parts but {len(runs)} runs of the image "
            f"token {pad} in its ids"
        )
    for (i, j, part), (start, length) in zip(parts, runs, strict=True):
        where = f"{sample.source}, message {i}, part {j}"
        item = vision.process(
            {"type": "image_url", "image_url": {"url": part.image_url.url}}, where=where
        )
        if item.num_tokens != length:
            raise TrajectoryError(
                f"{where}: the image takes {item.num_tokens} tokens, but its run in the "
                f"branch's ids has {length}"
            )
        sample.images.append({k: np.asarray(v) for k, v in item.item.items()})
        sample.placeholders.append(PlaceholderRange(start, length))
    return sample


def _runs(ids: np.ndarray, token: int) -> list[tuple[int, int]]:
    """(start, length) of each maximal run of ``token`` in ``ids``."""
    hit = np.concatenate([[False], ids == token, [False]])
    edges = np.flatnonzero(hit[1:] != hit[:-1])
    return [(int(a), int(b - a)) for a, b in zip(edges[0::2], edges[1::2], strict=True)]
