"""Fused Triton coupled verification: race every node's row at once, then walk.

Phase 1 (tree only, grid [B]): the position of the token after each node,
``t + depth(node)``, from the links (children have larger indices than their
parent, so one pass in index order sees every parent's depth first).
Phase 2 (grid [B*N, S]): the plain race kernel races all N target rows of
every request on the TARGET stream, each at its own position, in parallel,
writing per-split partials; rows off the accepted path are raced too, which
costs bandwidth but needs no host round trip. Phase 3 (grid [B]): reduce the
partials of the current node in split order, compare with its children's
candidates, move or stop, and write tokens, accept lengths and the path;
given SGLang's verify buffers, also ``predicts``, ``accept_index`` and
``accept_token_num`` at the accepted nodes' slots (``ops.verify_outputs``).
Nothing syncs with the host, so the whole op is CUDA-graph capturable. Bit
for bit equal to ``coupled_ref.coupled_walk_reference`` on the same CUDA
device (the same race arithmetic; the walk is integer logic).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import triton_config as cfg
from .race_triton import race_rows_argmax
from .streams import Stream
from .triton_hash import split_argmax


@triton.jit
def _tree_positions_kernel(
    nxt_ptr,  # [B, N] int first child or -1, row stride nxt_sb
    sib_ptr,  # [B, N] int next sibling or -1, row stride sib_sb
    pos_ptr,  # [B] int64: t, position of the token after the root
    out_ptr,  # [B, N] int64 out: t + depth(node), the position node's row decides
    N,
    nxt_sb,
    sib_sb,
    NP: tl.constexpr,  # next power of two >= N
):
    b = tl.program_id(0).to(tl.int64)
    lanes = tl.arange(0, NP)
    depth = tl.zeros([NP], tl.int64)
    for i in range(N):
        d = tl.sum(tl.where(lanes == i, depth, 0), axis=0)
        c = tl.load(nxt_ptr + b * nxt_sb + i).to(tl.int64)
        guard = d * 0
        # Links outside (0, N) end a child list; the guard bounds a cyclic
        # sibling list, reachable only unchecked.
        while (c > 0) & (c < N) & (guard < N):
            depth = tl.where(lanes == c, d + 1, depth)
            c = tl.load(sib_ptr + b * sib_sb + c).to(tl.int64)
            guard += 1
    t = tl.load(pos_ptr + b)
    tl.store(out_ptr + b * N + lanes, t + depth, mask=lanes < N)


@triton.jit(do_not_specialize=["num_splits"])  # the split count changes with the batch size
def _coupled_walk_kernel(
    cand_ptr,  # tree: [B, N] int candidates; chain: [B, N-1] int draft tokens (node c holds cand[c-1])
    nxt_ptr,  # [B, N] int first child or -1 (tree only)
    sib_ptr,  # [B, N] int next sibling or -1 (tree only)
    part_v_ptr,  # [B*N, S] float64: per-split best TARGET score of each node's row
    part_i_ptr,  # [B*N, S] int32: its token id
    tok_ptr,  # [B, N] int64 out: token committed after path[j], -1 padded
    acc_ptr,  # [B] int64 out: accepted draft nodes
    path_ptr,  # [B, N] int64 out (tree only): accepted nodes, path[0] = 0, -1 padded
    slot_ptr,  # [B, N] int: SGLang's retrive_index, flat slot of each node (SGL_OUT only)
    pred_ptr,  # [>= B*N] int out: SGLang's predicts, one token per slot (SGL_OUT only)
    aidx_ptr,  # [B, D] int out: SGLang's accept_index, slots of the path (SGL_OUT only)
    anum_ptr,  # [B] int out: SGLang's accept_token_num (SGL_OUT only)
    N,
    num_splits,
    cand_sb,
    nxt_sb,
    sib_sb,
    slot_sb,
    aidx_sb,
    D,
    CHAIN: tl.constexpr,
    SGL_OUT: tl.constexpr,  # also write SGLang's verify buffers (ops.verify_outputs layout)
    SP: tl.constexpr,  # a power of two >= S (triton_config.split_lanes: fixed per vocabulary)
    NP: tl.constexpr,  # next power of two >= N
    BIG: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    soffs = tl.arange(0, SP)
    smask = soffs < num_splits
    lanes = tl.arange(0, NP)
    cur = b * 0  # current node, int64
    n = b * 0  # accepted nodes
    walking = cur == 0
    for depth in range(N):
        base = (b * N + cur) * num_splits
        v = tl.load(part_v_ptr + base + soffs, mask=smask, other=-3.0)
        ids = tl.load(part_i_ptr + base + soffs, mask=smask, other=BIG)
        _, y = split_argmax(v, ids, BIG)
        y = y.to(tl.int64)
        tl.store(tok_ptr + b * N + depth, y, mask=walking)
        if SGL_OUT:
            # The node the walk stands on is path[depth]; y is the token committed after it.
            slot = tl.load(slot_ptr + b * slot_sb + cur, mask=walking, other=0).to(tl.int64)
            tl.store(pred_ptr + slot, y.to(pred_ptr.dtype.element_ty), mask=walking)
            tl.store(aidx_ptr + b * aidx_sb + depth, slot.to(aidx_ptr.dtype.element_ty), mask=walking & (depth < D))
        if CHAIN:
            c = cur + 1
            tok = tl.load(cand_ptr + b * cand_sb + cur, mask=walking & (c < N), other=-1).to(tl.int64)
            found = tl.where((c < N) & (tok == y), c, N)
        else:
            # Membership, not order: the smallest matching node index wins.
            found = cur * 0 + N
            c = tl.load(nxt_ptr + b * nxt_sb + cur, mask=walking, other=-1).to(tl.int64)
            guard = cur * 0
            while walking & (c > 0) & (c < N) & (guard < N):
                tok = tl.load(cand_ptr + b * cand_sb + c).to(tl.int64)
                found = tl.where((tok == y) & (c < found), c, found)
                c = tl.load(sib_ptr + b * sib_sb + c).to(tl.int64)
                guard += 1
        moved = walking & (found < N) & (depth + 1 < N)
        if not CHAIN:
            tl.store(path_ptr + b * N + depth + 1, found, mask=moved)
        n += moved.to(tl.int64)
        cur = tl.where(moved, found, cur)
        walking = moved
    tl.store(acc_ptr + b, n)
    if SGL_OUT:
        tl.store(anum_ptr + b, n.to(anum_ptr.dtype.element_ty))
    pad = (lanes > n) & (lanes < N)
    tl.store(tok_ptr + b * N + lanes, tl.full([NP], -1, tl.int64), mask=pad)
    if not CHAIN:
        tl.store(path_ptr + b * N + lanes, tl.where(lanes == 0, 0, -1).to(tl.int64), mask=(lanes == 0) | pad)


def _walk(cand, nxt, sib, target_probs, seeds, positions, position_step, chain, out):
    b, n, _ = target_probs.shape
    dev = target_probs.device
    part_v, part_i = race_rows_argmax(target_probs, seeds, positions, Stream.TARGET.salt, position_step=position_step)
    splits = part_v.shape[1]
    tokens = torch.empty(b, n, dtype=torch.int64, device=dev)
    accept = torch.empty(b, dtype=torch.int64, device=dev)
    path = tokens if chain else torch.empty(b, n, dtype=torch.int64, device=dev)
    if out is None:
        slots = pred = aidx = anum = accept
        slot_sb = aidx_sb = depth_cols = 0
    else:
        slots = out.retrive_index if out.retrive_index.stride(1) == 1 else out.retrive_index.contiguous()
        pred, aidx, anum = out.predicts, out.accept_index, out.accept_token_num
        slot_sb, aidx_sb, depth_cols = slots.stride(0), aidx.stride(0), aidx.shape[1]
    _coupled_walk_kernel[(b,)](
        cand, nxt, sib, part_v, part_i, tokens, accept, path, slots, pred, aidx, anum, n, splits,
        cand.stride(0), nxt.stride(0), sib.stride(0), slot_sb, aidx_sb, depth_cols,
        CHAIN=chain, SGL_OUT=out is not None, SP=cfg.split_lanes(target_probs.shape[2]),
        NP=triton.next_power_of_2(n), BIG=cfg.BIG,
    )
    return tokens, accept, path


def coupled_chain_triton(
    draft_tokens: torch.Tensor,  # [B, K] int64/int32
    target_probs: torch.Tensor,  # [B, K+1, V] float, unit last-dim stride
    seeds: torch.Tensor,  # [B] int64, uint64 bits
    positions: torch.Tensor,  # [B] int64: t, position decided by row 0
    out=None,  # ops.verify_outputs.VerifyOutputs over the chain's K+1 nodes, or None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused coupled chain verify: ``(tokens int64 [B, K+1], accept_lengths int64 [B])``. Unchecked.

    With ``out``, the walk also writes SGLang's verify buffers (node j of the
    chain is candidate j; ``ops.write_verify_outputs`` with ``path = arange``).
    """
    if target_probs.stride(2) != 1:
        target_probs = target_probs.contiguous()
    x = draft_tokens.contiguous()
    if x.shape[1] == 0:  # K = 0: a [B, 0] tensor may have stride 0; the kernel reads nothing from it
        x = torch.zeros(x.shape[0], 1, dtype=x.dtype, device=x.device)
    tokens, accept, _ = _walk(x, x, x, target_probs, seeds, positions, 1, True, out)
    return tokens, accept


def coupled_tree_triton(
    candidates: torch.Tensor,  # [B, N] int64/int32
    next_token: torch.Tensor,  # [B, N] int64/int32
    next_sibling: torch.Tensor,  # [B, N] int64/int32
    target_probs: torch.Tensor,  # [B, N, V] float, unit last-dim stride
    seeds: torch.Tensor,  # [B] int64
    positions: torch.Tensor,  # [B] int64: t, position after the root
    out=None,  # ops.verify_outputs.VerifyOutputs, or None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fused coupled tree verify: ``(tokens [B, N], accept_lengths [B], path [B, N])``, int64. Unchecked.

    With ``out``, the walk also writes SGLang's verify buffers as
    ``ops.write_verify_outputs`` of the three results would.
    """
    if target_probs.stride(2) != 1:
        target_probs = target_probs.contiguous()
    cand, nxt, sib = (t if t.stride(1) == 1 else t.contiguous() for t in (candidates, next_token, next_sibling))
    b, n = cand.shape
    node_pos = torch.empty(b, n, dtype=torch.int64, device=cand.device)
    _tree_positions_kernel[(b,)](nxt, sib, positions, node_pos, n, nxt.stride(0), sib.stride(0),
                                 NP=triton.next_power_of_2(n))
    return _walk(cand, nxt, sib, target_probs, seeds, node_pos, 0, False, out)
