"""The inference contracts: ``SamplingParams`` refuses what a sampler cannot use, by name."""

from __future__ import annotations

import json

import numpy as np
import pytest

from vf_mm.inference import SamplingParams


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
