"""The start-up notes: what a server's settings change, and what its claim rests on without a measurement.

One sentence per note, logged after the bag's own line wherever a bag is
installed (:func:`announce`: the launcher's resolution, ``startup.py``, and
each process's publish, ``resolve.py``) and printed
by ``detspec serve --dry-run``: why the attention rule claims ``tokens``,
settings the bag accepts that change nothing for this server
(:func:`setting_notes`), and the measured figures, or their absence, behind
a configuration's claim and cost (:func:`unmeasured_notes`). The figures
quoted here are the committed runs' (``docs/``); the rules they describe
live in ``config.py`` and the hooks, which never import this module.
"""

from __future__ import annotations

import dataclasses

import logging

from ..config import (DEFAULT_MOE_TILE, FA3_CAUSAL_KEPT_MAX_HEAD_DIM, FA3_MAX_HEAD_DIM, FA3_SPLIT_BACKENDS,
                      FA3_TREE_DEFAULTS, FA3_UNMASKED_DECODE_MAX_HEAD_DIM, MLA_DECODE_COST, MLA_TREE_EVIDENCE,
                      MOE_TILE_FIELDS,
                      ONE_PASS_DECODE_BACKENDS, PLAIN_TREE_DEFAULTS,
                      TREE_SETTING_ENVS, VERIFY_ENV, DetSpecConfig,
                      fa3_head_size_reason, fa3_own_calls_exact, fa3_split_takes, switch_settings)
from ..model_family import bitwise_backends, family_evidence_note, family_note

logger = logging.getLogger("sglang_detspec")


def setting_notes(config: DetSpecConfig) -> list[str]:
    """Notes for the start-up log, one sentence each (logged, never silent).

    Why the attention rule claims ``tokens`` (``DetSpecConfig.logits_reason``),
    an unmeasured target family (``model_family.family_note``), and settings
    the bag accepts that change nothing for this server.
    """
    notes = []
    if config.active and config.verify == "rejection":
        notes.append(REJECTION_MODE_NOTE)
    defaults = fa3_tree_defaults_note(config)
    if defaults:
        notes.append(defaults)
    # An unknown backend (None: SGLang picks it at start-up) has its own note in the dry run.
    # Where no run promoted an MLA family on its backend, the attention rule's reason would blame a setting
    # that does not act on its attention; the family and MLA notes say why the claim is 'tokens'.
    if (config.active and config.attention_backend is not None and config.logits_reason
            and ("mla" not in config.family_traits
                 or config.attention_backend in bitwise_backends(config.model_family))):
        notes.append(f"logits='tokens' because of {config.logits_reason}")
    family = (family_note(config.model_family, config.attention_backend, config.moe_runner, config.moe_a2a)
              if config.active else None)
    if family:
        notes.append(family)
    evidence = (family_evidence_note(config.model_family, config.attention_backend, config.moe_runner,
                                     config.moe_a2a)
                if config.active else None)
    if evidence:
        notes.append(evidence)
    if config.active and config.tree_attention == "nodes":
        if config.attention_backend not in (None, "fa3"):  # None: not resolved yet (SGLang picks it at start-up)
            notes.append(f"SGLANG_DETSPEC_TREE_ATTENTION=nodes applies to the FA3 backend only; with "
                         f"{config.attention_backend} attention it changes nothing")
        elif config.kv_layout_problem:
            notes.append(f"SGLANG_DETSPEC_TREE_ATTENTION=nodes changes nothing with {config.kv_layout_problem}: "
                         "the node path, like the prefix / tail split, reads KV pages of one token in SGLang's "
                         "default KV dtype (auto), so the server keeps SGLang's FA3 calls")
        elif config.decode_attention == "split" and (config.eagle_topk or 1) > 1 and config.algorithm:
            notes.append("SGLANG_DETSPEC_TREE_ATTENTION=nodes stands by on fa3: the prefix / tail split "
                         "(SGLANG_DETSPEC_DECODE_ATTENTION=split) verifies trees where it serves; the node path "
                         "verifies the trees it declines; "
                         "SGLANG_DETSPEC_DECODE_ATTENTION=sglang or one_pass runs the node path for every tree")
        elif config.algorithm is None or (config.eagle_topk or 1) <= 1:
            notes.append("SGLANG_DETSPEC_TREE_ATTENTION=nodes applies to tree verify (--speculative-eagle-topk > 1) "
                         "only; this server verifies no trees")
    if config.active and config.decode_attention != "split" and config.attention_backend is not None and (
            config.attention_backend.split("/")[-1] not in ONE_PASS_DECODE_BACKENDS + FA3_SPLIT_BACKENDS):
        notes.append(f"SGLANG_DETSPEC_DECODE_ATTENTION={config.decode_attention} applies to the triton and fa3 "
                     f"backends only; with {config.attention_backend} attention it changes nothing")
    if config.active and (config.tree_chain_batch or config.tree_chain_tokens) and not config.switches_shape:
        kept = "keeps its draft shape" if config.algorithm else "runs no speculative decoding"
        if config.algorithm and "mla" in config.family_traits:
            kept = "drafts a chain (an MLA target's trees are served as the chain of their depth): nothing to bound"
        settings = switch_settings(config.tree_chain_batch, config.tree_chain_tokens)
        verb = "apply" if config.tree_chain_batch and config.tree_chain_tokens else "applies"
        notes.append(f"{settings} {verb} to coupled EAGLE / EAGLE3 / NEXTN "
                     "trees (--speculative-eagle-topk > 1, not multi-layer EAGLE) with a KV page size of 1 and at "
                     f"least steps + 1 draft tokens; this server {kept}")
    tile = moe_tile_note(config)
    if tile:
        notes.append(tile)
    tables = moe_tables_note(config)
    if tables:
        notes.append(tables)
    return notes


# The serving runs of an MoE shape and the runs of the default tile (docs/determinism_tax.md, "The MoE cost shape"),
# for the note below.
MOE_COST_EVIDENCE = ("on a Qwen3-30B-A3B-like shape the coupled chain served 0.79-0.89x SGLang's non-deterministic "
                     "chain with it, 7 points of it the coupling's accept length "
                     "(docs/benchmarks/determinism_tax/2026-12-07-h100-moe-a3b)")
MOE_TILE_EVIDENCE = ("on a Qwen3-30B-A3B-like shape with 128-token prompts the coupled chain served 0.91-0.98x "
                     "SGLang's non-deterministic chain with the default tile "
                     "(docs/benchmarks/determinism_tax/2026-12-07-h100-moe-tile; 0.79-0.89x with SGLang's tile), "
                     "while its MoE calls at 2,048 / 8,192-token prefills take 1.14x / 1.29x SGLang's tile's time; "
                     "the tiny Qwen3-MoE's suite was 0 logprobs apart from no speculative decoding with it on fa3 "
                     "and triton (docs/e2e/2026-12-07-h100-moe-default-tile), as was the tiny DeepSeek-V3's on triton "
                     "(docs/e2e/2026-12-07-h100-mla-packed-default-tile), and every "
                     "tile the probe tried there, SGLang's included, gave the same bits on one H100 "
                     "(docs/benchmarks/moe_tile_probe/2026-12-07-h100)")


def moe_tile_note(config: DetSpecConfig) -> str | None:
    """Which fused-MoE tile serves this server (``sglang_plugin/moe_tile_hook.py``) and what was measured, or None.

    Said for an active run whose target family is known: on a target without
    expert layers only where the user set a tile (it changes nothing there);
    on a quantized MoE target that SGLang's tile serves; on an unquantized MoE
    target, the tile that serves (the default, another set, or SGLang's with
    ``sglang``).
    """
    if not config.active or config.model_family is None:
        return None
    tile = config.moe_tile
    if config.moe_tile_skip:
        serves = "" if config.moe_path_flag else "; SGLang's tile serves"
        return f"SGLANG_DETSPEC_MOE_TILE changes nothing here: {config.moe_tile_skip}{serves}"
    if not config.takes_moe_tile:
        flag = config.moe_path_flag
        if flag:
            return (f"the expert layers run on {flag}, whose kernels read no fused-MoE Triton tile: that path's "
                    "own choice serves (no run of the plugin has used it)")
        if "moe" in config.family_traits:  # quantized weights: the plugin's tile is not for them
            return (f"the expert layers keep SGLang's deterministic fused-MoE tile: the weights are quantized "
                    f"({config.model_family}), whose kernels need K tiles that divide the quantization blocks; the "
                    "plugin's tile serves unquantized MoE targets")
        return None  # the default tile on a target without expert layers: nothing to say
    if tile is None:
        return ("SGLANG_DETSPEC_MOE_TILE=sglang: the expert layers run SGLang's deterministic fused-MoE tile (64 x 64 "
                f"x 32 at every batch size): {MOE_COST_EVIDENCE}; unset, the plugin's default tile serves: "
                f"{MOE_TILE_EVIDENCE}")
    which = ("the plugin's default; SGLANG_DETSPEC_MOE_TILE=sglang keeps SGLang's deterministic tile"
             if tile == DEFAULT_MOE_TILE else "SGLANG_DETSPEC_MOE_TILE; this tile has run on no server, and what "
             f"follows is the default tile's, {','.join(map(str, DEFAULT_MOE_TILE))}")
    tables = ("" if config.moe_tables == "checked" else "; SGLANG_DETSPEC_MOE_TABLES=checked lets SGLang's tuned "
              "tables, faster at prefill sizes, serve where a start-up check finds them giving this tile's bits")
    return (f"the expert layers run the fused-MoE tile {','.join(map(str, tile))} ({', '.join(MOE_TILE_FIELDS)}) at "
            f"every batch size on SGLang's Triton MoE runner ({which}; another --moe-runner-backend reads no tile): "
            f"{MOE_TILE_EVIDENCE}; elsewhere a tile may change the logits' bits (so "
            "possibly a token) against another tile: a server this one is compared with must run the same tile "
            f"(the plugin's servers run the default unless told otherwise){tables}")


def moe_tables_note(config: DetSpecConfig) -> str | None:
    """What ``SGLANG_DETSPEC_MOE_TABLES=checked`` does on this server (``sglang_plugin/moe_tables.py``), or None
    where it is ``off``, the run is not the plugin's or the family is unknown."""
    if not config.active or config.model_family is None or config.moe_tables == "off":
        return None
    if config.moe_tables_skip:
        return f"SGLANG_DETSPEC_MOE_TABLES=checked changes nothing here: {config.moe_tables_skip}"
    tile = (f"the tile {','.join(map(str, config.moe_tile))}" if config.moe_tile is not None
            else "SGLang's deterministic tile")
    return ("SGLANG_DETSPEC_MOE_TABLES=checked: at start-up SGLang's tuned fused-MoE tables are checked on this "
            f"GPU, per expert shape, against {tile}: at the batch sizes where their config changes (both ends of "
            "each run of one config and sizes inside it), up to the largest forward, the same tokens through both "
            "must give the same bytes; a shape whose tables pass "
            f"runs them (their rows then are {tile}'s, so the tokens and logprobs are a server's with that tile), "
            "the others the tile, each shape's verdict logged. On one H100 at a Qwen3-30B-A3B-like shape the "
            "plugin's default tile took 1.7x / 2.8x the tables' time at 2,048 / 8,192-token calls and gave their "
            "bits (docs/benchmarks/moe_tile_probe/2026-12-07-h100); there the check passed the tables at 67 sizes, "
            "and servers of a shape with no tuned file ran the tile, 0 logprobs apart "
            "(docs/e2e/2026-12-07-h100-moe-tables); no server has run at a shape whose tables pass")


# What the FA3 tree defaults were measured against (docs/determinism_tax.md, "The token bound on one H100" and
# "The FA3 tree default on servers"), written once for the note below.
FA3_TREE_DEFAULTS_EVIDENCE = (
    "on the 8B shape (head size 128, one H100) it served 1.13 / 1.07 / 0.96 of SGLang's non-deterministic EAGLE "
    "chain at 1 / 8 / 32 short requests (above the coupled chain at 1 and 8, level with it at 32, where it drafts "
    "the chain), 0.99 at 4 requests of 2048-token prompts (above the plain tree and the coupled chain), 0.97-0.98 "
    "at 8 (level with both within the rounds' spread: it drafts the chain there) and 0.91 at 128 short requests "
    "(another H100; without the token bound 0.93 there, 1% below the coupled chain); SGLang's harness passed on a "
    "server taking them unnamed (p_vs_d 10 of 10)")


# Rejection mode's tokens follow its draft, so the logits claim cannot speak for them (README, "Two verify modes").
REJECTION_MODE_NOTE = (
    f"verify='rejection' ({VERIFY_ENV}=rejection, or auto with --speculative-use-rejection-sampling): SGLang's "
    "rejection sampling picks the tokens, so they depend on the draft model and shape and are not those of the "
    "server without speculative decoding (the logits claim speaks of the target's logits at the positions "
    "decoded), and a request SGLang retracts can change its output; drop --speculative-use-rejection-sampling "
    f"(or set {VERIFY_ENV}=coupled) for coupled verify, whose tokens are the target's own seeded draws")


# How the note on the defaults a server took begins (E2E files look for it in a server's log).
DEFAULTS_TAKEN_LOG = "FA3 tree defaults (head size"


def fa3_tree_defaults_note(config: DetSpecConfig) -> str | None:
    """The note on ``config.FA3_TREE_DEFAULTS`` for an FA3 tree that could take them, or None.

    Where the server took some: which (those the environment left unset),
    what they make and what was measured of them. Where an FA3 tree that
    can switch its draft shape does not take them: why (the head size, the
    KV layout or the target's family), so a user knows which tree runs.
    """
    if not (config.active and config.attention_backend == "fa3" and config.can_switch_shape) or \
            len(config.set_tree_settings) == len(FA3_TREE_DEFAULTS):  # all four set: no default to speak of
        return None
    if not config.takes_fa3_tree_defaults:
        return (f"FA3 tree defaults not taken ({fa3_tree_defaults_miss(config)}): the tree settings not set in the "
                "environment keep their plain defaults")
    taken = config.fa3_defaults_taken
    if not taken:
        return None
    names = " ".join(f"{TREE_SETTING_ENVS[f]}={getattr(config, f)}" for f in taken)
    plain = " ".join(f"{TREE_SETTING_ENVS[f]}={v}" for f, v in PLAIN_TREE_DEFAULTS.items())
    return (f"{DEFAULTS_TAKEN_LOG} {config.head_dim}, in {FA3_UNMASKED_DECODE_MAX_HEAD_DIM + 1}-"
            f"{FA3_CAUSAL_KEPT_MAX_HEAD_DIM}) taken for the tree settings not set in the environment: {names}; with "
            f"all four this is the tree verified per node on SGLang's FA3 calls, drafting a chain above "
            f"{FA3_TREE_DEFAULTS['tree_chain_batch']} requests or {FA3_TREE_DEFAULTS['tree_chain_tokens']:,} summed "
            f"tokens; {FA3_TREE_DEFAULTS_EVIDENCE}; {plain} gives the plain tree")


def fa3_tree_defaults_miss(config: DetSpecConfig) -> str:
    """Why an FA3 tree that can switch its draft shape does not take ``config.FA3_TREE_DEFAULTS`` (one clause)."""
    if "mla" in config.family_traits:
        return "an MLA target, whose attention the node path does not serve"
    if config.parallel_reason:
        return f"{config.parallel_reason}: its bounds could not act, leaving the node path at every batch size"
    if config.head_dim is None:
        return ("the target's head size was not read from its config.json here; a server that reads a head size of "
                f"{FA3_UNMASKED_DECODE_MAX_HEAD_DIM + 1}-{FA3_CAUSAL_KEPT_MAX_HEAD_DIM} takes them")
    if fa3_head_size_reason(config.head_dim) is not None:
        return (f"head size {config.head_dim} is outside {FA3_UNMASKED_DECODE_MAX_HEAD_DIM + 1}-"
                f"{FA3_CAUSAL_KEPT_MAX_HEAD_DIM}, where SGLang's FA3 decode call, and so the node path, is not bitwise")
    if config.kv_layout_problem:
        return f"{config.kv_layout_problem}: the node path reads KV pages of one token in SGLang's default KV dtype"
    return f"a {config.model_family} target, which no run has measured"


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
    ``DETERMINISTIC_ATTENTION_BACKEND_CHOICES`` (``resolve.sglang_refusals``) but
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
    # The figures below are a dense target's; an MLA target's attention has its own note, promoted or not.
    dense = (family_note(config.model_family, backend, config.moe_runner, config.moe_a2a) is None
             and "mla" not in config.family_traits)
    if config.switches_shape:
        notes.append(chain_note(config))
    elif config.can_switch_shape and dense and "tree_chain_batch" not in config.set_tree_settings:
        # A bound the user set to 0 needs no pointer to it. With no backend named, SGLang's fa3 pick would take
        # the FA3 tree defaults (another note): this note then speaks of the other picks only.
        other = backend is None and dataclasses.replace(config, attention_backend="fa3").takes_fa3_tree_defaults
        notes.append(("where SGLang picks a backend other than fa3 (its fa3 pick takes the FA3 tree defaults): "
                      if other else "") + tree_load_note(config))
    if not dense:
        # The family's own notes give the claim; the split notes below speak of a dense target's.
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
    if config.multi_layer_eagle and config.verifies_trees:
        notes.append("multi-layer EAGLE drafting a tree (--speculative-eagle-topk above 1): not measured (every "
                     "multi-layer EAGLE server measured drafts a chain): the logits claim is the tree rule's, "
                     "not a measured figure")
    return notes


def family_attention_note(config: DetSpecConfig) -> str | None:
    """:func:`unmeasured_notes`' sentence on the attention of an MLA target or one of an unmeasured family, or None.

    MLA: on triton the one-pass decode serves it (unless turned off), with no backend named both of SGLang's picks
    are named; elsewhere SGLang's calls. MoE or quantized
    weights with standard attention: which attention path serves it where the
    split would serve a dense target's (the split, or SGLang's own FA3 calls
    where the split stands down); None where no path of the plugin's serves
    (another backend, the split turned off or past a limit, no backend named).
    """
    if "mla" in config.family_traits:
        one_pass = config.decode_attention in ("split", "one_pass")
        as_one_pass = (", so the setting decode_attention='split' above runs as 'one_pass'"
                       if config.decode_attention == "split" and "decode_attention" in config.shown_fields() else "")
        if config.algorithm:
            # A speculative server's target verifies, never decodes: the decode kernel's cost is not this server's.
            decode = ("the target verifies, never decodes, so prefill, extend and verify all run the single-pass "
                      "kernel SGLang's deterministic mode runs for absorbed MLA (the positional split takes no MLA "
                      f"shape{as_one_pass})")
        else:
            decode = ("the target's decode runs the single-pass kernel SGLang's deterministic prefill and extend "
                      f"run for absorbed MLA (the positional split takes no MLA shape{as_one_pass}; "
                      "SGLANG_DETSPEC_DECODE_ATTENTION=sglang keeps SGLang's split-KV decode; with the query heads "
                      f"in SGLang's tile, where a start-up check lets them, it cost {MLA_DECODE_COST['packed']}, with "
                      f"one row per head {MLA_DECODE_COST['one_row']})")
        # Decode context parallelism keeps SGLang's decode: said only where the target decodes.
        dcp = "" if config.algorithm else " (not under decode context parallelism, which keeps SGLang's decode)"
        if config.attention_backend == "triton" and one_pass:
            return f"MLA attention on triton: {decode}{dcp}, so the split's notes do not apply"
        if config.attention_backend is None and one_pass:
            return ("MLA attention: on fa3 (SGLang's pick on Hopper) SGLang's own attention calls run; on triton "
                    f"(its pick for DeepSeek-family targets on Blackwell), {decode}{dcp}; so the split's notes do "
                    "not apply")
        sglang_decode = (" (with SGLANG_DETSPEC_DECODE_ATTENTION=sglang its split-KV decode kernel)"
                         if config.attention_backend == "triton" else "")
        return ("MLA attention: the plugin's attention paths do not serve it here: SGLang's own attention calls "
                f"run{sglang_decode}, so the split's notes do not apply")
    path = FAMILY_PATHS.get(split_path(config)) if config.decode_attention == "split" else None
    if path is None:
        return None
    why = (f"while {config.moe_path_flag} serves its expert layers (above)" if config.moe_path_flag
           else "until a run measures the family (above)")
    return (f"{path} this target's attention as a dense target's where the start-up check passes; the claim "
            f"stays 'tokens' {why}")


# What serves a target's attention under the split (split_path), as family_attention_note words it; a path
# missing here (the one-pass decode past a split limit) is no path the family note speaks of.
FAMILY_PATHS = {"triton_split": "the positional-split Triton kernels serve",
                "fa3_own_calls": ("SGLang's own FA3 calls serve (the split stands down: no trees, head size in "
                                  f"{FA3_UNMASKED_DECODE_MAX_HEAD_DIM + 1}-{FA3_CAUSAL_KEPT_MAX_HEAD_DIM})"),
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
                     "docs/e2e/2026-12-05-h200-default/); without speculative decoding on the 8B shape they served "
                     "at 0.97-1.13x the inter-token latency of SGLang's own deterministic Triton path (one H100, "
                     "docs/benchmarks/attention_cost/2026-12-06-h100-triton-split/; with speculative decoding "
                     "not measured); a "
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
        origin = "as set" if config.setting_origin("decode_attention") == "set" else "the default"
        notes.append(f"SGLANG_DETSPEC_DECODE_ATTENTION=split on fa3 ({origin}; sglang or one_pass turn it off): "
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


def split_flag_limit(config: DetSpecConfig) -> str | None:
    """A limit of the positional split that the flags already show this server passes, or None.

    Page size, a KV cache dtype other than auto, head size (both splits take
    up to 256) and, on fa3, the tree's draft tokens: past one the claim's reason says
    what serves instead, so no note describes the split. Limits only the
    built backend shows (head counts, windows) are the start-up check's.
    """
    kv = config.kv_layout_problem
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
    "trees of the FA3 forward-mode matrix: tiny models, head size 64, one H200; SGLang's harness, p_vs_d 10 of "
    "10, greedy with no draft accepted, on a tree switching to a chain at head size 128, one H100); against "
    "SGLang's cascade verify "
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
            "decode batches above B without changing a token (at B = 16 on fa3, head sizes 65-128, with "
            "SGLANG_DETSPEC_TREE_ATTENTION=nodes SGLANG_DETSPEC_DECODE_ATTENTION=sglang and a summed-token bound "
            "of 12,288 it served 1.13 / 1.07 / 0.96 of SGLang's EAGLE chain at 1 / 8 / 32 requests, one H100, "
            "62a91f2, and without the token bound 0.93 at 128, another H100, c052342; alone, on the split, 0.85 "
            "at 32, one H200, 18240f4)")


# What the 2048-token serving runs found for the node-path tree against the chain (docs/determinism_tax.md,
# "2048-token prompts on one H100 at 9f64626"): the figure behind the token bound, written once.
LONG_PROMPT_NOTE = ("at 2048-token prompts the tree on the node path served 1.04-1.07 of SGLang's EAGLE chain with "
                    "1 request (about 2,100 summed tokens) and 0.95-0.96 with 8 (about 17,000), against the coupled "
                    "chain's 0.93 / 0.98 (one H100, 9f64626)")


# The words of mla_chain_note the suites look for in a server's log.
MLA_CHAIN_LOG = "is served as the chain of its depth"


def mla_chain_note(config: DetSpecConfig) -> str:
    """What start-up does to an MLA target's tree (``config.mla_tree_as_chain``, ``config`` the bag as typed): the
    one sentence the server logs and the dry run prints.

    Raises:
        ValueError: ``config`` is not such a tree (nothing to say).
    """
    if not config.mla_tree_as_chain:
        raise ValueError("config must be an MLA target's tree served as a chain (mla_tree_as_chain)")
    chain = config.as_chain()
    typed = f"top-k {config.eagle_topk}" + (f", {config.num_draft_tokens} draft tokens" if config.num_draft_tokens else "")
    return (f"an MLA target's tree ({typed}) "
            f"{MLA_CHAIN_LOG} (--speculative-eagle-topk 1 --speculative-num-draft-tokens "
            f"{chain.num_draft_tokens}, {chain.num_steps} steps): its tree verify would run SGLang's own MLA tree "
            f"attention, which is not its decode's computation ({MLA_TREE_EVIDENCE}); coupled verify makes the "
            "tokens independent of the draft shape, so they are the tree's; accept lengths are the chain's (2.98 "
            "tokens per verify against the tree's 3.58 there), with no tree KV reserve or tree CUDA graphs")


def chain_note(config: DetSpecConfig) -> str:
    """:func:`unmeasured_notes`' sentence for a switching tree (``config.switches_shape``): what each bound set
    does, and what was measured of each."""
    which, evidence = [], []
    if config.chain_at_batch:
        which.append(f"of more than {config.chain_at_batch} requests")
        evidence.append(
            "the batch bound: tokens equal to no speculative decoding while switching both ways, the chain verifying "
            "under CUDA graphs (the tiny-model runs of 2026-12-04 and 2026-12-06); served at a bound of 16 on fa3 "
            "(8B shape, 128-token prompts, output tokens/s against SGLang's non-deterministic EAGLE chain, "
            "docs/determinism_tax.md): 0.92 / 0.85 at 8 / 32 requests with the split (one H200, 18240f4); on "
            "SGLang's FA3 calls with trees verified per node (SGLANG_DETSPEC_TREE_ATTENTION=nodes "
            "SGLANG_DETSPEC_DECODE_ATTENTION=sglang) 1.13 / 1.07 / 0.96 at 1 / 8 / 32 requests with a "
            "summed-token bound of 12,288 beside it (one H100, 62a91f2), against the coupled chain's 0.99 / 0.97 / "
            "0.95 in the same rounds, 0.91 at 128 with it (another H100, a516b19) and 0.93 at 128 without it "
            "(another H100, c052342; the chain 0.95); other "
            f"bounds and backends are not measured; {LONG_PROMPT_NOTE}"
            + ("" if config.chain_at_tokens else ", which SGLANG_DETSPEC_TREE_CHAIN_TOKENS addresses"))
    if config.chain_at_tokens:
        which.append(f"whose summed sequence length is above {config.chain_at_tokens} tokens")
        evidence.append(
            "the token bound, meant for trees on the node path (SGLANG_DETSPEC_TREE_ATTENTION=nodes), whose verify "
            "reads each node's whole context: tokens equal to no speculative decoding while switching both ways on "
            "100 tokens (the tiny-model run of 2026-12-06, Triton); at 12,288 beside a batch bound of 16 on the "
            "node path it served 0.99 of SGLang's non-deterministic EAGLE chain at 4 requests of 2048-token "
            "prompts (the tree) and 0.97-0.98 at 8 (the chain), against the coupled chain's 0.95 / 0.98 and the "
            "plain tree's 0.96 / 0.98 (one H100, adc7ae7); other bounds and backends are not measured"
            + ("" if config.chain_at_batch else f"; {LONG_PROMPT_NOTE}"))
    return (f"{switch_settings(config.chain_at_batch, config.chain_at_tokens)}: decode batches "
            f"{' or '.join(which)} draft a chain of {config.num_steps} steps instead of the tree; coupled verify "
            f"makes the tokens independent of the draft shape; {'; '.join(evidence)}")


def sampled_drafts_unavailable_note(blockers: list[str]) -> str:
    """The start-up note for a coupled chain whose sampled-draft path SGLang refuses (``blockers``, one reason each)."""
    return (f"SGLang's sampled-draft path is not available for this chain ({'; '.join(blockers)}); the plugin's "
            "draft-worker hooks draw its coupled drafts instead (on CUDA; multi-layer EAGLE chains keep argmax "
            "drafts: the same tokens, fewer accepted)")


def announce(config: DetSpecConfig) -> None:
    """The start-up log line: whether sglang-detspec is active, and the bag (the fields that apply).

    Then one line per :func:`setting_notes` and per :func:`unmeasured_notes`.
    """
    state = "active" if config.active else "inactive (SGLang's own sampling runs)"
    logger.warning("sglang-detspec %s: %s", state, config.describe())
    for note in setting_notes(config) + unmeasured_notes(config):
        logger.warning("sglang-detspec: %s", note)
