"""Positional-split attention: the same bits for a query row in prefill, chunked prefill, verify and decode.

Each row's keys are cut at fixed key positions, every :data:`SEGMENT_KEYS`
keys from key 0, whatever the forward mode, batch or chunk; each segment is
one online softmax over key tiles from its first key, and the segments are
folded in order by one rule (``split_attention_triton``). :func:`split_extend`
runs prefill and chunked prefill (an extend after cached keys), a tile of
query rows per program; :func:`split_tree_verify` runs a verify, chain or
tree, each draft token over its prefix and path; :func:`split_decode` runs
one token per request with one program per segment (split-KV: a long
context at small batch still fills the GPU) and folds them in a second
kernel. A row gets the same arithmetic in every mode, so decode equals the prefill of
the same token bit for bit, as far as the GPU's matrix products give a row
the same bits whatever the other rows of its tile are (the GPU suite
``test/registered/cuda/test_split_attention_cuda.py`` checks it row by row;
the plugin re-checks at start-up and keeps its one-pass path where it fails).

Method: FlashAttention's online softmax (Dao et al., 2022) and
Flash-Decoding's split-KV merge by log-sum-exp, with the splits placed by
key position (as SGLang's deterministic Triton decode places its own,
``SGLANG_TRITON_DECODE_SPLIT_TILE_SIZE``) and used by every mode.

Scope: full causal attention, page size 1 (``kv_indices`` are token slots),
bf16 / fp16 queries and KV of one dtype, head dims up to
:data:`MAX_HEAD_DIM`, up to :data:`TILE_ROWS` query heads per KV head, no
logit cap, sinks, sliding window or KV scales: :func:`unsupported` says why
a shape is out. :func:`split_attention_reference` is the torch statement of
the same segments and fold, equal to the kernels within float32 rounding
(the matrix products round apart from torch's), used by the tests.
"""

from __future__ import annotations

import math

import torch

from .split_limits import MAX_HEAD_DIM, MAX_TREE_NODES, SEGMENT_KEYS, TILE_ROWS
from .choices import one_of

# Query rows per tile (TILE_ROWS), key tiles, warps: one shape for every mode, so a row meets the same
# matrix instructions in decode (a KV head's query heads as rows) as in an extend (tokens as rows).
# Eight warps: compiled for sm_90 (ptxas, Triton 3.8) the 64-row tile on four spills at head dim 128
# (1,184 bytes in the extend kernel, 80 in the decode) and on eight does not; timing is the GPU run's.
TILE_KEYS = 64
TILE_WARPS = 8
TILE_STAGES = 2
# An extend may also run 128 rows per tile on the same warps (SGLang's Hopper tile shape): fewer key
# reads in a long prefill, the same bits per row if the GPU keeps a row's products independent of
# how the tile is spread over warpgroups (the GPU test checks it; the default stays at 64 rows until
# measured).
EXTEND_TILE_ROWS = (64, 128)
# Every launch: no multiply fused into an add anywhere, so each rounding is the one the code writes, in
# every kernel alike (the fold must round the same in the extend's registers as in the merge).
_LAUNCH = dict(num_warps=TILE_WARPS, num_stages=TILE_STAGES, enable_fp_fusion=False)
DTYPES = (torch.bfloat16, torch.float16)
_LOG2E = 1.4426950408889634


def unsupported(heads: int, kv_heads: int, head_dim: int, v_head_dim: int, dtype: torch.dtype) -> str | None:
    """Why the kernels cannot run this attention shape, or None when they can.

    ``heads`` query heads over ``kv_heads`` KV heads (a multiple, at most
    :data:`TILE_ROWS` per KV head), head dims 1..:data:`MAX_HEAD_DIM`, ``dtype``
    one of :data:`DTYPES`.
    """
    if kv_heads < 1 or heads < 1 or heads % kv_heads:
        return f"query heads ({heads}) must be a positive multiple of the KV heads ({kv_heads})"
    if heads // kv_heads > TILE_ROWS:
        return f"{heads // kv_heads} query heads per KV head: the decode tile holds at most {TILE_ROWS}"
    for name, dim in (("head_dim", head_dim), ("v_head_dim", v_head_dim)):
        if not 1 <= dim <= MAX_HEAD_DIM:
            return f"{name} must be in [1, {MAX_HEAD_DIM}], got {dim}"
    if dtype not in DTYPES:
        return f"dtype must be bfloat16 or float16, got {dtype}"
    return None


def segments_for(keys: int) -> int:
    """Segments of a row with ``keys`` keys: ``ceil(keys / SEGMENT_KEYS)``."""
    return -(-keys // SEGMENT_KEYS)


def _check(q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor, o: torch.Tensor) -> tuple[int, int]:
    """``(group, kv_heads)`` after checking the shared argument rules (ValueError naming the argument)."""
    if q.ndim != 3 or o.ndim != 3 or k_buffer.ndim != 3 or v_buffer.ndim != 3:
        raise ValueError(f"q, o, k_buffer and v_buffer must be 3-D, got {q.ndim}, {o.ndim}, {k_buffer.ndim}, "
                         f"{v_buffer.ndim} dimensions")
    heads, kv_heads = q.shape[1], k_buffer.shape[1]
    reason = unsupported(heads, kv_heads, q.shape[2], v_buffer.shape[2], k_buffer.dtype)
    if reason:
        raise ValueError(reason)
    if q.dtype != k_buffer.dtype or v_buffer.dtype != k_buffer.dtype:
        raise ValueError(f"q, k_buffer and v_buffer must share a dtype, got {q.dtype}, {k_buffer.dtype}, "
                         f"{v_buffer.dtype}")
    if k_buffer.shape[2] != q.shape[2] or v_buffer.shape[1] != kv_heads or k_buffer.shape[0] != v_buffer.shape[0]:
        raise ValueError(f"k_buffer {tuple(k_buffer.shape)} / v_buffer {tuple(v_buffer.shape)} do not match q "
                         f"{tuple(q.shape)}")
    if o.shape[:2] != q.shape[:2] or o.shape[2] != v_buffer.shape[2]:
        raise ValueError(f"o must be [{q.shape[0]}, {heads}, {v_buffer.shape[2]}], got {tuple(o.shape)}")
    if o.dtype not in (q.dtype, torch.float32):
        raise ValueError(f"o must be q's dtype ({q.dtype}) or float32 (the unrounded output), got {o.dtype}")
    for name, t in (("q", q), ("o", o), ("k_buffer", k_buffer), ("v_buffer", v_buffer)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name}'s last dimension must be contiguous")
    return heads // kv_heads, kv_heads


# Smallest head-dim block: a Triton matrix product needs 16 along each dimension.
MIN_BLOCK_D = 16


def _blocks(q: torch.Tensor, v_buffer: torch.Tensor) -> dict:
    return {"BLOCK_D": max(MIN_BLOCK_D, triton_next_pow2(q.shape[2])),
            "BLOCK_DV": max(MIN_BLOCK_D, triton_next_pow2(v_buffer.shape[2]))}


def triton_next_pow2(n: int) -> int:
    """The next power of two >= ``n`` (Triton's block shapes)."""
    return 1 << max(0, math.ceil(math.log2(n)))


def split_extend(q: torch.Tensor, o: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor,
                 qo_indptr: torch.Tensor, kv_indptr: torch.Tensor, kv_indices: torch.Tensor,
                 prefix_lens: torch.Tensor, max_len_extend: int, sm_scale: float, *,
                 tile_rows: int = TILE_ROWS) -> torch.Tensor:
    """Causal attention of an extend (prefill, chunked prefill, an extend after a cache hit), positionally split.

    Args:
        q: ``[tokens, heads, head_dim]`` bf16 / fp16; request b's queries are
            rows ``qo_indptr[b]:qo_indptr[b + 1]``.
        o: ``[tokens, heads, v_head_dim]``, q's dtype (or float32: the output before its rounding,
            which the checks compare), written in place.
        k_buffer, v_buffer: ``[slots, kv_heads, head_dim]`` / ``[slots, kv_heads, v_head_dim]``
            (the KV cache, page size 1; the extend's own keys already written).
        qo_indptr, kv_indptr: int32 / int64 ``[requests + 1]``; request b's keys are
            ``kv_indices[kv_indptr[b]:kv_indptr[b + 1]]``: its cached prefix, then its extend's tokens.
        kv_indices: int32 / int64 cache slots.
        prefix_lens: int32 ``[requests]``: keys before the extend; extend row i sees key positions
            ``<= prefix_lens[b] + i``.
        max_len_extend: a bound on every request's query count (host int; sizes the grid).
        sm_scale: softmax scale (float).
        tile_rows: query rows per program, one of :data:`EXTEND_TILE_ROWS` (on :data:`TILE_WARPS` warps).

    Returns:
        ``o``.

    Raises:
        ValueError: shapes, dtypes or strides outside the scope (:func:`unsupported`),
        ``max_len_extend`` below 1, or ``tile_rows`` not in :data:`EXTEND_TILE_ROWS`.
    """
    from .split_attention_triton import split_extend_kernel

    group, _ = _check(q, k_buffer, v_buffer, o)
    if not isinstance(max_len_extend, int) or max_len_extend < 1:
        raise ValueError(f"max_len_extend must be an int >= 1, got {max_len_extend!r}")
    if tile_rows not in EXTEND_TILE_ROWS:
        raise ValueError(f"tile_rows must be one of {one_of(EXTEND_TILE_ROWS)}, got {tile_rows!r}")
    requests = qo_indptr.numel() - 1
    if requests < 1:
        return o
    grid = (requests, q.shape[1], -(-max_len_extend // tile_rows))
    split_extend_kernel[grid](
        q, o, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices, prefix_lens, float(sm_scale) * _LOG2E,
        q.stride(0), q.stride(1), o.stride(0), o.stride(1), k_buffer.stride(0), k_buffer.stride(1),
        v_buffer.stride(0), v_buffer.stride(1), q.shape[2], v_buffer.shape[2], GROUP=group, SEGMENT=SEGMENT_KEYS,
        BLOCK_M=tile_rows, BLOCK_N=TILE_KEYS, **_blocks(q, v_buffer), **_LAUNCH)
    return o


def split_decode(q: torch.Tensor, o: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor,
                 kv_indptr: torch.Tensor, kv_indices: torch.Tensor, part_o: torch.Tensor, part_lse: torch.Tensor,
                 sm_scale: float) -> torch.Tensor:
    """One decode step's attention (one query per request over all its keys), split-KV by position, then folded.

    Args:
        q: ``[requests, heads, head_dim]`` bf16 / fp16.
        o: ``[requests, heads, v_head_dim]``, q's dtype or float32 (as :func:`split_extend`), written in place.
        k_buffer, v_buffer: as :func:`split_extend` (the step's own key already written).
        kv_indptr, kv_indices: request b's keys are ``kv_indices[kv_indptr[b]:kv_indptr[b + 1]]``.
        part_o: float32 ``[>= requests, heads, S, v_head_dim]`` scratch, ``S`` at least
            :func:`segments_for` of the longest request's keys (SGLang's decode ``attn_logits``);
            the grid launches ``S`` segments per request and KV head, those past a request's keys exit.
        part_lse: float32 ``[>= requests, heads, >= S]`` scratch (SGLang's ``attn_lse``).
        sm_scale: softmax scale (float).

    Returns:
        ``o``.

    Raises:
        ValueError: shapes, dtypes or strides outside the scope, or scratch of the wrong dtype or shape.
        (A request with more keys than ``part_o`` has segments cannot be seen without reading the
        device; the caller sizes the scratch for the context length.)
    """
    from .split_attention_triton import split_decode_kernel, split_merge_kernel

    group, kv_heads = _check(q, k_buffer, v_buffer, o)
    n, heads = q.shape[0], q.shape[1]
    if part_o.dtype != torch.float32 or part_lse.dtype != torch.float32:
        raise ValueError(f"part_o and part_lse must be float32, got {part_o.dtype} / {part_lse.dtype}")
    if (part_o.ndim != 4 or part_o.shape[0] < n or part_o.shape[1] != heads or part_o.shape[3] < v_buffer.shape[2]
            or part_lse.ndim != 3 or part_lse.shape[0] < n or part_lse.shape[1] != heads
            or part_lse.shape[2] < part_o.shape[2]):
        raise ValueError(f"part_o must be [>= {n}, {heads}, S, >= {v_buffer.shape[2]}] and part_lse "
                         f"[>= {n}, {heads}, >= S], got {tuple(part_o.shape)} / {tuple(part_lse.shape)}")
    if n == 0:
        return o
    blocks = _blocks(q, v_buffer)
    split_decode_kernel[(n, kv_heads, part_o.shape[2])](
        q, k_buffer, v_buffer, kv_indptr, kv_indices, part_o, part_lse, float(sm_scale) * _LOG2E,
        q.stride(0), q.stride(1), k_buffer.stride(0), k_buffer.stride(1), v_buffer.stride(0), v_buffer.stride(1),
        part_o.stride(0), part_o.stride(1), part_o.stride(2), part_lse.stride(0), part_lse.stride(1),
        part_lse.stride(2), q.shape[2], v_buffer.shape[2], GROUP=group, SEGMENT=SEGMENT_KEYS, BLOCK_M=TILE_ROWS,
        BLOCK_N=TILE_KEYS, **blocks, **_LAUNCH)
    split_merge_kernel[(n, kv_heads)](
        o, kv_indptr, part_o, part_lse, o.stride(0), o.stride(1), part_o.stride(0), part_o.stride(1),
        part_o.stride(2), part_lse.stride(0), part_lse.stride(1), part_lse.stride(2), v_buffer.shape[2],
        GROUP=group, SEGMENT=SEGMENT_KEYS, BLOCK_H=max(2, triton_next_pow2(group)), BLOCK_DV=blocks["BLOCK_DV"],
        **_LAUNCH)
    return o


def split_tree_verify(q: torch.Tensor, o: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor,
                      qo_indptr: torch.Tensor, kv_indptr: torch.Tensor, kv_indices: torch.Tensor,
                      prefix_lens: torch.Tensor, custom_mask: torch.Tensor, mask_indptr: torch.Tensor,
                      max_len_extend: int, sm_scale: float) -> torch.Tensor:
    """A tree's verify: each node's rows with the bits of its token's decode, the prefix read once per request.

    Node i of request b sees the request's ``prefix_lens[b]`` cached keys and
    the draft tokens its mask row marks (its ancestors and itself), and
    attends to them in that order, as the decode of the node's token would
    (its path after the prefix): the same segments, tiles and fold. The
    segments wholly below the prefix length are computed once for all of a
    request's nodes (their rows share each key tile); the last one or two
    per node. Requires a parent numbered before its children (SGLang's EAGLE
    trees: the mask's ancestors in index order are the path in order).

    Args:
        q, o, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices, prefix_lens: as :func:`split_extend`
            (request b's queries are its draft tokens, its keys its prefix then its draft tokens).
        custom_mask: bool / int8 / uint8, flat: node i of request b sees draft token j where
            ``custom_mask[mask_indptr[b] + i * kv_len_b + prefix_lens[b] + j]`` is nonzero
            (``kv_len_b = kv_indptr[b + 1] - kv_indptr[b]``; SGLang's verify mask layout).
        mask_indptr: int ``[requests + 1]``.
        max_len_extend: a bound on the draft tokens per request (host int, 1..:data:`MAX_TREE_NODES`).
        sm_scale: softmax scale.

    Returns:
        ``o``.

    Raises:
        ValueError: as :func:`split_extend`, a mask that is not 1-D, or ``max_len_extend`` out of range.
    """
    from .split_attention_triton import split_tree_shared_kernel, split_tree_tail_kernel

    group, kv_heads = _check(q, k_buffer, v_buffer, o)
    if not isinstance(max_len_extend, int) or not 1 <= max_len_extend <= MAX_TREE_NODES:
        raise ValueError(f"max_len_extend must be an int in [1, {MAX_TREE_NODES}], got {max_len_extend!r}")
    if custom_mask.ndim != 1:
        raise ValueError(f"custom_mask must be 1-D (SGLang's flat verify mask), got {custom_mask.ndim} dimensions")
    requests, tokens, heads = qo_indptr.numel() - 1, q.shape[0], q.shape[1]
    if requests < 1 or tokens == 0:
        return o
    dv = v_buffer.shape[2]
    state_acc = torch.empty(tokens, heads, dv, dtype=torch.float32, device=q.device)
    state_e = torch.empty(tokens, heads, dtype=torch.float32, device=q.device)
    state_total = torch.empty(tokens, heads, dtype=torch.float32, device=q.device)
    blocks = _blocks(q, v_buffer)
    strides = (k_buffer.stride(0), k_buffer.stride(1), v_buffer.stride(0), v_buffer.stride(1))
    state_strides = (state_acc.stride(0), state_acc.stride(1), state_e.stride(0), state_e.stride(1))
    scale = float(sm_scale) * _LOG2E
    launch = dict(GROUP=group, SEGMENT=SEGMENT_KEYS, BLOCK_M=TILE_ROWS, BLOCK_N=TILE_KEYS, **blocks, **_LAUNCH)
    split_tree_shared_kernel[(requests, kv_heads, -(-max_len_extend * group // TILE_ROWS))](
        q, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices, prefix_lens, state_acc, state_e, state_total, scale,
        q.stride(0), q.stride(1), *strides, *state_strides, q.shape[2], dv, **launch)
    mask = custom_mask.view(torch.int8) if custom_mask.dtype in (torch.bool, torch.uint8) else custom_mask
    split_tree_tail_kernel[(requests, kv_heads, max_len_extend)](
        q, o, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices, prefix_lens, mask, mask_indptr, state_acc, state_e,
        state_total, scale, q.stride(0), q.stride(1), o.stride(0), o.stride(1), *strides, *state_strides, q.shape[2],
        dv, BLOCK_T=max(MIN_BLOCK_D, triton_next_pow2(max_len_extend)), **launch)
    return o


def split_attention_reference(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, visible: int,
                              sm_scale: float) -> torch.Tensor:
    """The segments and fold of the kernels for one query row, in float32 torch (for tests).

    Args:
        q: ``[heads, head_dim]``; keys ``[n, kv_heads, head_dim]``, values ``[n, kv_heads, v_head_dim]``
            (any float dtype, computed in float32).
        visible: the row sees keys ``0 .. visible - 1`` (1 <= visible <= n).
        sm_scale: softmax scale.

    Returns:
        float32 ``[heads, v_head_dim]``: softmax attention over the visible keys, computed per
        :data:`SEGMENT_KEYS`-key segment (max, sum, normalised output, base-2 log-sum-exp) and folded
        in segment order. Equal to the kernels within float32 rounding, not bit for bit.

    Raises:
        ValueError: ``visible`` outside ``[1, n]`` or heads not a multiple of the KV heads.
    """
    n, kv_heads = keys.shape[0], keys.shape[1]
    if not 1 <= visible <= n:
        raise ValueError(f"visible must be in [1, {n}], got {visible}")
    if q.shape[0] % kv_heads:
        raise ValueError(f"q heads ({q.shape[0]}) must be a multiple of the KV heads ({kv_heads})")
    group = q.shape[0] // kv_heads
    kk = keys[:visible].float().repeat_interleave(group, dim=1)  # [visible, heads, d]
    vv = values[:visible].float().repeat_interleave(group, dim=1)
    s = torch.einsum("hd,nhd->hn", q.float(), kk) * (sm_scale * _LOG2E)
    e = torch.full((q.shape[0],), float("-inf"))
    total = torch.zeros(q.shape[0])
    acc = torch.zeros(q.shape[0], values.shape[-1])
    for lo in range(0, visible, SEGMENT_KEYS):
        seg = s[:, lo:lo + SEGMENT_KEYS]
        m = seg.max(dim=1).values
        p = torch.exp2(seg - m[:, None])
        l = p.sum(dim=1)
        seg_o = torch.einsum("hn,nhd->hd", p, vv[lo:lo + SEGMENT_KEYS]) / l[:, None]
        seg_lse = m + torch.log2(l)
        e_new = torch.maximum(e, seg_lse)
        a, b = torch.exp2(e - e_new), torch.exp2(seg_lse - e_new)
        total = total * a + b
        acc = acc * a[:, None] + b[:, None] * seg_o
        e = e_new
    return acc / total[:, None]


# Key counts split_modes_agree runs: both sides of the 64-key tiles and of the 256-key segments.
CHECK_LENGTHS = (1, 3, 63, 64, 65, 255, 256, 257, 300, 511, 512, 513, 1100)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two float tensors of one shape and dtype hold the same bit patterns (``-0.0`` is not ``0.0``)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return torch.equal(a.contiguous().view(ints), b.contiguous().view(ints))


def split_modes_agree(heads: int, kv_heads: int, head_dim: int, v_head_dim: int, dtype: torch.dtype,
                      device: torch.device, *, seed: int = 0, lengths: tuple[int, ...] = CHECK_LENGTHS) -> bool:
    """Whether decode, one prefill, a chunked extend and a tree verify give every checked row the same bits here.

    Random queries and KV of the given shape; requests of ``lengths`` keys
    (:data:`CHECK_LENGTHS`, each at least 1); each
    request's last token decoded, its whole sequence prefilled, and its last
    three tokens extended after the rest (a chunked extend), the batch
    in two orders; and each request longer than :data:`CHECK_TREE` verified
    as that tree after its other keys, every node against the decode of its
    path. Outputs are compared in float32, before their rounding to the
    serving dtype (which would hide most differences), bit pattern by bit
    pattern (zero signs too); once in ``dtype`` as well, which must give the
    float32 outputs rounded (and compiles the variants a server runs before
    its first request). Runs eagerly (allocates, synchronises): call it before
    CUDA-graph capture. The plugin keeps its one-pass path where this fails.

    Raises:
        ValueError: a shape :func:`unsupported` refuses.
    """
    reason = unsupported(heads, kv_heads, head_dim, v_head_dim, dtype)
    if reason:
        raise ValueError(reason)
    lens = list(lengths)
    if not lens or min(lens) < 1:
        raise ValueError(f"lengths must be key counts >= 1, got {lengths!r}")
    gen = torch.Generator(device=device).manual_seed(seed)
    slots = sum(lens) + 1
    k = torch.randn(slots, kv_heads, head_dim, generator=gen, device=device).to(dtype)
    v = torch.randn(slots, kv_heads, v_head_dim, generator=gen, device=device).to(dtype)
    order = torch.randperm(slots - 1, generator=gen, device=device) + 1
    q_all = torch.randn(sum(lens), heads, head_dim, generator=gen, device=device).to(dtype)
    scale = head_dim ** -0.5
    starts = [sum(lens[:i]) for i in range(len(lens))]
    segments = segments_for(max(lens))
    outputs = {}  # per batch order: the decode rows in request order
    for perm in (list(range(len(lens))), list(reversed(range(len(lens))))):
        ls = [lens[i] for i in perm]
        indptr = _indptr(ls, device)
        cum = indptr.tolist()
        indices = torch.cat([order[starts[i]:starts[i] + lens[i]] for i in perm])
        q = torch.cat([q_all[starts[i]:starts[i] + lens[i]] for i in perm])
        prefill = split_extend(q, torch.empty(q.shape[0], heads, v_head_dim, device=device), k, v,
                               indptr, indptr, indices, torch.zeros(len(ls), dtype=torch.int32, device=device),
                               max(ls), scale)
        last = torch.tensor([c - 1 for c in cum[1:]], device=device)
        decode = split_decode(q[last].contiguous(), torch.empty(len(ls), heads, v_head_dim, device=device), k, v,
                              indptr, indices,
                              torch.empty(len(ls), heads, segments, v_head_dim, device=device),
                              torch.empty(len(ls), heads, segments, device=device), scale)
        tail = [min(3, n) for n in ls]
        rows = torch.cat([torch.arange(c - t, c, device=device) for c, t in zip(cum[1:], tail)])
        qo = _indptr(tail, device)
        chunked = split_extend(q[rows].contiguous(), torch.empty(rows.numel(), heads, v_head_dim, device=device), k,
                               v, qo, indptr, indices,
                               torch.tensor([n - t for n, t in zip(ls, tail)], dtype=torch.int32, device=device),
                               3, scale)
        if not (same_bits(decode, prefill[last]) and same_bits(chunked, prefill[rows])):
            return False
        if not outputs:  # once, in the serving dtype: its outputs are the float32 ones rounded (and they compile here)
            served = split_extend(q, torch.empty(q.shape[0], heads, v_head_dim, dtype=dtype, device=device), k, v,
                                  indptr, indptr, indices, torch.zeros(len(ls), dtype=torch.int32, device=device),
                                  max(ls), scale)
            served_decode = split_decode(
                q[last].contiguous(), torch.empty(len(ls), heads, v_head_dim, dtype=dtype, device=device), k, v,
                indptr, indices, torch.empty(len(ls), heads, segments, v_head_dim, device=device),
                torch.empty(len(ls), heads, segments, device=device), scale)
            if not (same_bits(served, prefill.to(dtype)) and same_bits(served_decode, decode.to(dtype))):
                return False
        by_request = {}
        for j, i in enumerate(perm):
            by_request[i] = decode[j]
        outputs[tuple(perm)] = torch.stack([by_request[i] for i in range(len(lens))])
    first, second = outputs.values()
    return same_bits(first, second) and _tree_rows_agree(lens, starts, order, q_all, k, v, scale)


# The check's tree: SGLang's EAGLE numbering of top-k 4 with 8 draft tokens (a parent before its children).
CHECK_TREE = (-1, 0, 0, 0, 0, 1, 1, 2)


def tree_paths(parents) -> list[list[int]]:
    """Each node's path: the root, its ancestors down to the node, the node (draft-token indices, root first).

    ``parents[i]``: node i's parent, -1 for the root (node 0 only); a
    parent is numbered before its children, as in SGLang's EAGLE trees.

    Raises:
        ValueError: a tree not numbered that way.
    """
    parents = list(parents)
    if not parents or parents[0] != -1 or any(not 0 <= p < i for i, p in enumerate(parents) if i):
        raise ValueError(f"parents must start with -1 and number each parent before its child, got {parents}")
    paths = []
    for i, p in enumerate(parents):
        paths.append(paths[p] + [i] if p >= 0 else [i])
    return paths


def tree_verify_layout(parents, prefixes, slots) -> tuple[dict, list[torch.Tensor]]:
    """SGLang's verify arguments for one tree per request, and each node's keys in its decode's order.

    Args:
        parents: the tree (:func:`tree_paths`), the same for every request.
        prefixes: cached keys per request before its draft.
        slots: per request, a 1-D int tensor of its ``prefix + len(parents)`` cache slots: the
            prefix's, then the draft tokens' in node order (the layout SGLang's verify builds).

    Returns:
        ``(kwargs, paths)``: ``kwargs`` holds ``qo_indptr``, ``kv_indptr``, ``kv_indices``,
        ``prefix_lens``, ``custom_mask`` (bool, flat: node i sees the prefix, its ancestors and itself)
        and ``mask_indptr`` for :func:`split_tree_verify` (on the slots' device); ``paths`` holds each
        node's slots, request by request: the prefix, then its path (what its decode attends to).
    """
    n, node_paths = len(parents), tree_paths(parents)
    device = slots[0].device
    masks, paths = [], []
    for p, keys in zip(prefixes, slots):
        mask = torch.zeros(n, p + n, dtype=torch.bool)
        mask[:, :p] = True
        for node, path in enumerate(node_paths):
            mask[node, [p + j for j in path]] = True
            paths.append(torch.cat([keys[:p], keys[p:][torch.tensor(path, device=device)]]))
        masks.append(mask.flatten())
    kwargs = dict(
        qo_indptr=torch.arange(0, len(prefixes) * n + 1, n, dtype=torch.int32, device=device),
        kv_indptr=_indptr([p + n for p in prefixes], device), kv_indices=torch.cat(list(slots)),
        prefix_lens=torch.tensor(list(prefixes), dtype=torch.int32, device=device),
        custom_mask=torch.cat(masks).to(device),
        mask_indptr=_indptr([m.numel() for m in masks], device).to(torch.int64))
    return kwargs, paths


def _indptr(lengths, device) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(list(lengths)).cumsum(0).tolist()], dtype=torch.int32, device=device)


def _tree_rows_agree(lens, starts, order, q_all, k, v, scale) -> bool:
    """Whether :func:`split_tree_verify` gives each node of :data:`CHECK_TREE` its path's decode bits.

    Each request longer than the tree takes its last ``len(CHECK_TREE)``
    slots as the draft and the rest as the prefix.
    """
    n = len(CHECK_TREE)
    chosen = [i for i, m in enumerate(lens) if m > n]
    if not chosen:
        return True
    device, heads = q_all.device, q_all.shape[1]
    layout, paths = tree_verify_layout(CHECK_TREE, [lens[i] - n for i in chosen],
                                       [order[starts[i]:starts[i] + lens[i]] for i in chosen])
    q = torch.cat([q_all[starts[i]:starts[i] + n] for i in chosen])
    tree = split_tree_verify(q, torch.empty(q.shape[0], heads, v.shape[2], device=device), k, v,
                             max_len_extend=n, sm_scale=scale, **layout)
    served = split_tree_verify(q, torch.empty(q.shape[0], heads, v.shape[2], dtype=q.dtype, device=device), k, v,
                               max_len_extend=n, sm_scale=scale, **layout)
    path_lens = [len(x) for x in paths]
    segments = segments_for(max(path_lens))
    decode = split_decode(q, torch.empty_like(tree), k, v, _indptr(path_lens, device), torch.cat(paths),
                          torch.empty(len(paths), heads, segments, v.shape[2], device=device),
                          torch.empty(len(paths), heads, segments, device=device), scale)
    return same_bits(tree, decode) and same_bits(served, tree.to(q.dtype))
