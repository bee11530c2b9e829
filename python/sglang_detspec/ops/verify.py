"""Public chain verification with rejection sampling (topk = 1).

Checks its arguments, then runs the fused Triton kernel (``verify_triton``)
for CUDA tensors when Triton is present, or the torch reference
(``verify_ref``) elsewhere; the two agree bit for bit on the same CUDA device.
"""

from __future__ import annotations

import torch

from .checks import check_chain_args
from .kernel_choice import use_triton
from .verify_ref import verify_reference


def verify_chain(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    seeds,
    positions,
    *,
    check: bool = True,
    kernel: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Seeded chain verification with rejection sampling (topk = 1), docs/design.md §4.

    For each request: accept draft token x_j at position t+j when
    ``u * q_j[x_j] < p_j[x_j]`` in float64 (u from the ACCEPT stream); at
    the first rejection draw from the residual ``max(p_j - q_j, 0)`` (computed
    in the probs' dtype; ``p_j`` if the residual is all zero) on the RESAMPLE
    stream at position t+j and stop; if all K are accepted, draw the bonus
    token from ``p_K`` on the BONUS stream at position t+K. This is
    speculative sampling (Leviathan et al. 2023; Chen et al. 2023): the
    committed tokens are distributed exactly as target sampling.

    Args:
        draft_tokens: int64/int32 [B, K], ids in [0, V).
        draft_probs: [B, K, V] float, the exact q each x_j was drawn from;
            rows sum to 1 and ``q_j[x_j] > 0``.
        target_probs: [B, K+1, V] float of the same dtype, target distributions
            at positions t..t+K; rows sum to 1.
        seeds: as :func:`~sglang_detspec.ops.race.exponential_race`.
        positions: integer tensor [B], NumPy array, ints or one int: t, the absolute position of x_0;
            t + K must be < 2**32.
        check: run the value checks (reads tensors back to the host); pass
            False inside CUDA-graph capture.
        kernel: ``"auto"`` (Triton for CUDA tensors), ``"torch"`` or ``"triton"``.

    Returns:
        ``(tokens, accept_lengths)``: int64 [B, K+1] with the accepted draft
        tokens then the emitted (residual or bonus) token, padded with -1;
        int64 [B] number of accepted draft tokens (0..K). Row b commits
        ``accept_lengths[b] + 1`` tokens.

    Raises:
        ValueError: shape, dtype or device mismatch between the arguments
            (including K); draft tokens outside [0, V) or with q_j[x_j] = 0;
            NaN, inf or negative probabilities; rows that do not sum to 1
            (within 1e-3 for float32); a seed outside uint64; a position with
            t + K outside [0, 2**32); an unknown ``kernel`` (None included).
    """
    b, k, v, dev, seeds_t, pos_t = check_chain_args(draft_tokens, target_probs, seeds, positions, check,
                                                    draft_probs=draft_probs)
    if check and draft_tokens.numel():
        q_x = draft_probs.gather(2, draft_tokens.to(torch.int64).unsqueeze(2))
        if bool((q_x == 0).any()):
            b0, j0, _ = (q_x == 0).nonzero()[0].tolist()
            raise ValueError(
                f"draft_tokens[{b0}, {j0}] = {int(draft_tokens[b0, j0])} has draft probability 0: "
                "each draft token must be drawn from the draft_probs row given for it"
            )
    if b == 0:
        return (
            torch.zeros(0, k + 1, dtype=torch.int64, device=dev),
            torch.zeros(0, dtype=torch.int64, device=dev),
        )
    if use_triton(kernel, dev):
        from .verify_triton import verify_triton

        return verify_triton(draft_tokens.to(torch.int64), draft_probs, target_probs, seeds_t, pos_t)
    return verify_reference(draft_tokens.to(torch.int64), draft_probs, target_probs, seeds_t, pos_t)
