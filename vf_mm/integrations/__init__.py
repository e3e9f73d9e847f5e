"""Trainers people already run, fed by vf_mm environments.

- ``vf_mm.integrations.trl``: TRL's ``GRPOTrainer`` (the optional extra ``vf-mm[trl]``,
  TRL 1.16): ``GRPOTrainer(model=..., args=GRPOConfig(...), **trl_inputs(env, model_dir))``
  trains on vf_mm's own rollouts (its renderer, bridging, environment, rubric and local
  sampler), images in any turn, the trainer's forward fed the sampler's very image
  inputs. The guide: ``docs/trainers.md``.
- ``vf_mm.integrations.verifiers``: prime-rl, through verifiers 0.4 (v1) and ``renderers``
  0.1.12 (the optional extra ``vf-mm[verifiers1]``): a vf_mm environment as a verifiers
  environment (taskset id ``vf-mm-verifiers``), rendered by vf_mm through ``renderers``'
  ``custom`` hook (``VfMMRenderer``); ``branch_sample`` turns a trace branch into a vf_mm
  training ``Sample``.

Importing this package imports no trainer: each integration is a subpackage that
imports its trainer when it is imported itself.
"""
