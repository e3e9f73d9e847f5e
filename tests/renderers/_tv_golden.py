"""The claim the default tier makes of the families whose image processor transformers
has only for torchvision (Kimi-K2.5, LFM2.5-VL): vf_mm's renderer, with vf_mm's
torch-only port where torchvision does not import, reproduces the goldens the real
processor wrote (``golden/tv_ports.json``, by ``golden/tv_ports.py``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.renderers.golden.tv_ports import (
    conversation,
    image_digest,
    images_of,
    tensor_record,
)

GOLDEN = json.loads((Path(__file__).parent / "golden" / "tv_ports.json").read_text())


def golden_cases(family: str) -> list[dict[str, Any]]:
    return GOLDEN["families"][family]["cases"]


def assert_renders_the_golden(renderer: Any, family: str, case: dict[str, Any]) -> None:
    """The case's images are the golden's (same pixels in), and the render's token ids and
    batched model inputs (``model_inputs``: shape, dtype, sha256 of the bytes) are the
    real processor's; the placeholders cover exactly the tokens that take image
    embeddings, one placeholder per image."""
    import torch

    from vf_mm.models import family_info, image_token_ids, model_inputs

    messages = conversation(case["seed"])
    assert [image_digest(p) for p in images_of(messages)] == case["images"], "the inputs moved"
    rendered = renderer.render(messages)
    assert rendered.token_ids == case["input_ids"]
    items = rendered.multi_modal_data.mm_items["image"]
    embed = image_token_ids(renderer.vision.processor)
    inputs = model_inputs(family, torch.tensor([rendered.token_ids]), items,
                          image_token_ids=embed)  # fmt: skip
    for name in family_info(family).image_inputs:
        assert tensor_record(inputs[name].numpy()) == case["inputs"][name], name
    placeholders = rendered.multi_modal_data.mm_placeholders["image"]
    assert len(placeholders) == len(case["images"])
    marked = np.isin(rendered.token_ids, embed)
    covered = np.zeros(len(marked), dtype=bool)
    for placeholder in placeholders:
        covered[placeholder.embed_positions()] = True
    assert np.array_equal(covered, marked)


def require_the_ports_transformers(path: Path) -> None:
    """Skip where transformers is older than the release the ports follow (the vllm
    venv's 5.19), after checking that the port is refused there by name."""
    import transformers

    from vf_mm.errors import MissingDependencyError
    from vf_mm.models import load_processor

    version = tuple(int(p) for p in transformers.__version__.split(".")[:2])
    if version < (5, 23):  # the release the ports follow (the lock's)
        with pytest.raises(MissingDependencyError, match=r"follow transformers 5\.23"):
            load_processor(path, image_backend="torch")
        pytest.skip(f"the ports follow transformers 5.23's processors; this is {version}")


def assert_the_port_renders_as_torchvision(path: Path) -> None:
    """The renderer with the port (``image_backend="torch"``) renders what the one with
    transformers' torchvision class renders (ids, placeholders, every input's bytes and
    dtype), and a trainer processing with the port agrees with a sampler that had
    torchvision: the same recorded processing (``ImageProcessing``: classes, config,
    backend ``"torchvision"``). Needs torchvision and the ports' transformers."""
    from vf_mm.renderers import load_renderer
    from vf_mm.training import ImageProcessing

    pytest.importorskip("torchvision")
    require_the_ports_transformers(path)
    real = load_renderer(path, image_backend="torchvision")
    port = load_renderer(path, image_backend="torch")
    assert real.image_backend == port.image_backend == "torchvision"
    for seed in range(6):
        a, b = real.render(conversation(seed)), port.render(conversation(seed))
        assert a.token_ids == b.token_ids
        assert a.multi_modal_data.mm_placeholders == b.multi_modal_data.mm_placeholders
        pairs = zip(a.multi_modal_data.mm_items["image"], b.multi_modal_data.mm_items["image"],
                    strict=True)  # fmt: skip
        for x, y in pairs:
            assert all(np.array_equal(x[k], y[k]) and x[k].dtype == y[k].dtype for k in x)
    sampler = ImageProcessing.from_checkpoint(path, image_backend="torchvision")
    trainer = ImageProcessing.from_checkpoint(path, image_backend="torch")
    assert trainer.differences(sampler.description) == {}


def assert_same_outputs(
    real: Any, port: Any, calls: list[list[Any]], options: dict[str, Any]
) -> None:
    """``port`` gives what ``real`` gives on every call of ``calls`` with ``options``:
    the same keys, and each output's dtype, shape and values (channels-last arrays
    told so, as transformers cannot always guess)."""
    for images in calls:
        layout = {} if hasattr(images[0], "mode") else {"input_data_format": "channels_last"}
        want = real(images, return_tensors="np", **options, **layout)
        got = port(images, return_tensors="np", **options, **layout)
        assert set(got) == set(want)
        for key in want:
            a, b = np.asarray(want[key]), np.asarray(got[key])
            assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b), key
