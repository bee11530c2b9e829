"""Triton attention: the target's decode runs the kernel its verify and prefill run.

Hooked symbol:

- ``sglang.srt.layers.attention.triton_backend.TritonAttnBackend.__init__``
  (AFTER): on the target model's backend, the instance's
  ``decode_attention_fwd`` (the one name ``forward_decode`` calls for a
  decode step) is replaced by ``sglang_plugin.decode_attention.decode_as_extend``, or
  by ``decode_packed`` (the same kernel with a query-head group per tile:
  64 rows on Hopper for head dims without a rope part, SGLang's own tile
  for absorbed MLA's latent key) where a bitwise check at start-up passes.

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

Not covered by the one-pass decode, and why (``docs/forward_modes.md``):
tree verify (its custom mask interleaves other branches' keys between a
node's ancestors, so the tiles differ from the decode's; the ``split``
setting below covers it), the draft model's backends (their numerics decide
only how much a step commits), decode-context-parallel backends and
layers with Grok's attention temperature (they keep SGLang's kernel: the
single-pass kernel scales that temperature by another formula), and
sliding-window layers (deterministic extend pads the window to whole key
tiles, decode does not). Where the hook skips the target, or the model has a
sliding window, it logs that the server's logits are ``tokens``, not
``bitwise``. With an fp8 KV cache the single-pass kernel multiplies in fp8,
as verify and prefill already do, but no server has measured it: any
``--kv-cache-dtype`` but ``auto`` claims ``tokens`` (``config.kv_cache_reason``). Cost: decode loses split-KV, so long
contexts at small batch run few, long programs; the measured cost per
serving step is in ``docs/benchmarks/attention_cost/2026-12-02-h200/`` and,
summarised, ``docs/forward_modes.md`` ("What it costs").
On Hopper a query-head group shares one 64-row tile (``sglang_plugin.decode_attention.decode_packed``,
checked bitwise at start-up), which reads each KV head once per group.
``SGLANG_DETSPEC_DECODE_ATTENTION=sglang`` keeps SGLang's decode (claim ``tokens``).

MLA (DeepSeek-family targets, ``backend.use_mla``): SGLang runs their
attention absorbed in every forward mode under deterministic inference, so
the one-pass decode serves them under ``split`` and ``one_pass`` alike
(:func:`_mla_one_pass`), and a chain's verify runs the kernel's causal
path instead of its masked one (:func:`_causal_chain_verify`). The query
heads of a request share SGLang's own tile for the latent key
(``decode_packed``, SGLang's 32 rows and 8 warps on Hopper: the code of its
one-row call, rows that do not mix) where the start-up check finds the rows
bit for bit those of one row per head, which re-read the latent cache for
every head; ``config.MLA_DECODE_COST`` says what each costs.

``SGLANG_DETSPEC_DECODE_ATTENTION=split`` (the default, measured bitwise on the H200 in
``docs/e2e/2026-12-05-h200-split/``; its serving cost without speculative decoding in
``docs/benchmarks/attention_cost/2026-12-06-h100-triton-split/``; ``one_pass`` asks for the path above)
gives decode its split-KV parallelism back: the instance's
``decode_attention_fwd`` and ``extend_attention_fwd_unified`` (the name
deterministic prefill, extend and verify call) both run the plugin's
positional-split kernels (``ops/split_attention.py``: each row's keys cut
every 256 keys from key 0 in every mode, segments folded in one order), so
decode equals prefill and a chain's verify while a long context is spread
over one program per segment. It applies where
:func:`split_unavailable` finds nothing, its start-up check among it;
elsewhere the one-pass decode above serves, with a warning.
"""

from __future__ import annotations

import dataclasses
import logging

import torch

from ..config import MLA_DECODE_COST, current_config, install_config
from ..ops.split_attention import (MAX_TREE_NODES, SEGMENT_KEYS, segments_for, split_decode, split_extend,
                                   split_modes_agree, split_tree_verify)
from ..ops.split_attention import unsupported as split_shape_problem
from .decode_attention import decode_as_extend, decode_packed, packable, packed_matches, packed_shape

_BACKEND = "sglang.srt.layers.attention.triton_backend.TritonAttnBackend"
TARGET = f"{_BACKEND}.__init__"
DECODE_FWD = f"{_BACKEND}.decode_attention_fwd"  # the instance attribute swapped (kind SWAP)
# ... and, with SGLANG_DETSPEC_DECODE_ATTENTION=split, the extend kernel it calls in deterministic mode.
EXTEND_FWD = f"{_BACKEND}.extend_attention_fwd_unified"
# Logged on a target backend the positional-split kernels serve / where SGLANG_DETSPEC_DECODE_ATTENTION=split
# was asked for and could not apply (the E2E suites' positive control).
SPLIT_ON = "attention run the positional-split Triton kernels"
SPLIT_OFF = "SGLANG_DETSPEC_DECODE_ATTENTION=split not used"

# Logged on an MLA target's backend: what the one-pass decode covers there.
MLA_ONE_PASS = ("MLA target decode runs the verify's single-pass Triton kernel, the one SGLang's deterministic "
                "prefill, extend and verify run for absorbed MLA: a decoded token's logits equal the same token's "
                "in a verify, a prefill and an extend after a radix-cache hit, a chain's verify running the "
                "kernel's causal path as they do, not its masked one (docs/e2e/2026-12-07-h100-mla-causal-verify); "
                f"its cost, paid only without speculative decoding: one query row per head, {MLA_DECODE_COST['one_row']}; "
                "SGLANG_DETSPEC_DECODE_ATTENTION=sglang keeps SGLang's split-KV decode")
# Appended where the start-up check let the packed tile serve an MLA target's decode.
MLA_PACKED = ("; the query heads share SGLang's tile for the latent key (a tile of heads reads the latent cache "
              "once, checked bitwise against one row per head at start-up, served bitwise in "
              f"docs/e2e/2026-12-07-h100-mla-packed-default-tile): {MLA_DECODE_COST['packed']}")
logger = logging.getLogger("sglang_detspec")


def use_one_pass_decode(result, backend, *args, **kwargs):
    """AFTER hook of ``TritonAttnBackend.__init__``: route the target's decode through the verify's arithmetic.

    Only where the run is the plugin's (:attr:`DetSpecConfig.active`), SGLang's
    deterministic mode is on for this backend, the bag's ``decode_attention``
    is ``split`` (the default) or ``one_pass`` (``sglang`` keeps SGLang's
    faster split-KV decode and a ``tokens`` claim), and the backend belongs
    to the target model (``is_draft_runner`` false) without decode context
    parallelism. ``one_pass``: the decode runs SGLang's single-pass extend
    kernel. ``split``: decode and extend both run the positional-split
    kernels (:func:`_split_paths`), where their start-up check passes; the
    one-pass decode otherwise, and always for MLA (:func:`_mla_one_pass`).
    Returns None (the constructor's result is kept).
    """
    bag = current_config()
    if not (bag.active and getattr(backend, "enable_deterministic", False)) or backend.is_draft_runner:
        return None
    if bag.decode_attention not in ("one_pass", "split"):
        logger.warning("sglang-detspec: target decode keeps SGLang's split-KV Triton kernel "
                       "(SGLANG_DETSPEC_DECODE_ATTENTION=%s): this server's logits are 'tokens', not 'bitwise' "
                       "(docs/forward_modes.md)", bag.decode_attention)
        return None
    if getattr(backend, "dcp_size", 1) > 1:
        logger.warning("sglang-detspec: target decode keeps SGLang's split-KV Triton kernel (decode context "
                       "parallelism): this server's logits are 'tokens', not 'bitwise' (docs/forward_modes.md)")
        return None
    rows = torch.arange(backend.kv_indptr.numel(), dtype=torch.int64, device=backend.kv_indptr.device)
    unified = backend.extend_attention_fwd_unified
    if backend.use_mla:
        _mla_one_pass(backend, bag, unified, rows)
        return None
    window = (getattr(backend, "sliding_window_size", None) or -1) > 0
    if window:
        logger.warning("sglang-detspec: the model has sliding-window layers, whose decode and extend tile the window "
                       "differently: this server's logits are 'tokens', not 'bitwise' (docs/forward_modes.md)")
    if bag.decode_attention == "split":
        reason = "the model has sliding-window layers" if window else split_unavailable(backend)
        if reason is None:
            backend.decode_attention_fwd, backend.extend_attention_fwd_unified = _split_paths(
                backend, _one_pass_decode(backend, unified, rows, None), unified)
            logger.info("sglang-detspec: target prefill, extend, verify and decode %s (segments of %d keys; "
                        "decode = prefill checked bitwise at start-up)", SPLIT_ON, SEGMENT_KEYS)
            return None
        # The bag must state the path that runs: a tree's verify now keeps SGLang's kernel ('tokens').
        kept = dataclasses.replace(bag, decode_attention="one_pass")
        install_config(kept)
        logger.warning("sglang-detspec: %s (%s); the target decode runs the verify's single-pass kernel instead%s",
                       SPLIT_OFF, reason, "" if kept.logits == bag.logits else
                       f": this server's logits are {kept.logits!r}, not {bag.logits!r}")
    packed = _packed_kernel(backend, unified)
    backend.decode_attention_fwd = _one_pass_decode(backend, unified, rows, packed)
    logger.info("sglang-detspec: target decode attention runs the verify's single-pass Triton kernel%s",
                " (a query-head group per tile, checked bitwise at start-up)" if packed is not None else "")
    return None


def _mla_one_pass(backend, bag, unified, rows) -> None:
    """An MLA target's decode through the verify's single-pass kernel (module docstring, "MLA").

    Under deterministic inference SGLang 0.5.23 runs a DeepSeek-family
    target's attention absorbed in every forward mode on Triton
    (``handle_attention_triton``): prefill, extend over a cached prefix,
    target verify and decode all read the latent cache as one KV head of
    ``kv_lora_rank + rope`` dims. Its extend runs them through the
    single-pass kernel, its decode through the split-KV one (372 of 512
    logprobs of the tiny DeepSeek-V3's chain apart from its decode,
    ``docs/e2e/2026-12-07-h100-families-backends``). With the decode on the
    extend's kernel every mode takes one kernel's rows. The positional split
    does not serve MLA (its kernels take head dims up to ``MAX_HEAD_DIM``,
    256; the latent key is 576 wide), so ``split`` runs this one-pass decode
    too, and the bag says so. A chain's verify (every verify of an MLA
    target: its tree is served as its chain) runs that kernel's causal path,
    the one the decode and prefill take (:func:`_causal_chain_verify`).
    """
    if bag.decode_attention != "one_pass":
        install_config(dataclasses.replace(bag, decode_attention="one_pass"))
    packed = _packed_kernel(backend, unified)
    backend.decode_attention_fwd = _one_pass_decode(backend, unified, rows, packed)
    # NGRAM verifies trees even at breadth 1 (top-k 1): its mask is no chain's. Start-up refuses NGRAM on MLA
    # targets (refusal mla_tree); this keeps its mask should that refusal ever be passed by.
    if (getattr(backend, "topk", 0) or 0) == 1 and bag.algorithm != "NGRAM":
        backend.extend_attention_fwd_unified = _causal_chain_verify(unified)
    logger.info("sglang-detspec: %s%s", MLA_ONE_PASS, MLA_PACKED if packed is not None else "")


def _causal_chain_verify(unified):
    """SGLang's single-pass extend with a chain verify's mask dropped: the causal rule marks the same keys.

    SGLang's target verify hands the kernel the draft's mask even for a chain
    (top-k 1), where each draft token sees the prefix and the draft tokens up
    to itself: what ``is_causal`` with the request's ``prefix_len`` gives.
    For absorbed MLA (the latent key 576 wide) the kernel's masked path
    rounds otherwise than its causal path, which prefill, extend and the
    one-pass decode take (``test_decode_attention_cuda.py``, the MLA cases;
    56 of 512 logprobs of the tiny DeepSeek-V3's chain apart from decoding
    with the mask kept, ``docs/e2e/2026-12-07-h100-mla-triton-decode``). Installed on
    a target backend whose verifies are chains only (``backend.topk == 1``:
    an MLA target's tree is served as its chain; not under NGRAM, whose
    breadth-1 drafts are verified as trees with top-k 1 and which start-up
    refuses on MLA targets); a call with a window or without ``is_causal``
    keeps its mask.
    """

    @torch.compiler.disable  # as SGLang wraps its own kernel: dynamo must not trace into the launch
    def extend(q, o, k_buffer, v_buffer, k_scale, v_scale, qo_indptr, kv_indptr, kv_indices, prefix_lens,
               max_len_extend, custom_mask=None, mask_indptr=None, sm_scale=None, logit_cap=0.0, is_causal=True,
               sliding_window_size=-1, **kwargs):
        if custom_mask is not None and is_causal and (sliding_window_size or -1) <= 0:
            custom_mask = mask_indptr = None
        return unified(q, o, k_buffer, v_buffer, k_scale, v_scale, qo_indptr, kv_indptr, kv_indices, prefix_lens,
                       max_len_extend, custom_mask=custom_mask, mask_indptr=mask_indptr, sm_scale=sm_scale,
                       logit_cap=logit_cap, is_causal=is_causal, sliding_window_size=sliding_window_size, **kwargs)

    return extend


def _one_pass_decode(backend, unified, rows, packed):
    """The decode function that runs SGLang's single-pass extend kernel (``packed``: see :func:`_packed_kernel`)."""
    sglangs = backend.decode_attention_fwd
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

    return decode


def split_unavailable(backend) -> str | None:
    """Why the positional-split kernels cannot serve this target backend, or None where they can.

    They need a CUDA device (not ROCm), pages of one token, at most
    ``MAX_TREE_NODES`` draft tokens per verify, readable KV buffers of a shape
    :func:`~sglang_detspec.ops.split_attention.unsupported` accepts, SGLang's
    decode scratch sized for one segment per :data:`SEGMENT_KEYS` keys of the
    context (``max_kv_splits``, sized by SGLang's deterministic split tile),
    and their start-up check (decode = prefill = chunked extend = a tree's
    path, bit for bit, on this GPU at this shape). The check runs once per
    process and shape: every target backend of the process (a switching
    tree's chain state too) takes the same answer.
    """
    if (getattr(backend, "page_size", 1) or 1) != 1:
        return f"KV page size {backend.page_size} (the kernels read pages of one token)"
    if (getattr(backend, "num_draft_tokens", 0) or 0) > MAX_TREE_NODES:  # a chain's verify takes the same kernels
        return f"{backend.num_draft_tokens} draft tokens per verify (the split verify takes at most {MAX_TREE_NODES})"
    needed = segments_for(backend.max_context_len)
    if backend.max_kv_splits < needed:
        return (f"SGLang's decode scratch holds {backend.max_kv_splits} splits, the context needs {needed} segments "
                f"of {SEGMENT_KEYS} keys (SGLANG_TRITON_DECODE_SPLIT_TILE_SIZE above {SEGMENT_KEYS}?)")
    try:  # hybrid pools refuse layers that are not full attention
        k_buf, _ = _first_layer_buffers(backend)
        shape = _layer_shape(backend)
    except Exception as exc:
        return f"the KV cache's first layer is not readable as full attention ({exc!r})"
    if k_buf.ndim != 3:
        return f"a {k_buf.ndim}-D KV buffer"
    reason = split_shape_problem(*shape)
    if reason:
        return reason
    device = backend.kv_indptr.device
    if device.type != "cuda" or torch.version.hip is not None:
        return "no CUDA device" if device.type != "cuda" else "a ROCm GPU (not measured; other tiles and compiler)"
    key = (shape, str(device))
    if key not in _CHECKED:
        try:
            _CHECKED[key] = (None if split_modes_agree(*shape, device)
                             else "its start-up check found decode and prefill rows apart on this GPU")
        except Exception as exc:  # any surprise keeps the proven path
            _CHECKED[key] = f"its start-up check failed: {exc!r}"
    return _CHECKED[key]


# The start-up check's answer per (layer shape, device) in this process: one arithmetic for all its backends.
_CHECKED: dict[tuple, str | None] = {}


def _first_layer_buffers(backend):
    """The KV cache's key and value buffers of the backend's first layer (its shapes stand for the model's)."""
    pool = backend.token_to_kv_pool
    layer = getattr(pool, "start_layer", 0) or 0
    return pool.get_key_buffer(layer), pool.get_value_buffer(layer)


def _layer_shape(backend) -> tuple:
    """``(heads, kv_heads, head_dim, v_head_dim, kv dtype)`` of the first layer, as ``packed_shape`` lays it out."""
    k_buf, v_buf = _first_layer_buffers(backend)
    return backend.num_head, backend.num_kv_head, k_buf.shape[-1], v_buf.shape[-1], k_buf.dtype


def _split_paths(backend, one_pass, unified):
    """``(decode, extend)`` functions for the backend: the positional-split kernels, or the proven ones per call.

    A call the kernels do not cover (a logit cap, sinks, a score modifier,
    Grok's temperature, KV scales, pages above one token, another layer
    shape than the checked first one; for extends also a window, a
    non-causal call, or a tree of more than ``MAX_TREE_NODES`` draft tokens)
    goes to the one-pass decode and SGLang's single-pass extend, which agree
    with each other for causal calls: each layer meets one arithmetic in
    every mode. A verify (a call with SGLang's verify mask, chain or tree)
    runs each draft token over the prefix and its path
    (``split_tree_verify``), as its decode; one the kernels do not cover
    keeps SGLang's masked kernel: for a layer the kernels do not cover, a
    chain's still agrees with that layer's one-pass decode and a tree's with
    no decode (on a tree server, the backend's ``topk`` above 1, the first
    such call logs that its tree logits are ``tokens``); any other uncovered
    verify call meets a split decode, and the first logs that the server's
    verify logits are ``tokens``.
    """
    checked = _layer_shape(backend)
    trees = (getattr(backend, "topk", 0) or 0) > 1  # SGLang sets it from the published draft top-k
    warned = []  # one warning per backend for a tree verify the kernels do not cover

    def covered(q, k_buffer, v_buffer, k_scale, v_scale, logit_cap, sinks, xai_temperature_len, page_size,
                score_mod):
        return (sinks is None and score_mod is None and not logit_cap and xai_temperature_len <= 0
                and k_scale == 1.0 and v_scale == 1.0 and page_size == 1
                and packed_shape(q, k_buffer, v_buffer) == checked)

    @torch.compiler.disable
    def decode(q, k_buffer, v_buffer, o, kv_indptr, kv_indices, attn_logits, attn_lse, num_kv_splits,
               max_kv_splits, sm_scale, k_scale, v_scale, logit_cap=0.0, sinks=None, xai_temperature_len=-1,
               *args, page_size=1, score_mod=None, aux_tensors=None, **kwargs):
        if attn_logits is not None and covered(q, k_buffer, v_buffer, k_scale, v_scale, logit_cap, sinks,
                                               xai_temperature_len, page_size, score_mod):
            return split_decode(q, o, k_buffer, v_buffer, kv_indptr, kv_indices, attn_logits, attn_lse, sm_scale)
        return one_pass(q, k_buffer, v_buffer, o, kv_indptr, kv_indices, attn_logits, attn_lse, num_kv_splits,
                        max_kv_splits, sm_scale, k_scale, v_scale, logit_cap, sinks, xai_temperature_len, *args,
                        page_size=page_size, score_mod=score_mod, aux_tensors=aux_tensors, **kwargs)

    @torch.compiler.disable
    def extend(q, o, k_buffer, v_buffer, k_scale, v_scale, qo_indptr, kv_indptr, kv_indices, prefix_lens,
               max_len_extend, custom_mask=None, mask_indptr=None, sm_scale=None, logit_cap=0.0, is_causal=True,
               sliding_window_size=-1, sinks=None, window_start_pos=None, xai_temperature_len=-1, page_size=1,
               score_mod=None, aux_tensors=None):
        rows = int(max_len_extend)
        layer = covered(q, k_buffer, v_buffer, k_scale, v_scale, logit_cap, sinks, xai_temperature_len, page_size,
                        score_mod)
        if is_causal and (sliding_window_size or -1) <= 0 and rows >= 1 and layer:
            scale = sm_scale if sm_scale is not None else q.shape[-1] ** -0.5
            if custom_mask is None:
                return split_extend(q, o, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices, prefix_lens, rows,
                                    scale)
            # A verify: each draft token over the prefix and the draft tokens its mask row marks, in its
            # decode's order (a chain's mask is causal, so it gets its prefill rows' bits as well).
            if mask_indptr is not None and rows <= MAX_TREE_NODES:
                return split_tree_verify(q, o, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices, prefix_lens,
                                         custom_mask, mask_indptr, rows, scale)
        # A layer the kernels do not cover decodes on the one-pass kernel, which a chain's masked verify on
        # SGLang's kernel still matches (a tree's does not); any other masked call meets a split decode.
        if custom_mask is not None and (trees or layer) and not warned:
            warned.append(True)
            logger.warning("sglang-detspec: a verify the split kernels do not cover (%s) runs SGLang's masked "
                           "kernel: this server's %slogits are 'tokens', not 'bitwise'",
                           "a logit cap, sinks, KV scales or another layer shape" if not layer else
                           "a window, a non-causal call, no mask offsets or too many draft tokens",
                           "tree " if not layer else "verify ")
        return unified(q, o, k_buffer, v_buffer, k_scale, v_scale, qo_indptr, kv_indptr, kv_indices, prefix_lens,
                       max_len_extend, custom_mask=custom_mask, mask_indptr=mask_indptr, sm_scale=sm_scale,
                       logit_cap=logit_cap, is_causal=is_causal, sliding_window_size=sliding_window_size,
                       sinks=sinks, window_start_pos=window_start_pos, xai_temperature_len=xai_temperature_len,
                       page_size=page_size, score_mod=score_mod, aux_tensors=aux_tensors)

    return decode, extend


def _packed_kernel(backend, unified):
    """``(kernel, blocks, shape)`` for ``sglang_plugin.decode_attention.decode_packed`` on this backend, or None.

    Only where ``packable`` holds (Hopper with SGLang's 128-row tile for the
    model's head dims, or head dims with a rope part such as absorbed MLA's on
    any CUDA GPU; not ROCm) with a bf16 / fp16 KV cache, and only after ``packed_matches`` found
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

        k_buf, v_buf = _first_layer_buffers(backend)
        if k_buf.dtype not in (torch.bfloat16, torch.float16) or k_buf.ndim != 3:
            return None
        dim, v_dim = k_buf.shape[-1], v_buf.shape[-1]
        blocks = ext._get_block_sizes_for_extend_attention(dim, v_dim)
        if not packable(blocks, torch.cuda.get_device_capability(device), hip=torch.version.hip is not None):
            return None
        kernel = ext._fwd_kernel_unified
        # The cache's head count, not the backend's: an absorbed MLA cache holds one latent head, whatever the
        # config's num_key_value_heads (which SGLang's num_kv_head follows) says.
        kv_heads = k_buf.shape[-2]
        if packed_matches(unified, kernel, blocks, backend.num_head, kv_heads, dim, v_dim, k_buf.dtype, device,
                          page_size=getattr(backend, "page_size", 1) or 1):
            return kernel, blocks, (backend.num_head, kv_heads, dim, v_dim, k_buf.dtype)
        logger.warning("sglang-detspec: the packed decode tile did not reproduce the one-row-per-head rows bit for bit "
                       "on this GPU; the target decode keeps one query row per head (slower with many requests and long "
                       "contexts: %s)", "docs/benchmarks/mla_decode/2026-12-07-h100/" if blocks[1] else
                       "docs/benchmarks/attention_paths/2026-12-02-h200/")
    except Exception as exc:  # any surprise keeps the proven path
        logger.warning("sglang-detspec: packed decode tile not used (%r)", exc)
    return None
