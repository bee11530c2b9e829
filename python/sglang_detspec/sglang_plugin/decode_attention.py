"""One decode step's attention through SGLang's single-pass extend kernel (one query per request).

Why (``attention_hook.py``): in deterministic mode SGLang's Triton backend
runs verify and prefill through ``extend_attention_fwd_unified`` and decode
through a split-KV kernel; the two round differently. Running the decode
step as an extend of one token gives it the verify's tiles and rounding.

This module is the adapter to SGLang 0.5.23's private kernel code
(``sglang/kernels/ops/attention/extend_attention.py``): it lays out the
arguments of ``extend_attention_fwd_unified`` and launches its Triton kernel
``_fwd_kernel_unified`` directly, so it lives with the hooks, not in
``ops/`` (which imports nothing of SGLang). The launch binds the kernel's
parameters by name and takes the KV strides from SGLang's own
``_extract_kv_strides``: a parameter SGLang renames or removes is a
``TypeError`` at the first launch (the start-up check's), never an argument
bound to the wrong slot.
"""

from __future__ import annotations

import torch


def decode_as_extend(unified, rows, q, k_buffer, v_buffer, o, kv_indptr, kv_indices, sm_scale, k_scale, v_scale, *,
                     logit_cap=0.0, sinks=None, page_size=1, score_mod=None, aux_tensors=None):
    """One decode step's attention as an extend of one token per request, through ``unified``.

    Args:
        unified: SGLang's ``extend_attention_fwd_unified``.
        rows: int64 ``arange`` on the device, at least ``n + 1`` long (``n = q.shape[0]``);
            sliced, so a CUDA graph captures no allocation for it.
        q: ``[n, heads, head_dim]`` queries, one per request (bf16 / fp16).
        k_buffer, v_buffer: the layer's KV cache (the current token already written).
        o: ``[n, heads, v_head_dim]`` output, written in place.
        kv_indptr: int ``[>= n + 1]`` (int32 or int64); request i's keys are
            ``kv_indices[kv_indptr[i]:kv_indptr[i + 1]]``, its own token last.
        kv_indices: int cache slots (int32 or int64).
        sm_scale, k_scale, v_scale: softmax scale and KV dequantisation scales (floats).
        logit_cap, sinks, page_size, score_mod, aux_tensors: as SGLang's decode.

    Every key is visible to the request's query: it is the last token of an
    extend whose prefix is all keys before it (``prefix_len = len - 1``).

    Returns:
        ``o``.
    """
    n = q.shape[0]
    if rows.numel() < n + 1:  # not reached from SGLang: q never has more rows than kv_indptr has requests
        rows = torch.arange(n + 1, dtype=torch.int64, device=q.device)
    prefix_lens = (kv_indptr[1:n + 1] - kv_indptr[:n] - 1).to(torch.int32)
    unified(q, o, k_buffer, v_buffer, k_scale, v_scale, rows[:n + 1], kv_indptr, kv_indices, prefix_lens, 1,
            sm_scale=sm_scale, logit_cap=logit_cap, is_causal=True, sinks=sinks, page_size=page_size,
            score_mod=score_mod, aux_tensors=aux_tensors)
    return o


# SGLang's Hopper tiling of the single-pass kernel for head dims <= 128: 128 query rows over 8 warps, i.e. two
# warpgroups of 64 rows, each issuing the same 64-row matrix instructions. One warpgroup of 64 rows (4 warps)
# computes every row as either half of the 128-row tile does; the GPU suite and the start-up check prove it.
PACKED_BLOCK_M, PACKED_WARPS = 64, 4


def packable(blocks: tuple, capability: tuple[int, int], hip: bool = False) -> bool:
    """Whether :func:`decode_packed` applies: a CUDA GPU (not ROCm) and a tile :func:`packed_tile` gives.

    ``blocks``: SGLang's ``_get_block_sizes_for_extend_attention(Lq, Lv)``,
    ``(BLOCK_DMODEL, BLOCK_DPE, BLOCK_DV, BLOCK_M, BLOCK_N, num_warps)``.
    ``capability``: the CUDA compute capability. ``hip``: a ROCm build
    (``torch.version.hip``), whose gfx9 GPUs also report major version 9 but
    are no Hopper: SGLang launches its kernel there with other tiles and
    compiler options.

    Two cases: on Hopper, SGLang's 128-row / 8-warp tile for head dims
    without a rope part, packed into 64-row / 4-warp tiles; and, on any CUDA
    GPU, head dims with a rope part (absorbed MLA's 576-wide latent key, one
    KV head for every query head), packed into SGLang's own tile for them:
    the same kernel code as SGLang's call, rows that do not mix, so each
    row's arithmetic is its one-row call's (the start-up check proves both).
    """
    _, dpe, _, block_m, _, warps = blocks
    if hip:
        return False
    return dpe > 0 or (capability[0] == 9 and block_m == 2 * PACKED_BLOCK_M and warps == 2 * PACKED_WARPS)


def packed_tile(blocks: tuple) -> tuple[int, int]:
    """``(BLOCK_M, num_warps)`` of the packed launch for SGLang's ``blocks`` (where :func:`packable` holds).

    A rope part (``BLOCK_DPE > 0``): SGLang's own rows and warps; otherwise the half tile of Hopper's 128 rows.
    """
    _, dpe, _, block_m, _, warps = blocks
    return (block_m, warps) if dpe > 0 else (PACKED_BLOCK_M, PACKED_WARPS)


def packed_shape(q, k_buffer, v_buffer) -> tuple:
    """``(heads, kv_heads, head_dim, v_head_dim, kv dtype)`` of a decode call: what :func:`packed_matches` checked.

    The start-up check holds for the shapes it ran; a layer with other head
    counts, head dims or KV dtype (hybrid models) takes the one-row path.
    """
    return q.shape[1], k_buffer.shape[-2], q.shape[-1], v_buffer.shape[-1], k_buffer.dtype


def kv_strides(buf: torch.Tensor, page_size: int) -> tuple[int, int, int, int]:
    """``(slot, head, page, token)`` strides of a 3-D KV buffer, by SGLang's own ``_extract_kv_strides``.

    The helper SGLang's extend launch uses for the same kernel parameters
    (``extend_attention.py`` imports it from ``decode_attention.py``), so the
    packed call addresses the cache exactly as SGLang's call does. Raises
    SGLang's ``ValueError`` for a buffer that is not 3-D.
    """
    from sglang.kernels.ops.attention.extend_attention import _extract_kv_strides

    return _extract_kv_strides(buf, page_size)


def decode_packed(kernel, blocks: tuple, rows, q, k_buffer, v_buffer, o, kv_indptr, kv_indices, sm_scale, k_scale,
                  v_scale, *, logit_cap=0.0, page_size=1, num_stages=1, group_rows=None):
    """One decode step's attention through SGLang's single-pass kernel, a query-head group per tile.

    The same arithmetic per row as :func:`decode_as_extend` (same kernel, key
    tiles of ``BLOCK_N`` from key 0, one online softmax), but the ``G``
    query heads that share a KV head go into one tile as ``G`` query rows of
    that KV head (:func:`packed_tile`: a 64-row tile on 4 warps instead of
    one row per head in Hopper's 128-row tile on 8 warps; for absorbed MLA,
    whose one latent KV head serves every query head, SGLang's own tile for
    the latent key, 32 rows on Hopper and Ampere, 16 on sm_100, holding that
    many heads instead of one): each program reads its KV head's keys once
    for up to a tile of heads. Every key is visible to every row (all keys
    are passed as the row's prefix). With one KV head the packed rows are
    ``o``'s own rows, written in place; otherwise through a scratch buffer.

    Args:
        kernel: SGLang's ``_fwd_kernel_unified`` (a Triton kernel).
        blocks: SGLang's block sizes for the head dims (see :func:`packable`, which must hold).
        rows: int64 ``arange`` on the device, at least ``n + 1`` long.
        q: ``[n, heads, head_dim]`` bf16 / fp16, one query per request.
        k_buffer, v_buffer: ``[slots, kv_heads, head_dim]`` / ``[slots, kv_heads, v_head_dim]`` (page size 1)
            or paged as SGLang's kernel reads them with ``page_size``.
        o: ``[n, heads, v_head_dim]`` output, written in place.
        kv_indptr, kv_indices: request i's keys are ``kv_indices[kv_indptr[i]:kv_indptr[i + 1]]``.
        sm_scale, k_scale, v_scale: floats, as SGLang's decode receives them.
        logit_cap, page_size: as SGLang's decode; ``num_stages``: the kernel's software pipelining depth.
        group_rows: ``rows * G`` computed once by a caller that decodes every step (the packed rows'
            offsets; sliced, so a decode step launches nothing for them); None computes it here.

    Returns:
        ``o``.

    Raises:
        ValueError: ``heads`` not a multiple of ``kv_heads``, a KV buffer that is not 3-D, or head dims
            above the ``blocks``' ``BLOCK_DMODEL`` / ``BLOCK_DV`` (blocks made for other head dims).
    """
    n, heads, dim = q.shape
    if k_buffer.ndim != 3 or v_buffer.ndim != 3:
        raise ValueError(f"k_buffer and v_buffer must be 3-D [slots, kv_heads, dim], got {tuple(k_buffer.shape)} / "
                         f"{tuple(v_buffer.shape)}")
    kv_heads, v_dim = k_buffer.shape[-2], v_buffer.shape[-1]
    if heads % kv_heads:
        raise ValueError(f"q heads ({heads}) must be a multiple of the KV heads ({kv_heads})")
    dmodel, dpe, dv, _, block_n, _ = blocks
    if dim > dmodel + dpe or v_dim > dv:
        raise ValueError(f"head dims ({dim}, {v_dim}) must be at most the blocks' BLOCK_DMODEL + BLOCK_DPE "
                         f"({dmodel + dpe}) and BLOCK_DV ({dv}): blocks were made for other head dims")
    group = heads // kv_heads
    if group_rows is None or group_rows.numel() < n + 1:
        if rows.numel() < n + 1:
            rows = torch.arange(n + 1, dtype=torch.int64, device=q.device)
        group_rows = rows[:n + 1] * group
    # Row b * group + g of KV head h is query head h * group + g of request b.
    qp = q.view(n, kv_heads, group, dim).transpose(1, 2).reshape(n * group, kv_heads, dim)
    # One KV head (MLA, MQA): row b * group + g is o[b, g] itself, so the kernel writes o without a copy.
    direct = kv_heads == 1 and o.is_contiguous()
    op = o.view(n * group, 1, v_dim) if direct else torch.empty(n * group, kv_heads, v_dim, dtype=o.dtype,
                                                                   device=o.device)
    lens = (kv_indptr[1:n + 1] - kv_indptr[:n]).to(torch.int32)  # every key is a prefix key: none masked
    k_slot, k_head, k_page, k_tok = kv_strides(k_buffer, page_size)
    v_slot, v_head, v_page, v_tok = kv_strides(v_buffer, page_size)
    block_m, warps = packed_tile(blocks)
    # A group above one tile's rows (MQA or MLA with more query heads than the tile has rows) spans several tiles.
    kernel[(n, kv_heads, -(-group // block_m))](
        Q=qp, O=op, K_Buffer=k_buffer, V_Buffer=v_buffer, qo_indptr=group_rows[:n + 1], kv_indptr=kv_indptr,
        kv_indices=kv_indices, prefix_lens=lens, mask_ptr=None, mask_indptr=None, sink_ptr=None,
        window_start_pos=None, sm_scale_withk=sm_scale * k_scale, v_scale=v_scale, kv_group_num=1,
        stride_qbs=qp.stride(0), stride_qh=qp.stride(1), stride_obs=op.stride(0), stride_oh=op.stride(1),
        stride_buf_kbs=k_slot, stride_buf_kh=k_head, stride_buf_vbs=v_slot, stride_buf_vh=v_head,
        stride_buf_kpage=k_page, stride_buf_ktok=k_tok, stride_buf_vpage=v_page, stride_buf_vtok=v_tok,
        SLIDING_WINDOW_SIZE=-1, logit_cap=logit_cap, xai_temperature_len=-1, Lq=dim, Lv=v_dim,
        BLOCK_DMODEL=dmodel, BLOCK_DPE=dpe, BLOCK_DV=dv, BLOCK_M=block_m, BLOCK_N=block_n, IS_CAUSAL=True,
        USE_CUSTOM_MASK=False, HAS_SINK=False, IS_GFX1250=False, PAGE_SIZE=page_size, SCORE_MOD=None, Aux0=None,
        aux0_stride_t=0, aux0_stride_h=0, aux0_len=0, num_warps=warps, num_stages=num_stages)
    if not direct:
        o.view(n, kv_heads, group, v_dim).copy_(op.view(n, group, kv_heads, v_dim).transpose(1, 2))
    return o


def packed_matches(unified, kernel, blocks: tuple, heads: int, kv_heads: int, dim: int, v_dim: int, dtype,
                   device, *, num_stages: int = 1, seed: int = 0, page_size: int = 1) -> bool:
    """Whether :func:`decode_packed` gives :func:`decode_as_extend`'s rows bit for bit on this GPU and shape.

    Random queries and KV; key counts on both sides of the 64-key tile
    edges and of a 128-key span (1 to 1000 keys), the batch in two
    orders. Runs eagerly (allocates, synchronises): call it before CUDA-graph
    capture.

    Args:
        unified, kernel, blocks: SGLang's ``extend_attention_fwd_unified``, its ``_fwd_kernel_unified`` and its
            block sizes for the head dims (as :func:`decode_packed` takes them).
        heads: query heads per GPU; kv_heads: the KV cache's head count (1 for absorbed MLA, whatever the
            config's ``num_key_value_heads``); dim, v_dim: key and value head dims (576 and 512 for MLA's
            latent key, where the value is built as a view of the key's first ``v_dim`` dims, as SGLang's MLA
            pool gives it).
        dtype: the KV cache's (bf16 / fp16); device: the GPU.
        num_stages: the kernel's pipelining depth; seed: the random inputs'; page_size: the server's, so both
            calls compile the kernel variant the server runs (a slot's address is the same at every page size).

    Returns:
        True where every row of both batch orders is equal bit for bit.
    """
    lens = [1, 2, 63, 64, 65, 127, 128, 129, 300, 1000]
    gen = torch.Generator(device=device).manual_seed(seed)
    slots = sum(lens) + 1
    k = torch.randn(slots, kv_heads, dim, generator=gen, device=device).to(dtype)
    # MLA's value is the latent key's first v_dim dims (a strided view); other caches keep a value of their own.
    v = k[..., :v_dim] if v_dim < dim else torch.randn(slots, kv_heads, v_dim, generator=gen, device=device).to(dtype)
    order = torch.randperm(slots - 1, generator=gen, device=device) + 1
    q = torch.randn(len(lens), heads, dim, generator=gen, device=device).to(dtype)
    rows = torch.arange(len(lens) + 1, dtype=torch.int64, device=device)
    scale = dim ** -0.5
    for perm in (list(range(len(lens))), list(reversed(range(len(lens))))):
        ls = [lens[i] for i in perm]
        starts = [sum(lens[:i]) for i in perm]
        indices = torch.cat([order[s:s + n] for s, n in zip(starts, ls)])
        indptr = torch.tensor([0] + torch.tensor(ls).cumsum(0).tolist(), dtype=torch.int32, device=device)
        qq = q[perm].contiguous()
        want = decode_as_extend(unified, rows, qq, k, v, torch.empty(len(ls), heads, v_dim, dtype=dtype,
                                                                     device=device), indptr, indices, scale, 1.0, 1.0,
                                page_size=page_size)
        got = decode_packed(kernel, blocks, rows, qq, k, v, torch.empty_like(want), indptr, indices, scale, 1.0, 1.0,
                            num_stages=num_stages, page_size=page_size)
        if not torch.equal(got, want):
            return False
    return True
