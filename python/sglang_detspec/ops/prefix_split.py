"""The prefix / tail split: each query row's keys cut at one key chosen from the row's own length.

A query row with ``L`` keys (itself last) is computed as two attention calls
of an external kernel (FA3 on Hopper), merged by log-sum-exp:

- the **prefix part** over keys ``[0, S(L))``, non-causal;
- the **tail part** over keys ``[S(L), L)``, causal (the row at the end of
  its keys, so the mask hides none of them);

with ``S(L) = B * floor(max(L - 1 - D, 0) / B)`` (:func:`split_point`,
``B`` = ``split_limits.PREFIX_SPLIT_BLOCK``, ``D`` = ``PREFIX_SPLIT_DEPTH``).
``S`` depends on ``L`` alone, so decode, chain verify, tree verify, prefill
and chunked prefill hand the kernel the same two key ranges for a row, in the
same order; where the kernel's result for a row does not depend on how many
other rows share its call (measured for FA3 on the H200:
``docs/benchmarks/fa3_split_probe/``), every mode gives the row the same
bits. ``D`` bounds a draft tree's depth, so a tree's nodes split inside their
request's cached prefix, at one of two keys, and share one prefix read per
split key (SGLang's cascade shares one for the whole tree, but rounds the two
parts apart from decode).

This module builds, per forward mode, the inputs of the two calls as one
:class:`PrefixSplit` (static shapes, no host synchronisation: it runs as it
is before a CUDA-graph replay), and merges the two outputs
(:func:`merge_parts`: a fused Triton kernel on CUDA, its torch statement
:func:`merge_parts_reference` elsewhere). The calls themselves are the
caller's (``sglang_plugin/fa3_split.py``): this package imports no kernel
library.

Layout conventions (SGLang's FA3 metadata at page size 1): a page table is
``[rows, W]`` int32 of cache slots, read up to each element's key count, one
row per element or one per request with each element naming its row
(``PartCall.table_rows``: the prefix calls read SGLang's table as it is); a
call's query rows are given by ``cu_seqlens_q`` (int32 ``[elements + 1]``); a
causal call aligns each element's rows with the end of its keys (FA3's
bottom-right causal mask). Method: FlashAttention's online softmax (Dao et
al., 2022) in two calls, joined by the log-sum-exp merge of Flash-Decoding
(split-KV), the split placed by key position.
"""

from __future__ import annotations

import dataclasses

import torch

from .kernel_choice import use_triton
from .split_limits import PREFIX_SPLIT_BLOCK, PREFIX_SPLIT_DEPTH, PREFIX_SPLIT_GROUP_ROWS, PREFIX_SPLIT_TAIL_KEYS


@dataclasses.dataclass(frozen=True)
class PartCall:
    """The inputs of one attention call of the split.

    Attributes:
        rows: int64 ``[call rows]``, the query rows of the call in call order
            (``q.index_select(0, rows)``), or None: the caller's ``q`` as it is.
        page_table: int32 ``[table rows, width]``, element e's keys are
            ``page_table[t, :seqlens[e]]`` with ``t = table_rows[e]`` (``e`` where
            ``table_rows`` is None).
        seqlens: int32 ``[elements]``.
        cu_seqlens_q: int32 ``[elements + 1]``, element e's query rows are call
            rows ``cu_seqlens_q[e]:cu_seqlens_q[e + 1]``.
        max_rows: host int, a bound on any element's query rows (the kernel's grid).
        causal: the tail part is causal (bottom-right aligned), the prefix part not.
        table_rows: int32 ``[elements]``, the page-table row each element reads
            (FA3's ``cache_batch_idx``), or None: row e. The prefix calls read
            SGLang's page table through it instead of a copy of a row per element,
            whose size grows with the context (elements x keys).
    """

    rows: torch.Tensor | None
    page_table: torch.Tensor
    seqlens: torch.Tensor
    cu_seqlens_q: torch.Tensor
    max_rows: int
    causal: bool
    table_rows: torch.Tensor | None = None


@dataclasses.dataclass(frozen=True)
class PrefixSplit:
    """Both calls of a split forward and how their rows meet.

    Attributes:
        prefix, tail: the two calls (:class:`PartCall`); ``prefix`` is None where the
            page table is too narrow for any row to have a prefix part
            (:func:`prefix_free`): the tail call alone is then every row's attention.
        has_prefix: bool ``[rows]``, output row r has a non-empty prefix part
            (``S > 0``); where False the tail alone is the row's attention.
        prefix_index: int64 ``[rows]``, the prefix call's row holding output row
            r's prefix part, or None: row r. The tail call's row r is always
            output row r.
    """

    prefix: PartCall | None
    tail: PartCall
    has_prefix: torch.Tensor
    prefix_index: torch.Tensor | None


def split_point(lengths: torch.Tensor) -> torch.Tensor:
    """``S(L) = B * floor(max(L - 1 - D, 0) / B)``, elementwise, as int32 (module docstring).

    ``lengths``: integer tensor of key counts (each row's ``L``, itself included).
    """
    return (torch.clamp(lengths.to(torch.int64) - 1 - PREFIX_SPLIT_DEPTH, min=0)
            // PREFIX_SPLIT_BLOCK * PREFIX_SPLIT_BLOCK).to(torch.int32)


def prefix_free(page_table: torch.Tensor) -> bool:
    """Whether no row over this page table can have a prefix part (its width is a static bound on every row's keys).

    ``S(L) = 0`` for ``L <= D + B`` (:func:`split_point`), and a row reads at
    most the table's width in keys, so a table of at most ``D + B`` columns
    (SGLang's eager metadata slices it to the batch's longest sequence) needs
    no prefix call. Dropping the prefix call changes no bit: the merge of a
    row without a prefix part weighs its tail by ``exp(0) = 1`` and divides
    by 1, which returns the tail's output as it is (the start-up check and
    the GPU suite compare such rows with rows of a full split). Under a
    CUDA-graph capture the table is the graph's, as wide as the context, so
    captured forwards keep both calls unless the context itself is at most
    ``D + B`` tokens (where no row can have a prefix part either).
    """
    return page_table.shape[1] <= PREFIX_SPLIT_DEPTH + PREFIX_SPLIT_BLOCK


def _gather_columns(table: torch.Tensor, row: torch.Tensor, start: torch.Tensor, width: int) -> torch.Tensor:
    """int32 ``[len(row), width]``: ``table[row[e], start[e] + j]``, columns past the table clamped (never read)."""
    cols = start.to(torch.int64).unsqueeze(1) + torch.arange(width, device=table.device)
    cols = cols.clamp(max=table.shape[1] - 1)
    return table[row.to(torch.int64).unsqueeze(1), cols].to(torch.int32)


def _arange_cu(n: int, device) -> torch.Tensor:
    return torch.arange(n + 1, dtype=torch.int32, device=device)


def decode_split(page_table: torch.Tensor, seqlens: torch.Tensor) -> PrefixSplit:
    """The split of a decode step: one query row per request, the last of its keys.

    Args:
        page_table: int32 ``[bs, W]``, request b's keys ``page_table[b, :seqlens[b]]``
            (SGLang's decode metadata; the prefix call reads it as it is).
        seqlens: int32 ``[bs]``, keys per request, the new token's included (>= 1).

    Returns:
        :class:`PrefixSplit` with ``bs`` rows; the tail table is ``[bs, PREFIX_SPLIT_TAIL_KEYS]``;
        no prefix call where :func:`prefix_free`.
    """
    bs = seqlens.shape[0]
    s = split_point(seqlens)
    rows = torch.arange(bs, device=seqlens.device)
    cu = _arange_cu(bs, seqlens.device)
    prefix = None if prefix_free(page_table) else PartCall(None, page_table, s, cu, 1, causal=False)
    tail = PartCall(None, _gather_columns(page_table, rows, s, PREFIX_SPLIT_TAIL_KEYS),
                    (seqlens.to(torch.int32) - s), cu, 1, causal=True)
    return PrefixSplit(prefix, tail, s > 0, None)


def groups_per_request(max_rows: int) -> int:
    """Split groups an extend of at most ``max_rows`` rows per request can span.

    Rows at positions p share a split key while ``floor(max(p - D, 0) / B)``
    is equal: the first group holds ``D + B`` positions, each later one ``B``.
    """
    if max_rows < 1:
        raise ValueError(f"max_rows must be >= 1, got {max_rows}")
    return -(-max_rows // PREFIX_SPLIT_BLOCK) + 1


def extend_split(page_table: torch.Tensor, prefix_lens: torch.Tensor, extend_lens: torch.Tensor,
                 max_extend: int, rows: int) -> PrefixSplit:
    """The split of an extend: prefill, chunked prefill, an extend after cached keys, a chain verify.

    Request b's query rows are its tokens at positions
    ``prefix_lens[b] .. prefix_lens[b] + extend_lens[b] - 1``, laid out request
    after request (SGLang's extend order); row at position p has keys
    ``page_table[b, :p + 1]``. Rows are grouped by split key (at most
    :func:`groups_per_request` groups per request, a fixed count, so shapes
    do not depend on the data); a group is one element of each call: its
    prefix part over ``[0, S)``, its tail part causal over ``[S, last + 1)``.

    Args:
        page_table: int32 ``[bs, W]``, each request's cache slots up to its last extend token.
        prefix_lens: int ``[bs]``, keys before the extend (cached prefix; a verify's committed keys).
        extend_lens: int ``[bs]``, query rows per request (>= 0).
        max_extend: host int >= every ``extend_lens[b]`` (SGLang's ``max_seq_len_q``).
        rows: host int, the query's row count (``q.shape[0]``): ``sum(extend_lens)``, or more
            where the batch is padded (those rows are computed by neither call and ignored).

    Returns:
        :class:`PrefixSplit` over ``rows`` rows in their input order; no prefix call where
        :func:`prefix_free` (a prefill or extend of short sequences).

    Raises:
        ValueError: ``max_extend`` < 1, or tensors of mismatched batch sizes.
    """
    bs = page_table.shape[0]
    if prefix_lens.shape[0] != bs or extend_lens.shape[0] != bs:
        raise ValueError(f"page_table, prefix_lens and extend_lens must share a batch size, got {bs}, "
                         f"{prefix_lens.shape[0]}, {extend_lens.shape[0]}")
    g = groups_per_request(max_extend)
    dev = page_table.device
    start = prefix_lens.to(torch.int64)
    end = start + extend_lens.to(torch.int64)
    first = _group_of(start)  # [bs]
    group = first.unsqueeze(1) + torch.arange(g, device=dev)  # [bs, g]
    lo = torch.maximum(_group_start(group), start.unsqueeze(1))
    hi = torch.minimum(_group_start(group + 1), end.unsqueeze(1))
    count = (hi - lo).clamp(min=0)  # [bs, g] rows of each element
    s = (group * PREFIX_SPLIT_BLOCK).to(torch.int32)
    cu = torch.zeros(bs * g + 1, dtype=torch.int32, device=dev)
    cu[1:] = torch.cumsum(count.flatten(), 0).to(torch.int32)
    req = torch.arange(bs, device=dev).repeat_interleave(g)
    max_rows = min(max_extend, PREFIX_SPLIT_GROUP_ROWS)
    prefix = None if prefix_free(page_table) else PartCall(
        None, page_table.to(torch.int32), s.flatten(), cu, max_rows, causal=False, table_rows=req.to(torch.int32))
    tail_len = torch.where(count > 0, hi - s, torch.zeros_like(hi)).to(torch.int32)
    tail = PartCall(None, _gather_columns(page_table, req, s.flatten(), PREFIX_SPLIT_TAIL_KEYS),
                    tail_len.flatten(), cu, max_rows, causal=True)
    return PrefixSplit(prefix, tail, _rows_have_prefix(prefix_lens, extend_lens, rows), None)


def _group_of(pos: torch.Tensor) -> torch.Tensor:
    """The split group of a row at position ``pos`` (its split key over ``B``)."""
    return torch.clamp(pos - PREFIX_SPLIT_DEPTH, min=0) // PREFIX_SPLIT_BLOCK


def _group_start(group: torch.Tensor) -> torch.Tensor:
    """The first position of a split group (0 for the first; ``D + g B`` after it)."""
    return torch.where(group > 0, PREFIX_SPLIT_DEPTH + group * PREFIX_SPLIT_BLOCK, torch.zeros_like(group))


def _rows_have_prefix(prefix_lens: torch.Tensor, extend_lens: torch.Tensor, rows: int) -> torch.Tensor:
    """bool ``[rows]``: whether each extend row's split key is above 0 (rows past the extend: request bs - 1's)."""
    lens = extend_lens.to(torch.int64)
    ends = torch.cumsum(lens, 0)
    r = torch.arange(rows, device=lens.device)
    b = torch.searchsorted(ends, r, right=True).clamp(max=lens.shape[0] - 1)
    pos = prefix_lens.to(torch.int64)[b] + r - (ends[b] - lens[b])
    return _group_of(pos) > 0


def tree_split(page_table: torch.Tensor, prefix_lens: torch.Tensor, ancestor_table: torch.Tensor,
               ancestor_lens: torch.Tensor, n: int) -> PrefixSplit:
    """The split of a tree verify: ``n`` draft nodes per request, each over its prefix and its path.

    Node ``r = b * n + i`` has the keys ``page_table[b, :prefix_lens[b]]`` then
    ``ancestor_table[r, :ancestor_lens[r]]`` (root to node, itself last): the
    keys of its token's decode step, in that order (SGLang's cascade metadata:
    its prefix page table and its "expand" table). With ``L`` that count, its
    prefix part is ``[0, S(L))``, inside the request's cached prefix while the
    node's depth (``ancestor_lens - 1``) is at most ``PREFIX_SPLIT_DEPTH``; a
    request's nodes split at one of two keys ``S0 = S(prefix_lens[b] + 1)`` and
    ``S0 + B``, so the prefix call has two elements per request, the nodes of
    each gathered together (``prefix.rows``); the tail call has one element per
    node, one query row over ``[S, L)``.

    Args:
        page_table: int32 ``[bs, W]``, ``W >= prefix_lens[b]``.
        prefix_lens: int ``[bs]``, committed keys per request (the root's position).
        ancestor_table: int32 ``[bs * n, >= 1]``.
        ancestor_lens: int ``[bs * n]``, in ``[1, PREFIX_SPLIT_DEPTH + 1]``.
        n: draft tokens per request.

    Returns:
        :class:`PrefixSplit` over ``bs * n`` rows (node order).

    Raises:
        ValueError: tensors whose sizes do not match ``bs`` and ``n``. Depths past
        ``PREFIX_SPLIT_DEPTH`` are the caller's to refuse (``config``): this
        function does not read them on the host.
    """
    bs = page_table.shape[0]
    if prefix_lens.shape[0] != bs or ancestor_table.shape[0] != bs * n or ancestor_lens.shape[0] != bs * n:
        raise ValueError(f"expected prefix_lens [{bs}], ancestor_table [{bs * n}, k], ancestor_lens [{bs * n}]; got "
                         f"{tuple(prefix_lens.shape)}, {tuple(ancestor_table.shape)}, {tuple(ancestor_lens.shape)}")
    dev = page_table.device
    base = prefix_lens.to(torch.int64)
    node_base = base.repeat_interleave(n)  # [bs * n]
    length = node_base + ancestor_lens.to(torch.int64)
    s = split_point(length).to(torch.int64)
    s0 = split_point(base + 1).to(torch.int64)  # the root's, the smaller of a request's two
    upper = (s > s0.repeat_interleave(n)).view(bs, n)
    # Prefix call: element (b, 0) holds b's nodes splitting at S0, (b, 1) those at S0 + B, in node order.
    key = torch.arange(bs, device=dev).unsqueeze(1) * 2 + upper.to(torch.int64)
    order = torch.sort(key.flatten(), stable=True).indices
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(bs * n, device=dev)
    count = torch.stack([n - upper.sum(1), upper.sum(1)], 1)  # [bs, 2]
    cu = torch.zeros(2 * bs + 1, dtype=torch.int32, device=dev)
    cu[1:] = torch.cumsum(count.flatten(), 0).to(torch.int32)
    req2 = torch.arange(bs, device=dev).repeat_interleave(2)
    s_elem = torch.stack([s0, s0 + PREFIX_SPLIT_BLOCK], 1).flatten().to(torch.int32)
    prefix = PartCall(order, page_table.to(torch.int32), s_elem, cu, n, causal=False, table_rows=req2.to(torch.int32))
    # Tail call: node r's keys from S on, the prefix's first, then its path.
    j = torch.arange(PREFIX_SPLIT_TAIL_KEYS, device=dev)
    col = s.unsqueeze(1) + j  # [bs * n, T] key index in the node's key list
    in_prefix = col < node_base.unsqueeze(1)
    req = torch.arange(bs, device=dev).repeat_interleave(n)
    from_prefix = page_table[req.unsqueeze(1), col.clamp(max=page_table.shape[1] - 1)]
    path_col = (col - node_base.unsqueeze(1)).clamp(0, ancestor_table.shape[1] - 1)
    from_path = ancestor_table[torch.arange(bs * n, device=dev).unsqueeze(1), path_col]
    table = torch.where(in_prefix, from_prefix, from_path).to(torch.int32)
    tail = PartCall(None, table, (length - s).to(torch.int32), _arange_cu(bs * n, dev), 1, causal=True)
    return PrefixSplit(prefix, tail, s > 0, inverse)


def merge_parts_reference(o_prefix: torch.Tensor, lse_prefix: torch.Tensor, o_tail: torch.Tensor,
                          lse_tail: torch.Tensor, has_prefix: torch.Tensor,
                          prefix_index: torch.Tensor | None = None) -> torch.Tensor:
    """The log-sum-exp merge of the two parts, in float32, rounded once to ``o_tail``'s dtype.

    Args:
        o_prefix: ``[prefix rows, heads, dv]`` (bf16 / fp16 / fp32).
        lse_prefix: float32 ``[heads, prefix rows]`` (FA3's varlen layout; any strides).
        o_tail: ``[rows, heads, dv]``, same dtype.
        lse_tail: float32 ``[heads, rows]``.
        has_prefix: bool ``[rows]``; where False the prefix part weighs 0 and
            its output, whatever it holds (NaN included), is not read.
        prefix_index: int64 ``[rows]`` or None (:class:`PrefixSplit`).

    Returns:
        ``[rows, heads, dv]`` in ``o_tail``'s dtype: ``(w1 o1 + w2 o2) / (w1 + w2)``
        with ``w = exp(lse - max(lse1, lse2))``, each product and sum rounded as
        written (the Triton kernel fuses no multiply-add either); 0 where neither
        part has a key (a padded row).
    """
    rows = o_tail.shape[0]
    idx = torch.arange(rows, device=o_tail.device) if prefix_index is None else prefix_index
    o1 = o_prefix.index_select(0, idx).float()
    l1 = lse_prefix.float().index_select(1, idx).T  # [rows, heads]
    l2 = lse_tail.float()[:, :rows].T
    l1 = torch.where(has_prefix.unsqueeze(1), l1, torch.full_like(l1, float("-inf")))
    m = torch.maximum(l1, l2)
    m = torch.where(m == float("-inf"), torch.zeros_like(m), m)  # a row no call covered: weights 0, output 0
    w1 = torch.exp(l1 - m).unsqueeze(-1)
    w2 = torch.exp(l2 - m).unsqueeze(-1)
    t1 = torch.where(has_prefix.view(-1, 1, 1), o1 * w1, torch.zeros((), device=o1.device))
    t2 = o_tail.float() * w2
    den = w1 + w2
    return torch.where(den > 0, (t1 + t2) / den, torch.zeros((), device=den.device)).to(o_tail.dtype).contiguous()


def merge_parts(o_prefix: torch.Tensor, lse_prefix: torch.Tensor, o_tail: torch.Tensor, lse_tail: torch.Tensor,
                has_prefix: torch.Tensor, prefix_index: torch.Tensor | None = None, *,
                out: torch.Tensor | None = None, kernel: str = "auto") -> torch.Tensor:
    """:func:`merge_parts_reference` as one fused kernel (Triton on CUDA with ``auto``).

    Arguments as :func:`merge_parts_reference`; ``out``: ``[rows, heads, dv]``
    in ``o_tail``'s dtype or float32 (the merged result before its rounding, which the
    GPU suite compares), written in place, or None.
    ``kernel``: ``auto`` | ``torch`` | ``triton``.

    Raises:
        ValueError: mismatched shapes or dtypes, a non-contiguous last dimension
            (Triton path), an unknown ``kernel``.
    """
    rows, heads, dv = o_tail.shape
    if o_prefix.ndim != 3 or o_prefix.shape[1:] != (heads, dv):
        raise ValueError(f"o_prefix must be [rows, {heads}, {dv}], got {tuple(o_prefix.shape)}")
    if lse_prefix.shape != (heads, o_prefix.shape[0]) or lse_tail.shape[0] != heads or lse_tail.shape[1] < rows:
        raise ValueError(f"lse_prefix must be [{heads}, {o_prefix.shape[0]}] and lse_tail [{heads}, >= {rows}], got "
                         f"{tuple(lse_prefix.shape)} and {tuple(lse_tail.shape)}")
    if has_prefix.shape != (rows,) or (prefix_index is not None and prefix_index.shape != (rows,)):
        raise ValueError(f"has_prefix and prefix_index must be [{rows}]")
    if o_prefix.dtype != o_tail.dtype:
        raise ValueError(f"o_prefix and o_tail must share a dtype, got {o_prefix.dtype} and {o_tail.dtype}")
    if not use_triton(kernel, o_tail.device):
        if out is not None and out.dtype == torch.float32:
            o_prefix, o_tail = o_prefix.float(), o_tail.float()
        result = merge_parts_reference(o_prefix, lse_prefix, o_tail, lse_tail, has_prefix, prefix_index)
        if out is None:
            return result
        out.copy_(result)
        return out
    from .prefix_split_triton import merge_parts_triton

    return merge_parts_triton(o_prefix, lse_prefix, o_tail, lse_tail, has_prefix, prefix_index, out=out)


def part_call_reference(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, call: PartCall,
                        softmax_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """What the attention kernel computes for one :class:`PartCall`, in float32, one query row at a time.

    Args:
        q: ``[rows, heads, d]``; the call reads ``q[call.rows]`` when ``call.rows`` is given.
        k_cache, v_cache: ``[slots, kv_heads, d]`` / ``[slots, kv_heads, dv]`` (or FA3's paged form
            with a page size of 1, ``[slots, 1, kv_heads, d]``); query head h reads KV head
            ``h // (heads // kv_heads)``.
        call: the call's inputs.
        softmax_scale: the scores' factor.

    Returns:
        ``(o, lse)``: float32 ``[call rows, heads, dv]`` and ``[heads, call rows]``
        (FA3's varlen layout); a row without keys gets ``o = 0``, ``lse = -inf``.
        Each row is computed alone, so its result depends on its own keys only.
    """
    if k_cache.ndim == 4:
        k_cache, v_cache = k_cache[:, 0], v_cache[:, 0]
    qs = q if call.rows is None else q.index_select(0, call.rows)
    heads, group = qs.shape[1], qs.shape[1] // k_cache.shape[1]
    o = torch.zeros(qs.shape[0], heads, v_cache.shape[-1], dtype=torch.float32)
    lse = torch.full((heads, qs.shape[0]), float("-inf"), dtype=torch.float32)
    cu = call.cu_seqlens_q.tolist()
    lens = call.seqlens.tolist()
    for e, n_keys in enumerate(lens):
        first, last = cu[e], cu[e + 1]
        row = e if call.table_rows is None else int(call.table_rows[e])
        slots = call.page_table[row, :n_keys].long().cpu()
        k = k_cache[slots].float().cpu().repeat_interleave(group, 1)  # [n_keys, heads, d]
        v = v_cache[slots].float().cpu().repeat_interleave(group, 1)
        for i in range(first, last):
            seen = n_keys - (last - 1 - i) if call.causal else n_keys
            if seen <= 0:
                continue
            scores = torch.einsum("hd,nhd->hn", qs[i].float().cpu(), k[:seen]) * softmax_scale
            lse[:, i] = torch.logsumexp(scores, dim=1)
            o[i] = torch.einsum("hn,nhd->hd", torch.softmax(scores, dim=1), v[:seen])
    return o, lse


def prefix_split_reference(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, split: PrefixSplit,
                           softmax_scale: float) -> torch.Tensor:
    """The whole split attention in torch: both calls by :func:`part_call_reference`, then the merge.

    Returns float32 ``[rows, heads, dv]`` (``rows`` = ``split.has_prefix``'s length).
    """
    o2, l2 = part_call_reference(q, k_cache, v_cache, split.tail, softmax_scale)
    if split.prefix is None:  # no row has a prefix part: the merge weighs the tail alone
        o1, l1 = torch.zeros_like(o2), torch.full_like(l2, float("-inf"))
    else:
        o1, l1 = part_call_reference(q, k_cache, v_cache, split.prefix, softmax_scale)
    rows = split.has_prefix.shape[0]
    if o2.shape[0] < rows:  # rows no call covers (a padded batch's): zero
        o2 = torch.cat([o2, o2.new_zeros(rows - o2.shape[0], *o2.shape[1:])])
        l2 = torch.cat([l2, l2.new_full((l2.shape[0], rows - l2.shape[1]), float("-inf"))], 1)
    return merge_parts_reference(o1, l1, o2, l2, split.has_prefix.cpu(),
                                 None if split.prefix_index is None else split.prefix_index.cpu())
