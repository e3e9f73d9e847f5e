"""Train a vf_mm environment with prime-rl, through verifiers 0.4 (v1) and ``renderers``.

- ``VfMMTaskset`` / ``VfMMHarness``: a vf_mm environment as a verifiers v1 environment,
  found by verifiers' own loader under the taskset id ``vf-mm-verifiers`` (the package
  ``vf_mm_verifiers``, shipped with vf-mm, exports both): one task per dataset row, the
  environment's own rollout loop run against verifiers' interception endpoint, its
  rubric's reward on the trace.
- ``VfMMRenderer``: vf_mm's renderer behind the ``renderers`` protocol, for
  ``renderers``' ``custom`` config (``import_path =
  "vf_mm.integrations.verifiers.VfMMRenderer"``), so verifiers' train client renders,
  bridges and parses with vf_mm's templates and image rules.
- ``trace_samples`` / ``branch_sample``: a trace's branches (verifiers' own flattening)
  as vf_mm ``Sample``s, their images' model inputs rebuilt (verifiers 0.4 carries only
  their URLs), a sampled node shared by branches trained once.

What works, what is refused and why, and the commands: ``docs/trainers.md``. Importing
this package imports verifiers and renderers; without them, ``MissingDependencyError``
says what to install.
"""

from vf_mm.errors import MissingDependencyError

try:
    import renderers as _renderers  # noqa: F401
    import verifiers.v1 as _verifiers  # noqa: F401
except ImportError as exc:  # pragma: no cover - the verifiers1 tier has them
    raise MissingDependencyError(
        "vf_mm.integrations.verifiers needs verifiers 0.4 and renderers 0.1.12: "
        "pip install 'vf-mm[verifiers1]'"
    ) from exc

from vf_mm.integrations.verifiers._harness import VfMMHarness, VfMMHarnessConfig
from vf_mm.integrations.verifiers._renderer import VfMMRenderer, VfMMRendererConfig
from vf_mm.integrations.verifiers._samples import branch_sample, trace_samples
from vf_mm.integrations.verifiers._taskset import (
    VfMMTask,
    VfMMTaskData,
    VfMMTaskset,
    VfMMTasksetConfig,
)

#: the taskset id verifiers loads these by (the package ``vf_mm_verifiers``)
TASKSET_ID = "vf-mm-verifiers"

__all__ = [
    "TASKSET_ID",
    "VfMMHarness",
    "VfMMHarnessConfig",
    "VfMMRenderer",
    "VfMMRendererConfig",
    "VfMMTask",
    "VfMMTaskData",
    "VfMMTaskset",
    "VfMMTasksetConfig",
    "branch_sample",
    "trace_samples",
]
