"""Target sampler: every sampled token is the TARGET-stream race at the position it decides.

Under deterministic inference, every sampled token a request is given outside
speculative verify (the first token after prefill, every plain decode step,
the first token after a retraction) is ``y_t = race(w_t, TARGET, t)``
(docs/design.md, "Coupled verification"), where ``t`` is the absolute position of the token being
decided and ``w_t`` the target weights: ``torch.softmax(logits / T)`` cut by
the request's top-k / top-p / min-p in token-id order (:func:`target_weights`).
Coupled verify emits the same ``y_t`` for the same logits, so a request's
tokens do not depend on speculative decoding being on, on the drafter, or on
retraction.

SGLang's sampler passes the position of the last input token; the decided
token is the next one, so ``t = positions + 1``.

Hooked symbols (AROUND; SGLang's original runs when the bag is inactive or
the batch carries no seeds):

- ``sglang.srt.layers.sampler.sampling_from_probs_torch``: the simple path
  (no row truncates), drawn on the TARGET stream instead of SGLang's unsalted
  hash.
- ``sglang.srt.layers.sampler.top_k_top_p_min_p_sampling_from_probs_torch``:
  the top-k/top-p/min-p path. SGLang sends every row of a batch here when one
  row truncates (a greedy row has top_k = 1) and its seeded branch hashes by
  sorted column; the hook cuts in token-id order and races, so a row that
  asks for no truncation draws what the simple path draws.

The verify's own probability ops (softmax, top-k / top-p renorm) are
``probs_hook``'s.
"""

from __future__ import annotations

import torch

from ..config import current_config
from ..ops.race import exponential_race
from ..ops.streams import Stream
from ..ops.weights import id_ordered_filtered_probs
from .positions import next_token

SIMPLE_SAMPLER = "sglang.srt.layers.sampler.sampling_from_probs_torch"
SAMPLER = "sglang.srt.layers.sampler.top_k_top_p_min_p_sampling_from_probs_torch"


def target_draw(
    weights: torch.Tensor,  # [R, V] float
    seeds: torch.Tensor,  # [R] int64 request seeds (uint64 bits)
    positions: torch.Tensor,  # [R] int, absolute position of the token decided
    kernel: str,
) -> torch.Tensor:
    """``y_t = race(weights, TARGET, t)``: int64 [R]. No host sync (values unchecked)."""
    return exponential_race(weights, seeds, positions, stream=Stream.TARGET, check=False, kernel=kernel)[:, 0]


def seeded_sampling_from_probs(original, probs, sampling_seed=None, positions=None):
    """AROUND hook for SGLang's simple-path ``sampling_from_probs_torch``; same signature and return.

    Args:
        probs: float [B, V], ``torch.softmax(logits / T)`` (SGLang's deterministic sampler).
        sampling_seed: int64 [B] request seeds, or None (SGLang's original runs).
        positions: int [B], position of each row's last input token.

    Returns:
        int32 [B] token ids: the TARGET race at ``positions + 1``.
    """
    bag = current_config()
    if sampling_seed is None or not bag.active:
        return original(probs, sampling_seed=sampling_seed, positions=positions)
    return target_draw(probs, sampling_seed, next_token(positions), bag.kernel).to(torch.int32)


def seeded_top_k_top_p_sampling(
    original, probs, top_ks, top_ps, min_ps, need_min_p_sampling, sampling_seed, positions,
    *, return_filtered_probs: bool = False, max_top_k=None,
):
    """AROUND hook for SGLang's torch top-k/top-p/min-p sampler; same signature and returns.

    Args:
        probs: float [B, V], ``torch.softmax(logits / T)``.
        top_ks, top_ps, min_ps: [B] per-row cut; min-p applies only with ``need_min_p_sampling``.
        sampling_seed: int64 [B] request seeds, or None (SGLang's original runs).
        positions: int [B], position of each row's last input token; the
            TARGET race runs at ``positions + 1``.

    Returns int32 [B] token ids, or with ``return_filtered_probs`` the tuple
    ``(ids int32 [B], weights [B, V], token_ids int32 [B, V], selected_weight [B])``
    with the weights in token-id order (``token_ids`` is then ``arange(V)``).
    Min-p, which SGLang's seeded path cannot do (it asserts), is applied per row.
    """
    bag = current_config()
    if sampling_seed is None or not bag.active:
        return original(probs, top_ks, top_ps, min_ps, need_min_p_sampling, sampling_seed, positions,
                        return_filtered_probs=return_filtered_probs, max_top_k=max_top_k)
    filtered = id_ordered_filtered_probs(probs, top_ks, top_ps, min_ps if need_min_p_sampling else None)
    index = target_draw(filtered, sampling_seed, next_token(positions), bag.kernel).view(-1, 1)
    ids = index.view(-1).to(torch.int32)
    if not return_filtered_probs:
        return ids
    token_ids = torch.arange(probs.shape[-1], device=probs.device, dtype=torch.int32).expand_as(filtered)
    return ids, filtered, token_ids, filtered.gather(1, index).view(-1)
