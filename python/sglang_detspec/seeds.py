"""Request seeds: fresh seeds for unseeded requests and the seeds of parallel samples.

Pure Python, no torch: the HTTP server's process assigns these at admission.

- :func:`fresh_seed`: 64 random bits for a sampled request sent without a seed.
- :func:`derive_sample_seed`: the seed of sample ``j`` of a request with
  ``n > 1`` parallel samples. Sample 0 keeps the request's seed, so ``n = 1``
  gives sample 0 of ``n = 4``. Sample ``j >= 1`` is two draws of the SAMPLE
  stream (``Stream.SAMPLE`` of ``ops/streams.py``), the same keyed
  MurmurHash3_x86_32 as every other draw (``ops/murmur.py``): ``h0``, ``h1``
  over ``[lo32(key), hi32(key), j, c]`` for ``c = 0, 1`` with
  ``key = (seed + salt) mod 2**64``, joined as ``(h1 << 32) | h0``. Hashing
  keeps sample seeds off the plain seed sequence (seed 42's sample 1 is not
  seed 43); the SAMPLE salt keeps them apart from every uniform the request's
  own draws read, which use the other salts at the same positions and columns.
"""

from __future__ import annotations

import secrets

from .ops.murmur import keyed_hash_int
from .ops.streams import U32, Stream
from .ops.seed_encoding import check_seed


def derive_sample_seed(seed: int, index: int) -> int:
    """The uint64 seed of parallel sample ``index`` of a request seeded with ``seed``.

    Args:
        seed: the request's seed, an int in [0, 2**64).
        index: the sample's index among the request's ``n`` samples, in [0, 2**32).

    Returns:
        ``seed`` for ``index == 0``; otherwise ``(h1 << 32) | h0`` with
        ``h_c = MurmurHash3_x86_32(seed 0)`` of the 16 little-endian bytes
        ``[lo32(key), hi32(key), index, c]``, ``key = (seed + Stream.SAMPLE.salt) mod 2**64``.

    Raises:
        ValueError: ``seed`` outside [0, 2**64) or ``index`` outside [0, 2**32)
            (bools and non-integers included); the message names the argument.
    """
    check_seed(seed, "seed")
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < U32:
        raise ValueError(f"index must be an int in [0, 2**32), got {index!r}")
    if index == 0:
        return seed
    h0, h1 = (keyed_hash_int(seed, index, c, salt=Stream.SAMPLE) for c in (0, 1))
    return (h1 << 32) | h0


def fresh_seed() -> int:
    """64 random bits from the operating system's CSPRNG: an int in [0, 2**64).

    A fresh seed per unseeded request keeps unseeded requests of one prompt
    apart and unrelated prompts off one shared stream.
    """
    return secrets.randbits(64)

