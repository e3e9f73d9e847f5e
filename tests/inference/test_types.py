"""The inference contracts: ``SamplingParams`` refuses what a sampler cannot use, by name."""

from __future__ import annotations

import json

import numpy as np
import pytest

from vf_mm.inference import GenerateRequest, SamplingParams


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ({"temperature": "0.7"}, r"temperature must be a number, not str \('0.7'\)"),
        ({"max_tokens": True}, "max_tokens must be an int, not bool"),
        ({"max_tokens": 2.5}, "max_tokens must be an int, not float"),
        ({"logprobs": 1}, "logprobs must be a bool, not int"),
        ({"seed": 1.5}, "seed must be an int or None, not float"),
        (
            {"stop_token_ids": ["<|im_end|>"]},
            r"stop_token_ids must be ints, got \['<\|im_end\|>'\]",
        ),
    ],
)
def test_sampling_args_of_the_wrong_type_are_refused_by_name(args, match):
    with pytest.raises(TypeError, match=match):
        SamplingParams.from_dict(args)


def test_numpy_numbers_become_python_numbers_that_go_out_as_json():
    params = SamplingParams(max_tokens=np.int64(5), temperature=np.float32(0.5), seed=np.int32(3),
                            stop_token_ids=(np.int64(7),))  # fmt: skip
    assert json.dumps([params.max_tokens, params.temperature, params.seed, params.stop_token_ids])
    assert (type(params.max_tokens), type(params.temperature)) == (int, float)
    assert SamplingParams(seed=None).seed is None


def test_a_prompt_too_long_says_what_its_images_and_clips_take():
    """The refusal names the tokens the media take and how to shrink them: a clip's
    frames are what users shrink most often (``num_frames`` / ``fps``)."""
    from vf_mm.errors import PromptTooLongError
    from vf_mm.inference._internal import check_prompt_length
    from vf_mm.types import MultiModalData, PlaceholderRange

    data = MultiModalData(
        mm_hashes={"image": ["a"], "video": ["b", "c"]},
        mm_placeholders={
            "image": [PlaceholderRange(offset=1, length=4)],
            "video": [
                PlaceholderRange(offset=6, length=20),
                PlaceholderRange(offset=27, length=30),
            ],
        },
        mm_items={"image": [{}], "video": [{}, {}]},
    )
    request = GenerateRequest(list(range(60)), SamplingParams(max_tokens=8), multi_modal_data=data)
    with pytest.raises(PromptTooLongError) as info:
        check_prompt_length(request, 64, backend="x")
    message = str(info.value)
    assert "its 1 image(s) take 4 of them" in message
    assert "its 2 video(s) take 50 of them" in message and "num_frames or fps" in message
    check_prompt_length(request, 68, backend="x")  # fits: nothing raised
    text_only = GenerateRequest(list(range(60)), SamplingParams(max_tokens=8))
    with pytest.raises(PromptTooLongError) as info:
        check_prompt_length(text_only, 64, backend="x")
    assert "take" not in str(info.value)
