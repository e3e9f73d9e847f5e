"""vf_mm: multimodal, multi-turn RL environments with exact tokens and a fast tensor wire.

``import vf_mm as vf``: environments (``vf.Environment``, ``vf.SingleTurnEnv``,
``vf.MultiTurnEnv``, ``vf.ToolEnv``, ``vf.Rubric``, ``vf.Parser``,
``vf.load_environment``), and ``vf.RendererClient``, which turns messages into model
turns (exact token ids, images carried across turns). ``vf.load_environment`` also
loads a verifiers classic environment, wrapped as a ``vf_mm.adapters.VerifiersEnv``.
``vf_mm.wire`` is the tensor codec, ``vf_mm.renderers`` the renderers,
``vf_mm.inference`` the backends.
"""

from vf_mm import errors
from vf_mm.adapters import load_environment  # vf_mm's environments, and verifiers'
from vf_mm.client import ClientStats, ModelTurn, RendererClient, make_client
from vf_mm.envs import (
    Environment,
    LazyRows,
    MultiTurnEnv,
    Parser,
    Rubric,
    SingleTurnEnv,
    State,
    ThinkParser,
    ToolEnv,
    XMLParser,
    check_environment,
    stop,
)

__version__ = "0.1.0"

__all__ = [
    "ClientStats",
    "Environment",
    "LazyRows",
    "ModelTurn",
    "MultiTurnEnv",
    "Parser",
    "RendererClient",
    "Rubric",
    "SingleTurnEnv",
    "State",
    "ThinkParser",
    "ToolEnv",
    "XMLParser",
    "__version__",
    "check_environment",
    "errors",
    "load_environment",
    "make_client",
    "stop",
]
