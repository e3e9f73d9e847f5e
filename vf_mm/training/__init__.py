"""The trainer side: scored groups of rollouts in, training batches out.

- **Group frames** (the training wire format): ``pack_group`` turns one example's
  rollouts into one ``vf_mm.group/1`` message, each distinct image's tensors once;
  ``unpack_group`` rebuilds ``TrainingRollout`` s whose steps' ``MultiModalData`` equal
  the renderer's. Schema: ``vf_mm/training/_groups.py``.
- **Transport**: ``GroupSender`` / ``GroupReceiver`` / ``read_groups`` carry one message
  per group from rollout workers to the trainer, over a stream file or ZeroMQ
  (``tcp://``, ``ipc://``), with back-pressure and an end-of-stream marker, framed by
  ``vf_mm.wire``'s frame API. Layout: ``vf_mm/training/_transport.py``.
- **The producer loop**: ``stream_rollouts`` runs an environment's train split and sends
  each group as soon as it is scored, reporting ``RolloutProgress`` (``vf-mm rollout``
  is this plus a terminal).
- **Samples, batches, loss**: ``build_samples`` turns a rollout's steps into training
  samples (steps that extend each other merge; loss mask on sampled tokens; the
  sampler's logprobs; advantages; images in placeholder order), ``make_batches`` pads
  and packs them into ``MicroBatch`` es (multimodal and text apart, never cut through an
  image), ``grpo_loss`` is the clipped GRPO objective, ``group_advantages`` the
  group-normalised advantages.

Importing this package imports neither torch nor zmq; the torch-side names load on use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vf_mm._lazy import lazy_exports
from vf_mm.training._groups import GROUP_FORMAT, TrainingRollout, pack_group, unpack_group
from vf_mm.training._samples import Sample, build_samples, group_advantages
from vf_mm.training._streaming import RolloutProgress, stream_rollouts
from vf_mm.training._transport import GroupReceiver, GroupSender, is_endpoint, read_groups

__all__ = [
    "GROUP_FORMAT",
    "GroupReceiver",
    "GroupSender",
    "MicroBatch",
    "RolloutProgress",
    "Sample",
    "TensorList",
    "TrainingRollout",
    "build_samples",
    "group_advantages",
    "grpo_loss",
    "is_endpoint",
    "make_batches",
    "pack_group",
    "read_groups",
    "stream_rollouts",
    "token_logprobs",
    "unpack_group",
]

if TYPE_CHECKING:
    from vf_mm.training._batch import MicroBatch, TensorList, make_batches
    from vf_mm.training._grpo import grpo_loss, token_logprobs

__getattr__ = lazy_exports(
    __name__,
    {
        "MicroBatch": "vf_mm.training._batch",
        "TensorList": "vf_mm.training._batch",
        "make_batches": "vf_mm.training._batch",
        "grpo_loss": "vf_mm.training._grpo",
        "token_logprobs": "vf_mm.training._grpo",
    },
)
