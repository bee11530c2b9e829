"""Write tiny random-weight checkpoints for end-to-end runs of a real SGLang server.

No download: every weight comes from a fixed-seed generator. Written folders:

- ``target/``: ``LlamaForCausalLM`` (hidden 256, 2 layers, 4 heads of 64, 4 KV
  heads, intermediate 512, vocab 4096), bf16 safetensors. Attention and MLP
  outputs are scaled down so the model is close to a bigram model: its
  next-token distribution depends mostly on the current token.
- ``eagle/``: an EAGLE draft for it (SGLang's ``LlamaForCausalLMEagle``): one
  decoder layer, ``fc = [I | 0]`` and zero ``o_proj`` / ``down_proj``, so the
  draft's hidden state is the embedding of the token it reads and its logits
  (through the target's shared lm_head) copy the target's bigram: a
  high-acceptance pair, so accept coins, residual draws and bonus tokens are
  all exercised.
- ``eagle_random/``: the same draft with random weights (accept length near 1).

Usage: python scripts/make_tiny_models.py OUT_DIR
"""

from __future__ import annotations

import json
import os
import sys

import torch
from safetensors.torch import save_file

VOCAB, HIDDEN, INTER, HEADS, LAYERS = 4096, 256, 512, 4, 2
LOGIT_STD = 3.0  # spread of the bigram logits: sampled, not near-greedy


def llama_config(architecture: str, layers: int) -> dict:
    return {
        "architectures": [architecture],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "intermediate_size": INTER,
        "num_attention_heads": HEADS,
        "num_key_value_heads": HEADS,
        "head_dim": HIDDEN // HEADS,
        "num_hidden_layers": layers,
        "vocab_size": VOCAB,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "bos_token_id": 1,
        "eos_token_id": 2,
    }


def layer_weights(prefix: str, gen: torch.Generator, out_scale: float, with_input_norm: bool) -> dict:
    def rand(*shape, std):
        return torch.randn(*shape, generator=gen) * std

    std = HIDDEN**-0.5
    w = {
        f"{prefix}.self_attn.q_proj.weight": rand(HIDDEN, HIDDEN, std=std),
        f"{prefix}.self_attn.k_proj.weight": rand(HIDDEN, HIDDEN, std=std),
        f"{prefix}.self_attn.v_proj.weight": rand(HIDDEN, HIDDEN, std=std),
        f"{prefix}.self_attn.o_proj.weight": rand(HIDDEN, HIDDEN, std=std) * out_scale,
        f"{prefix}.mlp.gate_proj.weight": rand(INTER, HIDDEN, std=std),
        f"{prefix}.mlp.up_proj.weight": rand(INTER, HIDDEN, std=std),
        f"{prefix}.mlp.down_proj.weight": rand(HIDDEN, INTER, std=INTER**-0.5) * out_scale,
        f"{prefix}.post_attention_layernorm.weight": torch.ones(HIDDEN),
    }
    if with_input_norm:
        w[f"{prefix}.input_layernorm.weight"] = torch.ones(HIDDEN)
    return w


def write(folder: str, config: dict, weights: dict) -> None:
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in weights.items()},
              os.path.join(folder, "model.safetensors"))


def main(out_dir: str) -> None:
    gen = torch.Generator().manual_seed(20261129)
    embed = torch.randn(VOCAB, HIDDEN, generator=gen)
    embed /= embed.pow(2).mean(dim=1, keepdim=True).sqrt()  # RMS 1: the final norm is nearly the identity
    target = {
        "model.embed_tokens.weight": embed,
        "model.norm.weight": torch.ones(HIDDEN),
        "lm_head.weight": torch.randn(VOCAB, HIDDEN, generator=gen) * (LOGIT_STD / HIDDEN**0.5),
    }
    for i in range(LAYERS):
        target.update(layer_weights(f"model.layers.{i}", gen, out_scale=1e-3, with_input_norm=True))
    write(os.path.join(out_dir, "target"), llama_config("LlamaForCausalLM", LAYERS), target)

    # EAGLE draft: names without the "model." prefix; embed and lm_head are the target's.
    eagle = layer_weights("layers.0", gen, out_scale=0.0, with_input_norm=False)
    eagle["fc.weight"] = torch.cat([torch.eye(HIDDEN), torch.zeros(HIDDEN, HIDDEN)], dim=1)
    eagle["fc.bias"] = torch.zeros(HIDDEN)
    write(os.path.join(out_dir, "eagle"), llama_config("LlamaForCausalLMEagle", 1), eagle)

    noisy = layer_weights("layers.0", gen, out_scale=1.0, with_input_norm=False)
    noisy["fc.weight"] = torch.randn(HIDDEN, 2 * HIDDEN, generator=gen) * (2 * HIDDEN) ** -0.5
    noisy["fc.bias"] = torch.zeros(HIDDEN)
    write(os.path.join(out_dir, "eagle_random"), llama_config("LlamaForCausalLMEagle", 1), noisy)
    print(f"wrote target/, eagle/, eagle_random/ under {out_dir}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
