"""Request seeds: fresh seeds for unseeded requests and the seeds of parallel samples.

Pure Python, no torch: the HTTP server's process assigns these at admission.

- :func:`fresh_seed`: 64 random bits for a sampled request sent without a seed.
- :func:`derive_sample_seed`: the seed of sample ``j`` of a request with
  ``n > 1`` parallel samples. Sample 0 keeps the request's seed, so ``n = 1``
  gives sample 0 of ``n = 4``. Sample ``j >= 1`` hashes the request seed on
  the SAMPLE stream (salt ``Stream.SAMPLE`` of ``ops/streams.py``) with
  MurmurHash3_x86_32 (Austin Appleby's MurmurHash3, x86 32-bit variant, seed 0),
  the same hash and message layout as every other keyed draw: two 32-bit
  halves ``h0``, ``h1`` over ``[lo32(key), hi32(key), j, c]`` for ``c = 0, 1``
  with ``key = (seed + salt) mod 2**64``, joined as ``(h1 << 32) | h0``. The
  salt keeps sample seeds off the plain seed sequence: seed 42's sample 1 is
  not seed 43.
"""

from __future__ import annotations

import secrets
import struct

from .seed_encoding import U64, check_seed

U32 = 1 << 32
_MASK32 = U32 - 1

# Stream.SAMPLE's salt ("SAMPLE" in ASCII); ops/streams.py holds the same value,
# repeated here so that this module needs no torch.
SAMPLE_SALT = 0x53414D504C450000

_C1 = 0xCC9E2D51
_C2 = 0x1B873593


def _rotl32(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _MASK32


def murmur3_x86_32(data: bytes, seed: int = 0) -> int:
    """MurmurHash3_x86_32 of ``data`` (Appleby's x86 32-bit variant): an int in [0, 2**32).

    Args:
        data: the message; its length need not be a multiple of 4.
        seed: the hash seed, in [0, 2**32).

    Raises:
        ValueError: ``data`` is not bytes, or ``seed`` is outside [0, 2**32).
    """
    if not isinstance(data, (bytes, bytearray)):
        raise ValueError(f"data must be bytes, got {type(data).__name__}")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < U32:
        raise ValueError(f"seed must be an int in [0, 2**32), got {seed!r}")
    h = seed
    n_blocks = len(data) // 4
    for (k,) in struct.iter_unpack("<I", data[: 4 * n_blocks]):
        k = _rotl32((k * _C1) & _MASK32, 15) * _C2 & _MASK32
        h = (_rotl32(h ^ k, 13) * 5 + 0xE6546B64) & _MASK32
    tail = data[4 * n_blocks:]
    if tail:
        k = int.from_bytes(tail, "little")
        h ^= _rotl32((k * _C1) & _MASK32, 15) * _C2 & _MASK32
    h ^= len(data) & _MASK32
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & _MASK32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & _MASK32
    return h ^ (h >> 16)


def derive_sample_seed(seed: int, index: int) -> int:
    """The uint64 seed of parallel sample ``index`` of a request seeded with ``seed``.

    Args:
        seed: the request's seed, an int in [0, 2**64).
        index: the sample's index among the request's ``n`` samples, in [0, 2**32).

    Returns:
        ``seed`` for ``index == 0``; otherwise ``(h1 << 32) | h0`` with
        ``h_c = MurmurHash3_x86_32(seed 0)`` of the 16 little-endian bytes
        ``[lo32(key), hi32(key), index, c]``, ``key = (seed + SAMPLE_SALT) mod 2**64``.

    Raises:
        ValueError: ``seed`` outside [0, 2**64) or ``index`` outside [0, 2**32)
            (bools and non-integers included); the message names the argument.
    """
    check_seed(seed, "seed")
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < U32:
        raise ValueError(f"index must be an int in [0, 2**32), got {index!r}")
    if index == 0:
        return seed
    key = (seed + SAMPLE_SALT) % U64
    h0, h1 = (murmur3_x86_32(struct.pack("<4I", key & _MASK32, key >> 32, index, c)) for c in (0, 1))
    return (h1 << 32) | h0


def fresh_seed() -> int:
    """64 random bits from the operating system's CSPRNG: an int in [0, 2**64).

    A fresh seed per unseeded request keeps unseeded requests of one prompt
    apart and unrelated prompts off one shared stream.
    """
    return secrets.randbits(64)

