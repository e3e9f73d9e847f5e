"""Specification of vf_mm.types: messages helpers, the multi-modal sidecar, trajectories."""

from __future__ import annotations

import copy
import dataclasses
import re

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from vf_mm import types as T
from vf_mm.errors import MultiModalDataError, VfMmError
from vf_mm.types import (
    MultiModalData,
    PlaceholderRange,
    RenderedTokens,
    ResponseTokens,
    RolloutOutput,
    TrajectoryError,
    TrajectoryStep,
    content_parts,
    image_parts,
    text_of,
)
from vf_mm.wire import packb, unpackb

# -- helpers ------------------------------------------------------------------------


def item(tag: int = 0) -> dict[str, torch.Tensor]:
    return {
        "pixel_values": torch.full((4, 6), float(tag)),
        "image_grid_thw": torch.tensor([[1, 2, 2]]),
    }


def mmd(*ranges: tuple[int, int], modality: str = "image") -> MultiModalData:
    """One item per range, hashes "h0", "h1", ..."""
    return MultiModalData(
        mm_hashes={modality: [f"h{i}" for i in range(len(ranges))]},
        mm_placeholders={modality: [PlaceholderRange(o, n) for o, n in ranges]},
        mm_items={modality: [item(i) for i in range(len(ranges))]},
    )


def snapshot(data: MultiModalData) -> tuple:
    """Identity of every container and contents, to prove nothing was mutated."""
    return (
        id(data.mm_hashes),
        id(data.mm_placeholders),
        id(data.mm_items),
        {m: (id(v), list(v)) for m, v in data.mm_hashes.items()},
        {m: (id(v), list(v)) for m, v in data.mm_placeholders.items()},
        {m: (id(v), [id(i) for i in v]) for m, v in data.mm_items.items()},
    )


def tokens(**overrides) -> ResponseTokens:
    fields = {
        "prompt_ids": list(range(10)),
        "completion_ids": [1, 2, 3],
        "completion_logprobs": [-0.1, -0.2, -0.3],
        "completion_mask": [1, 1, 0],
        "finish_reason": "stop",
    }
    fields.update(overrides)
    return ResponseTokens(**fields)


IMG = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
PIL_LIKE = {"type": "image", "image": b"\x89PNG"}

# -- message helpers ----------------------------------------------------------------


def test_content_parts_turns_a_string_into_one_text_part():
    assert content_parts({"role": "user", "content": "hi"}) == [{"type": "text", "text": "hi"}]


def test_content_parts_of_none_or_missing_content_is_empty():
    assert content_parts({"role": "assistant", "content": None, "tool_calls": []}) == []
    assert content_parts({"role": "assistant"}) == []


def test_content_parts_of_a_list_is_a_new_list_of_the_same_parts():
    parts = [{"type": "text", "text": "a"}, IMG]
    message = {"role": "user", "content": parts}
    out = content_parts(message)
    assert out == parts
    assert out is not parts
    assert all(a is b for a, b in zip(out, parts, strict=True))
    out.append({"type": "text", "text": "x"})
    assert len(parts) == 2


def test_content_parts_rejects_content_of_another_type():
    with pytest.raises(TypeError, match="int"):
        content_parts({"role": "user", "content": 3})


def test_image_parts_lists_message_and_part_indices_in_order():
    messages = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": [{"type": "text", "text": "look"}, IMG, PIL_LIKE]},
        {"role": "assistant", "content": None},
        {"role": "tool", "tool_call_id": "c1", "content": [IMG]},
    ]
    before = copy.deepcopy(messages)
    found = image_parts(messages)
    assert [(m, p) for m, p, _ in found] == [(1, 1), (1, 2), (3, 0)]
    assert found[0][2] is messages[1]["content"][1]
    assert found[1][2] is messages[1]["content"][2]
    assert messages == before


def test_image_parts_of_text_only_messages_is_empty():
    assert image_parts([{"role": "user", "content": "no images"}]) == []


def test_text_of_joins_text_parts_and_skips_images():
    message = {
        "role": "user",
        "content": [{"type": "text", "text": "a"}, IMG, {"type": "text", "text": "b"}],
    }
    assert text_of(message) == "ab"


def test_text_of_string_and_none_content():
    assert text_of({"role": "user", "content": "plain"}) == "plain"
    assert text_of({"role": "assistant", "content": None}) == ""


# -- PlaceholderRange ---------------------------------------------------------------


def test_placeholder_range_end_is_offset_plus_length():
    assert PlaceholderRange(5, 3).end == 8


@pytest.mark.parametrize(
    ("offset", "length", "match"),
    [
        (-1, 3, "offset must be >= 0, got -1"),
        (0, 0, "length must be > 0, got 0"),
        (2, -4, "length"),
    ],
)
def test_placeholder_range_rejects_bad_offset_or_length(offset, length, match):
    with pytest.raises(MultiModalDataError, match=match):
        PlaceholderRange(offset, length)


def test_placeholder_range_rejects_non_integers():
    with pytest.raises(MultiModalDataError, match="offset must be an int"):
        PlaceholderRange(1.5, 2)  # type: ignore[arg-type]


def test_placeholder_range_is_frozen():
    r = PlaceholderRange(1, 2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.offset = 3  # type: ignore[misc]


# -- MultiModalData.validate --------------------------------------------------------


def test_valid_data_passes_validation():
    mmd((2, 4), (10, 4)).validate(num_tokens=14)


def test_empty_data_is_valid_and_empty():
    data = MultiModalData.empty()
    data.validate(num_tokens=0)
    assert data.is_empty
    assert data.num_items() == 0
    assert data.modalities == ()


def test_validate_rejects_different_modality_keys():
    data = mmd((0, 2))
    data.mm_items["video"] = []
    with pytest.raises(MultiModalDataError, match=r"same modalities.*'video'"):
        data.validate()


def test_validate_rejects_unequal_list_lengths():
    data = mmd((0, 2), (4, 2))
    data.mm_hashes["image"].pop()
    with pytest.raises(MultiModalDataError, match=r"'image': 1 hashes, 2 placeholders and 2 items"):
        data.validate()


def test_validate_rejects_a_placeholder_that_is_not_a_range():
    data = mmd((0, 2))
    data.mm_placeholders["image"][0] = {"offset": 0, "length": 2}  # type: ignore[list-item]
    with pytest.raises(MultiModalDataError, match=r"mm_placeholders\['image'\]\[0\].*dict"):
        data.validate()


def test_validate_rejects_a_hash_that_is_not_a_string():
    data = mmd((0, 2))
    data.mm_hashes["image"][0] = b"raw"  # type: ignore[call-overload]
    with pytest.raises(MultiModalDataError, match=r"mm_hashes\['image'\]\[0\].*bytes"):
        data.validate()


def test_validate_rejects_unsorted_placeholders_within_a_modality():
    data = mmd((10, 2), (2, 2))
    with pytest.raises(
        MultiModalDataError, match=r"not sorted: \[1\] at offset 2.*\[0\] at offset 10"
    ):
        data.validate()


def test_validate_rejects_overlap_within_a_modality():
    data = mmd((2, 4), (5, 4))
    with pytest.raises(
        MultiModalDataError,
        match=r"\['image'\]\[1\] \(offset 5, length 4\) overlaps .*\['image'\]\[0\] \(offset 2, length 4, end 6\)",
    ):
        data.validate()


def test_validate_rejects_overlap_across_modalities():
    data = mmd((0, 4), (20, 4))
    data.mm_hashes["video"] = ["v0"]
    data.mm_placeholders["video"] = [PlaceholderRange(22, 5)]
    data.mm_items["video"] = [item()]
    with pytest.raises(MultiModalDataError, match=r"\['video'\]\[0\].*overlaps.*\['image'\]\[1\]"):
        data.validate()


def test_validate_accepts_interleaved_modalities_that_do_not_overlap():
    data = mmd((0, 4), (20, 4))
    data.mm_hashes["video"] = ["v0"]
    data.mm_placeholders["video"] = [PlaceholderRange(8, 5)]
    data.mm_items["video"] = [item()]
    data.validate(num_tokens=24)
    assert [(m, i) for m, i, _ in data.all_placeholders()] == [
        ("image", 0),
        ("video", 0),
        ("image", 1),
    ]


def test_adjacent_placeholders_do_not_overlap():
    mmd((0, 4), (4, 4)).validate(num_tokens=8)


def test_validate_rejects_a_placeholder_past_the_prompt():
    data = mmd((2, 4), (10, 4))
    with pytest.raises(
        MultiModalDataError, match=r"\['image'\]\[1\] .*ends at 14, past the prompt's 13 tokens"
    ):
        data.validate(num_tokens=13)


def test_validate_without_num_tokens_skips_the_bounds_check():
    mmd((100, 4)).validate()


def test_repeated_image_is_two_entries_with_the_same_hash_and_may_share_its_item():
    pixels = item()
    data = MultiModalData(
        mm_hashes={"image": ["same", "same"]},
        mm_placeholders={"image": [PlaceholderRange(1, 3), PlaceholderRange(6, 3)]},
        mm_items={"image": [pixels, pixels]},
    )
    data.validate(num_tokens=9)
    assert data.num_items("image") == 2
    assert data.mm_items["image"][0] is data.mm_items["image"][1]


# -- accessors --------------------------------------------------------------------


def test_num_items_counts_one_modality_or_all():
    data = mmd((0, 2), (4, 2))
    data.mm_hashes["audio"] = ["a"]
    data.mm_placeholders["audio"] = [PlaceholderRange(8, 1)]
    data.mm_items["audio"] = [{}]
    assert data.num_items("image") == 2
    assert data.num_items("audio") == 1
    assert data.num_items("video") == 0
    assert data.num_items() == 3
    assert data.modalities == ("image", "audio")
    assert not data.is_empty


def test_a_modality_with_no_items_is_empty_and_not_listed():
    data = MultiModalData(
        mm_hashes={"image": []}, mm_placeholders={"image": []}, mm_items={"image": []}
    )
    data.validate()
    assert data.is_empty
    assert data.modalities == ()


def test_all_placeholders_is_sorted_by_offset():
    data = mmd((10, 2), (30, 2))
    data.mm_hashes["video"] = ["v"]
    data.mm_placeholders["video"] = [PlaceholderRange(0, 5)]
    data.mm_items["video"] = [{}]
    assert [r.offset for _, _, r in data.all_placeholders()] == [0, 10, 30]


# -- copy / extended / shifted never mutate ----------------------------------------


def test_copy_makes_new_containers_and_shares_items():
    data = mmd((0, 2), (4, 2))
    before = snapshot(data)
    out = data.copy()
    assert snapshot(data) == before
    assert out.mm_hashes is not data.mm_hashes
    assert out.mm_hashes["image"] is not data.mm_hashes["image"]
    assert out.mm_placeholders["image"] is not data.mm_placeholders["image"]
    assert out.mm_items["image"] is not data.mm_items["image"]
    assert all(a is b for a, b in zip(out.mm_items["image"], data.mm_items["image"], strict=True))
    assert out.mm_hashes == data.mm_hashes
    assert out.mm_placeholders == data.mm_placeholders


def test_appending_to_a_copy_leaves_the_original_alone():
    data = mmd((0, 2))
    before = snapshot(data)
    out = data.copy()
    out.mm_hashes["image"].append("new")
    out.mm_placeholders["image"].append(PlaceholderRange(5, 1))
    out.mm_items["image"].append(item(9))
    out.mm_hashes["video"] = []
    assert snapshot(data) == before


def test_extended_appends_other_after_self_without_mutating_either():
    first = mmd((0, 2), (4, 2))
    second = MultiModalData(
        mm_hashes={"image": ["h9"], "video": ["v0"]},
        mm_placeholders={"image": [PlaceholderRange(10, 2)], "video": [PlaceholderRange(20, 3)]},
        mm_items={"image": [item(9)], "video": [item(8)]},
    )
    before_first, before_second = snapshot(first), snapshot(second)
    out = first.extended(second)
    assert snapshot(first) == before_first
    assert snapshot(second) == before_second
    assert out.mm_hashes == {"image": ["h0", "h1", "h9"], "video": ["v0"]}
    assert [r.offset for r in out.mm_placeholders["image"]] == [0, 4, 10]
    assert out.mm_items["image"][2] is second.mm_items["image"][0]
    assert out.mm_items["image"][0] is first.mm_items["image"][0]
    assert out.mm_items["video"][0] is second.mm_items["video"][0]
    assert out.mm_items["video"] is not second.mm_items["video"]
    out.validate(num_tokens=23)


def test_extended_with_the_same_image_again_adds_a_second_entry():
    first = mmd((0, 2))
    again = MultiModalData(
        mm_hashes={"image": ["h0"]},
        mm_placeholders={"image": [PlaceholderRange(5, 2)]},
        mm_items={"image": [first.mm_items["image"][0]]},
    )
    out = first.extended(again)
    assert out.mm_hashes["image"] == ["h0", "h0"]
    assert out.mm_items["image"][0] is out.mm_items["image"][1]
    out.validate(num_tokens=7)


def test_shifted_moves_every_placeholder_and_shares_items():
    data = mmd((0, 2), (4, 2))
    before = snapshot(data)
    out = data.shifted(7)
    assert snapshot(data) == before
    assert [(r.offset, r.length) for r in out.mm_placeholders["image"]] == [(7, 2), (11, 2)]
    assert [r.offset for r in data.mm_placeholders["image"]] == [0, 4]
    assert all(a is b for a, b in zip(out.mm_items["image"], data.mm_items["image"], strict=True))
    assert out.mm_hashes == data.mm_hashes
    assert out.mm_hashes["image"] is not data.mm_hashes["image"]


def test_shifted_below_zero_is_rejected():
    with pytest.raises(MultiModalDataError, match="offset must be >= 0, got -1"):
        mmd((3, 2)).shifted(-4)


def test_from_dict_rebuilds_placeholder_ranges_from_wire_maps():
    data = mmd((1, 2), (5, 2))
    wire_form = {
        "mm_hashes": data.mm_hashes,
        "mm_placeholders": {"image": [{"offset": 1, "length": 2}, {"offset": 5, "length": 2}]},
        "mm_items": data.mm_items,
    }
    out = MultiModalData.from_dict(wire_form)
    assert out.mm_placeholders == data.mm_placeholders
    assert out.mm_items["image"][1] is data.mm_items["image"][1]
    out.validate(num_tokens=7)


# -- property: validation accepts exactly the sorted, non-overlapping layouts ------

ranges_st = st.lists(
    st.tuples(st.integers(0, 40), st.integers(1, 8), st.sampled_from(["image", "video"])),
    max_size=8,
)


def _is_valid_layout(entries: list[tuple[int, int, str]]) -> bool:
    for modality in ("image", "video"):
        offsets = [o for o, _, m in entries if m == modality]
        if offsets != sorted(offsets):
            return False
    spans = [(o, o + n) for o, n, _ in entries]
    return all(
        a_end <= b_start or b_end <= a_start
        for i, (a_start, a_end) in enumerate(spans)
        for b_start, b_end in spans[i + 1 :]
    )


def _build(entries: list[tuple[int, int, str]]) -> MultiModalData:
    data = MultiModalData()
    for i, (offset, length, modality) in enumerate(entries):
        data.mm_hashes.setdefault(modality, []).append(f"h{i}")
        data.mm_placeholders.setdefault(modality, []).append(PlaceholderRange(offset, length))
        data.mm_items.setdefault(modality, []).append({})
    return data


@given(ranges_st)
def test_validate_accepts_exactly_sorted_non_overlapping_layouts(entries):
    data = _build(entries)
    if _is_valid_layout(entries):
        data.validate()
    else:
        with pytest.raises(MultiModalDataError):
            data.validate()


@given(
    st.lists(st.tuples(st.integers(0, 5), st.integers(1, 6)), min_size=1, max_size=10), st.data()
)
def test_packed_layouts_validate_and_any_overlap_is_rejected(gaps_and_lengths, draw):
    offset, entries = 0, []
    for gap, length in gaps_and_lengths:
        entries.append((offset + gap, length, "image"))
        offset += gap + length
    _build(entries).validate(num_tokens=offset)
    if len(entries) >= 2:
        i = draw.draw(st.integers(1, len(entries) - 1))
        prev_offset, prev_length, _ = entries[i - 1]
        # move entry i to start inside entry i-1
        new_offset = draw.draw(st.integers(prev_offset, prev_offset + prev_length - 1))
        entries[i] = (new_offset, entries[i][1], "image")
        with pytest.raises(MultiModalDataError, match="overlaps"):
            _build(entries).validate()


# -- ResponseTokens ------------------------------------------------------------------


def test_response_tokens_validate_accepts_consistent_tokens():
    tokens(multi_modal_data=mmd((2, 4))).validate()


def test_trajectory_error_is_a_vf_mm_value_error():
    assert issubclass(TrajectoryError, VfMmError)
    assert issubclass(TrajectoryError, ValueError)


@pytest.mark.parametrize(
    "overrides",
    [
        {"completion_logprobs": [-0.1, -0.2]},
        {"completion_mask": [1, 1, 0, 1]},
    ],
)
def test_response_tokens_rejects_unequal_completion_lengths(overrides):
    with pytest.raises(TrajectoryError, match="completion_ids has 3 tokens"):
        tokens(**overrides).validate()


@pytest.mark.parametrize("bad", [2, -1, 0.5])
def test_response_tokens_rejects_mask_values_other_than_0_and_1(bad):
    with pytest.raises(TrajectoryError, match=re.escape(f"completion_mask[1] is {bad!r}")):
        tokens(completion_mask=[1, bad, 0]).validate()


def test_response_tokens_checks_placeholders_against_the_prompt_length():
    with pytest.raises(MultiModalDataError, match="past the prompt's 10 tokens"):
        tokens(multi_modal_data=mmd((8, 4))).validate()


# -- RolloutOutput ------------------------------------------------------------------


def test_rollout_output_ok_is_false_when_an_error_is_recorded():
    assert RolloutOutput(example_id=1, prompt=[], completion=[]).ok
    failed = RolloutOutput(example_id=1, prompt=[], completion=[], error="Timeout: backend")
    assert not failed.ok
    assert failed.error == "Timeout: backend"


def test_rollout_defaults_are_not_shared_between_instances():
    a = RolloutOutput(example_id=0, prompt=[], completion=[])
    b = RolloutOutput(example_id=1, prompt=[], completion=[])
    a.metrics["x"] = 1.0
    a.trajectory.append(TrajectoryStep(prompt=[], completion=[], tokens=None))
    assert b.metrics == {}
    assert b.trajectory == []


def test_trajectory_step_without_tokens_is_allowed():
    step = TrajectoryStep(
        prompt=[], completion=[{"role": "assistant", "content": "hi"}], tokens=None
    )
    assert step.tokens is None
    assert step.reward is None
    assert step.extras == {}


# -- wire round trip ----------------------------------------------------------------


def test_rollout_output_round_trips_through_the_wire_codec():
    pixels = torch.randn(16, 12, dtype=torch.bfloat16)
    mm = MultiModalData(
        mm_hashes={"image": ["abc123"]},
        mm_placeholders={"image": [PlaceholderRange(3, 4)]},
        mm_items={"image": [{"pixel_values": pixels, "image_grid_thw": torch.tensor([[1, 2, 2]])}]},
    )
    prompt = [{"role": "user", "content": [IMG, {"type": "text", "text": "what?"}]}]
    completion = [{"role": "assistant", "content": "a cat"}]
    response = tokens(prompt_ids=[9, 8, 7, 5, 5, 5, 5, 6], multi_modal_data=mm)
    response.validate()
    rollout = RolloutOutput(
        example_id="ex-1",
        prompt=prompt,
        completion=completion,
        answer="cat",
        trajectory=[
            TrajectoryStep(prompt=prompt, completion=completion, tokens=response, reward=1.0)
        ],
        reward=1.0,
        metrics={"correct": 1.0},
        timing={"generate_s": 0.25},
    )
    out = unpackb(packb(rollout))

    assert out["example_id"] == "ex-1"
    assert out["prompt"] == prompt
    assert out["error"] is None
    step_tokens = out["trajectory"][0]["tokens"]
    assert step_tokens["prompt_ids"] == response.prompt_ids
    assert step_tokens["completion_ids"] == response.completion_ids
    assert step_tokens["completion_mask"] == response.completion_mask
    mm_out = step_tokens["multi_modal_data"]
    assert mm_out["mm_hashes"] == {"image": ["abc123"]}
    assert mm_out["mm_placeholders"] == {"image": [{"offset": 3, "length": 4, "is_embed": None}]}
    got = mm_out["mm_items"]["image"][0]["pixel_values"]
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, pixels)
    assert torch.equal(mm_out["mm_items"]["image"][0]["image_grid_thw"], torch.tensor([[1, 2, 2]]))

    rebuilt = MultiModalData.from_dict(mm_out)
    rebuilt.validate(num_tokens=len(step_tokens["prompt_ids"]))
    assert rebuilt.mm_placeholders == mm.mm_placeholders


# -- public surface -----------------------------------------------------------------


def test_all_lists_every_public_name_and_only_existing_ones():
    public = {
        name
        for name, value in vars(T).items()
        if not name.startswith("_") and getattr(value, "__module__", None) == T.__name__
    }
    assert public <= set(T.__all__)
    assert all(hasattr(T, name) for name in T.__all__)
    assert {"Message", "Messages", "ContentPart", "IMAGE_PART_TYPES"} <= set(T.__all__)


def test_rendered_tokens_default_to_no_multi_modal_data():
    assert RenderedTokens(token_ids=[1, 2]).multi_modal_data is None


# -- RolloutError ---------------------------------------------------------------------


def test_a_rollout_error_reads_as_one_line_type_first():
    error = T.RolloutError("ImageFetchError", "no such file", "turn 2: model")
    assert str(error) == "ImageFetchError: no such file (turn 2: model)"
    assert str(T.RolloutError("KeyError", "'x'")) == "KeyError: 'x'"


def test_a_rollout_error_round_trips_through_its_dict():
    error = T.RolloutError("MessageError", "bad", "turn 1: env.env_response")
    assert T.RolloutError.from_value(error.to_dict()) == error
    assert T.RolloutError.from_value(unpackb(packb(error.to_dict()))) == error
    assert T.RolloutError.from_value(None) is None and T.RolloutError.from_value(error) is error


def test_one_line_errors_of_older_results_files_are_read_by_their_type():
    assert T.RolloutError.from_value("ImageFetchError: gone") == T.RolloutError(
        "ImageFetchError", "gone"
    )
    assert T.RolloutError.from_value("it broke") == T.RolloutError("Error", "it broke")


@pytest.mark.parametrize(
    "bad", [{"message": "no type"}, {"type": 3, "message": "m"}, 7, ["TypeError", "m"]]
)
def test_a_malformed_error_record_is_refused_not_stringified(bad):
    with pytest.raises(TypeError, match="error record"):
        T.RolloutError.from_value(bad)


def test_an_error_from_user_code_names_the_line_that_raised_it():
    def env_code():
        raise KeyError("cell")

    try:
        env_code()
    except KeyError as exc:
        error = T.RolloutError.from_exception(exc, where="turn 1: env.env_response")
    assert error.type == "KeyError" and error.message == "'cell'"
    assert error.where.startswith("turn 1: env.env_response, at test_types.py:")
    assert error.where.endswith("in env_code")


def test_a_vf_mm_error_names_its_cause_in_its_message_not_a_code_line():
    try:
        raise MultiModalDataError("placeholders overlap")
    except MultiModalDataError as exc:
        error = T.RolloutError.from_exception(exc, where="turn 3: model")
    assert error == T.RolloutError("MultiModalDataError", "placeholders overlap", "turn 3: model")
    assert T.RolloutError.from_exception(ValueError()).message == "ValueError"  # never empty


def test_an_error_raised_inside_vf_mm_by_a_wrong_call_points_at_the_call():
    import vf_mm as vf

    def load_environment(**kwargs):
        return vf.SingleTurnEnv(dataset=[{"question": "q"}], **kwargs)

    try:
        load_environment(difficultyy="hard")  # a typo, passed on into vf_mm
    except TypeError as exc:
        error = T.RolloutError.from_exception(exc)
    assert "difficultyy" in error.message
    assert error.where.startswith("at test_types.py:") and error.where.endswith(
        "in load_environment"
    )


def test_a_syntax_error_names_its_file_and_line_in_its_message_only():
    try:
        compile("def f(:\n", "my_env.py", "exec")
    except SyntaxError as exc:
        error = T.RolloutError.from_exception(exc, where="importing my_env.py")
    assert error.where == "importing my_env.py" and "my_env.py, line 1" in error.message


# -- PlaceholderRange.is_embed -----------------------------------------------------------


def test_a_range_with_markers_inside_says_which_positions_are_embeddings():
    r = T.PlaceholderRange(10, 6, (False, True, True, False, True, False))
    assert r.num_embeds == 3 and r.embed_positions() == [11, 12, 14]
    contiguous = T.PlaceholderRange(10, 3)
    assert contiguous.num_embeds == 3 and contiguous.embed_positions() == [10, 11, 12]
    # an all-True mask is the contiguous case: stored as None, so equal ranges compare equal
    assert T.PlaceholderRange(10, 3, (True, True, True)) == contiguous
    assert T.PlaceholderRange(10, 3, [True, False, True]).is_embed == (True, False, True)


@pytest.mark.parametrize(
    ("mask", "match"),
    [
        ((True, False), "2 entries for length 3"),
        ((False, False, False), "marks no position"),
        ((1, 0, 1), "bools only"),
    ],
)
def test_a_bad_embedding_mask_is_refused(mask, match):
    with pytest.raises(MultiModalDataError, match=match):
        T.PlaceholderRange(0, 3, mask)


def test_an_embedding_mask_survives_the_wire_and_from_dict():
    r = T.PlaceholderRange(2, 4, (False, True, True, False))
    data = T.MultiModalData({"image": ["h"]}, {"image": [r]}, {"image": [{}]})
    back = T.MultiModalData.from_dict(unpackb(packb(data)))
    assert back.mm_placeholders["image"] == [r]


def test_an_error_raised_inside_the_standard_library_points_at_the_authors_call():
    import json

    def env_response():
        return json.loads("{not json")  # raises deep inside json.decoder

    try:
        env_response()
    except ValueError as exc:
        error = T.RolloutError.from_exception(exc, where="turn 1: env.env_response")
    assert error.where.startswith("turn 1: env.env_response, at test_types.py:")
    assert error.where.endswith("in env_response")


def test_no_location_when_no_frame_is_the_authors():
    try:
        int("x")  # raised in a builtin, called from here: this frame is the test's own
    except ValueError as exc:
        inner = exc
    assert T.RolloutError.from_exception(inner).where.startswith("at test_types.py:")
    import sysconfig

    try:
        sysconfig.get_path("no-such-scheme-key")  # raises inside the standard library
    except KeyError as exc:
        lib = exc
    lib.__traceback__ = lib.__traceback__.tb_next  # drop this test's own frame
    assert T.RolloutError.from_exception(lib).where == ""


def test_coerce_takes_whatever_environment_code_stored_as_its_error():
    assert T.RolloutError.coerce(None) is None
    assert T.RolloutError.coerce("KeyError: 'x'") == T.RolloutError("KeyError", "'x'")
    assert T.RolloutError.coerce(ValueError("bad")).type == "ValueError"
    assert T.RolloutError.coerce(42) == T.RolloutError("Error", "42")  # never refused
    with pytest.raises(TypeError):
        T.RolloutError.from_value(42)  # the strict form refuses it
