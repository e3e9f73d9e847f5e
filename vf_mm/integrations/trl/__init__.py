"""Train a vf_mm environment with TRL's ``GRPOTrainer`` (the optional extra ``vf-mm[trl]``).

    from trl import GRPOConfig
    from vf_mm.integrations.trl import GRPOTrainer, trl_inputs

    trainer = GRPOTrainer(model=model, args=GRPOConfig(...), **trl_inputs(env, model_dir))
    trainer.train()

- ``trl_inputs(env, model_dir)``: the train dataset, the ``rollout_func``
  (``TRLRollouts``: vf_mm's own rollouts, sampled in process by a ``LocalBackend`` that
  takes the trainer's weights every step) and the reward function (the environment's
  rubric), and the checkpoint's processor;
- ``GRPOTrainer``: TRL 1.16's, whose forward takes each row's images from the rollout
  that made it (the very tensors the sampler used, in every turn), with the
  sampler/trainer mismatch logged (``vf_mm/mismatch_kl``, ``vf_mm/logprob_diff_max``).

What is supported and refused, and why: ``docs/trainers.md``. Importing this package
imports TRL; without it, ``MissingDependencyError`` says what to install.
"""

from vf_mm.errors import MissingDependencyError

try:
    import trl as _trl  # noqa: F401
except (
    ImportError
) as exc:  # pragma: no cover - the trl tier has it; the default one never imports this
    raise MissingDependencyError(
        "vf_mm.integrations.trl needs TRL 1.16: pip install 'vf-mm[trl]'"
    ) from exc

from vf_mm.integrations.trl._inputs import trl_inputs
from vf_mm.integrations.trl._rollouts import EXAMPLE_COLUMN, TRLRollouts
from vf_mm.integrations.trl._trainer import TRL_VERSIONS, GRPOTrainer

__all__ = ["EXAMPLE_COLUMN", "TRL_VERSIONS", "GRPOTrainer", "TRLRollouts", "trl_inputs"]
