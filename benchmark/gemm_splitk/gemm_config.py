"""Configuration of the batch-invariant GEMM: the reduction order and the tilings.

Two kinds of data, kept apart on purpose:

- :class:`KOrder` fixes the arithmetic of every output element: ``block_k``
  (the k-step of the Triton loop) and ``splits`` S (K is cut into S
  contiguous chunks of ``chunk_len`` columns, each summed from zero in fp32,
  the chunk sums added as ``((p0 + p1) + p2) + ...``). It is looked up from
  (N, K, dtype) only (:func:`k_order`), so no batch size can change a row's bits.
- :class:`Tiling` is the physical schedule of one M bucket: ``split`` (S
  programs per output tile write fp32 partials, a second kernel adds them
  in the fixed order: many programs for the memory-bound small-M case) or
  ``fused`` (one program sums the S chunks one after another in registers),
  and the tile sizes along M and N. A tiling may change speed, never bits;
  the GPU tests (``test_gemm_cuda.py``) check that claim for every bucket
  boundary, and :data:`VARIANTS` lets the benchmark compare tables side by side.

A :class:`GemmTable` is plain data: choosing another table after a
measurement changes :data:`DEFAULT_TABLE` and nothing else.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

SCHEDULES = ("split", "fused")
# Programs the small-M split schedule aims for: about two per SM on a 132-SM H200.
# A constant, not the device's SM count, so the reduction order is the same on every GPU.
TARGET_PROGRAMS = 256
# Columns of N one split-schedule program covers when S is chosen (the rule's unit, not a tile).
SPLIT_UNIT_N = 64
MAX_SPLITS = 8
# A chunk shorter than this many k-steps spends more on its prologue than it gains in programs.
MIN_CHUNK_STEPS = 8
DEFAULT_BLOCK_K = 64


@dataclass(frozen=True)
class KOrder:
    """The reduction order along K for one (N, K, dtype): what fixes the bits."""

    block_k: int
    splits: int

    def chunk_len(self, k: int) -> int:
        """Columns per chunk: ceil(K / S) rounded up to a multiple of ``block_k`` (the last chunk is shorter)."""
        steps = -(-k // self.block_k)
        return -(-steps // self.splits) * self.block_k


@dataclass(frozen=True)
class Tiling:
    """The physical schedule for M <= ``max_m`` (None: every larger M).

    ``swap_ab`` computes each tile as ``W @ A^T``: the weight tile is the
    MMA's row operand (Hopper's warp-group MMA needs 64 rows there) and the
    activation rows its column operand (16 are enough), so small M wastes
    less. Whether the two orientations give the same bits is for the GPU
    tests to say; a table that mixes them is a candidate until they do.
    """

    max_m: int | None
    schedule: str
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    group_m: int = 8
    swap_ab: bool = False


@dataclass(frozen=True)
class GemmTable:
    """M buckets (ascending ``max_m``, the last unbounded) and K orders for named shapes.

    ``k_orders`` maps ``(N, K)`` to a :class:`KOrder` for both fp16 and bf16;
    shapes not listed take :func:`rule_k_order`.
    """

    name: str
    buckets: tuple[Tiling, ...]
    k_orders: tuple[tuple[tuple[int, int], KOrder], ...] = ()
    block_k: int = DEFAULT_BLOCK_K

    def __post_init__(self):
        if not self.buckets or self.buckets[-1].max_m is not None:
            raise ValueError(f"table {self.name!r}: the last bucket must have max_m=None (every larger M)")
        bounds = [b.max_m for b in self.buckets[:-1]]
        if any(b is None or b < 1 for b in bounds) or bounds != sorted(set(bounds)):
            raise ValueError(f"table {self.name!r}: bucket bounds must be distinct ints >= 1 in ascending order, got {bounds}")
        for b in self.buckets:
            if b.schedule not in SCHEDULES:
                raise ValueError(f"table {self.name!r}: schedule must be one of {', '.join(SCHEDULES)}, got {b.schedule!r}")
            for field in ("block_m", "block_n"):
                v = getattr(b, field)
                if v < 16 or v & (v - 1):
                    raise ValueError(f"table {self.name!r}: {field} must be a power of two >= 16, got {v}")

    def bucket(self, m: int) -> Tiling:
        """The tiling that runs ``m`` rows."""
        for b in self.buckets:
            if b.max_m is None or m <= b.max_m:
                return b
        raise AssertionError("unreachable: the last bucket is unbounded")

    def k_order(self, n: int, k: int) -> KOrder:
        """The reduction order for an [*, K] x [N, K]^T product (no M: see the module docstring)."""
        return dict(self.k_orders).get((n, k)) or rule_k_order(n, k, self.block_k)

    def boundaries(self) -> list[int]:
        """Every bucket's last M (the tests check each one and its neighbours)."""
        return [b.max_m for b in self.buckets if b.max_m is not None]


def rule_k_order(n: int, k: int, block_k: int = DEFAULT_BLOCK_K) -> KOrder:
    """S from N and K only: enough (N/64-column x chunk) programs for ~TARGET_PROGRAMS, chunks >= 8 k-steps.

    Raises:
        ValueError: ``n`` or ``k`` below 1.
    """
    if n < 1 or k < 1:
        raise ValueError(f"n and k must be >= 1, got n={n}, k={k}")
    want = math.ceil(TARGET_PROGRAMS / math.ceil(n / SPLIT_UNIT_N))
    most = max(1, math.ceil(k / block_k) // MIN_CHUNK_STEPS)
    return KOrder(block_k=block_k, splits=max(1, min(want, most, MAX_SPLITS)))


# The (N, K) shapes the tables are measured and tested on: an 8B Llama target's layers, the EAGLE draft's
# fc, a 70B-class dense model. Names, not a lookup: any other shape takes the same rule.
REFERENCE_SHAPES = {
    "8b_qkv": (6144, 4096),
    "8b_o": (4096, 4096),
    "8b_gate_up": (28672, 4096),
    "8b_down": (4096, 14336),
    "8b_lm_head": (128256, 4096),
    "eagle_fc": (4096, 8192),
    "70b_qkv": (10240, 8192),
    "70b_o": (8192, 8192),
    "70b_gate_up": (57344, 8192),
    "70b_down": (8192, 28672),
}

# Small M: 64-row tiles (the smallest Hopper warp-group MMA) over many programs; large M: big fused tiles.
DEFAULT_TABLE = GemmTable(
    name="default",
    buckets=(
        Tiling(max_m=64, schedule="split", block_m=64, block_n=64, num_warps=4, num_stages=4),
        Tiling(max_m=256, schedule="split", block_m=64, block_n=128, num_warps=4, num_stages=4),
        Tiling(max_m=1024, schedule="fused", block_m=64, block_n=128, num_warps=4, num_stages=4),
        Tiling(max_m=None, schedule="fused", block_m=128, block_n=128, num_warps=8, num_stages=3),
    ),
)


def _variant(name: str, buckets, **kw) -> GemmTable:
    return dataclasses.replace(DEFAULT_TABLE, name=name, buckets=tuple(buckets), **kw)


# Candidate tables the benchmark times beside the default (``bench_gemm.py --variants``).
# 16-row tiles use Triton's pre-Hopper MMA path: whether its bits match the
# warp-group MMA of the larger buckets is exactly what the benchmark's bitwise
# column answers.
VARIANTS = {
    t.name: t
    for t in (
        DEFAULT_TABLE,
        _variant("split_narrow", (
            Tiling(max_m=16, schedule="split", block_m=64, block_n=32, num_warps=4, num_stages=6),
            Tiling(max_m=256, schedule="split", block_m=64, block_n=64, num_warps=4, num_stages=5),
            Tiling(max_m=1024, schedule="fused", block_m=64, block_n=128, num_warps=4, num_stages=4),
            Tiling(max_m=None, schedule="fused", block_m=128, block_n=128, num_warps=8, num_stages=3),
        )),
        _variant("mma16", (
            Tiling(max_m=16, schedule="split", block_m=16, block_n=64, num_warps=4, num_stages=5),
            Tiling(max_m=256, schedule="split", block_m=64, block_n=128, num_warps=4, num_stages=4),
            Tiling(max_m=1024, schedule="fused", block_m=64, block_n=128, num_warps=4, num_stages=4),
            Tiling(max_m=None, schedule="fused", block_m=128, block_n=128, num_warps=8, num_stages=3),
        )),
        _variant("bk128", DEFAULT_TABLE.buckets, block_k=128),
        _variant("fused_only", (
            Tiling(max_m=256, schedule="fused", block_m=64, block_n=64, num_warps=4, num_stages=4),
            Tiling(max_m=None, schedule="fused", block_m=128, block_n=128, num_warps=8, num_stages=3),
        )),
        _variant("swap_all", (
            Tiling(max_m=16, schedule="split", block_m=16, block_n=64, num_warps=4, num_stages=6, swap_ab=True),
            Tiling(max_m=64, schedule="split", block_m=64, block_n=64, num_warps=4, num_stages=5, swap_ab=True),
            Tiling(max_m=256, schedule="split", block_m=64, block_n=128, num_warps=4, num_stages=4, swap_ab=True),
            Tiling(max_m=1024, schedule="fused", block_m=64, block_n=128, num_warps=4, num_stages=4, swap_ab=True),
            Tiling(max_m=None, schedule="fused", block_m=128, block_n=128, num_warps=8, num_stages=3, swap_ab=True),
        )),
        _variant("swap_small", (
            Tiling(max_m=16, schedule="split", block_m=16, block_n=64, num_warps=4, num_stages=6, swap_ab=True),
            Tiling(max_m=64, schedule="split", block_m=64, block_n=64, num_warps=4, num_stages=5, swap_ab=True),
            *DEFAULT_TABLE.buckets[1:],
        )),
        _variant("split_to_512", (
            Tiling(max_m=64, schedule="split", block_m=64, block_n=64, num_warps=4, num_stages=4),
            Tiling(max_m=512, schedule="split", block_m=64, block_n=128, num_warps=4, num_stages=4),
            Tiling(max_m=2048, schedule="fused", block_m=128, block_n=128, num_warps=8, num_stages=3),
            Tiling(max_m=None, schedule="fused", block_m=128, block_n=256, num_warps=8, num_stages=3),
        )),
    )
}
