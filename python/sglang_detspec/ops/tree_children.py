"""Coupled tree children: q's Gumbel-top-k on the TARGET stream, scored against the race winner."""

from __future__ import annotations

import torch

from .race import exponential_race
from .streams import Stream


def coupled_children(
    weights: torch.Tensor,  # [R, V] float: q of each expanded node (any scale, cut rows zeroed)
    seeds: torch.Tensor,  # [R] int64, uint64 bits: the node's request seed
    positions: torch.Tensor,  # [R] int: absolute position of the children
    k: int,
    *,
    kernel: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """The k children of each node and their scores: ``(int64 [R, k], float64 [R, k])``.

    Children: ``exponential_race(weights, seeds, positions, TARGET,
    num_samples=k)``, the k largest race keys ``q_i / E_i`` on the uniforms
    the target's own race uses at that position (Gumbel-top-k: k draws
    without replacement from q, coupled to the target's race; Vieira 2014,
    Kool et al. 2019), in key order, so the first child is the coupled
    chain's draft. Scores: each child's key over the first child's, in
    (0, 1], the first exactly 1 (0 for a zero-weight child of a row with
    fewer than k positive weights). A path's product is then 1 along the
    chain of first children, and the other children rank by how close they
    came to winning the race, i.e. how small a difference between p and q
    would make them the target's winner. Unchecked, no host sync
    (CUDA-graph capturable); callers pass valid weights, seeds, positions.
    """
    children, keys = children_and_keys(weights, seeds, positions, k, kernel=kernel)
    return children, relative_scores(keys)


def children_and_keys(weights, seeds, positions, k: int, *, kernel: str = "auto",
                      unit_rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The k children of each node and their raw race keys: ``(int64 [R, k], float64 [R, k])``, keys descending.

    :func:`coupled_children` before :func:`relative_scores`; for callers that
    fuse the normalisation into a later kernel. ``unit_rows`` (bool [R]):
    rows ranked by their weights alone (``exponential_race``), whose "children"
    are the weights' top-k and keys the weights. Unchecked, no host sync.
    """
    # The race's own scores of its winners: recomputing them (keys.race_keys) is a chain of small
    # hash kernels, launched from the host at every draft extend outside the draft CUDA graph.
    return exponential_race(weights, seeds, positions, stream=Stream.TARGET, num_samples=k, check=False,
                            kernel=kernel, return_scores=True, unit_rows=unit_rows)


def relative_scores(keys: torch.Tensor) -> torch.Tensor:
    """float64 [R, k]: each key over its row's first (largest), the first exactly 1; 0 keys stay 0.

    The first key is floored at the smallest normal float64 so a row of zero
    keys divides by a positive number.
    """
    return keys / keys[:, :1].clamp(min=torch.finfo(torch.float64).tiny)
