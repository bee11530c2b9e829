"""Where a switching tree does not switch, or a bound of it cannot decide: one rule for the server and the dry run.

The bounds are ``SGLANG_DETSPEC_TREE_CHAIN_BATCH`` and
``SGLANG_DETSPEC_TREE_CHAIN_TOKENS``. ``shape_hook`` applies the rules at
start-up (and logs the reason); ``detspec serve --dry-run`` states them from
the flags as typed.
"""

from __future__ import annotations

from ..config import TREE_CHAIN_BATCH_ENV, TREE_CHAIN_TOKENS_ENV, switch_settings


def not_applied_reason(server_args, max_running_requests: int | None, threshold: int,
                       tokens: int = 0) -> str | None:
    """Why a serving process keeps its tree although the bag asks for the switch; None when it switches.

    ``threshold``: the batch bound (requests, 0: none); ``tokens``: the
    summed-sequence-length bound (0: none). Under attention data
    parallelism every rank would pick its shape from its own batch while
    SGLang pads the ranks' gathers with the local rank's tokens per request;
    under pipeline parallelism only the last stage drafts, the others verify
    with the tree's backends. A batch bound at or above
    ``max_running_requests`` leaves the chain state nothing to run, unless a
    token bound gives it batches.
    """
    from sglang.srt.arg_groups.overrides import resolved_view

    parallel = parallel_reason(resolved_view(server_args))
    if parallel:
        return parallel
    if not tokens and max_running_requests is not None and threshold >= max_running_requests:
        return f"the bound {threshold} is not below --max-running-requests {max_running_requests}"
    return None


def idle_bound_note(threshold: int, tokens: int, max_running_requests: int | None,
                    pool_tokens: int | None) -> str | None:
    """Where the switch applies but one of its bounds can never decide: the sentence saying so, else None.

    With a token bound the switch applies whatever the batch bound, so a
    batch bound at or above ``max_running_requests`` leaves the token bound
    alone to act; a token bound at or above the KV pool (``pool_tokens``,
    None: not known) is passed only by requests that share cached prefixes
    (the summed length counts a shared prefix once per request, the pool
    once).
    """
    notes = []
    if tokens and threshold and max_running_requests is not None and threshold >= max_running_requests:
        notes.append(f"{TREE_CHAIN_BATCH_ENV}={threshold} is not below --max-running-requests "
                     f"{max_running_requests}: only the token bound acts")
    if tokens and pool_tokens is not None and tokens >= pool_tokens:
        notes.append(f"{TREE_CHAIN_TOKENS_ENV}={tokens} is not below the KV pool's {pool_tokens} tokens: only "
                     "batches whose requests share cached prefixes can pass it")
    return "; ".join(notes) or None


def not_applied_note(threshold: int, reason: str, tokens: int = 0) -> str:
    """The sentence the server logs, and the dry run prints, where the switch is not applied."""
    return f"{switch_settings(threshold, tokens)} not applied: {reason}; the tree drafts at every batch size"


def attention_dp(view) -> bool:
    """Whether ``view`` (SGLang's resolved view, or the flags as typed) runs attention data parallelism."""
    from sglang.srt.runtime_context import attn_dp_enabled_of

    # Flags as typed (the dry run) may still carry the deprecated spelling SGLang maps to attn_dp_size = dp_size.
    legacy_dp = getattr(view, "enable_dp_attention", False) and (getattr(view, "dp_size", 1) or 1) > 1
    return bool((hasattr(view, "attn_dp_size") and attn_dp_enabled_of(view)) or legacy_dp)


def parallel_reason(view) -> str | None:
    """The parallel layout that keeps a server's draft shape fixed, or None (:func:`not_applied_reason`'s first rules).

    ``view``: SGLang's resolved view of the server arguments, or the flags as
    typed (the dry run). Also what keeps the FA3 tree default off a server
    (``config.DetSpecConfig.takes_fa3_tree_defaults``): without its bounds it
    would be the node path at every batch size.
    """
    if attention_dp(view):
        return "attention data parallelism (each rank would pick its own shape)"
    if (getattr(view, "pp_size", 1) or 1) > 1:
        return "pipeline parallelism (only the last stage drafts)"
    return None
