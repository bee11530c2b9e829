"""Keyed MurmurHash3 stream: torch reference, any device.

Every random number of the deterministic path is
``MurmurHash3_x86_32(message, seed=0)`` over 16 little-endian bytes
``[lo32(key), hi32(key), position, column]`` with
``key = (request_seed + stream_salt) mod 2**64`` (Appleby's MurmurHash3,
x86 32-bit variant), mapped to a float64 uniform by midpoint binning
``(h + 0.5) / 2**32``, strictly inside (0, 1).

torch has no general uint32 arithmetic, so words live in int64 and every
product is reduced mod 2**32 by splitting one factor into 16-bit halves: no
intermediate exceeds 2**49, so nothing overflows int64 on any device. The
constants are ``murmur.py``'s; ``murmur.keyed_hash_int`` is the same function
on Python ints.
"""

from __future__ import annotations

import torch

from .checks import as_column_tensor, as_position_tensor, as_seed_tensor, batch_of
from .murmur import C1, C2, FMIX1, FMIX2, MESSAGE_BYTES, MIX_ADD, MIX_MUL, R1, R2
from .streams import MASK32, U32, Stream, salt_value


def _mul32(a: torch.Tensor, c: int) -> torch.Tensor:
    # (a * c) mod 2**32 for a in [0, 2**32): a = hi * 2**16 + lo.
    lo = a & 0xFFFF
    hi = a >> 16
    return (lo * c + (((hi * c) & 0xFFFF) << 16)) & MASK32


def _rotl32(x: torch.Tensor, r: int) -> torch.Tensor:
    return ((x << r) | (x >> (32 - r))) & MASK32


def _scramble(k: torch.Tensor) -> torch.Tensor:
    return _mul32(_rotl32(_mul32(k, C1), R1), C2)


def _mix_block(h: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    h = _rotl32(h ^ _scramble(k), R2)
    return (_mul32(h, MIX_MUL) + MIX_ADD) & MASK32


def _finalize(h: torch.Tensor) -> torch.Tensor:
    h = h ^ MESSAGE_BYTES
    h = h ^ (h >> 16)
    h = _mul32(h, FMIX1)
    h = h ^ (h >> 13)
    h = _mul32(h, FMIX2)
    return h ^ (h >> 16)


def key_words(seeds: torch.Tensor, salts: torch.Tensor | int) -> tuple[torch.Tensor, torch.Tensor]:
    """Low and high 32-bit words of ``(seeds + salts) mod 2**64``.

    Args:
        seeds: int64 [B], uint64 bits.
        salts: a Python int in [0, 2**64), or an int64 tensor [B] of uint64 bits.

    Returns:
        ``(lo32, hi32)``, each int64 [B] in [0, 2**32).
    """
    s_lo = seeds & MASK32
    s_hi = (seeds >> 32) & MASK32  # arithmetic shift, masked: the uint64 high word
    if isinstance(salts, torch.Tensor):
        t_lo, t_hi = salts & MASK32, (salts >> 32) & MASK32
    else:
        t_lo, t_hi = salts & MASK32, salts >> 32
    lo = s_lo + t_lo
    hi = (s_hi + t_hi + (lo >> 32)) & MASK32
    return lo & MASK32, hi


def row_prefix(key_lo: torch.Tensor, key_hi: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Hash state after the three per-row words ``[lo32, hi32, position]``: int64 [B]."""
    h = torch.zeros_like(key_lo)
    h = _mix_block(h, key_lo)
    h = _mix_block(h, key_hi)
    return _mix_block(h, positions)


def hash_with_prefix(prefix: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
    """Finish the hash for every (row, column): int64 [B, C] in [0, 2**32).

    Args:
        prefix: int64 [B] from :func:`row_prefix`.
        columns: int64 [C] or [B, C] in [0, 2**32).
    """
    k = _scramble(columns)
    if k.dim() == 1:
        k = k.unsqueeze(0)
    h = _rotl32(prefix.unsqueeze(1) ^ k, R2)
    h = (_mul32(h, MIX_MUL) + MIX_ADD) & MASK32
    return _finalize(h)


def uniform_from_hash(h: torch.Tensor) -> torch.Tensor:
    """Midpoint binning ``(h + 0.5) / 2**32`` in float64: strictly inside (0, 1)."""
    return (h.to(torch.float64) + 0.5) * (1.0 / U32)


def keyed_hash(seeds, positions, columns, *, salt: int | Stream = 0) -> torch.Tensor:
    """MurmurHash3_x86_32 (seed 0) of ``[lo32(key), hi32(key), position, column]``.

    Args:
        seeds: int64 or uint64 tensor [B] (uint64 bits), a NumPy integer
            array, Python ints in [0, 2**64), or one int for every row.
        positions: integer tensor [B], NumPy array, Python ints in
            [0, 2**32), or one int for every row: absolute token positions.
        columns: integer tensor or Python ints [C] in [0, 2**32); a tensor
            on another device is copied to the seeds' device.
        salt: a :class:`Stream` or an int in [0, 2**64); ``key = seed + salt mod 2**64``.

    Returns:
        int64 [B, C]: the uint32 hash values. Device: that of ``seeds`` if it is
        a tensor, else of ``positions``, else CPU.

    Raises:
        ValueError: a seed outside uint64, a position or column outside
            [0, 2**32), mismatched lengths or devices, wrong dtypes.
    """
    device = _device_of(seeds, positions)
    batch = batch_of(seeds, positions)
    seeds_t = as_seed_tensor(seeds, batch, device)
    pos_t = as_position_tensor(positions, seeds_t.shape[0], device, True)
    cols = as_column_tensor(columns, device)
    lo, hi = key_words(seeds_t, salt_value(salt))
    return hash_with_prefix(row_prefix(lo, hi, pos_t), cols)


def hash_uniform(seeds, positions, columns, *, salt: int | Stream = 0) -> torch.Tensor:
    """Uniforms ``(h + 0.5) / 2**32`` of :func:`keyed_hash`: float64 [B, C] in (0, 1).

    The smallest value is 2**-33 (h = 0) and the largest 1 - 2**-33
    (h = 2**32 - 1), so ``-log(u)`` is always finite and positive.
    Arguments and errors as :func:`keyed_hash`.
    """
    return uniform_from_hash(keyed_hash(seeds, positions, columns, salt=salt))


def _device_of(*xs) -> torch.device:
    for x in xs:
        if isinstance(x, torch.Tensor):
            return x.device
    return torch.device("cpu")
