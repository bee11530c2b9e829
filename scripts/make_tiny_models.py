"""Write tiny random-weight checkpoints for end-to-end runs of a real SGLang server.

No download: every weight comes from a fixed-seed generator. Written folders:

- ``target/``: ``LlamaForCausalLM`` (hidden 256, 2 layers, 4 heads of 64, 4 KV
  heads, intermediate 512, vocab 4096 unless ``--vocab`` says otherwise), bf16 safetensors. Attention and MLP
  outputs are scaled down so the model is close to a bigram model: its
  next-token distribution depends mostly on the current token.
- ``eagle/``: an EAGLE draft for it (SGLang's ``LlamaForCausalLMEagle``): one
  decoder layer, ``fc = [I | 0]`` and zero ``o_proj`` / ``down_proj``, so the
  draft's hidden state is the embedding of the token it reads and its logits
  (through the target's shared lm_head) copy the target's bigram: a
  high-acceptance pair, so accept coins, residual draws and bonus tokens are
  all exercised.
- ``eagle_random/``: a second EAGLE draft of the same shapes with independent
  random weights (accept length near 1): another drafter for the same target.
- ``mtp/``: a ``Step3p5ForCausalLM`` target with two MTP layers in the same
  checkpoint, for ``--enable-multi-layer-eagle`` (see :func:`write_mtp` for
  why this architecture). Nearly the same bigram as ``target/`` (same
  embedding and lm_head, near-identity layers) and MTP layers that copy it,
  so it is a high-acceptance pair too. About 68 MB.
- ``eagle3/`` and ``eagle3_full/``: EAGLE3 drafts for ``target/`` (SGLang's
  ``LlamaForCausalLMEagle3``, see :func:`write_eagle3`). ``eagle3/`` drafts
  over a reduced vocabulary: three quarters of the target's tokens in shuffled
  order, with the ``d2t`` / ``t2d`` token map EAGLE3 checkpoints carry, so a
  draft index is not the target token id it stands for. ``eagle3_full/``
  drafts over the whole vocabulary (no map, the target's lm_head).
- ``mimo/``: a ``MiMoForCausalLM`` target with one MTP layer in its own
  checkpoint, served with ``--speculative-algorithm NEXTN`` (see
  :func:`write_mimo` for why this architecture).
- ``deepseek_v3/``, ``deepseek_v3_fp8/``, ``qwen3_moe/``, ``qwen3_moe_eagle3/``:
  the MoE, MLA and FP8 families, written by ``tiny_families.py`` (its
  docstring says what each holds).

``target/``, ``mtp/``, ``mimo/`` and the family targets also get a word-level tokenizer (``tokenizer.json``:
token ``i`` is the word ``t<i>``, ids 0-2 are ``<unk>``, ``<s>``, ``</s>``),
so servers started without ``--skip-tokenizer-init`` (SGLang's OpenAI
endpoints need one to build their responses' text) can load them.

Usage: python scripts/make_tiny_models.py OUT_DIR [--vocab N] [--attention-scale S]

``--vocab`` (default 4096) sets every model's vocabulary and the tokenizer's;
SGLang's own determinism harness (``sglang.test.test_deterministic``) sends
token ids up to 50,000, so its suite writes a set at a 128K vocabulary.
``--attention-scale`` (default :data:`TARGET_ATTENTION_SCALE`) scales the
target's attention output projection. At the default one bit of an attention
output seldom reaches a logit (the residual is about a thousand times larger),
so a suite that must see attention bits (decode against prefill) writes its
set with a scale near :data:`ATTENTION_VISIBLE_SCALE`, where the attention
output is about the residual's size.
"""

from __future__ import annotations

import argparse
import sys
import json
import os

import torch
from safetensors.torch import save_file

VOCAB, HIDDEN, INTER, HEADS, LAYERS = 4096, 256, 512, 4, 2
LOGIT_STD = 3.0  # spread of the bigram logits: sampled, not near-greedy
# The target's attention output scale: small, so the model stays close to its bigram (drafts are accepted).
TARGET_ATTENTION_SCALE = 1e-3
# At this scale the target's attention output has about the residual's RMS (1) over a few hundred random
# tokens (0.13 at scale 1), so a bit that differs in it reaches the logits.
ATTENTION_VISIBLE_SCALE = 8.0
# SGLang 0.5.23 builds every Step3p5 MTP block as decoder layer 45 (a literal in
# models/step3p5_mtp.py, Step-3.5-Flash's depth) and runs its attention as KV
# layer 45 - num_hidden_layers of the draft's one-layer KV pool, so the trunk
# must have exactly 45 layers for that index to be 0.
MTP_TRUNK_LAYERS = 45
MTP_LAYERS = 2  # --speculative-num-steps 2: one MTP layer per draft step
# The reduced EAGLE3 vocabulary is this fraction of the target's, so about a quarter of the
# target's mass at each position is out of the draft's reach (acceptance below the full draft's).
EAGLE3_DRAFT_FRACTION = (3, 4)
# EAGLE3's attention carries the embedding of the token read (see write_eagle3): query and
# key are this multiple of it, so each position attends to itself.
EAGLE3_SELF_ATTENTION_GAIN = 2.0


def llama_config(architecture: str, layers: int, vocab: int = VOCAB) -> dict:
    return {
        "architectures": [architecture],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "intermediate_size": INTER,
        "num_attention_heads": HEADS,
        "num_key_value_heads": HEADS,
        "head_dim": HIDDEN // HEADS,
        "num_hidden_layers": layers,
        "vocab_size": vocab,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "bos_token_id": 1,
        "eos_token_id": 2,
    }


def layer_weights(prefix: str, gen: torch.Generator, out_scale: float, with_input_norm: bool,
                  attention_scale: float | None = None) -> dict:
    """One decoder layer's weights; ``out_scale`` scales the MLP's output and, unless ``attention_scale`` is
    given, the attention's output projection too. Every weight is drawn in the same order either way."""
    def rand(*shape, std):
        return torch.randn(*shape, generator=gen) * std

    std = HIDDEN**-0.5
    w = {
        f"{prefix}.self_attn.q_proj.weight": rand(HIDDEN, HIDDEN, std=std),
        f"{prefix}.self_attn.k_proj.weight": rand(HIDDEN, HIDDEN, std=std),
        f"{prefix}.self_attn.v_proj.weight": rand(HIDDEN, HIDDEN, std=std),
        f"{prefix}.self_attn.o_proj.weight": rand(HIDDEN, HIDDEN, std=std) * (
            out_scale if attention_scale is None else attention_scale),
        f"{prefix}.mlp.gate_proj.weight": rand(INTER, HIDDEN, std=std),
        f"{prefix}.mlp.up_proj.weight": rand(INTER, HIDDEN, std=std),
        f"{prefix}.mlp.down_proj.weight": rand(HIDDEN, INTER, std=INTER**-0.5) * out_scale,
        f"{prefix}.post_attention_layernorm.weight": torch.ones(HIDDEN),
    }
    if with_input_norm:
        w[f"{prefix}.input_layernorm.weight"] = torch.ones(HIDDEN)
    return w


def step3p5_config(vocab: int = VOCAB) -> dict:
    """``config.json`` of the tiny Step3p5 target with ``MTP_LAYERS`` MTP layers.

    Fields are read by SGLang's ``Step3p5Config`` (``configs/step3p5.py``) and
    ``models/step3p5.py``; per-layer lists cover the trunk and the MTP layers
    (indices 45 and up), as in the released Step-3.5-Flash config.
    """
    total = MTP_TRUNK_LAYERS + MTP_LAYERS
    return {
        "architectures": ["Step3p5ForCausalLM"],
        "model_type": "step3p5",
        "hidden_size": HIDDEN,
        "intermediate_size": INTER,
        "num_attention_heads": HEADS,
        "num_attention_groups": HEADS,  # KV heads
        "head_dim": HIDDEN // HEADS,
        "num_hidden_layers": MTP_TRUNK_LAYERS,
        "num_nextn_predict_layers": MTP_LAYERS,
        "vocab_size": vocab,
        "max_seq_len": 4096,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5,
        # Full attention everywhere: no sliding-window layer, so no
        # attention_other_setting and nothing for the hybrid SWA pool to evict.
        "layer_types": ["full_attention"] * total,
        "sliding_window": None,
        "rope_theta": [10000.0] * total,
        "rope_scaling": None,
        "yarn_only_types": [],
        "partial_rotary_factors": [1.0] * total,
        "use_head_wise_attn_gate": False,
        "swiglu_limits_shared": [0] * total,  # 0: no SwiGLU clamp
        # Dense MLP in every layer. SGLang parses this as a comma-separated list
        # of MoE layer ids and an empty string does not parse, so it names a
        # layer id that does not exist.
        "moe_layers_enum": "999",
        "moe_num_experts": 2,
        "moe_top_k": 1,
        "moe_intermediate_size": INTER,
        "share_expert_dims": INTER,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "bos_token_id": 1,
        "eos_token_id": 2,
    }


def step3p5_layer_weights(prefix: str, gen: torch.Generator, out_scale: float) -> dict:
    """One Step3p5 decoder layer (dense MLP) under checkpoint names; norms are zero-centered (Gemma) RMSNorms."""
    head_dim = HIDDEN // HEADS
    w = layer_weights(prefix, gen, out_scale=out_scale, with_input_norm=True)
    # GemmaRMSNorm scales by (1 + weight): zeros are the identity scale.
    w[f"{prefix}.input_layernorm.weight"] = torch.zeros(HIDDEN)
    w[f"{prefix}.post_attention_layernorm.weight"] = torch.zeros(HIDDEN)
    w[f"{prefix}.self_attn.q_norm.weight"] = torch.zeros(head_dim)
    w[f"{prefix}.self_attn.k_norm.weight"] = torch.zeros(head_dim)
    return w


def write_mtp(out_dir: str, gen: torch.Generator, embed: torch.Tensor, lm_head: torch.Tensor) -> None:
    """``mtp/``: tiny ``Step3p5ForCausalLM`` whose checkpoint carries 2 MTP layers.

    Why Step3p5: SGLang 0.5.23's multi-layer EAGLE worker
    (``speculative/multi_layer_eagle_worker_v2.py``) builds one draft model per
    step and passes ``draft_model_idx`` to the draft class's constructor
    (``model_loader/loader.py``, ``_initialize_model``). Of the registered
    classes only four take it: ``Step3p5MTP``, ``MiMoV2MTP``,
    ``GigaChat35ForCausalLMNextN`` and ``InklingForConditionalGenerationMTP``;
    the EAGLE drafts (``LlamaForCausalLMEagle``...) and ``MiMoMTP`` do not, so
    ``--enable-multi-layer-eagle`` cannot load them. GigaChat 3.5 is MLA plus
    gated-delta-net linear attention plus MoE, Inkling a multimodal hybrid with
    short-convolution state, and MiMo-V2 has no config class in SGLang (its
    config needs the model's remote code) and a sliding-window, attention-sink
    MTP layer. Step3p5 has a config class in SGLang, a dense MLP wherever
    ``moe_layers_enum`` says so, full attention wherever ``layer_types`` says
    so, plain q/k/v/o and gate/up/down weight names, and its draft class loads
    MTP layer ``num_hidden_layers + draft_model_idx`` of the target's own
    checkpoint. Its one constraint is the depth: see ``MTP_TRUNK_LAYERS``.

    The draft is the target checkpoint itself: pass the same folder as
    ``--model-path`` and ``--speculative-draft-model-path`` (SGLang rewrites a
    draft ``Step3p5ForCausalLM`` to ``Step3p5MTP``, ``configs/model_config.py``;
    it does not default the draft path to the target for this architecture).
    SGLang counts Step3p5 as a hybrid sliding-window model whatever its layer
    types, so serve it with ``--disable-hybrid-swa-memory``: every layer here
    is full attention and the ordinary KV pool fits it.

    Weights: trunk layers ``model.layers.0..44`` (near-identity, as in
    ``target/``), final ``model.norm``, ``lm_head``; MTP layer ``k`` under
    ``model.layers.{45 + k}.``: ``enorm``, ``hnorm``, ``eh_proj`` [H, 2H],
    ``shared_head.norm``, ``shared_head.head`` (its own lm_head: Step3p5MTP
    does not share the target's) and the decoder block (``self_attn.*``,
    ``mlp.*``, norms). ``eh_proj = [I | 0]`` keeps the normalised embedding of
    the token read and drops the hidden state; zero ``o_proj``/``down_proj``
    make the block the identity, so each MTP layer predicts the bigram of its
    input token, as the target nearly does.
    """
    target = {
        "model.embed_tokens.weight": embed,
        "model.norm.weight": torch.zeros(HIDDEN),
        "lm_head.weight": lm_head,
    }
    for i in range(MTP_TRUNK_LAYERS):
        target.update(step3p5_layer_weights(f"model.layers.{i}", gen, out_scale=1e-3))
    for k in range(MTP_LAYERS):
        prefix = f"model.layers.{MTP_TRUNK_LAYERS + k}"
        target.update(step3p5_layer_weights(prefix, gen, out_scale=0.0))
        # Step3p5MTP concatenates (enorm(embedding), hnorm(hidden)) before eh_proj.
        target[f"{prefix}.eh_proj.weight"] = torch.cat([torch.eye(HIDDEN), torch.zeros(HIDDEN, HIDDEN)], dim=1)
        target[f"{prefix}.enorm.weight"] = torch.zeros(HIDDEN)
        target[f"{prefix}.hnorm.weight"] = torch.zeros(HIDDEN)
        target[f"{prefix}.shared_head.norm.weight"] = torch.zeros(HIDDEN)
        target[f"{prefix}.shared_head.head.weight"] = lm_head
    write(os.path.join(out_dir, "mtp"), step3p5_config(embed.shape[0]), target)


def eagle3_config(draft_vocab: int | None, vocab: int = VOCAB) -> dict:
    """``config.json`` of a one-layer ``LlamaForCausalLMEagle3`` draft for ``target/``.

    One auxiliary hidden state (the output of the target's layer 0,
    ``eagle_aux_hidden_state_layer_ids``), so the draft reads a hidden state of
    the target's own width. ``draft_vocab_size`` None: the full vocabulary, and
    SGLang loads the lm_head from the target.
    """
    config = llama_config("LlamaForCausalLMEagle3", 1, vocab)
    config["draft_vocab_size"] = draft_vocab
    config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [0]}
    return config


def eagle3_weights(embed: torch.Tensor, lm_head: torch.Tensor | None, gen: torch.Generator) -> dict:
    """One EAGLE3 decoder layer that predicts the target's bigram of the token it reads.

    SGLang's EAGLE3 layer feeds ``[norm(embedding), norm(hidden)]`` (2H wide)
    to q/k/v and carries ``hidden`` as the residual. Here q = k = gain x the
    normalised embedding (each head its slice), so a position attends to
    itself (or to earlier copies of the same token), and v = embedding minus
    the normalised hidden state, with ``o_proj = I``: the residual sum after
    attention is the embedding of the token read, whatever hidden state came
    in (the target's after the first draft, the draft's own after that). The
    MLP's ``down_proj`` is zero, so the final norm sees that embedding and the
    lm_head gives the target's bigram logits. ``fc`` is unused (the one
    auxiliary hidden state has the draft's width) and written as zeros.
    """
    del embed  # EAGLE3 takes the target's embedding (set_embed); only the head may be the draft's
    eye, zero = torch.eye(HIDDEN), torch.zeros(HIDDEN, HIDDEN)
    w = layer_weights("midlayer", gen, out_scale=0.0, with_input_norm=True)
    w["midlayer.self_attn.q_proj.weight"] = torch.cat([EAGLE3_SELF_ATTENTION_GAIN * eye, zero], dim=1)
    w["midlayer.self_attn.k_proj.weight"] = torch.cat([EAGLE3_SELF_ATTENTION_GAIN * eye, zero], dim=1)
    w["midlayer.self_attn.v_proj.weight"] = torch.cat([eye, -eye], dim=1)
    w["midlayer.self_attn.o_proj.weight"] = eye.clone()
    w["midlayer.hidden_norm.weight"] = torch.ones(HIDDEN)
    w["fc.weight"] = torch.zeros(HIDDEN, HIDDEN)
    w["norm.weight"] = torch.ones(HIDDEN)
    if lm_head is not None:
        w["lm_head.weight"] = lm_head
    return w


def eagle3_draft_vocab(vocab: int) -> int:
    """The reduced EAGLE3 draft's vocabulary for a target of ``vocab`` tokens (3,072 at 4,096)."""
    num, den = EAGLE3_DRAFT_FRACTION
    return vocab * num // den


def write_eagle3(out_dir: str, gen: torch.Generator, embed: torch.Tensor, lm_head: torch.Tensor) -> None:
    """``eagle3/`` (reduced vocabulary with its token map) and ``eagle3_full/`` (whole vocabulary).

    The reduced draft's vocabulary is :func:`eagle3_draft_vocab` target ids in a
    fixed random order (``hot``): draft index j stands for target id
    ``hot[j]``. Its lm_head is the target's rows in that order, and the
    checkpoint carries EAGLE3's map tensors: ``d2t[j] = hot[j] - j`` (SGLang
    adds ``arange`` back) and ``t2d`` (a bool mask over the target vocabulary,
    which SGLang ignores).
    """
    vocab = embed.shape[0]
    draft_vocab = eagle3_draft_vocab(vocab)
    order = torch.randperm(vocab, generator=gen)
    hot = order[:draft_vocab]
    reduced = eagle3_weights(embed, lm_head[hot], gen)
    reduced["d2t"] = (hot - torch.arange(draft_vocab)).to(torch.int64)
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[hot] = True
    reduced["t2d"] = t2d
    write(os.path.join(out_dir, "eagle3"), eagle3_config(draft_vocab, vocab), reduced)
    write(os.path.join(out_dir, "eagle3_full"), eagle3_config(None, vocab), eagle3_weights(embed, None, gen))


def write_mimo(out_dir: str, gen: torch.Generator, embed: torch.Tensor, lm_head: torch.Tensor) -> None:
    """``mimo/``: tiny ``MiMoForCausalLM`` (Qwen2 layers) with one MTP layer, for ``--speculative-algorithm NEXTN``.

    Why MiMo: SGLang serves NEXTN as EAGLE with the target's own MTP head as
    the draft, one draft class per architecture. Qwen3.5's MTP sits on a
    hybrid gated-delta-net trunk (recurrent state, its own cache), DeepSeek's
    and GLM's on MLA and MoE, and ``Step3p5MTP`` (``mtp/``) needs the
    ``draft_model_idx`` only the multi-layer worker passes. ``MiMoMTP`` is a
    dense Qwen2 decoder layer behind two norms and an input projection, which
    SGLang loads from the target's own checkpoint (it rewrites a draft
    ``MiMoForCausalLM`` to ``MiMoMTP``, ``configs/model_config.py``) and runs
    one step at a time, as NEXTN models are served.

    Weights: the trunk as in ``target/`` (near-identity Qwen2 layers, with the
    q/k/v biases Qwen2 has, zero), ``model.mtp_layers.0.*``: ``input_proj =
    [0 | I]`` over ``[norm(hidden), norm(embedding)]`` keeps the token read,
    zero ``o_proj`` / ``down_proj`` make the block the identity, so the MTP
    layer predicts the target's bigram of its input token.
    """
    config = llama_config("MiMoForCausalLM", LAYERS, embed.shape[0])
    config.update({"model_type": "qwen2", "num_nextn_predict_layers": 1, "use_sliding_window": False,
                   "sliding_window": None, "max_window_layers": LAYERS})

    def qwen2_layer(prefix: str, out_scale: float) -> dict:
        w = layer_weights(prefix, gen, out_scale=out_scale, with_input_norm=True)
        for proj in ("q_proj", "k_proj", "v_proj"):
            w[f"{prefix}.self_attn.{proj}.bias"] = torch.zeros(HIDDEN)
        return w

    weights = {"model.embed_tokens.weight": embed, "model.norm.weight": torch.ones(HIDDEN), "lm_head.weight": lm_head}
    for i in range(LAYERS):
        weights.update(qwen2_layer(f"model.layers.{i}", out_scale=1e-3))
    mtp = "model.mtp_layers.0"
    weights.update(qwen2_layer(mtp, out_scale=0.0))
    weights[f"{mtp}.input_proj.weight"] = torch.cat([torch.zeros(HIDDEN, HIDDEN), torch.eye(HIDDEN)], dim=1)
    for norm in ("token_layernorm", "hidden_layernorm", "final_layernorm"):
        weights[f"{mtp}.{norm}.weight"] = torch.ones(HIDDEN)
    write(os.path.join(out_dir, "mimo"), config, weights)


SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")  # ids 0, 1, 2: unk, and the configs' bos / eos


def write_tokenizer(folder: str, vocab_size: int = VOCAB) -> None:
    """A word-level tokenizer over ``vocab_size`` ids: ``tokenizer.json`` and ``tokenizer_config.json``.

    Whitespace-separated words ``t<i>`` map to id ``i``; any other word to
    ``<unk>`` (id 0). Decoding joins the words with spaces. Written as plain
    JSON in the ``tokenizers`` library's file format (a WordLevel model, a
    WhitespaceSplit pre-tokenizer, the three special tokens as added
    tokens), so writing needs no tokenizer package; transformers'
    ``AutoTokenizer`` loads it as a fast tokenizer.
    """
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    vocab.update({f"t{i}": i for i in range(len(SPECIAL_TOKENS), vocab_size)})
    added = [{"id": i, "content": token, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i, token in enumerate(SPECIAL_TOKENS)]
    tokenizer = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": None, "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": None,
        "decoder": None, "model": {"type": "WordLevel", "vocab": vocab, "unk_token": SPECIAL_TOKENS[0]},
    }
    with open(os.path.join(folder, "tokenizer.json"), "w") as f:
        json.dump(tokenizer, f)
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": SPECIAL_TOKENS[0], "bos_token": SPECIAL_TOKENS[1], "eos_token": SPECIAL_TOKENS[2],
        "model_max_length": 4096, "clean_up_tokenization_spaces": False,
    }
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, indent=1)


# Float32 tensors that checkpoints keep in float32 (DeepSeek-V3's FP8 block scales and its
# router's score-correction bias); every other float32 weight is written as bf16.
FLOAT32_SUFFIXES = ("weight_scale_inv", "e_score_correction_bias")


def write(folder: str, config: dict, weights: dict) -> None:
    """``config.json`` and ``model.safetensors`` in ``folder``.

    Float32 weights are written as bf16, except names ending in one of
    :data:`FLOAT32_SUFFIXES`; other dtypes (FP8 codes, the EAGLE3 token map's
    integers and booleans) are written as they are.
    """
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f, indent=1)

    def stored(name: str, v: torch.Tensor) -> torch.Tensor:
        keep = v.dtype != torch.float32 or name.endswith(FLOAT32_SUFFIXES)
        return (v if keep else v.to(torch.bfloat16)).contiguous()

    save_file({k: stored(k, v) for k, v in weights.items()}, os.path.join(folder, "model.safetensors"))


def main(out_dir: str, vocab: int = VOCAB, attention_scale: float = TARGET_ATTENTION_SCALE) -> None:
    """Write every tiny model (and the tokenizers) under ``out_dir`` at a vocabulary of ``vocab`` tokens.

    ``attention_scale`` scales the target's attention output projection (module docstring).

    Raises:
        ValueError: ``vocab`` below 8 (the special tokens and a reduced EAGLE3 vocabulary need room), or
            ``attention_scale`` not a finite number > 0.
    """
    if not isinstance(vocab, int) or vocab < 8:
        raise ValueError(f"vocab must be an integer >= 8, got {vocab!r}")
    if isinstance(attention_scale, bool) or not (isinstance(attention_scale, (int, float))
                                                 and 0 < attention_scale < float("inf")):
        raise ValueError(f"attention_scale must be a finite number > 0, got {attention_scale!r}")
    gen = torch.Generator().manual_seed(20261129)
    embed = torch.randn(vocab, HIDDEN, generator=gen)
    embed /= embed.pow(2).mean(dim=1, keepdim=True).sqrt()  # RMS 1: the final norm is nearly the identity
    target = {
        "model.embed_tokens.weight": embed,
        "model.norm.weight": torch.ones(HIDDEN),
        "lm_head.weight": torch.randn(vocab, HIDDEN, generator=gen) * (LOGIT_STD / HIDDEN**0.5),
    }
    for i in range(LAYERS):
        target.update(layer_weights(f"model.layers.{i}", gen, out_scale=1e-3, with_input_norm=True,
                                    attention_scale=attention_scale))
    write(os.path.join(out_dir, "target"), llama_config("LlamaForCausalLM", LAYERS, vocab), target)

    # EAGLE draft: names without the "model." prefix; embed and lm_head are the target's.
    eagle = layer_weights("layers.0", gen, out_scale=0.0, with_input_norm=False)
    eagle["fc.weight"] = torch.cat([torch.eye(HIDDEN), torch.zeros(HIDDEN, HIDDEN)], dim=1)
    eagle["fc.bias"] = torch.zeros(HIDDEN)
    write(os.path.join(out_dir, "eagle"), llama_config("LlamaForCausalLMEagle", 1, vocab), eagle)

    noisy = layer_weights("layers.0", gen, out_scale=1.0, with_input_norm=False)
    noisy["fc.weight"] = torch.randn(HIDDEN, 2 * HIDDEN, generator=gen) * (2 * HIDDEN) ** -0.5
    noisy["fc.bias"] = torch.zeros(HIDDEN)
    write(os.path.join(out_dir, "eagle_random"), llama_config("LlamaForCausalLMEagle", 1, vocab), noisy)

    # Drawn after the folders above, so adding it changed none of their weights.
    write_mtp(out_dir, gen, embed, target["lm_head.weight"])
    # Drawn after mtp/, for the same reason.
    write_eagle3(out_dir, gen, embed, target["lm_head.weight"])
    write_mimo(out_dir, gen, embed, target["lm_head.weight"])
    for folder in ("target", "mtp", "mimo"):
        write_tokenizer(os.path.join(out_dir, folder), vocab)
    if vocab != VOCAB or attention_scale != TARGET_ATTENTION_SCALE:  # a suite's own set; the families keep theirs
        print(f"wrote target/, eagle/, eagle_random/, mtp/, eagle3/, eagle3_full/, mimo/ (tokenizers in target/, "
              f"mtp/ and mimo/) under {out_dir}")
        return
    # Its own module (and generator); it imports this file's writers, so this folder goes on sys.path
    # also when this file was loaded by path (the end-to-end suites' fixture).
    here = os.path.dirname(os.path.abspath(__file__))
    if here not in sys.path:
        sys.path.insert(0, here)
    import tiny_families

    tiny_families.main(out_dir)
    print(f"wrote target/, eagle/, eagle_random/, mtp/, eagle3/, eagle3_full/, mimo/ (tokenizers in target/, "
          f"mtp/ and mimo/) and {', '.join(f + '/' for f in tiny_families.FOLDERS)} under {out_dir}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("out_dir")
    parser.add_argument("--vocab", type=int, default=VOCAB, help="vocabulary of every model and tokenizer")
    parser.add_argument("--attention-scale", type=float, default=TARGET_ATTENTION_SCALE,
                        help="scale of the target's attention output projection (module docstring)")
    cli = parser.parse_args()
    main(cli.out_dir, cli.vocab, cli.attention_scale)
