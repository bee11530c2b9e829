"""FA3 decode through the causal kernel its prefill uses, at head sizes up to 64: the aim, decode = verify = prefill.

Why: at head sizes up to 64 FA3 drops the causal flag of a call with one
query row (``max_seqlen_q`` 1, no window, no attention chunk; its mask is
empty there), so a decode step runs FA3's unmasked kernel, while a prefill,
a chunked prefill and a chain verify of the same row run the causal kernel
with 128-key blocks. From key 128 on a decode row then rounds apart from the
same row in a prefill: on the H200, 964 of 1,100 rows at head size 64, none
at head size 128
(``docs/benchmarks/fa3_chunk_probe/2026-12-04-h200/``). Between 65 and 128
FA3 keeps the causal flag for paged KV. A first rewrite (a whole-sequence
attention chunk, which makes the call "local") left the bits as they were
(``docs/benchmarks/fa3_chunk_probe/2026-12-04-h200-retiled/``): a local call
is another kernel than the causal one.

What: a decode-shaped FA3 call at head size <= 64 is passed
``max_seqlen_q`` = :data:`CAUSAL_MAX_SEQLEN_Q` (2). FA3 drops the causal flag
only when ``max_seqlen_q`` is 1, so the call stays on the causal kernel a
prefill runs. ``max_seqlen_q`` is an upper bound for the grid; each request's
own query count still comes from ``cu_seqlens_q`` (one row), so the causal
mask of a row at the end of its keys hides no key and no row is added. Its
precomputed scheduler metadata is dropped for that call: SGLang computes it
for the unmasked call; FA3 derives its own when none is given.

Hooked symbol: ``sglang.srt.layers.attention.flashattention_backend.flash_attn_with_kvcache``
(AROUND; SGLang's registry also rebinds the modules that imported the same
function), and ``FlashAttentionBackend.__init__`` (AFTER) for the start-up
line. Applies in the plugin's active runs only. Not yet measured on the GPU:
until it is, an FA3 server at these head sizes claims ``tokens``
(``config.guarantee_and_reason``). The registry's rebinding
also reaches the other callers of the same function (the local-attention
decode call, MiniCPM's sparse adapter, the draft's decode, extends of one
token per request): each such one-row causal call at head size <= 64 is
rewritten the same way, which changes no mask there either. Every other call
is SGLang's as made. The kernel split is Hopper's (sm90); sgl-kernel's FA3 on
other GPUs picks tiles elsewhere, not measured.
"""

from __future__ import annotations

import logging

from ..config import FA3_RETILED_MAX_HEAD_DIM, current_config

FA_MODULE = "sglang.srt.layers.attention.flashattention_backend"
TARGET = f"{FA_MODULE}.flash_attn_with_kvcache"
INIT = f"{FA_MODULE}.FlashAttentionBackend.__init__"

# FA3 unmasks a causal call only at max_seqlen_q == 1; 2 keeps the causal kernel (module docstring).
CAUSAL_MAX_SEQLEN_Q = 2
FA3 = 3

logger = logging.getLogger("sglang_detspec")
# Start-up line, once per FA3 backend it applies to.
RETILED_LOG = "sglang-detspec: FA3 decode keeps the causal flag (max_seqlen_q 2; not measured equal to a prefill)"


def retiled_kwargs(q, kwargs: dict) -> dict | None:
    """The keyword arguments that run a decode-shaped FA3 call on the prefill's causal kernel, or None to leave it.

    Args:
        q: the call's query tensor, ``[tokens, heads, head_dim]`` (only its last
            dimension is read).
        kwargs: the call's keyword arguments as SGLang passes them to
            ``flash_attn_with_kvcache``.

    A call is rewritten when it is FA3 (``ver`` 3), causal, with one query row
    per request (``max_seqlen_q`` 1), no window, no attention chunk, no
    ``qv`` (MLA's absorbed form) and a head size of at most
    ``config.FA3_RETILED_MAX_HEAD_DIM``. The rewrite sets ``max_seqlen_q`` to
    :data:`CAUSAL_MAX_SEQLEN_Q` and ``scheduler_metadata`` to None (module
    docstring); ``cu_seqlens_q`` still gives each request one row.

    Returns:
        a new dict (``kwargs`` is not changed), or None.
    """
    if kwargs.get("ver", FA3) != FA3 or kwargs.get("causal") is not True or kwargs.get("max_seqlen_q") != 1:
        return None
    if tuple(kwargs.get("window_size", (-1, -1))) != (-1, -1) or kwargs.get("attention_chunk"):
        return None
    if kwargs.get("qv") is not None or q is None or q.shape[-1] > FA3_RETILED_MAX_HEAD_DIM:
        return None
    if kwargs.get("cu_seqlens_q") is None:  # without it FA3 reads max_seqlen_q as every request's row count
        return None
    return {**kwargs, "max_seqlen_q": CAUSAL_MAX_SEQLEN_Q, "scheduler_metadata": None}


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
    """AFTER hook of ``FlashAttentionBackend.__init__``: say once per backend that its decode keeps the causal kernel.

    Only where it applies: an active run, FA3, a head size of at most
    ``config.FA3_RETILED_MAX_HEAD_DIM``, no MLA. Returns None.
    """
    head_dim = getattr(backend, "head_dim", None)
    if not current_config().active or getattr(backend, "fa_impl_ver", None) != FA3 or backend.use_mla:
        return None
    if head_dim is None or head_dim > FA3_RETILED_MAX_HEAD_DIM:
        return None
    role = "draft" if backend.is_draft_runner else "target"
    logger.info("%s (%s model, head size %d: one-row calls keep FA3's causal flag, so decode rounds as "
                "prefill and verify do; the first measurement of this path is pending, docs/forward_modes.md)",
                RETILED_LOG, role, head_dim)
    return None
