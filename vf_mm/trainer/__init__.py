"""The trainer side: scored groups of rollouts in, training batches out.

``GroupSender`` / ``GroupReceiver`` / ``read_groups`` carry one message per scored
group from rollout workers to the trainer, over a stream file or ZeroMQ (``tcp://``,
``ipc://``): bounded queues with back-pressure, an end-of-stream marker, the same
checked framing as ``vf_mm.wire`` streams. The layout and who binds are documented in
``vf_mm/trainer/_transport.py``.

``build_samples`` turns a rollout's steps into training samples (steps that extend each
other merge; loss mask on sampled tokens; the sampler's logprobs; advantages; images in
placeholder order), ``make_batches`` pads and packs them into ``MicroBatch`` es
(multimodal and text apart, never cut through an image), ``grpo_loss`` is the clipped
GRPO objective, ``group_advantages`` the group-normalised advantages.

Importing this package imports neither torch nor zmq; the torch-side names load on use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vf_mm.trainer._samples import Sample, build_samples, group_advantages
from vf_mm.trainer._transport import GroupReceiver, GroupSender, is_endpoint, read_groups

__all__ = [
    "GroupReceiver",
    "GroupSender",
    "MicroBatch",
    "Sample",
    "TensorList",
    "build_samples",
    "grpo_loss",
    "group_advantages",
    "is_endpoint",
    "make_batches",
    "read_groups",
    "token_logprobs",
]

_LAZY = {
    "MicroBatch": "vf_mm.trainer._batch",
    "TensorList": "vf_mm.trainer._batch",
    "make_batches": "vf_mm.trainer._batch",
    "grpo_loss": "vf_mm.trainer._grpo",
    "token_logprobs": "vf_mm.trainer._grpo",
}

if TYPE_CHECKING:
    from vf_mm.trainer._batch import MicroBatch, TensorList, make_batches
    from vf_mm.trainer._grpo import grpo_loss, token_logprobs


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'vf_mm.trainer' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
