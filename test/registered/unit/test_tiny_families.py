"""The tiny MoE / MLA / FP8 models (``scripts/tiny_families.py``) through SGLang 0.5.23's own config and loader code.

SGLang's model classes cannot be built on a CPU-only host (their rotary and
KV-cache modules import GPU kernels), so the weight names are checked against
the loader's own mappings: ``FusedMoE.make_expert_params_mapping`` for the
experts, the DeepSeek loader's NEXTN configuration for the NEXTN layer, and
SGLang's ``Fp8Config`` and ``block_quant_dequant`` for the FP8 blocks.

Hugging Face transformers' own ``DeepseekV3ForCausalLM`` and
``Qwen3MoeForCausalLM`` do run on a CPU: they load the written checkpoints
(the FP8 copy dequantized with SGLang's ``block_quant_dequant``: transformers'
own FP8 path needs ``accelerate``, no dependency of this project) and show, in bf16, that
the targets are sensitive (a relative 1e-3 change of one layer's output moves
some logit), reproducible, and still near the bigram their drafts copy.
"""

import importlib.util
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from sglang.test.ci.ci_register import register_cpu_ci
import torch
import torch.nn.functional as F
from safetensors import safe_open
from torch.overrides import TorchFunctionMode

register_cpu_ci(est_time=120, suite="detspec-unit-cpu")

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


@pytest.mark.parametrize("folder", ["deepseek_v3", "deepseek_v3_fp8"])
def test_the_deepseek_width_is_one_sglangs_fused_nextn_norm_takes(tiny, families, folder):
    """SGLang's DeepSeek NEXTN draft runs ``fused_eh_norm`` on CUDA with no fallback: a width it refuses fails the
    draft's CUDA-graph capture at start-up (the dense models' 256 did)."""
    from sglang.kernels.ops.layernorm.fused_eh_norm import is_supported_fused_eh_norm_hidden_size

    draft, _ = model_config(tiny / folder, is_draft_model=True)
    assert draft.hf_config.hidden_size == families.DEEPSEEK_HIDDEN
    assert is_supported_fused_eh_norm_hidden_size(draft.hf_config.hidden_size)
    assert not is_supported_fused_eh_norm_hidden_size(families.HIDDEN)  # why the DeepSeek targets are wider


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


def test_the_set_carries_the_version_file_the_e2e_suites_require(tiny, families):
    """An older set (no version file) counts as incomplete, so the E2E suites write the sensitive targets again."""
    written = json.loads((tiny / families.VERSION_FILE).read_text())
    assert written == {"seed": families.SEED, "deepseek_seed": families.DEEPSEEK_SEED, "hidden": families.HIDDEN,
                       "deepseek_hidden": families.DEEPSEEK_HIDDEN, "layer_out_scale": families.LAYER_OUT_SCALE,
                       "folders": list(families.FOLDERS)}
    sys.path.insert(0, str(ROOT / "test" / "registered" / "e2e"))
    try:
        e2e = importlib.import_module("_e2e")
    finally:
        sys.path.remove(str(ROOT / "test" / "registered" / "e2e"))
    assert families.VERSION_FILE in e2e.TINY_FILES


# -- sensitivity, on transformers' own forwards ------------------------------------------

# The size of a kernel's rounding difference relative to a layer's output: about one bf16 step of it.
RELATIVE_CHANGE = 1e-3
PROMPT_TOKENS = 8


class ScaledLinear(TorchFunctionMode):
    """Every ``F.linear`` on ``weight`` (matched by storage, so a per-expert slice works) computed once in float32 and
    scaled by ``factor`` before its single rounding to the activation dtype.

    A relative 1e-3 change cannot be written into bf16 weights or outputs (it
    rounds back to the same value): it has to enter before the output's
    rounding, where a kernel's accumulation order does. The reference runs
    under the same mode with ``factor`` 1, so only the factor differs.
    """

    def __init__(self, weight: torch.Tensor, factor: float):
        super().__init__()
        self.key = (weight.data_ptr(), tuple(weight.shape))
        self.factor = factor
        self.rows = 0  # activation rows that went through the weight

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear and (args[1].data_ptr(), tuple(args[1].shape)) == self.key:
            x, w = args[0], args[1]
            bias = args[2] if len(args) > 2 else kwargs.get("bias")
            assert bias is None, "the scaled projections have no bias"
            self.rows += x.reshape(-1, x.shape[-1]).shape[0]
            return (F.linear(x.float(), w.float()) * self.factor).to(x.dtype)
        return func(*args, **kwargs)


def dequantized_copy(fp8_folder: Path, out: Path, families) -> Path:
    """The FP8 checkpoint with every block-quantized weight dequantized by SGLang's ``block_quant_dequant``."""
    from sglang.srt.layers.quantization.fp8_utils import block_quant_dequant

    config = json.loads((fp8_folder / "config.json").read_text())
    block = config.pop("quantization_config")["weight_block_size"]
    stored = tensors(fp8_folder)
    weights = {}
    for name, value in stored.items():
        if name.endswith(".weight_scale_inv"):
            continue
        if value.dtype == torch.float8_e4m3fn:
            value = block_quant_dequant(value, stored[name[: -len("weight")] + "weight_scale_inv"], block, torch.float32)
        weights[name] = value
    families.base.write(str(out), config, weights)
    return out


@pytest.fixture(scope="module")
def hf_models(tiny, families, tmp_path_factory):
    """transformers' own model of each family target, bf16 on the CPU, eager experts (a per-expert ``F.linear``)."""
    from transformers import AutoModelForCausalLM

    paths = {"deepseek_v3": tiny / "deepseek_v3", "qwen3_moe": tiny / "qwen3_moe",
             "deepseek_v3_fp8": dequantized_copy(tiny / "deepseek_v3_fp8", tmp_path_factory.mktemp("fp8_dequant"),
                                                 families)}
    loaded = {}
    for folder, path in paths.items():
        model, info = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.bfloat16, experts_implementation="eager",
                                                           output_loading_info=True)
        loaded[folder] = (model.eval(), info)
    return loaded


def prompt(model, shape=(1, PROMPT_TOKENS), seed=0) -> torch.Tensor:
    """Fixed random token ids of the model's vocabulary, past the special ids 0-2."""
    return torch.randint(3, model.config.vocab_size, shape, generator=torch.Generator().manual_seed(seed))


def logits_with(model, weight: torch.Tensor, factor: float) -> tuple[torch.Tensor, int]:
    with torch.no_grad(), ScaledLinear(weight, factor) as mode:
        return model(prompt(model)).logits, mode.rows


def perturbed_projections(model) -> dict[str, torch.Tensor]:
    """Every output projection whose rounding a family's kernels own: MLA / attention o_proj, experts' down_proj."""
    out = {}
    for i, layer in enumerate(model.model.layers):
        out[f"layer{i}.o_proj"] = layer.self_attn.o_proj.weight
        mlp = layer.mlp
        if hasattr(mlp, "experts"):
            for e in range(mlp.experts.down_proj.shape[0]):
                out[f"layer{i}.expert{e}.down_proj"] = mlp.experts.down_proj[e]
            if hasattr(mlp, "shared_experts"):
                out[f"layer{i}.shared_expert.down_proj"] = mlp.shared_experts.down_proj.weight
    return out


@pytest.mark.parametrize("folder", ["deepseek_v3", "deepseek_v3_fp8", "qwen3_moe"])
def test_transformers_loads_every_trunk_weight_of_the_written_targets(hf_models, families, folder):
    model, info = hf_models[folder]
    assert not info["missing_keys"] and not info["mismatched_keys"], info
    # Only DeepSeek's NEXTN layer (SGLang's draft, not part of transformers' model) is left unread.
    nextn = f"model.layers.{families.DEEPSEEK_LAYERS}."
    assert all(k.startswith(nextn) for k in info["unexpected_keys"]), info["unexpected_keys"]
    assert next(model.parameters()).dtype == torch.bfloat16


@pytest.mark.parametrize("folder", ["deepseek_v3", "deepseek_v3_fp8", "qwen3_moe"])
def test_a_relative_1e3_change_of_any_one_expert_or_attention_output_moves_the_bf16_logits(hf_models, folder):
    model, _ = hf_models[folder]
    used = []
    for name, weight in perturbed_projections(model).items():
        reference, rows = logits_with(model, weight, 1.0)
        if rows == 0:  # an expert the prompt's router did not pick
            continue
        changed, _ = logits_with(model, weight, 1.0 + RELATIVE_CHANGE)
        assert not torch.equal(changed, reference), f"{folder}: {name} x (1 + 1e-3) left every bf16 logit as it was"
        used.append(name)
    assert sum(".expert" in n for n in used) >= 4 and any("o_proj" in n for n in used), used


@pytest.mark.parametrize("folder", ["deepseek_v3", "deepseek_v3_fp8", "qwen3_moe"])
def test_the_unperturbed_bf16_forward_is_reproducible(hf_models, folder):
    model, _ = hf_models[folder]
    with torch.no_grad():
        first, second = model(prompt(model)).logits, model(prompt(model)).logits
    assert first.dtype == torch.bfloat16 and torch.equal(first, second)
    # And the float32 reference path of the sensitivity test gives one answer too.
    weight = model.model.layers[0].self_attn.o_proj.weight
    assert torch.equal(logits_with(model, weight, 1.0)[0], logits_with(model, weight, 1.0)[0])


def test_the_fp8_copy_is_the_block_quantized_model_not_the_bf16_one(hf_models):
    bf16, fp8 = hf_models["deepseek_v3"][0], hf_models["deepseek_v3_fp8"][0]
    with torch.no_grad():
        assert not torch.equal(bf16(prompt(bf16)).logits, fp8(prompt(fp8)).logits)


# Lowest mean per-position acceptance (1 - total variation at temperature 1) of the bigram drafts
# the sensitive targets keep: a 3-step chain then accepts about 3 tokens per verify.
MIN_BIGRAM_ACCEPT = 0.8


@pytest.mark.parametrize("folder", ["deepseek_v3", "qwen3_moe"])
def test_the_targets_stay_near_the_bigram_their_drafts_copy(hf_models, tiny, families, folder):
    model, _ = hf_models[folder]
    if folder == "deepseek_v3":  # the NEXTN layer reads only the token's embedding and its block adds nothing
        stored, nextn = tensors(tiny / folder), f"model.layers.{families.DEEPSEEK_LAYERS}"
        eh, hidden = stored[f"{nextn}.eh_proj.weight"].float(), families.DEEPSEEK_HIDDEN
        assert torch.equal(eh, torch.cat([torch.eye(hidden), torch.zeros(hidden, hidden)], 1))
        assert not stored[f"{nextn}.self_attn.o_proj.weight"].any()
        assert not stored[f"{nextn}.mlp.shared_experts.down_proj.weight"].any()
    ids = prompt(model, (4, 64), seed=1)
    with torch.no_grad():
        target = model(ids).logits.float().softmax(-1)
    embed, head = model.model.embed_tokens.weight.float(), model.lm_head.weight.float()
    bigram = (F.rms_norm(embed[ids], (model.config.hidden_size,), eps=1e-6) @ head.T).softmax(-1)
    accept = 1 - 0.5 * (target - bigram).abs().sum(-1)
    assert accept.mean() >= MIN_BIGRAM_ACCEPT, accept.mean()
    assert accept.mean() < 0.97  # and not the bigram itself: the layers' outputs count


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
