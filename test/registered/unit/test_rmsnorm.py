"""Batch-invariant RMSNorm on CPU: the reference's order of operations, its semantics against SGLang's
RMSNorm, the argument checks, and the Triton kernel under Triton's interpreter bit for bit."""

import sys

import numpy as np
import pytest
import torch
from sglang.test.ci.ci_register import register_cpu_ci

from _interpreter import run_interpreted

from sglang_detspec.ops import fused_add_rms_norm, rms_norm
from sglang_detspec.ops.rmsnorm_ref import padded_width, pairwise_sum, rms_norm_reference

register_cpu_ci(est_time=20, suite="detspec-unit-cpu")

# Hidden sizes: Qwen3's q/k-norm head dim, gpt-oss (not a power of two), Llama 8B, Qwen3 14B/32B
# (not a power of two), Llama 70B.
HIDDEN = (128, 2880, 4096, 5120, 8192)
BITS = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(BITS[a.dtype]), b.view(BITS[b.dtype]))


def inputs(m, h, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(m, h, generator=gen) * 2).to(dtype)
    r = (torch.randn(m, h, generator=gen) * 4).to(dtype)
    w = (torch.rand(h, generator=gen) + 0.5).to(dtype)
    return x, r, w


def numpy_mirror(x, w, eps, r=None):
    """The documented order in NumPy float32, whose divide and sqrt are IEEE: an independent oracle."""
    v = x.float().numpy()
    if r is not None:
        v = v + r.float().numpy()
    s = v * v
    p = padded_width(s.shape[1])
    s = np.concatenate([s, np.zeros((s.shape[0], p - s.shape[1]), np.float32)], axis=1)
    while s.shape[1] > 1:
        s = s[:, : s.shape[1] // 2] + s[:, s.shape[1] // 2 :]
    mean = s / np.float32(x.shape[1])
    rstd = np.float32(1) / np.sqrt(mean + np.float32(eps))
    return torch.from_numpy((v * rstd) * w.float().numpy()).to(x.dtype)


def test_padded_width_is_the_next_power_of_two():
    assert [padded_width(h) for h in (1, 2, 3, 128, 2880, 4096, 5120)] == [1, 2, 4, 128, 4096, 4096, 8192]


def test_pairwise_sum_halves_the_row_level_by_level():
    # 2**24 + 1 + 1 is 2**24 summed left to right, 2**24 + 2 pairwise: the order is observable.
    s = torch.tensor([[2.0**24, 1.0, 0.0, 1.0, 0.0]])  # padded to 8: (a+0)+(1+0), (0+0)+(1+0) ...
    assert pairwise_sum(s).item() == (2.0**24 + 0.0) + (1.0 + 1.0)
    assert torch.tensor(2.0**24) + 1.0 + 1.0 == 2.0**24  # sequential would lose both ones
    gen = torch.Generator().manual_seed(1)
    t = torch.randn(3, 2880, generator=gen) ** 2
    assert pairwise_sum(t).shape == (3, 1)


@pytest.mark.parametrize("h", (1, 3, *HIDDEN))
@pytest.mark.parametrize("dtype", list(BITS))
def test_reference_equals_an_independent_numpy_mirror(h, dtype):
    x, r, w = inputs(16, h, dtype, seed=h)
    assert same_bits(rms_norm_reference(x, w, 1e-6)[0], numpy_mirror(x, w, 1e-6))
    out, res_out = rms_norm_reference(x, w, 1e-5, r)
    assert same_bits(out, numpy_mirror(x, w, 1e-5, r))
    assert same_bits(res_out, (x.float() + r.float()).to(dtype))


def test_reference_square_root_is_correctly_rounded_where_torchs_cpu_sqrt_is_not():
    x, _, w = inputs(4096, 4, torch.float32, seed=2)
    assert same_bits(rms_norm_reference(x, w, 1e-6)[0], numpy_mirror(x, w, 1e-6))
    # The check has teeth: on these rows torch's own float32 CPU sqrt is off the IEEE result somewhere.
    ms = pairwise_sum(x * x) / 4 + 1e-6
    if torch.equal(torch.sqrt(ms), torch.from_numpy(np.sqrt(ms.numpy()))):
        pytest.skip("this torch build's float32 CPU sqrt is correctly rounded on these rows")


@pytest.mark.parametrize("dtype", list(BITS))
def test_rows_do_not_depend_on_the_batch(dtype):
    x, r, w = inputs(64, 4096, dtype, seed=3)
    full, full_res = fused_add_rms_norm(x, r, w, 1e-6)
    plain = rms_norm(x, w, 1e-6)
    perm = torch.randperm(64, generator=torch.Generator().manual_seed(4))
    for m in (1, 7, 33, 64):
        assert same_bits(rms_norm(x[:m], w, 1e-6), plain[:m])
        out, res = fused_add_rms_norm(x[:m], r[:m], w, 1e-6)
        assert same_bits(out, full[:m]) and same_bits(res, full_res[:m])
    assert same_bits(rms_norm(x[perm], w, 1e-6), plain[perm])


@pytest.mark.parametrize("dtype", list(BITS))
def test_shapes_layouts_and_no_writes_to_the_inputs(dtype):
    x, r, w = inputs(24, 128, dtype, seed=5)
    x3, r3 = x.reshape(2, 12, 128), r.reshape(2, 12, 128)
    before = (x.clone(), r.clone())
    out, res = fused_add_rms_norm(x3, r3, w, 1e-6)
    assert out.shape == res.shape == (2, 12, 128) and out.is_contiguous()
    assert same_bits(out.reshape(24, 128), fused_add_rms_norm(x, r, w, 1e-6)[0])
    assert same_bits(x, before[0]) and same_bits(r, before[1])
    wide = torch.zeros(24, 300, dtype=dtype)
    wide[:, 50:178] = x  # rows with a stride of 300
    assert same_bits(rms_norm(wide[:, 50:178], w, 1e-6), rms_norm(x, w, 1e-6))
    assert same_bits(rms_norm(x.t().contiguous().t(), w, 1e-6), rms_norm(x, w, 1e-6))  # column-major
    assert rms_norm(x[:0], w).shape == (0, 128)


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16))
def test_float32_weight_with_half_activations(dtype):
    x, r, w = inputs(8, 4096, dtype, seed=6)
    assert same_bits(rms_norm(x, w.float(), 1e-6), numpy_mirror(x, w.float(), 1e-6))


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16))
def test_semantics_are_sglangs_rmsnorm(dtype):
    """SGLang's own ``RMSNorm.forward_native`` (what its deterministic residual path runs): the same residual
    bits, outputs within one rounding step (only the reduction order and rsqrt's rounding differ)."""
    from sglang.srt.layers.layernorm import RMSNorm

    x, r, w = inputs(32, 4096, dtype, seed=7)
    layer = RMSNorm(4096, eps=1e-5).to(dtype)
    layer.weight.data.copy_(w)
    want, want_res = layer.forward_native(x, r)
    out, res = fused_add_rms_norm(x, r, w, 1e-5)
    assert same_bits(res, want_res)
    step = torch.finfo(dtype).eps * want.float().abs().clamp_min(1e-3)
    assert ((out.float() - want.float()).abs() <= step).all()
    plain = layer.forward_native(x)
    assert ((rms_norm(x, w, 1e-5).float() - plain.float()).abs() <= torch.finfo(dtype).eps * plain.float().abs()
            .clamp_min(1e-3)).all()


BAD = [
    (dict(x=[1.0]), "x must be a tensor"),
    (dict(x=torch.ones(2, 4, dtype=torch.float64)), "x must have dtype bfloat16, float16 or float32"),
    (dict(x=torch.tensor(1.0)), "x must have a last"),
    (dict(x=torch.ones(2, 0)), r"H = 0; H must lie in \[1, 32768\]"),
    (dict(x=torch.ones(1, 32769), weight=torch.ones(32769)), r"H = 32769; H must lie in \[1, 32768\]"),
    (dict(weight=torch.ones(5)), r"weight must be 1-D \[H = 4\]"),
    (dict(weight=torch.ones(1, 4)), r"weight must be 1-D \[H = 4\]"),
    (dict(weight=torch.ones(4, dtype=torch.int32)), "weight must have dtype"),
    (dict(weight="w"), "weight must be a tensor"),
    (dict(eps=-1e-6), "eps must be a finite real >= 0"),
    (dict(eps=float("nan")), "eps must be a finite real >= 0"),
    (dict(eps=float("inf")), "eps must be a finite real >= 0"),
    (dict(eps=True), "eps must be a finite real >= 0"),
    (dict(eps="1e-6"), "eps must be a finite real >= 0"),
    (dict(kernel="cuda"), "kernel must be one of"),
    (dict(kernel="triton"), "kernel='triton' needs CUDA tensors"),
]


@pytest.mark.parametrize("kwargs, match", BAD)
def test_bad_arguments_name_the_argument_and_the_bound(kwargs, match):
    args = dict(x=torch.ones(2, 4), weight=torch.ones(4), eps=1e-6, kernel="auto") | kwargs
    with pytest.raises(ValueError, match=match):
        rms_norm(args["x"], args["weight"], args["eps"], kernel=args["kernel"])
    if isinstance(args["x"], torch.Tensor) and args["x"].dim():
        with pytest.raises(ValueError, match=match):
            fused_add_rms_norm(args["x"], args["x"], args["weight"], args["eps"], kernel=args["kernel"])


@pytest.mark.parametrize("residual, match", [
    (torch.ones(2, 5), r"residual must match x \(shape \(2, 4\)"),
    (torch.ones(2, 4, dtype=torch.bfloat16), "dtype torch.float32"),
    (None, "residual must be a tensor"),
])
def test_bad_residual_names_residual(residual, match):
    with pytest.raises(ValueError, match=match):
        fused_add_rms_norm(torch.ones(2, 4), residual, torch.ones(4))


def test_an_eps_of_zero_is_allowed_and_an_all_zero_row_gives_nan_like_sglang():
    out = rms_norm(torch.zeros(1, 8), torch.ones(8), 0.0)
    assert torch.isnan(out).all()


INTERPRETED = """
import torch
from sglang_detspec.ops.rmsnorm_ref import rms_norm_reference
from sglang_detspec.ops.rmsnorm_triton import rms_norm_triton
BITS = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}
checked = 0
for h in (1, 3, 128, 2880, 4096, 5120, 8192):
    for dtype in BITS:
        gen = torch.Generator().manual_seed(h)
        x = (torch.randn(6, h, generator=gen) * 3).to(dtype)
        r = (torch.randn(6, h, generator=gen) * 5).to(dtype)
        w = (torch.rand(h, generator=gen) + 0.5).to(dtype)
        x[0, :] = x[0, :] * 1e-3  # a small row
        x[1, : h // 2 + 1] = (x[1, : h // 2 + 1] * 60).to(dtype)  # a large one
        strided = torch.zeros(6, h + 40, dtype=dtype)
        strided[:, 8 : 8 + h] = x  # row stride h + 40
        for xin in (x, strided[:, 8 : 8 + h]):
            for res in (None, r):
                for wt in (w, w.float()):
                    got, got_res = rms_norm_triton(xin, wt, 1e-6, res)
                    want, want_res = rms_norm_reference(xin, wt, 1e-6, res)
                    assert torch.equal(got.view(BITS[dtype]), want.view(BITS[dtype])), (h, dtype)
                    if res is not None:
                        assert torch.equal(got_res.view(BITS[dtype]), want_res.view(BITS[dtype])), (h, dtype)
                    checked += 1
print("equal", checked)
"""


def test_the_triton_kernel_under_tritons_interpreter_equals_the_reference_bit_for_bit():
    """The kernel's logic on CPU (``TRITON_INTERPRET=1``, in a child process so no other kernel is
    interpreted): hidden sizes that are powers of two and not, residual or not, float32 or x's-dtype weight,
    strided rows; the GPU suite runs it compiled."""
    pytest.importorskip("triton", reason="needs Triton (its interpreter runs the kernel on CPU)")
    done = run_interpreted(INTERPRETED, timeout=600)
    assert done.returncode == 0 and done.stdout.strip() == "equal 168", done.stderr[-2000:] + done.stdout[-500:]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
