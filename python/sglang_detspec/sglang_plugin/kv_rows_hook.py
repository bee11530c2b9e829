"""KV rows: the request-to-token row holds every slot a speculative decode step reserves.

Hooked symbol (AFTER): ``sglang.srt.mem_cache.allocation_sizing.get_req_to_token_extra_context_len``,
read once per scheduler process when SGLang sizes its request-to-token rows
(``kv_cache_configurator``): a row holds the context length plus this headroom.

Why: each EAGLE decode step reserves ``get_alloc_reserve_per_decode()`` slots
past a request's committed length (twice ``max(steps * topk, draft tokens)``,
a double buffer for the overlap scheduler). SGLang 0.5.23 widens the row to
that reserve only at page sizes above 1; at page size 1 the headroom stays
``4 + draft tokens``. A chain fits (reserve 8, headroom 8 for 3 steps), a tree
does not (3 steps, top-k 4, 8 draft tokens: reserve 24, headroom 12). A
request that decodes up to the context length then has its reserve run past
the end of its row: the allocator writes slot ids into the next row and frees
only what the row holds, and SGLang's idle pool check stops the server on the
slots it lost (``pool memory leak detected``; the request fuzzer's
``max_new_tokens: null`` case on a tree server, 2026-12-04). The hook makes the
headroom at least the reserve plus ``page_size - 1`` at every page size, the
bound SGLang itself uses above page size 1.
"""

from __future__ import annotations

from ..config import current_config

TARGET = "sglang.srt.mem_cache.allocation_sizing.get_req_to_token_extra_context_len"


def reserve_headroom() -> int:
    """Slots a row needs past the context length to hold one decode step's reserve (SGLang's own formula).

    Reads SGLang's published runtime context (``get_alloc_reserve_per_decode``,
    ``get_alloc_page_size``), as the hooked function does.
    """
    from sglang.srt.mem_cache.allocation_sizing import get_alloc_page_size, get_alloc_reserve_per_decode

    return get_alloc_reserve_per_decode() + get_alloc_page_size() - 1


def hold_decode_reserve(result: int, *args, **kwargs) -> int:
    """AFTER hook: the row headroom SGLang computed, raised to one decode step's reserve where it is smaller.

    Args:
        result: SGLang's headroom in tokens (int).

    Returns:
        ``max(result, reserve_headroom())`` on an active speculative server
        (:attr:`DetSpecConfig.active`); ``result`` unchanged otherwise.
    """
    bag = current_config()
    if not bag.active or bag.algorithm is None:
        return result
    return max(result, reserve_headroom())
