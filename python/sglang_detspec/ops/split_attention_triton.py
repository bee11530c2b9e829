"""Positional-split attention kernels: extend (prefill, chunked prefill), verify, and split-KV decode + merge.

Every query row's keys are cut into segments at fixed key positions
(``[0, S)``, ``[S, 2S)``, ... with ``S`` = ``SEGMENT`` keys), whatever the
forward mode, the batch or the chunk. Each segment runs one online softmax
over key tiles of ``BLOCK_N`` from the segment's first key
(:func:`_segment`), and the segments' results are folded in segment order
by one rule (:func:`_fold`). The extend kernel does both in one program per
tile of ``BLOCK_M`` query rows of one head; the decode kernel runs one
segment per program (the G query heads of one KV head as the rows of a
``BLOCK_M`` tile, so the matrix products have the extend's shapes) and
writes each segment's result, which the merge kernel folds with the same
rule. A row therefore meets the same arithmetic in every mode: decode has
split-KV parallelism and still gives the extend's bits, provided the GPU's
matrix products give a row the same bits whatever the other rows of its
tile hold (the GPU suite and the plugin's start-up check test this).

Numerics: scores in base 2 (``q.k * sm_scale * log2(e)``), ``exp2`` /
``log2``, float32 state; a segment's result is its normalised output
``acc / l`` and log-sum-exp ``m + log2(l)``; the launches never let the
compiler fuse a multiply into an add (``enable_fp_fusion=False``), so the
fold computes the same roundings in the extend's registers as in the
merge's. Method: FlashAttention's online softmax (Dao et al., 2022) with
split-KV decoding merged by log-sum-exp (Flash-Decoding), the splits placed
by key position as in SGLang's deterministic Triton decode.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _segment(q, K_Buffer, V_Buffer, kv_indices, kv_start, seg_lo, seg_hi, limit, scale_log2, k_head, v_head,
             stride_kbs, stride_vbs, offs_d, mask_d, offs_dv, mask_dv, node_prefix, counts,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_DV: tl.constexpr, NODE: tl.constexpr):
    """One segment's softmax for a tile of rows: ``(o float32 [BLOCK_M, BLOCK_DV], lse float32 [BLOCK_M])``.

    Keys ``[seg_lo, seg_hi)`` of the request, in tiles of ``BLOCK_N`` from
    ``seg_lo``; row r sees key positions ``<= limit[r]`` (-1: none). A row
    that sees no key of the segment gets ``o = 0`` and ``lse = -inf``, which
    :func:`_fold` leaves out exactly. ``NODE``: the rows are one tree node's;
    its key at position ``n`` is the request's key ``n`` below
    ``node_prefix``, else the request's draft token ``j`` where ``j`` is the
    ``(n - node_prefix + 1)``-th draft token the node sees (``counts``: the
    running count of the node's visible draft tokens, int32 [BLOCK_T]), so
    the node's keys sit in the positions its decode would give them.
    """
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    for start in range(seg_lo, seg_hi, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        in_seg = offs_n < seg_hi
        if NODE:
            t = offs_n - node_prefix
            j = tl.sum((counts[None, :] <= t[:, None]).to(tl.int32), axis=1)
            pos = tl.where(t < 0, offs_n, node_prefix + j)
        else:
            pos = offs_n
        loc = tl.load(kv_indices + kv_start + pos, mask=in_seg, other=0).to(tl.int64)
        k = tl.load(K_Buffer + loc[None, :] * stride_kbs + k_head + offs_d[:, None],
                    mask=in_seg[None, :] & mask_d[:, None], other=0.0)
        s = tl.dot(q, k) * scale_log2
        s = tl.where(in_seg[None, :] & (offs_n[None, :] <= limit[:, None]), s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with no key yet: no inf - inf
        p = tl.exp2(s - m_ref[:, None])
        alpha = tl.exp2(m - m_ref)
        l = l * alpha + tl.sum(p, 1)
        v = tl.load(V_Buffer + loc[:, None] * stride_vbs + v_head + offs_dv[None, :],
                    mask=in_seg[:, None] & mask_dv[None, :], other=0.0)
        # A tile with none of a row's keys (an extend's rows end at different keys) adds exact zeros to it.
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc)
        m = m_new
    l_ref = tl.where(l == 0.0, 1.0, l)
    return acc / l_ref[:, None], m + tl.log2(l)


@triton.jit
def _fold(e, total, acc, seg_lse, seg_o):
    """Fold one segment's ``(seg_lse [R], seg_o [R, DV])`` into the running ``(e, total, acc)``; the same everywhere.

    ``e``: the largest log-sum-exp so far (base 2); ``total``: the sum of
    ``2**(lse - e)``; ``acc``: the outputs weighted by it. A segment at
    ``-inf`` (no key of the row) changes nothing.
    """
    e_new = tl.maximum(e, seg_lse)
    e_ref = tl.where(e_new == float("-inf"), 0.0, e_new)
    a = tl.exp2(e - e_ref)
    b = tl.exp2(seg_lse - e_ref)
    # A segment with none of a row's keys (an extend's rows end at different keys) is left out, as a decode
    # that never folds it.
    empty = seg_lse == float("-inf")
    return (e_new, tl.where(empty, total, total * a + b),
            tl.where(empty[:, None], acc, acc * a[:, None] + b[:, None] * seg_o))


@triton.jit
def _dims(D, DV, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    """``(offs_d, mask_d, offs_dv, mask_dv)``: the head-dim lanes of q/k and of v, and which are real."""
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    return offs_d, offs_d < D, offs_dv, offs_dv < DV


@triton.jit
def _head_rows(kvh, GROUP: tl.constexpr, BLOCK_M: tl.constexpr):
    """``(row_ok, heads)`` of a tile whose rows are the ``GROUP`` query heads of KV head ``kvh`` (padded)."""
    rows = tl.arange(0, BLOCK_M)
    return rows < GROUP, kvh * GROUP + rows


@triton.jit
def split_extend_kernel(Q, O, K_Buffer, V_Buffer, qo_indptr, kv_indptr, kv_indices, prefix_lens, scale_log2,
                        stride_qt, stride_qh, stride_ot, stride_oh, stride_kbs, stride_kh, stride_vbs, stride_vh,
                        D, DV, GROUP: tl.constexpr, SEGMENT: tl.constexpr, BLOCK_M: tl.constexpr,
                        BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    """Grid ``(requests, query heads, row tiles)``: rows ``t*BLOCK_M ..`` of one request's extend, one head.

    Request b's queries are rows ``qo_indptr[b]:qo_indptr[b + 1]`` of Q, its
    keys ``kv_indices[kv_indptr[b]:kv_indptr[b + 1]]`` (the prefix, then the
    extend's own tokens); extend row i sees key positions
    ``<= prefix_lens[b] + i`` (causal).
    """
    b = tl.program_id(0)
    h = tl.program_id(1)
    t = tl.program_id(2)
    q_start = tl.load(qo_indptr + b)
    q_len = tl.load(qo_indptr + b + 1) - q_start
    if t * BLOCK_M >= q_len:
        return
    kv_start = tl.load(kv_indptr + b)
    kv_len = tl.load(kv_indptr + b + 1) - kv_start
    prefix = tl.load(prefix_lens + b)
    rows = t * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < q_len
    limit = tl.where(row_ok, prefix + rows, -1)
    offs_d, mask_d, offs_dv, mask_dv = _dims(D, DV, BLOCK_D, BLOCK_DV)
    q = tl.load(Q + (q_start + rows)[:, None].to(tl.int64) * stride_qt + h * stride_qh + offs_d[None, :],
                mask=row_ok[:, None] & mask_d[None, :], other=0.0)
    kvh = h // GROUP
    # Keys the tile's last row sees; rows before it see fewer (masked, exact no-ops).
    hi = tl.minimum(kv_len, prefix + tl.minimum(q_len, (t + 1) * BLOCK_M))
    e = tl.full([BLOCK_M], float("-inf"), tl.float32)
    total = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    for seg_lo in range(0, hi, SEGMENT):
        seg_o, seg_lse = _segment(q, K_Buffer, V_Buffer, kv_indices, kv_start, seg_lo,
                                  tl.minimum(seg_lo + SEGMENT, hi), limit, scale_log2, kvh * stride_kh,
                                  kvh * stride_vh, stride_kbs, stride_vbs, offs_d, mask_d, offs_dv, mask_dv, 0, 0,
                                  BLOCK_M, BLOCK_N, BLOCK_DV, False)
        e, total, acc = _fold(e, total, acc, seg_lse, seg_o)
    out = acc / tl.where(total == 0.0, 1.0, total)[:, None]
    tl.store(O + (q_start + rows)[:, None].to(tl.int64) * stride_ot + h * stride_oh + offs_dv[None, :],
             out.to(O.dtype.element_ty), mask=row_ok[:, None] & mask_dv[None, :])


@triton.jit
def split_decode_kernel(Q, K_Buffer, V_Buffer, kv_indptr, kv_indices, Part_O, Part_Lse, scale_log2,
                        stride_qb, stride_qh, stride_kbs, stride_kh, stride_vbs, stride_vh,
                        stride_pb, stride_ph, stride_ps, stride_lb, stride_lh, stride_ls,
                        D, DV, GROUP: tl.constexpr, SEGMENT: tl.constexpr, BLOCK_M: tl.constexpr,
                        BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    """Grid ``(requests, KV heads, segments)``: one segment of one request's one-token decode, a KV head's group.

    The rows of the tile are the ``GROUP`` query heads sharing KV head
    ``program_id(1)``; every one sees all ``kv_indptr[b + 1] - kv_indptr[b]``
    keys. Writes the segment's output and log-sum-exp per query head to
    ``Part_O[b, head, segment]`` / ``Part_Lse[b, head, segment]``; segments
    past the request's keys write nothing.
    """
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    seg = tl.program_id(2)
    kv_start = tl.load(kv_indptr + b)
    kv_len = tl.load(kv_indptr + b + 1) - kv_start
    seg_lo = seg * SEGMENT
    if seg_lo >= kv_len:
        return
    row_ok, heads = _head_rows(kvh, GROUP, BLOCK_M)
    limit = tl.where(row_ok, kv_len - 1, -1)
    offs_d, mask_d, offs_dv, mask_dv = _dims(D, DV, BLOCK_D, BLOCK_DV)
    q = tl.load(Q + b.to(tl.int64) * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
                mask=row_ok[:, None] & mask_d[None, :], other=0.0)
    seg_o, seg_lse = _segment(q, K_Buffer, V_Buffer, kv_indices, kv_start, seg_lo,
                              tl.minimum(seg_lo + SEGMENT, kv_len), limit, scale_log2, kvh * stride_kh,
                              kvh * stride_vh, stride_kbs, stride_vbs, offs_d, mask_d, offs_dv, mask_dv, 0, 0,
                              BLOCK_M, BLOCK_N, BLOCK_DV, False)
    tl.store(Part_O + b.to(tl.int64) * stride_pb + heads[:, None] * stride_ph + seg * stride_ps + offs_dv[None, :],
             seg_o, mask=row_ok[:, None] & mask_dv[None, :])
    tl.store(Part_Lse + b.to(tl.int64) * stride_lb + heads * stride_lh + seg * stride_ls, seg_lse, mask=row_ok)


@triton.jit
def split_merge_kernel(O, kv_indptr, Part_O, Part_Lse, stride_ob, stride_oh, stride_pb, stride_ph, stride_ps,
                       stride_lb, stride_lh, stride_ls, DV, GROUP: tl.constexpr, SEGMENT: tl.constexpr,
                       BLOCK_H: tl.constexpr, BLOCK_DV: tl.constexpr):
    """Grid ``(requests, KV heads)``: fold a decode's segments in order, as the extend kernel folds them."""
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    kv_len = tl.load(kv_indptr + b + 1) - tl.load(kv_indptr + b)
    row_ok, heads = _head_rows(kvh, GROUP, BLOCK_H)
    offs_dv = tl.arange(0, BLOCK_DV)
    mask = row_ok[:, None] & (offs_dv < DV)[None, :]
    e = tl.full([BLOCK_H], float("-inf"), tl.float32)
    total = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_DV], tl.float32)
    for seg_lo in range(0, kv_len, SEGMENT):
        seg = seg_lo // SEGMENT
        seg_o = tl.load(Part_O + b.to(tl.int64) * stride_pb + heads[:, None] * stride_ph + seg * stride_ps
                        + offs_dv[None, :], mask=mask, other=0.0)
        seg_lse = tl.load(Part_Lse + b.to(tl.int64) * stride_lb + heads * stride_lh + seg * stride_ls,
                          mask=row_ok, other=float("-inf"))
        e, total, acc = _fold(e, total, acc, seg_lse, seg_o)
    out = acc / tl.where(total == 0.0, 1.0, total)[:, None]
    tl.store(O + b.to(tl.int64) * stride_ob + heads[:, None] * stride_oh + offs_dv[None, :],
             out.to(O.dtype.element_ty), mask=mask)


@triton.jit
def split_tree_shared_kernel(Q, K_Buffer, V_Buffer, qo_indptr, kv_indptr, kv_indices, prefix_lens, State_acc, State_e,
                             State_total, scale_log2, stride_qt, stride_qh, stride_kbs, stride_kh, stride_vbs,
                             stride_vh, stride_st, stride_sh, stride_et, stride_eh, D, DV, GROUP: tl.constexpr,
                             SEGMENT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                             BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    """Grid ``(requests, KV heads, row tiles)``: a tree verify's segments below the request's draft, shared by its nodes.

    Rows are (node, query head) pairs of KV head ``program_id(1)``, row
    ``node * GROUP + g``; every node of request b sees all keys of the
    segments that end at or before its prefix length ``prefix_lens[b]``, the
    same keys in the same positions as its decode: one read of them serves
    all nodes. Writes each row's fold state (largest log-sum-exp, sum,
    weighted output; -inf / 0 / 0 where no segment is shared) for
    :func:`split_tree_tail_kernel`.
    """
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    t = tl.program_id(2)
    q_start = tl.load(qo_indptr + b)
    q_len = tl.load(qo_indptr + b + 1) - q_start
    if t * BLOCK_M >= q_len * GROUP:
        return
    kv_start = tl.load(kv_indptr + b)
    prefix = tl.load(prefix_lens + b)
    rows = t * BLOCK_M + tl.arange(0, BLOCK_M)
    node = rows // GROUP
    heads = kvh * GROUP + rows % GROUP
    row_ok = node < q_len
    shared_hi = (prefix // SEGMENT) * SEGMENT
    limit = tl.where(row_ok, shared_hi - 1, -1)
    offs_d, mask_d, offs_dv, mask_dv = _dims(D, DV, BLOCK_D, BLOCK_DV)
    tok = (q_start + node).to(tl.int64)
    q = tl.load(Q + tok[:, None] * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
                mask=row_ok[:, None] & mask_d[None, :], other=0.0)
    e = tl.full([BLOCK_M], float("-inf"), tl.float32)
    total = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    for seg_lo in range(0, shared_hi, SEGMENT):
        seg_o, seg_lse = _segment(q, K_Buffer, V_Buffer, kv_indices, kv_start, seg_lo, seg_lo + SEGMENT, limit,
                                  scale_log2, kvh * stride_kh, kvh * stride_vh, stride_kbs, stride_vbs, offs_d,
                                  mask_d, offs_dv, mask_dv, 0, 0, BLOCK_M, BLOCK_N, BLOCK_DV, False)
        e, total, acc = _fold(e, total, acc, seg_lse, seg_o)
    tl.store(State_acc + tok[:, None] * stride_st + heads[:, None] * stride_sh + offs_dv[None, :], acc,
             mask=row_ok[:, None] & mask_dv[None, :])
    tl.store(State_e + tok * stride_et + heads * stride_eh, e, mask=row_ok)
    tl.store(State_total + tok * stride_et + heads * stride_eh, total, mask=row_ok)


@triton.jit
def split_tree_tail_kernel(Q, O, K_Buffer, V_Buffer, qo_indptr, kv_indptr, kv_indices, prefix_lens, Mask,
                           mask_indptr, State_acc, State_e, State_total, scale_log2, stride_qt, stride_qh, stride_ot,
                           stride_oh, stride_kbs, stride_kh, stride_vbs, stride_vh, stride_st, stride_sh, stride_et,
                           stride_eh, D, DV, GROUP: tl.constexpr, SEGMENT: tl.constexpr, BLOCK_M: tl.constexpr,
                           BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                           BLOCK_T: tl.constexpr):
    """Grid ``(requests, KV heads, nodes)``: a tree node's remaining segments, its keys in its decode's positions.

    Node i of request b sees the prefix and the draft tokens its mask row
    marks (``Mask[mask_indptr[b] + i * kv_len + prefix + j]``; its
    ancestors and itself, which SGLang numbers root first), laid out in that
    order after the prefix, as the decode of the node's token lays out its
    path. Continues the fold state of :func:`split_tree_shared_kernel` over
    the segments from the last shared one to the node's last key, then
    writes the node's output rows (the ``GROUP`` query heads of the KV head).
    """
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    node = tl.program_id(2)
    q_start = tl.load(qo_indptr + b)
    q_len = tl.load(qo_indptr + b + 1) - q_start
    if node >= q_len:
        return
    kv_start = tl.load(kv_indptr + b)
    kv_len = tl.load(kv_indptr + b + 1) - kv_start
    prefix = tl.load(prefix_lens + b)
    offs_t = tl.arange(0, BLOCK_T)
    row_mask = tl.load(Mask + tl.load(mask_indptr + b).to(tl.int64) + node * kv_len + prefix + offs_t,
                       mask=offs_t < q_len, other=0)
    counts = tl.cumsum((row_mask != 0).to(tl.int32), axis=0)
    keys = prefix + tl.max(counts, axis=0)
    row_ok, heads = _head_rows(kvh, GROUP, BLOCK_M)
    limit = tl.where(row_ok, keys - 1, -1)
    offs_d, mask_d, offs_dv, mask_dv = _dims(D, DV, BLOCK_D, BLOCK_DV)
    tok = (q_start + node).to(tl.int64)
    q = tl.load(Q + tok * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
                mask=row_ok[:, None] & mask_d[None, :], other=0.0)
    acc = tl.load(State_acc + tok * stride_st + heads[:, None] * stride_sh + offs_dv[None, :],
                  mask=row_ok[:, None] & mask_dv[None, :], other=0.0)
    e = tl.load(State_e + tok * stride_et + heads * stride_eh, mask=row_ok, other=float("-inf"))
    total = tl.load(State_total + tok * stride_et + heads * stride_eh, mask=row_ok, other=0.0)
    for seg_lo in range((prefix // SEGMENT) * SEGMENT, keys, SEGMENT):
        seg_o, seg_lse = _segment(q, K_Buffer, V_Buffer, kv_indices, kv_start, seg_lo,
                                  tl.minimum(seg_lo + SEGMENT, keys), limit, scale_log2, kvh * stride_kh,
                                  kvh * stride_vh, stride_kbs, stride_vbs, offs_d, mask_d, offs_dv, mask_dv, prefix,
                                  counts, BLOCK_M, BLOCK_N, BLOCK_DV, True)
        e, total, acc = _fold(e, total, acc, seg_lse, seg_o)
    out = acc / tl.where(total == 0.0, 1.0, total)[:, None]
    tl.store(O + tok * stride_ot + heads[:, None] * stride_oh + offs_dv[None, :], out.to(O.dtype.element_ty),
             mask=row_ok[:, None] & mask_dv[None, :])
