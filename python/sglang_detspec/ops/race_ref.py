"""Exponential race (Gumbel-max) over keyed uniforms: torch reference.

For non-negative weights ``w`` the index ``argmax_i w_i / E_i`` with
``E_i = -log(u_i)`` i.i.d. Exp(1) is distributed as ``w / sum(w)`` (the
exponential-race form of the Gumbel-max trick; Gumbel 1954, Yellott 1977).
The k largest scores in descending order are k draws without replacement
(Gumbel-top-k; Kool, van Hoof and Welling, ICML 2019), i.e. Plackett-Luce.

The result depends only on per-element comparisons, so it does not depend on
how the vocabulary is tiled or the batch is shaped. This module walks the
vocabulary in chunks so the extra memory stays at a few ``[B, chunk]``
temporaries instead of a full ``[B, V]`` float64 score matrix.
"""

from __future__ import annotations

import torch

from .hashing import hash_with_prefix, uniform_from_hash

# Elements per temporary: about 8 int64/float64 [B, chunk] temporaries live at
# once, so the peak extra memory is about 8 * 8 B * 2**20 = 64 MiB at any B.
CHUNK_ELEMENTS = 1 << 20
MIN_CHUNK = 1024


def chunk_size(batch: int, vocab: int) -> int:
    """Vocabulary columns per chunk: ``clamp(2**20 // B, 1024, V)``."""
    return max(1, min(vocab, max(MIN_CHUNK, CHUNK_ELEMENTS // max(batch, 1))))


def race_scores(
    weights: torch.Tensor,  # [B, n] float, a column slice of the weights
    prefix: torch.Tensor,  # [B] int64 hash state after (lo32, hi32, position)
    first_column: torch.Tensor | int,  # int, or [B] int64: column of weights[:, 0]
) -> torch.Tensor:
    """Race scores ``w * (1 / -log(u))`` in float64: [B, n].

    The reciprocal-then-multiply rounding is SGLang 0.5.23's ``fast_sample``
    arithmetic, so DRAFT-stream draws equal SGLang's bit for bit.
    """
    n = weights.shape[1]
    cols = torch.arange(n, device=weights.device, dtype=torch.int64)
    if isinstance(first_column, torch.Tensor):
        cols = first_column.unsqueeze(1) + cols.unsqueeze(0)  # [B, n]
    else:
        cols = cols + first_column  # [n]
    return race_score(weights, uniform_from_hash(hash_with_prefix(prefix, cols)))


def race_score(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The race score ``w * (1 / -log(u))`` in float64 (shapes broadcast; ``u`` float64 in (0, 1)).

    The one torch spelling of the score: the reciprocal-then-multiply
    rounding is SGLang 0.5.23's ``fast_sample`` arithmetic and the Triton
    kernels' (``triton_hash.exact_score``), so every path ranks by the same
    float64 value.
    """
    return weights.to(torch.float64) * torch.reciprocal(-torch.log(u))


def race_reference(
    weights: torch.Tensor,  # [B, V] float16/bfloat16/float32/float64, >= 0
    prefix: torch.Tensor,  # [B] int64, from hashing.row_prefix
    column_offset: torch.Tensor | int,  # int, or [B] int64: column of token 0
    num_samples: int,
    *,
    return_scores: bool = False,
    unit_rows: torch.Tensor | None = None,  # [B] bool: rows ranked by their weights alone
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Top-``num_samples`` race winners per row: int64 [B, num_samples].

    With ``return_scores`` also their race scores (:func:`race_score`),
    float64 [B, num_samples]. Ties go to the smaller token index. A row of
    ``unit_rows`` races with every exponential at 1: its score is the weight
    itself in float64, so its winners are the weights' own top-k.
    Unchecked: callers validate.
    """
    b, v = weights.shape
    k = num_samples
    out_idx = torch.zeros(b, k, dtype=torch.int64, device=weights.device)
    best_val = torch.full((b, k), -1.0, dtype=torch.float64, device=weights.device)
    if b == 0:
        return (out_idx, best_val) if return_scores else out_idx
    step = chunk_size(b, v)
    for start in range(0, v, step):
        w = weights[:, start : start + step]
        first = column_offset + start
        scores = race_scores(w, prefix, first)
        if unit_rows is not None:
            scores = torch.where(unit_rows.view(-1, 1), w.to(torch.float64), scores)
        if k == 1:
            # argmax returns the first maximum; strict '>' keeps the earlier chunk on ties.
            val, idx = scores.max(dim=1, keepdim=True)
            take = val > best_val
            best_val = torch.where(take, val, best_val)
            out_idx = torch.where(take, idx + start, out_idx)
            continue
        # Candidates in ascending index order (previous winners all have smaller
        # indices than this chunk and are themselves ordered by (score desc,
        # index asc)); a stable descending sort then breaks ties by index.
        idx = torch.arange(start, start + w.shape[1], device=weights.device).expand(b, -1)
        cand_val = torch.cat([best_val, scores], dim=1)
        cand_idx = torch.cat([out_idx, idx], dim=1)
        order = torch.sort(cand_val, dim=1, descending=True, stable=True).indices[:, :k]
        best_val = cand_val.gather(1, order)
        out_idx = cand_idx.gather(1, order)
    return (out_idx, best_val) if return_scores else out_idx

