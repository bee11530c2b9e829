"""SGLANG_DETSPEC_MOE_TABLES=checked on the GPU: the start-up check of SGLang's tuned fused-MoE tables.

One bf16 expert layer of Qwen3-30B-A3B's shape on one GPU (128 experts, intermediate 768, hidden 2048, top-8;
random weights), SGLang's own ``fused_experts`` and its tuned files for this GPU. The check's verdict is
recorded, not assumed (on one H100 every config the probe tried gave the tile's bits:
``docs/benchmarks/moe_tile_probe/2026-12-07-h100``); whatever it is, the lookup SGLang's forward makes must then
answer what the verdict says, and where the tables were admitted their output must be the tile's at sizes the
check did not try. Independent oracle: a float32 torch MoE of the same tokens, close to either answer.
"""

import importlib
from types import SimpleNamespace

import pytest
import torch

from _register import register_cuda_ci

register_cuda_ci(est_time=90, suite="detspec-kernels-cuda")

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU (SGLang's fused-MoE kernel is Triton)", allow_module_level=True)

from sglang.srt.layers.moe.moe_runner import MoeRunnerConfig  # noqa: E402
from sglang.srt.layers.moe.moe_runner import triton_utils  # noqa: E402
from sglang.srt.runtime_context import get_context, get_exec  # noqa: E402

from sglang_detspec.config import DEFAULT_MOE_TILE, MOE_TILE_FIELDS  # noqa: E402
from sglang_detspec.sglang_plugin import moe_tables  # noqa: E402

SGL = importlib.import_module(moe_tables.CONFIG_MODULE)
E, N, K, TOPK = 128, 768, 2048, 8
TILE = dict(zip(MOE_TILE_FIELDS, DEFAULT_MOE_TILE))
MAX_TOKENS = 2048


@pytest.fixture(scope="module")
def layer():
    g = torch.Generator(device="cuda").manual_seed(1)
    w13 = torch.empty(E, 2 * N, K, dtype=torch.bfloat16, device="cuda").normal_(0, K ** -0.5, generator=g)
    w2 = torch.empty(E, K, N, dtype=torch.bfloat16, device="cuda").normal_(0, N ** -0.5, generator=g)
    cfg = MoeRunnerConfig(num_experts=E, num_local_experts=E, hidden_size=K, top_k=TOPK,
                          intermediate_size_per_partition=N, params_dtype=torch.bfloat16, inplace=True)
    return SimpleNamespace(w13_weight=w13, w2_weight=w2, moe_runner_config=cfg)


@pytest.fixture
def deterministic(monkeypatch):
    """SGLang's lookup and override slot restored after; deterministic inference and batch-invariant mode on, as
    a server under --enable-deterministic-inference runs its forwards."""
    from sglang.srt.batch_invariant_ops import disable_batch_invariant_mode, enable_batch_invariant_mode

    lookup = SGL.get_moe_configs  # the test installs a TableSource in its place, which has no cache
    monkeypatch.setattr(SGL, "get_moe_configs", lookup)
    monkeypatch.setattr(triton_utils, "_config", None)
    lookup.cache_clear()
    with get_context().override_server_args(), get_exec().deterministic.override(enable_deterministic_inference=True):
        enable_batch_invariant_mode()
        try:
            yield
        finally:
            disable_batch_invariant_mode()
            lookup.cache_clear()


def fp32_moe(layer, run_tokens):
    """The float32 torch MoE of the first ``run_tokens`` tokens of moe_tables.layer_runner's fixed inputs."""
    g = torch.Generator(device="cuda").manual_seed(moe_tables.SEED)
    x = torch.randn(MAX_TOKENS, K, generator=g, device="cuda").to(torch.bfloat16)[:run_tokens].float()
    w, ids = torch.rand(MAX_TOKENS, E, generator=g, device="cuda").softmax(-1).topk(TOPK, -1)
    w, ids = (w / w.sum(-1, keepdim=True))[:run_tokens], ids[:run_tokens]
    out = torch.zeros(run_tokens, K, device="cuda")
    for e in range(E):
        rows, slots = (ids == e).nonzero(as_tuple=True)
        if rows.numel():
            gate, up = (x[rows] @ layer.w13_weight[e].float().T).chunk(2, dim=-1)
            out.index_add_(0, rows, w[rows, slots, None] * ((torch.nn.functional.silu(gate) * up)
                                                             @ layer.w2_weight[e].float().T))
    return out


def test_the_check_decides_and_the_lookup_answers_its_verdict(layer, deterministic):
    key = moe_tables.shape_key(layer)
    up, down = moe_tables.read_tuned(SGL.get_moe_configs, key)
    if up is None:
        pytest.skip(f"SGLang ships no tuned table for E={E}, N={N} on {torch.cuda.get_device_name()}")
    source = moe_tables.TableSource(reference={1: TILE}, original=SGL.get_moe_configs)
    SGL.get_moe_configs = source
    verdicts = moe_tables.admit_tables(source, {key: (up, down)}, {key: layer}, MAX_TOKENS)
    print(f"\nverdict on {torch.cuda.get_device_name()}: {verdicts[key]}")
    admitted = verdicts[key].startswith("tuned")
    w13, w2 = layer.w13_weight.shape, layer.w2_weight.shape
    for m in (3, 100, 700, MAX_TOKENS):
        config, _ = SGL.try_get_optimal_moe_config(w13, w2, TOPK, None, m, return_down_config=True)
        assert config == (moe_tables.nearest(up, m) if admitted else TILE), m
    # Sizes the check did not try: the answer in force gives the tile's bytes there too, and both are near fp32.
    run = moe_tables.layer_runner(layer, MAX_TOKENS)
    for m in (5, 77, 300, 1000):
        served = run(m)
        source.tables[(key, False)], source.tables[(key, True)] = {1: TILE}, None
        tile = run(m)
        source.tables[(key, False)], source.tables[(key, True)] = (up, down) if admitted else ({1: TILE}, None)
        if admitted:
            assert torch.equal(served.view(torch.uint8), tile.view(torch.uint8)), m
        ref = fp32_moe(layer, m)
        assert (served.float() - ref).abs().max().item() < 0.05 * ref.abs().max().item() + 1e-2, m


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", "-s"]))
