"""SGLang's real batch-invariant matmul functions, wrapped by the plugin: ours in the plugin's runs, SGLang's otherwise.

On CPU the plugin's GEMM takes its torch path; SGLang's own (Triton) route
cannot run without a GPU, so "SGLang's own" is recognised by giving exactly
the outcome SGLang's unwrapped function gives.
"""

import dataclasses

import pytest
import torch
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_detspec import sglang_plugin
from sglang_detspec.config import GEMM_ENV, DetSpecConfig, env_settings, reset_config
from sglang_detspec.ops.gemm import linear
from sglang_detspec.sglang_plugin import gemm_hook

register_cpu_ci(est_time=30, suite="detspec-unit-cpu")

OURS = DetSpecConfig(deterministic=True, gemm="plugin", source="server_args")  # no speculative decoding: the GEMM still counts


@pytest.fixture(scope="module")
def bio():
    """SGLang's batch-invariant ops module after SGLang's own loader applied the plugin's hooks."""
    from sglang.srt.batch_invariant_ops import batch_invariant_ops
    from sglang.srt.plugins import load_plugins

    load_plugins()
    yield batch_invariant_ops
    reset_config()


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


def test_sglangs_matmul_is_wrapped_once_where_its_callers_look_it_up(bio):
    import sglang.srt.batch_invariant_ops as package

    wrapped = bio.matmul_persistent
    assert wrapped.__wrapped__.__module__ == bio.__name__ and not hasattr(wrapped.__wrapped__, "__wrapped__")
    assert package.matmul_persistent is wrapped  # the package's re-export is rebound too
    assert gemm_hook.TARGET == f"{bio.__name__}.matmul_persistent"


def test_the_plugins_runs_get_the_plugins_gemm(bio, bag):
    bag(OURS)
    a, w, bias = operands()
    b = w.t()  # aten::mm's second operand for F.linear: the weight's transpose, a view
    assert torch.equal(bio.mm_batch_invariant(a, b), linear(a, w))
    assert torch.equal(bio.addmm_batch_invariant(bias, a, b), linear(a, w, bias))
    out = torch.empty(5, 48, dtype=torch.bfloat16)
    assert bio.mm_out_batch_invariant(a, b, out=out) is out and torch.equal(out, linear(a, w))
    assert torch.equal(bio.matmul_persistent(a, b, bias=bias), linear(a, w, bias))


@pytest.mark.parametrize("case", ["fp32", "out_dtype", "2d_bias", "mixed"])
def test_what_the_plugins_gemm_does_not_cover_goes_to_sglang(bio, bag, case):
    bag(OURS)
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
    original = bio.matmul_persistent.__wrapped__
    want = outcome(original, *args, **kwargs)
    assert isinstance(want, tuple), "SGLang's own route ran on CPU: compare tensors instead"
    assert outcome(bio.matmul_persistent, *args, **kwargs) == want


@pytest.mark.parametrize("config", [dataclasses.replace(OURS, deterministic=False),
                                    dataclasses.replace(OURS, disabled=True),
                                    dataclasses.replace(OURS, gemm="sglang")],
                         ids=["not_deterministic", "disabled", "gemm_sglang"])
def test_other_runs_keep_sglangs_matmul(bio, bag, config):
    bag(config)
    a, w, bias = operands()
    original = bio.matmul_persistent.__wrapped__
    want = outcome(original, a, w.t(), bias=bias)
    assert isinstance(want, tuple), "SGLang's own route ran on CPU: compare tensors instead"
    assert outcome(bio.addmm_batch_invariant, bias, a, w.t()) == want
    assert outcome(bio.mm_batch_invariant, a, w.t()) == outcome(original, a, w.t())


def test_the_setting():
    assert env_settings({})["gemm"] == "sglang"  # SGLang's own GEMM measured faster on the H200
    assert DetSpecConfig().gemm == "sglang"
    assert env_settings({GEMM_ENV: " Plugin "})["gemm"] == "plugin"
    with pytest.raises(ValueError, match=rf"{GEMM_ENV} must be one of \('sglang', 'plugin'\), got 'cublas'"):
        env_settings({GEMM_ENV: "cublas"})
    assert "gemm='plugin'" in OURS.describe()


def test_the_hook_is_required_where_the_bag_asks_for_it(bio):
    assert sglang_plugin.required_by(OURS) == {gemm_hook.TARGET}
    for other in (dataclasses.replace(OURS, gemm="sglang"), dataclasses.replace(OURS, deterministic=False),
                  dataclasses.replace(OURS, disabled=True)):
        assert gemm_hook.TARGET not in sglang_plugin.required_by(other)
    row = next(r for r in sglang_plugin.hook_table() if r.target == gemm_hook.TARGET)
    assert row.kind == "AROUND" and row.absent_ok  # optional unless the bag asks for it
    assert sglang_plugin.hook_problems(config=OURS) == []


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__, "-v"]))
