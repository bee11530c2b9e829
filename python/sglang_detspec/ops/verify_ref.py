"""Seeded chain verification (topk = 1): torch reference.

Speculative sampling (Leviathan, Kalman and Matias, ICML 2023; Chen et al.
2023): draft token ``x_j`` is accepted when ``u_j * q_j[x_j] < p_j[x_j]``;
the first rejection is replaced by a draw from the residual distribution
``max(p_j - q_j, 0)``; when all K are accepted a bonus token is drawn from
``p_K``. With the ACCEPT, RESAMPLE and BONUS streams independent, the
committed tokens are distributed exactly as sampling from the target.
"""

from __future__ import annotations

import torch

from .hashing import hash_with_prefix, key_words, row_prefix, uniform_from_hash
from .race_ref import race_reference
from .streams import Stream


def accept_coins(
    seeds: torch.Tensor,  # [B] int64, uint64 bits
    positions: torch.Tensor,  # [B] int64, position of the first draft token
    num_draft: int,  # K
) -> torch.Tensor:
    """ACCEPT-stream uniforms for positions ``t .. t+K-1``: float64 [B, K]."""
    b = seeds.shape[0]
    lo, hi = key_words(seeds, Stream.ACCEPT.salt)
    offs = torch.arange(num_draft, device=seeds.device, dtype=torch.int64)
    pos = (positions.unsqueeze(1) + offs).reshape(-1)  # [B*K]
    prefix = row_prefix(lo.repeat_interleave(num_draft), hi.repeat_interleave(num_draft), pos)
    col0 = torch.zeros(1, dtype=torch.int64, device=seeds.device)
    return uniform_from_hash(hash_with_prefix(prefix, col0)).view(b, num_draft)


def verify_reference(
    draft_tokens: torch.Tensor,  # [B, K] int64 in [0, V)
    draft_probs: torch.Tensor,  # [B, K, V] float, q_j each x_j was drawn from
    target_probs: torch.Tensor,  # [B, K+1, V] float, same dtype as draft_probs
    seeds: torch.Tensor,  # [B] int64, uint64 bits
    positions: torch.Tensor,  # [B] int64, position of x_0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Unchecked chain verify: ``(tokens int64 [B, K+1] padded with -1, accept_lengths int64 [B])``."""
    b, k = draft_tokens.shape
    dev = draft_tokens.device
    rows = torch.arange(b, device=dev)
    if k > 0:
        u = accept_coins(seeds, positions, k)
        qx = draft_probs.gather(2, draft_tokens.unsqueeze(2)).squeeze(2).to(torch.float64)
        px = target_probs[:, :k].gather(2, draft_tokens.unsqueeze(2)).squeeze(2).to(torch.float64)
        accepted = u * qx < px  # [B, K]
        accept_len = accepted.to(torch.int64).cumprod(dim=1).sum(dim=1)
    else:
        accept_len = torch.zeros(b, dtype=torch.int64, device=dev)
    rejected = accept_len < k  # [B]
    p_sel = target_probs[rows, accept_len]  # [B, V]
    if k > 0:
        q_sel = draft_probs[rows, accept_len.clamp(max=k - 1)]
        resid = torch.clamp_min(p_sel - q_sel, 0)  # in the probs' own dtype
        use_resid = rejected & (resid.amax(dim=1) > 0)
        weights = torch.where(use_resid.unsqueeze(1), resid, p_sel)
    else:
        weights = p_sel
    salts = torch.where(rejected, Stream.RESAMPLE.salt, Stream.BONUS.salt)  # int64 [B]
    lo, hi = key_words(seeds, salts)
    final = race_reference(weights, row_prefix(lo, hi, positions + accept_len), 0, 1)[:, 0]
    tokens = torch.full((b, k + 1), -1, dtype=torch.int64, device=dev)
    if k > 0:
        keep = torch.arange(k, device=dev).unsqueeze(0) < accept_len.unsqueeze(1)
        tokens[:, :k] = torch.where(keep, draft_tokens.to(torch.int64), -1)
    tokens[rows, accept_len] = final
    return tokens, accept_len
