"""Which model family a server's target belongs to, and what that does to the logits claim.

The logits claim (``config.logits_guarantee``) was measured on dense
full-attention targets in bf16 (``docs/forward_modes.md``). Mixture-of-experts
layers, multi-head latent attention (MLA) and FP8 weights take other kernels
under SGLang's deterministic inference (the fused MoE kernel's fixed tile
configuration, the MLA attention paths, the FP8 GEMMs with pinned tactics):
for them the claim is ``tokens`` until a run measures them, and the start-up
line says what was measured (:data:`MEASURED_APART`) or that nothing was
(the model-family suite's first checks ran on 2026-12-07, fa3 only:
``docs/e2e/2026-12-07-h100-model-families``). A family enters :data:`MEASURED_BITWISE` when a committed run
(``test/registered/e2e/test_model_families.py``) records 0 differing logprobs
for it on a backend, on a target whose logits those layers move. The tiny
family targets (``scripts/tiny_families.py``) are such targets: their
attention and expert outputs are large enough (its ``LAYER_OUT_SCALE``) that
a relative 1e-3 change of one routed expert's, the shared expert's, the MLA
attention's or an FP8 projection's output before its bf16 rounding (the size
of a kernel's rounding difference) changes some bf16 logit of a short
prompt, shown on transformers' own forwards of the written checkpoints
(``test/registered/unit/test_tiny_families.py``). So 0 differing logprobs
there on a backend may promote the family on that backend, for the kernel
paths those shapes take (8 experts of intermediate 128, hidden 512 for
DeepSeek-V3 and 256 for Qwen3-MoE, one GPU): a full-size model can take
other tile configurations or expert parallelism, which the entry's run does
not cover and its record names. A run on a set written before the targets
were made sensitive (no ``tiny_families-v2.json`` or a later version file
beside the folders; layer outputs at 1e-3, a rounding difference rounded
away before the logits) promotes nothing.

The family is read from the target's ``config.json`` (and SGLang's
``--quantization`` flag), never guessed from its name.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path

DENSE = "dense"
# Config keys that give a model's routed-expert count, by family (DeepSeek, Qwen-MoE,
# Mixtral, Step): the model is MoE when one of them is above 1 and some layer uses it.
EXPERT_COUNT_KEYS = ("n_routed_experts", "num_experts", "num_local_experts", "moe_num_experts")

# (family label, attention backend) pairs whose bitwise logprobs a committed end-to-end run
# recorded, with the run. Dense targets are not listed: config.logits_guarantee is theirs.
# moe on fa3 and triton: the tiny Qwen3-MoE target (dense attention, head size 64) with its EAGLE3 draft on the
# plugin's default fused-MoE tile, chain and tree, 0 of 512 logprobs apart from no speculative decoding, 0 after
# radix-cache hits and retractions (SGLang's tile before it: the same, fa3 and triton).
# mla+moe on triton: the tiny DeepSeek-V3 (absorbed MLA, routed and shared experts, one NEXTN layer) with the decode's
# query heads in SGLang's tile, the causal chain verify and the default fused-MoE tile, chain and tree (served as its
# chain), 0 of 512 logprobs apart, 0 after radix-cache hits and retractions (one query row per head and SGLang's tile
# before it: 0; the masked verify: 56 apart; SGLang's split-KV decode: 372).
# mla+moe+fp8 on triton: its FP8 block-quantized copy on the same attention paths (SGLang's deterministic fused-MoE
# tile, as quantized experts keep), 0 of 512 apart, 0 after radix-cache hits and retractions (SGLang's split-KV
# decode before it: 370 apart, one radix-cache hit taking another token).
MEASURED_BITWISE: dict[tuple[str, str], str] = {
    ("moe", "fa3"): "docs/e2e/2026-12-07-h100-moe-default-tile",
    ("moe", "triton"): "docs/e2e/2026-12-07-h100-moe-default-tile",
    ("mla+moe", "triton"): "docs/e2e/2026-12-07-h100-mla-packed-default-tile",
    ("mla+moe+fp8", "triton"): "docs/e2e/2026-12-07-h100-fp8-triton",
}
# What a promotion covers beyond its run, for the start-up note (family_evidence_note).
_MLA_TRITON = ("absorbed MLA with 4 query heads on the single-pass kernel in every mode, the decode's heads in "
               "SGLang's tile as the start-up check allows, its tree served as the chain of its depth")
_NOT_COVERED_MLA = ("other head counts per GPU (DeepSeek-V3's 16 at tensor parallelism 8, 128 on one GPU; the "
                    "kernel tests check the tile there), expert parallelism and other MoE runner backends not at all")
MEASURED_SHAPES = {
    ("moe", "fa3"): "on the tiny Qwen3-MoE with its EAGLE3 draft (head size 64, the FA3 prefix / tail split; 8 "
                    "experts of intermediate 128 on the plugin's default fused-MoE tile, one GPU); the attention "
                    "paths other head sizes take (SGLang's FA3 calls and the node path at 65-128) were measured on "
                    "dense targets only, and other expert layouts, expert parallelism and other MoE runner backends not "
                    "at all",
    ("moe", "triton"): "on the tiny Qwen3-MoE with its EAGLE3 draft (head size 64, the positional-split kernels; 8 "
                       "experts of intermediate 128 on the plugin's default fused-MoE tile, one GPU), and other "
                       "expert layouts, expert parallelism and other MoE runner backends not at all",
    ("mla+moe", "triton"): f"on the tiny DeepSeek-V3 with its NEXTN layer ({_MLA_TRITON}; 8 experts of "
                           "intermediate 128 on the plugin's default fused-MoE tile, one GPU), and "
                           f"{_NOT_COVERED_MLA}",
    ("mla+moe+fp8", "triton"): f"on the tiny FP8 DeepSeek-V3 with its NEXTN layer (FP8 weights in 128 x 128 "
                               f"blocks; {_MLA_TRITON}; 8 experts of intermediate 128 on SGLang's deterministic "
                               "fused-MoE tile, which quantized experts keep; SGLang's prefill CUDA graphs on, one "
                               f"GPU), and other FP8 layouts (per-tensor, per-channel), {_NOT_COVERED_MLA}",
}
# (family label, attention backend) pairs a committed run measured but did not promote (logprobs apart somewhere,
# or a family whose forward modes a run has not covered): what it found.
MEASURED_APART: dict[tuple[str, str], str] = {
    ("mla+moe", "fa3"): "two runs of the tiny DeepSeek-V3 are all there is: its NEXTN chain gave the logprobs of "
                        "decoding without speculative decoding bit for bit, its tree verified as a tree did not "
                        "(docs/e2e/2026-12-07-h100-model-families), its tree served as the chain of its depth did "
                        "(docs/e2e/2026-12-07-h100-mla-chain-served); MLA's forward modes (prefill against decode) "
                        "have not been measured",
    ("mla+moe+fp8", "fa3"): "one run of the tiny FP8 DeepSeek-V3 (SGLang's prefill CUDA graphs off) is all there "
                            "is: its chain and its tree served as the chain gave the logprobs of decoding without "
                            "speculative decoding bit for bit, and after radix-cache hits and retractions "
                            "(docs/e2e/2026-12-07-h100-families-backends/fp8-auto); MLA's prefill against decode "
                            "has not been measured",
    ("moe", "flashinfer"): "the tiny Qwen3-MoE on FlashInfer: 96 and 130 of 512 logprobs of its chain and tree "
                           "apart from decoding without speculative decoding, no token "
                           "(docs/e2e/2026-12-07-h100-families-backends/flashinfer)",
}


@dataclasses.dataclass(frozen=True)
class ModelTraits:
    """What about a target takes it off the measured dense path.

    Attributes:
        moe: some decoder layer routes tokens to experts.
        mla: multi-head latent attention (a ``kv_lora_rank`` in the config).
        quantization: the weights' quantization method (``fp8``, ...), None for bf16/fp16 weights.
    """

    moe: bool = False
    mla: bool = False
    quantization: str | None = None

    @property
    def label(self) -> str:
        """``dense``, or the traits joined by ``+`` in a fixed order (``mla+moe+fp8``)."""
        parts = [name for name, on in (("mla", self.mla), ("moe", self.moe)) if on]
        if self.quantization:
            parts.append(self.quantization)
        return "+".join(parts) or DENSE


def label_traits(label: str | None) -> tuple[str, ...]:
    """The traits a :attr:`ModelTraits.label` names (``"mla+moe"`` -> ``("mla", "moe")``); empty for dense or None."""
    return tuple(t for t in (label or "").split("+") if t and t != DENSE)


def _uses_experts(config: Mapping) -> bool:
    counts = [config.get(key) for key in EXPERT_COUNT_KEYS]
    if not any(isinstance(c, int) and c > 1 for c in counts):
        return False
    layers = int(config.get("num_hidden_layers") or 0) + int(config.get("num_nextn_predict_layers") or 0)
    # Step3p5 lists its MoE layer ids; the project's tiny Step3p5 names one past its depth (dense).
    listed = config.get("moe_layers_enum")
    if isinstance(listed, str) and listed.strip():
        return any(int(i) < layers for i in listed.split(",") if i.strip().isdigit())
    # DeepSeek: the first first_k_dense_replace layers are dense; Qwen-MoE: mlp_only_layers are.
    dense_first = int(config.get("first_k_dense_replace") or 0)
    mlp_only = set(config.get("mlp_only_layers") or ())
    return any(i >= dense_first and i not in mlp_only for i in range(max(layers, 1)))


def traits_of(config: Mapping, quantization_flag: str | None = None) -> ModelTraits:
    """The :class:`ModelTraits` of a model from its ``config.json`` (a dict), multimodal ``text_config`` included.

    Args:
        config: the parsed ``config.json``.
        quantization_flag: SGLang's ``--quantization`` (quantizes at load time), or None.

    Raises:
        ValueError: ``config`` is not a mapping.
    """
    if not isinstance(config, Mapping):
        raise ValueError(f"config must be a mapping (a parsed config.json), got {type(config).__name__}")
    text = config.get("text_config")
    if isinstance(text, Mapping):
        config = {**text, **{k: v for k, v in config.items() if k in QUANT_CONFIG_KEYS}}
    method = quantization_flag or _quant_method(config)
    return ModelTraits(moe=_uses_experts(config), mla=config.get("kv_lora_rank") is not None,
                       quantization=str(method).lower() if method else None)


# Where a config.json says its weights are quantized, as SGLang 0.5.23's ModelConfig._parse_quant_hf_config
# reads it: a quantization_config (with or without quant_method: ModelOpt's has none), else a
# compression_config (compressed-tensors); a standalone hf_quant_config.json is read by model_family.
QUANT_CONFIG_KEYS = ("quantization_config", "compression_config")


def _quant_method(config: Mapping) -> str | None:
    """The quantization method a config names (``quant_method``, else ModelOpt's ``quant_algo``, else the key's
    kind), or None where it names none."""
    for key in QUANT_CONFIG_KEYS:
        quant = config.get(key)
        if isinstance(quant, Mapping):
            return (quant.get("quant_method") or quant.get("quant_algo")
                    or ("compressed-tensors" if key == "compression_config" else "quantized"))
    return None


def model_family(model_path: str | None, quantization_flag: str | None = None) -> str | None:
    """The :attr:`ModelTraits.label` of the model at ``model_path`` (a folder, or a repository id in the Hugging Face cache).

    None when the path is not given or its ``config.json`` cannot be read: the
    claim then follows the attention backend alone, as before the family was known.
    """
    config = read_config(model_path)
    if config is None:
        return None
    if not quantization_flag and _quant_method(config) is None:
        # ModelOpt and mixed-precision checkpoints name their quantization beside config.json only.
        quantization_flag = _standalone_quant_method(model_path)
    return traits_of(config, quantization_flag).label


def _standalone_quant_method(model_path: str) -> str | None:
    """The method of a local ``hf_quant_config.json`` beside the model's ``config.json`` (ModelOpt's layout:
    ``{"quantization": {"quant_algo": ...}}``), ``quantized`` where it names none; None without the file."""
    path = Path(model_path) / "hf_quant_config.json"
    if not path.is_file():
        return None
    try:
        quant = json.loads(path.read_text()).get("quantization")
    except (OSError, ValueError, AttributeError):
        return "quantized"
    return (quant.get("quant_algo") if isinstance(quant, Mapping) else None) or "quantized"


def attention_head_dim(config: Mapping) -> int | None:
    """The attention head size of a model from its ``config.json`` (a dict), multimodal ``text_config`` included.

    ``head_dim`` where given, else ``hidden_size / num_attention_heads``;
    None for MLA (``kv_lora_rank``: its attention calls take other head sizes)
    or where neither is readable.
    """
    text = config.get("text_config")
    config = text if isinstance(text, Mapping) else config
    if config.get("kv_lora_rank") is not None:
        return None
    if isinstance(config.get("head_dim"), int) and config["head_dim"] > 0:
        return config["head_dim"]
    heads, hidden = config.get("num_attention_heads"), config.get("hidden_size")
    if isinstance(heads, int) and isinstance(hidden, int) and heads > 0:
        return hidden // heads
    return None


def head_dim_of(model_path: str | None) -> int | None:
    """:func:`attention_head_dim` of the model at ``model_path`` (as :func:`model_family` finds it); None if unreadable."""
    config = read_config(model_path)
    return None if config is None else attention_head_dim(config)


def read_config(model_path: str | None) -> Mapping | None:
    """The parsed ``config.json`` of the model at ``model_path`` (:func:`config_file`); None if absent or unreadable."""
    if not model_path:
        return None
    path = config_file(model_path)
    try:
        config = json.loads(Path(path).read_text()) if path else None
    except (OSError, ValueError):
        return None
    return config if isinstance(config, Mapping) else None


def config_file(model_path: str) -> Path | str | None:
    """A model's ``config.json``: in the local folder ``model_path``, else in the Hugging Face cache; None if absent."""
    local = Path(model_path) / "config.json"
    if local.is_file():
        return local
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(model_path, "config.json")
    except Exception:  # not a repository id, or no hub client
        return None
    return cached if isinstance(cached, str) else None


# SGLang's --moe-runner-backend values the runs of MEASURED_BITWISE served expert layers with: auto (which SGLang
# resolved to its Triton runner on the Hopper GPUs measured) and triton, with no --moe-a2a-backend (none). Another
# runner, or an all-to-all backend (which moves FP8 experts to DeepGEMM, megamoe among them), is another kernel.
MEASURED_MOE_RUNNERS = ("auto", "triton")
MEASURED_MOE_A2A = ("none",)


def unmeasured_moe_runner(family: str | None, moe_runner: str | None, moe_a2a: str | None = None) -> str | None:
    """The flag, as ``--moe-runner-backend X`` or ``--moe-a2a-backend X``, when it serves ``family``'s expert
    layers with a path no run of :data:`MEASURED_BITWISE` used (a runner not in :data:`MEASURED_MOE_RUNNERS`, an
    all-to-all backend not in :data:`MEASURED_MOE_A2A`), else None (no expert layers, or unknown values)."""
    if family is None or "moe" not in label_traits(family):
        return None
    if moe_runner not in (None, *MEASURED_MOE_RUNNERS):
        return f"--moe-runner-backend {moe_runner}"
    if moe_a2a not in (None, *MEASURED_MOE_A2A):
        return f"--moe-a2a-backend {moe_a2a}"
    return None


# What each trait of a family label (ModelTraits.label) stands for, as start-up notes spell it out.
TRAIT_NAMES = {"mla": "multi-head latent attention", "moe": "mixture-of-experts layers"}


def spelled(family: str) -> str:
    """A family label in words: ``"mla+moe+fp8"`` -> ``"multi-head latent attention, mixture-of-experts layers,
    fp8 weights"`` (a quantization trait is named as the weights' method)."""
    return ", ".join(TRAIT_NAMES.get(t, f"{t} weights") for t in label_traits(family)) or DENSE


def bitwise_backends(family: str) -> list[str]:
    """The backends :data:`MEASURED_BITWISE` records ``family`` on, sorted (where it claims its attention's claim)."""
    return sorted(b for f, b in MEASURED_BITWISE if f == family)


def family_claim(family: str | None, attention_claim: str, attention_backend: str | None,
                 moe_runner: str | None = None, moe_a2a: str | None = None) -> str:
    """The logits claim for a target of ``family`` whose attention backend alone would give ``attention_claim``.

    ``dense`` or unknown (None): ``attention_claim``. Any other family:
    ``tokens``, unless :data:`MEASURED_BITWISE` records the family on this backend and its expert layers (if
    any) run a MoE path the runs used (``moe_runner`` / ``moe_a2a``, SGLang's ``--moe-runner-backend`` /
    ``--moe-a2a-backend``: :func:`unmeasured_moe_runner`).
    """
    if family in (None, DENSE) or attention_claim != "bitwise":
        return attention_claim
    if unmeasured_moe_runner(family, moe_runner, moe_a2a):
        return "tokens"
    return "bitwise" if (family, attention_backend) in MEASURED_BITWISE else "tokens"


def family_note(family: str | None, attention_backend: str | None, moe_runner: str | None = None,
                moe_a2a: str | None = None) -> str | None:
    """The start-up note for a family whose claim is ``tokens`` on this backend (None for dense or promoted ones):
    the MoE runner no run used (:func:`unmeasured_moe_runner`), what a run measured of it
    (:data:`MEASURED_APART`), or that none did."""
    flag = unmeasured_moe_runner(family, moe_runner, moe_a2a)
    if flag:
        return (f"the target is {family} ({spelled(family)}): its logits claim is 'tokens': {flag} runs its expert "
                f"layers on another path than the runs of this family used (SGLang's Triton MoE runner, "
                f"--moe-runner-backend {' or '.join(MEASURED_MOE_RUNNERS)}, no --moe-a2a-backend)")
    if family in (None, DENSE) or (family, attention_backend) in MEASURED_BITWISE:
        return None
    found = MEASURED_APART.get((family, attention_backend))
    if found:
        return f"the target is {family} ({spelled(family)}): its logits claim is 'tokens': {found}"
    measured = sorted({b for f, b in (*MEASURED_BITWISE, *MEASURED_APART) if f == family})
    if attention_backend is None and measured:
        promoted = bitwise_backends(family)
        if not promoted:
            return (f"the target is {family} ({spelled(family)}): its logits claim is 'tokens' on every "
                    f"backend (a run measured this family on {', '.join(measured)}; name --attention-backend for "
                    "what was measured there)")
        return (f"the target is {family} ({spelled(family)}): its logits claim is 'tokens' until the "
                f"backend is known (a run measured this family bitwise on {', '.join(promoted)}; name "
                "--attention-backend for that backend's claim and what was measured there)")
    where = f"{attention_backend} attention" if attention_backend else "any attention backend"
    return (f"the target is {family} ({spelled(family)}): its logits claim is 'tokens', not measured "
            f"(no end-to-end run has recorded its logprobs across forward modes on {where} yet)")


def family_evidence_note(family: str | None, attention_backend: str | None, moe_runner: str | None = None,
                         moe_a2a: str | None = None) -> str | None:
    """The start-up note for a promoted family (:data:`MEASURED_BITWISE`): its run and what the run does not cover
    (None where :func:`family_note` speaks: not promoted, or a MoE runner no run used)."""
    run = MEASURED_BITWISE.get((family, attention_backend))
    if run is None or unmeasured_moe_runner(family, moe_runner, moe_a2a):
        return None
    return (f"the target is {family} ({spelled(family)}): it claims what its attention claims on "
            f"{attention_backend}, measured "
            f"{MEASURED_SHAPES[(family, attention_backend)]} ({run})")
