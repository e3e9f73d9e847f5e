"""Adapters: environments written for other frameworks, run as vf_mm environments.

``VerifiersEnv(env)`` wraps a verifiers classic environment (verifiers 0.3.x:
``vf.SingleTurnEnv``, ``vf.MultiTurnEnv``, ``vf.ToolEnv``): its rollout talks to an
in-process recording client, so each rollout's trajectory holds exact tokens and
images, and its own rubric scores it. ``load_environment`` (``vf_mm.load_environment``)
finds environments as ``vf_mm.envs`` does and wraps those it knows, so ``vf-mm eval``
and ``vf-mm rollout`` run a verifiers environment by id or path. verifiers itself is an
optional dependency (``pip install 'vf-mm[verifiers]'``): nothing here imports it until
an environment of its own is wrapped.
"""

from vf_mm.adapters._loading import ADAPTERS, load_environment
from vf_mm.adapters._verifiers import VerifiersEnv, adapt_verifiers, is_verifiers_environment

__all__ = [
    "ADAPTERS",
    "VerifiersEnv",
    "adapt_verifiers",
    "is_verifiers_environment",
    "load_environment",
]
