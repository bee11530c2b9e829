"""FA3 attention under the prefix / tail split: the two FA3 calls of ``ops.prefix_split`` and their merge.

``ops.prefix_split`` gives, for any forward mode, the inputs of two attention
calls per query row (keys ``[0, S(L))`` non-causal, keys ``[S(L), L)``
causal) and merges their results; this module makes the two calls with
SGLang's FA3 (``flash_attn_with_kvcache``, ``ver`` 3, one split, page size
1), as SGLang's FlashAttention backend calls it, and merges them with the
fused kernel. A row's two calls get the same keys in the same order in every
mode, so decode, verify (chain or tree) and prefill agree bit for bit
wherever FA3 gives a row the same bits whatever other rows share its call:
the GPU suite (``test/registered/cuda/test_fa3_split_cuda.py``) checks this
row by row before any server uses it.

At head sizes up to :data:`FLOOR_HEAD_DIM` every call passes FA3 the same
``max_seqlen_q`` floor, :data:`MIN_MAX_ROWS` (the most rows one element of a
prefill holds), one query row per element included: there FA3 picks its
kernel from ``max_seqlen_q`` (at head size 64 on the H200, a decode-shaped
call with ``max_seqlen_q`` 1 and the prefill's call with 192 rounded rows
apart past 128 keys, in the non-causal prefix call as well; with 192 in both,
0 of 1,100 rows apart), and it drops the causal flag of a call with
``max_seqlen_q`` 1. It is a bound for the grid: each element's rows still come
from ``cu_seqlens_q``. Above that head size FA3's tile does not follow
``max_seqlen_q`` (0 rows apart without the floor at 96, 128 and 256 on the
H200), and the floor's empty row blocks would cost up to a third of a tree's
verify, so calls pass their own row count, causal calls at least
:data:`MIN_CAUSAL_ROWS`: with one row FA3 drops the causal flag above head
size 128, and the tail call must stay on the prefill's causal kernel (two
rows still fit one query block).

``sglang_plugin/fa3_split_hook.py`` routes the target's FA3 forward modes
through :func:`split_attention` (``SGLANG_DETSPEC_DECODE_ATTENTION=split``);
measured on the H200 in ``docs/e2e/2026-12-05-h200-split/``.
"""

from __future__ import annotations

import torch

from ..ops.prefix_split import PartCall, PrefixSplit, merge_parts
from ..ops.split_limits import PREFIX_SPLIT_GROUP_ROWS

# SGLang's FA3 backend module and class, which the node path and the split hook.
FA_MODULE = "sglang.srt.layers.attention.flashattention_backend"
FA_BACKEND = f"{FA_MODULE}.FlashAttentionBackend"
# Every call's max_seqlen_q is at least this: the most rows a prefill's element holds (module docstring).
MIN_MAX_ROWS = PREFIX_SPLIT_GROUP_ROWS
# Largest head size at which FA3 (sgl-kernel's Hopper build) sizes its query tile from max_seqlen_q.
FLOOR_HEAD_DIM = 64
# Above it, a causal call's max_seqlen_q is at least this: FA3 keeps the causal flag of a call with more than one row.
MIN_CAUSAL_ROWS = 2
FA3 = 3


def fa3_part(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, call: PartCall,
             softmax_scale: float, softcap: float = 0.0,
             out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One call of the split through SGLang's FA3: ``(o, lse)``.

    Args:
        q: ``[rows, heads, head_dim]`` bf16 / fp16 (the caller's query; ``call.rows`` selects from it).
        k_cache, v_cache: FA3's paged KV at page size 1, ``[slots, 1, kv_heads, head_dim]``.
        call: :class:`ops.prefix_split.PartCall`.
        softmax_scale: the layer's scaling.
        softcap: the layer's logit cap (0: none), as SGLang passes it.
        out: ``[call rows, heads, v_head_dim]`` in q's dtype for FA3 to write into, or None.

    Returns:
        ``o`` ``[call rows, heads, v_head_dim]`` in q's dtype (``out`` where given) and ``lse``
        float32 ``[heads, call rows]`` (FA3's varlen layout).
    """
    from sglang.kernels.ops.attention.flash_attention import flash_attn_with_kvcache

    qs = q if call.rows is None else q.index_select(0, call.rows)
    max_rows = max_seqlen_q(call, q.shape[-1])
    result = flash_attn_with_kvcache(q=qs, k_cache=k_cache, v_cache=v_cache, page_table=call.page_table,
                                     cache_batch_idx=call.table_rows, cache_seqlens=call.seqlens,
                                     cu_seqlens_q=call.cu_seqlens_q, max_seqlen_q=max_rows,
                                     softmax_scale=softmax_scale, causal=call.causal, softcap=softcap,
                                     return_softmax_lse=True, num_splits=1, ver=FA3, out=out)
    o, lse = result[0], result[1]
    if out is not None and o.data_ptr() != out.data_ptr():  # a kernel build without an output argument
        o = out.copy_(o)
    return o, lse


def max_seqlen_q(call: PartCall, head_dim: int) -> int:
    """The ``max_seqlen_q`` one call of the split passes FA3 (module docstring): a bound, never a row count.

    Args:
        call: the part call (:class:`ops.prefix_split.PartCall`; its ``max_rows`` and ``causal``).
        head_dim: the layer's query head size.

    Returns:
        :data:`MIN_MAX_ROWS` or more at head sizes up to :data:`FLOOR_HEAD_DIM`; above it the call's own
        row bound, at least :data:`MIN_CAUSAL_ROWS` for a causal call.
    """
    if head_dim <= FLOOR_HEAD_DIM:
        return max(call.max_rows, MIN_MAX_ROWS)
    return max(call.max_rows, MIN_CAUSAL_ROWS) if call.causal else call.max_rows


def split_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, split: PrefixSplit,
                    softmax_scale: float, *, softcap: float = 0.0, out: torch.Tensor | None = None) -> torch.Tensor:
    """Attention of every query row as its prefix call and its tail call merged (module docstring).

    Args:
        q: ``[rows, heads, head_dim]``.
        k_cache, v_cache: ``[slots, 1, kv_heads, head_dim]`` (FA3's paged form, page size 1).
        split: the forward's :class:`ops.prefix_split.PrefixSplit` (``decode_split``,
            ``extend_split`` or ``tree_split``), built once per forward and shared by its layers.
        softmax_scale: the layer's scaling.
        softcap: the layer's logit cap (0: none).
        out: ``[rows, heads, v_head_dim]`` in q's dtype (or float32: the merged result before its
            rounding), written in place, or None.

    Returns:
        ``[rows, heads, v_head_dim]`` in q's dtype (``out`` where given). Where the split has no prefix
        call (every row's keys below the first split key) the tail call's output is the result.
    """
    if split.prefix is None:
        # No row has a prefix part (ops.prefix_split.prefix_free): the merge would return the tail as it is.
        direct = out if out is not None and out.dtype == q.dtype else None
        o2, _ = fa3_part(q, k_cache, v_cache, split.tail, softmax_scale, softcap, out=direct)
        return o2 if out is None or direct is not None else out.copy_(o2)
    o2, l2 = fa3_part(q, k_cache, v_cache, split.tail, softmax_scale, softcap)
    o1, l1 = fa3_part(q, k_cache, v_cache, split.prefix, softmax_scale, softcap)
    return merge_parts(o1, l1, o2, l2, split.has_prefix, split.prefix_index, out=out)


def backend_problem(backend) -> str | None:
    """Why an SGLang ``FlashAttentionBackend`` is outside the case the plugin's FA3 paths cover, or None.

    Both FA3 paths (the node path and the prefix / tail split) rebuild page
    tables of token slots and call FA3 on the layer's KV as it is: they need
    FA3 (not FA4), no MLA, pages of one token, no sliding-window or local
    attention, a KV cache of the model's dtype (``kv_cache_dtype_str`` auto),
    no context parallelism and a backend that keeps a KV cache.
    """
    if backend.fa_impl_ver != FA3:
        return "FA4 (only FA3 is covered)"
    if backend.use_mla:
        return "MLA"
    if backend.page_size != 1:
        return f"KV page size {backend.page_size} (the plugin's page tables list token slots)"
    if backend.has_swa or backend.local_attn_builder is not None:
        return "sliding-window or local attention"
    if backend.kv_cache_dtype_str != "auto":
        return f"a {backend.kv_cache_dtype_str} KV cache"
    if getattr(backend, "attn_cp_size", 1) > 1:
        return "context parallelism"
    if getattr(backend, "fa_skip_kv_cache", False):
        return "a backend that skips the KV cache"
    return None


# The start-up check's request lengths: below the first split key, across the first group edge
# (D + B = 192 keys) and several groups on; the trees' depth and width.
CHECK_LENGTHS = (5, 191, 193, 460)
CHECK_TREE = (-1, 0, 0, 1, 1, 2, 3, 4)  # parents, SGLang's order (a parent before its children)
# The start-up checks' chunked prefill: chunks of this many rows, whose starts fall off FA3's key tile edges.
CHECK_CHUNK = 100


def padded_table(seqs: list[torch.Tensor]) -> torch.Tensor:
    """The start-up checks' page table of several requests in one call: int32 ``[requests, longest]``, a row each,
    each request's slots then zeros."""
    width = max(s.numel() for s in seqs)
    return torch.stack([torch.nn.functional.pad(s, (0, width - s.numel())) for s in seqs])


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors hold the same values bit for bit, compared as float32 bit patterns."""
    return bool(torch.equal(a.float().contiguous().view(torch.int32), b.float().contiguous().view(torch.int32)))


def split_modes_agree(heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device, *,
                      seed: int = 0, lengths: tuple[int, ...] = CHECK_LENGTHS) -> bool:
    """Whether decode, one prefill, a chunked extend and a tree verify give every checked row the same bits here.

    Random queries and KV of the given shape in scattered slots; requests of
    ``lengths`` keys: every position of each request decoded (one batch),
    each request prefilled whole, its rows extended in chunks of :data:`CHECK_CHUNK` after
    the cached ones, and :data:`CHECK_TREE` verified after each request's
    keys, every node against the decode of its path; then all requests in
    one prefill and one tree verify, one page-table row each (so the prefix
    calls' row indices, FA3's ``cache_batch_idx``, must address the right
    request). Merged outputs are
    compared in float32 (before the rounding to ``dtype``, which would hide
    most differences), bit pattern by bit pattern. Runs eagerly (allocates,
    synchronises): call it before CUDA-graph capture. The plugin keeps
    SGLang's FA3 calls where this fails.
    """
    from ..ops.prefix_split import decode_split, extend_split, tree_split

    gen = torch.Generator(device=device).manual_seed(seed)
    n = len(CHECK_TREE)
    total = sum(lengths) + len(lengths) * n
    k = torch.randn(total + 1, 1, kv_heads, head_dim, generator=gen, device=device).to(dtype)
    v = torch.randn(total + 1, 1, kv_heads, head_dim, generator=gen, device=device).to(dtype)
    order = (torch.randperm(total, generator=gen, device=device) + 1).to(torch.int32)
    scale = head_dim ** -0.5
    i32 = dict(dtype=torch.int32, device=device)

    def run(q, split):
        return split_attention(q, k, v, split, scale,
                               out=torch.empty(q.shape[0], heads, head_dim, device=device))

    at = 0
    seqs, queries, decodes, node_queries, node_decodes, node_anc, node_lens = [], [], [], [], [], [], []
    for length in lengths:
        seq = order[at:at + length]
        nodes = order[at + length:at + length + n]
        at += length + n
        q = torch.randn(length, heads, head_dim, generator=gen, device=device).to(dtype)
        table = seq.unsqueeze(0).expand(length, length).contiguous()
        dec = run(q, decode_split(table, torch.arange(1, length + 1, **i32)))
        pre = run(q, extend_split(seq.unsqueeze(0), torch.zeros(1, **i32), torch.tensor([length], **i32), length,
                                  length))
        chunks = []
        for lo in range(0, length, CHECK_CHUNK):
            m = min(CHECK_CHUNK, length - lo)
            chunks.append(run(q[lo:lo + m], extend_split(seq[:lo + m].unsqueeze(0), torch.tensor([lo], **i32),
                                                         torch.tensor([m], **i32), m, m)))
        if not (same_bits(dec, pre) and same_bits(torch.cat(chunks), dec)):
            return False
        paths = []
        for i in range(n):
            path, j = [], i
            while j >= 0:
                path.append(j)
                j = CHECK_TREE[j]
            paths.append(path[::-1])
        anc = torch.zeros(n, n, **i32)
        for i, path in enumerate(paths):
            anc[i, :len(path)] = nodes[torch.tensor(path, device=device)]
        anc_lens = torch.tensor([len(p) for p in paths], **i32)
        qn = torch.randn(n, heads, head_dim, generator=gen, device=device).to(dtype)
        tree = run(qn, tree_split(seq.unsqueeze(0), torch.tensor([length], **i32), anc, anc_lens, n))
        keys = [torch.cat([seq, anc[i, :len(p)]]) for i, p in enumerate(paths)]
        width = max(x.numel() for x in keys)
        node_table = torch.stack([torch.nn.functional.pad(x, (0, width - x.numel())) for x in keys])
        node_dec = run(qn, decode_split(node_table, torch.tensor([x.numel() for x in keys], **i32)))
        if not same_bits(tree, node_dec):
            return False
        seqs.append(seq)
        queries.append(q)
        decodes.append(dec)
        node_queries.append(qn)
        node_decodes.append(node_dec)
        node_anc.append(anc)
        node_lens.append(anc_lens)
    table = padded_table(seqs)
    lens = torch.tensor(lengths, **i32)
    pre = run(torch.cat(queries), extend_split(table, torch.zeros_like(lens), lens, table.shape[1], sum(lengths)))
    tree = run(torch.cat(node_queries), tree_split(table, lens, torch.cat(node_anc), torch.cat(node_lens), n))
    return same_bits(pre, torch.cat(decodes)) and same_bits(tree, torch.cat(node_decodes))
