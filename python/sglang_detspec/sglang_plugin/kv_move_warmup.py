"""Start-up: SGLang's KV move of accepted tree paths compiled before the server takes requests.

After a tree verify (EAGLE / EAGLE3 / NEXTN with top-k > 1) and after every
NGRAM verify, SGLang 0.5.23 moves each request's accepted tokens' KV slots to
the front of its block (``spec_utils.move_accept_tokens_to_target_kvcache``
-> the KV pool's ``move_kv_cache``), an eager launch of its Triton kernel
``copy_all_layer_kv_cache_tiled`` over ``N = batch size x accept width``
slots. The kernel takes ``next_power_of_2(N)`` as a compile-time constant
(moves longer than the pool's bound, 128 or 256 slots, go in chunks of it),
and Triton specialises the count itself (1, a multiple of 16, any other), so
a tree server compiles a new variant the first time its batch reaches a new
power of two: on one H200 at the 8B shape the two 256-slot variants took
4.2-4.5 s each, inside the first wave of 128 requests (SGLang's warning
"took ... s to compile after serving started";
docs/benchmarks/determinism_tax/2026-12-06-h200-ade-c1-c128/; the smaller
variants compile in under a second each). SGLang's own start-up warm-up
compiles one variant, a single slot under the bound's constant, which no
serving move launches. Not warmed: the page-size > 1 tree's copy of each
prefix's last page into its branches (another count), and pools that wrap
others (sliding-window and hybrid-linear pools, whose inner pools hold the
copy: :func:`copy_bound` finds none on the wrapper).
"""

from __future__ import annotations

import torch


def moves_accepted_kv(bag) -> bool:
    """Whether SGLang moves each verify's accepted KV slots for a server with bag ``bag`` (a ``DetSpecConfig``).

    A tree (or NGRAM) verify outside multi-layer EAGLE:
    ``eagle_worker_common.run_eagle_verify``'s ``finalize_tree_path`` (off in
    the multi-layer worker) with top-k above 1; ``ngram_worker`` moves after
    every verify.
    """
    return bag.verifies_trees and not bag.multi_layer_eagle


def count_variant(n: int) -> str:
    """How Triton specialises an integer argument of value ``n`` >= 1: ``"one"``, else its backend's mark.

    Triton's launcher makes the value 1 a constant (in its native
    ``specialize_impl``) and asks the backend for the rest
    (``BaseBackend.get_int_specialization``: ``"D"`` for a multiple of 16,
    ``""`` otherwise; the CUDA backend keeps the base rule).
    """
    from triton.backends.compiler import BaseBackend

    return "one" if n == 1 else BaseBackend.get_int_specialization(n, align=True)


def move_segments(n: int, bound: int) -> list[int]:
    """The slot counts of SGLang's launches for one move of ``n`` >= 1 slots with chunk ``bound``.

    ``MHATokenToKVPool._move_kv_cache_impl``: one launch up to ``bound``,
    else full chunks of ``bound`` and the remainder.
    """
    if n <= bound:
        return [n]
    return [bound] * (n // bound) + ([n % bound] if n % bound else [])


def move_lengths(accept_width: int, max_batch: int, bound: int) -> list[int]:
    """One move length per kernel variant a server can launch, the least of each, ascending.

    Args:
        accept_width: slots moved per request (SGLang's ``accept_index``
            columns: ``num_steps + 1`` for EAGLE, the draft token count
            for NGRAM), >= 1.
        max_batch: the largest verify batch, >= 1 (the scheduler's
            ``max_running_requests``, or a switching tree's bound).
        bound: the pool's chunk bound (its ``_kv_copy_config
            ["num_locs_upper"]``), a power of two >= 1.

    Returns:
        lengths, each <= ``bound``: a move of each runs one launch, and
        together they compile every (``next_power_of_2``, :func:`count_variant`)
        pair that moves of ``accept_width x b`` slots, b = 1 .. ``max_batch``,
        launch. Batches past ``2 x bound`` add no pair (the remainder of
        ``accept_width x b`` modulo ``bound`` repeats with a period dividing
        ``bound``), so at most ``2 x bound`` batch sizes are enumerated.

    Raises:
        ValueError: an argument below its bound, or ``bound`` not a power of two.
    """
    from sglang.srt.utils import next_power_of_2

    for name, value in (("accept_width", accept_width), ("max_batch", max_batch), ("bound", bound)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if bound & (bound - 1):
        raise ValueError(f"bound must be a power of two, got {bound}")
    least: dict[tuple[int, str], int] = {}
    for b in range(1, min(max_batch, 2 * bound) + 1):
        for s in set(move_segments(accept_width * b, bound)):
            key = (next_power_of_2(s), count_variant(s))
            least[key] = min(s, least.get(key, s))
    return sorted(least.values())


def copy_bound(kvcache) -> int | None:
    """The chunk bound of ``kvcache``'s tiled copy, or None where its moves do not launch that kernel.

    None for pools without the tiled copy's configuration (SGLang builds
    it for its MHA pool on CUDA), with ``SGLANG_NATIVE_MOVE_KV_CACHE`` (a
    torch index copy) or with the HND layout (a gather).
    """
    config = getattr(kvcache, "_kv_copy_config", None)
    if (not isinstance(config, dict) or "num_locs_upper" not in config
            or getattr(kvcache, "use_native_move_kv_cache", False) or getattr(kvcache, "use_hnd", False)):
        return None
    return int(config["num_locs_upper"])


def warm_kv_move(kvcache, accept_width: int, max_batch: int, device: torch.device) -> int:
    """Every variant of ``kvcache``'s KV move compiled by one move per :func:`move_lengths`; returns the moves.

    Each move copies slot 0 onto itself in every layer (SGLang's padding
    slot, which no request owns; SGLang's own warm-up does the same) through
    the pool's ``move_kv_cache``, the call serving makes, with int64 location
    tensors of shape [n] on ``device`` as serving passes them, then waits
    for the device (on CUDA) so a fault shows here. 0 where
    :func:`copy_bound` finds no tiled copy.

    Args:
        kvcache: SGLang's KV pool (``token_to_kv_pool_allocator.get_kvcache()``).
        accept_width, max_batch: as for :func:`move_lengths`.
        device: the pool's device.

    Raises:
        ValueError: from :func:`move_lengths`; whatever SGLang's move raises.
    """
    bound = copy_bound(kvcache)
    if bound is None:
        return 0
    lengths = move_lengths(accept_width, max_batch, bound)
    for n in lengths:
        loc = torch.zeros(n, dtype=torch.int64, device=device)
        kvcache.move_kv_cache(loc, loc)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return len(lengths)
