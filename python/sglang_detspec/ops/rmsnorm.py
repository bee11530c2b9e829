"""Public batch-invariant RMSNorm and fused add + RMSNorm.

Checks the arguments, then runs the fused Triton kernel (``rmsnorm_triton``,
one program per row) for CUDA tensors when Triton is present, or the torch
reference (``rmsnorm_ref``) elsewhere; the two agree bit for bit on the same
CUDA device. Row i of every output depends on row i of the inputs, the
weight and eps only: never on the row count or the other rows.

Semantics are those of SGLang 0.5.23's ``RMSNorm`` under deterministic
inference (``sglang/srt/layers/layernorm.py``: ``forward_cuda`` sends the
plain form to ``rms_norm_batch_invariant`` and the residual form to
``forward_native``): ``out = x / sqrt(mean(x**2) + eps) * weight`` computed in
float32 and rounded to x's dtype; with a residual, the sum ``x + residual``
is formed in float32, normalised unrounded, and returned rounded to x's
dtype as the new residual. Nothing is written in place (SGLang's default
CUDA kernels write in place; its deterministic path does not). The last bits
differ from SGLang's own kernels: the reduction order and the IEEE square
root here are the plugin's (``rmsnorm_ref`` states them).

The norm hook (``sglang_plugin/norm_hook.py``) runs :func:`fused_add_rms_norm`
only; SGLang's own plain-form kernel is already batch-invariant and one
kernel, so :func:`rms_norm` serves the tests and the benchmark
(``benchmark/bench_rmsnorm.py``), where it shows whether a plain form of
this kernel would win at some shape.
"""

from __future__ import annotations

import math
import numbers

import torch

from .choices import one_of
from .kernel_choice import use_triton
from .rmsnorm_ref import rms_norm_reference

NORM_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
# One program holds a whole row (padded to a power of two) in registers: 32768 float32
# over 16 warps is 64 per thread, no spills on sm_90.
MAX_HIDDEN = 32768
MAX_ROWS = 2**31 - 1  # grid dimension x of one launch


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, *, kernel: str = "auto") -> torch.Tensor:
    """Batch-invariant RMSNorm over the last dimension.

    ``out = round(float32(x) * rstd * float32(weight))`` with
    ``rstd = 1 / sqrt(mean(float32(x)**2) + eps)``, the sum of squares
    reduced by pairwise halving in float32 and the division and square root
    IEEE-rounded (``rmsnorm_ref``). Source: SGLang 0.5.23
    ``RMSNorm.forward_cuda`` in deterministic mode (``rms_norm_batch_invariant``).

    Args:
        x: [..., H] bfloat16 / float16 / float32, 1 <= H <= 32768; any
            layout (rows are gathered with ``reshape``).
        weight: [H] bfloat16 / float16 / float32, on x's device.
        eps: finite real >= 0, added to the mean square in float32.
        kernel: ``"auto"`` (Triton for CUDA tensors), ``"torch"`` or ``"triton"``.

    Returns:
        A new contiguous tensor of x's shape and dtype.

    Raises:
        ValueError: x or weight not a tensor, of another dtype, x without a
            last dimension, H outside [1, 32768], weight not [H] or on another
            device, more than 2**31 - 1 rows, eps not a finite real >= 0, an
            unknown ``kernel``, or ``kernel="triton"`` for CPU tensors.
    """
    x2, h = _check_input("x", x)
    _check_weight(weight, h, x.device)
    eps = _check_eps(eps)
    out, _ = _run(x2, weight, eps, None, kernel)
    return out.reshape(x.shape)


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, *, kernel: str = "auto"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Batch-invariant ``residual += x`` then RMSNorm of the sum, as one kernel, out of place.

    ``s = float32(x) + float32(residual)``; returns ``(rms_norm(s), round(s))``
    where the norm is taken of the float32 ``s`` (not of its rounding), with
    the same reduction and rounding as :func:`rms_norm`. Source: SGLang 0.5.23
    ``RMSNorm.forward_native`` with a residual (``fp32_residual`` off), which
    ``forward_cuda`` runs in deterministic mode; the Llama and Qwen decoder
    layers call it as ``hidden, residual = norm(hidden, residual)``.

    Args:
        x: [..., H] bfloat16 / float16 / float32, 1 <= H <= 32768.
        residual: x's shape, dtype and device.
        weight: [H] bfloat16 / float16 / float32, on x's device.
        eps: finite real >= 0.
        kernel: ``"auto"``, ``"torch"`` or ``"triton"``.

    Returns:
        ``(out, residual_out)``: new contiguous tensors of x's shape and dtype;
        ``residual_out`` is ``x + residual`` rounded to x's dtype. x and
        residual are left unchanged.

    Raises:
        ValueError: as :func:`rms_norm`, and residual not a tensor of x's
            shape, dtype and device.
    """
    x2, h = _check_input("x", x)
    if not isinstance(residual, torch.Tensor):
        raise ValueError(f"residual must be a tensor, got {type(residual).__name__}")
    if residual.shape != x.shape or residual.dtype != x.dtype or residual.device != x.device:
        raise ValueError(
            f"residual must match x (shape {tuple(x.shape)}, dtype {x.dtype}, device {x.device}); got shape "
            f"{tuple(residual.shape)}, dtype {residual.dtype}, device {residual.device}"
        )
    r2 = _rows(residual, h)
    _check_weight(weight, h, x.device)
    eps = _check_eps(eps)
    out, res_out = _run(x2, weight, eps, r2, kernel)
    return out.reshape(x.shape), res_out.reshape(x.shape)


def _run(x2, weight, eps, r2, kernel):
    if use_triton(kernel, x2.device):
        if x2.shape[0] == 0:  # a launch needs at least one program
            empty = torch.empty_like(x2, memory_format=torch.contiguous_format)
            return empty, (torch.empty_like(empty) if r2 is not None else None)
        from .rmsnorm_triton import rms_norm_triton  # imports Triton only when a kernel runs

        return rms_norm_triton(x2, weight.contiguous(), eps, r2)
    return rms_norm_reference(x2, weight, eps, r2)


def _check_input(name: str, x) -> tuple[torch.Tensor, int]:
    """x as [M, H] rows with column stride 1, and H."""
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a tensor, got {type(x).__name__}")
    if x.dtype not in NORM_DTYPES:
        raise ValueError(f"{name} must have dtype {one_of(NORM_DTYPES)}, got {x.dtype}")
    if x.dim() == 0:
        raise ValueError(f"{name} must have a last (hidden) dimension, got a 0-d tensor")
    h = x.shape[-1]
    if not 1 <= h <= MAX_HIDDEN:
        raise ValueError(f"{name} has hidden size H = {h}; H must lie in [1, {MAX_HIDDEN}]")
    return _rows(x, h), h


def _rows(t: torch.Tensor, h: int) -> torch.Tensor:
    t2 = t.reshape(-1, h)
    if t2.shape[0] > MAX_ROWS:
        raise ValueError(f"the input has {t2.shape[0]} rows of H = {h}; at most {MAX_ROWS} rows per call")
    return t2 if t2.stride(-1) == 1 or h == 1 else t2.contiguous()


def _check_weight(weight, h: int, device: torch.device) -> None:
    if not isinstance(weight, torch.Tensor):
        raise ValueError(f"weight must be a tensor, got {type(weight).__name__}")
    if weight.dtype not in NORM_DTYPES:
        raise ValueError(f"weight must have dtype {one_of(NORM_DTYPES)}, got {weight.dtype}")
    if weight.shape != (h,):
        raise ValueError(f"weight must be 1-D [H = {h}] (x's last dimension), got shape {tuple(weight.shape)}")
    if weight.device != device:
        raise ValueError(f"weight is on {weight.device} but x is on {device}")


def _check_eps(eps) -> float:
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real) or not math.isfinite(eps) or eps < 0:
        raise ValueError(f"eps must be a finite real >= 0, got {eps!r}")
    return float(eps)
