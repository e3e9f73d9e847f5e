"""``trl_inputs``: what TRL's ``GRPOTrainer`` needs from a vf_mm environment, in one call.

``GRPOTrainer(model=..., args=GRPOConfig(...), **trl_inputs(env, model_dir))`` (the
trainer of ``vf_mm.integrations.trl``) gets:

- ``train_dataset``: one row per example of the environment's train split, a
  ``prompt`` column (its prompt messages as text, images shown as ``<image>``: what
  TRL logs; the rollouts render the real ones) and ``EXAMPLE_COLUMN`` (which example).
  It has no image column on purpose: TRL would process those images itself, for the
  first prompt only;
- ``rollout_func``: a ``TRLRollouts`` (vf_mm's rollouts of those examples);
- ``reward_funcs``: one function, named after the environment, returning each
  rollout's reward as the environment's rubric scored it (its weighted sum; None for a
  failed rollout, which TRL then leaves out). It logs the rubric's metrics as
  ``vf_mm/<name>`` and the share of failed rollouts as ``vf_mm/errors``;
- ``processing_class``: the checkpoint's processor (vf_mm loads it by class, which
  works without torchvision; ``AutoProcessor`` may silently return only the tokenizer)
  or, for a text model, its tokenizer. TRL decodes completions and saves it with
  checkpoints.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from vf_mm.errors import UnsupportedModelError
from vf_mm.integrations.trl._rollouts import (
    ERROR_KEY,
    EXAMPLE_COLUMN,
    METRICS_KEY,
    REWARD_KEY,
    TRLRollouts,
)
from vf_mm.types import IMAGE_PART_TYPES, VIDEO_PART_TYPES


def trl_inputs(
    env: Any,
    model: str | os.PathLike[str],
    *,
    num_examples: int = -1,
    sampling_args: Mapping[str, Any] | None = None,
    backend_options: Mapping[str, Any] | None = None,
    image_backend: str = "auto",
) -> dict[str, Any]:
    """The keyword arguments of ``vf_mm.integrations.trl.GRPOTrainer`` that come from
    ``env``: ``train_dataset``, ``rollout_func``, ``reward_funcs`` and
    ``processing_class`` (module docstring).

    Args:
        env: a vf_mm environment (``vf.load_environment(...)``).
        model: the checkpoint directory the trainer's model is loaded from: the
            renderer, the processor and the sampler are built from it (the sampler then
            takes the trainer's weights before every step).
        num_examples: how many of the environment's train rows (-1: all).
        sampling_args: the environment's sampling args overridden (``max_tokens``: per
            model turn; temperature, top_p, top_k and min_p come from the ``GRPOConfig``).
        backend_options: keyword arguments for the sampler's ``LocalBackend`` (``device``:
            default the trainer's; ``dtype``, ``max_batch``, ...).
        image_backend: the renderer's image processing (``"auto"``, ``"pil"``,
            ``"torchvision"``).
    """
    import datasets

    from vf_mm.models import VISION_FAMILIES, load_processor, model_type

    path = Path(model)
    if not path.is_dir():  # TRL's own model= takes Hub ids; vf_mm loads a directory
        raise UnsupportedModelError(
            f"trl_inputs: {str(model)!r} is not a checkpoint directory, and vf_mm's renderer, "
            "processor and sampler load from one. For a Hub model id, download it first "
            f"(huggingface_hub.snapshot_download({str(model)!r}) returns the directory) and "
            "pass that directory here and as GRPOTrainer(model=...)"
        )
    family = model_type(path)
    rows = env.get_dataset(num_examples)
    if not rows:
        raise ValueError(f"{env.env_id}: no train rows to train on")
    rollouts = TRLRollouts(
        env,
        path,
        rows,
        sampling_args=sampling_args,
        backend_options=backend_options,
        image_backend=image_backend,
        family=family,
    )
    if family in VISION_FAMILIES:
        processing_class = load_processor(path, image_backend=image_backend)
    else:
        from transformers import AutoTokenizer

        processing_class = AutoTokenizer.from_pretrained(path)
    dataset = datasets.Dataset.from_list(
        [{"prompt": _shown(env, row), EXAMPLE_COLUMN: i} for i, row in enumerate(rows)]
    )
    return {
        "train_dataset": dataset,
        "rollout_func": rollouts,
        "reward_funcs": [_reward_function(str(env.env_id))],
        "processing_class": processing_class,
    }


def _shown(env: Any, row: Mapping[str, Any]) -> list[dict[str, str]]:
    """A row's prompt as TRL logs it: each message's text, ``<image>`` / ``<video>`` where
    its media are (a row whose prompt cannot be made says so: its rollouts fail, named)."""
    try:
        messages = env.format_prompt(row)
    except Exception as exc:  # the rollout will fail with the same error, by name
        return [{"role": "user", "content": f"(no prompt: {type(exc).__name__}: {exc})"}]
    shown = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            parts = []
            for part in content:
                kind = part.get("type") if isinstance(part, Mapping) else None
                if kind in IMAGE_PART_TYPES:
                    parts.append("<image>")
                elif kind in VIDEO_PART_TYPES:
                    parts.append("<video>")
                elif isinstance(part, Mapping) and isinstance(part.get("text"), str):
                    parts.append(part["text"])
            content = "".join(parts)
        shown.append({"role": str(message.get("role")), "content": str(content or "")})
    return shown


def _reward_function(name: str) -> Callable[..., list[float | None]]:
    """TRL's reward function: each rollout's reward as the rubric scored it (the rollout
    function passes them in), the rubric's metrics and the failures logged."""

    def reward(**kwargs: Any) -> list[float | None]:
        rewards = list(kwargs[REWARD_KEY])
        log_metric = kwargs.get("log_metric")
        if log_metric is not None:
            for metrics in kwargs[METRICS_KEY]:
                for key, value in metrics.items():
                    if value is not None:
                        log_metric(f"vf_mm/{key}", float(value))
            for error in kwargs[ERROR_KEY]:
                log_metric("vf_mm/errors", float(error is not None))
        return rewards

    reward.__name__ = reward.__qualname__ = name
    return reward
