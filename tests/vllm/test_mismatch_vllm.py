"""Issue 31's sampler/trainer mismatch metric on the session's Qwen2-VL server.

The other families are measured where their servers run (``test_families_vllm.py``:
Qwen3.5, LLaVA-OneVision, Gemma 4 in content_parts mode, and Gemma 3, Gemma 4 and SmolVLM
refused in features mode; ``test_video_vllm.py``:
Qwen2.5-VL, Qwen3-VL), by the same helper: ``tests/vllm/_mismatch.py``.
"""

from __future__ import annotations

import pytest

from tests.vllm._mismatch import assert_agrees, measure

pytestmark = pytest.mark.vllm


def test_the_trainer_scores_vllms_multi_turn_image_samples_as_vllm_did(vl_server, checkpoint_dirs):
    assert_agrees(measure("qwen2_vl", vl_server.base_url, checkpoint_dirs["vl"]))
