from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from vf_mm.renderers import load_renderer
from vf_mm.testing import build_tiny_vlm


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    return build_tiny_vlm(tmp_path_factory.mktemp("envs") / "m", "qwen2_5_vl")


@pytest.fixture(scope="session")
def renderer(tiny):
    return load_renderer(tiny)


def picture(seed: int = 0, size=(64, 48)) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))
