"""The split-K GEMM experiment (benchmark/gemm_splitk/) on CPU: its config table, its argument errors, the
torch path, and the Triton kernels' logic under Triton's interpreter (its GPU test runs them compiled, bit
for bit). Kept in the unit suite so the experiment keeps working although it is not shipped."""

import math
import sys
from pathlib import Path

import pytest
import torch
from sglang.test.ci.ci_register import register_cpu_ci

from _interpreter import run_interpreted

BENCH = Path(__file__).resolve().parents[3] / "benchmark"
sys.path.insert(0, str(BENCH))
from gemm_splitk import gemm_triton  # noqa: E402
from gemm_splitk.gemm import linear, linear_reference, mm, unsupported  # noqa: E402
from gemm_splitk.gemm_config import (  # noqa: E402
    DEFAULT_TABLE,
    MAX_SPLITS,
    MIN_CHUNK_STEPS,
    REFERENCE_SHAPES,
    SPLIT_UNIT_N,
    TARGET_PROGRAMS,
    VARIANTS,
    GemmTable,
    KOrder,
    Tiling,
    rule_k_order,
)

register_cpu_ci(est_time=120, suite="detspec-unit-cpu")

SHAPES = [*REFERENCE_SHAPES.values(), (3, 4096), (1000, 1000), (512, 40)]


def oracle_bound(out, a, w, b):
    """|out - fp64| <= one rounding of out's dtype + fp32 accumulation error (one rounding per 16 of K)."""
    ref = a.double() @ w.double().T + (0 if b is None else b.double())
    scale = a.double().abs() @ w.double().abs().T + (0 if b is None else b.double().abs())
    unit = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}[out.dtype]
    bound = unit * ref.abs() + (a.shape[1] / 16 + 2) * 2.0**-23 * scale + 2.0**-24
    return bool(((out.double() - ref).abs() <= bound).all())


# --- the config table ---------------------------------------------------------------------------------


class _Launches:
    """Stands in for one of the GEMM's Triton kernels: records the reduction order each launch receives."""

    def __init__(self, name, seen):
        self.name, self.seen = name, seen

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            if self.name == "combine":  # (ws, bias, c, m * n, n): the chunk count and the fixed combine order
                self.seen.append(("combine", kwargs["SPLITS"]))
            else:  # (..., m, n, k, chunk, 4 strides): K, its chunk length and the k-step
                k, chunk = args[-6], args[-5]
                self.seen.append((self.name, k, chunk, kwargs["BLOCK_K"], kwargs.get("SPLITS")))
        return launch


@pytest.mark.parametrize("table", list(VARIANTS.values()), ids=lambda t: t.name)
def test_the_reduction_order_is_looked_up_without_m(table, monkeypatch):
    """Every M, in every bucket and both schedules, launches the kernels with one K order for a given (N, K)."""
    seen = []
    for name, attr in (("split", "_gemm_split_kernel"), ("combine", "_gemm_combine_kernel"),
                       ("fused", "_gemm_fused_kernel")):
        monkeypatch.setattr(gemm_triton, attr, _Launches(name, seen))
    n, k = 256, 4096
    order = table.k_order(n, k)
    chunk, splits = order.chunk_len(k), -(-k // order.chunk_len(k))
    w = torch.zeros(n, k, dtype=torch.float16)
    schedules = set()
    for m in sorted({1, 2, 7, *table.boundaries(), *(b + 1 for b in table.boundaries()), 5000}):
        seen.clear()
        gemm_triton.gemm_triton(torch.zeros(m, k, dtype=torch.float16), w, None, table)
        kinds = {launch[0] for launch in seen}
        schedules.add(frozenset(kinds))
        for launch in seen:
            if launch[0] == "combine":
                assert launch[1] == splits, (m, launch)
            else:
                assert launch[1:4] == (k, chunk, order.block_k), (m, launch)
                assert launch[4] in (None, splits), (m, launch)
    if any(b.schedule == "split" for b in table.buckets) and splits > 1:
        assert {frozenset({"split", "combine"}), frozenset({"fused"})} <= schedules  # both schedules were seen


@pytest.mark.parametrize("table", list(VARIANTS.values()), ids=lambda t: t.name)
@pytest.mark.parametrize("n, k", SHAPES)
def test_chunks_cover_k_in_block_steps(table, n, k):
    order = table.k_order(n, k)
    chunk = order.chunk_len(k)
    assert chunk % order.block_k == 0 and chunk >= order.block_k
    assert math.ceil(k / chunk) <= order.splits <= MAX_SPLITS
    assert (order.splits - 1) * chunk < k + chunk  # no chunk starts past K + one chunk


@pytest.mark.parametrize("n, k", SHAPES)
def test_the_rule_aims_for_enough_programs_within_its_caps(n, k):
    order = rule_k_order(n, k)
    programs = math.ceil(n / SPLIT_UNIT_N) * order.splits
    steps = math.ceil(k / order.block_k)
    assert programs >= TARGET_PROGRAMS or order.splits == MAX_SPLITS or order.splits == max(1, steps // MIN_CHUNK_STEPS)
    assert order.splits == 1 or steps // order.splits >= MIN_CHUNK_STEPS


@pytest.mark.parametrize("table", list(VARIANTS.values()), ids=lambda t: t.name)
def test_buckets_cover_every_m_once(table):
    bounds = table.boundaries()
    assert bounds == sorted(bounds)
    for b in bounds:
        assert table.bucket(b).max_m == b and table.bucket(b + 1).max_m != b
    assert table.bucket(1) is table.buckets[0] and table.bucket(10**9) is table.buckets[-1]


def test_listed_k_orders_win_over_the_rule():
    table = GemmTable(name="t", buckets=DEFAULT_TABLE.buckets, k_orders=(((64, 640), KOrder(32, 5)),))
    assert table.k_order(64, 640) == KOrder(32, 5)
    assert table.k_order(64, 641) == rule_k_order(64, 641)


@pytest.mark.parametrize("buckets, match", [
    ((Tiling(64, "split", 64, 64, 4, 4),), "last bucket must have max_m=None"),
    ((Tiling(64, "split", 64, 64, 4, 4), Tiling(32, "fused", 64, 64, 4, 4), Tiling(None, "fused", 64, 64, 4, 4)),
     "ascending"),
    ((Tiling(None, "splitk", 64, 64, 4, 4),), "schedule must be one of"),
    ((Tiling(None, "fused", 48, 64, 4, 4),), "block_m must be a power of two"),
    ((), "last bucket"),
])
def test_bad_tables_are_refused(buckets, match):
    with pytest.raises(ValueError, match=match):
        GemmTable(name="bad", buckets=buckets)


def test_rule_refuses_empty_shapes():
    with pytest.raises(ValueError, match="n and k must be >= 1"):
        rule_k_order(0, 64)


# --- arguments ----------------------------------------------------------------------------------------


def bf(*shape):
    return torch.randn(*shape).to(torch.bfloat16)


@pytest.mark.parametrize("args, match", [
    ((torch.randn(2, 8), torch.randn(4, 8)), "a must be float16 or bfloat16, got dtype torch.float32"),
    ((bf(2, 8), torch.randn(4, 8).half()), "weight must have a's dtype torch.bfloat16"),
    ((bf(2, 8), bf(4, 8, 1)), r"weight must be 2-D \[N, K\]"),
    ((bf(2, 8), bf(4, 9)), r"a.shape\[-1\] must equal weight.shape\[1\] \(K = 9\)"),
    ((bf(2, 0), bf(4, 0)), "N >= 1 and K >= 1"),
    ((bf(2, 8), bf(4, 8), bf(5)), r"bias must be 1-D \[N\] with N = 4"),
    ((bf(2, 8), bf(4, 8), bf(1, 4)), r"bias must be 1-D \[N\] with N = 4"),
    ((bf(2, 8), bf(4, 8), torch.zeros(4, dtype=torch.int32)), "bias must have a's dtype torch.bfloat16 or float32"),
    ((bf(2, 8), torch.empty(4, 8, dtype=torch.bfloat16, device="meta")), "weight must be on a's device cpu"),
    ((bf(2, 8), bf(4, 8), [0.0] * 4), "bias must be a tensor or None"),
])
def test_bad_arguments_name_the_argument_and_the_bound(args, match):
    assert unsupported(*args) is not None
    with pytest.raises(ValueError, match=match):
        linear(*args)


def test_mm_wants_2d_and_triton_wants_cuda():
    with pytest.raises(ValueError, match="b must be a 2-D tensor"):
        mm(bf(2, 8), bf(8))
    with pytest.raises(ValueError, match="a must be a 2-D tensor"):
        mm(bf(2, 2, 8), bf(8, 4))
    with pytest.raises(ValueError, match="kernel='triton' needs CUDA tensors"):
        linear(bf(2, 8), bf(4, 8), kernel="triton")
    with pytest.raises(ValueError, match="kernel must be one of"):
        linear(bf(2, 8), bf(4, 8), kernel="cuda")


# --- the torch path (CPU) -----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
def test_torch_path_is_the_chunked_reference_and_accurate(dtype, bias):
    gen = torch.Generator().manual_seed(1)
    a = torch.randn(2, 3, 700, generator=gen).to(dtype)  # leading dims, as F.linear takes them
    w = (torch.randn(96, 700, generator=gen) / 700**0.5).to(dtype)
    b = torch.randn(96, generator=gen).to(dtype) if bias else None
    table = GemmTable(name="t", buckets=DEFAULT_TABLE.buckets, k_orders=(((96, 700), KOrder(64, 3)),))
    out = linear(a, w, b, table=table)
    assert out.shape == (2, 3, 96) and out.dtype == dtype
    assert torch.equal(out.reshape(6, 96), linear_reference(a.reshape(6, 700), w, b, table))
    assert oracle_bound(out.reshape(6, 96), a.reshape(6, 700), w, b)
    assert torch.equal(mm(a.reshape(6, 700), w.t(), b, table=table), out.reshape(6, 96))
    assert linear(a[:0, 0], w, b).shape == (0, 96)


def test_fp32_bias_is_added_before_the_one_rounding():
    a, w = torch.ones(1, 64, dtype=torch.bfloat16), torch.full((1, 64), 2.0**-8, dtype=torch.bfloat16)
    bias = torch.tensor([1.0 + 2.0**-9 + 2.0**-12])  # fp32: 1 + 0.25 + bias rounds once, not twice
    out = linear(a, w, bias)
    assert out.item() == torch.tensor(1.25 + 2.0**-9 + 2.0**-12).to(torch.bfloat16).item()


# --- the Triton kernels under the interpreter ----------------------------------------------------------

INTERPRETED = r"""
import torch
from gemm_splitk.gemm_config import GemmTable, KOrder, Tiling
from gemm_splitk.gemm_triton import gemm_triton
from gemm_splitk.gemm import linear_reference

CASES = [  # (N, K, KOrder): splits that divide K, that do not, a short last chunk, masked K, one split
    (40, 192, KOrder(16, 3)), (24, 80, KOrder(16, 4)), (33, 200, KOrder(16, 3)), (16, 48, KOrder(16, 1)),
    (20, 96, KOrder(32, 2)),
]
# One tile shape per table, alternating schedules: the interpreter's dot is NumPy's matmul, whose bits
# depend on the tile's shape, so only the schedules' chunking and combine order compare bit for bit here.
def buckets(swap):
    return tuple(Tiling(max_m, sched, 16, 16, 4, 2, swap_ab=swap)
                 for max_m, sched in ((4, "split"), (9, "fused"), (20, "split"), (None, "fused")))
OTHER_TILES = (Tiling(9, "split", 32, 32, 4, 2), Tiling(None, "fused", 32, 16, 4, 2, swap_ab=True))
gen = torch.Generator().manual_seed(0)
checked = 0
for n, k, order in CASES:
    orders = (((n, k), order),)
    for swap in (False, True):
        table = GemmTable(name="t", buckets=buckets(swap), k_orders=orders)
        one = GemmTable(name="fused", buckets=(Tiling(None, "fused", 16, 16, 4, 2, swap_ab=swap),), k_orders=orders)
        for bias in (False, True):
            case = (n, k, swap, bias)
            a = torch.randn(40, k, generator=gen).half()
            w = (torch.randn(n, k, generator=gen) / k**0.5).half()
            b = torch.randn(n, generator=gen).half() if bias else None
            full = gemm_triton(a, w, b, table)
            assert torch.equal(full, gemm_triton(a, w, b, one)), (case, "split and fused schedules differ")
            for m in (1, 3, 4, 5, 9, 10, 20, 21, 39):
                got = gemm_triton(a[:m], w, b, table)
                assert torch.equal(got, full[:m]), (case, m)
            strided = torch.zeros(40, k + 8).half()
            strided[:, 8:] = a
            assert torch.equal(gemm_triton(strided[:, 8:], w, b, table), full), (case, "row-strided a")
            ref = a.double() @ w.double().T + (0 if b is None else b.double())
            scale = a.double().abs() @ w.double().abs().T + (0 if b is None else b.double().abs())
            bound = 2.0**-11 * ref.abs() + (k / 16 + 2) * 2.0**-23 * scale + 2.0**-24
            for got, what in ((full, "fp64 oracle"),
                              (gemm_triton(a, w, b, GemmTable(name="o", buckets=OTHER_TILES, k_orders=orders)),
                               "other tiles"),
                              (gemm_triton(a[:7], w, b, GemmTable(name="o", buckets=OTHER_TILES, k_orders=orders)),
                               "other tiles, split")):
                assert bool(((got.double() - ref[:got.shape[0]]).abs() <= bound[:got.shape[0]]).all()), (case, what)
            close = (full.float() - linear_reference(a, w, b, table).float()).abs().max().item()
            assert close <= 2.0**-9 * (ref.abs().max().item() + 1), (case, close)
            checked += 1
print("checked", checked)
"""


def test_the_kernels_under_tritons_interpreter():
    """Across M, schedules, orientations (``swap_ab``) and strides, against fp64; fp16 only.

    Triton 3.8's interpreter computes ``tl.dot`` wrongly on bf16, and its dot
    (NumPy's matmul) gives a row other bits at another position in a tile or
    in a tile of another shape, so bf16, row permutations and bits across
    tile shapes are left to the GPU suite, where each output element is one
    MMA lane's sum.
    """
    pytest.importorskip("triton", reason="needs Triton (its interpreter runs the kernels on CPU)")
    done = run_interpreted(INTERPRETED, timeout=600, extra_paths=(BENCH,))
    assert done.returncode == 0 and done.stdout.strip() == "checked 20", done.stderr[-3000:]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
