"""Public coupled (drafter-invariant) verification: chain and tree.

Both check their arguments, then run the fused Triton kernels for CUDA
tensors (when Triton is present) or the torch reference elsewhere; the two
agree bit for bit on the same CUDA device. See docs/design.md, coupled
verification.
"""

from __future__ import annotations

import torch

from .checks import (
    INT_DTYPES, as_position_tensor, as_seed_tensor, check_chain_args, check_columns_fit, check_probs, check_token_range,
)
from .choices import one_of
from .coupled_ref import coupled_walk_reference
from .kernel_choice import use_triton
from .tree import check_link_tensor, tree_max_depth
from .verify_outputs import VerifyOutputs, check_verify_outputs, write_verify_outputs


def coupled_verify_chain(
    draft_tokens: torch.Tensor,
    target_probs: torch.Tensor,
    seeds,
    positions,
    *,
    check: bool = True,
    kernel: str = "auto",
    out: VerifyOutputs | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Coupled chain verification: commit the target race tokens the draft agrees with.

    With ``t = positions[b]`` and ``y_{t+j} = race(target_probs[b, j], TARGET,
    t + j)`` (:func:`exponential_race` on ``Stream.TARGET``), draft token
    ``x_j`` is accepted iff ``x_j == y_{t+j}`` and every earlier one was; the
    row commits the accepted drafts and then the first non-matching y (or
    ``y_{t+K}`` after K accepts). The committed tokens are therefore exactly
    plain autoregressive sampling on the TARGET stream, whatever the drafts
    (drafter-invariant and lossless); drafts raced on the same uniforms are
    accepted with probability at least (1 - TV)/(1 + TV) per token (Gumbel
    coupling: Daliri, Musco and Suresh 2024). No draft probabilities.

    Args:
        draft_tokens: int64/int32 [B, K], ids in [0, V).
        target_probs: [B, K+1, V] float16/bfloat16/float32/float64, finite,
            >= 0, each row with a positive entry (need not sum to 1: a
            filtered top-k/top-p row is fine). Row j decides position t + j.
        seeds: int64 or uint64 tensor [B] (uint64 bits), a NumPy integer
            array, ints in [0, 2**64), or one int for every row.
        positions: integer tensor [B], NumPy array, ints, or one int: t, the
            absolute position of x_0; t + K must be < 2**32.
        check: run the value checks (read tensors back to the host); pass
            False inside CUDA-graph capture. Shape, dtype and device checks
            always run.
        kernel: ``"auto"`` (Triton for CUDA tensors), ``"torch"`` or ``"triton"``.
        out: SGLang's verify buffers over the chain's K + 1 nodes (node 0
            the root, node j + 1 draft ``x_j``), written in place as
            :func:`~.verify_outputs.write_verify_outputs` writes them with
            ``path = arange(K + 1)``: by the kernel's own walk on the Triton
            path (no scatter launched after it), by that function on the torch path.

    Returns:
        ``(tokens, accept_lengths)``: int64 [B, K+1], accepted drafts then the
        emitted y, padded with -1; int64 [B] in [0, K]. Row b commits
        ``accept_lengths[b] + 1`` tokens.

    Raises:
        ValueError: shape, dtype or device mismatch (including K); draft
            tokens outside [0, V); NaN, inf or negative probabilities or an
            all-zero row; a seed outside uint64; t + K outside [0, 2**32);
            an unknown ``kernel``; ``out`` of the wrong shape, dtype or device.
    """
    b, k, v, dev, seeds_t, pos_t = check_chain_args(draft_tokens, target_probs, seeds, positions, check)
    triton_path = use_triton(kernel, dev)
    if out is not None:
        check_verify_outputs(out, b, k + 1, dev)
    if b == 0:
        return torch.zeros(0, k + 1, dtype=torch.int64, device=dev), torch.zeros(0, dtype=torch.int64, device=dev)
    if triton_path:
        from .coupled_triton import coupled_chain_triton

        return coupled_chain_triton(draft_tokens, target_probs, seeds_t, pos_t, out)
    cand, nxt, sib = chain_links(draft_tokens.to(torch.int64))
    tokens, accept, path = coupled_walk_reference(cand, nxt, sib, target_probs, seeds_t, pos_t)
    if out is not None:
        write_verify_outputs(tokens, accept, path, *out)
    return tokens, accept


def chain_links(draft_tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A chain [B, K] as the tree layout: ``(candidates, next_token, next_sibling)``, each int64 [B, K+1].

    Node j + 1 holds ``x_j``; node i's only child is i + 1; the root's
    candidate is -1 (never read).
    """
    b, k = draft_tokens.shape
    dev = draft_tokens.device
    cand = torch.cat([torch.full((b, 1), -1, dtype=torch.int64, device=dev), draft_tokens.to(torch.int64)], 1)
    nxt = torch.arange(1, k + 2, device=dev).expand(b, -1).clone()
    nxt[:, k] = -1
    return cand, nxt, torch.full((b, k + 1), -1, dtype=torch.int64, device=dev)


def coupled_verify_tree(
    candidates: torch.Tensor,
    retrieve_next_token: torch.Tensor,
    retrieve_next_sibling: torch.Tensor,
    target_probs: torch.Tensor,
    seeds,
    positions,
    *,
    check: bool = True,
    kernel: str = "auto",
    out: VerifyOutputs | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Coupled tree verification over SGLang's draft-tree layout.

    Node 0 is the root (the last committed token; its candidate is never
    read); ``retrieve_next_token[b, i]`` is node i's first child or -1,
    ``retrieve_next_sibling[b, i]`` its next sibling or -1; children have
    larger indices than their parent. ``target_probs[b, i]`` is the target
    distribution of the token after node i, at position
    ``positions[b] + depth(i)`` (depth(root) = 0). Walk: at node ``cur``
    (first the root) draw ``y = race(target_probs[b, cur], TARGET,
    positions[b] + depth(cur))``; if a child of ``cur`` has candidate y, move
    to it (the smallest node index if several have), else stop. The committed
    tokens are the plain TARGET-stream tokens: only the number committed per
    step depends on the tree, never the tokens (membership, not order, of the
    children matters). A chain is the tree with next_token[i] = i + 1.

    Args:
        candidates: int64/int32 [B, N], token of each node; nodes 1..N-1 in [0, V).
        retrieve_next_token: int64/int32 [B, N], first child or -1.
        retrieve_next_sibling: int64/int32 [B, N], next sibling or -1.
        target_probs: [B, N, V] float, finite, >= 0, each row with a positive
            entry (need not sum to 1).
        seeds: as :func:`coupled_verify_chain`.
        positions: t per row: the position of the token after the root;
            t + (max depth) must be < 2**32.
        check: value checks, including the link checks (read back to the
            host); pass False inside CUDA-graph capture.
        kernel: ``"auto"``, ``"torch"`` or ``"triton"``.
        out: SGLang's verify buffers, written in place as
            :func:`~.verify_outputs.write_verify_outputs` writes them from the
            three results: by the kernel's own walk on the Triton path, by
            that function on the torch path.

    Returns:
        ``(tokens, accept_lengths, path)``, int64: ``path[b, 0] = 0`` and
        ``path[b, j]`` the j-th accepted node; ``tokens[b, j]`` the token
        committed after ``path[b, j]`` (the candidate of ``path[b, j+1]``, or
        the final y at ``j = accept_lengths[b]``); ``accept_lengths[b]`` the
        number of accepted draft nodes. tokens and path are [B, N], -1 padded.

    Raises:
        ValueError: shape, dtype or device mismatch; candidates outside [0, V);
            links outside [-1, N), a child index not greater than its
            parent's, a sibling of the root, a node with two incoming links,
            a cycle; NaN, inf or negative probabilities or an all-zero row; a
            seed outside uint64; t + max depth outside [0, 2**32); an unknown
            ``kernel``; ``out`` of the wrong shape, dtype or device.
    """
    if not isinstance(candidates, torch.Tensor) or candidates.dtype not in INT_DTYPES:
        got = candidates.dtype if isinstance(candidates, torch.Tensor) else type(candidates).__name__
        raise ValueError(f"candidates must be an {one_of(INT_DTYPES)} tensor [B, N], got {got}")
    if candidates.dim() != 2 or candidates.shape[1] < 1:
        raise ValueError(f"candidates must be 2-D [B, N] with N >= 1 (node 0 is the root), got {tuple(candidates.shape)}")
    b, n = candidates.shape
    check_probs("target_probs", target_probs, 3, False)
    v = target_probs.shape[2]
    if tuple(target_probs.shape) != (b, n, v):
        raise ValueError(f"target_probs must be [B, N, V] = {(b, n, v)}, got {tuple(target_probs.shape)}")
    dev = target_probs.device
    if candidates.device != dev:
        raise ValueError(f"candidates is on {candidates.device} but target_probs is on {dev}")
    check_link_tensor("retrieve_next_token", retrieve_next_token, (b, n), dev)
    check_link_tensor("retrieve_next_sibling", retrieve_next_sibling, (b, n), dev)
    check_columns_fit("token ids", 0, v)
    triton_path = use_triton(kernel, dev)
    check_probs("target_probs", target_probs, 3, check)
    seeds_t = as_seed_tensor(seeds, b, dev)
    span = 1
    if check and b:
        if n > 1:
            check_token_range("candidates[:, 1:]", candidates[:, 1:], v)
        span = tree_max_depth(retrieve_next_token.cpu(), retrieve_next_sibling.cpu()) + 1
    pos_t = as_position_tensor(positions, b, dev, check, span=span)
    if out is not None:
        check_verify_outputs(out, b, n, dev)
    if b == 0:
        empty = torch.zeros(0, n, dtype=torch.int64, device=dev)
        return empty, torch.zeros(0, dtype=torch.int64, device=dev), empty.clone()
    if triton_path:
        from .coupled_triton import coupled_tree_triton

        return coupled_tree_triton(
            candidates, retrieve_next_token, retrieve_next_sibling, target_probs, seeds_t, pos_t, out
        )
    result = coupled_walk_reference(
        candidates.to(torch.int64), retrieve_next_token.to(torch.int64), retrieve_next_sibling.to(torch.int64),
        target_probs, seeds_t, pos_t,
    )
    if out is not None:
        write_verify_outputs(*result, *out)
    return result
