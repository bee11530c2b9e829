"""SGLang plugin: wires the seeded streams into SGLang 0.5.23's sampling and speculative runtime.

Entry point ``detspec`` in SGLang's general plugin group ``sglang.srt.plugins``
(``register`` below). SGLang calls it in every process that loads plugins —
the launcher, each scheduler process (which hosts the TP and speculative
workers), the detokenizer — and then applies the registered hooks. Hooks are
registered unconditionally (server arguments are not resolved yet when
plugins load) and decide per call from the config bag, all by one test,
:attr:`DetSpecConfig.active <sglang_detspec.config.DetSpecConfig.active>`:
while it holds our streams and rules run; otherwise SGLang's original code
runs untouched.

Hooks (each module's docstring names the SGLang symbols it hooks and why;
docs/plugin.md's hook table is generated from :func:`hook_table`, ``make docs-hooks``):

- ``startup``: ``handle_speculative_decoding`` (BEFORE and AFTER): refuses
  what cannot be made deterministic, serves an MLA target's tree as the chain
  of its depth, turns SGLang's sampled-draft path on for coupled chains,
  installs and logs the bag (in the launcher).
- ``resolve``: ``runtime_context.publish`` (AFTER): installs and logs the
  bag of the published context at the entry of every process (scheduler
  processes get theirs there, before any hooked site reads it).
- ``target_sampler_hook``: the sampler's simple and top-k/top-p/min-p paths:
  every sampled token on the TARGET stream.
- ``probs_hook``: the verify's softmax, top-k / top-p renorm and coins: not
  computed in a coupled verify (unread); renorm reproducible in rejection mode.
- ``verify_hook``: ``eagle_sample`` and its two samplers: coupled verify
  (chain and tree) or seeded rejection sampling (chain).
- ``draft_hook``: ``fast_sample`` and the multi-layer draft-extend sites:
  draft proposals on the DRAFT stream, or on the TARGET stream at the exact
  drafted position for coupled chain drafts.
- ``topk_draft_hook``: coupled drafts SGLang's EAGLE v2 draft worker picks by
  top-k: tree children are q's Gumbel-top-k on the TARGET stream, and chains
  without SGLang's sampled-draft path draft the race winner (also over a
  reduced draft vocabulary, through its id map), eager and in the draft CUDA
  graphs; SGLang's ``fast_topk`` of the children gets the race's own ranking.
- ``request_validation``: the one table of request rules (``request_rules``:
  token ids inside the vocabulary, ``n``, a batch's per-request lists,
  ``sampling_seed`` in [0, 2**64), logprob fields, ``top_k``,
  ``min_new_tokens``, stop ids, logit bias, grammars) at SGLang's own check
  points (``_validate_one_request``, ``_handle_parallel_sampling``,
  ``SamplingParams.verify``, the ``/generate`` schema gate), before a request
  reaches the scheduler.
- ``request_seeds``: request seeds: a fresh seed for an unseeded sampled
  request, one derived seed per parallel sample, the seed in every response.
- ``attention_hook``: the target's Triton decode, prefill and verify run the
  plugin's positional-split kernels (the default; with ``one_pass`` the
  decode runs the kernel its verify and prefill run), so their logits are
  bitwise equal.
- ``tree_attention_hook``: with ``SGLANG_DETSPEC_TREE_ATTENTION=nodes``, FA3
  tree verify runs one decode query per tree node, so tree verify logits
  equal decode logits bit for bit.
- ``fa3_split_hook``: with ``SGLANG_DETSPEC_DECODE_ATTENTION=split`` on FA3,
  every forward mode of the target computes each row as two FA3 calls over
  key ranges chosen from the row's own length, merged in one order, so
  decode, prefill and chain and tree verify agree bit for bit (measured on
  the H200: ``docs/e2e/2026-12-05-h200-split/``).
- ``norm_hook``: SGLang's RMSNorm with the residual add runs one fused
  batch-invariant kernel per norm (the plain form keeps SGLang's
  ``rms_norm_batch_invariant``).
- ``kv_rows_hook``: ``get_req_to_token_extra_context_len`` (AFTER): a
  request's KV row holds the slots a tree's decode step reserves, so a
  request that decodes up to the context length cannot write past its row.
- ``shape_hook``: ``EAGLEWorkerV2.init_cuda_graphs`` (AFTER),
  ``forward_batch_generation`` and ``EagleDraftWorker.draft`` (AROUND): with
  ``SGLANG_DETSPEC_TREE_CHAIN_BATCH`` / ``_TOKENS`` a coupled tree drafts as a
  chain of its depth for large or long decode batches (one runtime state per
  draft shape).
- ``warmup_hook``: ``Scheduler.init_all_cuda_graphs`` (BEFORE): the plugin's
  Triton kernels that run outside CUDA graphs are compiled at start-up,
  not inside the first requests.
- ``gemm_warmup_hook``: ``Scheduler.init_all_cuda_graphs`` (BEFORE): under
  deterministic inference, DeepGEMM's kernels for SGLang's batch-invariant
  matmul are compiled for every row count a batch can have, at start-up.
- ``moe_tile_hook``: ``Scheduler.init_all_cuda_graphs`` (BEFORE): an
  unquantized mixture-of-experts target's fused-MoE Triton kernel runs one
  tile at every batch size (``SGLANG_DETSPEC_MOE_TILE``, by default
  ``config.DEFAULT_MOE_TILE``) instead of SGLang's deterministic tile (rows
  stay batch-invariant; the cost differs); with
  ``SGLANG_DETSPEC_MOE_TABLES=checked`` SGLang's tuned per-batch-size tables
  serve the expert shapes whose rows a start-up check finds bit for bit the
  tile's (``moe_tables``).

:func:`hook_table` is the one list of every change the plugin makes to
SGLang: the registry's hooks (BEFORE, AFTER, AROUND) and the changes those
hooks make themselves (an instance method swapped, a method patched for one
call, a field added to a response model, an attribute kept on an SGLang
object). Registration, the start-up check that every required hook is in
place (:func:`hook_problems`), the tests and ``docs/plugin.md`` all follow it.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import threading
from collections.abc import Callable
from typing import NamedTuple

from ..config import current_config
from . import (
    attention_hook, channels, draft_hook, fa3_split_hook, gemm_warmup_hook, kv_rows_hook, moe_tile_hook,
    norm_hook, probs_hook, request_seeds,
    request_validation, resolve, shape_hook, startup, target_sampler_hook, topk_draft_hook, tree_attention_hook,
    verify_hook, warmup_hook,
)
from .fa3_split import FA_MODULE

ENTRY_POINT_NAME = "detspec"
ENTRY_POINT_GROUP = "sglang.srt.plugins"

_KERNEL_ONLY = "None in SGLang builds without the CUDA kernel (CPU-only): nothing to hook there"
_CUDA_ONLY = ("not importable in SGLang builds without CUDA (it loads sgl_kernel's CUDA library): no FA3 "
              "backend to hook there")
_SPEED_ONLY = "speed only: without it a coupled verify also computes SGLang's target probabilities or coins, unread"
_WARMUP_ONLY = "speed only: without it the plugin's eager kernels compile inside the first requests"
_GEMM_WARMUP_ONLY = "speed only: without it DeepGEMM compiles matmul kernels inside the first requests"
_MOE_TILE_ONLY = ("speed only: without it SGLang's deterministic fused-MoE tile serves (the moe and mla+moe "
                  "families' claims are measured with both)")

_registered = False
_lock = threading.Lock()


# Kinds SGLang's HookRegistry applies; the other kinds are changes a registered hook makes itself.
REGISTRY_KINDS = ("BEFORE", "AFTER", "AROUND")
KINDS = {
    "BEFORE": "registry hook, runs before the symbol",
    "AFTER": "registry hook, runs after the symbol",
    "AROUND": "registry hook, runs instead of the symbol and calls it",
    "SWAP": "instance attribute replaced (for the instance's life) by the function named",
    "PATCH": "method or attribute of one SGLang object replaced for one call, restored after it",
    "FIELD": "field added to an SGLang pydantic model, once, by the function named",
    "ATTR": "attribute the plugin keeps on an SGLang object, set by the function named",
}


class Hook(NamedTuple):
    """One row of the hook table.

    Attributes:
        target: dotted path of the SGLang symbol (for SWAP, PATCH, FIELD and
            ATTR rows: the class, then the attribute changed on its instances).
        hook: our function: the registry hook (SGLang's ``HookRegistry``
            calling convention for ``kind``), or the function that makes the change.
        kind: one of :data:`KINDS`; only :data:`REGISTRY_KINDS` are registered.
        absent_ok: why the target may be missing, or None: it must be hooked
            for the plugin's promise to hold, and start-up stops without it
            (registry rows; the other rows follow the registry row whose hook makes them).
    """

    target: str
    hook: Callable
    kind: str
    absent_ok: str | None = None


def hook_table() -> list[Hook]:
    """Every change the plugin makes to SGLang, in registration order (non-registry rows after their hook)."""
    tah, tdh, sh, rv, fsh = tree_attention_hook, topk_draft_hook, request_seeds, request_validation, fa3_split_hook
    return [
        Hook(startup.TARGET, startup.check_raw_flags, "BEFORE"),
        Hook(startup.TARGET, startup.resolve_and_announce, "AFTER"),
        Hook(startup.TARGET, check_hooks_in_place, "AFTER"),
        Hook(resolve.PUBLISH, resolve.install_published_bag, "AFTER"),
        Hook(draft_hook.TARGET, draft_hook.seeded_fast_sample, "AROUND"),
        Hook(draft_hook.ML_PREFILL, draft_hook.ml_prefill_positions, "AROUND"),
        Hook(draft_hook.ML_DECODE, draft_hook.ml_decode_positions, "AROUND"),
        Hook(draft_hook.ML_GRAPH_SAMPLE, draft_hook.ml_graph_sample_positions, "AROUND"),
        Hook(tdh.DRAFT_FORWARD, tdh.draft_forward_site, "AROUND"),
        Hook(tdh.EXTEND_PREFILL, tdh.extend_prefill_site, "AROUND"),
        Hook(tdh.EXTEND_DECODE, tdh.extend_decode_site, "AROUND"),
        Hook(tdh.DRAFT_RUNNER_FORWARD, tdh._kept_draft_logits, "PATCH"),
        Hook(tdh.DRAFT_EXTEND_GRAPH_EXECUTE, tdh._kept_draft_logits, "PATCH"),
        Hook(tdh.RENORM, tdh.coupled_renorm_draft_probs, "AROUND"),
        Hook(tdh.SITE_FAST_TOPK, tdh._ranked_within, "PATCH"),
        Hook(tdh.TOPK1, tdh.coupled_chain_step, "AROUND"),
        Hook(tdh.GRAPH_CAPTURE, tdh.graph_seed_buffer, "AROUND"),
        Hook(tdh.GRAPH_SEED_BUFFER, tdh.graph_seed_buffer, "ATTR"),
        Hook(tdh.GRAPH_EXECUTE, tdh.graph_refill, "AROUND"),
        Hook(verify_hook.EAGLE_SAMPLE, verify_hook.seeded_eagle_sample, "AROUND"),
        Hook(verify_hook.CHAIN_SAMPLER, verify_hook.seeded_chain_sampling, "AROUND"),
        Hook(verify_hook.TREE_SAMPLER, verify_hook.coupled_tree_sampling, "AROUND", _KERNEL_ONLY),
        Hook(target_sampler_hook.SIMPLE_SAMPLER, target_sampler_hook.seeded_sampling_from_probs, "AROUND"),
        Hook(target_sampler_hook.SAMPLER, target_sampler_hook.seeded_top_k_top_p_sampling, "AROUND"),
        Hook(probs_hook.SOFTMAX, probs_hook.skip_in_coupled_verify, "AROUND", _SPEED_ONLY),
        Hook(probs_hook.COINS, probs_hook.skip_coins_in_coupled_verify, "AROUND", _SPEED_ONLY),
        Hook(probs_hook.TOP_K_RENORM, probs_hook.top_k_renorm_keep_neutral, "AROUND", _KERNEL_ONLY),
        Hook(probs_hook.TOP_P_RENORM, probs_hook.top_p_renorm_keep_neutral, "AROUND", _KERNEL_ONLY),
        Hook(rv.VERIFY_TARGET, rv.verify_unsigned_seed, "AROUND"),
        Hook(rv.CONTRACT_TARGET, rv.name_bad_seed, "AROUND"),
        Hook(rv.TARGET, rv.validate_request, "AROUND"),
        Hook(rv.WHOLE_TARGET, rv.validate_whole_request, "BEFORE"),
        Hook(attention_hook.TARGET, attention_hook.use_one_pass_decode, "AFTER"),
        Hook(attention_hook.DECODE_FWD, attention_hook.use_one_pass_decode, "SWAP"),
        Hook(attention_hook.EXTEND_FWD, attention_hook.use_one_pass_decode, "SWAP"),
        Hook(tah.INIT, tah.check_backend, "AFTER", _CUDA_ONLY),
        Hook(f"{tah.FA}.{channels.TREE_NODES_OK.attr}", tah.check_backend, "ATTR"),
        Hook(tah.GRAPH_STATE, tah.allocate_graph_buffers, "AFTER", _CUDA_ONLY),
        Hook(f"{tah.FA}.{channels.TREE_BUFFERS.attr}", tah.allocate_graph_buffers, "ATTR"),
        Hook(f"{tah.FA}.{channels.TREE_GRAPH_META.attr}", tah.build_after_graph_metadata, "ATTR"),
        Hook(tah.INIT_EAGER, tah.build_after_eager_metadata, "AFTER", _CUDA_ONLY),
        Hook(tah.INIT_GRAPH, tah.build_after_graph_metadata, "AFTER", _CUDA_ONLY),
        Hook(f"{tah.FA}.{channels.TREE_NODES.attr}", tah.build_after_eager_metadata, "ATTR"),
        Hook(tah.FORWARD_EXTEND, tah.verify_tree_as_decode, "AROUND", _CUDA_ONLY),
        Hook(fsh.INIT, fsh.check_backend, "AFTER", _CUDA_ONLY),
        Hook(f"{fsh.FA}.{channels.FA3_SPLIT_OK.attr}", fsh.check_backend, "ATTR"),
        Hook(f"{fsh.FA}.{channels.FA3_OWN_CALLS.attr}", fsh.check_backend, "ATTR"),
        Hook(fsh.INIT_EAGER, fsh.forget_split, "AFTER", _CUDA_ONLY),
        Hook(fsh.INIT_OUT_GRAPH, fsh.forget_split, "AFTER", _CUDA_ONLY),
        Hook(fsh.INIT_IN_GRAPH, fsh.forget_split, "AFTER", _CUDA_ONLY),
        Hook(fsh.FORWARD_EXTEND, fsh.split_extend_around, "AROUND", _CUDA_ONLY),
        Hook(fsh.FORWARD_DECODE, fsh.split_decode_around, "AROUND", _CUDA_ONLY),
        Hook(f"{fsh.FA}.{channels.FA3_SPLIT.attr}", fsh.split_extend_around, "ATTR"),
        Hook(f"{fsh.FA}.{channels.FA3_SPLIT_WARNED.attr}", fsh.split_extend_around, "ATTR"),
        Hook(f"{tah.FA}.forward_metadata", tah.verify_tree_as_decode, "PATCH"),
        Hook(f"{tah.FA}.topk", tah.verify_tree_as_decode, "PATCH"),
        Hook(norm_hook.TARGET, norm_hook.batch_invariant_forward, "AROUND"),
        Hook(kv_rows_hook.TARGET, kv_rows_hook.hold_decode_reserve, "AFTER"),
        Hook(shape_hook.INIT_GRAPHS, shape_hook.install_shapes, "AFTER"),
        Hook(f"{shape_hook.INIT_GRAPHS.rsplit('.', 1)[0]}.{channels.DRAFT_SHAPES.attr}", shape_hook.install_shapes,
             "ATTR"),
        Hook(shape_hook.FORWARD, shape_hook.run_in_shape, "AROUND"),
        Hook(shape_hook.DRAFT, shape_hook.draft_in_shape, "AROUND"),
        Hook(f"{shape_hook.DRAFT.rsplit('.', 1)[0]}.{channels.DRAFT_TOPK.attr}", shape_hook.apply_state, "ATTR"),
        Hook(warmup_hook.TARGET, warmup_hook.compile_kernels, "BEFORE", _WARMUP_ONLY),
        Hook(warmup_hook.TARGET, gemm_warmup_hook.compile_gemms, "BEFORE", _GEMM_WARMUP_ONLY),
        Hook(moe_tile_hook.TARGET, moe_tile_hook.pin_moe_tile, "BEFORE", _MOE_TILE_ONLY),
        Hook(moe_tile_hook.OVERRIDE, moe_tile_hook.pin_moe_tile, "ATTR"),
        Hook(moe_tile_hook.TABLES, moe_tile_hook.pin_moe_tile, "ATTR"),
        Hook(sh.CREATE_TARGET, sh.assign_fresh_seed, "AROUND"),
        Hook(sh.BATCH_TARGET, sh.scope_parallel_samples, "AROUND"),
        Hook(sh.SEND_ONE_TARGET, sh.seed_one_send, "AROUND"),
        Hook(sh.SEND_BATCH_TARGET, sh.seed_batch_send, "AROUND"),
        Hook(sh.REQ_STATE_SEED, sh.seed_one_send, "ATTR"),
        Hook(sh.WAIT_TARGET, sh.report_seed, "AROUND"),
        Hook(sh.COMPLETION_TARGET, sh.report_completion_choices, "AROUND"),
        Hook(sh.CHAT_TARGET, sh.report_chat_choices, "AROUND"),
        Hook(sh.COMPLETION_CHOICE_SEED, sh.add_choice_fields, "FIELD"),
        Hook(sh.CHAT_CHOICE_SEED, sh.add_choice_fields, "FIELD"),
    ]


def registry_rows() -> list[Hook]:
    """The rows SGLang's ``HookRegistry`` applies (kinds :data:`REGISTRY_KINDS`)."""
    return [row for row in hook_table() if row.kind in REGISTRY_KINDS]


def hook_table_markdown() -> str:
    """``docs/plugin.md``'s hook table: one Markdown row per :func:`hook_table` row.

    Columns: SGLang symbol, kind, our function (module and name) and what it
    does: the first paragraph of its docstring, then why the target may be
    absent where it may.
    """
    lines = ["| SGLang symbol | kind | plugin function | what it does |", "|---|---|---|---|"]
    for row in hook_table():
        doc = (row.hook.__doc__ or "").strip().split("\n\n")[0]
        what = " ".join(doc.split()).replace("|", "\\|")
        if row.absent_ok:
            what += f" May be absent: {row.absent_ok}."
        where = f"{row.hook.__module__.rsplit('.', 1)[-1]}.{row.hook.__name__}"
        lines.append(f"| `{row.target}` | {row.kind} | `{where}` | {what} |")
    lines += ["", "Kinds: " + "; ".join(f"{k}: {v}" for k, v in KINDS.items()) + "."]
    return "\n".join(lines) + "\n"


def register() -> None:
    """SGLang plugin entry point: register the hooks with SGLang's HookRegistry.

    Idempotent: a second call in the same process registers nothing more.
    SGLang applies the hooks itself after every plugin's entry point ran. A
    required target that does not resolve is logged as an error here and
    stops start-up in :func:`check_hooks_in_place` (SGLang's loader only logs
    what an entry point raises).
    """
    global _registered
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    with _lock:
        if _registered:
            return
        log = logging.getLogger("sglang_detspec")
        for row in registry_rows():
            if callable(_resolve(row.target)):
                HookRegistry.register(row.target, row.hook, HookType[row.kind])
            elif row.absent_ok:
                log.info("sglang-detspec: %s is not hooked: %s", row.target, row.absent_ok)
            else:
                log.error("sglang-detspec: required hook target %s not found in SGLang %s", row.target,
                          _sglang_version())
        _registered = True


def hook_problems(*, applied: bool = True, config=None) -> list[str]:
    """Required hooks that are not in place in this process: one message per target, empty when all are.

    A required target is missing (it does not resolve: a renamed symbol, a
    missing module, another SGLang build), or, with ``applied`` (after SGLang
    applied the hooks, ``load_plugins``), SGLang's registry did not wrap it.
    With ``config`` (the bag), the rows its promise rests on are required too
    (:func:`required_by`).
    """
    extra = required_by(config) if config is not None else set()
    problems, seen = [], set()
    for row in registry_rows():
        if (row.absent_ok and row.target not in extra) or row.target in seen:
            continue
        seen.add(row.target)
        obj = _resolve(row.target)
        if obj is None:
            problems.append(f"{row.target} is not found in SGLang {_sglang_version()}")
        elif applied and not hasattr(obj, "__wrapped__"):
            problems.append(f"{row.target} (SGLang {_sglang_version()}) was not patched by SGLang's hook registry")
    return problems


def required_by(config) -> set[str]:
    """Optional targets a bag rests on, by the claim it makes.

    The claim read here is the one the hooks make possible, before the
    head-size rule (``config.guarantee_and_reason``). A ``bitwise`` tree
    through the node path rests on the node path's hooks, and an FA3 server
    with the prefix / tail split (the default) on the split's hooks (required
    whatever the claim, where SGLang's FA3 backend imports: where it does not,
    no FA3 server can start). The node path's hooks are required where the
    environment asks for it, and where it comes with the FA3 tree default
    only where the FA3 backend imports, as the split's (so a CPU machine's
    dry run of such a tree does not stop on hooks no server there could
    run). The node path, where asked for, is the split's fallback, so its
    hooks are required beside the split's.
    """
    required = set()
    claim = dataclasses.replace(config, head_dim=None).logits
    tree = config.algorithm is not None and (config.eagle_topk or 1) > 1
    asked = "tree_attention" in config.set_tree_settings
    # The node path serves trees where the split does not (asked for, or declined), so it is required either way.
    if tree and config.tree_attention == "nodes" and claim == "bitwise" and (asked or _fa3_backend_imports()):
        required |= {row.target for row in registry_rows() if row.hook.__module__ == tree_attention_hook.__name__}
    if config.attention_backend == "fa3" and config.decode_attention == "split" and _fa3_backend_imports():
        required |= {row.target for row in registry_rows() if row.hook.__module__ == fa3_split_hook.__name__}
    return required


def _fa3_backend_imports() -> bool:
    """SGLang's FA3 backend module imports in this build (it loads sgl_kernel's CUDA library)."""
    try:
        importlib.import_module(FA_MODULE)
    except Exception:  # ImportError, or the CUDA library failing to load: either way no FA3 server here
        return False
    return True


def check_hooks_in_place(result, server_args) -> None:
    """AFTER hook for ``handle_speculative_decoding``: stop start-up when a required hook is not in place.

    Only for active runs (:attr:`DetSpecConfig.active`, the test every hook
    makes; a run the bag refuses has stopped before this hook): elsewhere
    SGLang's own code runs anyway.

    Raises:
        RuntimeError: naming each missing symbol and the SGLang version.
    """
    bag = current_config()
    if not bag.active:
        return None
    problems = hook_problems(config=bag)
    if problems:
        raise RuntimeError(
            "sglang-detspec cannot keep its determinism promise: a required SGLang symbol is not hooked "
            "(this plugin is pinned to sglang==0.5.23; set SGLANG_DETSPEC_DISABLE=1 to run SGLang's own "
            "sampling):\n  - " + "\n  - ".join(problems)
        )
    return None


def _sglang_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sglang")
    except PackageNotFoundError:
        return "(not installed)"


def _resolve(target: str):
    """The object a dotted target names, or None.

    Some SGLang names are None on platforms without the kernel (the renorm
    ops on a CPU-only build). Such a target must not be hooked: the registry
    rebinds every module attribute that *is* the original object, and for
    None that would be every unset attribute of every loaded module.
    """
    import pkgutil

    obj_path, attr = target.rsplit(".", 1)
    try:
        return getattr(pkgutil.resolve_name(obj_path), attr, None)
    except (ImportError, AttributeError, ValueError):
        return None
