"""Public exponential race: the seeded categorical draw (Gumbel-max), top-k too.

Checks its arguments, then runs the fused Triton kernel (``race_triton``) for
CUDA tensors when Triton is present, or the torch reference (``race_ref``)
elsewhere; the two agree bit for bit on the same CUDA device.
"""

from __future__ import annotations

import torch

from .checks import as_position_tensor, as_seed_tensor, check_columns_fit, check_probs
from .hashing import key_words, row_prefix
from .kernel_choice import use_triton
from .race_ref import race_reference
from .streams import Stream


def exponential_race(
    weights: torch.Tensor,
    seeds,
    positions,
    *,
    stream: Stream | str,
    draft_step: int = 0,
    num_samples: int = 1,
    check: bool = True,
    kernel: str = "auto",
    return_scores: bool = False,
    unit_rows: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Seeded categorical draw by exponential race (Gumbel-max), docs/design.md §3.

    Row b draws ``argmax_i w[b, i] * (1 / -log(u_i))`` with ``u_i`` the keyed
    uniform of (seeds[b] + stream salt, positions[b], column of token i);
    ties go to the smaller index. Distributed as ``w[b] / sum(w[b])`` without
    normalising; ``num_samples = k > 1`` returns the k largest scores in
    descending order, i.e. k draws without replacement (Gumbel-top-k,
    Plackett-Luce).

    Args:
        weights: [B, V] float16/bfloat16/float32/float64, finite, >= 0, each
            row with a positive entry. Need not sum to 1.
        seeds: int64 tensor [B] (uint64 bits, as SGLang carries
            ``sampling_seed``), a torch.uint64 tensor, a NumPy integer array,
            ints in [0, 2**64), or one int for every row.
        positions: integer tensor [B], NumPy array, ints, or one int for
            every row: absolute position, in the request's full sequence, of
            the token being drawn; < 2**32.
        stream: which stream (:class:`Stream` or its name).
        draft_step: DRAFT stream only: draft step / MTP layer; the columns are
            ``draft_step * V + token_id`` and must stay below 2**32.
        num_samples: k in [1, V]; with ``check`` every row needs k positive weights.
        check: run the value checks (NaN, sign, ranges), which read tensors back
            to the host; pass False inside CUDA-graph capture. Shape, dtype and
            device checks always run.
        kernel: ``"auto"`` (Triton for CUDA tensors), ``"torch"`` or ``"triton"``.
        return_scores: also return each winner's race score ``w * (1 / -log(u))``
            (float64, the value the race compared; ``keys.race_keys`` of the
            winners), so a caller that weighs the winners against each other
            needs no second pass over their uniforms.
        unit_rows: bool [B] on the weights' device, or None: rows that race
            with every exponential at 1, i.e. draw nothing: their winners are
            the weights' own top-k (ties to the smaller index) and their scores
            the weights in float64. For callers that mix rows which sample with
            rows that take the most likely tokens (greedy drafts) in one launch.

    Returns:
        int64 [B, num_samples] token ids, on the weights' device; with
        ``return_scores`` the pair ``(ids, float64 [B, num_samples] scores)``.

    Memory: the torch reference walks V in chunks of ``clamp(2**20 // B, 1024, V)``
    columns, so its extra memory is about 64 MiB at most (8 temporaries of
    2**20 8-byte elements) plus [B, k] state, never a [B, V] float64 matrix.
    The Triton kernel keeps everything in registers plus a [B, splits, k] partial.

    Raises:
        ValueError: bad shapes, dtypes or devices (``unit_rows`` included); NaN, inf or negative weights;
            float64 weights that are subnormal or above 1e290; an all-zero row; fewer than k positive weights in a row; a seed
            outside uint64; a position outside [0, 2**32); draft_step * V + V
            above 2**32; draft_step given for a stream other than DRAFT; an
            unknown ``kernel`` (None included).
    """
    stream = Stream.parse(stream)
    check_probs("weights", weights, 2, check)
    b, v = weights.shape
    dev = weights.device
    if isinstance(num_samples, bool) or not isinstance(num_samples, int) or not 1 <= num_samples <= v:
        raise ValueError(f"num_samples must be an int in [1, V = {v}], got {num_samples!r}")
    if isinstance(draft_step, bool) or not isinstance(draft_step, int) or draft_step < 0:
        raise ValueError(f"draft_step must be a non-negative int, got {draft_step!r}")
    if draft_step and stream is not Stream.DRAFT:
        raise ValueError(f"draft_step applies to the DRAFT stream only, got draft_step={draft_step} for {stream.name}")
    column_offset = draft_step * v
    check_columns_fit(f"draft_step * V (draft_step={draft_step}, V={v})", column_offset, v)
    if unit_rows is not None and (unit_rows.dtype != torch.bool or tuple(unit_rows.shape) != (b,)
                                  or unit_rows.device != dev):
        raise ValueError(f"unit_rows must be a bool tensor of shape ({b},) on {dev}, got {unit_rows.dtype} "
                         f"{tuple(unit_rows.shape)} on {unit_rows.device}")
    seeds_t = as_seed_tensor(seeds, b, dev)
    pos_t = as_position_tensor(positions, b, dev, check)
    if check and num_samples > 1 and b:
        short = (weights > 0).sum(dim=1) < num_samples
        if bool(short.any()):
            row = int(short.nonzero()[0])
            raise ValueError(
                f"num_samples={num_samples} draws without replacement, but weights row {row} has only "
                f"{int((weights[row] > 0).sum())} positive entries"
            )
    if b == 0:
        empty = torch.zeros(0, num_samples, dtype=torch.int64, device=dev)
        return (empty, empty.to(torch.float64)) if return_scores else empty
    if use_triton(kernel, dev):
        from .race_triton import race_triton

        return race_triton(weights, seeds_t, pos_t, stream.salt, column_offset, num_samples,
                           return_scores=return_scores, unit_rows=unit_rows)
    lo, hi = key_words(seeds_t, stream.salt)
    return race_reference(weights, row_prefix(lo, hi, pos_t), column_offset, num_samples,
                          return_scores=return_scores, unit_rows=unit_rows)
