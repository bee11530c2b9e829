"""Coupled (drafter-invariant) verification: torch reference, any device.

Every token committed at absolute position t is the target race
``y_t = race(p_t, TARGET, t)``; verification only decides how many of them a
step commits. The walk starts at the root, computes y for the position after
the current node, moves to the child whose candidate equals y (the smallest
node index if several do) and stops, emitting y, when none does. This module
races lazily, one tree level per step (the current node's row of every
request), so it learns depths by walking and never uses the kernels'
precomputed depths: an independent check of them. Coupling by a shared race follows Daliri,
Musco and Suresh 2024 ("Coupling without Communication and
Drafter-Invariant Speculative Decoding").
"""

from __future__ import annotations

import torch

from .hashing import key_words, row_prefix
from .race_ref import race_reference
from .streams import MASK32, Stream


def coupled_walk_reference(
    candidates: torch.Tensor,  # [B, N] int64, token of each node (node 0, the root, unread)
    next_token: torch.Tensor,  # [B, N] int64, first child or -1
    next_sibling: torch.Tensor,  # [B, N] int64, next sibling or -1
    target_probs: torch.Tensor,  # [B, N, V] float, row i: the token after node i
    seeds: torch.Tensor,  # [B] int64, uint64 bits
    positions: torch.Tensor,  # [B] int64, position of the token after the root
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Unchecked tree walk: ``(tokens int64 [B, N], accept_lengths int64 [B], path int64 [B, N])``.

    ``path[b, 0] = 0`` and ``path[b, j]`` is the j-th accepted node;
    ``tokens[b, j]`` is the token committed after ``path[b, j]``; both -1
    padded. Links outside [0, N) end a child list (only reachable unchecked).
    """
    b, n = candidates.shape
    dev = candidates.device
    lo, hi = key_words(seeds, Stream.TARGET.salt)
    tokens = torch.full((b, n), -1, dtype=torch.int64, device=dev)
    path = torch.full((b, n), -1, dtype=torch.int64, device=dev)
    path[:, 0] = 0
    accept = torch.zeros(b, dtype=torch.int64, device=dev)
    cur = torch.zeros(b, dtype=torch.int64, device=dev)
    walking = torch.ones(b, dtype=torch.bool, device=dev)
    rows = torch.arange(b, device=dev)
    # Fixed trip counts and masks instead of data-dependent exits: no host
    # sync, so the reference is CUDA-graph capturable like the kernels.
    for depth in range(n):
        # The hash position word is uint32; the mask only matters unchecked.
        pos = (positions + depth) & MASK32
        y = race_reference(target_probs[rows, cur], row_prefix(lo, hi, pos), 0, 1)[:, 0]
        tokens[:, depth] = torch.where(walking, y, tokens[:, depth])
        if depth + 1 == n:  # a valid tree moves at most N - 1 times
            break
        child = next_token[rows, cur]
        found = torch.full_like(child, n)
        for _ in range(n - 1):  # a child list holds at most N - 1 nodes
            valid = (child > 0) & (child < n)
            c = child.clamp(0, n - 1)
            hit = valid & (candidates[rows, c] == y) & (c < found)
            found = torch.where(hit, c, found)
            child = torch.where(valid, next_sibling[rows, c], -1)
        walking = walking & (found < n)
        path[:, depth + 1] = torch.where(walking, found, -1)
        accept += walking.to(torch.int64)
        cur = torch.where(walking, found, cur)
    return tokens, accept, path
