"""The split-K GEMM experiment's hook (benchmark/gemm_splitk/matmul_hook.py) on SGLang's real batch-invariant ops.

Which function ran is observed directly: SGLang's own ``matmul_persistent``
and the experiment's ``linear`` are each wrapped in a recorder that calls the
real function. On CPU SGLang's own (Triton) route cannot run, so where it is
chosen its failure is what comes back; the recorder shows it was called.
"""

import sys
from pathlib import Path

import pytest
import torch
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_detspec import sglang_plugin
from sglang_detspec.config import REMOVED_ENV, env_settings

register_cpu_ci(est_time=30, suite="detspec-unit-cpu")

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmark"))
from gemm_splitk import matmul_hook  # noqa: E402
from gemm_splitk.gemm import linear  # noqa: E402

GEMM_ENV = "SGLANG_DETSPEC_GEMM"


@pytest.fixture()
def bio():
    from sglang.srt.batch_invariant_ops import batch_invariant_ops

    return batch_invariant_ops


@pytest.fixture()
def calls(bio, monkeypatch):
    """``{"sglang": [...], "split_k": [...]}``: the calls SGLang's matmul and the split-K ``linear`` received."""
    seen = {"sglang": [], "split_k": []}
    sglangs = bio.matmul_persistent

    def sglang_matmul(*args, **kwargs):
        seen["sglang"].append((args, kwargs))
        return sglangs(*args, **kwargs)

    def split_k_linear(*args, **kwargs):
        seen["split_k"].append((args, kwargs))
        return linear(*args, **kwargs)

    import sglang.srt.batch_invariant_ops as package

    # What installed() finds and keeps as the original, in the module and in the package's re-export.
    monkeypatch.setattr(bio, "matmul_persistent", sglang_matmul)
    monkeypatch.setattr(package, "matmul_persistent", sglang_matmul)
    monkeypatch.setattr(matmul_hook, "linear", split_k_linear)
    return seen


def operands(m=5, k=200, n=48, seed=0):
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=gen).to(torch.bfloat16)
    w = (torch.randn(n, k, generator=gen) / k**0.5).to(torch.bfloat16)
    bias = torch.randn(n, generator=gen).to(torch.bfloat16)
    return a, w, bias


def outcome(fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except Exception as err:  # noqa: BLE001 - SGLang's own failure mode on CPU is the thing compared
        return type(err), str(err)


def test_sglangs_overrides_run_the_split_k_gemm_inside_installed(bio, calls):
    a, w, bias = operands()
    b = w.t()  # aten::mm's second operand for F.linear: the weight's transpose, a view
    out = torch.empty(5, 48, dtype=torch.bfloat16)
    with matmul_hook.installed():
        import sglang.srt.batch_invariant_ops as package

        assert package.matmul_persistent is bio.matmul_persistent  # the package's re-export follows
        got = [bio.mm_batch_invariant(a, b), bio.addmm_batch_invariant(bias, a, b),
               bio.mm_out_batch_invariant(a, b, out=out)]
    assert calls["sglang"] == [] and len(calls["split_k"]) == 3
    assert got[2] is out
    product = a.double() @ w.double().T
    for result, want, ref in zip(got, (linear(a, w), linear(a, w, bias), linear(a, w)),
                                 (product, product + bias.double(), product)):
        assert torch.equal(result, want)
        assert torch.allclose(result.double(), ref, rtol=2**-7, atol=2**-7)  # one bf16 rounding of the product


@pytest.mark.parametrize("case", ["fp32", "out_dtype", "2d_bias", "mixed"])
def test_what_the_split_k_gemm_does_not_cover_goes_to_sglang(bio, calls, case):
    a, w, bias = operands()
    args, kwargs = (a, w.t()), {}
    if case == "fp32":
        args = (a.float(), w.t().float())
    elif case == "out_dtype":
        kwargs = {"out_dtype": torch.float32}
    elif case == "2d_bias":
        kwargs = {"bias": torch.zeros(5, 48, dtype=torch.bfloat16)}
    else:
        args = (a, w.t().half())
    sglangs = bio.matmul_persistent
    want = outcome(sglangs, *args, **kwargs)
    calls["sglang"].clear()
    with matmul_hook.installed():
        got = outcome(bio.matmul_persistent, *args, **kwargs)
    assert len(calls["sglang"]) == 1 and calls["split_k"] == []
    assert type(got) is type(want) and (got == want if isinstance(want, tuple) else torch.equal(got, want))


def test_leaving_installed_restores_sglangs_matmul_also_on_error(bio, calls):
    sglangs = bio.matmul_persistent
    a, w, _ = operands()
    with pytest.raises(RuntimeError, match="inside"):
        with matmul_hook.installed():
            assert bio.matmul_persistent is not sglangs
            raise RuntimeError("inside")
    assert bio.matmul_persistent is sglangs
    calls["sglang"].clear()
    outcome(bio.mm_batch_invariant, a, w.t())
    assert len(calls["sglang"]) == 1 and calls["split_k"] == []


def test_the_package_neither_hooks_the_matmul_nor_takes_the_old_setting():
    assert matmul_hook.TARGET not in {row.target for row in sglang_plugin.hook_table()}
    assert "gemm" not in env_settings({})
    with pytest.raises(ValueError, match=rf"{GEMM_ENV} is set \('plugin'\) but was removed: .*benchmark/gemm_splitk/"):
        env_settings({GEMM_ENV: "plugin"})
    assert GEMM_ENV in REMOVED_ENV
    # The old default asked for SGLang's matmul, which now always runs: scripts that spelled it out keep working.
    assert env_settings({GEMM_ENV: "sglang"}) == env_settings({})


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
