"""MurmurHash3_x86_32: its constants and a pure-Python reference (no torch, no triton).

Source: MurmurHash3 by Austin Appleby (public domain), the x86 32-bit
variant, ``MurmurHash3_x86_32`` in smhasher's ``MurmurHash3.cpp``.

The hash is computed three ways: the torch op (``hashing.py``), the Triton
kernel blocks (``triton_hash.py``) and this module. The constants are written
only here, so the three cannot drift apart; each keeps its own arithmetic
because torch has no wrapping uint32 multiply, Triton's uint32 wraps natively
and Python's ints are unbounded. This module serves the paths that must not
load torch (request seeds in the HTTP server's process, ``seeds.py``) and the
tests, as the readable reference the other two are checked against.
"""

from __future__ import annotations

import struct

from .seed_encoding import check_seed
from .streams import MASK32, U32, U64, Stream, salt_value

C1 = 0xCC9E2D51  # block word multiplier before the rotation
C2 = 0x1B873593  # and after it
R1 = 15  # rotation of a block word
R2 = 13  # rotation of the running state after it takes a block
MIX_MUL = 5  # the state becomes h * MIX_MUL + MIX_ADD after each block
MIX_ADD = 0xE6546B64
FMIX1 = 0x85EBCA6B  # finaliser (fmix32) multipliers
FMIX2 = 0xC2B2AE35
MESSAGE_BYTES = 16  # a stream message: [lo32(key), hi32(key), position, column]


def rotl32(x: int, r: int) -> int:
    """``x`` (in [0, 2**32)) rotated left by ``r`` bits within 32 bits."""
    return ((x << r) | (x >> (32 - r))) & MASK32


def scramble(k: int) -> int:
    """A block word's contribution before it is xored into the state: an int in [0, 2**32)."""
    return (rotl32((k * C1) & MASK32, R1) * C2) & MASK32


def mix_block(h: int, k: int) -> int:
    """The state after taking the block word ``k``: an int in [0, 2**32)."""
    return (rotl32(h ^ scramble(k), R2) * MIX_MUL + MIX_ADD) & MASK32


def finalize(h: int, length: int) -> int:
    """fmix32 of the state after xoring in the message length: the hash, in [0, 2**32)."""
    h ^= length & MASK32
    h ^= h >> 16
    h = (h * FMIX1) & MASK32
    h ^= h >> 13
    h = (h * FMIX2) & MASK32
    return h ^ (h >> 16)


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
        h = mix_block(h, k)
    tail = data[4 * n_blocks:]
    if tail:
        # The tail is scrambled and xored in, but the state is not rotated or mixed after it.
        h ^= scramble(int.from_bytes(tail, "little"))
    return finalize(h, len(data))


def keyed_hash_int(seed: int, position: int, column: int, *, salt: int | Stream) -> int:
    """One draw of a keyed stream: the pure-Python form of ``hashing.keyed_hash``.

    ``MurmurHash3_x86_32`` (seed 0) of the 16 little-endian bytes
    ``[lo32(key), hi32(key), position, column]`` with
    ``key = (seed + salt) mod 2**64`` (docs/design.md §1).

    Args:
        seed: the request seed, an int in [0, 2**64).
        position: the absolute token position, an int in [0, 2**32).
        column: the stream's column, an int in [0, 2**32).
        salt: a :class:`Stream` or an int in [0, 2**64).

    Returns:
        The uint32 hash value, an int in [0, 2**32).

    Raises:
        ValueError: an argument outside its range, a bool or a non-int; the
            message names the argument.
    """
    check_seed(seed, "seed")
    for name, word in (("position", position), ("column", column)):
        if isinstance(word, bool) or not isinstance(word, int) or not 0 <= word < U32:
            raise ValueError(f"{name} must be an int in [0, 2**32), got {word!r}")
    key = (seed + salt_value(salt)) % U64
    return murmur3_x86_32(struct.pack("<4I", key & MASK32, key >> 32, position, column))
