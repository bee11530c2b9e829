"""Tiny target and draft Llama models with weights made from a fixed seed.

Both are ``transformers`` ``LlamaForCausalLM`` models, float32, on the CPU,
a few MB each. Nothing is downloaded: the weights are drawn from a private
``torch.Generator`` at build time, so every process builds bit-identical
models and the caller's global RNG is left untouched. The draft is the target
plus a small deterministic perturbation of every weight, so it agrees with the
target often enough for speculative decoding to accept several tokens a round;
:func:`with_random_draft` swaps in an unrelated draft (independent weights) for
the same target.

:class:`ProbsMemo` memoises the one-position distributions the engine reads:
a distribution is a pure function of (model, prefix, temperature), and the
engine computes each one by a forward over exactly that prefix.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Sequence

import torch
from transformers import LlamaConfig, LlamaForCausalLM


@dataclasses.dataclass(frozen=True)
class TinyLlamaSpec:
    """Architecture and weight recipe of the reference model pair.

    Attributes:
        vocab_size: V, the number of token ids.
        hidden_size, intermediate_size, num_layers, num_heads, num_kv_heads:
            Llama architecture sizes.
        weight_seed: seed of the generator the target weights are drawn from.
        draft_seed: seed of the generator the draft perturbation is drawn from.
        random_draft_seed: seed of the generator the weights of the unrelated
            draft of :func:`with_random_draft` are drawn from.
        lm_head_std: std of the output projection. Large enough that the
            next-token distributions are peaked (a few nats of entropy, not
            log V), as a trained model's are.
        draft_noise: relative size of the draft's perturbation: each draft
            weight is ``w + draft_noise * std(w) * N(0, 1)``.
    """

    vocab_size: int = 384
    hidden_size: int = 128
    intermediate_size: int = 256
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    weight_seed: int = 0
    draft_seed: int = 1
    random_draft_seed: int = 2
    lm_head_std: float = 0.3
    draft_noise: float = 0.12

    def llama_config(self) -> LlamaConfig:
        """The ``LlamaConfig`` both models share."""
        return LlamaConfig(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_layers,
            num_attention_heads=self.num_heads,
            num_key_value_heads=self.num_kv_heads,
            max_position_embeddings=4096,
            tie_word_embeddings=False,
            torch_dtype="float32",
        )


@dataclasses.dataclass(frozen=True)
class ModelPair:
    """The target model, its draft model and the spec they were built from.

    Attributes:
        draft_kind: ``"close"`` (the target plus a small perturbation, from
            :func:`build_model_pair`), ``"random"`` (independent weights,
            from :func:`with_random_draft`) or ``"reduced"`` (a reduced draft
            vocabulary, from :func:`with_reduced_draft_vocab`).
        hot_token_ids: the target id of each draft column when the draft
            proposes over a reduced vocabulary (EAGLE3's ``d2t`` map); None
            when draft columns are target ids.
    """

    target: LlamaForCausalLM
    draft: LlamaForCausalLM
    spec: TinyLlamaSpec
    draft_kind: str = "close"
    hot_token_ids: tuple[int, ...] | None = None

    @property
    def vocab_size(self) -> int:
        return self.spec.vocab_size

    @property
    def max_positions(self) -> int:
        """The longest sequence both models take: the smaller ``max_position_embeddings``."""
        return min(self.target.config.max_position_embeddings, self.draft.config.max_position_embeddings)


def _weight_std(name: str, param: torch.Tensor, spec: TinyLlamaSpec) -> float | None:
    # None marks RMSNorm gains, which start at exactly 1 as in a fresh Llama.
    if param.dim() == 1:
        return None
    if name.startswith("lm_head"):
        return spec.lm_head_std
    if "embed_tokens" in name:
        return 1.0
    # Fan-in scaling keeps the residual stream at unit size through the layers.
    return 1.0 / math.sqrt(param.shape[1])


def _new_model(spec: TinyLlamaSpec) -> LlamaForCausalLM:
    # transformers initialises weights from the global RNG; fork it so building
    # the models never changes the caller's random state.
    with torch.random.fork_rng(devices=[]):
        model = LlamaForCausalLM(spec.llama_config())
    return model.to(torch.float32).eval()


def _check_spec(spec: TinyLlamaSpec) -> None:
    sizes = ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads")
    for field in sizes:
        if getattr(spec, field) < 1:
            raise ValueError(f"TinyLlamaSpec.{field} must be >= 1, got {getattr(spec, field)}")
    if spec.hidden_size % spec.num_heads or spec.num_heads % spec.num_kv_heads:
        raise ValueError(
            f"hidden_size ({spec.hidden_size}) must be a multiple of num_heads ({spec.num_heads}) "
            f"and num_heads a multiple of num_kv_heads ({spec.num_kv_heads})"
        )


def build_model_pair(spec: TinyLlamaSpec | None = None) -> ModelPair:
    """Build the target and draft models, bit-identical in every process.

    Target weights: N(0, std) per parameter from ``torch.Generator`` seeded
    with ``spec.weight_seed``, filled in ``named_parameters`` order (see
    :class:`TinyLlamaSpec` for the stds); RMSNorm gains are 1. Draft weights:
    target weights plus ``draft_noise * std * N(0, 1)`` from a generator seeded
    with ``spec.draft_seed``.

    Args:
        spec: the recipe; None means ``TinyLlamaSpec()``.

    Returns:
        A :class:`ModelPair` of float32 CPU models in eval mode, ``draft_kind`` ``"close"``.

    Raises:
        ValueError: a non-positive size, or ``num_heads`` not a multiple of
            ``num_kv_heads`` or not dividing ``hidden_size``.
    """
    spec = TinyLlamaSpec() if spec is None else spec
    _check_spec(spec)
    target = _new_model(spec)
    draft = _new_model(spec)
    weight_gen = torch.Generator().manual_seed(spec.weight_seed)
    noise_gen = torch.Generator().manual_seed(spec.draft_seed)
    with torch.no_grad():
        for (name, t_param), (_, d_param) in zip(target.named_parameters(), draft.named_parameters()):
            std = _weight_std(name, t_param, spec)
            if std is None:
                t_param.fill_(1.0)
                d_param.fill_(1.0)
                continue
            t_param.copy_(torch.randn(t_param.shape, generator=weight_gen) * std)
            noise = torch.randn(d_param.shape, generator=noise_gen) * (spec.draft_noise * std)
            d_param.copy_(t_param + noise)
    return ModelPair(target=target, draft=draft, spec=spec)


def with_random_draft(pair: ModelPair) -> ModelPair:
    """The same target model with an unrelated draft model.

    The draft has the target's architecture and weight recipe (same stds,
    RMSNorm gains 1) but its own weights, drawn from a ``torch.Generator``
    seeded with ``pair.spec.random_draft_seed``: a drafter that knows nothing
    of the target, so speculative decoding accepts little, while the output
    of coupled verification must not change. The target object is shared,
    not copied.

    Args:
        pair: from :func:`build_model_pair`.

    Returns:
        A :class:`ModelPair` with ``draft_kind`` ``"random"``, bit-identical
        in every process.

    Raises:
        ValueError: ``pair`` is not a :class:`ModelPair`.
    """
    if not isinstance(pair, ModelPair):
        raise ValueError(f"pair must be a ModelPair, got {type(pair).__name__}")
    spec = pair.spec
    draft = _new_model(spec)
    gen = torch.Generator().manual_seed(spec.random_draft_seed)
    with torch.no_grad():
        for name, param in draft.named_parameters():
            std = _weight_std(name, param, spec)
            if std is None:
                param.fill_(1.0)
            else:
                param.copy_(torch.randn(param.shape, generator=gen) * std)
    return ModelPair(target=pair.target, draft=draft, spec=spec, draft_kind="random")


def with_reduced_draft_vocab(pair: ModelPair, hot_token_ids: Sequence[int]) -> ModelPair:
    """The same pair with a draft that proposes over a reduced vocabulary (an EAGLE3 hot-token draft).

    Draft column j stands for target id ``hot_token_ids[j]``: the draft's
    logits are its model's logits at those ids (the lm_head rows of the hot
    tokens), so its q over draft columns is the softmax of those, and no
    other target id can be drafted. The engine spreads q back onto target
    ids (:func:`draft_probs`) before it proposes, as the plugin's draft hooks
    do, so every draft races on the uniform of the target id it proposes
    (:func:`reduced_draft_probs`).

    Raises:
        ValueError: ``pair`` is not a :class:`ModelPair`, or the ids are empty,
            repeated or outside [0, V).
    """
    if not isinstance(pair, ModelPair):
        raise ValueError(f"pair must be a ModelPair, got {type(pair).__name__}")
    ids = tuple(int(i) for i in hot_token_ids)
    v = pair.vocab_size
    if not ids or len(set(ids)) != len(ids) or not all(0 <= i < v for i in ids):
        raise ValueError(f"hot_token_ids must be distinct target ids in [0, {v}), at least one, got {len(ids)} ids")
    return dataclasses.replace(pair, draft_kind="reduced", hot_token_ids=ids)


def reduced_draft_probs(pair: ModelPair, draft_log_probs: torch.Tensor, temperature: float) -> torch.Tensor:
    """q over target ids of a reduced-vocabulary draft, float32 [V]: zero off ``pair.hot_token_ids``.

    The draft's own distribution over its columns: ``softmax(l / T)`` of its
    logits ``l`` at the hot ids, or at temperature 0 the one-hot of their
    argmax (ties: the first draft column, as SGLang's argmax), spread back
    onto target ids. Computed from the draft model's log-probabilities at
    temperature 1 (equal to its logits up to a constant, which the softmax
    drops), so a low temperature or a greedy row whose full-vocabulary argmax
    is not a hot id still gives a distribution.

    Args:
        pair: from :func:`with_reduced_draft_vocab`.
        draft_log_probs: float [V], ``log softmax`` of the draft model's logits.
        temperature: >= 0.
    """
    hot = torch.tensor(pair.hot_token_ids, dtype=torch.int64)
    kept = draft_log_probs.index_select(-1, hot).to(torch.float32)
    if temperature == 0:
        q = torch.nn.functional.one_hot(kept.argmax(dim=-1), kept.shape[-1]).to(torch.float32)
    else:
        q = torch.softmax(kept / temperature, dim=-1)
    return torch.zeros(draft_log_probs.shape[-1], dtype=torch.float32).index_copy_(-1, hot, q)


def next_token_probs(
    model: LlamaForCausalLM, token_ids: Sequence[int], temperature: float, num_positions: int = 1
) -> torch.Tensor:
    """Next-token distributions at the last ``num_positions`` positions of a sequence.

    Row i is the distribution of the token that follows
    ``token_ids[: len(token_ids) - num_positions + 1 + i]``. One forward over
    the whole sequence, batch of one, no KV cache, so the result depends on
    the sequence alone.

    Args:
        model: a causal LM returning ``.logits`` [1, L, V].
        token_ids: the sequence, L >= num_positions.
        temperature: 0 gives the one-hot of the argmax (ties: smallest id);
            > 0 gives ``softmax(logits / temperature)``.
        num_positions: how many trailing positions to return.

    Returns:
        float32 [num_positions, V], each row summing to 1 (up to rounding).

    Raises:
        ValueError: ``num_positions`` outside [1, len(token_ids)], or a
            negative temperature.
    """
    if not 1 <= num_positions <= len(token_ids):
        raise ValueError(f"num_positions must lie in [1, {len(token_ids)}], got {num_positions}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    ids = torch.tensor([list(token_ids)], dtype=torch.int64)
    logits = model(input_ids=ids, use_cache=False, logits_to_keep=num_positions).logits[0].to(torch.float32)
    if temperature == 0:
        # argmax returns the first maximum, matching the race's smallest-index tie rule.
        return torch.nn.functional.one_hot(logits.argmax(dim=-1), logits.shape[-1]).to(torch.float32)
    return torch.softmax(logits / temperature, dim=-1)


class ProbsMemo:
    """Memoised next-token distributions, one position at a time.

    ``memo(model, token_ids, temperature)`` is
    ``next_token_probs(model, token_ids, temperature)[0]``: a forward over
    exactly ``token_ids``, read at its last position. The engine defines the
    distribution of the token at position t as this forward over the t-token
    prefix, whatever the round drafted after it: on the CPU a longer forward
    (or one that keeps more positions) does not give bitwise-equal rows, and
    coupled verification promises equal outputs only for bitwise-equal
    distributions. One forward per distribution is costly, so the memo keeps
    the most recent ``max_entries`` results (least recently used goes first);
    engines sharing a memo share each other's forwards.

    Args:
        max_entries: >= 1; at V = 384 float32 an entry holds 1.5 KiB.

    Raises:
        ValueError: ``max_entries`` < 1.
    """

    def __init__(self, max_entries: int = 1 << 14) -> None:
        if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 1:
            raise ValueError(f"max_entries must be an int >= 1, got {max_entries!r}")
        self.max_entries = max_entries
        self._entries: collections.OrderedDict[tuple, torch.Tensor] = collections.OrderedDict()
        # Keys hold id(model); keeping the models alive keeps those ids from being reused.
        self._models: dict[int, torch.nn.Module] = {}
        self.hits = 0
        self.misses = 0

    def __call__(self, model: LlamaForCausalLM, token_ids: Sequence[int], temperature: float) -> torch.Tensor:
        """The distribution of the token after ``token_ids``: float32 [V], read-only by convention.

        Raises:
            ValueError: as :func:`next_token_probs` (empty sequence, negative temperature).
        """
        key = (id(model), float(temperature), tuple(token_ids))
        hit = self._entries.get(key)
        if hit is not None:
            self._entries.move_to_end(key)
            self.hits += 1
            return hit
        self.misses += 1
        probs = next_token_probs(model, token_ids, temperature)[0]
        self._models[id(model)] = model
        self._entries[key] = probs
        if len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
        return probs

    def __len__(self) -> int:
        return len(self._entries)
