"""Write a realistic-size target, an EAGLE draft for it and a tokenizer, with no download.

Target (``--shape``, :data:`SHAPES`): ``llama-8b`` (default), a
``LlamaForCausalLM`` with the shape of a common 8B model (hidden 4096, 32
layers, 32 query / 8 KV heads of 128, intermediate 14336, vocabulary 128,256);
or ``qwen3-moe-a3b-24l``, a ``Qwen3MoeForCausalLM`` with the layer shape of
Qwen3-30B-A3B (hidden 2048, 32 query / 4 KV heads of 128 with per-head q/k
RMSNorms, 128 routed experts of intermediate 768, 8 per token, vocabulary
151,936) at half its 48 layers, so its 31 GB of bf16 weights fit the disk of
a one-H200 machine beside SGLang. bf16 safetensors. Their compute per token
is that of any model of their shape; only the weight values are synthetic.

Why this construction gives a high, controllable acceptance (the near-bigram
pair of ``scripts/make_tiny_models.py``, scaled up, plus one knob):

- Embedding rows have RMS 1 and every layer's output projections
  (``o_proj``, ``down_proj``, each expert's ``down_proj``) are scaled by ``out_scale`` (1e-3), so the
  residual stream stays within about ``out_scale * layers`` of the
  embedding of the current token and the final RMSNorm is nearly the
  identity: the target's next-token distribution is close to the bigram
  ``softmax(lm_head @ e_x)``, logits of standard deviation ``logit_std``.
- The EAGLE draft (SGLang's ``LlamaForCausalLMEagle``: one decoder layer, no
  final norm, the target's embedding and lm_head) gets ``fc = [I + eps*R | 0]``
  with ``R`` of entries ``N(0, 1/H)`` and zero ``o_proj`` / ``down_proj``: its
  hidden state is ``e_x + eps * R e_x``, so its logits are the target's bigram
  logits plus a Gaussian perturbation of standard deviation about
  ``logit_std * eps`` per token.
- The per-token acceptance of rejection sampling is ``1 - TV(p, q)`` (Leviathan
  et al. 2023, "Fast Inference from Transformers via Speculative Decoding",
  Theorem 3.5); it falls continuously from 1 at ``eps = 0``.
  :func:`calibrate_noise` bisects ``eps`` so that the mean of ``1 - TV`` over
  sampled current tokens (computed exactly over the whole vocabulary, on the
  bigram approximation) meets the requested acceptance. The knob is that
  acceptance, which is what a user of a real draft reasons about; the writer
  reports the predicted chain accept length ``1 + a + a^2 + ...``.

Weights are drawn on the GPU (when there is one) from a fixed seed and written
in shards, so the 16 GB target takes seconds to generate and about as long as
the disk needs to write.

Tokenizer: a word-level ``tokenizers`` model whose token ``i`` is the string
``w<i>`` (split on whitespace, decoded joined by spaces), so every id decodes
to non-empty text, as SGLang's streaming detokenizer and ``bench_serving``
need; saved as ``tokenizer.json`` with ``PreTrainedTokenizerFast``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """Dimensions of the target (defaults: the common 8B Llama shape).

    ``head_size`` 0 means ``hidden // heads``; ``experts`` > 0 makes every
    layer a Qwen3-MoE layer (router, ``experts`` SwiGLU experts of
    ``moe_intermediate``, ``experts_per_token`` of them per token, per-head
    q/k RMSNorms); ``intermediate`` is then the EAGLE draft's dense MLP.
    """

    hidden: int = 4096
    layers: int = 32
    heads: int = 32
    kv_heads: int = 8
    intermediate: int = 14336
    vocab: int = 128256
    head_size: int = 0
    experts: int = 0
    experts_per_token: int = 0
    moe_intermediate: int = 0

    def __post_init__(self):
        for name in ("hidden", "layers", "heads", "kv_heads", "intermediate", "vocab"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        for name in ("head_size", "experts", "experts_per_token", "moe_intermediate"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
        if not self.head_size and self.hidden % self.heads:
            raise ValueError(f"hidden ({self.hidden}) must be a multiple of heads ({self.heads}) when head_size is 0")
        if self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        if self.experts and not (1 <= self.experts_per_token <= self.experts and self.moe_intermediate >= 1):
            raise ValueError(f"with experts = {self.experts}, experts_per_token must lie in [1, {self.experts}] "
                             f"and moe_intermediate be >= 1, got {self.experts_per_token} and {self.moe_intermediate}")

    @property
    def head_dim(self) -> int:
        return self.head_size or self.hidden // self.heads

    @property
    def moe(self) -> bool:
        return self.experts > 0

    @property
    def architecture(self) -> str:
        return "Qwen3MoeForCausalLM" if self.moe else "LlamaForCausalLM"

    def attention_params(self) -> int:
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return 2 * q * self.hidden + 2 * kv * self.hidden

    def layer_params(self) -> int:
        if self.moe:
            mlp = self.experts * (3 * self.moe_intermediate * self.hidden + self.hidden)
        else:
            mlp = 3 * self.intermediate * self.hidden
        return self.attention_params() + mlp

    def target_params(self) -> int:
        return self.layers * self.layer_params() + 2 * self.vocab * self.hidden

    def draft_params(self) -> int:
        """The EAGLE draft's parameters as SGLang holds them at load: one dense layer of ``intermediate``,
        ``fc`` (2 x hidden -> hidden, with its bias) and an embedding and LM head of its own (SGLang allocates
        both before it takes the target's; 2.43 GB logged at the 8B shape)."""
        dense_layer = self.attention_params() + 3 * self.intermediate * self.hidden
        return dense_layer + 2 * self.hidden * self.hidden + self.hidden + 2 * self.vocab * self.hidden

    def kv_bytes_per_token(self, layers: int | None = None) -> int:
        """bf16 K and V of every layer (SGLang's MHA token pool), bytes per token."""
        return 2 * (self.layers if layers is None else layers) * self.kv_heads * self.head_dim * 2


EIGHT_B = ModelShape()
# Qwen3-30B-A3B's layer (its config.json) at 24 of its 48 layers; intermediate: the EAGLE draft's MLP.
QWEN3_MOE_A3B_24L = ModelShape(hidden=2048, layers=24, heads=32, kv_heads=4, intermediate=6144, vocab=151936,
                               head_size=128, experts=128, experts_per_token=8, moe_intermediate=768)
SHAPES = {"llama-8b": EIGHT_B, "qwen3-moe-a3b-24l": QWEN3_MOE_A3B_24L}
SEED = 20261130
LOGIT_STD = 3.0  # spread of the bigram logits: sampled at temperature 1, not near-greedy
OUT_SCALE = 1e-3  # layer outputs: how far the target is from its bigram


# Positions the written models take: 8K-token prompts (the attention-cost benchmark's longest) plus output.
CONTEXT_LEN = 16384


def llama_config(shape: ModelShape, architecture: str, layers: int) -> dict:
    """``config.json`` of a Llama model (the dense target, and every EAGLE draft) of ``shape``."""
    return {
        "architectures": [architecture], "model_type": "llama",
        "hidden_size": shape.hidden, "intermediate_size": shape.intermediate,
        "num_attention_heads": shape.heads, "num_key_value_heads": shape.kv_heads, "head_dim": shape.head_dim,
        "num_hidden_layers": layers, "vocab_size": shape.vocab,
        "max_position_embeddings": CONTEXT_LEN, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
        "hidden_act": "silu", "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "bos_token_id": shape.vocab - 256 if shape.vocab > 512 else 1,
        "eos_token_id": shape.vocab - 255 if shape.vocab > 512 else 2,
    }


def qwen3_moe_config(shape: ModelShape) -> dict:
    """``config.json`` of the Qwen3-MoE target of ``shape`` (the fields SGLang's ``models/qwen3_moe.py`` reads)."""
    return {
        **llama_config(shape, "Qwen3MoeForCausalLM", shape.layers), "model_type": "qwen3_moe",
        "moe_intermediate_size": shape.moe_intermediate, "num_experts": shape.experts,
        "num_experts_per_tok": shape.experts_per_token, "decoder_sparse_step": 1, "mlp_only_layers": [],
        "norm_topk_prob": True, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "rope_scaling": None,
        "attention_bias": False, "use_sliding_window": False, "sliding_window": None,
        "output_router_logits": False, "router_aux_loss_coef": 0.001,
    }


def layer_weights(prefix: str, shape: ModelShape, gen, device, *, out_scale: float, input_norm: bool,
                  moe: bool = False) -> dict:
    """One decoder layer under checkpoint names, float32 on ``device`` (converted at write time).

    Llama's (the dense target, the EAGLE draft), or with ``moe`` Qwen3-MoE's:
    per-head q/k RMSNorms, a router ``mlp.gate`` and ``shape.experts`` experts
    ``mlp.experts.<e>``, each expert's ``down_proj`` scaled like the dense one.
    """
    import torch

    def rand(rows, cols, std):
        return torch.randn(rows, cols, generator=gen, device=device).mul_(std)

    def swiglu(name, inter):
        return {f"{name}.gate_proj.weight": rand(inter, h, std), f"{name}.up_proj.weight": rand(inter, h, std),
                f"{name}.down_proj.weight": rand(h, inter, inter ** -0.5 * out_scale)}

    h, q, kv = shape.hidden, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    std = h ** -0.5
    w = {
        f"{prefix}.self_attn.q_proj.weight": rand(q, h, std),
        f"{prefix}.self_attn.k_proj.weight": rand(kv, h, std),
        f"{prefix}.self_attn.v_proj.weight": rand(kv, h, std),
        f"{prefix}.self_attn.o_proj.weight": rand(h, q, q ** -0.5 * out_scale),
        f"{prefix}.post_attention_layernorm.weight": torch.ones(h, device=device),
    }
    if moe:
        w[f"{prefix}.self_attn.q_norm.weight"] = torch.ones(shape.head_dim, device=device)
        w[f"{prefix}.self_attn.k_norm.weight"] = torch.ones(shape.head_dim, device=device)
        w[f"{prefix}.mlp.gate.weight"] = rand(shape.experts, h, std)
        for e in range(shape.experts):
            w.update(swiglu(f"{prefix}.mlp.experts.{e}", shape.moe_intermediate))
    else:
        w.update(swiglu(f"{prefix}.mlp", shape.intermediate))
    if input_norm:
        w[f"{prefix}.input_layernorm.weight"] = torch.ones(h, device=device)
    return w


def bigram_acceptance(embed, lm_head, noise, eps: float, tokens) -> float:
    """Mean over ``tokens`` of ``1 - TV(p_x, q_x)``, exact over the vocabulary.

    ``p_x = softmax(lm_head @ e_x)`` (the target's bigram), ``q_x =
    softmax(lm_head @ (e_x + eps * noise @ e_x))`` (the draft). Shapes: embed
    [V, H], lm_head [V, H], noise [H, H], tokens [N] int64; float32 math.
    """
    import torch

    e = embed[tokens].float()  # [N, H]
    p = torch.softmax(e @ lm_head.float().T, dim=-1)  # [N, V]
    q = torch.softmax((e + eps * (e @ noise.float().T)) @ lm_head.float().T, dim=-1)
    return float(1.0 - 0.5 * (p - q).abs().sum(dim=-1).mean())


def calibrate_noise(embed, lm_head, noise, accept: float, tokens, *, iterations: int = 30) -> tuple[float, float]:
    """``(eps, achieved)``: the draft perturbation whose bigram acceptance is ``accept`` (bisection).

    Raises:
        ValueError: ``accept`` outside [0.05, 1].
    """
    if not 0.05 <= accept <= 1.0:
        raise ValueError(f"accept must lie in [0.05, 1], got {accept}")
    if accept >= 1.0:
        return 0.0, bigram_acceptance(embed, lm_head, noise, 0.0, tokens)
    lo, hi = 0.0, 1.0
    while bigram_acceptance(embed, lm_head, noise, hi, tokens) > accept and hi < 1e3:
        lo, hi = hi, hi * 2  # acceptance falls as eps grows; find a bracket first
    for _ in range(iterations):
        mid = 0.5 * (lo + hi)
        if bigram_acceptance(embed, lm_head, noise, mid, tokens) > accept:
            lo = mid
        else:
            hi = mid
    eps = 0.5 * (lo + hi)
    return eps, bigram_acceptance(embed, lm_head, noise, eps, tokens)


def chain_accept_length(alpha: float, steps: int) -> float:
    """Expected tokens per verify round of a chain of ``steps`` drafts, i.i.d. acceptance ``alpha`` (+1 bonus)."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must lie in [0, 1], got {alpha}")
    if steps < 0:
        raise ValueError(f"steps must be >= 0, got {steps}")
    return sum(alpha ** k for k in range(steps + 1))


def write_tokenizer(folder: str, vocab: int) -> None:
    """``tokenizer.json`` + ``tokenizer_config.json``: word-level, token ``i`` is ``w<i>``."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    if vocab < 4:
        raise ValueError(f"vocab must be >= 4, got {vocab}")
    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(vocab)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "w0",
                   "model_max_length": CONTEXT_LEN, "clean_up_tokenization_spaces": False}, f, indent=1)


def _save(folder: str, name: str, weights: dict, index: dict) -> None:
    import torch
    from safetensors.torch import save_file

    cpu = {k: v.to(torch.bfloat16).contiguous().cpu() for k, v in weights.items()}
    save_file(cpu, os.path.join(folder, name), metadata={"format": "pt"})
    index.update({k: name for k in cpu})


def write_models(out_dir: str, *, shape: ModelShape = EIGHT_B, accept: float = 0.85, device: str | None = None,
                 layers_per_shard: int = 4, calibration_tokens: int = 256, seed: int = SEED) -> dict:
    """Write ``target/`` and ``eagle/`` under ``out_dir``; returns the facts written to ``models.json``.

    Args:
        out_dir: folder to create (existing files are overwritten).
        shape: target dimensions.
        accept: per-token bigram acceptance of the draft under rejection sampling, (0.05, 1].
        device: where weights are drawn ("cuda" when available, else "cpu").
        layers_per_shard: decoder layers per safetensors file.
        calibration_tokens: current tokens the acceptance is averaged over.

    Raises:
        ValueError: accept outside [0.05, 1], layers_per_shard or calibration_tokens below 1.
    """
    import torch

    if layers_per_shard < 1:
        raise ValueError(f"layers_per_shard must be >= 1, got {layers_per_shard}")
    if calibration_tokens < 1:
        raise ValueError(f"calibration_tokens must be >= 1, got {calibration_tokens}")
    if not 0.05 <= accept <= 1.0:
        raise ValueError(f"accept must lie in [0.05, 1], got {accept}")
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    started = time.monotonic()
    gen = torch.Generator(device=device).manual_seed(seed)
    target_dir, eagle_dir = os.path.join(out_dir, "target"), os.path.join(out_dir, "eagle")
    os.makedirs(target_dir, exist_ok=True)
    os.makedirs(eagle_dir, exist_ok=True)
    h = shape.hidden

    embed = torch.randn(shape.vocab, h, generator=gen, device=device)
    embed /= embed.pow(2).mean(dim=1, keepdim=True).sqrt()  # RMS 1: the final norm is nearly the identity
    lm_head = torch.randn(shape.vocab, h, generator=gen, device=device).mul_(LOGIT_STD / h ** 0.5)
    noise = torch.randn(h, h, generator=gen, device=device).mul_(h ** -0.5)
    # Calibrate on the values the server reads: bf16-rounded, as written.
    embed, lm_head, noise = (t.to(torch.bfloat16).float() for t in (embed, lm_head, noise))
    tokens = torch.randint(0, shape.vocab, (calibration_tokens,), generator=gen, device=device)
    eps, achieved = calibrate_noise(embed, lm_head, noise, accept, tokens)

    index: dict[str, str] = {}
    shards = 1 + math.ceil(shape.layers / layers_per_shard)
    _save(target_dir, f"model-00001-of-{shards:05d}.safetensors",
          {"model.embed_tokens.weight": embed, "lm_head.weight": lm_head,
           "model.norm.weight": torch.ones(h, device=device)}, index)
    for s in range(shards - 1):
        weights = {}
        for i in range(s * layers_per_shard, min(shape.layers, (s + 1) * layers_per_shard)):
            weights.update(layer_weights(f"model.layers.{i}", shape, gen, device, out_scale=OUT_SCALE, input_norm=True,
                                         moe=shape.moe))
        _save(target_dir, f"model-{s + 2:05d}-of-{shards:05d}.safetensors", weights, index)
        del weights
    with open(os.path.join(target_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": 2 * shape.target_params()}, "weight_map": index}, f)
    with open(os.path.join(target_dir, "config.json"), "w") as f:
        json.dump(qwen3_moe_config(shape) if shape.moe else llama_config(shape, "LlamaForCausalLM", shape.layers),
                  f, indent=1)
    write_tokenizer(target_dir, shape.vocab)

    # EAGLE draft: names without "model."; embed and lm_head are the target's (SGLang shares them).
    draft = layer_weights("layers.0", shape, gen, device, out_scale=0.0, input_norm=False)
    eye = torch.eye(h, device=device)
    draft["fc.weight"] = torch.cat([eye + eps * noise, torch.zeros(h, h, device=device)], dim=1)
    draft["fc.bias"] = torch.zeros(h, device=device)
    _save(eagle_dir, "model.safetensors", draft, {})
    with open(os.path.join(eagle_dir, "config.json"), "w") as f:
        json.dump(llama_config(shape, "LlamaForCausalLMEagle", 1), f, indent=1)

    facts = {
        "shape": dataclasses.asdict(shape), "shape_name": shape_name(shape), "architecture": shape.architecture,
        "target_params": shape.target_params(), "seed": seed,
        "logit_std": LOGIT_STD, "out_scale": OUT_SCALE, "requested_accept": accept,
        "draft_noise_eps": eps, "bigram_accept": achieved,
        "predicted_chain_accept_length_3_steps": chain_accept_length(min(1.0, achieved), 3),
        "calibration_tokens": calibration_tokens, "device": device,
        "write_s": round(time.monotonic() - started, 1),
    }
    with open(os.path.join(out_dir, "models.json"), "w") as f:
        json.dump(facts, f, indent=1)
    return facts


def shape_name(shape: ModelShape) -> str | None:
    """The :data:`SHAPES` name of ``shape``, or None for a shape of its own (tests)."""
    return next((name for name, known in SHAPES.items() if known == shape), None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="llama-8b", help="target shape (default llama-8b)")
    parser.add_argument("--accept", type=float, default=0.85,
                        help="per-token acceptance of the draft under rejection sampling (default 0.85)")
    parser.add_argument("--device", default=None)
    args = parser.parse_args(argv)
    try:
        facts = write_models(args.out_dir, shape=SHAPES[args.shape], accept=args.accept, device=args.device)
    except ValueError as exc:
        parser.error(str(exc))
    print(json.dumps(facts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
