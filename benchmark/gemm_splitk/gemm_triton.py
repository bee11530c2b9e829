"""Triton kernels of the batch-invariant GEMM ``C = A @ W^T (+ bias)``.

Every output element is summed the same way whatever M is (see
:mod:`.gemm_config`): chunk s of K (``[s * chunk, min((s + 1) * chunk, K))``)
is accumulated from zero in fp32 by ``tl.dot`` over ``BLOCK_K`` steps in K
order, the chunk sums are added in chunk order, the bias (fp32) is added
last and the result is rounded once to the output dtype. Only which program
does that work changes with M:

- ``split``: grid [N tiles, M tiles, S]; each program writes its chunk's fp32
  partial to a workspace [S, M, N]; :func:`_gemm_combine_kernel` adds them.
- ``fused``: grid [M tiles x N tiles]; one program walks the S chunks.

Rows past M and columns past N are loaded from row / column 0 (clamped
indices, no mask) and never stored: a row's result depends only on its own
row of A, which is what makes it independent of the other rows. M is never
specialised on (``do_not_specialize``), so within one M bucket every M runs
the same compiled kernel and only the grid changes.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gemm_splitk.gemm_config import GemmTable

COMBINE_BLOCK = 1024


@triton.jit
def _chunk_sum(a_ptr, w_ptr, offs_m, offs_n, k_lo, k_hi, stride_am, stride_ak, stride_wn, stride_wk,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
               SWAP: tl.constexpr):
    """fp32 sum over k in [k_lo, k_hi) of A[m, k] * W[n, k], from zero, in k order, one tile.

    [BLOCK_M, BLOCK_N] as ``A @ W^T``, or with SWAP [BLOCK_N, BLOCK_M] as
    ``W @ A^T``: the weight is then the MMA's row operand, so a few
    activation rows need a tile only as tall as the MMA's smallest column
    count instead of its smallest row count (16 rows instead of 64 on Hopper).
    """
    kk = k_lo + tl.arange(0, BLOCK_K)
    if SWAP:
        w_ptrs = w_ptr + offs_n[:, None] * stride_wn + kk[None, :].to(tl.int64) * stride_wk
        a_ptrs = a_ptr + offs_m[None, :] * stride_am + kk[:, None].to(tl.int64) * stride_ak
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        a_ptrs = a_ptr + offs_m[:, None] * stride_am + kk[None, :].to(tl.int64) * stride_ak
        w_ptrs = w_ptr + offs_n[None, :] * stride_wn + kk[:, None].to(tl.int64) * stride_wk
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(k_lo, k_hi, BLOCK_K):
        if EVEN_K:
            a = tl.load(a_ptrs)
            w = tl.load(w_ptrs)
        elif SWAP:
            in_k = (k + tl.arange(0, BLOCK_K)) < k_hi
            a = tl.load(a_ptrs, mask=in_k[:, None], other=0.0)
            w = tl.load(w_ptrs, mask=in_k[None, :], other=0.0)
        else:
            in_k = (k + tl.arange(0, BLOCK_K)) < k_hi
            a = tl.load(a_ptrs, mask=in_k[None, :], other=0.0)
            w = tl.load(w_ptrs, mask=in_k[:, None], other=0.0)
        if SWAP:
            acc = tl.dot(w, a, acc)
        else:
            acc = tl.dot(a, w, acc)
        a_ptrs += BLOCK_K * stride_ak
        w_ptrs += BLOCK_K * stride_wk
    return acc


@triton.jit
def _tile_offsets(pid_m, pid_n, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SWAP: tl.constexpr):
    """A tile's indices: rows and columns clamped into [0, M) / [0, N) (int64, for unmasked loads), and
    the output's row and column indices as 2-D grids in the tile's orientation (for stores and the bias)."""
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.where(rm < M, rm, 0).to(tl.int64)
    offs_n = tl.where(rn < N, rn, 0).to(tl.int64)
    if SWAP:
        m2 = rm[None, :]
        n2 = rn[:, None]
    else:
        m2 = rm[:, None]
        n2 = rn[None, :]
    return offs_m, offs_n, m2, n2


@triton.jit(do_not_specialize=["M"])
def _gemm_split_kernel(
    a_ptr, w_ptr, ws_ptr,  # A [M, K], W [N, K] (any strides), workspace fp32 [S, M, N] contiguous
    M, N, K, chunk,
    stride_am, stride_ak, stride_wn, stride_wk,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
    SWAP: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    s = tl.program_id(2)
    offs_m, offs_n, m2, n2 = _tile_offsets(pid_m, pid_n, M, N, BLOCK_M, BLOCK_N, SWAP)
    k_lo = s * chunk
    k_hi = tl.minimum(k_lo + chunk, K)
    part = _chunk_sum(a_ptr, w_ptr, offs_m, offs_n, k_lo, k_hi, stride_am, stride_ak, stride_wn, stride_wk,
                      BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, SWAP)
    out = ws_ptr + s.to(tl.int64) * M * N + m2.to(tl.int64) * N + n2
    tl.store(out, part, mask=(m2 < M) & (n2 < N))


@triton.jit
def _finish(total, bias_ptr, n_idx, N, HAS_BIAS: tl.constexpr):
    """The one place a result meets the bias: + bias[n] in fp32 (both schedules call it; rounding follows)."""
    if HAS_BIAS:
        total = total + tl.load(bias_ptr + n_idx, mask=n_idx < N, other=0.0).to(tl.float32)
    return total


@triton.jit(do_not_specialize=["size"])
def _gemm_combine_kernel(
    ws_ptr, bias_ptr, c_ptr,  # workspace fp32 [S, M, N], bias [N], C [M, N] contiguous
    size, N,  # size = M * N
    SPLITS: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr,
):
    idx = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    live = idx < size
    part = ws_ptr + idx
    total = tl.load(part, mask=live, other=0.0)
    for _ in tl.static_range(1, SPLITS):
        part += size  # one partial further (Triton passes size as int64 once it exceeds int32)
        total = total + tl.load(part, mask=live, other=0.0)
    total = _finish(total, bias_ptr, idx % N, N, HAS_BIAS)
    tl.store(c_ptr + idx, total.to(c_ptr.dtype.element_ty), mask=live)


@triton.jit(do_not_specialize=["M"])
def _gemm_fused_kernel(
    a_ptr, w_ptr, bias_ptr, c_ptr,  # A [M, K], W [N, K] (any strides), bias [N], C [M, N] contiguous
    M, N, K, chunk,
    stride_am, stride_ak, stride_wn, stride_wk,
    SPLITS: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
    GROUP_M: tl.constexpr, SWAP: tl.constexpr,
):
    # Grouped order: GROUP_M row tiles share each weight tile while it is in L2.
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * tiles_n
    first_m = (pid // per_group) * GROUP_M
    rows = tl.minimum(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % rows
    pid_n = (pid % per_group) // rows
    offs_m, offs_n, m2, n2 = _tile_offsets(pid_m, pid_n, M, N, BLOCK_M, BLOCK_N, SWAP)
    total = _chunk_sum(a_ptr, w_ptr, offs_m, offs_n, 0, tl.minimum(chunk, K), stride_am, stride_ak,
                       stride_wn, stride_wk, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, SWAP)
    for s in range(1, SPLITS):
        k_lo = s * chunk
        part = _chunk_sum(a_ptr, w_ptr, offs_m, offs_n, k_lo, tl.minimum(k_lo + chunk, K), stride_am, stride_ak,
                          stride_wn, stride_wk, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, SWAP)
        total = total + part
    total = _finish(total, bias_ptr, n2, N, HAS_BIAS)
    out = c_ptr + m2.to(tl.int64) * N + n2
    tl.store(out, total.to(c_ptr.dtype.element_ty), mask=(m2 < M) & (n2 < N))


def gemm_triton(a: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, table: GemmTable) -> torch.Tensor:
    """``a @ w.T (+ bias)`` by the kernels above; arguments already checked by :func:`.gemm.linear`.

    a: [M, K], w: [N, K] (any strides), bias: [N] or None, all one dtype
    (fp16 or bf16) on one CUDA device. Returns a new contiguous [M, N] tensor
    of that dtype. No host synchronisation (CUDA-graph capturable).
    """
    m, k = a.shape
    n = w.shape[0]
    c = torch.empty((m, n), dtype=a.dtype, device=a.device)
    if m == 0:
        return c
    order = table.k_order(n, k)
    tiling = table.bucket(m)
    chunk = order.chunk_len(k)
    splits = -(-k // chunk)  # chunks that hold columns (S or fewer when K is short)
    even_k = k % order.block_k == 0
    bias_arg = bias if bias is not None else c  # never read without HAS_BIAS
    common = dict(BLOCK_M=tiling.block_m, BLOCK_N=tiling.block_n, BLOCK_K=order.block_k, EVEN_K=even_k,
                  SWAP=tiling.swap_ab, num_warps=tiling.num_warps, num_stages=tiling.num_stages)
    tiles = (triton.cdiv(n, tiling.block_n), triton.cdiv(m, tiling.block_m))
    if tiling.schedule == "split" and splits > 1:
        ws = torch.empty((splits, m, n), dtype=torch.float32, device=a.device)
        _gemm_split_kernel[(tiles[0], tiles[1], splits)](
            a, w, ws, m, n, k, chunk, a.stride(0), a.stride(1), w.stride(0), w.stride(1), **common)
        _gemm_combine_kernel[(triton.cdiv(m * n, COMBINE_BLOCK),)](
            ws, bias_arg, c, m * n, n, SPLITS=splits, HAS_BIAS=bias is not None, BLOCK=COMBINE_BLOCK)
    else:
        _gemm_fused_kernel[(tiles[0] * tiles[1],)](
            a, w, bias_arg, c, m, n, k, chunk, a.stride(0), a.stride(1), w.stride(0), w.stride(1),
            SPLITS=splits, HAS_BIAS=bias is not None, GROUP_M=tiling.group_m, **common)
    return c
