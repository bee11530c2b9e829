"""Torch reference of the batch-invariant RMSNorm: every rounding point written out.

The order of the float32 operations is the definition; the Triton kernel
(``rmsnorm_triton``) performs the same operations and is pinned to this
reference bit for bit on the same CUDA device:

1. ``v = float32(x)`` (with a residual: ``float32(x) + float32(residual)``,
   and ``residual_out = v`` rounded to x's dtype);
2. ``s = v * v``, zero-padded to ``P``, the next power of two >= H (adding a
   zero is exact, so the padding changes no value);
3. pairwise halving: ``s = s[:n/2] + s[n/2:]`` until one element is left;
4. ``mean = s / H``, ``rstd = 1 / sqrt(mean + eps)`` with IEEE division and
   square root, ``eps`` rounded to float32;
5. ``out = ((v * rstd) * float32(weight))`` rounded to x's dtype.

Each step is elementwise on rows, so row i depends on row i only.

The division and the square root are computed in float64 and rounded to
float32: for these operations rounding twice gives the correctly rounded
float32 result (float64 has more than 2 * 24 + 2 significand bits), on any
device. torch's own float32 ``sqrt`` on CPU is not correctly rounded (its
vectorised kernel is one ulp off for some inputs), and its CUDA kernels turn
a division by a Python scalar into a multiplication by the reciprocal, so
divisors here are tensors.
"""

from __future__ import annotations

import torch


def padded_width(hidden: int) -> int:
    """P: the next power of two >= ``hidden`` (the width the pairwise reduction runs over)."""
    return 1 << (hidden - 1).bit_length()


def pairwise_sum(s: torch.Tensor) -> torch.Tensor:
    """Sum of float32 ``s`` [M, H] over the last dim by pairwise halving; returns [M, 1] float32.

    ``s`` is zero-padded to :func:`padded_width` columns, then halved:
    ``s[:, :n/2] + s[:, n/2:]`` until one column is left.
    """
    h = s.shape[-1]
    p = padded_width(h)
    if p != h:
        s = torch.nn.functional.pad(s, (0, p - h))
    while s.shape[-1] > 1:
        half = s.shape[-1] // 2
        s = s[:, :half] + s[:, half:]
    return s


def _div(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """IEEE float32 ``a / b``, computed in float64 and rounded once more (exact: see the module docstring)."""
    return (a.to(torch.float64) / b.to(torch.float64)).to(torch.float32)


def rms_norm_reference(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The batch-invariant (add +) RMSNorm in torch, on any device.

    Args:
        x: [M, H] bfloat16 / float16 / float32.
        weight: [H] bfloat16 / float16 / float32.
        eps: added to the mean square (rounded to float32 first).
        residual: None or [M, H] in x's dtype.

    Returns:
        ``(out, residual_out)``: [M, H] in x's dtype; ``residual_out`` is
        ``x + residual`` rounded to x's dtype, None without a residual.
    """
    v = x.to(torch.float32)
    res_out = None
    if residual is not None:
        v = v + residual.to(torch.float32)
        res_out = v.to(x.dtype)
    total = pairwise_sum(v * v)
    mean = _div(total, torch.full_like(total, x.shape[-1]))
    root = torch.sqrt((mean + torch.full_like(mean, eps)).to(torch.float64)).to(torch.float32)
    rstd = _div(torch.ones_like(root), root)
    out = ((v * rstd) * weight.to(torch.float32)).to(x.dtype)
    return out, res_out
