"""Tiny random-weight targets of the families people speculate with: MoE, MLA and FP8.

Written by ``make_tiny_models.py`` beside its dense models (same vocabulary
and tokenizer, a generator of their own so the dense models' weights do not
move; Qwen3-MoE at their hidden size, which its EAGLE3 draft shares, the
DeepSeek targets at twice it, :data:`DEEPSEEK_HIDDEN`). Folders:

- ``deepseek_v3/``: ``DeepseekV3ForCausalLM`` with multi-head latent
  attention (MLA: ``q_lora_rank``, ``kv_lora_rank``, a rotary and a
  non-rotary part per head, DeepSeek-V3's head sizes), a dense layer 0, a
  mixture-of-experts layer 1 (routed experts behind a sigmoid, bias-corrected
  gate, ``noaux_tc``, plus one shared expert) and one NEXTN layer (layer 2,
  the layout ``models/deepseek_nextn.py`` loads: ``enorm``, ``hnorm``,
  ``eh_proj``, ``shared_head.norm`` and an MoE decoder block). Serve it with
  ``--speculative-algorithm NEXTN`` and itself as the draft.
- ``deepseek_v3_fp8/``: the same weights block-quantized to FP8 as
  DeepSeek-V3 ships them: ``quantization_config`` ``{"quant_method": "fp8",
  "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128,
  128]}``, every attention and MLP projection as ``float8_e4m3fn`` with a
  float32 ``weight_scale_inv`` of one entry per 128 x 128 block (the factor
  that multiplies the block back). Router, norms, ``eh_proj``, embedding and
  heads stay bf16, as in DeepSeek-V3.
- ``qwen3_moe/``: ``Qwen3MoeForCausalLM`` (per-head q/k norms, routed experts,
  no shared expert, every layer MoE) and ``qwen3_moe_eagle3/``, a one-layer
  ``LlamaForCausalLMEagle3`` draft for it over the whole vocabulary.

Every target is near a bigram model, as ``target/`` is, but not as near:
the output projections of its trunk (attention ``o_proj``, the dense MLP's,
every routed expert's and the shared expert's ``down_proj``) are drawn at
:data:`LAYER_OUT_SCALE` = 0.1 of a unit-gain projection, not ``target/``'s
1e-3, so each attention and MLP block adds about 5% (RMS) to the unit-RMS
residual. That makes the families' runs sensitive: a relative 1e-3 change of
one expert's, the MLA attention's or an FP8 projection's output before its
bf16 rounding (the size of a kernel's rounding difference: about one bf16
step of that output) moves an element of the bf16 residual by a step, and so
some bf16 logit. At 1e-3 a block's output was about a bf16 half-step of
the residual, and a 1e-3 change of it was nearly always rounded away. Measured
with Hugging Face transformers' own DeepSeek-V3 and Qwen3-MoE forwards in
bf16 on the written checkpoints (``test/registered/unit/test_tiny_families.py``
asserts it for every expert a short prompt routes to and every attention
output): a perturbed expert of the last layer changes the logits at 64 of
the 64 positions routed to it, on both targets, of a 32-token prompt (61
and 63 on the earlier set whose DeepSeek targets were 256 wide; at a scale
of 0.03 there, at 45 and 46).

The price is acceptance. The drafts copy the bigram (the NEXTN layer's
``eh_proj = [I | 0]`` keeps the embedding of the token read and its block's
output projections are zero; the EAGLE3 draft is ``make_tiny_models``'s),
and the targets' next-token distributions overlap it by about 0.88
(DeepSeek-V3) and 0.91 (Qwen3-MoE) at temperature 1 (one minus the total
variation, on random contexts; 0.994 at the old scale), so a 3-step chain
accepts about 3.3-3.5 tokens per verify and rejections, residual draws and
bonus tokens all run. On the earlier set, 0.2 left 0.77 and 0.82; 0.03 kept
0.96 and 0.97 but missed about 3 in 10 of the perturbations above.

Usage: python scripts/tiny_families.py OUT_DIR (``make_tiny_models.py`` runs it too)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the shared writers, when run as a script
import make_tiny_models as base  # noqa: E402

VOCAB, HIDDEN = base.VOCAB, base.HIDDEN
# SGLang 0.5.23's DeepSeek NEXTN draft joins its two normalized inputs in one fused CUDA kernel
# (kernels/ops/layernorm/fused_eh_norm.py, no fallback on CUDA) that takes hidden sizes above 256
# that are multiples of 256; at the dense models' 256 its CUDA-graph capture fails at start-up.
DEEPSEEK_HIDDEN = 2 * HIDDEN
SEED = 20261203  # apart from make_tiny_models' seed: adding these folders moved none of its weights
# The DeepSeek targets' own stream: their width (DEEPSEEK_HIDDEN) does not move Qwen3-MoE's weights.
DEEPSEEK_SEED = SEED + 1
# Output projections of the trunk (o_proj, down_proj of the dense MLP and of every expert): large
# enough that a rounding difference in one layer's output reaches the bf16 logits, small enough
# that the bigram drafts are still accepted about 9 times in 10 (the module docstring measures both).
LAYER_OUT_SCALE = 0.1
# Written last: its absence marks a set from an older generator (the E2E suites rewrite it).
VERSION_FILE = "tiny_families-v3.json"

# MLA sizes: DeepSeek-V3's per-head sizes (the attention kernels' MLA paths are built for
# them: 512 + 64 = 576 key dims), few heads.
MLA_HEADS = 4
Q_LORA_RANK = 256  # a multiple of 128: the fused q_a / kv_a projection keeps whole FP8 blocks
KV_LORA_RANK = 512
QK_NOPE_HEAD_DIM, QK_ROPE_HEAD_DIM, V_HEAD_DIM = 128, 64, 128
DENSE_INTER = 512
# Experts: sizes that are multiples of the FP8 block (SGLang refuses merged gate/up shards
# that are not), few enough to load in seconds.
ROUTED_EXPERTS, EXPERTS_PER_TOKEN, SHARED_EXPERTS, MOE_INTER = 8, 2, 1, 128
DEEPSEEK_LAYERS = 2  # layer 0 dense, layer 1 MoE; the NEXTN layer is layer 2
QWEN3_LAYERS, QWEN3_HEADS, QWEN3_KV_HEADS = 2, 4, 2

FP8_BLOCK = (128, 128)
FP8_MAX = torch.finfo(torch.float8_e4m3fn).max  # 448
# Checkpoint names of the projections DeepSeek-V3 stores in FP8 (norms, router, eh_proj, heads stay bf16).
FP8_PROJECTIONS = ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj",
                   "gate_proj", "up_proj", "down_proj")
FP8_QUANTIZATION_CONFIG = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                           "weight_block_size": list(FP8_BLOCK)}

FOLDERS = ("deepseek_v3", "deepseek_v3_fp8", "qwen3_moe", "qwen3_moe_eagle3")
TOKENIZER_FOLDERS = ("deepseek_v3", "deepseek_v3_fp8", "qwen3_moe")


# Fields both targets share (sizes, activation, norm, rope base, dtype).
SHARED_CONFIG = {
    "vocab_size": VOCAB, "hidden_size": HIDDEN, "intermediate_size": DENSE_INTER, "moe_intermediate_size": MOE_INTER,
    "hidden_act": "silu", "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16",
}


def deepseek_v3_config() -> dict:
    """``config.json`` of the tiny DeepSeek-V3 target (fields read by SGLang's ``models/deepseek_v2.py``)."""
    return {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        **SHARED_CONFIG,
        "hidden_size": DEEPSEEK_HIDDEN,
        "num_hidden_layers": DEEPSEEK_LAYERS,
        "num_nextn_predict_layers": 1,
        "num_attention_heads": MLA_HEADS,
        "num_key_value_heads": MLA_HEADS,
        "q_lora_rank": Q_LORA_RANK,
        "kv_lora_rank": KV_LORA_RANK,
        "qk_nope_head_dim": QK_NOPE_HEAD_DIM,
        "qk_rope_head_dim": QK_ROPE_HEAD_DIM,
        "v_head_dim": V_HEAD_DIM,
        "n_routed_experts": ROUTED_EXPERTS,
        "n_shared_experts": SHARED_EXPERTS,
        "num_experts_per_tok": EXPERTS_PER_TOKEN,
        "first_k_dense_replace": 1,
        "moe_layer_freq": 1,
        "n_group": 1,
        "topk_group": 1,
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "norm_topk_prob": True,
        "routed_scaling_factor": 1.0,
        "rope_scaling": None,
        "attention_bias": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
    }


def _rand(gen: torch.Generator, rows: int, cols: int, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(rows, cols, generator=gen) * (cols**-0.5) * scale


def embedding_and_head(gen: torch.Generator, hidden: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A target's embedding [VOCAB, hidden] (rows of RMS 1: the final norm is nearly the identity) and head."""
    embed = torch.randn(VOCAB, hidden, generator=gen)
    embed /= embed.pow(2).mean(dim=1, keepdim=True).sqrt()
    return embed, torch.randn(VOCAB, hidden, generator=gen) * (base.LOGIT_STD / hidden**0.5)


def mlp_weights(prefix: str, gen: torch.Generator, inter: int, out_scale: float, hidden: int = HIDDEN) -> dict:
    """A SwiGLU MLP under checkpoint names ``{prefix}.gate_proj`` / ``up_proj`` [inter, hidden] and ``down_proj``
    [hidden, inter] (float32), its output scaled by ``out_scale``."""
    return {f"{prefix}.gate_proj.weight": _rand(gen, inter, hidden),
            f"{prefix}.up_proj.weight": _rand(gen, inter, hidden),
            f"{prefix}.down_proj.weight": _rand(gen, hidden, inter, out_scale)}


def moe_weights(prefix: str, gen: torch.Generator, experts: int, shared: int, out_scale: float,
                correction_bias: bool, hidden: int = HIDDEN) -> dict:
    """Router (``{prefix}.gate`` [experts, hidden]), routed experts (``{prefix}.experts.<e>``), shared experts if any.

    Every expert is a :func:`mlp_weights` MLP of width ``hidden``; float32.
    """
    w = {f"{prefix}.gate.weight": _rand(gen, experts, hidden)}
    if correction_bias:  # noaux_tc's per-expert bias, float32 in DeepSeek-V3's checkpoint
        w[f"{prefix}.gate.e_score_correction_bias"] = torch.zeros(experts)
    for e in range(experts):
        w.update(mlp_weights(f"{prefix}.experts.{e}", gen, MOE_INTER, out_scale, hidden))
    if shared:
        w.update(mlp_weights(f"{prefix}.shared_experts", gen, MOE_INTER * shared, out_scale, hidden))
    return w


def mla_layer_weights(prefix: str, gen: torch.Generator, out_scale: float, moe: bool) -> dict:
    """One DeepSeek-V3 decoder layer: MLA attention, then a dense or MoE MLP (checkpoint names)."""
    qk_head = QK_NOPE_HEAD_DIM + QK_ROPE_HEAD_DIM
    a = f"{prefix}.self_attn"
    w = {
        f"{prefix}.input_layernorm.weight": torch.ones(DEEPSEEK_HIDDEN),
        f"{prefix}.post_attention_layernorm.weight": torch.ones(DEEPSEEK_HIDDEN),
        f"{a}.q_a_proj.weight": _rand(gen, Q_LORA_RANK, DEEPSEEK_HIDDEN),
        f"{a}.q_a_layernorm.weight": torch.ones(Q_LORA_RANK),
        f"{a}.q_b_proj.weight": _rand(gen, MLA_HEADS * qk_head, Q_LORA_RANK),
        f"{a}.kv_a_proj_with_mqa.weight": _rand(gen, KV_LORA_RANK + QK_ROPE_HEAD_DIM, DEEPSEEK_HIDDEN),
        f"{a}.kv_a_layernorm.weight": torch.ones(KV_LORA_RANK),
        f"{a}.kv_b_proj.weight": _rand(gen, MLA_HEADS * (QK_NOPE_HEAD_DIM + V_HEAD_DIM), KV_LORA_RANK),
        f"{a}.o_proj.weight": _rand(gen, DEEPSEEK_HIDDEN, MLA_HEADS * V_HEAD_DIM, out_scale),
    }
    if moe:
        w.update(moe_weights(f"{prefix}.mlp", gen, ROUTED_EXPERTS, SHARED_EXPERTS, out_scale, correction_bias=True,
                             hidden=DEEPSEEK_HIDDEN))
    else:
        w.update(mlp_weights(f"{prefix}.mlp", gen, DENSE_INTER, out_scale, DEEPSEEK_HIDDEN))
    return w


def deepseek_v3_weights(gen: torch.Generator, embed: torch.Tensor, lm_head: torch.Tensor) -> dict:
    """The tiny DeepSeek-V3 checkpoint in float32 (the writer casts): trunk, final norm, heads, NEXTN layer.

    ``embed`` and ``lm_head`` are [VOCAB, DEEPSEEK_HIDDEN].

    The NEXTN layer ``model.layers.{DEEPSEEK_LAYERS}`` carries ``enorm``,
    ``hnorm``, ``eh_proj`` [H, 2H] over ``[enorm(embedding), hnorm(hidden)]``,
    ``shared_head.norm``, ``shared_head.head`` and ``embed_tokens`` (SGLang
    takes those two from the target) and an MoE decoder block whose output
    projections are zero: the block is the identity and ``eh_proj = [I | 0]``
    keeps the embedding of the token read, so the layer predicts the target's
    bigram of it.
    """
    w = {"model.embed_tokens.weight": embed, "model.norm.weight": torch.ones(DEEPSEEK_HIDDEN), "lm_head.weight": lm_head}
    for i in range(DEEPSEEK_LAYERS):
        w.update(mla_layer_weights(f"model.layers.{i}", gen, LAYER_OUT_SCALE, moe=i >= 1))
    nextn = f"model.layers.{DEEPSEEK_LAYERS}"
    w.update(mla_layer_weights(nextn, gen, 0.0, moe=True))
    eye, zeros = torch.eye(DEEPSEEK_HIDDEN), torch.zeros(DEEPSEEK_HIDDEN, DEEPSEEK_HIDDEN)
    w[f"{nextn}.eh_proj.weight"] = torch.cat([eye, zeros], dim=1)
    for norm in ("enorm", "hnorm", "shared_head.norm"):
        w[f"{nextn}.{norm}.weight"] = torch.ones(DEEPSEEK_HIDDEN)
    w[f"{nextn}.shared_head.head.weight"] = lm_head
    w[f"{nextn}.embed_tokens.weight"] = embed
    return w


def quantize_block_fp8(weight: torch.Tensor, block: tuple[int, int] = FP8_BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """Block-wise FP8 quantization as DeepSeek-V3's checkpoints store it.

    Args:
        weight: [out, in] floating tensor.
        block: (rows, columns) of one block.

    Returns:
        ``(q, scale_inv)``: ``q`` [out, in] ``float8_e4m3fn``, and ``scale_inv``
        [ceil(out / rows), ceil(in / columns)] float32 with
        ``weight ~= q * scale_inv`` block by block (edge blocks partial).
        A block of zeros gets the scale 1 (its codes are zeros).

    Raises:
        ValueError: ``weight`` not 2-D floating, or a block side below 1.
    """
    if weight.dim() != 2 or not weight.is_floating_point():
        raise ValueError(f"weight must be a 2-D floating tensor, got {weight.dim()}-D {weight.dtype}")
    if min(block) < 1:
        raise ValueError(f"block sides must be >= 1, got {block}")
    (out, inp), (bo, bi) = weight.shape, block
    rows, cols = math.ceil(out / bo), math.ceil(inp / bi)
    padded = torch.zeros(rows * bo, cols * bi, dtype=torch.float32)
    padded[:out, :inp] = weight.float()
    blocks = padded.view(rows, bo, cols, bi)
    amax = blocks.abs().amax(dim=(1, 3))
    scale_inv = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    q = (blocks / scale_inv[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q.view(rows * bo, cols * bi)[:out, :inp].contiguous(), scale_inv


def is_fp8_projection(name: str) -> bool:
    """Whether DeepSeek-V3's FP8 checkpoint stores this weight in FP8 (an attention or MLP projection)."""
    parts = name.split(".")
    return len(parts) >= 2 and parts[-1] == "weight" and parts[-2] in FP8_PROJECTIONS


def fp8_checkpoint(weights: dict) -> dict:
    """``weights`` with every :func:`is_fp8_projection` weight replaced by its FP8 codes and ``weight_scale_inv``.

    The codes are of the weight as the bf16 checkpoint stores it (bf16 first),
    so both folders hold the same model up to the FP8 rounding.
    """
    out = {}
    for name, w in weights.items():
        if is_fp8_projection(name):
            q, scale_inv = quantize_block_fp8(w.to(torch.bfloat16))
            out[name] = q
            out[name[: -len("weight")] + "weight_scale_inv"] = scale_inv
        else:
            out[name] = w
    return out


def qwen3_moe_config() -> dict:
    """``config.json`` of the tiny Qwen3-MoE target (fields read by SGLang's ``models/qwen3_moe.py``)."""
    return {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        **SHARED_CONFIG,
        "num_hidden_layers": QWEN3_LAYERS,
        "num_attention_heads": QWEN3_HEADS,
        "num_key_value_heads": QWEN3_KV_HEADS,
        "head_dim": HIDDEN // QWEN3_HEADS,
        "num_experts": ROUTED_EXPERTS,
        "num_experts_per_tok": EXPERTS_PER_TOKEN,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "norm_topk_prob": True,
        "rope_scaling": None,
        "attention_bias": False,
        "use_sliding_window": False,
        "sliding_window": None,
        "bos_token_id": 1,
        "eos_token_id": 2,
    }


def qwen3_moe_weights(gen: torch.Generator, embed: torch.Tensor, lm_head: torch.Tensor) -> dict:
    """The tiny Qwen3-MoE checkpoint in float32: GQA attention with per-head q/k RMSNorms, MoE in every layer."""
    head_dim = HIDDEN // QWEN3_HEADS
    w = {"model.embed_tokens.weight": embed, "model.norm.weight": torch.ones(HIDDEN), "lm_head.weight": lm_head}
    for i in range(QWEN3_LAYERS):
        p, a = f"model.layers.{i}", f"model.layers.{i}.self_attn"
        w.update({
            f"{p}.input_layernorm.weight": torch.ones(HIDDEN),
            f"{p}.post_attention_layernorm.weight": torch.ones(HIDDEN),
            f"{a}.q_proj.weight": _rand(gen, QWEN3_HEADS * head_dim, HIDDEN),
            f"{a}.k_proj.weight": _rand(gen, QWEN3_KV_HEADS * head_dim, HIDDEN),
            f"{a}.v_proj.weight": _rand(gen, QWEN3_KV_HEADS * head_dim, HIDDEN),
            f"{a}.o_proj.weight": _rand(gen, HIDDEN, QWEN3_HEADS * head_dim, LAYER_OUT_SCALE),
            f"{a}.q_norm.weight": torch.ones(head_dim),
            f"{a}.k_norm.weight": torch.ones(head_dim),
        })
        w.update(moe_weights(f"{p}.mlp", gen, ROUTED_EXPERTS, 0, LAYER_OUT_SCALE, correction_bias=False))
    return w


def main(out_dir: str) -> None:
    """Write :data:`FOLDERS` under ``out_dir`` (fixed seed, no download), tokenizers in :data:`TOKENIZER_FOLDERS`.

    :data:`VERSION_FILE` (the seed, scale and folders) is written last, so a
    set whose writing stopped part way lacks it.
    """
    gen = torch.Generator().manual_seed(SEED)
    embed, lm_head = embedding_and_head(gen, HIDDEN)
    deepseek_gen = torch.Generator().manual_seed(DEEPSEEK_SEED)
    deepseek = deepseek_v3_weights(deepseek_gen, *embedding_and_head(deepseek_gen, DEEPSEEK_HIDDEN))
    base.write(os.path.join(out_dir, "deepseek_v3"), deepseek_v3_config(), deepseek)
    base.write(os.path.join(out_dir, "deepseek_v3_fp8"),
               {**deepseek_v3_config(), "quantization_config": FP8_QUANTIZATION_CONFIG}, fp8_checkpoint(deepseek))

    base.write(os.path.join(out_dir, "qwen3_moe"), qwen3_moe_config(), qwen3_moe_weights(gen, embed, lm_head))
    # The Llama pair's EAGLE3 layer fits: same hidden size and vocabulary, the target's embedding and head.
    base.write(os.path.join(out_dir, "qwen3_moe_eagle3"), base.eagle3_config(None), base.eagle3_weights(embed, None, gen))
    for folder in TOKENIZER_FOLDERS:
        base.write_tokenizer(os.path.join(out_dir, folder))
    with open(os.path.join(out_dir, VERSION_FILE), "w") as f:
        json.dump({"seed": SEED, "deepseek_seed": DEEPSEEK_SEED, "hidden": HIDDEN, "deepseek_hidden": DEEPSEEK_HIDDEN,
                   "layer_out_scale": LAYER_OUT_SCALE, "folders": list(FOLDERS)}, f, indent=1)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("out_dir", help="folder to write the model folders into (created)")
    out_dir = parser.parse_args().out_dir
    main(out_dir)
    print(f"wrote {', '.join(f + '/' for f in FOLDERS)} under {out_dir}")
