"""RMSNorm in one fused kernel for the text layers of packed forwards.

Transformers' RMSNorm of the Qwen and Llama kinds computes, in eager PyTorch, ``weight *
(x.float() * rsqrt(mean(x.float() ** 2) + eps)).to(x.dtype)``: six or seven kernels
(casts, a power, a mean, an addition, a square root, two products) for each norm, two
or four a layer. In a CUDA-graph decode step of a 3B model at 32 rows they are about a
tenth of the step, kernels of a few microseconds each. ``torch.nn.functional.rms_norm``
computes the normalisation in float32 in one kernel; the weight is then applied as the
module does, in the model's dtype, after the cast.

A norm is replaced only where a probe shows the fused form computes the module's own
output (``fused_forward``): the module's class is run on a random input beside the
fused form, and they must agree to within one bfloat16 rounding. A norm of another
formula (Gemma's ``1 + weight``, a norm with an offset or without a weight) fails the
probe and keeps its forward. The replacement holds only inside ``fused`` (the length of a
packed forward), so other callers of the model (a trainer's reference forward) see the
model's own norms.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence

import torch

Forward = Callable[[torch.Tensor], torch.Tensor]


def fused_forward(module: torch.nn.Module) -> Forward | None:
    """The fused forward of RMSNorm ``module``, or None where the probe finds it would
    not compute the module's own output (or ``module`` is no weighted RMSNorm)."""
    weight = getattr(module, "weight", None)
    eps = getattr(module, "variance_epsilon", getattr(module, "eps", None))
    if not isinstance(weight, torch.Tensor) or weight.dim() != 1 or not isinstance(eps, float):
        return None
    width = weight.shape[0]

    def forward(hidden: torch.Tensor) -> torch.Tensor:
        normed = torch.nn.functional.rms_norm(hidden.float(), (width,), eps=eps)
        return weight * normed.to(hidden.dtype)

    generator = torch.Generator(device="cpu").manual_seed(0)
    probe = (3 * torch.randn((4, width), generator=generator)).to(weight.device, weight.dtype)
    with torch.no_grad():
        own, fused = module(probe).float(), forward(probe).float()
    if own.shape != fused.shape or not torch.allclose(fused, own, rtol=2**-7, atol=1e-6):
        return None
    return forward


def fusable_norms(modules: Sequence[torch.nn.Module]) -> dict[torch.nn.Module, Forward]:
    """Each module of ``modules`` whose class name ends in ``RMSNorm`` and whose probe
    passes, with its fused forward."""
    out: dict[torch.nn.Module, Forward] = {}
    for module in modules:
        if type(module).__name__.endswith("RMSNorm"):
            forward = fused_forward(module)
            if forward is not None:
                out[module] = forward
    return out


@contextlib.contextmanager
def fused(norms: dict[torch.nn.Module, Forward]) -> Iterator[None]:
    """``norms``' modules run their fused forward for the block (an exception
    included: each gets its class's forward back after)."""
    for module, forward in norms.items():
        module.forward = forward  # the instance's, over the class's
    try:
        yield
    finally:
        for module in norms:
            del module.forward
