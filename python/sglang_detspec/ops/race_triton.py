"""Fused Triton exponential race: one pass over the weights, no [B, V] intermediate.

Each program walks one vocabulary split of one row: hash, uniform, -log,
reciprocal, multiply and a running argmax (or running top-k) stay in
registers. When B is small the vocabulary is split across programs so the
GPU is full; a second tiny kernel reduces the [B, S] partials in a fixed
order, ties to the smaller index, so the result never depends on the split.
Bit for bit equal to ``race_ref.race_reference`` on the same CUDA device.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import triton_config as cfg
from .streams import salt_words
from .triton_blocks import load_tile, race_split_argmax, split_bounds
from .triton_hash import exact_score, may_reach, row_prefix, split_argmax


# Split counts and widths change with the batch size: unspecialised, so a new batch size never compiles.
@triton.jit(do_not_specialize=["col_offset", "num_splits", "split_cols"])
def _race_argmax_kernel(
    w_ptr,  # [B, N, V] float (N = 1 for a plain race), strides (w_sb, w_sn, 1)
    seed_ptr,  # [B] int64, uint64 bits
    pos_ptr,  # [B, N] int64 positions, strides (pos_sb, pos_sn); pos_sn = 0: one per request
    part_v_ptr,  # [B*N, S] float64 out: best score per split
    part_i_ptr,  # [B*N, S] int32 out: its token id
    V,
    N,  # rows per request
    w_sb,
    w_sn,
    pos_sb,
    pos_sn,
    pos_step,  # added per node index: 1 makes row i of a chain race at pos + i
    col_offset,  # draft_step * V
    num_splits,  # S
    split_cols,  # columns per split, a multiple of BLOCK
    SALT_LO: tl.constexpr,
    SALT_HI: tl.constexpr,
    BLOCK: tl.constexpr,
    BIG: tl.constexpr,
):
    r = tl.program_id(0)
    split = tl.program_id(1)
    b = r // N
    i = r % N
    pos = tl.load(pos_ptr + b.to(tl.int64) * pos_sb + i * pos_sn) + i * pos_step
    prefix = row_prefix(tl.load(seed_ptr + b), pos, SALT_LO, SALT_HI)
    w_row = w_ptr + b.to(tl.int64) * w_sb + i.to(tl.int64) * w_sn
    start, end = split_bounds(split, split_cols, V)
    m, idx = race_split_argmax(w_row, prefix, col_offset, start, end, BLOCK, BIG)
    tl.store(part_v_ptr + r.to(tl.int64) * num_splits + split, m)
    tl.store(part_i_ptr + r.to(tl.int64) * num_splits + split, idx)


@triton.jit(do_not_specialize=["col_offset", "num_splits", "split_cols"])
def _race_topk_kernel(
    w_ptr,  # [B, V] float, row stride w_stride
    seed_ptr,  # [B] int64
    pos_ptr,  # [B] int64
    unit_ptr,  # [B] bool: rows scored by their weights alone (read with HAS_UNIT only)
    part_v_ptr,  # [B, S, KP] float64 out: per-split top-k scores, descending
    part_i_ptr,  # [B, S, KP] int32 out: their token ids
    V,
    w_stride,
    col_offset,
    num_splits,
    split_cols,
    SALT_LO: tl.constexpr,
    SALT_HI: tl.constexpr,
    K: tl.constexpr,  # num_samples
    KP: tl.constexpr,  # next power of two >= K
    BLOCK: tl.constexpr,
    BIG: tl.constexpr,
    HAS_UNIT: tl.constexpr,
):
    row = tl.program_id(0)
    split = tl.program_id(1)
    prefix = row_prefix(tl.load(seed_ptr + row), tl.load(pos_ptr + row), SALT_LO, SALT_HI)
    unit = False
    if HAS_UNIT:
        unit = tl.load(unit_ptr + row) != 0
    w_row = w_ptr + row.to(tl.int64) * w_stride
    slots = tl.arange(0, KP)
    bv = tl.full([KP], -2.0, tl.float64)
    bi = tl.full([KP], BIG, tl.int32)
    kth = tl.min(bv, axis=0)  # score in slot K-1: a tile must beat it to change the list
    start, end = split_bounds(split, split_cols, V)
    for tile in range(start, end, BLOCK):
        idx, mask, w, h = load_tile(w_row, prefix, tile, col_offset, end, BLOCK)
        s = tl.full([BLOCK], -1.0, tl.float64)
        if unit:
            # Every exponential at 1: the score is the weight itself (race_ref.race_reference, unit_rows).
            s = tl.where(mask, w.to(tl.float64), -1.0)
        elif tl.max((may_reach(w, h, kth) & mask).to(tl.int32), axis=0) > 0:
            s = tl.where(mask, exact_score(w, h), -1.0)
        if tl.max(s, axis=0) > kth:
            # Merge K times: the list's ids are all smaller than this tile's,
            # so on equal scores the list entry comes first.
            nv = tl.full([KP], -2.0, tl.float64)
            ni = tl.full([KP], BIG, tl.int32)
            for r in tl.static_range(K):
                m1, i1 = split_argmax(s, idx, BIG)
                m2, i2 = split_argmax(bv, bi, BIG)
                from_list = m2 >= m1
                nv = tl.where(slots == r, tl.where(from_list, m2, m1), nv)
                ni = tl.where(slots == r, tl.where(from_list, i2, i1), ni)
                bv = tl.where(from_list, tl.where(bi == i2, -3.0, bv), bv)
                s = tl.where(from_list, s, tl.where(idx == i1, -3.0, s))
            bv = nv
            bi = ni
            kth = tl.sum(tl.where(slots == K - 1, bv, 0.0), axis=0)
    base = (row * num_splits + split) * KP
    tl.store(part_v_ptr + base + slots, bv)
    tl.store(part_i_ptr + base + slots, bi)


@triton.jit(do_not_specialize=["N"])
def _race_reduce_kernel(
    part_v_ptr,  # [B, N] float64 candidates (N = S * KP), per-split lists in split order
    part_i_ptr,  # [B, N] int32 token ids
    out_ptr,  # [B, K] int64 out
    score_ptr,  # [B, K] float64 out: each winner's race score (written with WITH_SCORES only)
    N,
    K: tl.constexpr,
    NP: tl.constexpr,  # a power of two >= N (triton_config.split_lanes: fixed per vocabulary)
    BIG: tl.constexpr,
    WITH_SCORES: tl.constexpr,
):
    row = tl.program_id(0)
    offs = tl.arange(0, NP)
    mask = offs < N
    v = tl.load(part_v_ptr + row * N + offs, mask=mask, other=-3.0)
    ids = tl.load(part_i_ptr + row * N + offs, mask=mask, other=BIG)
    for r in tl.static_range(K):
        m, i = split_argmax(v, ids, BIG)
        tl.store(out_ptr + row * K + r, i.to(tl.int64))
        if WITH_SCORES:
            tl.store(score_ptr + row * K + r, m)
        v = tl.where(ids == i, -3.0, v)


def race_triton(
    weights: torch.Tensor,  # [B, V] float16/bfloat16/float32/float64, CUDA, unit last-dim stride
    seeds: torch.Tensor,  # [B] int64, uint64 bits
    positions: torch.Tensor,  # [B] int64
    salt: int,  # stream salt, uint64
    column_offset: int,  # draft_step * V
    num_samples: int,
    *,
    return_scores: bool = False,
    unit_rows: torch.Tensor | None = None,  # [B] bool: rows ranked by their weights alone
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Fused exponential race: int64 [B, num_samples]. Unchecked: callers validate.

    With ``return_scores`` also the winners' race scores, float64 [B,
    num_samples] (``triton_hash.exact_score``, the value the race compared).
    ``unit_rows``: rows whose exponentials are all 1 (``race_ref``), scored by
    their weights in float64; for one sample, the weights' argmax. CUDA-graph
    capturable: seeds, positions and ``unit_rows`` are read from device memory
    and nothing syncs with the host.
    """
    if weights.stride(1) != 1:
        weights = weights.contiguous()
    b, v = weights.shape
    splits, split_cols = cfg.plan_splits(b, v, weights.device)
    dev = weights.device
    salt_lo, salt_hi = salt_words(salt)
    out = torch.empty(b, num_samples, dtype=torch.int64, device=dev)
    if num_samples == 1:
        kp = 1
        part_v, part_i = race_rows_argmax(
            weights.unsqueeze(1), seeds, positions, salt, column_offset=column_offset
        )
    else:
        kp = triton.next_power_of_2(num_samples)
        part_v = torch.empty(b, splits, kp, dtype=torch.float64, device=dev)
        part_i = torch.empty(b, splits, kp, dtype=torch.int32, device=dev)
        _race_topk_kernel[(b, splits)](
            weights, seeds, positions, unit_rows if unit_rows is not None else seeds, part_v, part_i, v,
            weights.stride(0), column_offset, splits, split_cols,
            SALT_LO=salt_lo, SALT_HI=salt_hi, K=num_samples, KP=kp, BLOCK=cfg.BLOCK, BIG=cfg.BIG,
            HAS_UNIT=unit_rows is not None, num_warps=cfg.NUM_WARPS,
        )
    n = part_v.numel() // max(b, 1)
    scores = torch.empty(b, num_samples, dtype=torch.float64, device=dev) if return_scores else out
    _race_reduce_kernel[(b,)](part_v, part_i, out, scores, n, K=num_samples, NP=cfg.split_lanes(v, kp), BIG=cfg.BIG,
                              WITH_SCORES=return_scores)
    if num_samples == 1 and unit_rows is not None:
        # The one-sample kernel is shared with the verify kernels: unit rows take the weights' argmax
        # after it (the first maximum, as race_ref's strict '>' across chunks keeps).
        best = weights.argmax(dim=1, keepdim=True)
        unit = unit_rows.view(-1, 1)
        out = torch.where(unit, best, out)
        if return_scores:
            scores = torch.where(unit, weights.gather(1, best).to(torch.float64), scores)
    return (out, scores) if return_scores else out


def race_rows_argmax(
    weights: torch.Tensor,  # [B, N, V] float, unit last-dim stride
    seeds: torch.Tensor,  # [B] int64, uint64 bits
    positions: torch.Tensor,  # [B] or [B, N] int64
    salt: int,  # stream salt, uint64
    *,
    column_offset: int = 0,
    position_step: int = 0,  # [B] positions only: row i races at positions[b] + i * position_step
) -> tuple[torch.Tensor, torch.Tensor]:
    """Race all B*N rows at once: per-split partials ``(float64 [B*N, S], int32 [B*N, S])``.

    Row (b, i) uses seed b and position ``positions[b, i]`` (or
    ``positions[b] + i * position_step``). Reduce a row's S partials in split
    order, ties to the smaller id, to get its winner. Unchecked; no host sync.
    """
    b, n, v = weights.shape
    dev = weights.device
    splits, split_cols = cfg.plan_splits(b * n, v, dev)
    part_v = torch.empty(b * n, splits, dtype=torch.float64, device=dev)
    part_i = torch.empty(b * n, splits, dtype=torch.int32, device=dev)
    if positions.dim() == 1:
        pos_sb, pos_sn = positions.stride(0), 0
    else:
        pos_sb, pos_sn = positions.stride(0), positions.stride(1)
    salt_lo, salt_hi = salt_words(salt)
    _race_argmax_kernel[(b * n, splits)](
        weights, seeds, positions, part_v, part_i, v, n, weights.stride(0), weights.stride(1),
        pos_sb, pos_sn, position_step, column_offset, splits, split_cols,
        SALT_LO=salt_lo, SALT_HI=salt_hi, BLOCK=cfg.BLOCK, BIG=cfg.BIG, num_warps=cfg.NUM_WARPS,
    )
    return part_v, part_i
