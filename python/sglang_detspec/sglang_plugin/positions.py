"""Where the token a hooked call decides sits, and how a hook publishes that to the sampler it calls.

Every TARGET-stream draw is keyed by the absolute position ``t`` of the
token it decides (docs/design.md). SGLang's call sites key their draws
differently; the rules that turn what a site has into ``t`` are written here
and nowhere else:

- target sampler (prefill's first token, plain decode): SGLang passes the
  position of the last input token, so ``t = positions + 1``;
- verify: the tree root (the last committed token) sits at ``seq_lens``, so
  the token after the root is at ``seq_lens + 1`` and the one after node i at
  ``seq_lens + 1 + depth(i)``;
- EAGLE v2 draft proposals: SGLang keys a drafted token with the position of
  the token before it, so ``t = key + 1`` (:func:`eagle_v2_positions`). The
  EAGLE draft model runs one position behind the token it reads, so in
  ``draft_forward`` step i the drafted token is at ``forward_batch.positions
  + 2``; draft extend after prefill drafts ``seq_lens + 1``, after verify
  ``new_seq_lens + 1``;
- multi-layer EAGLE, MTP layer s: after prefill ``t = key + 1 + s`` (key the
  prompt length); after verify ``t = seq_lens + accept_lens + 1 + s``; in
  the single-CUDA-graph runner the same from the graph's input buffers
  (``seq_lens - num_draft_tokens + num_accept_tokens + 1 + s``).

A hook that knows ``t`` publishes it for the duration of one SGLang call
on a channel of :mod:`.channels`, and the hook of the sampler that call reaches reads it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from .channels import DRAFT_RULE, DRAFT_SITE

# (key positions [B], draft_step) -> absolute positions [B] of the drafted tokens.
PositionRule = Callable[[torch.Tensor, int], torch.Tensor]


class DraftSite(NamedTuple):
    """A draft-worker call in progress whose top-k drafts the plugin draws (``topk_draft_hook``).

    Attributes:
        k: children per expanded node (``--speculative-eagle-topk``; 1 for a chain).
        positions: called when the choice is made; int [R], one per logits row.
        hot_token_id: int64 [V_draft], the target id of each draft column over
            a reduced draft vocabulary; None when draft columns are target ids.
        target_vocab: the target's vocabulary size (read with ``hot_token_id``).
        sampling_info: SGLang's ``SamplingBatchInfo`` of the batch, for the
            sites SGLang calls without it (a chain's draft step).
        picked: a list the site's children hook keeps its last
            ``ops.draft_children.DraftChildren`` in (one entry), for SGLang's
            ``fast_topk`` that ranks them next; None: not kept.
    """

    k: int
    positions: Callable[[], torch.Tensor]
    hot_token_id: torch.Tensor | None = None
    target_vocab: int | None = None
    sampling_info: object = None
    picked: list | None = None


def eagle_v2_positions(key: torch.Tensor, draft_step: int) -> torch.Tensor:
    """EAGLE v2 sampled drafts: SGLang's key is the position before the drafted token's."""
    return key + 1


def multi_layer_prefill_rule(key: torch.Tensor, draft_step: int) -> torch.Tensor:
    """Multi-layer EAGLE after prefill: ``key`` is the prompt length; MTP layer s drafts ``key + 1 + s``."""
    return key + 1 + draft_step


def multi_layer_decode_rule(seq_lens: torch.Tensor, accept_lens: torch.Tensor) -> PositionRule:
    """Multi-layer EAGLE after verify: MTP layer s drafts ``seq_lens + accept_lens + 1 + s``.

    ``seq_lens`` [B]: pre-verify lengths; ``accept_lens`` [B]: tokens the
    verify committed (drafts + 1), so the new first sampled token sits at
    ``seq_lens + accept_lens`` (computed once, before the call runs).
    """
    base = seq_lens + accept_lens.to(seq_lens.dtype) + 1  # [B]
    return lambda key, draft_step: base + draft_step


def multi_layer_graph_rule(num_draft_tokens: int, num_accept_tokens: torch.Tensor) -> PositionRule:
    """Multi-layer EAGLE's single-CUDA-graph runner: ``key - num_draft_tokens + num_accept_tokens + 1 + s``.

    Inside the graph SGLang keys with ``seq_lens`` = pre-verify length +
    ``num_draft_tokens``; ``num_accept_tokens`` [B] (a graph input buffer,
    refilled before every replay) holds the verify's committed count.
    """
    def rule(key: torch.Tensor, draft_step: int) -> torch.Tensor:
        return key - num_draft_tokens + num_accept_tokens.to(key.dtype) + 1 + draft_step

    return rule


def coupled_draft_position(key: torch.Tensor, draft_step: int) -> torch.Tensor:
    """Absolute position of the drafted token at the call site in progress (EAGLE v2 unless one published)."""
    rule = DRAFT_RULE.read() or eagle_v2_positions
    return rule(key, draft_step)


def draft_positions(rule: PositionRule):
    """Use ``rule`` for the coupled draft positions of the proposals drawn while the block runs."""
    return DRAFT_RULE.publish(rule)


def draft_site(site: DraftSite):
    """Publish a top-k draft site (``topk_draft_hook``) while the block runs."""
    return DRAFT_SITE.publish(site)


def published_site() -> DraftSite | None:
    """The top-k draft site in progress, or None."""
    return DRAFT_SITE.read()


def draft_forward_positions(positions: torch.Tensor) -> torch.Tensor:
    """EAGLE v2 ``draft_forward``: the token a step drafts, from the positions the step ran at."""
    return eagle_v2_positions(positions + 1, 0)


def after_root(seq_lens: torch.Tensor) -> torch.Tensor:
    """Verify and draft extend: the position of the token after the last committed one."""
    return seq_lens + 1


def next_token(positions: torch.Tensor) -> torch.Tensor:
    """Target sampler: the token decided after the last input token."""
    return positions + 1


class SamplingRows(NamedTuple):
    """A batch's sampling settings, one row per logits row (``SamplingBatchInfo`` rows repeated).

    Attributes:
        temperatures: float [R, 1].
        top_ks: int [R] (also read without a cut: ``top_k <= 1`` marks a greedy row).
        top_ps: float [R].
        min_ps: float [R] where the batch asks for a min-p cut, else None.
        cut: some row of the batch truncates (SGLang's ``need_top_k/top_p/min_p_sampling``).
        seeds: int64 [R] request seeds (uint64 bits), or None for a batch without them.
    """

    temperatures: torch.Tensor
    top_ks: torch.Tensor
    top_ps: torch.Tensor
    min_ps: torch.Tensor | None
    cut: bool
    seeds: torch.Tensor | None

    def cut_args(self) -> tuple:
        """``(top_ks, top_ps, min_ps)`` for ``ops.target_weights``, all None when no row truncates."""
        return (self.top_ks, self.top_ps, self.min_ps) if self.cut else (None, None, None)


def cuts(sampling_info) -> bool:
    """Some row of SGLang's ``SamplingBatchInfo`` truncates (its ``need_top_k/top_p/min_p_sampling``)."""
    info = sampling_info
    return bool(info.need_top_k_sampling or info.need_top_p_sampling or info.need_min_p_sampling)


def sampling_rows(sampling_info, repeat: int) -> SamplingRows:
    """SGLang's ``SamplingBatchInfo`` of B requests as the rows of a [B * repeat, V] logits tensor.

    A request's ``repeat`` rows (its verify nodes, or the nodes a draft step
    expands) are consecutive. No host sync (CUDA-graph capturable).
    """
    def rows(values):
        return torch.repeat_interleave(values, repeat, dim=0) if repeat > 1 else values

    info = sampling_info
    cut = cuts(info)
    seeds = info.sampling_seed
    return SamplingRows(rows(info.temperatures), rows(info.top_ks), rows(info.top_ps),
                        rows(info.min_ps) if cut and info.need_min_p_sampling else None, cut,
                        None if seeds is None else rows(seeds))
