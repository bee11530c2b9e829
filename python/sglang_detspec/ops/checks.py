"""Argument checks shared by every op.

Every bad input raises ``ValueError`` naming the argument and the bound; no op
silently wraps a seed, a position or a column. Value checks (ranges, NaN) read
the tensor back to the host, so callers inside CUDA-graph capture pass
``check=False`` and keep only the metadata checks (shape, dtype, device).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .streams import U32, U64

INT_DTYPES = (torch.int64, torch.int32)
PROB_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def as_seed_tensor(seeds, batch: int | None, device: torch.device, check: bool) -> torch.Tensor:
    """Seeds as an int64 tensor holding the uint64 bits.

    A tensor must be int64 (SGLang's carrier type; its bits are read as
    uint64, so every value is valid). A Python sequence must hold ints in
    ``[0, 2**64)``.

    Raises:
        ValueError: wrong dtype, shape, device, or a Python seed outside uint64.
    """
    if isinstance(seeds, torch.Tensor):
        if seeds.dtype != torch.int64:
            raise ValueError(f"seeds must be an int64 tensor (uint64 bits), got dtype {seeds.dtype}")
        t = seeds
    elif isinstance(seeds, Sequence) and not isinstance(seeds, (str, bytes)):
        vals = []
        for i, s in enumerate(seeds):
            if isinstance(s, bool) or not isinstance(s, int):
                raise ValueError(f"seeds[{i}] must be an int, got {type(s).__name__}")
            if not 0 <= s < U64:
                raise ValueError(f"seeds[{i}] = {s} is outside uint64 [0, 2**64)")
            vals.append(s - U64 if s >= 1 << 63 else s)
        t = torch.tensor(vals, dtype=torch.int64, device=device)
    else:
        raise ValueError(f"seeds must be an int64 tensor or a sequence of ints, got {type(seeds).__name__}")
    _check_vector("seeds", t, batch, device)
    return t


def as_position_tensor(
    positions, batch: int | None, device: torch.device, check: bool, *, span: int = 1, name: str = "positions"
) -> torch.Tensor:
    """Absolute positions as int64; ``positions + span - 1`` must stay below 2**32.

    ``span`` is how many consecutive positions each row uses from its start
    (``K + 1`` for a chain verify), so the last one is checked too.

    Raises:
        ValueError: wrong dtype, shape, device, or a position outside [0, 2**32 - span].
    """
    if isinstance(positions, torch.Tensor):
        if positions.dtype not in INT_DTYPES:
            raise ValueError(f"{name} must be an int64 or int32 tensor, got dtype {positions.dtype}")
        t = positions.to(torch.int64)
    elif isinstance(positions, Sequence) and not isinstance(positions, (str, bytes)):
        for i, p in enumerate(positions):
            if isinstance(p, bool) or not isinstance(p, int):
                raise ValueError(f"{name}[{i}] must be an int, got {type(p).__name__}")
            if not 0 <= p <= U32 - span:
                raise ValueError(f"{name}[{i}] = {p} is outside [0, 2**32 - {span}]")
        t = torch.tensor(list(positions), dtype=torch.int64, device=device)
    else:
        raise ValueError(f"{name} must be an integer tensor or a sequence of ints, got {type(positions).__name__}")
    _check_vector(name, t, batch, device)
    if check and t.numel():
        lo, hi = int(t.min()), int(t.max())
        if lo < 0 or hi > U32 - span:
            bad = lo if lo < 0 else hi
            raise ValueError(
                f"{name} holds {bad}, outside [0, 2**32 - {span}]: the hash position word is uint32"
                + (f" and each row uses {span} consecutive positions" if span > 1 else "")
            )
    return t


def _check_vector(name: str, t: torch.Tensor, batch: int | None, device: torch.device) -> None:
    if t.dim() != 1:
        raise ValueError(f"{name} must be 1-D [B], got shape {tuple(t.shape)}")
    if batch is not None and t.shape[0] != batch:
        raise ValueError(f"{name} has {t.shape[0]} rows but the batch has B = {batch}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but the other tensors are on {device}")


def check_probs(name: str, t: torch.Tensor, dims: int, check: bool, *, row_sum_positive: bool = True) -> None:
    """Probability/weight tensor: float dtype, ``dims`` dims, finite and >= 0.

    Raises:
        ValueError: wrong dtype or rank; NaN, infinite or negative entries; a
            row (last dim) that is all zero when ``row_sum_positive``.
    """
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a tensor, got {type(t).__name__}")
    if t.dtype not in PROB_DTYPES:
        raise ValueError(f"{name} must be a floating tensor {PROB_DTYPES}, got dtype {t.dtype}")
    if t.dim() != dims:
        raise ValueError(f"{name} must have {dims} dims, got shape {tuple(t.shape)}")
    if t.shape[-1] == 0:
        raise ValueError(f"{name} has an empty vocabulary (last dim V = 0); V must be >= 1")
    if not check or t.numel() == 0:
        return
    if bool(torch.isnan(t).any()):
        raise ValueError(f"{name} contains NaN; weights must be finite and >= 0")
    if bool(torch.isinf(t).any()):
        raise ValueError(f"{name} contains inf; weights must be finite and >= 0")
    if bool((t < 0).any()):
        raise ValueError(f"{name} contains negative entries (min {float(t.min())}); weights must be >= 0")
    if row_sum_positive and bool((t.amax(dim=-1) == 0).any()):
        idx = (t.amax(dim=-1) == 0).nonzero()[0].tolist()
        raise ValueError(f"{name} has an all-zero row at index {idx}; at least one weight must be > 0")


def check_columns_fit(name: str, first_column: int, vocab: int) -> None:
    """Columns ``first_column .. first_column + vocab - 1`` must stay below 2**32."""
    if first_column < 0 or first_column + vocab > U32:
        raise ValueError(
            f"{name}: columns up to {first_column + vocab - 1} reach 2**32; "
            f"the hash column word is uint32 (vocab V = {vocab})"
        )
