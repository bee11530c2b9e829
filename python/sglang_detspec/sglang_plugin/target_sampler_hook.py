"""Keep a request's seeded target draws independent of its neighbours' sampling settings.

Measured on an H200 with SGLang 0.5.23 (chain EAGLE, rejection sampling,
deterministic inference): a probe request with fixed ``sampling_seed`` gave
one output whenever its batch held only non-greedy requests and another
whenever the batch held a greedy one, from the first token on. SGLang picks
the sampling path per *batch*: with any row using top-k/top-p (a greedy row
has top_k = 1) every row goes through the top-k/top-p path, and on the
seeded top-k/top-p path (``top_k_top_p_min_p_sampling_from_probs_torch``)
the Gumbel noise is hashed by the column of the *sorted* probabilities, not
by the token id, so a row's draw changes with the path its batch takes. The
same batch switch applies flashinfer's top-k / top-p renormalisation to every
row of the verify's target distributions, which rescales rows that asked for
no truncation.

Hooked symbols (AROUND, active only while the config bag is active):

- ``sglang.srt.layers.sampler.top_k_top_p_min_p_sampling_from_probs_torch``
  (the first token after prefill, and any non-speculative decode): the
  top-k / top-p cut is applied as SGLang defines it, written back in token-id
  order, and drawn with SGLang's own ``multinomial_with_seed(log(probs))`` as
  its simple path does; a row that asked for no truncation therefore draws
  exactly what the simple path draws.
- ``sglang.kernels.ops.sampling.renorm.top_k_renorm_prob`` and
  ``top_p_renorm_prob`` (bound in ``eagle_utils``, used by the verify): rows
  with ``top_k >= V`` or ``top_p >= 1`` keep their probabilities bit for bit.
"""

from __future__ import annotations

import torch

from .resolve import active_config

SAMPLER = "sglang.srt.layers.sampler.top_k_top_p_min_p_sampling_from_probs_torch"
TOP_K_RENORM = "sglang.kernels.ops.sampling.renorm.top_k_renorm_prob"
TOP_P_RENORM = "sglang.kernels.ops.sampling.renorm.top_p_renorm_prob"


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


def seeded_top_k_top_p_sampling(
    original, probs, top_ks, top_ps, min_ps, need_min_p_sampling, sampling_seed, positions,
    *, return_filtered_probs: bool = False, max_top_k=None,
):
    """AROUND hook for SGLang's torch top-k/top-p/min-p sampler; same signature and returns.

    Returns int32 [B] token ids, or with ``return_filtered_probs`` the tuple
    ``(ids int32 [B], weights [B, V], token_ids int32 [B, V], selected_weight [B])``
    with the weights in token-id order (``token_ids`` is then ``arange(V)``).
    Seeded rows draw by token id (see the module docstring); min-p, which
    SGLang's seeded path cannot do (it asserts), is applied per row. Unseeded
    calls and an inactive bag run SGLang's original.
    """
    if sampling_seed is None or not active_config().active:
        return original(probs, top_ks, top_ps, min_ps, need_min_p_sampling, sampling_seed, positions,
                        return_filtered_probs=return_filtered_probs, max_top_k=max_top_k)
    from sglang.srt.layers import sampler

    filtered = id_ordered_filtered_probs(probs, top_ks, top_ps, min_ps if need_min_p_sampling else None)
    index = sampler.multinomial_with_seed(torch.log(filtered), sampling_seed, positions)
    ids = index.view(-1).to(torch.int32)
    if not return_filtered_probs:
        return ids
    token_ids = torch.arange(probs.shape[-1], device=probs.device, dtype=torch.int32).expand_as(filtered)
    return ids, filtered, token_ids, filtered.gather(1, index).view(-1)


def _keep_neutral_rows(probs, renormed, neutral):
    return torch.where(neutral.view(-1, 1), probs, renormed)


def top_k_renorm_keep_neutral(original, probs, top_ks, *args, **kwargs):
    """AROUND hook for SGLang's ``top_k_renorm_prob(probs [B, V], top_ks [B])``."""
    out = original(probs, top_ks, *args, **kwargs)
    if not active_config().active or not isinstance(top_ks, torch.Tensor):
        return out
    return _keep_neutral_rows(probs, out, top_ks >= probs.shape[-1])


def top_p_renorm_keep_neutral(original, probs, top_ps, *args, **kwargs):
    """AROUND hook for SGLang's ``top_p_renorm_prob(probs [B, V], top_ps [B])``."""
    out = original(probs, top_ps, *args, **kwargs)
    if not active_config().active or not isinstance(top_ps, torch.Tensor):
        return out
    return _keep_neutral_rows(probs, out, top_ps >= 1.0)
