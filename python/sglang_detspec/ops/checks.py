"""Argument checks shared by every op.

Every bad input raises ``ValueError`` naming the argument and the bound; no op
silently wraps a seed, a position or a column. Value checks (ranges, NaN) read
the tensor back to the host, so callers inside CUDA-graph capture pass
``check=False`` and keep only the metadata checks (shape, dtype, device).
"""

from __future__ import annotations

import operator
from collections.abc import Sequence

import torch

from .choices import one_of
from .seed_encoding import SEED_RANGE, to_int64
from .streams import U32

INT_DTYPES = (torch.int64, torch.int32)
POSITION_DTYPES = (torch.int64, torch.int32, torch.uint32, torch.uint64)
PROB_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


SEED_FORMS = (
    "an int64 tensor [B] (uint64 bits, SGLang's carrier), a torch.uint64 tensor [B], "
    f"a NumPy integer array [B], a sequence of ints in {SEED_RANGE}, or one int for every row"
)
POSITION_FORMS = (
    "an integer tensor [B], a NumPy integer array [B], a sequence of ints, or one int for every row"
)


def batch_of(*values) -> int | None:
    """The row count of the first argument that is not a scalar (None if all are)."""
    for v in values:
        if _is_scalar(v):
            continue
        if isinstance(v, torch.Tensor):
            return v.shape[0] if v.dim() else None
        try:
            return len(v)
        except TypeError:
            return None
    return None


def _is_scalar(value) -> bool:
    if isinstance(value, torch.Tensor):
        return value.dim() == 0
    if _is_ndarray(value):
        return value.ndim == 0
    return not isinstance(value, bool) and hasattr(value, "__index__")


def _is_ndarray(value) -> bool:
    return type(value).__module__ == "numpy" and type(value).__name__ == "ndarray"


def _broadcast(t: torch.Tensor, batch: int | None) -> torch.Tensor:
    # A real [B] copy, not an expanded view: kernels index it per row.
    return t.reshape(1).expand(1 if batch is None else batch).contiguous()


def as_seed_tensor(seeds, batch: int | None, device: torch.device) -> torch.Tensor:
    """Seeds as an int64 [B] tensor holding the uint64 bits.

    Accepted forms: an int64 tensor (SGLang's carrier type; its bits are read
    as uint64, so every value is valid); a ``torch.uint64`` tensor (its bits
    are reinterpreted, no value changes); a NumPy integer array (``uint64``
    reinterpreted, signed dtypes must hold values >= 0); a sequence of ints in
    ``[0, 2**64)``; one int (Python, NumPy or a 0-d tensor) used for every row.
    Tensors and arrays are 1-D [B]; tensors must already be on ``device``.

    Raises:
        ValueError: another dtype (the message says what to pass), wrong
            shape or device, or a seed outside uint64.
    """
    if isinstance(seeds, torch.Tensor):
        if seeds.dtype == torch.uint64:
            t = seeds.view(torch.int64)
        elif seeds.dtype == torch.int64:
            t = seeds
        else:
            raise ValueError(
                f"seeds must be an int64 tensor (uint64 bits) or a torch.uint64 tensor, got dtype {seeds.dtype}; "
                "for non-negative values pass seeds.to(torch.int64)"
            )
        if t.dim() == 0:
            t = _broadcast(t, batch)
    elif _is_ndarray(seeds):
        t = _numpy_to_tensor("seeds", seeds, device, uint64_bits=True)
        if t.dim() == 0:
            t = _broadcast(t, batch)
    elif _is_scalar(seeds):
        t = _broadcast(torch.tensor(_seed_bits("seeds", seeds), dtype=torch.int64, device=device), batch)
    elif isinstance(seeds, Sequence) and not isinstance(seeds, (str, bytes)):
        vals = [_seed_bits(f"seeds[{i}]", s) for i, s in enumerate(seeds)]
        t = torch.tensor(vals, dtype=torch.int64, device=device)
    else:
        raise ValueError(f"seeds must be {SEED_FORMS}; got {type(seeds).__name__}")
    _check_vector("seeds", t, batch, device)
    return t.contiguous()  # kernels index seeds by row


def _seed_bits(name: str, value) -> int:
    """A Python or NumPy integer seed as the int64 with its uint64 bits.

    Raises:
        ValueError: a bool or float, or an int outside uint64 [0, 2**64).
    """
    s = _as_int(name, value)
    try:
        return to_int64(s, name)
    except ValueError:
        # The range rule is check_seed's; the ops word it as every other bound here.
        raise ValueError(f"{name} = {s} is outside uint64 {SEED_RANGE}") from None


def _numpy_to_tensor(name: str, arr, device: torch.device, *, uint64_bits: bool) -> torch.Tensor:
    """An integer NumPy array as int64 on ``device``; uint64 seeds keep their bits."""
    import numpy as np

    if not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{name} as a NumPy array must have an integer dtype, got {arr.dtype}")
    if arr.dtype == np.uint64:
        if uint64_bits:
            return torch.from_numpy(np.ascontiguousarray(arr).view(np.int64)).to(device)
        if arr.size and int(arr.max()) >= 1 << 63:
            raise ValueError(f"{name} holds {int(arr.max())}, outside [0, 2**32)")
    elif np.issubdtype(arr.dtype, np.signedinteger) and arr.size and int(arr.min()) < 0:
        bound = f"uint64 {SEED_RANGE}" if uint64_bits else "[0, 2**32)"
        raise ValueError(f"{name} holds {int(arr.min())}, outside {bound}")
    return torch.from_numpy(np.ascontiguousarray(arr).astype(np.int64)).to(device)


def as_position_tensor(
    positions, batch: int | None, device: torch.device, check: bool, *, span: int = 1, name: str = "positions"
) -> torch.Tensor:
    """Absolute positions as int64 [B]; ``positions + span - 1`` must stay below 2**32.

    ``span`` is how many consecutive positions each row uses from its start
    (``K + 1`` for a chain verify), so the last one is checked too. Accepted
    forms: an integer tensor (int64, int32, uint32 or uint64) [B] on
    ``device``, a NumPy integer array [B], a sequence of ints, or one int
    (Python, NumPy or a 0-d tensor) used for every row.

    Raises:
        ValueError: wrong dtype, shape, device, or a position outside [0, 2**32 - span].
    """
    if isinstance(positions, torch.Tensor):
        if positions.dtype not in POSITION_DTYPES:
            raise ValueError(
                f"{name} must be an integer tensor ({one_of(POSITION_DTYPES)}), got dtype {positions.dtype}"
            )
        t = positions.to(torch.int64)
        if t.dim() == 0:
            t = _broadcast(t, batch)
    elif _is_ndarray(positions):
        # Host data: its range costs no device read, so it is checked even with check=False.
        if positions.size and positions.dtype.kind in "iu" and int(positions.max()) > U32 - span:
            raise ValueError(f"{name} holds {int(positions.max())}, outside [0, 2**32 - {span}]")
        t = _numpy_to_tensor(name, positions, device, uint64_bits=False)
        if t.dim() == 0:
            t = _broadcast(t, batch)
    elif _is_scalar(positions) or (isinstance(positions, Sequence) and not isinstance(positions, (str, bytes))):
        scalar = _is_scalar(positions)
        items = [positions] if scalar else positions
        vals = [_as_int(name if scalar else f"{name}[{i}]", p) for i, p in enumerate(items)]
        for i, p in enumerate(vals):
            if not 0 <= p <= U32 - span:
                label = name if scalar else f"{name}[{i}]"
                raise ValueError(f"{label} = {p} is outside [0, 2**32 - {span}]")
        t = torch.tensor(vals, dtype=torch.int64, device=device)
        if scalar:
            t = _broadcast(t, batch)
    else:
        raise ValueError(f"{name} must be {POSITION_FORMS}; got {type(positions).__name__}")
    _check_vector(name, t, batch, device)
    t = t.contiguous()
    if check and t.numel():
        lo, hi = int(t.min()), int(t.max())
        if lo < 0 or hi > U32 - span:
            bad = lo if lo < 0 else hi
            raise ValueError(
                f"{name} holds {bad}, outside [0, 2**32 - {span}]: the hash position word is uint32"
                + (f" and each row uses {span} consecutive positions" if span > 1 else "")
            )
    return t


def _as_int(name: str, value) -> int:
    """A Python or NumPy integer as int; bools and floats are refused."""
    if isinstance(value, bool):
        raise ValueError(f"{name} must be an int, got bool")
    try:
        return operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must be an int, got {type(value).__name__}") from None


def as_column_tensor(columns, device: torch.device) -> torch.Tensor:
    """Hash columns as int64 [C] on ``device``, each in [0, 2**32).

    Raises:
        ValueError: not a 1-D integer tensor or sequence of ints, or a column
            outside [0, 2**32).
    """
    if isinstance(columns, torch.Tensor):
        if columns.dtype not in INT_DTYPES:
            raise ValueError(f"columns must be an {one_of(INT_DTYPES)} tensor, got dtype {columns.dtype}")
        c = columns.to(device=device, dtype=torch.int64)
    elif isinstance(columns, (Sequence, range)) and not isinstance(columns, (str, bytes)):
        vals = [_as_int(f"columns[{i}]", x) for i, x in enumerate(columns)]
        for i, x in enumerate(vals):
            if not 0 <= x < U32:
                raise ValueError(f"columns[{i}] = {x} is outside [0, 2**32)")
        c = torch.tensor(vals, dtype=torch.int64, device=device)
    else:
        raise ValueError(f"columns must be an integer tensor or a sequence of ints, got {type(columns).__name__}")
    if c.dim() != 1:
        raise ValueError(f"columns must be 1-D [C], got shape {tuple(c.shape)}")
    if c.numel() and (int(c.min()) < 0 or int(c.max()) >= U32):
        raise ValueError(f"columns must lie in [0, 2**32), got range [{int(c.min())}, {int(c.max())}]")
    return c


def _check_vector(name: str, t: torch.Tensor, batch: int | None, device: torch.device) -> None:
    if t.dim() != 1:
        raise ValueError(f"{name} must be 1-D [B], got shape {tuple(t.shape)}")
    if batch is not None and t.shape[0] != batch:
        raise ValueError(f"{name} has {t.shape[0]} rows but the batch has B = {batch}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but the other tensors are on {device}")


# float64 weights above this overflow the race score w / E (E >= 1.2e-10).
MAX_FLOAT64_WEIGHT = 1e290
# Sum-to-one tolerance of probability rows, by dtype (float32 softmax over
# 262,144 entries stays far inside 1e-3).
_SUM_TOL = {torch.float64: 1e-6, torch.float32: 1e-3, torch.float16: 2e-2, torch.bfloat16: 2e-2}


def check_probs(
    name: str, t: torch.Tensor, dims: int, check: bool, *, row_sum_positive: bool = True, normalised: bool = False
) -> None:
    """Probability/weight tensor: float dtype, ``dims`` dims, finite and >= 0.

    float64 weights must also be normal (no subnormal positives) and at most
    1e290, where the race score ``w * (1 / -log(u))`` would lose its precision or
    overflow; ``normalised`` rows must sum to 1 within the dtype's tolerance.

    Raises:
        ValueError: wrong type, dtype or rank; NaN, infinite or negative
            entries; float64 entries that are subnormal or above 1e290; a row
            (last dim) that is all zero when ``row_sum_positive``; a row whose
            sum is off 1 when ``normalised``.
    """
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a tensor, got {type(t).__name__}")
    if t.dtype not in PROB_DTYPES:
        raise ValueError(f"{name} must be a floating tensor of dtype {one_of(PROB_DTYPES)}, got dtype {t.dtype}")
    if t.dim() != dims:
        raise ValueError(f"{name} must have {dims} dims, got shape {tuple(t.shape)}")
    if t.shape[-1] == 0:
        raise ValueError(f"{name} has an empty vocabulary (last dim V = 0); V must be >= 1")
    if not check or t.numel() == 0:
        return
    if bool(torch.isnan(t).any()):
        raise ValueError(f"{name} contains NaN; {name} must be finite and >= 0")
    if bool(torch.isinf(t).any()):
        raise ValueError(f"{name} contains inf; {name} must be finite and >= 0")
    if bool((t < 0).any()):
        raise ValueError(f"{name} contains negative entries (min {float(t.min())}); {name} must be >= 0")
    if t.dtype == torch.float64:
        if bool((t > MAX_FLOAT64_WEIGHT).any()):
            raise ValueError(f"{name} holds {float(t.max())}, above 1e290: the race score would overflow")
        tiny = (t > 0) & (t < torch.finfo(torch.float64).tiny)
        if bool(tiny.any()):
            raise ValueError(f"{name} holds subnormal entries (below 2.2e-308): set them to 0 or rescale the row")
    if row_sum_positive and bool((t.amax(dim=-1) == 0).any()):
        idx = (t.amax(dim=-1) == 0).nonzero()[0].tolist()
        raise ValueError(f"{name} has an all-zero row at index {idx}; at least one weight must be > 0")
    if normalised:
        err = (t.sum(dim=-1, dtype=torch.float64) - 1.0).abs()
        tol = _SUM_TOL[t.dtype]
        if bool((err > tol).any()):
            idx = (err > tol).nonzero()[0].tolist()
            raise ValueError(
                f"{name} row {idx} sums to {float(t[tuple(idx)].double().sum())}, "
                f"not 1 within {tol}: verification needs probability distributions"
            )


def check_draft_tokens(draft_tokens) -> tuple[int, int]:
    """Metadata of chain draft tokens: an int64/int32 tensor [B, K]; returns ``(B, K)``.

    Raises:
        ValueError: not an int64/int32 tensor, or not 2-D.
    """
    if not isinstance(draft_tokens, torch.Tensor) or draft_tokens.dtype not in INT_DTYPES:
        got = draft_tokens.dtype if isinstance(draft_tokens, torch.Tensor) else type(draft_tokens).__name__
        raise ValueError(f"draft_tokens must be an {one_of(INT_DTYPES)} tensor [B, K], got {got}")
    if draft_tokens.dim() != 2:
        raise ValueError(f"draft_tokens must be 2-D [B, K], got shape {tuple(draft_tokens.shape)}")
    return tuple(draft_tokens.shape)


def check_token_range(name: str, tokens: torch.Tensor, vocab: int) -> None:
    """Every id in ``tokens`` lies in [0, V) (reads the tensor back to the host).

    Raises:
        ValueError: naming ``name``, the offending id and V.
    """
    if tokens.numel():
        lo, hi = int(tokens.min()), int(tokens.max())
        if lo < 0 or hi >= vocab:
            raise ValueError(f"{name} holds {lo if lo < 0 else hi}, outside [0, V = {vocab})")


def check_columns_fit(name: str, first_column: int, vocab: int) -> None:
    """Columns ``first_column .. first_column + vocab - 1`` must stay below 2**32."""
    if first_column < 0 or first_column + vocab > U32:
        raise ValueError(
            f"{name}: columns up to {first_column + vocab - 1} reach 2**32; "
            f"the hash column word is uint32 (vocab V = {vocab})"
        )


def check_chain_args(draft_tokens, target_probs, seeds, positions, check: bool, *, draft_probs=None):
    """The arguments both chain verifies share (``verify.verify_chain``, ``coupled.coupled_verify_chain``).

    ``draft_tokens`` int64/int32 [B, K]; ``target_probs`` float [B, K+1, V];
    with ``draft_probs`` (rejection sampling) float [B, K, V] of the same
    dtype and device, and both rows normalised. Shapes, dtypes and devices are
    checked first, so a mismatch is named as such; values only with ``check``
    (reads tensors back to the host).

    Returns:
        ``(B, K, V, device, seeds int64 [B], positions int64 [B])``.

    Raises:
        ValueError: naming the argument: shape, dtype or device mismatch
            (including K); draft tokens outside [0, V); NaN, inf or negative
            probabilities, an all-zero row, or (with ``draft_probs``) a row
            not summing to 1; a seed outside uint64; t + K outside [0, 2**32).
    """
    b, k = check_draft_tokens(draft_tokens)
    if draft_probs is not None:
        check_probs("draft_probs", draft_probs, 3, False)
    check_probs("target_probs", target_probs, 3, False)
    v = target_probs.shape[2]
    if draft_probs is not None and tuple(draft_probs.shape) != (b, k, v):
        raise ValueError(f"draft_probs must be [B, K, V] = {(b, k, v)}, got {tuple(draft_probs.shape)}")
    if tuple(target_probs.shape) != (b, k + 1, v):
        raise ValueError(f"target_probs must be [B, K+1, V] = {(b, k + 1, v)}, got {tuple(target_probs.shape)}")
    if draft_probs is not None and draft_probs.dtype != target_probs.dtype:
        raise ValueError(
            f"draft_probs ({draft_probs.dtype}) and target_probs ({target_probs.dtype}) must share a dtype: "
            "the residual max(p - q, 0) is computed in it"
        )
    dev = target_probs.device
    for name, t in (("draft_tokens", draft_tokens), ("draft_probs", draft_probs)):
        if t is not None and t.device != dev:
            raise ValueError(f"{name} is on {t.device} but target_probs is on {dev}")
    check_columns_fit("token ids", 0, v)
    if draft_probs is not None:
        check_probs("draft_probs", draft_probs, 3, check, normalised=True)
    check_probs("target_probs", target_probs, 3, check, normalised=draft_probs is not None)
    seeds_t = as_seed_tensor(seeds, b, dev)
    pos_t = as_position_tensor(positions, b, dev, check, span=k + 1)
    if check:
        check_token_range("draft_tokens", draft_tokens, v)
    return b, k, v, dev, seeds_t, pos_t
