"""MurmurHash3_x86_32 building blocks for Triton kernels (uint32 arithmetic wraps).

Same message as the torch reference (hashing.py): ``[lo32(key), hi32(key),
position, column]`` with seed 0; the first three words are mixed once per
row (``row_prefix``), the column word per element (``hash_column``).
"""

import triton
import triton.language as tl

from . import murmur, streams

# A @triton.jit function may read a module global only if it is a tl.constexpr,
# so the constants of murmur.py and streams.py are wrapped here, once; a
# constexpr compiles exactly as the same literal would.
C1 = tl.constexpr(murmur.C1)
C2 = tl.constexpr(murmur.C2)
R1 = tl.constexpr(murmur.R1)
R2 = tl.constexpr(murmur.R2)
MIX_MUL = tl.constexpr(murmur.MIX_MUL)
MIX_ADD = tl.constexpr(murmur.MIX_ADD)
FMIX1 = tl.constexpr(murmur.FMIX1)
FMIX2 = tl.constexpr(murmur.FMIX2)
MESSAGE_BYTES = tl.constexpr(murmur.MESSAGE_BYTES)
MASK32 = tl.constexpr(streams.MASK32)
INV_2_32 = tl.constexpr(1.0 / streams.U32)  # 2**-32, exact in float64


@triton.jit
def _scramble(k):  # k: uint32, any shape
    k = k * C1
    k = (k << R1) | (k >> (32 - R1))
    return k * C2


@triton.jit
def _mix(h, k):  # h, k: uint32, broadcastable
    h = h ^ _scramble(k)
    h = (h << R2) | (h >> (32 - R2))
    return h * MIX_MUL + MIX_ADD


@triton.jit
def _mix_first(k):  # the first block of a seed-0 hash: h starts at 0
    h = _scramble(k)
    h = (h << R2) | (h >> (32 - R2))
    return h * MIX_MUL + MIX_ADD


@triton.jit
def row_prefix(seed, position, salt_lo, salt_hi):
    """Hash state after [lo32(seed + salt), hi32(seed + salt), position].

    seed: int64 scalar (uint64 bits); position: int64 scalar in [0, 2**32);
    salt_lo, salt_hi: int scalars in [0, 2**32). Returns a uint32 scalar.
    """
    s_lo = seed & MASK32
    s_hi = (seed >> 32) & MASK32  # arithmetic shift, masked: the uint64 high word
    lo = s_lo + salt_lo
    hi = (s_hi + salt_hi + (lo >> 32)) & MASK32
    lo = lo & MASK32
    h = _mix_first(lo.to(tl.uint32))
    h = _mix(h, hi.to(tl.uint32))
    return _mix(h, position.to(tl.uint32))


@triton.jit
def hash_column(prefix, column):
    """Finish the hash: prefix uint32 scalar, column uint32 [BLOCK] -> uint32 [BLOCK]."""
    h = _mix(prefix, column)
    h = h ^ MESSAGE_BYTES
    h = h ^ (h >> 16)
    h = h * FMIX1
    h = h ^ (h >> 13)
    h = h * FMIX2
    return h ^ (h >> 16)


@triton.jit
def inverse_exponential(h):
    """``1 / -log(u)`` in float64 with u = (h + 0.5) / 2**32; h: uint32 [BLOCK]."""
    u = (h.to(tl.float64) + 0.5) * INV_2_32
    return 1.0 / -tl.log(u)


@triton.jit
def exact_score(weight, h):
    """Race score ``w * (1 / -log(u))`` in float64 (SGLang's reciprocal-then-multiply).

    weight: [BLOCK] any float dtype; h: uint32 [BLOCK]. Returns float64 [BLOCK].
    """
    return weight.to(tl.float64) * inverse_exponential(h)


@triton.jit
def may_reach(weight, h, best):
    """float32 pre-filter: False only where ``exact_score(weight, h) < best`` for sure.

    weight: [BLOCK] float; h: uint32 [BLOCK]; best: float64 scalar, the running
    best exact score T. Since ``-log(u) >= 1 - u``, a score ``w / E >= T``
    needs ``1 - u <= w / T``; with ``d = 2**32 - 1 - h`` (exact in uint32),
    ``1 - u = (d + 0.5) / 2**32``, so the test is ``d <= w * 2**32 / T``. It is
    evaluated in float32 with 2**-10 relative and +1 absolute slack, far above
    the float32 rounding (a few 2**-24), so no lane that could reach ``best``
    is dropped. It costs no transcendental: an integer subtract, a convert and
    a multiply. For ``best`` below 1e-20 (nothing found yet, or float64 weights
    that underflow float32) every lane passes.
    """
    scale = (4294967296.0 / tl.maximum(best, 1e-20)).to(tl.float32) * 1.0009765625  # 2**32 / T * (1 + 2**-10)
    d = (MASK32 - h).to(tl.float32)
    return tl.where(best < 1e-20, d == d, d <= weight.to(tl.float32) * scale + 1.0)


@triton.jit
def split_argmax(best_v, best_i, BIG: tl.constexpr):
    """Per-lane bests [BLOCK] -> (max value, smallest index holding it)."""
    m = tl.max(best_v, axis=0)
    i = tl.min(tl.where(best_v == m, best_i, BIG), axis=0)
    return m, i
