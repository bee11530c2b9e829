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

from ..config import (COUPLED_ALGORITHMS, DetSpecConfig, Refusal, current_config, env_settings, install_config,
                      resolve_verify, with_server_defaults)
from ..model_family import config_file, head_dim_of, model_family
from .shape_rules import attention_dp, parallel_reason
from .startup_notes import announce

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


def moe_runner_of(spec, name: str = "moe_runner_backend") -> str | None:
    """SGLang's ``--moe-runner-backend`` (or the flag ``name`` names, ``moe_a2a_backend``) on ``spec`` as a
    lower-case name (an enum's value), None where absent."""
    runner = getattr(spec, name, None)
    runner = getattr(runner, "value", runner)
    return str(runner).lower() if runner else None


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

    The four tree settings the environment leaves unset take the server's
    defaults (``config.with_server_defaults``: the FA3 tree defaults on an FA3
    tree at head sizes 65-128).

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
    values["moe_runner"] = moe_runner_of(spec)
    values["moe_a2a"] = moe_runner_of(spec, "moe_a2a_backend")
    values["model_family"] = model_family(getattr(spec, "model_path", None), getattr(spec, "quantization", None))
    values["head_dim"] = head_dim_of(getattr(spec, "model_path", None))
    # The runtime context's "spec" namespace has no parallel fields: its caller reads the record.
    values["parallel_reason"] = parallel_reason(spec) if hasattr(spec, "attn_dp_size") else None
    algo = values["algorithm"]
    values["algorithm"] = None if algo is None or str(algo).upper() == "NONE" else str(algo).upper()
    values["eagle_topk"] = resolved_eagle_topk(spec, values["algorithm"], values["eagle_topk"])
    values["adaptive_steps"] = adaptive_steps(spec) if values["algorithm"] else ()
    settings = env_settings(environ)
    settings["verify"] = "coupled" if sampled_drafts else resolve_verify(settings["verify"], values["rejection_sampling"])
    bag = with_server_defaults(DetSpecConfig(**settings, deterministic=bool(deterministic), source=source, **values))
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
    algorithm (NEXTN counted as EAGLE), top-k, multi-layer EAGLE, attention
    data parallelism, two-batch overlap and PD multiplexing apply here too.

    Raises:
        ValueError: SGLang's, for a malformed adaptive config file.
    """
    if not getattr(spec, "speculative_adaptive", False):
        return ()
    # Flags as typed (the dry run's raw record) have not met _maybe_disable_adaptive yet: its
    # rules on what this bag reads (SGLang 0.5.23's adaptive_unsupported_reason).
    algorithm = str(getattr(spec, "speculative_algorithm", None) or "").upper()
    # NEXTN as typed: SGLang renames it EAGLE before it decides on adaptive speculation.
    if (algorithm not in ("EAGLE", "EAGLE3", "NEXTN") or getattr(spec, "speculative_eagle_topk", None) not in (None, 1)
            or getattr(spec, "enable_multi_layer_eagle", False) or attention_dp(spec)
            or getattr(spec, "enable_two_batch_overlap", False) or getattr(spec, "enable_pdmux", False)):
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
    # The tree settings' defaults read the backend and the head size filled in here (with_server_defaults).
    return with_server_defaults(dataclasses.replace(bag, rl_on_policy=bool(getattr(det, "rl_on_policy_target", None)),
                               attention_backend=attention_backend_of(exec_bag.kernel),
                               page_size=getattr(view, "page_size", None),
                               kv_cache_dtype=getattr(view, "kv_cache_dtype", None),
                               moe_runner=moe_runner_of(view),
                               moe_a2a=moe_runner_of(view, "moe_a2a_backend"),
                               model_family=model_family(getattr(view, "model_path", None),
                                                         getattr(view, "quantization", None)),
                               head_dim=head_dim_of(getattr(view, "model_path", None)),
                               parallel_reason=parallel_reason(view) if view is not None else None,
                               tokenizer_workers=int(getattr(serving, "tokenizer_worker_num", 1) or 1)))


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


def sglang_resolution(launch: argparse.Namespace):
    """SGLang's own verdict on ``launch_server`` flags, from its real argument resolution run in this process.

    Runs ``ServerArgs.resolve_once`` on the flags, the resolution
    ``launch_server`` runs before it loads any weight (it reads the model's
    ``config.json``): e.g. SGLang 0.5.23 accepts only ascend, fa3, fa4 and
    triton attention for a DeepSeek-family (absorbed-MLA) target under
    deterministic inference, which the backend list of
    :func:`sglang_refusals` does not show. Flags without a device are
    resolved as on ``cuda`` (the machine that runs the server has a GPU;
    this one may not). Rules that read the GPU (e.g. fa4 for such a target
    needs SM100 / SM110) are decided on this machine's platform, so a caller
    on another machine reports the result as SGLang's verdict here. The
    environment variables SGLang's resolution sets and its log level are
    restored afterwards; the plugin's hooks run only where the caller loaded
    them.

    Args:
        launch: SGLang's parsed ``launch_server`` arguments (a ``--config``
            file merged in: ``cli.serve.read_launch_args``); ``--model-path``
            and a ``--speculative-draft-model-path`` naming local folders (hub
            ids are not fetched).

    Returns:
        ``(message, None)`` when its resolution raises ``ValueError`` (its
        refusals); ``(None, record)`` with the resolved ``ServerArgs`` when
        it accepts the flags (e.g. the draft shape SGLang picks for the model).

    Raises:
        LookupError: a model or draft path that is not a local folder.
        Exception: anything else SGLang's resolution raises (not a refusal).
    """
    import copy
    import os

    from sglang.srt.server_args import ServerArgs

    ns = copy.copy(launch)
    if getattr(ns, "device", None) is None:
        ns.device = "cuda"
    for flag, path in (("--model-path", ns.model_path),
                       ("--speculative-draft-model-path", getattr(ns, "speculative_draft_model_path", None))):
        if (path is not None or flag == "--model-path") and not (path and os.path.isdir(path)):
            raise LookupError(f"{flag} {path} is not a local folder")
    record = ServerArgs.from_cli_args(ns)
    environ, sglang_log = dict(os.environ), logging.getLogger("sglang")
    level = sglang_log.level
    sglang_log.setLevel(logging.ERROR)  # its resolution's notes belong in the server's log, not the dry run's
    try:
        record.resolve_once()
    except ValueError as exc:
        return str(exc), None
    finally:
        sglang_log.setLevel(level)
        os.environ.clear()
        os.environ.update(environ)
    return None, record


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


def sampled_draft_blockers(server_args) -> list[str]:
    """Why SGLang's sampled-draft path cannot be turned on for this coupled chain: one reason each.

    SGLang refuses its rejection-sampling flag (which opens that path) with a
    reduced draft vocabulary, watermarking, accept thresholds and devices
    other than CUDA; these checks run before the plugin's, so they are
    mirrored here (:func:`flag_blockers` on SGLang's resolved view of ``server_args``).
    """
    from sglang.srt.arg_groups.overrides import resolved_view

    return flag_blockers(resolved_view(server_args))


def flag_blockers(view) -> list[str]:
    """The reasons of :func:`sampled_draft_blockers` read from ``view``, any object with SGLang's argument names.

    ``view`` is SGLang's resolved view at start-up, or the parsed
    ``launch_server`` flags where ``detspec serve --dry-run`` could not run
    SGLang's resolution. An EAGLE3 draft whose ``config.json`` cannot be read
    locally (e.g. a hub repository id) counts as reduced: most EAGLE3
    checkpoints draft over a hot-token vocabulary.
    """
    reasons = []
    if reduced_draft_vocab(view) is not False:
        reasons.append("the draft proposes over a reduced vocabulary (--speculative-token-map, or "
                       "draft_vocab_size in its config.json), or it is an EAGLE3 draft whose config.json is "
                       "not a local file")
    if getattr(view, "enable_watermark", False):
        reasons.append("--enable-watermark")
    if (getattr(view, "speculative_accept_threshold_single", 1.0) != 1.0
            or getattr(view, "speculative_accept_threshold_acc", 1.0) != 1.0):
        reasons.append("--speculative-accept-threshold-single / -acc")
    if not str(getattr(view, "device", "cuda") or "cuda").startswith("cuda"):
        reasons.append(f"--device {view.device}")
    return reasons
