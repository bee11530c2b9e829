"""SGLang's real RMSNorm layer with the plugin's hook applied by SGLang's own loader, on CPU.

``forward_cuda`` is the method SGLang's op dispatch binds on CUDA (on CPU it
binds ``forward_cpu``), so the tests call it by name on CPU tensors: with the
bag active ``norm(x, residual)`` must return the plugin's op (its torch
reference here), and every other call (``norm(x)`` included) must do
whatever SGLang's own ``forward_cuda`` does, error included, without the
plugin's op running (a recorder around it counts its calls).
"""

import dataclasses

import pytest
import torch
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_detspec import sglang_plugin
from sglang_detspec.config import DetSpecConfig, reset_config
from sglang_detspec.ops.rmsnorm_ref import rms_norm_reference
from sglang_detspec.sglang_plugin import norm_hook

register_cpu_ci(est_time=10, suite="detspec-unit-cpu")

ACTIVE = DetSpecConfig(deterministic=True, source="server_args")
INACTIVE = dataclasses.replace(ACTIVE, deterministic=False)
DISABLED = dataclasses.replace(ACTIVE, disabled=True)
BITS = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}


@pytest.fixture(scope="module")
def loaded():
    from sglang.srt.plugins import load_plugins

    load_plugins()
    yield
    reset_config()


def same_bits(a, b) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(BITS[a.dtype]), b.view(BITS[b.dtype]))


def layer_and_inputs(h=256, dtype=torch.bfloat16, m=12, cls=None, **layer_kwargs):
    from sglang.srt.layers.layernorm import RMSNorm

    gen = torch.Generator().manual_seed(h + m)
    layer = (cls or RMSNorm)(h, eps=1e-5, **layer_kwargs)
    layer.weight.data = (torch.rand(h, generator=gen) + 0.5).to(dtype)
    x = (torch.randn(m, h, generator=gen) * 3).to(dtype)
    r = (torch.randn(m, h, generator=gen) * 5).to(dtype)
    return layer, x, r


def outcome(fn, *args, **kwargs):
    """What a call returns, or the error it raises (SGLang's CUDA branches raise on CPU)."""
    try:
        out = fn(*args, **kwargs)
    except Exception as err:  # noqa: BLE001 - compare SGLang's own failure mode
        return type(err), str(err)
    return out if isinstance(out, tuple) else (out,)


@pytest.fixture()
def plugin_calls(monkeypatch):
    """The calls the hook made to the plugin's fused op (a recorder around the real op)."""
    seen = []
    real = norm_hook.fused_add_rms_norm

    def recorded(*args, **kwargs):
        seen.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(norm_hook, "fused_add_rms_norm", recorded)
    return seen


def same_outcome(a, b) -> bool:
    if isinstance(a[0], type) or isinstance(b[0], type):
        return a == b
    return len(a) == len(b) and all(same_bits(x, y) for x, y in zip(a, b))


def test_the_row_is_required_and_sglangs_loader_wraps_the_method_once(loaded):
    from sglang.srt.layers.layernorm import RMSNorm

    rows = [r for r in sglang_plugin.hook_table() if r.target == norm_hook.TARGET]
    assert len(rows) == 1 and rows[0].kind == "AROUND" and rows[0].absent_ok is None
    assert rows[0].hook is norm_hook.batch_invariant_forward
    hooked = RMSNorm.forward_cuda
    assert hooked.__wrapped__.__qualname__ == "RMSNorm.forward_cuda" and not hasattr(hooked.__wrapped__, "__wrapped__")


@pytest.mark.parametrize("dtype", list(BITS))
@pytest.mark.parametrize("h", (128, 4096, 5120))
def test_active_bag_runs_the_plugins_norm_through_sglangs_layer(loaded, bag, plugin_calls, dtype, h):
    bag(ACTIVE)
    layer, x, r = layer_and_inputs(h, dtype)
    before = (x.clone(), r.clone())
    out, res = layer.forward_cuda(x, r)
    assert len(plugin_calls) == 1
    want_out, want_res = rms_norm_reference(x, layer.weight.data, 1e-5, r)
    assert same_bits(out, want_out) and same_bits(res, want_res)
    assert same_bits(x, before[0]) and same_bits(r, before[1])  # out of place, as SGLang's deterministic path
    # 3-D input (Qwen3's q/k norm passes [tokens, heads, head_dim]); keyword call as the decoder layers do.
    out3, res3 = layer.forward_cuda(x.reshape(3, 4, h), residual=r.reshape(3, 4, h))
    assert out3.shape == (3, 4, h) and same_bits(out3.reshape(12, h), want_out) and same_bits(res3.reshape(12, h),
                                                                                                  want_res)


@pytest.mark.parametrize("shape", [(12, 4096), (3, 4, 128), (40, 32, 128)], ids=["hidden", "qk_3d", "qk_heads"])
def test_active_bag_leaves_the_plain_norm_to_sglang(loaded, bag, plugin_calls, shape):
    """``norm(x)``, hidden-sized or per head (Qwen3's q / k norms): SGLang's own batch-invariant kernel runs.

    On CPU that kernel is a Triton launch that cannot run, so SGLang's
    outcome is its error; the recorder shows the plugin's op did not run.
    """
    from sglang.srt.layers.layernorm import RMSNorm

    bag(ACTIVE)
    layer, x, _ = layer_and_inputs(shape[-1], m=1)
    x = torch.randn(*shape).to(torch.bfloat16)
    original = RMSNorm.forward_cuda.__wrapped__
    assert same_outcome(outcome(layer.forward_cuda, x), outcome(original, layer, x))
    assert same_outcome(outcome(layer.forward_cuda, x=x), outcome(original, layer, x))
    assert plugin_calls == []


def test_active_bag_matches_sglangs_own_residual_semantics(loaded, bag):
    """The new residual is the one SGLang's deterministic path returns, bit for bit."""
    bag(ACTIVE)
    layer, x, r = layer_and_inputs(4096)
    _, res = layer.forward_cuda(x, r)
    _, sglang_res = layer.forward_native(x, r)
    assert same_bits(res, sglang_res)


@pytest.mark.parametrize("config", [INACTIVE, DISABLED], ids=["deterministic-off", "plugin-disabled"])
def test_without_an_active_bag_sglangs_forward_cuda_runs(loaded, bag, config):
    from sglang.srt.layers.layernorm import RMSNorm

    bag(config)
    layer, x, r = layer_and_inputs()
    original = RMSNorm.forward_cuda.__wrapped__
    for args in ((x,), (x, r)):
        got, want = outcome(layer.forward_cuda, *args), outcome(original, layer, *args)
        assert same_outcome(got, want)
        # On CPU SGLang's non-deterministic branch needs sgl_kernel's CUDA ops: the hook delegated.
        assert isinstance(want[0], type) or torch.cuda.is_available()


def _own_native_cls():
    from sglang.srt.layers.layernorm import RMSNorm

    class OwnNative(RMSNorm):
        def forward_native(self, x, residual=None, post_residual_addition=None, quant_linear=None):
            return super().forward_native(x, residual, post_residual_addition) if residual is None else (x, residual)

    return OwnNative


VARIANTS = {
    "var_hidden_size": (dict(var_hidden_size=128), {}),
    "cast_x_before_out_mul": (dict(cast_x_before_out_mul=True), {}),
    "override_orig_dtype": (dict(override_orig_dtype=torch.float32), {}),
    "fp32_residual": (dict(fp32_residual=True), dict(residual_only=True)),
    "post_residual_addition": ({}, dict(post=True, residual_only=True)),
    "float32_residual_tensor": ({}, dict(residual_dtype=torch.float32, residual_only=True)),
    "own_forward_native": (dict(cls="own"), dict(residual_only=True)),
}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_variants_outside_the_op_keep_sglangs_path_with_an_active_bag(loaded, bag, name):
    from sglang.srt.layers.layernorm import RMSNorm

    bag(ACTIVE)
    layer_kwargs, call = VARIANTS[name]
    if layer_kwargs.get("cls") == "own":
        layer_kwargs = dict(cls=_own_native_cls())
    layer, x, r = layer_and_inputs(**layer_kwargs)
    r = r.to(call.get("residual_dtype", r.dtype))
    original = RMSNorm.forward_cuda.__wrapped__
    calls = [] if call.get("residual_only") else [(x,)]
    calls.append((x, r, r.clone()) if call.get("post") else (x, r))
    for args in calls:
        got, want = outcome(layer.forward_cuda, *args), outcome(original, layer, *args)
        assert same_outcome(got, want), name


def test_an_empty_batch_keeps_sglangs_path(loaded, bag, plugin_calls):
    """SGLang returns an empty batch's own tensors untouched (the residual with ``post_residual_addition``
    added); the hook must hand back exactly that, without running the plugin's op."""
    from sglang.srt.layers.layernorm import RMSNorm

    bag(ACTIVE)
    layer, x, r = layer_and_inputs()
    x0, r0 = x[:0], r[:0]
    original = RMSNorm.forward_cuda.__wrapped__
    got, want = layer.forward_cuda(x0, r0), original(layer, x0, r0)
    assert got[0] is x0 and got[1] is r0 and want[0] is x0 and want[1] is r0
    assert layer.forward_cuda(x0) is x0 and original(layer, x0) is x0
    post = torch.ones(0, 256, dtype=torch.bfloat16)
    got_post = layer.forward_cuda(x0, r0, post)
    assert got_post[0] is x0 and same_bits(got_post[1], original(layer, x0, r0, post)[1])
    assert plugin_calls == []


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__, "-v"]))
