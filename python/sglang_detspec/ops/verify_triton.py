"""Fused Triton chain verification: accept coins, residual race and bonus race.

Phase 1 (grid [B, S]): every program of a row recomputes the K accept coins
(scalar work) to learn the accept length n, then races its vocabulary split
of the one row that decides the emitted token: the residual
``max(p_n - q_n, 0)`` after a rejection (and ``p_n`` beside it, for the
all-zero-residual fallback) or ``p_K`` for the bonus token. Only that row is
read, never all K+1 rows. Phase 2 (grid [B]) reduces the splits in a fixed
order and writes tokens and accept lengths. No host synchronisation, so both
phases are CUDA-graph capturable. Bit for bit equal to
``verify_ref.verify_reference`` on the same CUDA device.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import triton_config as cfg
from .streams import Stream, salt_words
from .triton_blocks import lane_bests, load_tile, split_bounds, take_better
from .triton_hash import INV_2_32, hash_column, inverse_exponential, may_reach, row_prefix, split_argmax

_ACC, _RES, _BON = Stream.ACCEPT.salt, Stream.RESAMPLE.salt, Stream.BONUS.salt


# Split counts and widths change with the batch size: unspecialised, so a new batch size never compiles.
@triton.jit(do_not_specialize=["num_splits", "split_cols"])
def _verify_race_kernel(
    x_ptr,  # [B, K] int64 draft tokens, row stride K
    q_ptr,  # [B, K, V] float draft probs, strides (q_sb, q_sk, 1)
    p_ptr,  # [B, K+1, V] float target probs, strides (p_sb, p_sk, 1)
    seed_ptr,  # [B] int64, uint64 bits
    pos_ptr,  # [B] int64, position of x_0
    acc_ptr,  # [B] int64 out: accept length (written by split 0)
    part_ptr,  # [B, S, 2] float64 out: best residual score, best target score
    part_i_ptr,  # [B, S, 2] int32 out: their token ids
    part_any_ptr,  # [B, S] int32 out: 1 if the split has a positive residual entry
    K,
    V,
    q_sb,
    q_sk,
    p_sb,
    p_sk,
    num_splits,
    split_cols,
    ACC_LO: tl.constexpr,
    ACC_HI: tl.constexpr,
    RES_LO: tl.constexpr,
    RES_HI: tl.constexpr,
    BON_LO: tl.constexpr,
    BON_HI: tl.constexpr,
    BLOCK: tl.constexpr,
    BIG: tl.constexpr,
):
    row = tl.program_id(0)
    split = tl.program_id(1)
    seed = tl.load(seed_ptr + row)
    t = tl.load(pos_ptr + row)
    q_row = q_ptr + row.to(tl.int64) * q_sb
    p_row = p_ptr + row.to(tl.int64) * p_sb
    n = t * 0  # accept length, int64
    alive = n == 0
    for j in range(K):
        tok = tl.load(x_ptr + row.to(tl.int64) * K + j)
        qx = tl.load(q_row + j * q_sk + tok).to(tl.float64)
        px = tl.load(p_row + j * p_sk + tok).to(tl.float64)
        h = hash_column(row_prefix(seed, t + j, ACC_LO, ACC_HI), tok.to(tl.uint32) * 0)
        u = (h.to(tl.float64) + 0.5) * INV_2_32
        alive = alive & (u * qx < px)
        n += alive.to(tl.int64)
    rejected = n < K
    if split == 0:
        tl.store(acc_ptr + row, n)
    salt_lo = tl.where(rejected, RES_LO, BON_LO)
    salt_hi = tl.where(rejected, RES_HI, BON_HI)
    prefix = row_prefix(seed, t + n, salt_lo, salt_hi)
    p_sel = p_row + n * p_sk
    q_sel = q_row + tl.minimum(n, K - 1) * q_sk
    best_r, best_ri, top_r = lane_bests(BLOCK)  # residual race
    best_p, best_pi, top_p = lane_bests(BLOCK)  # race over p (bonus, or all-zero residual fallback)
    any_pos = tl.zeros([BLOCK], tl.int32)
    start, end = split_bounds(split, split_cols, V)
    for tile in range(start, end, BLOCK):
        idx, mask, pv, h = load_tile(p_sel, prefix, tile, n * 0, end, BLOCK)
        qv = tl.load(q_sel + idx, mask=mask & rejected, other=0.0)
        # The residual in the probs' own dtype, as the reference computes it.
        r = tl.maximum(pv - qv, 0.0)
        any_pos = any_pos | (r > 0).to(tl.int32)
        maybe = (may_reach(r, h, top_r) | may_reach(pv, h, top_p)) & mask
        if tl.max(maybe.to(tl.int32), axis=0) > 0:
            # One log per lane serves both races.
            inv_e = inverse_exponential(h)
            best_r, best_ri, top_r = take_better(tl.where(mask, r.to(tl.float64) * inv_e, -1.0), idx, best_r, best_ri)
            best_p, best_pi, top_p = take_better(tl.where(mask, pv.to(tl.float64) * inv_e, -1.0), idx, best_p, best_pi)
    mr, ir = split_argmax(best_r, best_ri, BIG)
    mp, ip = split_argmax(best_p, best_pi, BIG)
    base = row * num_splits + split
    tl.store(part_ptr + base * 2, mr)
    tl.store(part_ptr + base * 2 + 1, mp)
    tl.store(part_i_ptr + base * 2, ir)
    tl.store(part_i_ptr + base * 2 + 1, ip)
    tl.store(part_any_ptr + base, tl.max(any_pos, axis=0))


@triton.jit(do_not_specialize=["num_splits"])
def _verify_emit_kernel(
    x_ptr,  # [B, K] int64 draft tokens
    acc_ptr,  # [B] int64 accept lengths
    part_ptr,  # [B, S, 2] float64
    part_i_ptr,  # [B, S, 2] int32
    part_any_ptr,  # [B, S] int32
    tok_ptr,  # [B, K+1] int64 out
    K,
    num_splits,
    SP: tl.constexpr,  # a power of two >= S (triton_config.split_lanes: fixed per vocabulary)
    KP1: tl.constexpr,  # next power of two >= K+1
    BIG: tl.constexpr,
):
    row = tl.program_id(0)
    offs = tl.arange(0, SP)
    mask = offs < num_splits
    base = row * num_splits + offs
    vr = tl.load(part_ptr + base * 2, mask=mask, other=-3.0)
    vp = tl.load(part_ptr + base * 2 + 1, mask=mask, other=-3.0)
    ir = tl.load(part_i_ptr + base * 2, mask=mask, other=BIG)
    ip = tl.load(part_i_ptr + base * 2 + 1, mask=mask, other=BIG)
    anyr = tl.max(tl.load(part_any_ptr + base, mask=mask, other=0), axis=0)
    n = tl.load(acc_ptr + row)
    _, tok_r = split_argmax(vr, ir, BIG)
    _, tok_p = split_argmax(vp, ip, BIG)
    # Rejected with a positive residual: residual race; otherwise (bonus, or the
    # all-zero residual fallback) the race over p on the same stream and position.
    final = tl.where((n < K) & (anyr > 0), tok_r, tok_p).to(tl.int64)
    cols = tl.arange(0, KP1)
    drafts = tl.load(x_ptr + row.to(tl.int64) * K + cols, mask=cols < n, other=-1)
    out = tl.where(cols == n, final, drafts)
    tl.store(tok_ptr + row.to(tl.int64) * (K + 1) + cols, out, mask=cols < K + 1)


def verify_triton(
    draft_tokens: torch.Tensor,  # [B, K] int64
    draft_probs: torch.Tensor,  # [B, K, V] float
    target_probs: torch.Tensor,  # [B, K+1, V] float, same dtype
    seeds: torch.Tensor,  # [B] int64
    positions: torch.Tensor,  # [B] int64
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused chain verify: ``(tokens int64 [B, K+1], accept_lengths int64 [B])``. Unchecked."""
    draft_tokens = draft_tokens.contiguous()
    if draft_probs.stride(2) != 1:
        draft_probs = draft_probs.contiguous()
    if target_probs.stride(2) != 1:
        target_probs = target_probs.contiguous()
    b, k = draft_tokens.shape
    v = target_probs.shape[2]
    dev = target_probs.device
    splits, split_cols = cfg.plan_splits(b, v, dev)
    acc = torch.empty(b, dtype=torch.int64, device=dev)
    part = torch.empty(b, splits, 2, dtype=torch.float64, device=dev)
    part_i = torch.empty(b, splits, 2, dtype=torch.int32, device=dev)
    part_any = torch.empty(b, splits, dtype=torch.int32, device=dev)
    tokens = torch.empty(b, k + 1, dtype=torch.int64, device=dev)
    acc_lo, acc_hi = salt_words(_ACC)
    res_lo, res_hi = salt_words(_RES)
    bon_lo, bon_hi = salt_words(_BON)
    q_sb, q_sk = (draft_probs.stride(0), draft_probs.stride(1)) if k else (0, 0)
    _verify_race_kernel[(b, splits)](
        draft_tokens, draft_probs, target_probs, seeds, positions, acc, part, part_i, part_any,
        k, v, q_sb, q_sk, target_probs.stride(0), target_probs.stride(1), splits, split_cols,
        ACC_LO=acc_lo, ACC_HI=acc_hi, RES_LO=res_lo, RES_HI=res_hi, BON_LO=bon_lo, BON_HI=bon_hi,
        BLOCK=cfg.BLOCK, BIG=cfg.BIG, num_warps=cfg.NUM_WARPS,
    )
    _verify_emit_kernel[(b,)](
        draft_tokens, acc, part, part_i, part_any, tokens, k, splits,
        SP=cfg.split_lanes(v), KP1=triton.next_power_of_2(k + 1), BIG=cfg.BIG,
    )
    return tokens, acc
