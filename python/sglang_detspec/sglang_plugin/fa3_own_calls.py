"""Whether SGLang's own FA3 calls already give a chain server decode = prefill = verify, bit for bit.

At target head sizes from ``config.FA3_UNMASKED_DECODE_MAX_HEAD_DIM`` + 1 to
``config.FA3_CAUSAL_KEPT_MAX_HEAD_DIM`` (65-128) FA3 keeps the causal flag of
a one-row call on paged KV, so a decode step, a prefill, a chunked prefill
and a chain's verify all run its causal kernel over the same key tiles; the
kernel probe found 0 of 2,100 rows apart at head size 128
(``docs/benchmarks/fa3_chunk_probe/``). There a server that verifies no
trees gains nothing from the prefix / tail split and pays for it (up to
1.21x SGLang's inter-token latency on the 8B shape,
``docs/benchmarks/attention_cost/2026-12-05-h200-split/``), so the split
stands down for it (``sglang_plugin/fa3_split_hook.py``) where
:func:`sglang_calls_agree` passes on the server's own GPU and shape. Trees
keep the split: SGLang verifies them by cascade attention, which rounds
apart from decode.

The check calls FA3 as SGLang's FlashAttention backend does under
deterministic inference (``flash_attn_with_kvcache``, ``ver`` 3, one split,
``causal`` True, the call's own ``max_seqlen_q``, page size 1).
"""

from __future__ import annotations

from typing import Callable

import torch

from ..ops.prefix_split import PartCall
from .fa3_split import CHECK_CHUNK, CHECK_LENGTHS, FA3, padded_table, same_bits

# Rows a chain verify holds per request in the check (SGLang's default chain: 3 steps, 4 draft tokens).
CHECK_VERIFY_ROWS = 4

Call = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, PartCall, float], tuple[torch.Tensor, torch.Tensor]]


def sglang_fa3_call(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, call: PartCall,
                    softmax_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """One FA3 call as SGLang's backend makes it under deterministic inference: ``(o, lse)``.

    A decode call (``max_rows`` 1) gets the scheduler metadata SGLang's
    backend precomputes for its decode (``_compute_scheduler_metadata``:
    ``get_scheduler_metadata`` with one query row, causal, one split, no
    softcap). Not covered: a logit cap (the hook warns for such layers).

    Args:
        q: ``[rows, heads, head_dim]`` bf16 / fp16 (``call.rows`` must be None).
        k_cache, v_cache: ``[slots, 1, kv_heads, head_dim]`` (page size 1).
        call: a causal :class:`ops.prefix_split.PartCall`; its ``max_rows`` is passed as FA3's
            ``max_seqlen_q`` unchanged (1 for decode), as SGLang passes it.
        softmax_scale: the layer's scaling.

    Returns:
        ``o`` ``[rows, heads, head_dim]`` in q's dtype and ``lse`` float32 ``[heads, rows]``.
    """
    from sglang.kernels.ops.attention.flash_attention import flash_attn_with_kvcache

    metadata = None
    if call.max_rows == 1:
        from sgl_kernel.flash_attn import get_scheduler_metadata

        metadata = get_scheduler_metadata(batch_size=call.seqlens.numel(), max_seqlen_q=1,
                                          max_seqlen_k=int(call.seqlens.max()), num_heads=q.shape[1],
                                          num_heads_k=k_cache.shape[2], headdim=q.shape[2],
                                          cache_seqlens=call.seqlens, qkv_dtype=k_cache.dtype,
                                          cu_seqlens_q=call.cu_seqlens_q, page_size=1, causal=True,
                                          has_softcap=False, num_splits=1)
    o, lse, *_ = flash_attn_with_kvcache(q=q, k_cache=k_cache, v_cache=v_cache, page_table=call.page_table,
                                         cache_seqlens=call.seqlens, cu_seqlens_q=call.cu_seqlens_q,
                                         max_seqlen_q=call.max_rows, softmax_scale=softmax_scale, causal=True,
                                         return_softmax_lse=True, num_splits=1, ver=FA3,
                                         scheduler_metadata=metadata)
    return o, lse


def sglang_calls_agree(heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device, *,
                       seed: int = 0, lengths: tuple[int, ...] = CHECK_LENGTHS,
                       call: Call = sglang_fa3_call) -> bool:
    """Whether SGLang's FA3 calls give every checked row the same bits in decode, prefill, chunks and chain verify.

    Random queries and KV of the given shape in scattered cache slots;
    requests of ``lengths`` keys. Every position of every request is decoded
    (one batch of one-row calls, ``max_seqlen_q`` 1); each request is
    prefilled whole, prefilled in chunks of :data:`CHECK_CHUNK` rows after its
    cached ones, and its last :data:`CHECK_VERIFY_ROWS` rows verified as a
    chain (one causal call); then all requests in one prefill and one chain
    verify. Each row's output and log-sum-exp must equal its decode's bit
    for bit. Runs eagerly (allocates, synchronises): call it before CUDA-graph
    capture.

    Args:
        heads, kv_heads, head_dim: the target layer's attention shape.
        dtype: the query and KV dtype (bf16 or fp16).
        device: the GPU.
        seed: the random data's seed.
        lengths: the requests' key counts.
        call: the attention call (:func:`sglang_fa3_call`; CPU tests pass a torch statement).

    Returns:
        True where every row agrees; False at the first row apart.
    """
    gen = torch.Generator(device=device).manual_seed(seed)
    total = sum(lengths)
    k = torch.randn(total + 1, 1, kv_heads, head_dim, generator=gen, device=device).to(dtype)
    v = torch.randn(total + 1, 1, kv_heads, head_dim, generator=gen, device=device).to(dtype)
    order = (torch.randperm(total, generator=gen, device=device) + 1).to(torch.int32)
    scale = head_dim ** -0.5
    i32 = dict(dtype=torch.int32, device=device)

    def run(q, table, seqlens, rows_per_element):
        counts = torch.as_tensor(rows_per_element, **i32)
        cu = torch.cat([torch.zeros(1, **i32), torch.cumsum(counts, 0, dtype=torch.int32)])
        part = PartCall(rows=None, page_table=table, seqlens=seqlens, cu_seqlens_q=cu,
                        max_rows=int(max(rows_per_element)), causal=True)
        o, lse = call(q, k, v, part, scale)
        return o, lse.transpose(0, 1)  # [rows, heads], to index by row

    def agree(got, want):
        return same_bits(got[0], want[0]) and same_bits(got[1], want[1])

    at = 0
    seqs, queries, decodes = [], [], []
    for length in lengths:
        seq = order[at:at + length]
        at += length
        q = torch.randn(length, heads, head_dim, generator=gen, device=device).to(dtype)
        table = seq.unsqueeze(0).expand(length, length).contiguous()
        dec = run(q, table, torch.arange(1, length + 1, **i32), [1] * length)
        whole = run(q, seq.unsqueeze(0), torch.tensor([length], **i32), [length])
        chunks = [run(q[lo:lo + CHECK_CHUNK], seq[:lo + CHECK_CHUNK].unsqueeze(0),
                      torch.tensor([min(lo + CHECK_CHUNK, length)], **i32), [min(CHECK_CHUNK, length - lo)])
                  for lo in range(0, length, CHECK_CHUNK)]
        chunked = tuple(torch.cat(parts) for parts in zip(*chunks))
        n = min(CHECK_VERIFY_ROWS, length)
        verify = run(q[length - n:], seq.unsqueeze(0), torch.tensor([length], **i32), [n])
        tail = (dec[0][length - n:], dec[1][length - n:])
        if not (agree(whole, dec) and agree(chunked, dec) and agree(verify, tail)):
            return False
        seqs.append(seq)
        queries.append(q)
        decodes.append(dec)
    table = padded_table(seqs)
    lens = torch.tensor(lengths, **i32)
    dec = tuple(torch.cat(parts) for parts in zip(*decodes))
    if not agree(run(torch.cat(queries), table, lens, list(lengths)), dec):
        return False
    ns = [min(CHECK_VERIFY_ROWS, n) for n in lengths]
    verify = run(torch.cat([q[q.shape[0] - n:] for q, n in zip(queries, ns)]), table, lens, ns)
    tails = tuple(torch.cat([d[i][d[i].shape[0] - n:] for d, n in zip(decodes, ns)]) for i in range(2))
    return agree(verify, tails)
