"""Coupled drafts picked by top-k: the tensor whose top-k are each sampled row's coupled children.

SGLang's EAGLE v2 draft worker picks a node's children as the top-k of a
[R, V_draft] tensor (``renorm_draft_probs`` then ``fast_topk``). For coupled
drafts that tensor is zero except at the row's Gumbel-top-k on the TARGET
stream (docs/design.md, coupled drafts); ``sglang_plugin/topk_draft_hook.py``
hands it to SGLang. Over a reduced draft vocabulary (EAGLE3 ``d2t``,
``--speculative-token-map``) draft column j stands for target id
``hot_token_id[j]``: q is spread onto those target ids before the race, so
every draft races on the uniform of the target id it proposes, and the
winners are mapped back to draft columns.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .kernel_choice import use_triton
from .tree_children import children_and_keys, relative_scores
from .weights import id_ordered_filtered_probs, target_weights


class DraftChildren(NamedTuple):
    """The children of every row, as the dense tensor SGLang ranks and as a ranking of it.

    Attributes:
        dense: float32 [R, V_draft]: sampled rows' children at their scores, 0
            elsewhere; greedy rows' q.
        values: float32 [R, k]: per row, descending: a sampled row's children's
            scores (the first 1), a greedy row's k largest q; None where not ranked.
        indices: int64 [R, k] in [0, V_draft): their draft columns (among equal
            values the smaller id, or for a sampled row the race's key order);
            None where not ranked.
    """

    dense: torch.Tensor
    values: torch.Tensor | None
    indices: torch.Tensor | None


def draft_children(
    logits: torch.Tensor,  # [R, V_draft] float: draft logits
    temperatures: torch.Tensor,  # [R, 1] float
    top_ks: torch.Tensor,  # [R] int: top_k <= 1 marks a greedy row
    seeds: torch.Tensor,  # [R] int64 request seeds (uint64 bits)
    positions: torch.Tensor,  # [R] int: absolute position of the token each row drafts
    k: int,
    *,
    cut: tuple = (None, None, None),  # (top_ks [R], top_ps [R], min_ps [R] or None), all None: no row truncates
    kernel: str = "auto",
    hot_token_id: torch.Tensor | None = None,  # [V_draft] int64: target id of each draft column
    target_vocab: int | None = None,  # the target's vocabulary size, with hot_token_id
) -> torch.Tensor:
    """float32 [R, V_draft]: each sampled row's coupled children at their scores, zero elsewhere.

    Row r: ``q = softmax(logits[r] / T_r)``, ``w`` = q cut by the row's
    top-k / top-p / min-p in draft-column order where ``cut`` asks for it
    (:func:`~sglang_detspec.ops.weights.id_ordered_filtered_probs`, the
    target's rule; over a full vocabulary that is token-id order), spread onto
    target ids through ``hot_token_id`` when given (zero elsewhere), then
    children = ``coupled_children(w, seeds[r], positions[r], k)`` (q's
    Gumbel-top-k on the TARGET stream, keyed by target id), each at its score
    (the race winner at 1), back in draft columns. Greedy rows
    (``top_ks <= 1``) return q itself, so a top-k of q drafts them. No host
    sync: safe inside CUDA-graph capture (so greedy rows are raced too and
    their children thrown away: picking rows out would need one). On the
    Triton path the scores, the dense tensor and the greedy rows' q come
    from one kernel after the race (``draft_children_triton``), bit for bit
    the torch path's. Unchecked (called inside capture); ValueError for an
    unknown ``kernel``.
    """
    return _children(logits, temperatures, top_ks, seeds, positions, k, cut, kernel, hot_token_id, target_vocab,
                     rank=False).dense


def draft_children_topk(logits: torch.Tensor, temperatures: torch.Tensor, top_ks: torch.Tensor, seeds: torch.Tensor,
                        positions: torch.Tensor, k: int, *, cut: tuple = (None, None, None),
                        kernel: str = "auto") -> DraftChildren:
    """:func:`draft_children` with a top-k of it: :class:`DraftChildren`, over a full draft vocabulary.

    The race that picks a sampled row's children also ranks a greedy row's q
    (``exponential_race``'s ``unit_rows``: exponentials at 1; the row's cut
    made neutral, so q is ranked uncut), so ``values`` are, row by row, the
    k largest entries of ``dense`` (a sampled row's children in race order,
    a greedy row's k largest q) without a second pass over ``[R, V]``, and
    ``indices`` their columns (SGLang's top-k leaves the order among equal
    values open; here the smaller id first, or the race's key order, and a
    row with fewer than k positive weights fills with zero-score columns).
    Indices stay in ``[0, V)`` whatever the logits. Arguments (shapes and
    dtypes) and errors as :func:`draft_children`, without a reduced draft
    vocabulary (a child off it has no column).
    """
    return _children(logits, temperatures, top_ks, seeds, positions, k, cut, kernel, None, None, rank=True)


def _children(logits, temperatures, top_ks, seeds, positions, k, cut, kernel, hot_token_id, target_vocab, *,
              rank: bool) -> DraftChildren:
    rows, v = logits.shape
    q = target_weights(logits.float(), temperatures)
    greedy = (top_ks <= 1).view(-1)
    if any(c is not None for c in cut):
        cut_ks, cut_ps, cut_mins = cut
        if rank:
            # A greedy row ranks q itself: a neutral cut returns its row bit for bit, at no extra [R, V] pass.
            cut_ks = torch.where(greedy, v, cut_ks)
            cut_ps = torch.where(greedy, 1.0, cut_ps)
            cut_mins = None if cut_mins is None else torch.where(greedy, 0.0, cut_mins)
        weights = id_ordered_filtered_probs(q, cut_ks, cut_ps, cut_mins)
    else:
        weights = q
    if hot_token_id is not None:
        spread = torch.zeros(rows, target_vocab, dtype=weights.dtype, device=weights.device)
        weights = spread.index_copy_(1, hot_token_id, weights)
    children, keys = children_and_keys(weights, seeds, positions, min(k, v), kernel=kernel,
                                       unit_rows=greedy if rank else None)
    if hot_token_id is not None:
        # Target ids back to draft columns; a zero-weight child off the draft vocabulary lands in
        # a spare last column and drops out.
        column = torch.full((target_vocab,), v, dtype=torch.int64, device=logits.device)
        column[hot_token_id] = torch.arange(v, device=logits.device)
        children = column[children]
    values = indices = None
    if rank:
        values = torch.where(greedy.view(-1, 1), keys, relative_scores(keys)).float()
        indices = children.clamp(0, v - 1)  # a race over a NaN row returns no id inside the vocabulary
    if use_triton(kernel, logits.device):
        from .draft_children_triton import dense_children_triton

        return DraftChildren(dense_children_triton(q, children, keys, top_ks), values, indices)
    sparse = torch.zeros(rows, v + 1, dtype=torch.float32, device=logits.device)
    sparse.scatter_(1, children, relative_scores(keys).float())
    return DraftChildren(torch.where(greedy.view(-1, 1), q, sparse[:, :v]), values, indices)
