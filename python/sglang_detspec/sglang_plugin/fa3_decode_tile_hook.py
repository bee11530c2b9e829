"""FA3 decode over the prefill's key tiles at head sizes up to 64, so decode = verify = prefill bit for bit.

Why: FA3 on Hopper sums a query row's keys block by block, and the block
width comes from its tile table (``tile_size_fwd_sm90``): at head sizes up to
64 a causal or local call gets 128-key blocks, any other call 192-key ones.
A decode step is a causal call with one query row, and FA3 drops the causal
flag of such a call (its mask is empty) for head sizes up to 64 unless a
window or an attention chunk is set; the call then runs with 192-key blocks
while a prefill, a chunked prefill and a chain verify of the same row run
causal with 128-key blocks. The online softmax rescales once per block, so
from key 128 on a decode row rounds apart from the same row in a prefill:
on the H200, 964 of 1,100 rows at head size 64, none at head size 128
(``docs/benchmarks/fa3_chunk_probe/2026-12-04-h200/``). Between 65 and 128
FA3 keeps the causal flag for paged KV; above 128 its blocks do not depend on
the flag.

What: a decode-shaped FA3 call at head size <= 64 gets an attention chunk
longer than any sequence (:data:`WHOLE_SEQUENCE_CHUNK`). FA3 then keeps the
call masked ("local"), which takes the 128-key blocks, and the chunk's mask
hides no key (every key of a row lies in its first chunk). Its precomputed
scheduler metadata is dropped for that call: SGLang computes it for the
unmasked call, with the other block width, and FA3 derives its own when
none is given.

Hooked symbol: ``sglang.srt.layers.attention.flashattention_backend.flash_attn_with_kvcache``
(AROUND; SGLang's registry also rebinds the modules that imported the same
function), and ``FlashAttentionBackend.__init__`` (AFTER) for the start-up
line. Applies in the plugin's active runs only. The registry's rebinding
also reaches the other callers of the same function (the local-attention
decode call, MiniCPM's sparse adapter, the draft's decode, extends of one
token per request): each such one-row causal call at head size <= 64 gets
the same chunk, which masks no key there either. Every other call is
SGLang's as made. FA3's tile table is Hopper's (sm90); sgl-kernel's FA3 on
other GPUs picks tiles elsewhere, not measured.
"""

from __future__ import annotations

import logging

from ..config import FA3_RETILED_MAX_HEAD_DIM, current_config

FA_MODULE = "sglang.srt.layers.attention.flashattention_backend"
TARGET = f"{FA_MODULE}.flash_attn_with_kvcache"
INIT = f"{FA_MODULE}.FlashAttentionBackend.__init__"

# Longer than any sequence a KV cache holds (int32 positions): the chunk's mask hides no key.
WHOLE_SEQUENCE_CHUNK = 1 << 30
FA3 = 3

logger = logging.getLogger("sglang_detspec")
# Start-up line, once per FA3 backend it applies to.
RETILED_LOG = "sglang-detspec: FA3 decode runs over the prefill's 128-key blocks"


def retiled_kwargs(q, kwargs: dict) -> dict | None:
    """The keyword arguments that give a decode-shaped FA3 call the prefill's key blocks, or None to leave it.

    Args:
        q: the call's query tensor, ``[tokens, heads, head_dim]`` (only its last
            dimension is read).
        kwargs: the call's keyword arguments as SGLang passes them to
            ``flash_attn_with_kvcache``.

    A call is rewritten when it is FA3 (``ver`` 3), causal, with one query row
    per request (``max_seqlen_q`` 1), no window, no attention chunk, no
    ``qv`` (MLA's absorbed form) and a head size of at most
    ``config.FA3_RETILED_MAX_HEAD_DIM``. The rewrite adds ``attention_chunk`` =
    :data:`WHOLE_SEQUENCE_CHUNK` and sets ``scheduler_metadata`` to None
    (module docstring).

    Returns:
        a new dict (``kwargs`` is not changed), or None.
    """
    if kwargs.get("ver", FA3) != FA3 or kwargs.get("causal") is not True or kwargs.get("max_seqlen_q") != 1:
        return None
    if tuple(kwargs.get("window_size", (-1, -1))) != (-1, -1) or kwargs.get("attention_chunk"):
        return None
    if kwargs.get("qv") is not None or q is None or q.shape[-1] > FA3_RETILED_MAX_HEAD_DIM:
        return None
    return {**kwargs, "attention_chunk": WHOLE_SEQUENCE_CHUNK, "scheduler_metadata": None}


def decode_on_prefill_tiles(original, *args, **kwargs):
    """AROUND hook of the FA backend's ``flash_attn_with_kvcache``: :func:`retiled_kwargs` in the plugin's runs.

    Returns what SGLang's function returns.
    """
    if current_config().active:
        q = kwargs["q"] if "q" in kwargs else (args[0] if args else None)
        new = retiled_kwargs(q, kwargs)
        if new is not None:
            return original(*args, **new)
    return original(*args, **kwargs)


def log_retiling(result, backend, *args, **kwargs):
    """AFTER hook of ``FlashAttentionBackend.__init__``: say once per backend that its decode is re-tiled.

    Only where it applies: an active run, FA3, a head size of at most
    ``config.FA3_RETILED_MAX_HEAD_DIM``, no MLA. Returns None.
    """
    head_dim = getattr(backend, "head_dim", None)
    if not current_config().active or getattr(backend, "fa_impl_ver", None) != FA3 or backend.use_mla:
        return None
    if head_dim is None or head_dim > FA3_RETILED_MAX_HEAD_DIM:
        return None
    role = "draft" if backend.is_draft_runner else "target"
    logger.info("%s (%s model, head size %d: one-row calls run as a whole-sequence attention chunk, so "
                "decode rounds as prefill and verify do; the first server measurement of this path is pending, "
                "docs/forward_modes.md)", RETILED_LOG, role, head_dim)
    return None
