"""TRL 1.16's ``GRPOTrainer`` trains vf_mm environments (``vf_mm.integrations.trl``), for
real: tiny checkpoints of every family, vf_mm's rollouts sampled by its ``LocalBackend``,
one or two trainer steps on the CPU.

What is checked against what: the trainer's log-probabilities of the sampled tokens
(its own forward, TRL's fused LM head) against the ones the sampler recorded, within
``tolerance(family)``; the image inputs the trainer's forward got against the ones the sampler
was sent (the rollouts' last turns), tensor for tensor, and the per-token type ids
against the image tokens; the parameters move; the environment's reward is TRL's
logged reward. And the mistakes: settings, trainers and datasets that cannot work are
refused by name before anything runs; a rollout TRL cannot take fails alone.

The trl tier (``python3 dev.py trl``): TRL is imported by the fixtures, never at
collection, so the default tier deselects these quietly.
"""

from __future__ import annotations

import dataclasses
import statistics

import numpy as np
import pytest
import torch
from PIL import Image

import vf_mm as vf
from vf_mm.errors import MissingDependencyError, TrajectoryError
from vf_mm.models import VISION_FAMILIES, model_class, model_inputs
from vf_mm.training import MicroBatch, logprob_mismatch
from vf_mm.types import (
    MultiModalData,
    PlaceholderRange,
    ResponseTokens,
    RolloutError,
    RolloutOutput,
    TrajectoryStep,
)

pytestmark = pytest.mark.trl

#: the largest |trainer - sampler| logprob difference allowed on a sampled token: 4
#: float32 ulps at |logprob| ~ 7 (one ulp is 2**-21 = 4.8e-7 on [4, 8); measured: 4.8e-7
#: to 9.5e-7, 1-2 ulps)
TOLERANCE = 2e-6
#: Gemma 4's bound: 16 ulps (7.6e-6). Its float32 forward rounds more than the others'
#: (sqrt(hidden) embedding scale, per-layer embeddings, logit softcapping), and both sides
#: compute the same function over differently shaped inputs: the sampler one sequence with
#: a growing KV cache, TRL the group left-padded into one batch through its fused LM head.
#: Measured on the tiny checkpoint with plain transformers (same weights, ids, images):
#: in float64 (Gemma 4's internal float32 casts kept at float64) TRL's padded batch, the
#: sequence alone and the sequence decoded token by token agree within 3.6e-15 (2 float64
#: ulps at |logprob| 8), so no input differs (type ids, mask, positions, image positions);
#: in float32 the same three differ by up to 4.3e-6, the sampler is 2.4e-6 (5 ulps) and
#: TRL 3.5e-6 (7 ulps) from the float64 value, and they differ from each other by 3.8e-6
#: (8 ulps): float32 reduction order, not a mismatch. A real one (a dropped image, a
#: wrong position) is orders of magnitude larger.
TOLERANCES = {"gemma4": 16 * 2**-21}


def tolerance(family: str) -> float:
    """The largest |trainer - sampler| logprob difference allowed for ``family``."""
    return TOLERANCES.get(family, TOLERANCE)


# every family: LFM2-VL's and Kimi-K2.5's image processors (torchvision's alone in
# transformers) through vf_mm's torch-only ports, the trl tier's venv having no torchvision
FAMILIES = (*VISION_FAMILIES, "text")
# TRL takes one sequence per completion, so a multi-turn rollout trains only under a
# template that renders earlier turns as it prompted them: Qwen3-VL's Instruct template
# (Qwen3-VL's default, the Thinking checkpoints', drops a turn's thought once a new user
# turn comes, and its rollouts are refused by name: the test after the next)
QWEN = (("qwen2_5_vl", None), ("qwen3_vl", "instruct"))


def token_mean(state) -> float:
    """A reward that differs between rollouts from the first step (a random model's
    tokens): the mean sampled token id, scaled."""
    ids = [t for step in state["trajectory"] for t in step.tokens.completion_ids]
    return sum(ids) / len(ids) / 1000


def pictures_env(*, text: bool = False) -> vf.SingleTurnEnv:
    """Four examples: one image, then two (of another shape), alternately; noise, so
    every image differs. ``text``: the same questions without images."""
    rng = np.random.default_rng(0)
    rows = []
    for i in range(4):
        sizes = [(64, 64)] + ([(96, 48)] if i % 2 else [])
        images = [
            Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)) for w, h in sizes
        ]
        rows.append({"question": f"What is in picture {i}?", "answer": str(i)})
        if not text:
            rows[-1]["images"] = images
    return vf.SingleTurnEnv(dataset=rows, rubric=vf.Rubric([token_mean]))


def gridnav_env(**kwargs) -> vf.Environment:
    env = vf.load_environment("gridnav", difficulty="easy", num_examples=4, max_turns=2, **kwargs)
    env.rubric = vf.Rubric([token_mean], parser=env.parser)
    return env


def load_model(family: str, path):
    if family == "text":
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(path)
    return model_class(family, checkpoint=path).from_pretrained(path)


def config(tmp_path, **overrides):
    from trl import GRPOConfig

    options = dict(
        output_dir=str(tmp_path / "out"), use_cpu=True, bf16=False, max_steps=1,
        per_device_train_batch_size=4, num_generations=2, learning_rate=1e-2,
        logging_steps=1, report_to="none", save_strategy="no", seed=0,
    )  # fmt: skip
    return GRPOConfig(**{**options, **overrides})


@dataclasses.dataclass
class Run:
    """One training run and what it saw: each generation's rollouts (outputs, records),
    each loss forward's rows and log-probabilities, and each forward's inputs."""

    trainer: object
    rollouts: object
    before: dict[str, torch.Tensor]
    generations: list[tuple[list, list]] = dataclasses.field(default_factory=list)
    losses: list[tuple[list, torch.Tensor, int, dict]] = dataclasses.field(default_factory=list)
    forwards: list[dict] = dataclasses.field(default_factory=list)

    @property
    def logs(self) -> list[dict]:
        return [h for h in self.trainer.state.log_history if "loss" in h]


def train(trl, family, path, env, tmp_path, *, max_tokens=6, **overrides) -> Run:
    model = load_model(family, path)
    inputs = trl.trl_inputs(env, path, sampling_args={"max_tokens": max_tokens})
    trainer = trl.GRPOTrainer(model=model, args=config(tmp_path, **overrides), **inputs)
    run = Run(
        trainer, inputs["rollout_func"], {k: v.clone() for k, v in model.state_dict().items()}
    )
    generate = trainer._generate_and_score_completions
    logps = trainer._get_per_token_logps_and_entropies

    def spy_generate(batch):
        out = generate(batch)
        run.generations.append((list(run.rollouts.outputs), list(run.rollouts.records)))
        return out

    def spy_logps(*args, **kwargs):
        start = len(run.forwards)
        out = logps(*args, **kwargs)
        if trainer._vf_mm_rows is not None:  # a loss forward (one model forward: one chunk)
            rows, step = list(trainer._vf_mm_rows), trainer.state.global_step
            run.losses.append((rows, out[0].detach(), step, run.forwards[start]))
        return out

    def spy_forward(module, args, kwargs):
        run.forwards.append(
            {k: v.detach().clone() for k, v in kwargs.items() if torch.is_tensor(v)}
        )

    trainer._generate_and_score_completions = spy_generate
    trainer._get_per_token_logps_and_entropies = spy_logps
    trainer.model.register_forward_pre_hook(spy_forward, with_kwargs=True)
    try:
        trainer.train()
    finally:
        run.rollouts.close()
    return run


def mismatch(rows, logps) -> dict[str, float]:
    """``logprob_mismatch`` of a loss forward's completions against the sampler's."""
    shape = tuple(logps.shape)
    sampler, mask = torch.zeros(shape), torch.zeros(shape)
    for i, row in enumerate(rows):
        sampler[i, : len(row.logprobs)] = torch.tensor(row.logprobs)
        mask[i, : len(row.env_mask)] = torch.tensor(row.env_mask, dtype=torch.float32)
    zeros = torch.zeros(shape, dtype=torch.long)
    batch = MicroBatch(
        input_ids=zeros, attention_mask=zeros, loss_mask=mask, logprobs=sampler,
        advantages=mask * 0, mm_token_type_ids=zeros, images=None,
        sources=[row.source for row in rows],
    )  # fmt: skip
    return logprob_mismatch(batch, logps.float())


def sampler_images(output) -> list:
    """The images the sampler was sent for a rollout's last turn (all of its images)."""
    if not output.trajectory or output.error is not None:
        return []
    data = output.trajectory[-1].tokens.multi_modal_data
    return [] if data is None else list(data.mm_items.get("image", []))


def check_agreement(run: Run, family: str, step: int = 0) -> dict[str, float]:
    """The loss forward of trainer step ``step``: its log-probabilities are the sampler's
    within ``tolerance(family)``, and its image inputs are exactly what the sampler was sent."""
    rows, logps, _, forward = next(loss for loss in run.losses if loss[2] == step)
    stats = mismatch(rows, logps)
    assert stats["tokens"] > 0
    assert stats["max_abs_diff"] <= tolerance(family), stats
    outputs = next(outs for outs, recs in run.generations if any(r is rows[0] for r in recs))
    ids = forward["input_ids"]
    if family == "text":
        assert "pixel_values" not in forward
        return stats
    vision = run.rollouts.vision
    sent = [image for row in rows for image in sampler_images(outputs[row.index])]
    assert sent, "the batch holds images"
    expected = model_inputs(family, ids, sent, image_token_ids=vision.embed_token_ids)
    expected.pop("batch_num_images", None)
    assert set(expected) <= set(forward), sorted(forward)
    for name, tensor in expected.items():
        assert torch.equal(forward[name], tensor.to(forward[name].dtype)), name
    kinds = [k for k in ("mm_token_type_ids", "token_type_ids") if k in forward]
    for kind in kinds:  # 1 exactly on the tokens that take image embeddings
        marks = torch.isin(ids, torch.tensor(vision.embed_token_ids)).long()
        assert torch.equal(forward[kind], marks), kind
    return stats


def moved(run: Run) -> int:
    after = run.trainer.accelerator.unwrap_model(run.trainer.model).state_dict()
    return sum(not torch.equal(run.before[k], after[k]) for k in run.before)


# -- every family, images in the prompt ------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_the_first_step_trains_on_the_samplers_tokens_logprobs_and_images(
    trl, checkpoints, tmp_path, family
):
    env = pictures_env(text=family == "text")
    run = train(trl, family, checkpoints(family), env, tmp_path)
    stats = check_agreement(run, family)
    log = run.logs[0]
    # the trainer logs the same agreement it measured (vf_mm/logprob_diff_max)
    assert log["vf_mm/logprob_diff_max"] == pytest.approx(stats["max_abs_diff"], abs=1e-9)
    assert log["vf_mm/mismatch_kl"] < 1e-10
    # the environment's reward (its rubric, on vf_mm's rollouts) is the reward TRL logs
    outputs, _ = run.generations[0]
    rewards = [o.reward for o in outputs]
    assert None not in rewards
    assert log[f"rewards/{env.env_id}/mean"] == pytest.approx(statistics.mean(rewards), rel=1e-5)
    assert log["vf_mm/token_mean"] == pytest.approx(statistics.mean(rewards), rel=1e-5)
    assert log["vf_mm/errors"] == 0
    # and TRL's update moved the parameters
    assert log["frac_reward_zero_std"] < 1
    assert moved(run) > 0


# -- images in later turns, weights every step -----------------------------------------


@pytest.mark.parametrize(("family", "variant"), QWEN)
def test_images_of_later_turns_train_and_the_sampler_gets_each_steps_weights(
    trl, checkpoints, tmp_path, family, variant
):
    from vf_mm.testing import build_tiny_vlm

    path = checkpoints(family) if variant is None else build_tiny_vlm(tmp_path / "m", family,
                                                                      variant=variant)  # fmt: skip
    run = train(trl, family, path, gridnav_env(), tmp_path, max_steps=2)
    _, records = run.generations[0]
    assert any(len(r.images) > 1 for r in records), "no rollout had an image after its prompt"
    check_agreement(run, family, step=0)
    # step 2 is sampled with step 1's update: the sampler took the trainer's weights (had
    # it kept the old ones, the trainer's log-probabilities would have moved away)
    assert moved(run) > 0
    check_agreement(run, family, step=1)
    assert run.rollouts.synced_step == 1
    assert run.rollouts._client is None  # closed
    assert all(log[f"rewards/{run.rollouts.env.env_id}/mean"] > 0 for log in run.logs)


def test_a_multi_turn_rollout_under_the_thinking_template_is_refused_naming_why(
    trl, checkpoints, tmp_path
):
    """Qwen3-VL's Thinking template opens a thought in each prompt and drops it from the
    history on the next user turn: turn 2's prompt is not turn 1's tokens, which one
    sequence per completion cannot train; every rollout fails saying so, none is cut."""
    with pytest.raises(TrajectoryError, match="renders earlier turns as it prompted them"):
        train(trl, "qwen3_vl", checkpoints("qwen3_vl"), gridnav_env(), tmp_path, max_steps=1)


def test_old_policy_and_reference_forwards_get_the_images_too(trl, checkpoints, tmp_path):
    """num_iterations > 1 (TRL computes the old policy's log-probabilities in its own
    forward) and beta > 0 (a reference model's forward): both run with the images, and
    with gradient accumulation (a generated batch split over micro-steps)."""
    run = train(
        trl, "qwen2_5_vl", checkpoints("qwen2_5_vl"), gridnav_env(), tmp_path,
        max_steps=2, num_iterations=2, beta=0.04, gradient_accumulation_steps=2,
    )  # fmt: skip
    check_agreement(run, "qwen2_5_vl", step=0)
    assert len(run.forwards) > len(run.losses)  # the old-policy forward happened
    logs = run.logs
    assert "vf_mm/mismatch_kl" in logs[0]
    assert "vf_mm/mismatch_kl" not in logs[1]  # the second pass trains a moved policy
    # before the first update the policy is the reference: their forwards agree only if
    # the reference's got the same images
    assert logs[0]["kl"] < 1e-9
    assert logs[1]["kl"] > 0


def test_truncated_completions_with_images_are_not_fed_to_a_masked_forward(
    trl, checkpoints, tmp_path
):
    """mask_truncated_completions zeroes the attention over a completion that does not
    end: one holding images becomes a row with nothing to learn (TRL would train on
    neither), keeping its reward."""
    run = train(
        trl, "qwen2_5_vl", checkpoints("qwen2_5_vl"), gridnav_env(), tmp_path,
        mask_truncated_completions=True,
    )  # fmt: skip
    outputs, records = run.generations[0]
    ends = run.trainer.completion_ends()
    embeds = set(run.rollouts.vision.embed_token_ids)
    for record in records:
        truncated = record.completion_ids[-1] not in ends
        assert not (truncated and embeds.intersection(record.completion_ids)), record.source
    assert any(record.images == [] and record.env_mask == [0] for record in records)
    assert None not in [o.reward for o in outputs]


# -- what fails, and how -----------------------------------------------------------------


def failing_reward(answer) -> float:
    if answer in ("1", "3"):
        raise ValueError(f"no score for {answer}")
    return float(answer)


def test_a_failed_rollout_is_left_out_with_no_reward_and_the_rest_train(trl, checkpoints, tmp_path):
    env = pictures_env(text=True)
    env.rubric = vf.Rubric([failing_reward, token_mean], [1.0, 1.0])
    run = train(trl, "text", checkpoints("text"), env, tmp_path, per_device_train_batch_size=8)
    outputs, records = run.generations[0]
    failed = [r for r, o in zip(records, outputs, strict=True) if o.error is not None]
    assert len(failed) == 4
    assert all(r.env_mask == [0] and r.images == [] for r in failed)
    assert run.logs[0]["vf_mm/errors"] == pytest.approx(0.5)
    scored = [o.reward for o in outputs if o.error is None]
    assert run.logs[0]["rewards/SingleTurnEnv/mean"] == pytest.approx(statistics.mean(scored))
    assert moved(run) > 0


def test_a_first_batch_whose_rollouts_all_failed_stops_training_naming_why(
    trl, checkpoints, tmp_path
):
    env = pictures_env(text=True)

    def broken(answer) -> float:
        raise ValueError("the rubric is broken")

    env.rubric = vf.Rubric([broken])
    with pytest.raises(
        TrajectoryError, match=r"every rollout of the first batch failed.*rubric is broken"
    ):
        train(trl, "text", checkpoints("text"), env, tmp_path)


def test_a_later_batch_whose_rollouts_all_failed_trains_on_nothing_and_goes_on(
    trl, checkpoints, tmp_path
):
    env = pictures_env(text=True)
    scored = []

    def flaky(state) -> float:  # the first batch's 4 rollouts score, the rest fail
        scored.append(1)
        if len(scored) > 4:
            raise ValueError("the scorer went away")
        return token_mean(state)

    env.rubric = vf.Rubric([flaky])
    run = train(trl, "text", checkpoints("text"), env, tmp_path, max_steps=2)
    assert [log["vf_mm/errors"] for log in run.logs] == [0.0, 1.0]
    assert all(o.error is not None for o in run.generations[1][0])


def rollout_of(steps, *, error=None) -> RolloutOutput:
    return RolloutOutput(
        example_id=7, prompt=[], completion=[], trajectory=steps, reward=1.0, error=error
    )


def step(prompt, completion, data=None) -> TrajectoryStep:
    tokens = ResponseTokens(
        prompt, completion, [-1.0] * len(completion), [1] * len(completion), "stop", data
    )
    return TrajectoryStep(prompt=[], completion=[], tokens=tokens)


@pytest.fixture
def bare(trl):
    """A ``TRLRollouts`` that was never started: enough to turn outputs into rows."""
    rollouts = trl.TRLRollouts(pictures_env(text=True), "unused", [], family="qwen2_5_vl")
    rollouts._pad_id, rollouts._eos_id = 0, 2
    return rollouts


def test_the_sampler_samples_by_the_grpo_config(bare, tmp_path):
    """TRL's loss divides the logits by the config's temperature: the sampler samples at
    it (and its top_p, top_k, min_p); max_tokens per turn is the environment's if it set
    one, else max_completion_length."""
    args = config(
        tmp_path, temperature=0.7, top_p=0.9, top_k=5, min_p=0.1, max_completion_length=12
    )
    got = bare._sampling(args)
    assert (got.temperature, got.top_p, got.top_k, got.min_p, got.max_tokens) == (
        0.7,
        0.9,
        5,
        0.1,
        12,
    )
    bare.sampling_args = {"max_tokens": 3, "temperature": 0.2}
    got = bare._sampling(args)
    assert (got.max_tokens, got.temperature, got.logprobs) == (3, 0.7, True)


def test_a_rollout_whose_turns_do_not_extend_each_other_fails_alone(bare):
    out = rollout_of([step([1, 5, 6], [7, 8]), step([1, 9, 9, 9], [3])])  # history rewritten
    record, error = bare._record(out, 3, "example 7, rollout 1")
    assert "example 7, rollout 1" in error and "TRL takes one sequence" in error
    # where and why (vf_mm.training.history_break): before any sampled token, no messages
    assert "position 1" in error and "in the first prompt, before model turn 1" in error
    # a model turn re-rendered by the template is named as such, not as the environment's
    out = rollout_of([step([1, 5, 6], [7, 8]), step([1, 5, 6, 7, 9, 4], [3])])
    _, error = bare._record(out, 0, "x")
    assert "inside model turn 1's sampled tokens" in error and "stop tokens" in error
    assert (record.prompt_ids, record.completion_ids, record.env_mask) == ([0], [2], [0])
    assert record.index == 3
    good, none = bare._record(
        rollout_of([step([1, 5, 6], [7, 8]), step([1, 5, 6, 7, 8, 4], [3])]), 0, "x"
    )
    assert none is None
    assert (good.prompt_ids, good.completion_ids, good.env_mask) == (
        [1, 5, 6],
        [7, 8, 4, 3],
        [1, 1, 0, 1],
    )
    assert good.logprobs == [-1.0, -1.0, 0.0, -1.0]


def test_a_rollout_with_a_video_fails_alone_naming_why(bare):
    bare.vision = type(
        "Vision", (), {"image_token_id": 5, "video_token_id": 6, "embed_token_ids": (5,)}
    )
    data = MultiModalData(
        mm_hashes={"video": ["h"]},
        mm_placeholders={"video": [PlaceholderRange(1, 2)]},
        mm_items={
            "video": [
                {"pixel_values_videos": np.zeros((4, 3)), "video_grid_thw": np.array([[1, 2, 2]])}
            ]
        },
    )
    record, error = bare._record(
        rollout_of([step([1, 6, 6], [7], data)]), 0, "example 7, rollout 0"
    )
    assert "videos" in error and "TRL 1.16" in error
    assert record.env_mask == [0]
    failed = RolloutError("ValueError", "bad move", "turn 1: env_response")
    _, error = bare._record(rollout_of([step([1], [7])], error=failed), 1, "example 7, rollout 1")
    assert error == "example 7, rollout 1: ValueError: bad move (turn 1: env_response)"


@pytest.mark.parametrize(
    ("setting", "named"),
    [
        ({"use_vllm": True}, "use_vllm"),
        ({"use_liger_kernel": True}, "use_liger_kernel"),
        ({"repetition_penalty": 1.2}, "repetition_penalty"),
        ({"generation_kwargs": {"top_k": 3}}, "generation_kwargs"),
        ({"off_policy_mask_threshold": 0.5, "temperature": 0.7}, "off_policy_mask_threshold"),
    ],
)
def test_settings_it_cannot_honour_are_refused_before_anything_loads(
    trl, checkpoints, tmp_path, setting, named
):
    path = checkpoints("text")
    inputs = trl.trl_inputs(pictures_env(text=True), path)
    with pytest.raises(ValueError, match=named):
        trl.GRPOTrainer(model=str(path), args=config(tmp_path, **setting), **inputs)


def test_trls_own_tool_loop_is_refused(trl, checkpoints, tmp_path):
    path = checkpoints("text")

    def look() -> str:
        """Look around."""
        return "a wall"

    inputs = trl.trl_inputs(pictures_env(text=True), path)
    with pytest.raises(ValueError, match="tools / environment_factory"):
        trl.GRPOTrainer(model=str(path), args=config(tmp_path), tools=[look], **inputs)


def test_trls_own_trainer_is_refused_before_its_forward_sees_an_image(trl, checkpoints, tmp_path):
    from trl import GRPOTrainer

    path = checkpoints("qwen2_5_vl")
    inputs = trl.trl_inputs(pictures_env(), path)
    trainer = GRPOTrainer(model=load_model("qwen2_5_vl", path), args=config(tmp_path), **inputs)
    with pytest.raises(TypeError, match=r"vf_mm\.integrations\.trl import GRPOTrainer"):
        trainer.train()


def test_a_dataset_that_is_not_trl_inputs_is_refused(trl, checkpoints, tmp_path):
    import datasets

    path = checkpoints("text")
    inputs = trl.trl_inputs(pictures_env(text=True), path)
    inputs["train_dataset"] = datasets.Dataset.from_list(
        [{"prompt": [{"role": "user", "content": "hi"}]}] * 4
    )
    trainer = trl.GRPOTrainer(model=load_model("text", path), args=config(tmp_path), **inputs)
    try:
        with pytest.raises(TypeError, match=trl.EXAMPLE_COLUMN):
            trainer.train()
    finally:
        inputs["rollout_func"].close()


def test_another_rollout_func_is_refused(trl, checkpoints, tmp_path):
    path = checkpoints("text")
    inputs = trl.trl_inputs(pictures_env(text=True), path)
    inputs["rollout_func"] = lambda prompts, trainer: {}
    with pytest.raises(TypeError, match="trl_inputs"):
        trl.GRPOTrainer(model=str(path), args=config(tmp_path), **inputs)


def test_another_trl_version_is_refused_naming_the_one_to_install(
    trl, checkpoints, tmp_path, monkeypatch
):
    import trl as upstream

    monkeypatch.setattr(upstream, "__version__", "1.17.0")
    path = checkpoints("text")
    inputs = trl.trl_inputs(pictures_env(text=True), path)
    with pytest.raises(MissingDependencyError, match=r"TRL 1\.17\.0 is installed.*trl==1\.16\.0"):
        trl.GRPOTrainer(model=str(path), args=config(tmp_path), **inputs)


def test_a_hub_model_id_is_refused_naming_the_download(trl, tmp_path):
    """TRL's ``model=`` takes a Hub id; vf_mm's renderer and sampler load a directory."""
    from vf_mm.errors import UnsupportedModelError

    with pytest.raises(
        UnsupportedModelError, match=r"not a checkpoint directory.*snapshot_download"
    ):
        trl.trl_inputs(pictures_env(text=True), "Qwen/Qwen2.5-VL-3B-Instruct")
    with pytest.raises(UnsupportedModelError, match="not a checkpoint directory"):
        trl.trl_inputs(pictures_env(text=True), tmp_path / "missing")


def test_the_dataset_shows_each_prompt_and_names_its_example(trl, checkpoints):
    inputs = trl.trl_inputs(pictures_env(), checkpoints("qwen2_5_vl"), num_examples=3)
    dataset = inputs["train_dataset"]
    assert dataset.column_names == ["prompt", trl.EXAMPLE_COLUMN]
    assert dataset[trl.EXAMPLE_COLUMN] == [0, 1, 2]
    assert dataset[1]["prompt"] == [
        {"role": "user", "content": "<image><image>What is in picture 1?"}
    ]
    assert [f.__name__ for f in inputs["reward_funcs"]] == ["SingleTurnEnv"]
    assert type(inputs["processing_class"]).__name__.startswith("Qwen2_5_VLProcessor")


def test_the_guides_example_runs_as_written(trl, tmp_path, monkeypatch):
    from tests.test_docs_environments import REPO, blocks

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("VF_MM_ENV_PATH", str(REPO / "environments"))
    guide = (REPO / "docs" / "trainers.md").read_text(encoding="utf-8")
    code = [block for lang, block, _ in blocks(guide) if lang == "python"]
    assert len(code) == 1
    namespace: dict = {"__name__": "guide"}
    exec(compile(code[0], "docs/trainers.md", "exec"), namespace)
    trainer = namespace["trainer"]
    try:
        logs = [h for h in trainer.state.log_history if "rewards/gridnav/mean" in h]
        assert len(logs) == 2  # a log line per step
        assert all(log["vf_mm/logprob_diff_max"] <= tolerance("qwen2_5_vl") for log in logs)
    finally:
        trainer.rollout_func.close()
