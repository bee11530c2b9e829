"""Fused batch-invariant RMSNorm and add + RMSNorm: one Triton program per row.

A program loads its whole row (zero-padded to the next power of two ``P``),
optionally adds the residual row in float32 and stores that sum, reduces the
float32 squares by pairwise halving (``s[:n/2] + s[n/2:]``, ``log2(P)``
levels, each level one reshape to ``(2, n/2)`` and a sum over the size-2
axis, so each output element is exactly one float32 add), then divides and
takes the square root with IEEE rounding (``div_rn``, ``sqrt_rn``; Triton's
``/`` and ``sqrt`` are approximate on CUDA) and scales. Nothing depends on
the row count or on other rows, and the launch never lets the compiler fuse a
square into the next add (``enable_fp_fusion=False``), so every rounding
point is the one ``rmsnorm_ref.rms_norm_reference`` writes out in torch: the
two agree bit for bit on the same CUDA device.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .rmsnorm_ref import padded_width


def num_warps_for(hidden: int) -> int:
    """Warps per program: from the hidden size only (about 16 float32 per thread; 1 to 16 warps).

    Speed only: the reduction order is fixed by :func:`padded_width`, not by the launch.
    """
    return max(1, min(16, padded_width(hidden) // 512))


@triton.jit
def _pairwise_sum(s, P: tl.constexpr, LEVELS: tl.constexpr):
    # static_range unrolls at compile time, so s may halve its shape at each level.
    for level in tl.static_range(LEVELS):
        s = tl.sum(tl.reshape(s, (2, P >> (level + 1))), axis=0)
    return tl.sum(s, axis=0)  # one element left: no add


@triton.jit
def _round_to(v, DTYPE: tl.constexpr):
    """float32 ``v`` rounded to nearest even in ``DTYPE`` (the rounding of torch's ``.to``).

    bfloat16 by integer arithmetic on the bits: Triton's interpreter truncates
    float32 -> bfloat16 casts, so the CPU check would not see the GPU's
    rounding (``cvt.rn.bf16.f32`` gives these bits for every non-NaN input).
    """
    if DTYPE == tl.bfloat16:
        bits = v.to(tl.uint32, bitcast=True)
        even = (bits >> 16) & 1
        rounded = ((bits + 0x7FFF + even) >> 16).to(tl.uint16)
        rounded = tl.where(v != v, 0x7FC0, rounded).to(tl.uint16)  # NaN stays NaN (the carry could make it inf)
        return rounded.to(tl.bfloat16, bitcast=True)
    return v.to(DTYPE)


@triton.jit
def _rms_norm_kernel(
    x_ptr,  # [M, H] rows, row stride x_stride, column stride 1
    r_ptr,  # [M, H] residual rows (HAS_RESIDUAL), row stride r_stride
    w_ptr,  # [H] weight, contiguous
    out_ptr,  # [M, H] output in x's dtype, contiguous
    res_out_ptr,  # [M, H] x + residual in x's dtype, contiguous (HAS_RESIDUAL)
    x_stride,
    r_stride,
    eps,  # float32
    H: tl.constexpr,
    P: tl.constexpr,  # next power of two >= H
    LEVELS: tl.constexpr,  # log2(P)
    HAS_RESIDUAL: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, P)
    mask = cols < H
    v = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        v = v + tl.load(r_ptr + row * r_stride + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(res_out_ptr + row * H + cols, _round_to(v, res_out_ptr.dtype.element_ty), mask=mask)
    total = _pairwise_sum(v * v, P, LEVELS)
    mean = tl.div_rn(total, tl.full((), H, tl.float32))
    rstd = tl.div_rn(tl.full((), 1.0, tl.float32), tl.sqrt_rn(mean + eps))
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * H + cols, _round_to((v * rstd) * w, out_ptr.dtype.element_ty), mask=mask)


def rms_norm_triton(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Launch the kernel on checked arguments (``rmsnorm.py`` checks them).

    Args:
        x: [M, H] with M >= 1 and column stride 1.
        weight: [H], contiguous.
        eps: float.
        residual: None or [M, H] in x's dtype with column stride 1.

    Returns:
        ``(out, residual_out)``: new contiguous [M, H] tensors in x's dtype;
        ``residual_out`` is None without a residual.
    """
    m, h = x.shape
    p = padded_width(h)
    out = torch.empty((m, h), dtype=x.dtype, device=x.device)
    res_out = torch.empty_like(out) if residual is not None else None
    _rms_norm_kernel[(m,)](
        x, residual if residual is not None else x, weight, out, res_out if res_out is not None else out,
        x.stride(0), residual.stride(0) if residual is not None else 0, eps,
        H=h, P=p, LEVELS=p.bit_length() - 1, HAS_RESIDUAL=residual is not None,
        num_warps=num_warps_for(h), enable_fp_fusion=False,
    )
    return out, res_out
