"""GRPO on the tiny VLM, end to end: sample, stream, batch, step, push weights back.

Each step:
  1. the local backend samples a group of rollouts for each of a few training rows of
     the single-turn ``shapes`` environment (easy setting: "How many circles?", 1-3);
  2. each scored group is packed (each distinct image's tensors once, and an id) and
     streamed over ZeroMQ (ipc) to the trainer side, which reads it back;
  3. the trainer turns rollouts into samples (loss mask on sampled tokens, the sampler's
     logprobs, group-normalised advantages, pixel_values / image_grid_thw) and packs them
     into micro-batches;
  4. the policy (a separate copy of the model) takes a GRPO step (importance ratio
     against the sampler's logprobs, clipping); before it, the policy's logprobs of the
     sampled tokens are compared with the sampler's (``mkl``: the masked k3 mismatch KL,
     ``max|d|``: the largest logprob difference; ``logprob_mismatch``): the two hold the
     same weights, so both stay near 0 and a jump means the trainer computes something
     other than what was sampled;
  5. the new weights go back into the local backend in place, and the trainer commits
     the step's groups: only now may their senders forget them (a trainer that died
     before this point would get them again, and skip any it had committed).

The model starts from random weights, so the example's reward is shaped: how close the
answer is to the expected ``<answer>N</answer>`` (difflib's similarity ratio), so that a
group's rollouts differ in reward from the first step; the exact-match rate is reported
beside it. It prints the reward curve and saves a PNG plot. CPU: a few minutes.

    python examples/train_grpo_tiny.py [--steps 40] [--out out/grpo]
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import statistics
import tempfile
import time
from pathlib import Path

import torch
from PIL import Image, ImageDraw

import vf_mm as vf
from vf_mm.inference import LocalBackend, SamplingParams
from vf_mm.models import model_class
from vf_mm.renderers import RendererPool, load_renderer
from vf_mm.testing import build_tiny_vlm
from vf_mm.training import (
    GroupReceiver,
    GroupSender,
    build_samples,
    group_advantages,
    grpo_loss,
    make_batches,
    pack_group,
    unpack_group,
)


def similarity(completion, answer) -> float:
    """Shaped reward: how close the reply is to ``<answer>N</answer>`` (1.0 = exact)."""
    text = completion[-1]["content"] if completion else ""
    return difflib.SequenceMatcher(None, text.strip(), f"<answer>{answer}</answer>").ratio()


def exact(completion, answer, parser) -> float:
    return float(parser.parse_answer(completion) == str(answer))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rows", type=int, default=8, help="training rows (groups) per step")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=10)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument(
        "--model", type=Path, default=None, help="checkpoint (default: a new tiny VLM)"
    )
    parser.add_argument("--out", type=Path, default=Path("out/grpo"))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model or build_tiny_vlm(Path(tmp) / "tiny", "qwen2_5_vl", seed=args.seed)
        curve = asyncio.run(train(args, Path(model_dir), Path(tmp)))
    plot(curve, args.out / "reward_curve.png")
    first, last = curve[0]["reward"], statistics.mean(c["reward"] for c in curve[-5:])
    print(
        f"\nmean reward: first step {first:.3f}, last 5 steps {last:.3f} ({last / max(first, 1e-9):.1f}x)"
    )
    print(f"plot: {args.out / 'reward_curve.png'}")


async def train(args: argparse.Namespace, model_dir: Path, tmp: Path) -> list[dict[str, float]]:
    env = vf.load_environment("shapes", difficulty="easy", seed=args.seed, num_examples=512)
    env.rubric = vf.Rubric([similarity, exact], [1.0, 0.0], parser=env.parser)
    renderer = RendererPool(lambda: load_renderer(model_dir), size=2)
    backend = LocalBackend(model_dir, device=args.device, max_batch=args.rows * args.group_size)
    client = vf.RendererClient(
        backend, renderer, sampling=SamplingParams(max_tokens=args.max_tokens)
    )
    with renderer.renderer() as r:
        image_token_id, pad_id = r.vision.image_token_id, r.tokenizer.pad_token_id
    policy = model_class("qwen2_5_vl").from_pretrained(model_dir).to(args.device)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=args.lr, weight_decay=0.0)
    address = f"ipc://{tmp}/rollouts.sock"
    # the trainer binds; it commits a step's groups after the step (autocommit=False). A
    # trainer in its own process would also pass ledger=PATH, so that after a restart it
    # skips the groups it had committed (docs/deployment.md, "Many workers, one trainer")
    receiver = GroupReceiver(address, bind=True, senders=None, timeout_s=600, autocommit=False)
    # rollout workers connect; at most one step's groups unacknowledged (the trainer reads
    # them after the step's sampling ends and commits them after its update, so a smaller
    # bound would stall the sampler here)
    sender = GroupSender(address, hwm=args.rows)
    run_id = f"grpo-tiny-seed{args.seed}"  # group ids: f"{run_id}/{step}/{example_id}"
    rows = env.get_dataset()
    curve = []
    print(f"{'step':>4} {'reward':>7} {'exact':>6} {'loss':>8} {'kl':>8} {'mkl':>8} "
          f"{'max|d|':>7} {'s':>5}")  # fmt: skip
    try:
        for step in range(args.steps):
            start = time.perf_counter()
            batch_rows = [rows[(step * args.rows + i) % len(rows)] for i in range(args.rows)]
            groups: dict[int, list] = {}

            async def ship(output, index, groups=groups, step=step):
                groups.setdefault(output.example_id, []).append(output)
                if len(groups[output.example_id]) == args.group_size:
                    outs = groups.pop(output.example_id)
                    advantages = group_advantages([o.reward for o in outs])
                    group_id = f"{run_id}/{step}/{output.example_id}"
                    await sender.asend(pack_group(outs, advantages=advantages, group_id=group_id))

            await env.evaluate(client, rows=batch_rows, rollouts_per_example=args.group_size,
                               concurrency=args.rows * args.group_size, on_result=ship)  # fmt: skip
            received = [next(receiver) for _ in range(args.rows)]
            samples, rewards, exacts = [], [], []
            for group in received:
                for rollout in unpack_group(group):
                    rewards.append(rollout.reward)
                    exacts.append(rollout.metrics.get("exact", 0.0))
                    if rollout.error is None and rollout.advantage:
                        samples += build_samples(rollout, advantage=rollout.advantage,
                                                 image_token_id=image_token_id)  # fmt: skip
            stats = {"loss": 0.0, "kl": 0.0, "mismatch_kl": 0.0, "max_abs_diff": 0.0}
            if samples:
                policy.train()
                batches = make_batches(samples, token_budget=8192, pad_token_id=pad_id,
                                       image_token_id=image_token_id,
                                       family=policy.config.model_type)  # fmt: skip
                optimizer.zero_grad()
                total = sum(float(b.loss_mask.sum()) for b in batches)
                for b in batches:
                    # s holds logprob_mismatch(b, token_logprobs(policy, b)) of this forward
                    loss, s = grpo_loss(policy, b)
                    (loss * s["tokens"] / total).backward()
                    for key in ("loss", "kl", "mismatch_kl"):
                        stats[key] += s[key] * s["tokens"] / total
                    stats["max_abs_diff"] = max(stats["max_abs_diff"], s["max_abs_diff"])
                torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
                optimizer.step()
                backend.load_weights(
                    {k: v.detach().to("cpu") for k, v in policy.state_dict().items()}
                )
            receiver.commit()  # the step is done with its groups: acknowledge them
            point = {
                "step": step,
                "reward": statistics.mean(rewards),
                "exact": statistics.mean(exacts),
                **stats,
            }
            curve.append(point)
            print(f"{step:>4} {point['reward']:>7.3f} {point['exact']:>6.2f} {point['loss']:>8.4f} "
                  f"{point['kl']:>8.4f} {point['mismatch_kl']:>8.1e} {point['max_abs_diff']:>7.4f} "
                  f"{time.perf_counter() - start:>5.1f}", flush=True)  # fmt: skip
    finally:
        # the trainer is this process, and it reads nothing more: every group it took is
        # committed (or the run failed), so the sender need not wait for the trainer to
        # take its end marker (a trainer in a process of its own would: keep the linger)
        sender.linger_s = 0
        sender.close()
        receiver.close()
        await backend.aclose()
    return curve


def plot(curve: list[dict[str, float]], path: Path, size: tuple[int, int] = (640, 360)) -> None:
    """A line plot of mean reward (blue) and exact-match rate (green) per step, drawn with PIL."""
    width, height = size
    margin = 40
    image = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(image)
    draw.rectangle([margin, margin // 2, width - margin // 2, height - margin], outline="black")
    steps = max(len(curve) - 1, 1)

    def xy(i: int, value: float) -> tuple[float, float]:
        x = margin + (width - 1.5 * margin) * i / steps
        y = (height - margin) - (height - 1.5 * margin) * max(0.0, min(1.0, value))
        return x, y

    for key, colour in (("reward", "blue"), ("exact", "green")):
        points = [xy(i, c[key]) for i, c in enumerate(curve)]
        if len(points) > 1:
            draw.line(points, fill=colour, width=2)
    for v in (0.0, 0.5, 1.0):
        draw.text((4, xy(0, v)[1] - 6), f"{v:.1f}", fill="black")
    draw.text((margin, height - margin + 8), f"step 0 .. {len(curve) - 1}", fill="black")
    draw.text((width - 230, height - margin + 8), "blue: mean reward, green: exact", fill="black")
    image.save(path)


if __name__ == "__main__":
    main()
