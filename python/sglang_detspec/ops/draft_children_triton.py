"""Fused tail of the coupled draft children: relative scores, the dense [R, V] tensor, greedy rows' q, one kernel.

The torch reference (``draft_children`` with ``kernel="torch"``) divides the
race keys by the row's first, casts them to float32, scatters them into a
zero [R, V + 1] tensor and picks q for greedy rows: five launches after the
race, at every draft extend, outside SGLang's CUDA graphs. Here each program
writes one tile of one row: q where the row is greedy, else the score of the
child whose column it is (children are distinct ids, so at most one matches;
an id outside [0, V) matches no column) and 0 elsewhere. The float64 division
(correctly rounded) and the round-to-nearest cast are the reference's, so the
two agree bit for bit on the same device.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 1024
TINY = torch.finfo(torch.float64).tiny


@triton.jit
def _dense_children_kernel(
    q_ptr,  # [R, V] float32: the draft's q (greedy rows' output)
    child_ptr,  # [R, K] int64: the children's columns, distinct; >= V: none
    key_ptr,  # [R, K] float64: their race keys, the first the largest
    topk_ptr,  # [R] int: top_k <= 1 marks a greedy row
    out_ptr,  # [R, V] float32 out
    V,
    q_sr,
    child_sr,
    key_sr,
    out_sr,
    TINY_F64: tl.constexpr,
    K: tl.constexpr,
    KP: tl.constexpr,  # next power of two >= K
    BLOCK_V: tl.constexpr,
):
    r = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
    cmask = cols < V
    greedy = tl.load(topk_ptr + r) <= 1
    q = tl.load(q_ptr + r * q_sr + cols, mask=cmask, other=0.0)
    lanes = tl.arange(0, KP)
    kmask = lanes < K
    child = tl.load(child_ptr + r * child_sr + lanes, mask=kmask, other=-1)
    keys = tl.load(key_ptr + r * key_sr + lanes, mask=kmask, other=0.0)
    first = tl.maximum(tl.load(key_ptr + r * key_sr), TINY_F64)
    score = (keys / first).to(tl.float32)
    hit = cols[:, None] == child[None, :]
    dense = tl.sum(tl.where(hit, score[None, :], 0.0), axis=1)
    tl.store(out_ptr + r * out_sr + cols, tl.where(greedy, q, dense), mask=cmask)


def dense_children_triton(
    q: torch.Tensor,  # [R, V] float32
    children: torch.Tensor,  # [R, K] int64, distinct per row; a column >= V drops out
    keys: torch.Tensor,  # [R, K] float64, descending per row
    top_ks: torch.Tensor,  # [R] int
) -> torch.Tensor:
    """float32 [R, V]: greedy rows' q, else each child's key over the row's first at its column, 0 elsewhere. Unchecked."""
    rows, v = q.shape
    k = children.shape[1]
    out = torch.empty(rows, v, dtype=torch.float32, device=q.device)
    if rows == 0 or v == 0:
        return out
    q = q if q.stride(1) == 1 else q.contiguous()
    children = children.contiguous()
    keys = keys.contiguous()
    grid = (rows, triton.cdiv(v, BLOCK))
    _dense_children_kernel[grid](q, children, keys, top_ks.contiguous(), out, v, q.stride(0), children.stride(0),
                                 keys.stride(0), out.stride(0), TINY_F64=TINY, K=k,
                                 KP=triton.next_power_of_2(max(k, 1)), BLOCK_V=BLOCK)
    return out
