"""One decode step's attention through SGLang's single-pass extend kernel (one query per request).

Why (``sglang_plugin/attention_hook.py``): in deterministic mode SGLang's
Triton backend runs verify and prefill through ``extend_attention_fwd_unified``
and decode through a split-KV kernel; the two round differently. Running the
decode step as an extend of one token gives it the verify's tiles and
rounding. The kernel is SGLang's, passed in as ``unified``: this op only lays
out its arguments.
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
