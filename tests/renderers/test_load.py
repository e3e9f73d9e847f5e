"""``load_renderer``, ``RendererPool`` and ``is_multimodal``."""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest

from tests.renderers.conftest import conversation
from vf_mm.errors import UnsupportedModelError
from vf_mm.models import load_processor
from vf_mm.renderers import (
    ChatTemplateRenderer,
    RendererPool,
    is_multimodal,
    load_renderer,
)


def test_loads_from_directory_processor_and_tokenizer(checkpoints, family):
    from_dir = load_renderer(checkpoints[family])
    processor = load_processor(checkpoints[family])
    from_processor = load_renderer(processor)
    from_tokenizer = load_renderer(processor.tokenizer)
    assert is_multimodal(from_dir) and is_multimodal(from_processor)
    assert not is_multimodal(from_tokenizer)
    messages = [{"role": "user", "content": "hi"}]
    assert from_dir.render(messages).token_ids == from_tokenizer.render(messages).token_ids
    assert from_dir.stop_token_ids == (processor.tokenizer.convert_tokens_to_ids("<|im_end|>"),
                                       processor.tokenizer.convert_tokens_to_ids("<|endoftext|>"))  # fmt: skip


def test_text_renderer_refuses_images_clearly(checkpoints):
    text_only = load_renderer(load_processor(checkpoints["qwen2_vl"]).tokenizer)
    with pytest.raises(Exception, match=r"message 0, part 0: .* no vision input"):
        text_only.render(
            [
                {
                    "role": "user",
                    "content": [{"type": "image", "image": b"x"}, {"type": "text", "text": "?"}],
                }
            ]
        )


def test_unsupported_model_type_lists_what_is_supported(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "llava"}')
    with pytest.raises(UnsupportedModelError, match="supported: qwen2_vl, qwen2_5_vl, qwen3_vl"):
        load_renderer(tmp_path)


def test_a_vision_model_of_another_family_is_refused_not_rendered_as_text(checkpoints, tmp_path):
    """A PaliGemma checkpoint has a tokenizer with a chat template: loading it as a text
    model would silently drop its images. It is refused, naming its family and the ones
    rendered."""
    import shutil

    other = tmp_path / "paligemma"
    shutil.copytree(checkpoints["qwen2_5_vl"], other)  # a loadable tokenizer and template
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "model_type": "paligemma"}))
    with pytest.raises(UnsupportedModelError) as info:
        load_renderer(other)
    message = str(info.value)
    assert "model type 'paligemma' is a vision-language model vf_mm does not render yet" in message
    assert (
        "qwen2_vl, qwen2_5_vl, qwen3_vl, qwen3_5, gemma3" in message and "AutoTokenizer" in message
    )
    assert "gemma4" in message  # the list is the registry's, the families added since included


@pytest.mark.parametrize("family", ["glm4v"])
def test_the_families_left_out_are_refused_by_name_with_the_current_list(
    checkpoints, tmp_path, family
):
    """GLM-4.1V / GLM-4.5V (``glm4v``: another template and processor than GLM-4.6V's) is
    refused by name, and the list of what is rendered includes the families added since
    (GLM-4.6V last)."""
    import shutil

    other = tmp_path / family
    shutil.copytree(checkpoints["qwen2_5_vl"], other)
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "model_type": family}))
    with pytest.raises(UnsupportedModelError, match=f"model type '{family}' is a vision") as info:
        load_renderer(other)
    assert "llava_next, internvl, lfm2_vl, kimi_k25, glm46v" in str(info.value)


def test_a_checkpoint_whose_files_do_not_make_its_familys_processor(checkpoints, tmp_path):
    """A 'gemma3' checkpoint with a Qwen tokenizer (no <start_of_image> token) is refused
    naming the family and what is missing, not an AttributeError from transformers."""
    import shutil

    gemma = tmp_path / "gemma"
    shutil.copytree(checkpoints["qwen2_5_vl"], gemma)
    config = json.loads((gemma / "config.json").read_text())
    (gemma / "config.json").write_text(json.dumps({**config, "model_type": "gemma3"}))
    with pytest.raises(UnsupportedModelError, match=r"Gemma 3 processor.*boi_token"):
        load_renderer(gemma, image_backend="pil")


def test_not_a_checkpoint(tmp_path):
    with pytest.raises(UnsupportedModelError, match="not a checkpoint directory"):
        load_renderer(tmp_path)


def test_pool_is_multimodal_like_its_renderers(checkpoints):
    pool = RendererPool(lambda: load_renderer(checkpoints["qwen2_vl"]), size=2)
    assert is_multimodal(pool)
    text_pool = RendererPool(
        lambda: load_renderer(load_processor(checkpoints["qwen2_vl"]).tokenizer), size=1
    )
    assert not is_multimodal(text_pool)


def test_pool_renders_from_threads(checkpoints):
    pool = RendererPool(lambda: load_renderer(checkpoints["qwen2_5_vl"]), size=3)
    single = load_renderer(checkpoints["qwen2_5_vl"])
    expected = {seed: single.render(conversation(seed, max_turns=2)).token_ids for seed in range(6)}
    results: dict[int, list[int]] = {}

    def work(seed):
        results[seed] = pool.render(conversation(seed, max_turns=2)).token_ids

    threads = [threading.Thread(target=work, args=(s,)) for s in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == expected
    assert isinstance(single, ChatTemplateRenderer)


def test_a_pool_builds_renderers_only_as_concurrent_renders_need_them(checkpoints):
    built = []

    def factory():
        built.append(load_renderer(checkpoints["qwen2_5_vl"]))
        return built[-1]

    pool = RendererPool(factory, size=3)
    assert len(built) == 1  # the first at once: a bad checkpoint fails here
    for seed in range(3):  # one render at a time: the one renderer serves them all
        pool.render(conversation(seed, max_turns=1))
    assert len(built) == 1 and pool.size == 3
    with pool.renderer() as a, pool.renderer() as b:  # two at once: a second is built
        assert a is not b
        assert a.vision.cache is b.vision.cache  # sharing the first one's image cache
    assert len(built) == 2
    with pool.renderer(), pool.renderer(), pool.renderer():
        pass
    assert len(built) == 3 and pool.renderers == tuple(built)
    got = threading.Event()

    def borrow():
        with pool.renderer():
            got.set()

    with pool.renderer(), pool.renderer(), pool.renderer():  # all three out
        fourth = threading.Thread(target=borrow)
        fourth.start()
        assert not got.wait(0.2)  # it waits for one back, and none is built past size
    fourth.join()
    assert got.is_set() and len(built) == 3


def test_renderers_needed_together_are_built_together_and_a_failed_build_stops_growth(
    checkpoints, caplog
):
    builds = []
    meet = threading.Barrier(2, timeout=10)  # builds made one after another never meet

    def factory():
        builds.append(len(builds) + 1)
        n = builds[-1]
        if n in (2, 3):
            meet.wait()
        if n == 4:
            raise OSError("the checkpoint is gone")
        return load_renderer(checkpoints["qwen2_5_vl"])

    pool = RendererPool(factory, size=5)
    held: list = []
    errors: list = []

    def hold(ready):
        try:
            with pool.renderer() as r:
                held.append(r)
                ready.wait(10)
        except Exception as exc:  # a broken barrier: the two builds did not overlap
            errors.append(exc)

    release = threading.Event()
    with pool.renderer():
        threads = [threading.Thread(target=hold, args=(release,)) for _ in range(2)]
        for t in threads:
            t.start()
        for _ in range(3000):  # up to 30 s for the two builds
            if len(held) == 2 or errors:
                break
            threading.Event().wait(0.01)
        assert not errors and len(pool.renderers) == 3
        got = threading.Event()
        fourth = threading.Thread(
            target=lambda: (pool.render(conversation(0, max_turns=1)), got.set())
        )
        fourth.start()  # finds none free for a build's time, its build fails: it waits
        for _ in range(3000):
            if len(builds) == 4:
                break
            threading.Event().wait(0.01)
        release.set()
        fourth.join(10)
    for t in threads:
        t.join(10)
    assert got.is_set() and pool.size == 3 and len(pool.renderers) == 3
    assert "could not build another renderer" in caplog.text


def test_a_borrower_waits_for_a_renderer_to_come_back_before_building_one(checkpoints):
    """A build holds the GIL for most of its time (the tokenizer's deserialisation): a
    borrower that finds every renderer out waits as long as the first build took for one
    to come back, and builds only if none does."""
    built = []

    def factory():
        time.sleep(0.5)  # a build as slow as a large vocabulary's
        built.append(load_renderer(checkpoints["qwen2_5_vl"]))
        return built[-1]

    pool = RendererPool(factory, size=3)
    out = threading.Event()

    def hold_briefly():
        with pool.renderer():
            out.set()
            time.sleep(0.05)

    holder = threading.Thread(target=hold_briefly)
    holder.start()
    out.wait(10)
    with pool.renderer() as r:  # the one renderer comes back in 50 ms: no build
        assert r is built[0]
    holder.join()
    assert len(built) == 1
    with pool.renderer(), pool.renderer() as second:  # none comes back: one is built
        assert second is built[1]


def test_a_renderer_and_a_pool_are_renderers(checkpoints):
    """Both meet the ``Renderer`` protocol, with the protocol's own signatures."""
    import inspect

    from vf_mm.renderers import Renderer

    single = load_renderer(checkpoints["qwen2_5_vl"])
    pool = RendererPool(lambda: load_renderer(checkpoints["qwen2_5_vl"]), size=1)
    for renderer in (single, pool):
        assert isinstance(renderer, Renderer)
        for name in ("render", "bridge_to_next_turn", "parse_response"):
            expected = inspect.signature(getattr(Renderer, name))
            assert inspect.signature(getattr(type(renderer), name)) == expected, (renderer, name)
        assert renderer.stop_token_ids == single.stop_token_ids
        assert renderer.is_multimodal
    assert not isinstance(object(), Renderer)


def test_the_image_backend_is_what_autoprocessor_would_pick_and_is_recorded(checkpoints):
    from vf_mm.errors import MissingDependencyError
    from vf_mm.models import resolve_image_backend, torchvision_available

    renderer = load_renderer(checkpoints["qwen2_5_vl"])  # auto
    assert renderer.image_backend == resolve_image_backend("auto")
    assert renderer.image_backend == ("torchvision" if torchvision_available() else "pil")
    pil = load_renderer(checkpoints["qwen2_5_vl"], image_backend="pil")
    image = {"type": "image", "image": np.zeros((40, 50, 3), dtype=np.uint8)}
    processed = pil.vision.process(image, where="test")
    assert pil.image_backend == processed.backend == "pil"  # the features say who made them
    assert load_renderer(checkpoints["qwen2_5_vl"], image_backend="pil").image_backend == "pil"
    with pytest.raises(ValueError, match="image_backend must be one of"):
        load_renderer(checkpoints["qwen2_5_vl"], image_backend="opencv")
    with pytest.raises(UnsupportedModelError, match="has a PIL backend"):  # nothing to port
        load_renderer(checkpoints["qwen2_5_vl"], image_backend="torch")
    if not torchvision_available():
        with pytest.raises(MissingDependencyError, match="needs torchvision"):
            load_renderer(checkpoints["qwen2_5_vl"], image_backend="torchvision")
