"""The weights every TARGET-stream race runs over: softmax(logits / T), then the request's cut in token-id order.

The target sampler, coupled verify and coupled drafts all reach their weights
here, so equal logits give bitwise-equal weights on every path.
"""

from __future__ import annotations

import torch


def id_ordered_filtered_probs(
    probs: torch.Tensor,  # [B, V] float, rows of a softmax
    top_ks: torch.Tensor,  # [B] int: keep the top_k most likely tokens
    top_ps: torch.Tensor,  # [B] float: keep the smallest prefix of mass >= top_p
    min_ps: torch.Tensor | None = None,  # [B] float: drop tokens below min_p * max prob
) -> torch.Tensor:
    """SGLang's top-k / top-p / min-p cut, in token-id order: float [B, V], not renormalised.

    The cut follows SGLang's sorted rule (rank >= top_k, or the mass before a
    token > top_p, is zeroed; then, with ``min_ps``, entries below
    ``min_p * max`` of what is left); the stable sort makes the cut among
    equal probabilities depend on token ids only. Rows with ``top_k >= V``,
    ``top_p >= 1`` and ``min_p == 0`` are returned bit for bit.
    """
    v = probs.shape[-1]
    probs_sort, probs_idx = probs.sort(dim=-1, descending=True, stable=True)
    mass_before = torch.cumsum(probs_sort, dim=-1) - probs_sort
    ranks = torch.arange(v, device=probs.device).view(1, -1)
    cut = (ranks >= top_ks.view(-1, 1)) | (mass_before > top_ps.view(-1, 1))
    filtered = torch.empty_like(probs).scatter_(1, probs_idx, probs_sort.masked_fill(cut, 0.0))
    neutral = (top_ks >= v) & (top_ps >= 1.0)
    if min_ps is not None:
        threshold = filtered.amax(dim=-1, keepdim=True) * min_ps.view(-1, 1)
        filtered = filtered.masked_fill(filtered < threshold, 0.0)
        neutral = neutral & (min_ps <= 0)
    return torch.where(neutral.view(-1, 1), probs, filtered)


def target_weights(
    logits: torch.Tensor,  # [R, V] float, target logits after penalties / bias / grammar mask
    temperatures: torch.Tensor,  # [R, 1] float
    top_ks: torch.Tensor | None = None,  # [R] int, or None: no row truncates
    top_ps: torch.Tensor | None = None,  # [R] float
    min_ps: torch.Tensor | None = None,  # [R] float, or None: no min-p cut
) -> torch.Tensor:
    """The weights the TARGET race runs over: float [R, V], not renormalised.

    ``torch.softmax(logits / T)``, the kernel SGLang's sampler uses under
    deterministic inference, then the id-ordered cut of
    :func:`id_ordered_filtered_probs` when ``top_ks`` is given. The sampler
    hooks and coupled verify both reach their weights this way, so equal
    logits give bitwise-equal weights on either path.
    """
    probs = torch.softmax(logits / temperatures, dim=-1)
    if top_ks is None:
        return probs
    return id_ordered_filtered_probs(probs, top_ks, top_ps, min_ps)
