"""Race keys of chosen tokens: the scores ``w_i * (1 / E_i)`` the exponential race compares (docs/design.md §3)."""

from __future__ import annotations

import torch

from .hashing import hash_with_prefix, key_words, row_prefix, uniform_from_hash
from .race_ref import race_score
from .streams import Stream


def race_keys(
    weights: torch.Tensor,  # [R, k] float: w of each chosen token
    seeds: torch.Tensor,  # [R] int64, uint64 bits
    positions: torch.Tensor,  # [R] int: absolute position of the token the race decides
    token_ids: torch.Tensor,  # [R, k] int: the chosen tokens (the race's columns)
    stream: Stream,
) -> torch.Tensor:
    """float64 [R, k]: ``w * (1 / -log(u))`` (``race_ref.race_score``) with ``u`` the stream's uniform of (seed, position, token id).

    The same score :func:`exponential_race` ranks by, for k given tokens only
    (e.g. a Gumbel-top-k's winners, to weigh them against each other). The
    race's winner has the largest key in its row. Unchecked and without a
    host sync (CUDA-graph capturable): callers pass ids in [0, 2**32) and
    positions in [0, 2**32). On CPU ``log`` may differ from CUDA's by one ulp.
    """
    lo, hi = key_words(seeds.to(torch.int64), stream.salt)
    prefix = row_prefix(lo, hi, positions.to(torch.int64))
    u = uniform_from_hash(hash_with_prefix(prefix, token_ids.to(torch.int64)))
    return race_score(weights, u)
