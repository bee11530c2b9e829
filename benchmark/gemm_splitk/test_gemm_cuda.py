"""The split-K GEMM experiment on a CUDA GPU: row bits independent of M and of the other rows; values vs fp64.

For each shape, A has 8192 random rows; ``linear(A[:m])[i]`` must equal
``linear(A)[i]`` bit for bit for every tested m: a dense run of small m,
every bucket boundary of the table and its neighbours, and m up to 8192.
Rows permuted, a row-strided A, the [K, N] layout of ``mm``, bias / no bias,
bf16 and fp16. A small model built on the kernel gives the same logits for a
request alone and inside batches of 37, 128, 600 and 2000.

Not part of the registered suites (the GEMM is not shipped): run it with
``python -m pytest benchmark/gemm_splitk/test_gemm_cuda.py -q -rA`` from the
repository root, with ``python/`` on ``PYTHONPATH``. Without a CUDA GPU,
torch or Triton the module is skipped with the reason.
"""

import math
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="needs torch and a CUDA GPU: the split-K GEMM's kernels run only on CUDA")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU: the split-K GEMM's Triton kernels run only on CUDA", allow_module_level=True)
pytest.importorskip("triton", reason="needs Triton: the split-K GEMM's kernels are Triton kernels")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmark/: the experiment's package
from gemm_splitk.gemm import linear, mm  # noqa: E402
from gemm_splitk.gemm_config import DEFAULT_TABLE, REFERENCE_SHAPES  # noqa: E402

DEV = "cuda"
MAX_M = 8192
DTYPES = (torch.bfloat16, torch.float16)
SHAPES = REFERENCE_SHAPES  # name: (N, K)
ODD_SHAPES = {"odd_nk": (1000, 1000), "tiny_n": (3, 4096), "k_not_block": (4096, 4104), "short_k": (512, 40)}


def tested_ms() -> list[int]:
    """Small m densely, every bucket boundary +-1, then up to MAX_M."""
    ms = set(range(1, 21)) | {31, 32, 33, 37, 63, 100, 127, 129, 300, 1000, 2047, 2049, 4095, 4097, 5000, 8191, MAX_M}
    for b in DEFAULT_TABLE.boundaries():
        ms |= {b - 1, b, b + 1}
    return sorted(m for m in ms if 1 <= m <= MAX_M)


def inputs(n, k, dtype, bias, seed, rows=MAX_M):
    gen = torch.Generator(device=DEV).manual_seed(seed)
    a = torch.randn(rows, k, device=DEV, generator=gen).to(dtype)
    w = (torch.randn(n, k, device=DEV, generator=gen) / math.sqrt(k)).to(dtype)
    b = torch.randn(n, device=DEV, generator=gen).to(dtype) if bias else None
    return a, w, b


def first_difference(got, want, m) -> str:
    bad = (got != want).any(dim=1).nonzero().flatten()
    return f"m={m}: {bad.numel()} rows differ from the same rows at M={want.shape[0]}, first {bad[:5].tolist()}"


def check_rows_invariant(a, w, b, ms):
    full = linear(a, w, b)
    for m in ms:
        got = linear(a[:m], w, b)
        assert torch.equal(got, full[:m]), first_difference(got, full[:m], m)
    return full


@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("shape", list(SHAPES), ids=str)
def test_rows_equal_across_m_and_order(shape, dtype, bias):
    n, k = SHAPES[shape]
    a, w, b = inputs(n, k, dtype, bias, seed=n + k)
    full = check_rows_invariant(a, w, b, tested_ms())
    perm = torch.randperm(MAX_M, device=DEV, generator=torch.Generator(device=DEV).manual_seed(1))
    assert torch.equal(linear(a[perm], w, b), full[perm]), "rows permuted: a row's bits moved with its index"
    for m in (1, 37, 129, 1000):  # the other rows replaced by others: only the row itself counts
        mixed = torch.cat([a[:1], a[MAX_M - m + 1:]]) if m > 1 else a[:1]
        assert torch.equal(linear(mixed, w, b)[0], full[0]), f"row 0 changed with other rows at m={m}"


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("shape", list(ODD_SHAPES), ids=str)
def test_odd_shapes_invariant_and_accurate(shape, dtype):
    n, k = ODD_SHAPES[shape]
    a, w, b = inputs(n, k, dtype, True, seed=n * 3 + k, rows=2100)
    full = check_rows_invariant(a, w, b, [m for m in tested_ms() if m <= 2100] + [2100])
    assert_accurate(full, a, w, b)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def test_strided_rows_and_mm_layouts(dtype):
    n, k = SHAPES["8b_o"]
    a, w, b = inputs(n, k, dtype, False, seed=5, rows=1100)
    full = linear(a, w, b)
    wide = torch.zeros(a.shape[0], k + 64, device=DEV, dtype=dtype)
    wide[:, 32:32 + k] = a
    strided = wide[:, 32:32 + k]  # row stride K + 64, not contiguous
    for m in (1, 7, 64, 65, 300, 1100):
        assert torch.equal(linear(strided[:m], w, b), full[:m]), f"row-strided A at m={m}"
    # aten mm's layout: b = weight.t() is read through its strides, the same kernel as linear
    assert torch.equal(mm(a, w.t()), full)
    # a contiguous [K, N] b (not a weight's transpose): its own bits, still invariant across M
    b_kn = w.t().contiguous()
    whole = mm(a, b_kn)
    for m in (1, 64, 65, 257, 1100):
        assert torch.equal(mm(a[:m], b_kn), whole[:m]), f"[K, N] b at m={m}"
    assert_accurate(whole, a, w, None)


def assert_accurate(out, a, w, b):
    """Each element within one rounding of the output dtype plus fp32 accumulation error of fp64; overall no worse than cuBLAS.

    The accumulation term counts one fp32 rounding (relative 2**-23, as the
    tensor cores truncate) per 16-wide MMA step of K, over sum |a| |w|.
    """
    ref = a.double() @ w.double().T
    scale = a.double().abs() @ w.double().abs().T
    if b is not None:
        ref = ref + b.double()
        scale = scale + b.double().abs()
    unit = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}[out.dtype]
    k = a.shape[1]
    bound = unit * ref.abs() + (k / 16 + 2) * 2.0**-23 * scale + 2.0**-24
    err = (out.double() - ref).abs()
    assert bool((err <= bound).all()), f"max error {err.max().item():.3g}, worst ratio to bound {(err / bound).max().item():.3g}"
    cublas = torch.nn.functional.linear(a, w, b).double()
    ours_rel, cublas_rel = (torch.linalg.norm(x - ref) / torch.linalg.norm(ref) for x in (out.double(), cublas))
    assert ours_rel <= 1.5 * cublas_rel + 1e-6, f"relative error {ours_rel:.3g} against cuBLAS's {cublas_rel:.3g}"


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("shape", ["8b_qkv", "8b_down", "eagle_fc", "70b_down"], ids=str)
@pytest.mark.parametrize("m", [1, 64, 200, 2000])
def test_accuracy_against_fp64(shape, dtype, m):
    n, k = SHAPES[shape]
    a, w, b = inputs(n, k, dtype, True, seed=11, rows=m)
    assert_accurate(linear(a, w, b), a, w, b)


@pytest.mark.parametrize("m", [1, 37, 300, 2000])
def test_cuda_graph_replay_equals_eager(m):
    """SGLang captures the model's matmuls in CUDA graphs: the split schedule's workspace and both kernels replay."""
    n, k = SHAPES["8b_o"]
    a, w, b = inputs(n, k, torch.bfloat16, True, seed=m, rows=m)
    static = a.clone()
    linear(static, w, b)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = linear(static, w, b)
    for seed in (1, 2):
        fresh = inputs(n, k, torch.bfloat16, False, seed=100 + seed, rows=m)[0]
        static.copy_(fresh)
        graph.replay()
        assert torch.equal(out, linear(fresh, w, b)), f"replay {seed} at m={m}"


def test_sglangs_batch_invariant_mode_runs_the_split_k_gemm_where_installed():
    """The wiring on a GPU: under SGLang's batch-invariant aten overrides, F.linear and the lm_head's matmul
    give the split-K GEMM's bits inside ``matmul_hook.installed()``, and SGLang's own outside it."""
    pytest.importorskip("sglang", reason="needs SGLang (its batch-invariant mode is what is hooked)")
    from sglang.srt.batch_invariant_ops import batch_invariant_ops as bio

    from gemm_splitk.matmul_hook import installed

    n, k = SHAPES["8b_qkv"]
    a, w, b = inputs(n, k, torch.bfloat16, True, seed=4, rows=300)
    sglangs = bio.matmul_persistent
    try:
        bio.enable_batch_invariant_mode()
        with installed():
            assert torch.equal(torch.nn.functional.linear(a, w), linear(a, w))
            assert torch.equal(torch.nn.functional.linear(a, w, b), linear(a, w, b))  # aten::addmm
            assert torch.equal(torch.matmul(a, w.T), linear(a, w))  # the lm_head's form
        assert bio.matmul_persistent is sglangs
        assert torch.equal(torch.nn.functional.linear(a, w), sglangs(a, w.T))
    finally:
        bio.disable_batch_invariant_mode()


class TinyModel:
    """Embedding, residual MLP blocks with RMSNorm, lm_head: every matmul is the batch-invariant GEMM.

    The norm reduces each row as its own 1-D tensor, so its reduction is the
    same whatever the batch; everything else is elementwise.
    """

    def __init__(self, dtype, hidden=1024, inter=4096, vocab=8000, layers=3, seed=3):
        gen = torch.Generator(device=DEV).manual_seed(seed)

        def weight(n, k):
            return (torch.randn(n, k, device=DEV, generator=gen) / math.sqrt(k)).to(dtype)

        self.embed = torch.randn(vocab, hidden, device=DEV, generator=gen).to(dtype)
        self.blocks = [(weight(inter, hidden), weight(hidden, inter)) for _ in range(layers)]
        self.lm_head = weight(vocab, hidden)

    @staticmethod
    def norm(h):
        inv = torch.stack([torch.rsqrt(row.float().pow(2).mean() + 1e-5) for row in h])
        return (h.float() * inv[:, None]).to(h.dtype)

    def logits(self, tokens):
        h = self.embed[tokens]
        for up, down in self.blocks:
            h = h + linear(torch.nn.functional.silu(linear(self.norm(h), up)), down)
        return linear(self.norm(h), self.lm_head)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def test_small_model_logits_equal_alone_and_in_batches(dtype):
    model = TinyModel(dtype)
    tokens = torch.randint(0, 8000, (2000,), device=DEV, generator=torch.Generator(device=DEV).manual_seed(9))
    alone = model.logits(tokens[:1])
    for batch in (37, 128, 600, 2000):
        together = model.logits(tokens[:batch])
        assert torch.equal(together[:1], alone), f"request 0's logits differ inside a batch of {batch}"
        if batch > 37:
            assert torch.equal(together[:37], model.logits(tokens[:37])), f"rows 0..36 differ at batch {batch}"


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__, "-v"]))
