"""vf_mm: multimodal, multi-turn RL environments with exact tokens and a fast tensor wire.

``import vf_mm as vf``: ``vf.RendererClient`` turns messages into model turns (exact
token ids, images carried across turns); ``vf_mm.wire`` is the tensor codec,
``vf_mm.renderers`` the renderers, ``vf_mm.inference`` the backends.
"""

from vf_mm import errors
from vf_mm.client import ClientStats, ModelTurn, RendererClient

__version__ = "0.1.0"

__all__ = ["ClientStats", "ModelTurn", "RendererClient", "__version__", "errors"]
