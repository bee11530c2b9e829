"""Race building blocks for the Triton kernels: one tile, one split, the bests.

Every kernel that races a vocabulary row (the plain race, chain verify,
coupled verify) walks it in ``BLOCK``-wide tiles: load the weights, finish the
row's hash per column, and keep per-lane running bests, computing the float64
score only for tiles the float32 pre-filter cannot rule out. The steps live
here once; the kernels differ only in which rows they race and what they do
with the winners.
"""

import triton
import triton.language as tl

from .triton_hash import exact_score, hash_column, may_reach, split_argmax


@triton.jit
def split_bounds(split, split_cols, V):
    """Columns ``[start, end)`` of vocabulary split ``split``: int32 scalars."""
    start = split * split_cols
    return start, tl.minimum(start + split_cols, V)


@triton.jit
def lane_bests(BLOCK: tl.constexpr):
    """Empty per-lane bests: scores float64 [BLOCK] at -1, ids int32 [BLOCK], the scalar best."""
    best_v = tl.full([BLOCK], -1.0, tl.float64)
    best_i = tl.zeros([BLOCK], tl.int32)
    return best_v, best_i, tl.max(best_v, axis=0)


@triton.jit
def load_tile(w_row, prefix, tile, col_offset, end, BLOCK: tl.constexpr):
    """One tile of a row: ``(idx int32, mask, w, h uint32)``, each [BLOCK].

    w_row: pointer to the row's column 0 (unit stride); prefix: uint32 row
    hash state; col_offset: int scalar added to the token id to form the
    hash column (the DRAFT stream's ``draft_step * V``, else 0).
    """
    idx = tile + tl.arange(0, BLOCK)
    mask = idx < end
    w = tl.load(w_row + idx, mask=mask, other=0.0)
    h = hash_column(prefix, idx.to(tl.uint32) + col_offset.to(tl.uint32))
    return idx, mask, w, h


@triton.jit
def take_better(s, idx, best_v, best_i):
    """Keep the larger score per lane; strict '>' keeps the earlier (smaller) id on ties."""
    take = s > best_v
    best_v = tl.where(take, s, best_v)
    best_i = tl.where(take, idx, best_i)
    return best_v, best_i, tl.max(best_v, axis=0)


@triton.jit
def argmax_tile(w, h, idx, mask, best_v, best_i, best):
    """Fold one tile into the running argmax; float64 log and divide only if the tile may win."""
    if tl.max((may_reach(w, h, best) & mask).to(tl.int32), axis=0) > 0:
        s = tl.where(mask, exact_score(w, h), -1.0)
        best_v, best_i, best = take_better(s, idx, best_v, best_i)
    return best_v, best_i, best


@triton.jit
def race_split_argmax(w_row, prefix, col_offset, start, end, BLOCK: tl.constexpr, BIG: tl.constexpr):
    """Race columns ``[start, end)`` of one row: ``(best score float64, its id int32)``.

    Ties go to the smaller id; an empty split returns (-1, smallest lane id).
    """
    best_v, best_i, best = lane_bests(BLOCK)
    for tile in range(start, end, BLOCK):
        idx, mask, w, h = load_tile(w_row, prefix, tile, col_offset, end, BLOCK)
        best_v, best_i, best = argmax_tile(w, h, idx, mask, best_v, best_i, best)
    return split_argmax(best_v, best_i, BIG)
