"""Images by reference rebuilt bit for bit with the backend the engine uses: torchvision.

Beside vLLM (and on every GPU machine) the renderer processes images with transformers'
torchvision backend, so that is what a trainer must rebuild with. For every family, a
group sent ``encoded`` and ``ref`` from a torchvision renderer, on images that force a
resize, is rebuilt by a torchvision trainer to the sampler's exact tensors; a PIL trainer
is refused by name (``backend``) before it processes anything.

Runs in the vllm tier's venv (``python3 dev.py vllm``), the one with torchvision.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from PIL import Image

from vf_mm import RendererClient
from vf_mm.errors import MissingDependencyError, ProcessingMismatchError
from vf_mm.models import VISION_FAMILIES, family_info
from vf_mm.renderers import load_renderer
from vf_mm.testing import ScriptedBackend, build_tiny_vlm
from vf_mm.training import (
    ImageProcessing,
    ImageRebuilder,
    ImageStore,
    pack_group,
    unpack_group,
)
from vf_mm.types import RolloutOutput
from vf_mm.wire import packb, unpackb

pytestmark = pytest.mark.vllm


@pytest.fixture(autouse=True, scope="module")
def _needs_torchvision():
    pytest.importorskip("torchvision")


def picture(size, seed, mode="RGB"):
    rng = np.random.default_rng(seed)
    image = Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))
    return image.convert(mode)


def rollout(renderer, images):
    client = RendererClient(ScriptedBackend(renderer, ["ok"]), renderer)
    prompt = [
        {
            "role": "user",
            "content": [
                *({"type": "image", "image": image} for image in images),
                {"type": "text", "text": "?"},
            ],
        }
    ]

    async def one():
        turn = await client.generate(prompt)
        return RolloutOutput(
            example_id=0, prompt=prompt, completion=[turn.message],
            trajectory=[turn.step(prompt)], reward=1.0,
        )  # fmt: skip

    return asyncio.run(one())


def items(rollouts):
    return [
        item
        for r in rollouts
        for step in r.trajectory
        for item in step.tokens.multi_modal_data.mm_items["image"]
    ]


@pytest.mark.parametrize("family", VISION_FAMILIES)
@pytest.mark.parametrize("mode", ["encoded", "ref"])
def test_a_torchvision_sampler_is_rebuilt_bit_for_bit(family, mode, tmp_path):
    path = build_tiny_vlm(tmp_path / family, family)
    renderer = load_renderer(path, image_backend="torchvision")
    assert renderer.image_backend == "torchvision"
    images = [picture((97, 501), 1), picture((1000, 120), 2, "L"), picture((333, 777), 3, "RGBA")]
    outputs = [rollout(renderer, images), rollout(renderer, images[:1])]
    store = ImageStore(tmp_path / "store")
    sampler = ImageProcessing.from_vision(renderer.vision)
    assert sampler.description["backend"] == "torchvision"
    frame = unpackb(packb(pack_group(outputs, images=mode, processing=sampler, store=store)))
    assert len(frame["sources"]) == 3 and not frame["images"]

    trainer = ImageProcessing.from_checkpoint(path, image_backend="torchvision")
    with ImageRebuilder(trainer, roots=[store.root]) as rebuilder:
        got = unpack_group(frame, images=rebuilder)
    sent, rebuilt = items(outputs), items(got)
    assert len(sent) == len(rebuilt) == 4
    for a, b in zip(sent, rebuilt, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            x, y = np.asarray(a[key]), np.asarray(b[key])
            assert (x.dtype, x.shape) == (y.dtype, y.shape) and x.tobytes() == y.tobytes(), key

    if not family_info(family).pil_backend:  # LFM2-VL, Kimi-K2.5: no PIL backend to differ
        with pytest.raises(MissingDependencyError, match="has only a torchvision backend"):
            ImageProcessing.from_checkpoint(path, image_backend="pil")
        # a trainer without torchvision rebuilds through vf_mm's port: the same bytes (the
        # port follows transformers 5.23: under the vLLM venv's 5.19 it is refused by name)
        try:
            port = ImageProcessing.from_checkpoint(path, image_backend="torch")
        except MissingDependencyError as exc:
            assert "follow transformers 5.23" in str(exc)
            return
        with ImageRebuilder(port, roots=[store.root]) as rebuilder:
            by_port = items(unpack_group(frame, images=rebuilder))
        for a, b in zip(sent, by_port, strict=True):
            for key in a:
                x, y = np.asarray(a[key]), np.asarray(b[key])
                assert (x.dtype, x.shape) == (y.dtype, y.shape) and x.tobytes() == y.tobytes(), key
        return
    pil = ImageProcessing.from_checkpoint(path, image_backend="pil")
    with (
        ImageRebuilder(pil, roots=[store.root]) as rebuilder,
        pytest.raises(ProcessingMismatchError, match="backend") as caught,
    ):
        unpack_group(frame, images=rebuilder)
    assert "backend" in caught.value.differs and rebuilder.rebuilt == 0
