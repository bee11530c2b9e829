"""The prefix / tail split's merge as one kernel: two partial attentions joined by log-sum-exp.

One program per (output row, head): it reads the row's prefix part (through
``prefix_index``) and tail part, weighs each by ``exp(lse - max)`` in float32
and writes ``(w1 o1 + w2 o2) / (w1 + w2)`` rounded once to the output dtype.
A row without a prefix part (``has_prefix`` False) weighs it 0 and never
multiplies its output, which may hold anything. The launch forbids fused
multiply-adds, so the kernel rounds each product and sum as its torch
statement (``prefix_split.merge_parts_reference``) writes them; the merge is
elementwise, so a row's bits cannot depend on the other rows of a launch.
Method: the split-KV merge of Flash-Decoding.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def merge_parts_kernel(O1, L1, O2, L2, HasPrefix, PrefixIndex, Out,
                       s_o1r, s_o1h, s_l1h, s_l1r, s_o2r, s_o2h, s_l2h, s_l2r, s_or, s_oh,
                       DV, BLOCK_DV: tl.constexpr, INDEXED: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1).to(tl.int64)
    offs = tl.arange(0, BLOCK_DV)
    mask = offs < DV
    prow = tl.load(PrefixIndex + row).to(tl.int64) if INDEXED else row
    has = tl.load(HasPrefix + row) != 0
    l1 = tl.load(L1 + head * s_l1h + prow * s_l1r)
    l2 = tl.load(L2 + head * s_l2h + row * s_l2r)
    l1 = tl.where(has, l1, float("-inf"))
    m = tl.maximum(l1, l2)
    m = tl.where(m == float("-inf"), 0.0, m)
    w1 = tl.exp(l1 - m)
    w2 = tl.exp(l2 - m)
    o2 = tl.load(O2 + row * s_o2r + head * s_o2h + offs, mask=mask, other=0.0).to(tl.float32)
    t2 = o2 * w2
    if has:
        o1 = tl.load(O1 + prow * s_o1r + head * s_o1h + offs, mask=mask, other=0.0).to(tl.float32)
        total = o1 * w1 + t2
    else:
        total = t2
    den = w1 + w2
    out = tl.where(den > 0, total / den, 0.0)
    tl.store(Out + row * s_or + head * s_oh + offs, out.to(Out.dtype.element_ty), mask=mask)


def merge_parts_triton(o_prefix: torch.Tensor, lse_prefix: torch.Tensor, o_tail: torch.Tensor,
                       lse_tail: torch.Tensor, has_prefix: torch.Tensor, prefix_index: torch.Tensor | None,
                       *, out: torch.Tensor | None = None) -> torch.Tensor:
    """Launch :func:`merge_parts_kernel`; arguments as ``prefix_split.merge_parts`` (checked there).

    Raises:
        ValueError: a tensor whose last dimension is not contiguous, or ``out`` of another shape / dtype.
    """
    rows, heads, dv = o_tail.shape
    if out is None:
        out = torch.empty_like(o_tail)
    if out.shape != o_tail.shape or out.dtype not in (o_tail.dtype, torch.float32):
        raise ValueError(f"out must be {tuple(o_tail.shape)} {o_tail.dtype} (or float32), got {tuple(out.shape)} "
                         f"{out.dtype}")
    for name, t in (("o_prefix", o_prefix), ("o_tail", o_tail), ("out", out)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name}'s last dimension must be contiguous")
    if rows == 0:
        return out
    index = prefix_index if prefix_index is not None else has_prefix  # unread when not INDEXED
    merge_parts_kernel[(rows, heads)](
        o_prefix, lse_prefix, o_tail, lse_tail, has_prefix, index, out,
        o_prefix.stride(0), o_prefix.stride(1), lse_prefix.stride(0), lse_prefix.stride(1),
        o_tail.stride(0), o_tail.stride(1), lse_tail.stride(0), lse_tail.stride(1), out.stride(0), out.stride(1),
        dv, BLOCK_DV=triton.next_power_of_2(dv), INDEXED=prefix_index is not None,
        num_warps=1 if dv <= 128 else 2, enable_fp_fusion=False)
    return out
