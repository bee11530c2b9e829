"""FA3 attention under the prefix / tail split in every forward mode of the target (the default but for FA3 trees
at head sizes 65-128, whose default is the node path: ``config.FA3_TREE_DEFAULTS``).

``SGLANG_DETSPEC_DECODE_ATTENTION=split`` (the bag's ``decode_attention``, its
default; ``sglang`` or ``one_pass`` keep SGLang's calls) on an FA3 server: the target's prefill, chunked prefill, extend after a
radix-cache hit, decode, chain verify and tree verify all compute each query
row as two FA3 calls over keys ``[0, S(L))`` and ``[S(L), L)``, merged by
log-sum-exp (``sglang_plugin/fa3_split.py``, ``ops/prefix_split.py``).

Why: SGLang's FA3 verifies a tree by cascade attention (prefix and draft
parts merged from two bf16 outputs), which rounds apart from the decode of
the same token; the node path (``SGLANG_DETSPEC_TREE_ATTENTION=nodes``)
fixes that by reading each node's whole prefix on its own (+17% to +36% per
step at 2,048-token prompts). Under the split a row's two key ranges depend
on its own length alone, so every mode gives it the same bits, and a tree's
nodes share their prefix reads (one prefix call per request and split key).
The tail call always runs FA3's causal kernel, so decode and prefill share
it at every head size, which SGLang's own one-row decode call does not at
head sizes up to 64 and above 128.

A server that verifies no trees (a chain, or no speculative decoding) at a
target head size of 65-128 keeps SGLang's own calls: FA3 runs all its modes
on one causal kernel there, so the split would only add cost
(:func:`own_calls_serve`, ``sglang_plugin/fa3_own_calls.py``; its start-up
check of SGLang's calls decides on each GPU).

Hooked symbols (``sglang.srt.layers.attention.flashattention_backend.FlashAttentionBackend``):

- ``__init__`` (AFTER): whether this backend takes the split (:func:`own_calls_serve`
  first, then :func:`split_unavailable`, each with its start-up check), logged once; where it
  cannot, the bag drops to SGLang's calls and the start-up line says which claim that leaves.
- ``init_forward_metadata``, ``init_forward_metadata_out_graph`` and
  ``init_forward_metadata_in_graph`` (AFTER): forget the previous forward's
  split layout. The first layer of a forward builds it from SGLang's metadata
  (static shapes, no host sync) and the others reuse it; a layout built
  outside a CUDA-graph capture is never reused inside one, so the captured
  graph holds the layout's kernels and every replay rebuilds it from the
  refilled metadata. Not covered: SGLang's opt-in metadata glue graph
  (``SGLANG_ENABLE_METADATA_GLUE_GRAPH``), whose replays run none of these
  hooks.
- ``forward_extend`` and ``forward_decode`` (AROUND): a covered call writes
  the layer's K/V as SGLang does and returns the split attention; any other
  call is SGLang's.

Covered: the target model (not the draft's backends), FA3 with page size 1,
a bf16 / fp16 KV cache, no MLA, sliding-window or local attention, context
parallelism or KV-skipping; per call, a causal self-attention layer without
sinks, score modifiers, relative bias, a returned LSE or MLA inputs, in
decode, extend (not a draft extend) or target verify (chain or tree; trees
of up to ``PREFIX_SPLIT_MAX_TREE_TOKENS`` draft tokens). A layer it does not
cover keeps SGLang's call and the first such call logs that the server's
logits are ``tokens``. Measured on the H200 (kernels:
``test/registered/cuda/test_fa3_split_cuda.py``; servers, SGLang's harness
included: ``docs/e2e/2026-12-05-h200-split/``); each server's start-up check
decides; the cost is in ``docs/forward_modes.md``.
"""

from __future__ import annotations

import dataclasses
import logging

import torch

from ..config import current_config, fa3_own_calls_exact, fa3_split_takes, install_config
from ..ops.prefix_split import decode_split, extend_split, tree_split
from ..ops.split_limits import FA3_MAX_HEAD_DIM, PREFIX_SPLIT_DEPTH, PREFIX_SPLIT_MAX_TREE_TOKENS
from .channels import FA3_OWN_CALLS, FA3_SPLIT, FA3_SPLIT_OK, FA3_SPLIT_WARNED
from .fa3_own_calls import sglang_calls_agree
from .fa3_split import FA_BACKEND as FA
from .fa3_split import backend_problem, split_attention, split_modes_agree

INIT = f"{FA}.__init__"
INIT_EAGER = f"{FA}.init_forward_metadata"
INIT_OUT_GRAPH = f"{FA}.init_forward_metadata_out_graph"
INIT_IN_GRAPH = f"{FA}.init_forward_metadata_in_graph"
FORWARD_EXTEND = f"{FA}.forward_extend"
FORWARD_DECODE = f"{FA}.forward_decode"

logger = logging.getLogger("sglang_detspec")
# Start-up lines (the E2E suites read them from a server's log).
SPLIT_ON = "FA3 attention runs the prefix / tail split in every forward mode"
SPLIT_OFF = "SGLANG_DETSPEC_DECODE_ATTENTION=split not used on FA3"
STANDS_DOWN = "the FA3 split stands down: SGLang's own FA3 calls give this target decode = prefill = verify"
OWN_CALLS_APART = "the start-up check found SGLang's own FA3 calls rounding decode, prefill or verify rows apart"
KV_DTYPES = (torch.bfloat16, torch.float16)
# Layer types SGLang's FA3 extend runs without the causal mask (its own rule in forward_extend).
NON_CAUSAL_TYPES = ("ENCODER_ONLY", "DECODER_BIDIRECTIONAL")

# The start-up check's answer per (shape, device) in this process: one arithmetic for all its backends.
_CHECKED: dict[tuple, str | None] = {}
# ... and the check of SGLang's own calls (fa3_own_calls.sglang_calls_agree) per (shape, device).
_OWN_CHECKED: dict[tuple, bool] = {}


def _shape_key(backend) -> tuple:
    shape = (backend.num_attention_heads, backend.num_kv_heads, backend.head_dim, backend.kv_cache_dtype)
    return shape, str(torch.device(backend.device))


def _on_cuda(backend) -> bool:
    return torch.device(backend.device).type == "cuda" and torch.version.hip is None


def own_calls_serve(bag, backend) -> bool:
    """Whether this target backend keeps SGLang's FA3 calls because they are already one arithmetic here.

    Where ``config.fa3_own_calls_exact`` holds for the server (no trees, a
    head size of 65-128), the backend is one the split could serve, and the
    check of SGLang's calls (``fa3_own_calls.sglang_calls_agree``, once per
    process, shape and device) finds decode, prefill, chunks and chain verify
    equal bit for bit on this GPU. The decision follows the server's settings
    and shape, so every target backend of a server (a switching tree's second
    state included) makes the same one.
    """
    if not fa3_own_calls_exact(backend.head_dim, bag.verifies_trees):
        return False
    if backend_problem(backend) or backend.kv_cache_dtype not in KV_DTYPES or not _on_cuda(backend):
        return False
    key = _shape_key(backend)
    if key not in _OWN_CHECKED:
        try:
            _OWN_CHECKED[key] = sglang_calls_agree(*key[0], torch.device(backend.device))
            if not _OWN_CHECKED[key]:
                logger.warning("sglang-detspec: %s at head size %d on this GPU; the split serves", OWN_CALLS_APART,
                               backend.head_dim)
        except Exception as exc:  # any surprise: the split, checked on its own, decides
            logger.warning("sglang-detspec: the start-up check of SGLang's FA3 calls failed (%r); the split serves",
                           exc)
            _OWN_CHECKED[key] = False
    return _OWN_CHECKED[key]


def split_unavailable(backend) -> str | None:
    """Why the split cannot serve this FA3 target backend, or None where it can (its start-up check included).

    The check (``fa3_split.split_modes_agree``) runs once per process, shape and device.
    """
    reason = backend_problem(backend)
    if reason:
        return reason
    if backend.kv_cache_dtype not in KV_DTYPES:
        return f"a {backend.kv_cache_dtype} KV cache"
    tokens = backend.speculative_num_draft_tokens or 0
    if not fa3_split_takes(backend.topk, tokens):
        # Depth is bounded by the token count for every drafter (NGRAM's trie depth is its own setting).
        return (f"trees of {tokens} draft tokens (the split covers trees of up to {PREFIX_SPLIT_MAX_TREE_TOKENS}, "
                f"{PREFIX_SPLIT_DEPTH} deep)")
    if not 1 <= backend.head_dim <= FA3_MAX_HEAD_DIM:
        return f"head size {backend.head_dim}"
    device = torch.device(backend.device)
    if not _on_cuda(backend):
        return "no CUDA device" if device.type != "cuda" else "a ROCm GPU"
    key = _shape_key(backend)
    if key not in _CHECKED:
        try:
            _CHECKED[key] = (None if split_modes_agree(*key[0], device)
                             else "its start-up check found decode, prefill or tree rows apart on this GPU")
        except Exception as exc:  # any surprise keeps SGLang's calls
            _CHECKED[key] = f"its start-up check failed: {exc!r}"
    return _CHECKED[key]


def check_backend(result, backend, *args, **kwargs):
    """AFTER hook of ``FlashAttentionBackend.__init__``: decide once whether this target backend takes the split.

    Where SGLang's own calls are already one arithmetic for the server
    (:func:`own_calls_serve`: no trees, head size 65-128, checked at start-up)
    the split stands down and the claim stays. Where the bag asks for the
    split on an FA3 target and it cannot serve, the bag drops
    ``decode_attention`` to ``one_pass`` (SGLang's calls), so the claim the
    server states is the one that runs, and the warning says which claim
    that is. Returns None.
    """
    FA3_SPLIT_OK.write(backend, False)
    FA3_OWN_CALLS.write(backend, False)
    FA3_SPLIT.write(backend, None)
    bag = current_config()
    if not (bag.active and bag.decode_attention == "split") or backend.is_draft_runner:
        return None
    if own_calls_serve(bag, backend):
        FA3_OWN_CALLS.write(backend, True)
        logger.info("sglang-detspec: %s at head size %d for a server that verifies no trees (checked bitwise at "
                    "start-up); its logits stay %r", STANDS_DOWN, backend.head_dim, bag.logits)
        return None
    reason = split_unavailable(backend)
    if reason is None:
        FA3_SPLIT_OK.write(backend, True)
        logger.info("sglang-detspec: %s (head size %d; decode = prefill = verify checked bitwise at start-up)",
                    SPLIT_ON, backend.head_dim)
        return None
    kept = dataclasses.replace(bag, decode_attention="one_pass")
    install_config(kept)
    logger.warning("sglang-detspec: %s (%s): the target keeps SGLang's FA3 calls%s", SPLIT_OFF, reason,
                   "" if kept.logits == bag.logits else
                   f": this server's logits are {kept.logits!r}, not {bag.logits!r}")
    return None


def forget_split(result, backend, *args, **kwargs):
    """AFTER hook of the metadata builders: the next forward builds its own layout. Returns None."""
    FA3_SPLIT.write(backend, None)
    return None


def _decided(backend, slot) -> bool:
    """The start-up decision ``slot`` (FA3_SPLIT_OK or FA3_OWN_CALLS) holds under the bag in force."""
    bag = current_config()
    return bag.active and bag.decode_attention == "split" and slot.read(backend, False)


def _serves(backend) -> bool:
    return _decided(backend, FA3_SPLIT_OK)


def _layer_covered(layer, kwargs) -> bool:
    sliding = getattr(layer, "sliding_window_size", None)
    if (sliding is not None and sliding > -1) or layer.is_cross_attention:
        return False
    if layer.v_head_dim != layer.head_dim or getattr(getattr(layer, "attn_type", None), "name", "") in NON_CAUSAL_TYPES:
        return False
    names = ("q_rope", "k_rope", "sinks", "score_mod", "rel_bias", "q_descale", "k_descale", "v_descale")
    return not any(kwargs.get(name) is not None for name in names) and not kwargs.get("return_lse")


def _capturing(q) -> bool:
    return q.is_cuda and torch.cuda.is_current_stream_capturing()


def _layout(backend, forward_batch, rows: int, capturing: bool = False):
    """The forward's :class:`ops.prefix_split.PrefixSplit`, built at its first layer, or None for an uncovered mode.

    A layout built outside a CUDA-graph capture is not reused inside one (nor the other way round): some
    runners (SGLang's full prefill graphs) run warm-up forwards and the capture after one metadata call,
    and the captured graph must hold the kernels that rebuild it from the refilled metadata.
    """
    kept = FA3_SPLIT.read(backend)
    if kept is not None and kept[0] is not None and kept[1] == capturing:
        return kept[0]
    split = None
    md, mode = backend.forward_metadata, forward_batch.forward_mode
    if mode.is_target_verify():
        n = backend.speculative_num_draft_tokens
        if backend.topk > 1:
            expand = backend.forward_metadata_spec_decode_expand
            split = tree_split(md.page_table, md.cache_seqlens_int32, expand.page_table,
                               expand.cache_seqlens_int32, n)
        else:
            split = _extend_layout(md, rows)
    elif mode.is_decode() and forward_batch.spec_info is None:
        split = decode_split(md.page_table, md.cache_seqlens_int32)
    elif mode.is_extend() and not (mode.is_split_prefill() or mode.is_dllm_extend()):
        split = _extend_layout(md, rows)
    FA3_SPLIT.write(backend, (split, capturing))
    return split


def _extend_layout(md, rows: int):
    extend_lens = md.cu_seqlens_q[1:] - md.cu_seqlens_q[:-1]
    # A host int in SGLang's eager and verify metadata; otherwise the query's row count bounds every request.
    bound = md.max_seq_len_q if isinstance(md.max_seq_len_q, int) and md.max_seq_len_q >= 1 else max(rows, 1)
    return extend_split(md.page_table, md.cache_seqlens_int32 - extend_lens, extend_lens, bound, rows)


def _save_kv(backend, layer, forward_batch, k, v, save_kv_cache):
    """Write the call's K/V as SGLang's FA3 backend does for a covered call (no MLA, no mxfp8, no CP)."""
    if k is None or not save_kv_cache:
        return
    from sglang.srt.mem_cache.memory_pool import KVWriteLoc

    loc = KVWriteLoc.for_layer(forward_batch, layer, swa_loc=backend.forward_metadata.swa_out_cache_loc)
    backend.token_to_kv_pool.set_kv_buffer(layer, loc, k, v, layer.k_scale, layer.v_scale)


@torch.compiler.disable  # as SGLang keeps attention out of traced graphs
def _split_forward(backend, q, k, v, layer, forward_batch, save_kv_cache):
    rows = q.shape[0]
    split = _layout(backend, forward_batch, rows, _capturing(q))
    if split is None:
        return None
    _save_kv(backend, layer, forward_batch, k, v, save_kv_cache)
    key_cache, value_cache = backend.get_paged_mha_kv_cache(layer)
    out = getattr(forward_batch, "_attn_output", None)
    out = out.view(-1, layer.tp_q_head_num, layer.v_head_dim) if out is not None else None
    o = split_attention(q.contiguous().view(-1, layer.tp_q_head_num, layer.head_dim), key_cache, value_cache, split,
                        layer.scaling, softcap=layer.logit_cap or 0.0, out=out)
    return o.view(-1, layer.tp_q_head_num * layer.v_head_dim)


def _run(original, backend, q, k, v, layer, forward_batch, save_kv_cache, args, kwargs):
    if _serves(backend):
        if not args and _layer_covered(layer, kwargs):
            o = _split_forward(backend, q, k, v, layer, forward_batch, save_kv_cache)
            if o is not None:
                return o
        elif not FA3_SPLIT_WARNED.read(backend, False):
            # That layer rounds as SGLang's calls do in each mode, which are not one arithmetic.
            FA3_SPLIT_WARNED.write(backend, True)
            logger.warning("sglang-detspec: a layer the FA3 split does not cover (a window, a non-causal or cross "
                           "attention layer, sinks, a score modifier, MLA inputs, a returned LSE or another value "
                           "head size) runs SGLang's FA3 call: this server's logits are 'tokens', not 'bitwise'")
    elif (not FA3_SPLIT_WARNED.read(backend, False) and _decided(backend, FA3_OWN_CALLS)
          and (args or getattr(layer, "logit_cap", 0) or not _layer_covered(layer, kwargs))):
        # The start-up check ran SGLang's plain causal calls: such a layer takes another FA3 variant, unchecked.
        FA3_SPLIT_WARNED.write(backend, True)
        logger.warning("sglang-detspec: a layer the start-up check of SGLang's FA3 calls did not cover (a window, a "
                       "logit cap, a non-causal or cross attention layer, sinks, a score modifier, MLA inputs, a "
                       "returned LSE or another value head size) runs with the split stood down: this server's "
                       "logits are 'tokens', not 'bitwise'")
    return original(backend, q, k, v, layer, forward_batch, save_kv_cache, *args, **kwargs)


def split_extend_around(original, backend, q, k, v, layer, forward_batch, save_kv_cache=True, *args, **kwargs):
    """AROUND hook of ``forward_extend``: a covered call runs the split (module docstring); others SGLang's.

    The first call a serving backend leaves to SGLang logs that the server's logits are ``tokens``.
    Returns ``[tokens, heads * v_head_dim]`` as SGLang's does.
    """
    return _run(original, backend, q, k, v, layer, forward_batch, save_kv_cache, args, kwargs)


def split_decode_around(original, backend, q, k, v, layer, forward_batch, save_kv_cache=True, *args, **kwargs):
    """AROUND hook of ``forward_decode``: as :func:`split_extend_around`, for a decode step."""
    return _run(original, backend, q, k, v, layer, forward_batch, save_kv_cache, args, kwargs)
