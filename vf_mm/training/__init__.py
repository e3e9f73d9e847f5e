"""The trainer side: scored groups of rollouts in, training batches out.

- **Group frames** (the training wire format): ``pack_group`` turns one example's
  rollouts into one ``vf_mm.group/1`` message, each distinct image's tensors once;
  ``unpack_group`` rebuilds ``TrainingRollout`` s whose steps' ``MultiModalData`` equal
  the renderer's. Schema: ``vf_mm/training/_groups.py``.
- **Image modes** (``IMAGE_MODES``): ``pack_group(..., images="encoded" | "ref")`` sends
  each distinct image's encoded bytes (or an ``ImageStore`` reference and its sha256)
  instead of its tensors, with the sampler's ``ImageProcessing`` described; the trainer's
  ``ImageRebuilder`` rebuilds the model inputs and checks them bit for bit by hash
  (``inputs_hash``). How and why it is exact: ``vf_mm/training/_images.py``; the
  store (a shared directory or an fsspec URL), how references are confined and how it
  is pruned: ``vf_mm/training/_store.py``.
- **Transport**: ``GroupSender`` / ``GroupReceiver`` / ``read_groups`` carry one message
  per group from rollout workers to the trainer, over a stream file or ZeroMQ
  (``tcp://``, ``ipc://``), with back-pressure and an end-of-stream marker, framed by
  ``vf_mm.wire``'s frame API. Specified in ``docs/formats/transport.md``.
- **Exactly once**: a group with an id (``pack_group(..., group_id=...)``, at most
  ``MAX_GROUP_ID_BYTES``) is held by its sender until the trainer commits it
  (``GroupReceiver`` commits on the next ``next()``, or at ``commit()``), sent again to a
  trainer that restarted, and skipped by the trainer if it has it already; committed ids
  go to the receiver's ledger (``ledger=PATH``; ``read_ledger`` lists them).
- **CURVE** (``vf_mm/training/_curve.py``): ``write_key_pair`` (``vf-mm keys``) makes the
  key files; ``GroupReceiver(secret_key=, allow=)`` accepts only the workers whose public
  keys are in ``allow``, ``GroupSender(secret_key=, trainer_key=)`` only the trainer
  holding ``trainer_key``'s secret; plain TCP off loopback needs ``insecure=True``.
- **The producer loop**: ``stream_rollouts`` runs an environment's train split and sends
  each group as soon as it is scored, its id ``f"{run_id}/{example_id}"`` (``run_id_for``
  derives a run id when none is given), reporting ``RolloutProgress`` (``vf-mm
  rollout`` is this plus a terminal).
- **Samples, batches, loss**: ``build_samples`` turns a rollout's steps into training
  samples (steps that extend each other merge; loss mask on sampled tokens; the
  sampler's logprobs; advantages; images in placeholder order), ``make_batches`` pads
  and packs them into ``MicroBatch`` es (multimodal and text apart, never cut through an
  image), ``grpo_loss`` is the clipped GRPO objective, ``group_advantages`` the
  group-normalised advantages (``stream_rollouts`` fills them unless told
  ``advantages="none"``; ``build_samples`` and ``grpo_loss`` refuse a missing or NaN
  one), ``history_break`` says where and why a rollout's turns stop extending each
  other (the template re-rendering the model's turn, or the environment rewriting the
  history), ``logprob_mismatch`` the sampler/trainer mismatch (masked k3 KL and the largest
  logprob difference). The guide: ``docs/training.md``.

Importing this package imports neither torch nor zmq; the torch-side names load on use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vf_mm._lazy import lazy_exports
from vf_mm.training._breaks import history_break
from vf_mm.training._curve import write_key_pair
from vf_mm.training._groups import (
    GROUP_FORMAT,
    MAX_GROUP_ID_BYTES,
    TrainingRollout,
    pack_group,
    unpack_group,
)
from vf_mm.training._images import (
    IMAGE_MODES,
    ImageProcessing,
    ImageRebuilder,
    RebuildFailure,
    inputs_hash,
)
from vf_mm.training._ledger import read_ledger
from vf_mm.training._samples import Sample, build_samples, group_advantages
from vf_mm.training._store import ImageStore, PruneReport
from vf_mm.training._streaming import RolloutProgress, run_id_for, stream_rollouts
from vf_mm.training._transport import (
    GroupReceiver,
    GroupSender,
    read_groups,
)

__all__ = [
    "GROUP_FORMAT",
    "GroupReceiver",
    "IMAGE_MODES",
    "ImageProcessing",
    "ImageRebuilder",
    "ImageStore",
    "GroupSender",
    "MAX_GROUP_ID_BYTES",
    "MicroBatch",
    "PruneReport",
    "RebuildFailure",
    "RolloutProgress",
    "Sample",
    "TensorList",
    "TrainingRollout",
    "build_samples",
    "group_advantages",
    "history_break",
    "inputs_hash",
    "grpo_loss",
    "logprob_mismatch",
    "make_batches",
    "pack_group",
    "read_groups",
    "read_ledger",
    "run_id_for",
    "stream_rollouts",
    "token_logprobs",
    "unpack_group",
    "write_key_pair",
]

if TYPE_CHECKING:
    from vf_mm.training._batch import MicroBatch, TensorList, make_batches
    from vf_mm.training._grpo import grpo_loss, token_logprobs
    from vf_mm.training._mismatch import logprob_mismatch

__getattr__ = lazy_exports(
    __name__,
    {
        "MicroBatch": "vf_mm.training._batch",
        "TensorList": "vf_mm.training._batch",
        "make_batches": "vf_mm.training._batch",
        "grpo_loss": "vf_mm.training._grpo",
        "token_logprobs": "vf_mm.training._grpo",
        "logprob_mismatch": "vf_mm.training._mismatch",
    },
)
