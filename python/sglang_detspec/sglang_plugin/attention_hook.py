"""Triton attention: the target's decode runs the kernel its verify and prefill run.

Hooked symbol:

- ``sglang.srt.layers.attention.triton_backend.TritonAttnBackend.__init__``
  (AFTER): on the target model's backend, the instance's
  ``decode_attention_fwd`` (the one name ``forward_decode`` calls for a
  decode step) is replaced by ``sglang_plugin.decode_attention.decode_as_extend``, or
  on Hopper by ``decode_packed`` (the same kernel with a query-head group
  per 64-row tile) where a bitwise check at start-up passes.

Why: in deterministic mode SGLang 0.5.23's Triton backend runs prefill and
target verify through one single-pass kernel (``extend_attention_fwd_unified``:
one online softmax over key tiles aligned at key 0), but decode through the
two-stage split-KV kernel (splits of 256 keys, merged by log-sum-exp). The two
round differently, so the logits of a token decoded by a server without
speculative decoding and of the same token checked by a verify differ by about
one bf16 step, and a near-tie can flip a sampled token. With the decode step
going through the verify's kernel, one query per request, each row of a chain
verify (and of a prefill, a re-prefill after retraction, an extend after a
radix-cache hit) sees the same keys in the same tiles and the same rounding
as the decode of that token: the logits are bitwise equal. The kernel's
per-row result does not depend on the row's place in its query tile (block
sizes depend on the head dimensions only; rows do not mix in the tile's
matrix products; key tiles past a row's last key are fully masked and leave
its running max, sum and accumulator unchanged).

Not covered, and why (``docs/forward_modes.md``): tree verify (its custom mask
interleaves other branches' keys between a node's ancestors, so the tiles
differ from the decode's), the draft model's backends (their numerics decide
only how much a step commits), MLA and decode-context-parallel backends and
layers with Grok's attention temperature (they keep SGLang's kernel: the
single-pass kernel scales that temperature by another formula), and
sliding-window layers (deterministic extend pads the window to whole key
tiles, decode does not). Where the hook skips the target, or the model has a
sliding window, it logs that the server's logits are ``tokens``, not
``bitwise``. With an fp8 KV cache the single-pass kernel multiplies in fp8,
as verify and prefill already do. Cost: decode loses split-KV, so long
contexts at small batch run few, long programs; the measured cost per
serving step is in ``docs/benchmarks/attention_cost/2026-12-02-h200/`` and,
summarised, ``docs/forward_modes.md`` ("What it costs").
On Hopper a query-head group shares one 64-row tile (``sglang_plugin.decode_attention.decode_packed``,
checked bitwise at start-up), which reads each KV head once per group.
``SGLANG_DETSPEC_DECODE_ATTENTION=sglang`` keeps SGLang's decode (claim ``tokens``).
"""

from __future__ import annotations

import logging

import torch

from ..config import current_config
from .decode_attention import decode_as_extend, decode_packed, packable, packed_matches, packed_shape

_BACKEND = "sglang.srt.layers.attention.triton_backend.TritonAttnBackend"
TARGET = f"{_BACKEND}.__init__"
DECODE_FWD = f"{_BACKEND}.decode_attention_fwd"  # the instance attribute swapped (kind SWAP)

logger = logging.getLogger("sglang_detspec")


def use_one_pass_decode(result, backend, *args, **kwargs):
    """AFTER hook of ``TritonAttnBackend.__init__``: route the target's decode through the verify kernel.

    Only where the run is the plugin's (:attr:`DetSpecConfig.active`), SGLang's
    deterministic mode is on for this backend, the bag's ``decode_attention``
    is ``one_pass`` (the default; ``SGLANG_DETSPEC_DECODE_ATTENTION=sglang``
    keeps SGLang's faster split-KV decode and a ``tokens`` claim), and the
    backend belongs to the target model (``is_draft_runner`` false) without
    MLA or decode context parallelism. Returns None (the constructor's result
    is kept).
    """
    bag = current_config()
    if not (bag.active and getattr(backend, "enable_deterministic", False)) or backend.is_draft_runner:
        return None
    if bag.decode_attention != "one_pass":
        logger.warning("sglang-detspec: target decode keeps SGLang's split-KV Triton kernel "
                       "(SGLANG_DETSPEC_DECODE_ATTENTION=%s): this server's logits are 'tokens', not 'bitwise' "
                       "(docs/forward_modes.md)", bag.decode_attention)
        return None
    if backend.use_mla or getattr(backend, "dcp_size", 1) > 1:
        logger.warning("sglang-detspec: target decode keeps SGLang's split-KV Triton kernel (MLA or decode context "
                       "parallelism): this server's logits are 'tokens', not 'bitwise' (docs/forward_modes.md)")
        return None
    if (getattr(backend, "sliding_window_size", None) or -1) > 0:
        logger.warning("sglang-detspec: the model has sliding-window layers, whose decode and extend tile the window "
                       "differently: this server's logits are 'tokens', not 'bitwise' (docs/forward_modes.md)")
    rows = torch.arange(backend.kv_indptr.numel(), dtype=torch.int64, device=backend.kv_indptr.device)
    unified, sglangs = backend.extend_attention_fwd_unified, backend.decode_attention_fwd
    packed = _packed_kernel(backend, unified)
    # The packed rows' offsets for the checked head counts (packed[2]), made once instead of at every layer call.
    group_rows = rows * (packed[2][0] // packed[2][1]) if packed is not None else None

    @torch.compiler.disable  # as SGLang wraps its own decode: dynamo must not trace into the kernel launch
    def decode(q, k_buffer, v_buffer, o, kv_indptr, kv_indices, attn_logits, attn_lse, num_kv_splits,
               max_kv_splits, sm_scale, k_scale, v_scale, logit_cap=0.0, sinks=None, xai_temperature_len=-1,
               *args, page_size=1, score_mod=None, aux_tensors=None, **kwargs):
        if xai_temperature_len > 0:  # the single-pass kernel's temperature formula is not the decode's
            return sglangs(q, k_buffer, v_buffer, o, kv_indptr, kv_indices, attn_logits, attn_lse, num_kv_splits,
                           max_kv_splits, sm_scale, k_scale, v_scale, logit_cap, sinks, xai_temperature_len, *args,
                           page_size=page_size, score_mod=score_mod, aux_tensors=aux_tensors, **kwargs)
        # sinks and score_mod index query heads; the start-up check covers its own shapes only, without a logit
        # cap (the cap is a layer's, unknown at start-up).
        if (packed is not None and sinks is None and score_mod is None and not logit_cap
                and packed_shape(q, k_buffer, v_buffer) == packed[2]):
            return decode_packed(packed[0], packed[1], rows, q, k_buffer, v_buffer, o, kv_indptr, kv_indices,
                                 sm_scale, k_scale, v_scale, logit_cap=logit_cap, page_size=page_size,
                                 group_rows=group_rows)
        return decode_as_extend(unified, rows, q, k_buffer, v_buffer, o, kv_indptr, kv_indices, sm_scale, k_scale,
                                v_scale, logit_cap=logit_cap, sinks=sinks, page_size=page_size, score_mod=score_mod,
                                aux_tensors=aux_tensors)

    backend.decode_attention_fwd = decode
    logger.info("sglang-detspec: target decode attention runs the verify's single-pass Triton kernel%s",
                " (a query-head group per tile, checked bitwise at start-up)" if packed is not None else "")
    return None


def _packed_kernel(backend, unified):
    """``(kernel, blocks, shape)`` for ``sglang_plugin.decode_attention.decode_packed`` on this backend, or None.

    Only on Hopper (not ROCm) with SGLang's 128-row tile for the model's head
    dims and a bf16 / fp16 KV cache, and only after ``packed_matches`` found
    the packed rows bit for bit equal to the one-row-per-head ones on this
    GPU with the model's head counts and page size (so a Triton or driver
    whose code generation differs keeps the proven path, with a warning).
    ``shape``: the ``packed_shape`` checked (those of the first layer); a
    decode call of another shape takes the one-row path.
    """
    device = backend.kv_indptr.device
    if device.type != "cuda":
        return None
    try:
        from sglang.kernels.ops.attention import extend_attention as ext

        pool = backend.token_to_kv_pool
        layer = getattr(pool, "start_layer", 0) or 0
        k_buf, v_buf = pool.get_key_buffer(layer), pool.get_value_buffer(layer)
        if k_buf.dtype not in (torch.bfloat16, torch.float16) or k_buf.ndim != 3:
            return None
        dim, v_dim = k_buf.shape[-1], v_buf.shape[-1]
        blocks = ext._get_block_sizes_for_extend_attention(dim, v_dim)
        if not packable(blocks, torch.cuda.get_device_capability(device), hip=torch.version.hip is not None):
            return None
        kernel = ext._fwd_kernel_unified
        if packed_matches(unified, kernel, blocks, backend.num_head, backend.num_kv_head, dim, v_dim, k_buf.dtype,
                          device, page_size=getattr(backend, "page_size", 1) or 1):
            return kernel, blocks, (backend.num_head, backend.num_kv_head, dim, v_dim, k_buf.dtype)
        logger.warning("sglang-detspec: the packed decode tile did not reproduce the one-row-per-head rows bit for bit "
                       "on this GPU; the target decode keeps one query row per head (slower with many requests and long "
                       "contexts: docs/benchmarks/attention_paths/2026-12-02-h200/)")
    except Exception as exc:  # any surprise keeps the proven path
        logger.warning("sglang-detspec: packed decode tile not used (%r)", exc)
    return None
