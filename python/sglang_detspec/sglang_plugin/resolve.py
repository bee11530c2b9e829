"""Resolve the config bag from SGLang's resolved server arguments and install it, at definite points.

The launcher resolves it from the ``ServerArgs`` record during SGLang's own
argument resolution (``startup.resolve_and_announce``). Every process that
loads the plugin then resolves it from SGLang's runtime context
(``get_exec()`` / ``get_spec()`` / ``get_serving()``) right after SGLang
publishes that context at the process entry (:func:`install_published_bag`,
an AFTER hook of ``runtime_context.publish``): that is where scheduler
processes, which receive an already-resolved record, get their bag, before
any hooked site runs. Each resolution is pushed into the config module with
``install_config``; the config getter never calls back here.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
from collections.abc import Mapping
from pathlib import Path

from ..config import (COUPLED_ALGORITHMS, FA3_CAUSAL_KEPT_MAX_HEAD_DIM, FA3_MAX_HEAD_DIM, FA3_SPLIT_BACKENDS,
                      FA3_UNMASKED_DECODE_MAX_HEAD_DIM, ONE_PASS_DECODE_BACKENDS, DetSpecConfig, Refusal,
                      current_config, env_settings, fa3_own_calls_exact, fa3_split_takes, install_config,
                      kv_cache_reason, resolve_verify)
from ..model_family import config_file, family_note, head_dim_of, model_family

logger = logging.getLogger("sglang_detspec")

# Called at the entry of every SGLang process (the scheduler, the HTTP server, the Engine, the
# detokenizer manager and the data-parallel controller), each through its module's
# ``from sglang.srt.runtime_context import publish`` binding, which SGLang's hook registry rebinds.
PUBLISH = "sglang.srt.runtime_context.publish"


# Bag field -> SGLang's server-argument name (the same on the raw ServerArgs
# record, its resolved view and the published "spec" namespace).
SPEC_FIELDS = {
    "algorithm": "speculative_algorithm",
    "num_steps": "speculative_num_steps",
    "eagle_topk": "speculative_eagle_topk",
    "num_draft_tokens": "speculative_num_draft_tokens",
    "rejection_sampling": "speculative_use_rejection_sampling",
    "multi_layer_eagle": "enable_multi_layer_eagle",
    "block_verification": "speculative_use_block_verification",
    "rl_on_policy": "rl_on_policy_target",  # in the "exec.deterministic" namespace once published
}
_FLAGS = ("rejection_sampling", "multi_layer_eagle", "block_verification", "rl_on_policy")
# The source name of the plugin's own declaration on SGLang's resolution stash (startup.py):
# it turned the rejection-sampling flag on for a coupled chain's sampled drafts.
SAMPLED_DRAFTS_SOURCE = "sglang_detspec.coupled_drafts"


def declared_sampled_drafts(server_args) -> bool:
    """Whether the plugin's start-up turned SGLang's sampled-draft path on for this server.

    Read from SGLang's resolution stash on the ``ServerArgs`` record, which
    SGLang pickles to the scheduler processes with the record (its own
    declared resolutions travel the same way).
    """
    stash = getattr(server_args, "_resolved_overrides", None) or ()
    return any(source == SAMPLED_DRAFTS_SOURCE for source, _ in stash)


def bag_from(spec, deterministic, source: str, environ: Mapping[str, str] | None = None, *,
             sampled_drafts: bool = False) -> DetSpecConfig:
    """A bag from any object carrying SGLang's speculative argument names.

    Args:
        spec: the ``ServerArgs`` record (raw values), its resolved view, or
            ``get_spec()``; attributes named as in :data:`SPEC_FIELDS`.
        deterministic: ``enable_deterministic_inference``.
        source: where the values came from (``server_args``, ``runtime_context``, ``raw_args``).
        sampled_drafts: the plugin turned the rejection-sampling flag on for
            coupled drafts (:func:`declared_sampled_drafts`): the verify stays coupled.

    Raises:
        ValueError: a bad ``SGLANG_DETSPEC_*`` setting, or a flag out of its bound (:func:`check_bounds`).
    """
    values = {field: getattr(spec, name, None) for field, name in SPEC_FIELDS.items()}
    for flag in _FLAGS:
        values[flag] = bool(values[flag])
    # On the record; the runtime context carries it in "serving" (config_from_runtime_context).
    values["tokenizer_workers"] = int(getattr(spec, "tokenizer_worker_num", 1) or 1)
    # Read from the draft's config.json; only a known reduced vocabulary counts (for the refusal).
    values["reduced_draft_vocab"] = reduced_draft_vocab(spec) is True
    # The "spec" namespace of the runtime context has no attention fields: its caller reads "exec.kernel".
    values["attention_backend"] = attention_backend_of(spec) if hasattr(spec, "attention_backend") else None
    values["page_size"] = getattr(spec, "page_size", None)
    values["kv_cache_dtype"] = getattr(spec, "kv_cache_dtype", None)
    values["model_family"] = model_family(getattr(spec, "model_path", None), getattr(spec, "quantization", None))
    values["head_dim"] = head_dim_of(getattr(spec, "model_path", None))
    algo = values["algorithm"]
    values["algorithm"] = None if algo is None or str(algo).upper() == "NONE" else str(algo).upper()
    values["eagle_topk"] = resolved_eagle_topk(spec, values["algorithm"], values["eagle_topk"])
    values["adaptive_steps"] = adaptive_steps(spec) if values["algorithm"] else ()
    settings = env_settings(environ)
    settings["verify"] = "coupled" if sampled_drafts else resolve_verify(settings["verify"], values["rejection_sampling"])
    bag = DetSpecConfig(**settings, deterministic=bool(deterministic), source=source, **values)
    if bag.ours:  # a run the plugin serves; others meet SGLang's own rules only
        check_bounds(values)
    return bag


def adaptive_steps(spec) -> tuple[int, ...]:
    """The step counts SGLang's ``--speculative-adaptive`` switches among, sorted; () when it is off.

    Read with SGLang's own ``resolve_candidate_steps_from_config`` (its
    default table, or ``--speculative-adaptive-config``): the union over
    every batch-size slot, as SGLang sizes its runtime states. SGLang turns
    the flag off itself where it cannot run (top-k > 1, multi-layer EAGLE,
    ...; ``_maybe_disable_adaptive``); for flags as typed its rules on the
    algorithm, top-k and multi-layer EAGLE apply here too.

    Raises:
        ValueError: SGLang's, for a malformed adaptive config file.
    """
    if not getattr(spec, "speculative_adaptive", False):
        return ()
    # Flags as typed (the dry run's raw record) have not met _maybe_disable_adaptive yet: its
    # rules on what this bag reads (SGLang 0.5.23's adaptive_unsupported_reason).
    algorithm = str(getattr(spec, "speculative_algorithm", None) or "").upper()
    if (algorithm not in ("EAGLE", "EAGLE3") or getattr(spec, "speculative_eagle_topk", None) not in (None, 1)
            or getattr(spec, "enable_multi_layer_eagle", False)):
        return ()
    from sglang.srt.speculative.adaptive_spec_params import resolve_candidate_steps_from_config

    return tuple(int(s) for s in resolve_candidate_steps_from_config(getattr(spec, "speculative_adaptive_config", None)))


def check_bounds(values: dict) -> None:
    """Refuse the flags the bag reads that no server can run with, naming the flag and its bound.

    ``values``: the bag's fields as :func:`bag_from` read them, for a run
    the plugin serves. A draft top-k below 1 (NGRAM's is its BFS breadth)
    for an algorithm that keeps it (:data:`COUPLED_ALGORITHMS`; SGLang sets
    others' top-k itself), and a KV page size below 1, would otherwise pass
    the dry run with a claim and fail later inside SGLang.

    Raises:
        ValueError: naming the flag, the bound and the value.
    """
    topk, algorithm = values.get("eagle_topk"), values.get("algorithm")
    if algorithm in COUPLED_ALGORITHMS and topk is not None and int(topk) < 1:
        flag = "--speculative-ngram-max-bfs-breadth" if algorithm == "NGRAM" else "--speculative-eagle-topk"
        raise ValueError(f"{flag} must be >= 1 with --speculative-algorithm {algorithm}, got {topk}")
    page = values.get("page_size")
    if page is not None and int(page) < 1:
        raise ValueError(f"--page-size must be >= 1, got {page}")


def resolved_eagle_topk(spec, algorithm: str | None, eagle_topk: int | None) -> int | None:
    """The draft top-k SGLang serves ``spec`` with, also from flags as typed (so the ``logits`` claim is right).

    SGLang's ``handle_speculative_decoding`` sets NGRAM's top-k to
    ``--speculative-ngram-max-bfs-breadth`` whatever ``--speculative-eagle-topk``
    says (10 by default: a tree); every other algorithm keeps ``eagle_topk``.
    On a resolved record the two already agree; the runtime context's "spec"
    namespace may not carry the breadth, and then ``eagle_topk`` (resolved) stays.
    """
    breadth = getattr(spec, "speculative_ngram_max_bfs_breadth", None)
    return int(breadth) if algorithm == "NGRAM" and breadth is not None else eagle_topk


def config_from_server_args(server_args, environ: Mapping[str, str] | None = None) -> DetSpecConfig:
    """The bag from a ``ServerArgs`` record, read through SGLang's resolved view.

    SGLang keeps raw CLI values on the record (``nextn`` stays ``nextn``) and
    the resolved ones (``EAGLE``) beside it, so this reads ``resolved_view``.

    Raises:
        ValueError: a bad ``SGLANG_DETSPEC_*`` setting.
    """
    from sglang.srt.arg_groups.overrides import resolved_view

    view = resolved_view(server_args)
    return bag_from(view, view.enable_deterministic_inference, "server_args", environ,
                    sampled_drafts=declared_sampled_drafts(server_args))


def config_from_runtime_context(environ: Mapping[str, str] | None = None) -> DetSpecConfig:
    """The bag from SGLang's published runtime context.

    Raises:
        LookupError: the context is not published in this process yet, or the
            publish role may not read a namespace the bag needs
            (``SGLANG_ROLE_NAMESPACES=enforce``).
        ValueError: a bad ``SGLANG_DETSPEC_*`` setting.
    """
    from sglang.srt.runtime_context import get_context, get_exec, get_serving, get_spec

    try:
        exec_bag, spec, record = get_exec(), get_spec(), get_context().server_args
        serving = get_serving()
    except ValueError as err:  # SGLang raises ValueError("... not published")
        raise LookupError(str(err)) from err
    det = exec_bag.deterministic
    bag = bag_from(spec, det.enable_deterministic_inference, "runtime_context", environ,
                   sampled_drafts=declared_sampled_drafts(record))
    # The published "spec" namespace carries no attention fields; "exec.kernel" does.
    from sglang.srt.arg_groups.overrides import resolved_view

    view = resolved_view(record) if record else None
    return dataclasses.replace(bag, rl_on_policy=bool(getattr(det, "rl_on_policy_target", None)),
                               attention_backend=attention_backend_of(exec_bag.kernel),
                               page_size=getattr(view, "page_size", None),
                               kv_cache_dtype=getattr(view, "kv_cache_dtype", None),
                               model_family=model_family(getattr(view, "model_path", None),
                                                         getattr(view, "quantization", None)),
                               head_dim=head_dim_of(getattr(view, "model_path", None)),
                               tokenizer_workers=int(getattr(serving, "tokenizer_worker_num", 1) or 1))


def setting_notes(config: DetSpecConfig) -> list[str]:
    """Notes for the start-up log, one sentence each (logged, never silent).

    Why the attention rule claims ``tokens`` (``DetSpecConfig.logits_reason``),
    an unmeasured target family (``model_family.family_note``), and settings
    the bag accepts that change nothing for this server.
    """
    notes = []
    # An unknown backend (None: SGLang picks it at start-up) has its own note in the dry run.
    if config.active and config.attention_backend is not None and config.logits_reason:
        notes.append(f"logits='tokens' because of {config.logits_reason}")
    family = family_note(config.model_family, config.attention_backend) if config.active else None
    if family:
        notes.append(family)
    if config.active and config.tree_attention == "nodes":
        if config.attention_backend not in (None, "fa3"):  # None: not resolved yet (SGLang picks it at start-up)
            notes.append(f"SGLANG_DETSPEC_TREE_ATTENTION=nodes applies to the FA3 backend only; with "
                         f"{config.attention_backend} attention it changes nothing")
        elif kv_layout_limit(config):
            notes.append(f"SGLANG_DETSPEC_TREE_ATTENTION=nodes changes nothing with {kv_layout_limit(config)}: "
                         "the node path, like the prefix / tail split, reads KV pages of one token in SGLang's "
                         "default KV dtype (auto), so the server keeps SGLang's FA3 calls")
        elif config.decode_attention == "split" and (config.eagle_topk or 1) > 1 and config.algorithm:
            notes.append("SGLANG_DETSPEC_TREE_ATTENTION=nodes stands by on fa3: the prefix / tail split (the "
                         "default) verifies trees where it serves; the node path verifies the trees it declines; "
                         "SGLANG_DETSPEC_DECODE_ATTENTION=sglang or one_pass runs the node path for every tree")
        elif config.algorithm is None or (config.eagle_topk or 1) <= 1:
            notes.append("SGLANG_DETSPEC_TREE_ATTENTION=nodes applies to tree verify (--speculative-eagle-topk > 1) "
                         "only; this server verifies no trees")
    if config.active and config.decode_attention != "split" and config.attention_backend is not None and (
            config.attention_backend.split("/")[-1] not in ONE_PASS_DECODE_BACKENDS + FA3_SPLIT_BACKENDS):
        notes.append(f"SGLANG_DETSPEC_DECODE_ATTENTION={config.decode_attention} applies to the triton and fa3 "
                     f"backends only; with {config.attention_backend} attention it changes nothing")
    if config.active and config.tree_chain_batch and not config.chain_at_batch:
        kept = "keeps its draft shape" if config.algorithm else "runs no speculative decoding"
        notes.append(f"SGLANG_DETSPEC_TREE_CHAIN_BATCH={config.tree_chain_batch} applies to coupled EAGLE / EAGLE3 "
                     "trees (--speculative-eagle-topk > 1, not multi-layer EAGLE) with a KV page size of 1 and at "
                     f"least steps + 1 draft tokens; this server {kept}")
    return notes


# What committed server runs cover (docs/e2e/, docs/forward_modes.md): the attention backends of the
# 2026-12-02 matrix, and the speculative algorithms no server has run yet (wired and CPU-tested).
MEASURED_ATTENTION_BACKENDS = ("fa3", "triton", "flashinfer")
UNMEASURED_ALGORITHMS = ("NGRAM", "STANDALONE")


def fa3_split_path(config: DetSpecConfig) -> str:
    """Which FA3 path this server's target takes under ``split`` where the split does not stand down, and why."""
    if config.verifies_trees:
        return "this server verifies draft trees, so its target runs the split at every head size"
    if config.head_dim is None:
        return (f"this server verifies no trees: at a target head size of {FA3_UNMASKED_DECODE_MAX_HEAD_DIM + 1}-"
                f"{FA3_CAUSAL_KEPT_MAX_HEAD_DIM} it keeps SGLang's own FA3 calls (a start-up check decides), at "
                "other head sizes it runs the split (the model's head size was not read)")
    return (f"at target head size {config.head_dim} SGLang's own FA3 calls run a decode step on another kernel than "
            "a prefill, so this server's target runs the split")


def unadmitted_split_backends(backend: str | None) -> list[str]:
    """The parts of a ``prefill/decode`` backend pair outside SGLang's deterministic set, in order.

    SGLang 0.5.23 refuses an ``--attention-backend`` outside its
    ``DETERMINISTIC_ATTENTION_BACKEND_CHOICES`` (:func:`sglang_refusals`) but
    does not check ``--prefill-attention-backend`` / ``--decode-attention-backend``.

    Args:
        backend: the bag's ``attention_backend`` (``prefill/decode`` where they differ), or None.

    Returns:
        Each part SGLang would not admit as ``--attention-backend``; empty for one backend or None.
    """
    if backend is None or "/" not in backend:
        return []
    from sglang.srt.server_args import DETERMINISTIC_ATTENTION_BACKEND_CHOICES as accepted

    return [part for part in dict.fromkeys(backend.split("/")) if part not in accepted]


def unmeasured_notes(config: DetSpecConfig) -> list[str]:
    """What an active server's ``logits`` claim rests on without a server run behind it, one sentence each.

    An attention backend SGLang admits under deterministic inference that no
    committed run used (FA4, and the non-CUDA ones), a prefill/decode pair of
    backends (with a part outside SGLang's deterministic set named), and the
    speculative algorithms in :data:`UNMEASURED_ALGORITHMS`.
    Empty for an inactive bag (it claims nothing) and for a backend not
    resolved yet (None).
    """
    if not config.active:
        return []
    notes = []
    backend = config.attention_backend
    if backend is not None and backend not in MEASURED_ATTENTION_BACKENDS:
        notes.append(f"attention backend {backend}: not measured (servers have run on "
                     f"{', '.join(MEASURED_ATTENTION_BACKENDS)} only): the logits={config.logits!r} claim is "
                     "the rule's, not a measured figure")
    outside = unadmitted_split_backends(backend)
    if outside:
        notes.append(f"prefill / decode attention {backend}: SGLang checks only --attention-backend against the "
                     f"backends it admits under deterministic inference, and {', '.join(outside)} is not among "
                     "them: nothing vouches for its batch invariance, so outputs may change with the batch")
    if config.adaptive_steps:
        notes.append(f"--speculative-adaptive (draft steps {list(config.adaptive_steps)} by batch size and accept "
                     "rate): coupled verify makes the tokens independent of the step count (tokens equal to no "
                     "speculative decoding while the steps switched: the tiny-model invariance run of "
                     "2026-12-04); its serving cost is not measured")
    dense = family_note(config.model_family, backend) is None  # the figures below are a dense target's
    if config.chain_at_batch:
        notes.append(chain_note(config))
    elif config.can_switch_shape and dense:
        notes.append(tree_load_note(config))
    if not dense:
        # The family's own note gives the claim ('tokens'); the split notes below speak of a dense target's.
        attention = family_attention_note(config)
        if attention:
            notes.append(attention)
    elif config.decode_attention == "split":
        notes.extend(split_notes(config))
    if config.node_path_verifies and dense:
        notes.append(NODE_PATH_NOTE)
    if config.algorithm in UNMEASURED_ALGORITHMS:
        notes.append(f"{config.algorithm} is wired and CPU-tested but has not yet run on a server: its logits "
                     "claim is what the attention backend and top-k promise, not a measured figure")
    return notes


def family_attention_note(config: DetSpecConfig) -> str | None:
    """:func:`unmeasured_notes`' sentence on the attention of a target of an unmeasured family, or None.

    MLA: neither of the plugin's attention paths serves it. MoE or quantized
    weights with standard attention: which attention path serves it where the
    split would serve a dense target's (the split, or SGLang's own FA3 calls
    where the split stands down); None where no path of the plugin's serves
    (another backend, the split turned off or past a limit, no backend named).
    """
    if "mla" in (config.model_family or "").split("+"):
        return ("MLA attention: neither the positional split nor the one-pass decode serves it; SGLang's own "
                "attention calls run (on triton its split-KV decode kernel), so the split's notes do not apply")
    path = FAMILY_PATHS.get(split_path(config)) if config.decode_attention == "split" else None
    if path is None:
        return None
    return (f"{path} this target's attention as a dense target's where the start-up check passes; the claim "
            "stays 'tokens' until a run measures the family (above)")


# What serves a target's attention under the split (split_path), as family_attention_note words it; a path
# missing here (the one-pass decode past a split limit) is no path the family note speaks of.
FAMILY_PATHS = {"triton_split": "the positional-split Triton kernels serve",
                "fa3_own_calls": "SGLang's own FA3 calls serve (the split stands down: no trees, head size in 65-128)",
                "fa3_split": "the FA3 prefix / tail split serves"}


def split_path(config: DetSpecConfig) -> str | None:
    """Which of the plugin's attention paths the flags show serving a dense target under ``split``, or None.

    ``triton_split`` / ``triton_one_pass`` (a split limit the flags show) on triton; ``fa3_own_calls`` (the
    split stands down: no trees, head size 65-128) / ``fa3_split`` on fa3; None on any other backend, a
    pair of backends or none named, and on fa3 past a split limit (SGLang's calls, logged in the claim).
    """
    backend = config.attention_backend
    limit = split_flag_limit(config)
    if backend in ONE_PASS_DECODE_BACKENDS:  # one backend: a pair claims tokens anyway
        return "triton_one_pass" if limit else "triton_split"
    if backend in FA3_SPLIT_BACKENDS and limit is None:
        return "fa3_own_calls" if fa3_own_calls_exact(config.head_dim, config.verifies_trees) else "fa3_split"
    return None


def split_notes(config: DetSpecConfig) -> list[str]:
    """:func:`unmeasured_notes`' sentences on the positional split (``SGLANG_DETSPEC_DECODE_ATTENTION=split``)."""
    notes = []
    path = split_path(config)
    if path == "triton_split":
        notes.append("SGLANG_DETSPEC_DECODE_ATTENTION=split (the default; one_pass or sglang turn it off): the "
                     "positional-split Triton kernels were measured "
                     "bitwise on one H200 (kernels at head sizes 64-256; servers on the tiny suite models: the "
                     "forward modes, docs/e2e/2026-12-05-h200-split/, SGLang's harness at the default, "
                     "docs/e2e/2026-12-05-h200-default/); their serving cost is not measured; a "
                     "start-up check on the GPU compares their decode with their prefill, a chunked extend and tree "
                     "verify bit for bit, and where it fails, or past a limit the dry run does not check (more than "
                     "64 query heads per KV head), the server keeps the one-pass decode, chains stay 'bitwise' and "
                     "trees drop to 'tokens' (logged); a model with sliding-window layers claims 'tokens' (logged)")
    if path == "triton_one_pass":
        notes.append(f"the positional-split Triton kernels cannot serve this server ({split_flag_limit(config)}): "
                     "the target keeps the "
                     "one-pass decode, whose cost is measured without speculative decoding at 2.03x SGLang's "
                     "inter-token latency at one request with 2,048-token prompts (docs/forward_modes.md)")
    if path == "fa3_own_calls":
        notes.append(f"SGLANG_DETSPEC_DECODE_ATTENTION=split on fa3 (the default) stands down for this server: it "
                     f"verifies no trees and its target's head size, {config.head_dim}, is in "
                     f"{FA3_UNMASKED_DECODE_MAX_HEAD_DIM + 1}-{FA3_CAUSAL_KEPT_MAX_HEAD_DIM}, where SGLang's own FA3 "
                     "calls run decode, prefill, chunked prefill and a chain's verify on one causal kernel over the "
                     "same key tiles (0 of 2,100 rows apart at head size 128: docs/benchmarks/fa3_chunk_probe/; "
                     "SGLang's harness on such servers: docs/e2e/2026-12-05-h100-own-calls/), "
                     "so the split would add cost (up to 1.21x SGLang's inter-token latency on the 8B shape) and "
                     "change no claim; a start-up check on the GPU compares SGLang's calls in those modes bit for "
                     "bit, and where it finds a row apart the split serves (logged)")
    elif path == "fa3_split":
        cost = ("0.92-1.06x SGLang's FA3 inter-token latency for a tree" if config.verifies_trees else
                "0.99-1.21x SGLang's FA3 inter-token latency for a chain running it (a chain at head sizes "
                f"{FA3_UNMASKED_DECODE_MAX_HEAD_DIM + 1}-{FA3_CAUSAL_KEPT_MAX_HEAD_DIM} keeps SGLang's calls and "
                "pays none of it)")
        fallback = ": 'tokens' for a tree (SGLang's cascade)" if config.verifies_trees else ""
        notes.append(f"SGLANG_DETSPEC_DECODE_ATTENTION=split on fa3 (the default; sglang or one_pass turn it off): "
                     f"{fa3_split_path(config)}; the prefix / tail split (two FA3 calls per row "
                     "over key ranges chosen from its own length) was measured bitwise on one H200 (kernels at head "
                     "sizes 64-256; servers on the tiny suite models at head size 64, SGLang's harness and the "
                     "forward modes at the default: docs/e2e/2026-12-05-h200-default/; SGLang's harness on a "
                     "head-size-128 tree: docs/e2e/2026-12-05-h100-own-calls/); its serving cost on the 8B shape "
                     f"(head size 128): {cost} (docs/benchmarks/attention_cost/2026-12-05-h200-split/); "
                     "a start-up check on the GPU compares its decode with its prefill, "
                     "chunked prefill and tree verify bit for bit, and where it fails, or past a limit the dry run "
                     "cannot see (a layer with a window, sinks or a value head size unlike the key's), the server "
                     f"keeps SGLang's FA3 calls there and logs the claim they give{fallback}")
    return notes


def kv_layout_limit(config: DetSpecConfig) -> str | None:
    """The KV page size or cache dtype that turns down both FA3 paths and the Triton split, or None.

    Both read pages of one token in SGLang's default KV dtype (``auto``).
    """
    if (config.page_size or 1) != 1:
        return f"KV page size {config.page_size}"
    if kv_cache_reason(config.kv_cache_dtype) is not None:
        return f"--kv-cache-dtype {config.kv_cache_dtype}"
    return None


def split_flag_limit(config: DetSpecConfig) -> str | None:
    """A limit of the positional split that the flags already show this server passes, or None.

    Page size, a KV cache dtype other than auto, head size (both splits take
    up to 256) and, on fa3, the tree's draft tokens: past one the claim's reason says
    what serves instead, so no note describes the split. Limits only the
    built backend shows (head counts, windows) are the start-up check's.
    """
    kv = kv_layout_limit(config)
    if kv:
        return kv
    if config.head_dim is not None and config.head_dim > FA3_MAX_HEAD_DIM:
        return f"head size {config.head_dim}"
    tree_topk = config.eagle_topk if config.algorithm else None
    if config.attention_backend in FA3_SPLIT_BACKENDS and not fa3_split_takes(tree_topk, config.num_draft_tokens):
        return f"trees of {config.num_draft_tokens} draft tokens"
    return None


NODE_PATH_NOTE = (
    "SGLANG_DETSPEC_TREE_ATTENTION=nodes on fa3: every tree verify runs SGLang's FA3 decode call over one "
    "query per tree node (0 of 1,024 logprobs apart from no speculative decoding on the EAGLE, EAGLE3 and NEXTN "
    "trees of the FA3 forward-mode matrix: tiny models, head size 64, one H200); against SGLang's cascade verify "
    "it cost -3% to +6.5% inter-token latency at 128-token prompts and +17% (8 requests) to about +36% (32 "
    "requests) at 2048-token prompts on the 8B shape (one H200, docs/forward_modes.md); other prompt lengths "
    "are not measured")


def tree_load_note(config: DetSpecConfig) -> str:
    """:func:`unmeasured_notes`' sentence for a tree that could draft a chain at large batches but does not."""
    rows = config.num_draft_tokens or "one per draft token,"
    return (f"a tree verifies {rows} rows per request, a chain of its depth {config.num_steps + 1}: on fa3 at the "
            "8B shape (128-token prompts, prefill CUDA graphs on) the tree of 8 rows served 0.85 of SGLang's "
            "non-deterministic EAGLE chain at 32 requests (one H100, da5949a) and 0.59 at 128 (one H200, 18240f4), "
            "below the coupled chain, and 0.995 / 1.014 at 1 / 8 (the H200 / the H100); other backends and shapes "
            "are not measured (docs/determinism_tax.md); SGLANG_DETSPEC_TREE_CHAIN_BATCH=B drafts a chain for "
            "decode batches above B without changing a token")


def chain_note(config: DetSpecConfig) -> str:
    """:func:`unmeasured_notes`' sentence for a switching tree (``config.chain_at_batch`` set)."""
    return (f"SGLANG_DETSPEC_TREE_CHAIN_BATCH={config.chain_at_batch}: decode batches of more than "
            f"{config.chain_at_batch} requests draft a chain of {config.num_steps} steps instead of the tree; "
            "coupled verify makes the tokens independent of the draft shape (tokens equal to no speculative "
            "decoding while switching both ways, the chain verifying under CUDA graphs: the tiny-model runs of "
            "2026-12-04 and 2026-12-06); served at a bound of 16 on fa3 (8B shape, 128-token prompts, output "
            "tokens/s against SGLang's non-deterministic EAGLE chain, docs/determinism_tax.md): 0.92 / 0.85 at "
            "8 / 32 requests with the split (one H200, 18240f4), 1.03 / 0.90 on SGLang's FA3 calls with trees "
            "verified per node (SGLANG_DETSPEC_TREE_ATTENTION=nodes SGLANG_DETSPEC_DECODE_ATTENTION=sglang; one "
            "H100, 951108d, where the coupled chain served 0.85 / 0.87); other bounds, backends, concurrencies and "
            "prompt lengths are not measured")


def announce(config: DetSpecConfig) -> None:
    """The start-up log line: whether sglang-detspec is active, and the bag (the fields that apply).

    Then one line per :func:`setting_notes` and per :func:`unmeasured_notes`.
    """
    state = "active" if config.active else "inactive (SGLang's own sampling runs)"
    logger.warning("sglang-detspec %s: %s", state, config.describe())
    for note in setting_notes(config) + unmeasured_notes(config):
        logger.warning("sglang-detspec: %s", note)


def install_published_bag(result, *args, **kwargs) -> None:
    """AFTER hook for SGLang's ``runtime_context.publish``: install the bag of the context just published.

    Runs at the entry of every process that loads the plugin, before any
    hooked site reads the bag. The bag is installed and its start-up line
    logged unless the bag in force is already the same one (equal in every
    field but ``source``). Returns None, so ``publish`` returns its context.

    Raises:
        ValueError: a bad ``SGLANG_DETSPEC_*`` setting (the process stops at its entry).
    """
    try:
        bag = config_from_runtime_context()
    except LookupError as err:
        # Only a role whose declared namespaces leave out the bag's (SGLANG_ROLE_NAMESPACES=enforce: the
        # DP controller reads no "spec") gets here; such a process runs none of the hooked sites.
        logger.info("sglang-detspec: no config bag for publish role %r: %s", kwargs.get("role"), err)
        return None
    before = current_config()
    # SGLang's re-publish is last-publish-wins (a process that rebuilds an engine, possibly from a record
    # resolved before, so without a new resolve_and_announce): a different bag replaces the one in force.
    # The launcher's own publish comes after resolve_and_announce installed the bag of the same record;
    # this resolution then agrees in every field (tokenizer_workers included, which the launcher's
    # refusals read), so that bag stays, with its "server_args" source and its one start-up line.
    if before.source != "env" and dataclasses.replace(bag, source=before.source) == before:
        return None
    install_config(bag)
    announce(bag)
    return None


def attention_backend_of(cfg) -> str | None:
    """The attention backend of ``cfg`` (SGLang's argument names), as ``config.logits_guarantee`` takes it.

    SGLang's own ``attention_backends_of`` splits it into prefill and decode;
    one name where both use the same backend, ``"prefill/decode"`` where they
    differ (their forwards cannot agree bit for bit), None where nothing is set.
    """
    from sglang.srt.arg_groups.model_override_base import attention_backends_of

    prefill, decode = attention_backends_of(cfg)
    return decode if prefill == decode else f"{prefill}/{decode}"


def reduced_draft_vocab(spec) -> bool | None:
    """Whether the draft of ``spec`` (SGLang's argument names) proposes over a reduced vocabulary.

    True with ``--speculative-token-map`` (SGLang ignores the map for EAGLE3,
    whose checkpoint carries its own), or when the draft's ``config.json``
    (local, or in the Hugging Face cache for a repository id) has a
    ``draft_vocab_size`` other than its ``vocab_size`` (EAGLE3 checkpoints
    with a ``d2t`` map). None when an EAGLE3 draft's ``config.json`` cannot be
    read (most EAGLE3 checkpoints are reduced); False otherwise (EAGLE drafts
    share the target's head).
    """
    algorithm = str(getattr(spec, "speculative_algorithm", None) or "").upper()
    if not algorithm or algorithm == "NONE":
        return False
    if getattr(spec, "speculative_token_map", None) and algorithm != "EAGLE3":
        return True
    path = getattr(spec, "speculative_draft_model_path", None)
    try:
        config = json.loads(Path(config_file(path)).read_text()) if path else None
    except (OSError, ValueError, TypeError):
        config = None
    if config is None:
        return None if algorithm == "EAGLE3" else False
    draft_vocab = config.get("draft_vocab_size")
    return draft_vocab is not None and draft_vocab != config.get("vocab_size")


def sglang_backend_switch(args) -> str | None:
    """The backend SGLang's FA3 + ``fp8_e5m2`` fallback puts in place of ``--attention-backend``, or None.

    SGLang 0.5.23 serves ``--attention-backend fa3`` with an ``fp8_e5m2`` KV cache on Triton
    (FA3 reads FP8 as e4m3 only): a post-process of its resolution
    (``arg_groups/overrides.py``, ``_attention_backend_fa3_fp8_fallback``) that needs no model,
    so the dry run asks that function itself instead of restating its rule (its other resolution
    passes, which read the model or the platform, are not consulted). The server's own bag is
    read after SGLang's resolution and sees the switched backend.

    Args:
        args: SGLang's parsed ``launch_server`` arguments (``attention_backend``, ``kv_cache_dtype``).

    Returns:
        The backend SGLang switches to, or None where it keeps the typed one (or this SGLang has
        no such rule).
    """
    try:
        from sglang.srt.arg_groups.overrides import _attention_backend_fa3_fp8_fallback as switch
    except ImportError:
        return None
    typed = getattr(args, "attention_backend", None)
    view = argparse.Namespace(attention_backend=typed, kv_cache_dtype=getattr(args, "kv_cache_dtype", None))
    sglang_log = logging.getLogger(switch.__module__)  # its warning is for servers; the dry run says it in a note
    level = sglang_log.level
    sglang_log.setLevel(logging.ERROR)
    try:
        switched = switch(view).get("attention_backend")
    finally:
        sglang_log.setLevel(level)
    return switched if switched not in (None, typed) else None


def sglang_refusals(args) -> list[Refusal]:
    """What SGLang's own deterministic-inference resolution refuses among the flags as typed.

    SGLang 0.5.23 admits under ``--enable-deterministic-inference`` only the
    attention backends of its ``DETERMINISTIC_ATTENTION_BACKEND_CHOICES``
    (``sglang.srt.server_args``; read at call time, not copied, since SGLang
    plugins may extend it) and raises for any other ``--attention-backend``
    (``arg_groups/overrides.py``, ``_deterministic_attention_backend``). That
    check runs in SGLang's resolution pipeline, which needs the model, so
    ``detspec serve`` (and its ``--dry-run``) states it up front from the
    parsed flags. In the server SGLang's check runs before the plugin's hook
    (``handle_deterministic_inference`` precedes ``handle_speculative_decoding``),
    so :func:`check_raw_flags` does not repeat it. The split
    ``--prefill-attention-backend`` / ``--decode-attention-backend`` flags
    are not part of SGLang's rule, so not of this one.

    Args:
        args: SGLang's parsed ``launch_server`` arguments (``attention_backend``,
            ``enable_deterministic_inference``).

    Returns:
        One :class:`~sglang_detspec.config.Refusal` (code ``attention_backend``)
        naming the flag, the value and the accepted set; empty when SGLang admits the flags
        or deterministic inference is off.
    """
    from sglang.srt.server_args import DETERMINISTIC_ATTENTION_BACKEND_CHOICES as accepted

    backend = getattr(args, "attention_backend", None)
    if not getattr(args, "enable_deterministic_inference", False) or backend is None or backend in accepted:
        return []
    return [Refusal("attention_backend",
        f"--attention-backend {backend} is refused by SGLang under --enable-deterministic-inference: "
        f"it admits only {', '.join(accepted)} there (fa3 and triton serve chains and trees with "
        "bitwise logits; "
        "docs/forward_modes.md)")]
