"""The tiny MoE / MLA / FP8 models (``scripts/tiny_families.py``) through SGLang 0.5.23's own config and loader code.

SGLang's model classes cannot be built on a CPU-only host (their rotary and
KV-cache modules import GPU kernels), so the weight names are checked against
the loader's own mappings: ``FusedMoE.make_expert_params_mapping`` for the
experts, the DeepSeek loader's NEXTN configuration for the NEXTN layer, and
SGLang's ``Fp8Config`` and ``block_quant_dequant`` for the FP8 blocks.
"""

import importlib.util
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from sglang.test.ci.ci_register import register_cpu_ci
import torch
from safetensors import safe_open

register_cpu_ci(est_time=60, suite="detspec-unit-cpu")

ROOT = Path(__file__).resolve().parents[3]


def _load(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def families():
    return _load("tiny_families")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, families):
    out = tmp_path_factory.mktemp("families")
    families.main(str(out))
    return out


def tensors(folder: Path) -> dict:
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def model_config(path: Path, **kwargs):
    from sglang.srt.configs.model_config import AttentionArch, ModelConfig

    return ModelConfig(str(path), **kwargs), AttentionArch


@pytest.mark.parametrize("folder, arch, mla, quantization", [
    ("deepseek_v3", "DeepseekV3ForCausalLM", True, None),
    ("deepseek_v3_fp8", "DeepseekV3ForCausalLM", True, "fp8"),
    ("qwen3_moe", "Qwen3MoeForCausalLM", False, None),
    ("qwen3_moe_eagle3", "LlamaForCausalLMEagle3", False, None),
])
def test_configs_parse_with_sglang_model_config_and_resolve_in_its_registry(tiny, folder, arch, mla, quantization):
    from sglang.srt.models.registry import ModelRegistry

    config, attention = model_config(tiny / folder)
    assert config.hf_config.architectures == [arch]
    assert (config.attention_arch == attention.MLA) is mla
    assert config.quantization == quantization
    cls, name = ModelRegistry.resolve_model_cls(config.hf_config.architectures)
    assert name == arch and cls.__name__ == arch


@pytest.mark.parametrize("folder", ["deepseek_v3", "deepseek_v3_fp8"])
def test_sglang_serves_the_deepseek_checkpoint_as_its_own_nextn_draft(tiny, folder):
    from sglang.srt.models.registry import ModelRegistry

    draft, _ = model_config(tiny / folder, is_draft_model=True)
    assert draft.hf_config.architectures == ["DeepseekV3ForCausalLMNextN"]
    assert ModelRegistry.resolve_model_cls(draft.hf_config.architectures)[1] == "DeepseekV3ForCausalLMNextN"


def test_the_nextn_layer_sits_where_sglangs_deepseek_loader_reads_it(tiny):
    from sglang.srt.models.deepseek_common.deepseek_weight_loader import DeepseekV2WeightLoaderMixin

    config, _ = model_config(tiny / "deepseek_v3")
    # The loader's own rule, on a stand-in carrying only the config it reads.
    conf = DeepseekV2WeightLoaderMixin._initialize_nextn_conf(SimpleNamespace(config=config.hf_config), True)
    names = tensors(tiny / "deepseek_v3")
    layer = [n for n in names if n.startswith(conf.nextn_layer_prefix + ".")]
    for spec_name in conf.nextn_spec_weight_names:
        assert any(spec_name in n for n in layer), spec_name
    # Its decoder block: MLA attention and an MoE MLP, as the trunk's MoE layer has them.
    block = {n[len(conf.nextn_layer_prefix):] for n in layer if not any(s in n for s in conf.nextn_spec_weight_names)}
    trunk = {n[len("model.layers.1"):] for n in names if n.startswith("model.layers.1.")}
    assert trunk <= block
    # The target's own load skips layers from num_hidden_layers on: the trunk is layers 0..n-1.
    assert conf.nextn_layer_prefix == f"model.layers.{config.hf_config.num_hidden_layers}"


@pytest.mark.parametrize("folder, experts_key", [("deepseek_v3", "n_routed_experts"), ("qwen3_moe", "num_experts")])
def test_expert_weights_match_sglangs_expert_mapping(tiny, folder, experts_key):
    from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE

    config = json.loads((tiny / folder / "config.json").read_text())
    count = config[experts_key]
    mapping = FusedMoE.make_expert_params_mapping(ckpt_gate_proj_name="gate_proj", ckpt_down_proj_name="down_proj",
                                                  ckpt_up_proj_name="up_proj", num_experts=count)
    experts = [n for n in tensors(tiny / folder) if ".mlp.experts." in n]
    seen = set()
    for name in experts:
        hits = [(e, shard) for _, weight_name, e, shard in mapping if weight_name in name]
        assert len(hits) == 1, name  # exactly one (expert, shard) of SGLang's mapping takes it
        layer = name.split(".mlp.")[0]
        seen.add((layer, *hits[0]))
    layers = {s[0] for s in seen}
    assert layers and seen == {(layer, e, shard) for layer in layers for e in range(count) for shard in ("w1", "w2", "w3")}


def test_fp8_scales_have_the_shapes_sglangs_block_fp8_loader_expects(tiny, families):
    from sglang.srt.layers.quantization.fp8 import Fp8Config
    from sglang.srt.layers.quantization.fp8_utils import block_quant_dequant

    config = json.loads((tiny / "deepseek_v3_fp8" / "config.json").read_text())
    quant = Fp8Config.from_config(config["quantization_config"])
    assert quant.is_checkpoint_fp8_serialized and quant.weight_block_size == [128, 128]
    block_n, block_k = quant.weight_block_size
    fp8, bf16 = tensors(tiny / "deepseek_v3_fp8"), tensors(tiny / "deepseek_v3")
    scaled = [n for n in fp8 if n.endswith(".weight_scale_inv")]
    assert scaled and {n[: -len("_scale_inv")] for n in scaled} == {n for n in bf16 if families.is_fp8_projection(n)}
    for name in scaled:
        weight = name[: -len("_scale_inv")]
        q, s = fp8[weight], fp8[name]
        n, k = q.shape
        assert q.dtype == torch.float8_e4m3fn and s.dtype == torch.float32
        assert tuple(s.shape) == ((n + block_n - 1) // block_n, (k + block_k - 1) // block_k), name
        back = block_quant_dequant(q, s, quant.weight_block_size, torch.float32)
        ref = bf16[weight].float()
        # e4m3 keeps 3 mantissa bits: each element within half a step (1/16 of its binade) of the bf16 weight.
        assert torch.all((back - ref).abs() <= ref.abs() / 16 + s.max() * 2.0**-9), name
    # What stays bf16 in DeepSeek-V3's FP8 checkpoint stays bf16 here.
    for name in ("model.layers.1.mlp.gate.weight", "model.layers.2.eh_proj.weight", "lm_head.weight"):
        assert fp8[name].dtype == torch.bfloat16
    assert fp8["model.layers.1.mlp.gate.e_score_correction_bias"].dtype == torch.float32


def test_quantize_block_fp8_rejects_bad_input(families):
    with pytest.raises(ValueError, match="2-D floating"):
        families.quantize_block_fp8(torch.zeros(4))
    with pytest.raises(ValueError, match="block sides"):
        families.quantize_block_fp8(torch.zeros(4, 4), (0, 128))
    q, s = families.quantize_block_fp8(torch.zeros(130, 10))
    assert s.shape == (2, 1) and torch.all(s == 1) and torch.all(q.float() == 0)


@pytest.mark.parametrize("folder", ["deepseek_v3", "deepseek_v3_fp8", "qwen3_moe"])
def test_family_targets_carry_the_word_level_tokenizer(tiny, folder):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny / folder))
    assert tok.encode("t7 t4095", add_special_tokens=False) == [7, 4095]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
