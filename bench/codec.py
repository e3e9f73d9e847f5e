"""Codec benchmark: vf_mm.wire against named baselines, side by side in one process.

Payloads:
  rollout   one rollout as a trainer receives it: token ids as Python lists (8000
            prompt ids, 2000 completion ids, 2000 logprobs, a 2000-long mask) and six
            images' ``pixel_values`` of shape (1024, 1176) with their ``image_grid_thw``
            (the Qwen2-VL layout of a 448x448 image), three in float32 and three in
            bfloat16: 21.7 MB of tensors
  batch     a training batch of 64 rollouts (1500 prompt ids, 500 completion ids,
            logprobs and mask each as lists, four images each), once in float32
            (1.23 GB of tensors) and once in bfloat16

Baselines (each encodes to an in-memory buffer and decodes it back):
  pickle-5         pickle.dumps(obj, protocol=5) / pickle.loads
  torch.save       torch.save to BytesIO / torch.load(weights_only=True)
  msgpack-list     msgpack with tensors as .tolist() (timed on a sample, scaled up:
                   the whole payload would need many GB of Python floats)
  plain-copy       one copy of every tensor's bytes into one fresh buffer (np.empty,
                   the allocator the encoder uses): the physical floor of any encoder
                   that returns a new contiguous message
  plain-copy warm  the same copy into a buffer reused from the previous round: the
                   floor for ``Encoder(reuse_buffer=True)``, which skips the page faults

vf_mm runs as ``packb``/``unpackb`` (a fresh buffer per message) and as
``Encoder(reuse_buffer=True)`` (the last message's buffer, once dropped, is reused).

Contenders run round-robin (one unrecorded warm-up round, then ``--repeat`` rounds)
and each keeps its best time; the headline ratio is also given at the median. Prints
GB/s of tensor bytes, each codec's round trip against vf_mm's, vf_mm against the plain
copy (target: round trip <= 1.5x the fresh copy), where vf_mm's time goes (token lists,
tensors, page faults), then decode time against payload size, which should stay flat:
vf_mm decodes to views of the message, so it never copies tensor bytes.

    python bench/codec.py            # every payload (the batch needs ~6 GB of memory)
    python bench/codec.py --quick    # the rollout, and a 4-rollout batch, 3 rounds
    python bench/codec.py --only rollout
"""

from __future__ import annotations

import argparse
import gc
import io
import os
import pickle
import platform
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import msgpack
import msgspec
import numpy as np
import torch
from _machine import cpu_name

import vf_mm
from vf_mm.wire import Encoder, packb, unpackb

# -- payloads ------------------------------------------------------------------------------


def image(gen: torch.Generator, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """One 448x448 image as Qwen2-VL's processor makes it."""
    return {
        "pixel_values": torch.randn(1024, 1176, generator=gen).to(dtype),
        "image_grid_thw": torch.tensor([1, 32, 32]),
    }


def rollout_message(seed: int = 0) -> dict[str, Any]:
    """One multi-turn rollout with six images (three float32, three bfloat16)."""
    gen = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    return {
        "example_id": 7,
        "rollout_index": 3,
        "prompt_ids": rng.integers(0, 151_643, size=8_000).tolist(),
        "completion_ids": rng.integers(0, 151_643, size=2_000).tolist(),
        "completion_logprobs": (-rng.random(2_000)).tolist(),
        "completion_mask": [1] * 2_000,
        "reward": 0.75,
        "advantage": 0.31,
        "images": [image(gen, torch.float32) for _ in range(3)]
        + [image(gen, torch.bfloat16) for _ in range(3)],
    }


def batch_payload(rollouts: int, dtype: torch.dtype, seed: int = 0) -> list[dict[str, Any]]:
    """A training batch: ``rollouts`` rollouts of four images each."""
    gen = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    return [
        {
            "example_id": i,
            "prompt_ids": rng.integers(0, 151_643, size=1_500).tolist(),
            "completion_ids": rng.integers(0, 151_643, size=500).tolist(),
            "completion_logprobs": (-rng.random(500)).tolist(),
            "completion_mask": [1] * 500,
            "reward": float(rng.random()),
            "images": [image(gen, dtype) for _ in range(4)],
        }
        for i in range(rollouts)
    ]


def tensors(obj: Any) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for value in obj.values():
            yield from tensors(value)
    elif isinstance(obj, list):
        for value in obj:
            yield from tensors(value)


def strip(obj: Any, keep_tensors: bool) -> Any:
    """``obj`` with only its tensors (``keep_tensors``) or only everything else."""
    if isinstance(obj, dict):
        out = {k: strip(v, keep_tensors) for k, v in obj.items()}
        return {k: v for k, v in out.items() if v is not _DROP}
    if isinstance(obj, list) and obj and isinstance(obj[0], dict | torch.Tensor):
        return [v for v in (strip(v, keep_tensors) for v in obj) if v is not _DROP]
    if isinstance(obj, torch.Tensor) == keep_tensors:
        return obj
    return _DROP


_DROP = object()


def tensor_bytes(obj: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors(obj))


def list_counts(obj: Any) -> tuple[int, int]:
    """How many ints and floats the payload's Python lists hold."""
    ints = floats = 0
    stack = [obj]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            if item and type(item[0]) is int:
                ints += len(item)
            elif item and type(item[0]) is float:
                floats += len(item)
            else:
                stack.extend(item)
    return ints, floats


def check_equal(sent: Any, got: Any) -> None:
    if isinstance(sent, torch.Tensor):
        assert isinstance(got, torch.Tensor) and got.dtype == sent.dtype
        assert got.shape == sent.shape
        assert torch.equal(got.view(-1).view(torch.uint8), sent.reshape(-1).view(torch.uint8))
    elif isinstance(sent, dict):
        assert set(sent) == set(got)
        for key in sent:
            check_equal(sent[key], got[key])
    elif isinstance(sent, list) and sent and isinstance(sent[0], dict | torch.Tensor):
        assert len(sent) == len(got)
        for a, b in zip(sent, got, strict=True):
            check_equal(a, b)
    else:
        assert sent == got or list(sent) == list(got)


# -- the contenders: (encode, decode) -----------------------------------------------------


def pickle_codec() -> tuple[Callable, Callable]:
    return (lambda obj: pickle.dumps(obj, protocol=5)), pickle.loads


def torch_save_codec() -> tuple[Callable, Callable]:
    def enc(obj: Any) -> Any:
        buf = io.BytesIO()
        torch.save(obj, buf)
        return buf.getbuffer()

    def dec(data: Any) -> Any:
        return torch.load(io.BytesIO(data), weights_only=True)

    return enc, dec


def msgpack_list_codec() -> tuple[Callable, Callable]:
    def default(obj: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            return {"dtype": str(obj.dtype), "shape": list(obj.shape), "data": obj.float().tolist()}
        raise TypeError(type(obj))

    def hook(d: dict) -> Any:
        if "dtype" in d and "data" in d:
            dtype = getattr(torch, d["dtype"].removeprefix("torch."))
            return torch.tensor(d["data"], dtype=dtype).reshape(d["shape"])
        return d

    return (lambda obj: msgpack.packb(obj, default=default)), (
        lambda data: msgpack.unpackb(data, object_hook=hook)
    )


def sources(payload: Any) -> list[np.ndarray]:
    return [t.reshape(-1).view(torch.uint8).numpy() for t in tensors(payload)]


def plain_copy(payload: Any) -> Callable[[Any], np.ndarray]:
    """One copy of every tensor's bytes into one fresh buffer (no headers, no structure)."""
    srcs = sources(payload)
    total = sum(s.size for s in srcs)

    def run(_obj: Any) -> np.ndarray:
        out = np.empty(total, dtype=np.uint8)
        pos = 0
        for s in srcs:
            out[pos : pos + s.size] = s
            pos += s.size
        return out

    return run


def plain_copy_warm(payload: Any) -> Callable[[Any], None]:
    """The same copy into one buffer kept from call to call."""
    srcs = sources(payload)
    out = np.ones(sum(s.size for s in srcs), dtype=np.uint8)

    def run(_obj: Any) -> None:
        pos = 0
        for s in srcs:
            out[pos : pos + s.size] = s
            pos += s.size

    return run


# -- measuring ----------------------------------------------------------------------------


def round_robin(
    contenders: dict[str, tuple[Callable, Callable | None]],
    payload: Any,
    repeat: int,
    *,
    check: bool = True,
) -> dict[str, tuple[list[float], list[float]]]:
    """Encode and decode times of each contender, ``repeat`` rounds after a warm-up round
    (round-robin, so drift in the machine's state hits all alike)."""
    times: dict[str, tuple[list[float], list[float]]] = {k: ([], []) for k in contenders}
    for round_ in range(repeat + 1):
        for label, (enc, dec) in contenders.items():
            gc.collect()
            start = time.perf_counter()
            blob = enc(payload)
            t_enc = time.perf_counter() - start
            t_dec = 0.0
            if dec is not None:
                start = time.perf_counter()
                back = dec(blob)
                t_dec = time.perf_counter() - start
                if round_ == 0 and check:
                    check_equal(payload, back)
                del back
            del blob
            if round_:
                times[label][0].append(t_enc)
                times[label][1].append(t_dec)
    return times


def best(samples: list[float]) -> float:
    return min(samples)


def run_case(name: str, payload: Any, repeat: int, list_sample: Any) -> None:
    nbytes = tensor_bytes(payload)
    ints, floats = list_counts(payload)
    print(
        f"\n== {name}: {nbytes / 1e6:,.1f} MB of tensors in {sum(1 for _ in tensors(payload))} "
        f"tensors, {ints:,} ints and {floats:,} floats in Python lists; best of {repeat} rounds"
    )
    reuse = Encoder(reuse_buffer=True)
    contenders: dict[str, tuple[Callable, Callable | None]] = {
        "vf_mm": (packb, unpackb),
        "vf_mm reuse_buffer": (reuse.encode, unpackb),
        "pickle-5": pickle_codec(),
        "torch.save": torch_save_codec(),
        "plain-copy": (plain_copy(payload), None),
        "plain-copy warm": (plain_copy_warm(payload), None),
    }
    times = round_robin(contenders, payload, repeat)
    rows = {label: (best(te), best(td)) for label, (te, td) in times.items()}

    enc, dec = msgpack_list_codec()
    scale = nbytes / tensor_bytes(list_sample)
    list_times = round_robin({"msgpack-list": (enc, dec)}, list_sample, 1)["msgpack-list"]
    rows[f"msgpack-list (x{scale:.0f})"] = (
        best(list_times[0]) * scale,
        best(list_times[1]) * scale,
    )
    for label in ("plain-copy", "plain-copy warm"):  # keep the floors at the bottom
        rows[label] = rows.pop(label)

    ours_rt = sum(rows["vf_mm"])
    header = (
        f"{'codec':<24}{'encode ms':>11}{'decode ms':>11}{'encode GB/s':>13}{'decode GB/s':>13}"
        f"{'round trip GB/s':>17}{'round trip / vf_mm':>20}"
    )
    print(header)
    print("-" * len(header))
    for label, (te, td) in rows.items():
        rt = te + td
        dec_ms = f"{td * 1e3:11.2f}" if td else f"{'-':>11}"
        dec_rate = f"{nbytes / td / 1e9:13.2f}" if td else f"{'-':>13}"
        print(
            f"{label:<24}{te * 1e3:11.2f}{dec_ms}{nbytes / te / 1e9:13.2f}{dec_rate}"
            f"{nbytes / rt / 1e9:17.2f}{rt / ours_rt:20.2f}"
        )

    copy = rows["plain-copy"][0]
    warm = rows["plain-copy warm"][0]
    reuse_rt = sum(rows["vf_mm reuse_buffer"])
    med = statistics.median(
        (a + b) / c for a, b, c in zip(*times["vf_mm"], times["plain-copy"][0], strict=True)
    )
    print(
        f"vf_mm round trip: {sum(rows['pickle-5']) / ours_rt:.2f}x faster than pickle-5, "
        f"{sum(rows['torch.save']) / ours_rt:.2f}x faster than torch.save; "
        f"{ours_rt / copy:.2f}x the fresh plain copy (target <= 1.5x; round by round, "
        f"median {med:.2f}x)"
    )
    print(
        f"vf_mm reuse_buffer round trip: {reuse_rt / warm:.2f}x the warm plain copy, "
        f"{reuse_rt / copy:.2f}x the fresh plain copy"
    )
    breakdown(payload, repeat)


def breakdown(payload: Any, repeat: int) -> None:
    """Where vf_mm's round trip goes: the token lists, the tensors, the fresh buffer."""
    lists_only = strip(payload, keep_tensors=False)
    tensors_only = strip(payload, keep_tensors=True)
    size = len(packb(payload))
    kept = np.empty(size, dtype=np.uint8)
    parts = {
        "lists": round_robin({"x": (packb, unpackb)}, lists_only, repeat),
        "lists by msgpack": round_robin(
            {"x": (msgpack.packb, msgspec.msgpack.decode)}, lists_only, repeat
        ),
        "tensors": round_robin({"x": (packb, unpackb)}, tensors_only, repeat),
        "fresh": round_robin(
            {"x": (lambda _obj: np.ones(size, dtype=np.uint8), None)}, None, repeat, check=False
        ),
        "warm": round_robin({"x": (lambda _obj: kept.fill(1), None)}, None, repeat, check=False),
    }
    (te, td), (me, md), (ue, ud), (fresh, _), (warm, _) = (
        (best(enc) * 1e3, best(dec) * 1e3 if dec[0] else 0.0)
        for enc, dec in (part["x"] for part in parts.values())
    )
    print(
        f"  where it goes: the token lists alone encode in {te:.2f} ms (msgpack's packer: "
        f"{me:.2f}) and decode in {td:.2f} ms (msgspec alone: {md:.2f}); the tensors alone "
        f"encode in {ue:.2f} ms and decode in {ud:.3f} ms; filling a fresh {size / 1e6:,.1f} MB "
        f"buffer takes {fresh:.2f} ms, a warm one {warm:.2f} ms (the difference, page faults and "
        f"zero-filling by the kernel: {fresh - warm:.2f} ms)"
    )


def decode_scaling(rollouts: int, repeat: int) -> None:
    print("\n== vf_mm decode time against payload size (flat per image = no copy of tensor bytes)")
    for n in sorted({max(1, rollouts // 8), max(1, rollouts // 2), rollouts}):
        payload = batch_payload(n, torch.float32, seed=1)
        blob = packb(payload)
        t_dec = best(
            round_robin({"d": (lambda _o, b=blob: b, unpackb)}, None, repeat, check=False)["d"][1]
        )
        per_item = t_dec / (n * 4) * 1e6
        print(
            f"{tensor_bytes(payload) / 1e9:8.3f} GB  decode {t_dec * 1e3:8.2f} ms  "
            f"({per_item:.1f} us per image with its rollout's token lists)"
        )
        del payload, blob
        gc.collect()


def machine() -> str:
    cpu = cpu_name()
    return (
        f"{cpu}, {os.cpu_count()} cores, torch threads {torch.get_num_threads()} | "
        f"Python {platform.python_version()}, vf_mm {vf_mm.__version__} "
        f"({os.path.dirname(vf_mm.__file__)}), torch {torch.__version__}, "
        f"numpy {np.__version__}, msgpack {'.'.join(map(str, msgpack.version))}, "
        f"msgspec {msgspec.__version__}"
    )


def warm_allocator(nbytes: int) -> None:
    """Fault in and free a payload-sized buffer a few times before any timing, so that
    whichever codec runs first does not pay the kernel's first-touch costs alone."""
    for _ in range(3):
        np.ones(nbytes, dtype=np.uint8)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small batch, 3 rounds (smoke run)")
    parser.add_argument("--only", choices=("rollout", "batch"), default=None)
    parser.add_argument("--rollouts", type=int, default=64, help="rollouts in the batch")
    parser.add_argument("--repeat", type=int, default=5, help="rounds for the batch")
    parser.add_argument("--rollout-repeat", type=int, default=100, help="rounds for the rollout")
    args = parser.parse_args()
    rollouts, repeat, rollout_repeat = (
        (4, 3, 20) if args.quick else (args.rollouts, args.repeat, args.rollout_repeat)
    )
    print(machine())
    if args.only in (None, "rollout"):
        payload = rollout_message()
        warm_allocator(2 * tensor_bytes(payload))
        sample = dict(payload, images=payload["images"][:1] + payload["images"][-1:])
        run_case("rollout message", payload, rollout_repeat, sample)
        del payload, sample
    if args.only in (None, "batch"):
        warm_allocator(rollouts * 4 * 1024 * 1176 * 4)
        for dtype in (torch.float32, torch.bfloat16):
            payload = batch_payload(rollouts, dtype)
            run_case(
                f"batch of {rollouts} rollouts, {str(dtype).removeprefix('torch.')}",
                payload,
                repeat,
                payload[:1],
            )
            del payload
            gc.collect()
        decode_scaling(rollouts, repeat)


if __name__ == "__main__":
    main()
