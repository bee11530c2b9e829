"""What ``detspec serve --dry-run`` prints between the checks and the command: the server the flags give.

:func:`report` prints the config line (the bag as start-up will set it),
the warnings under it, the notes (each cut at its first clause unless
``--verbose``) and the claim again as the last line. The note builders
here are the dry run's own: what start-up changes before SGLang builds
anything, what the flags alone cannot tell (the backend SGLang picks, a
target whose ``config.json`` is not read, parallel sizes no run measured);
the notes a server logs too come from ``sglang_plugin.startup_notes``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING

from .messages import say

if TYPE_CHECKING:
    from ..config import DetSpecConfig

# The E2E suites that have run with SGLang's prefill CUDA graphs on, and where: the help and the dry run say it.
PREFILL_GRAPH_SUITES = ("every E2E file that runs CUDA graphs (all but the controls), the forward-mode matrix and "
                        "SGLang's harness among them (the runs of 2026-12-06 and 2026-12-07 in docs/results.md)")
# A Hugging Face repository id as --model-path takes one: owner/name.
HF_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
# The claim line's mark when the target's config.json was not read (family_unknown_notes).
DENSE_ASSUMED = "for a dense target: its config.json was not read, see the note above"
# The families the claim line spells out beside that mark: the ones people speculate with whose claim may differ.
ASSUMED_FAMILIES = (("moe", "with experts"), ("mla+moe", "MLA with experts"), ("mla+moe+fp8", "the same in FP8"),
                    ("fp8", "dense in FP8"))
# Where the dry run cut a note short (brief_note); --verbose prints the notes whole.
CUT_MARK = "[...]"
# The line after shortened notes: what was cut and how to see it.
CUT_NOTE = (f"notes cut to their first clause and what is not measured ({CUT_MARK}); --verbose prints them whole, "
            "with the runs behind each figure")
# A clause with one of these says what no run measured: the shortened notes keep it beside what they keep.
UNMEASURED_WORDS = ("not measured", "not at all", "no run ", "never run", "unmeasured", "no measurement")
# A --model-path or --speculative-draft-model-path written as a file-system path (a repository id is owner/name).
LOCAL_PATH_PREFIXES = ("/", "./", "../", "~")
PREFILL_GRAPH_OFF_RUNS = "except the two-GPU file (never run)"
# ... and for an FP8 target, whose passing family rows ran with them off (prefill_graph_notes).
PREFILL_GRAPH_FP8 = ("the model families' FP8 rows passed on triton with them on and DeepGEMM's pre-compile on "
                     "(four tiny FP8 servers started within 450 s, docs/e2e/2026-12-07-h100-fp8-triton), on fa3 "
                     "with both off (with the graphs on, four were not healthy within 300 s: each prefill size "
                     "compiled its FP8 kernels at capture, docs/e2e/2026-12-07-h100-families-backends); allow a "
                     "longer start-up")


def switch_notes(bag: DetSpecConfig, notes: list[str], ns: argparse.Namespace) -> list[str]:
    """``notes`` with the switching tree's note replaced by why it is not applied, where the server would not apply it,
    or with a note on a bound that applies but can never decide (``shape_rules.idle_bound_note``).

    The server decides at start-up (``shape_hook.install_shapes``) with the
    same rules (``shape_rules.not_applied_reason``, ``idle_bound_note``); the dry run reads the
    flags as typed, so its bound is ``--max-running-requests`` as given
    (SGLang's default is worked out at start-up).
    """
    if not bag.switches_shape:
        return notes
    from ..sglang_plugin.startup_notes import chain_note
    from ..sglang_plugin.shape_rules import idle_bound_note, not_applied_note, not_applied_reason

    max_running = getattr(ns, "max_running_requests", None)
    reason = not_applied_reason(ns, max_running, bag.chain_at_batch, bag.chain_at_tokens)
    if reason is None:
        # The pool as typed (--max-total-tokens); SGLang sizes it from free memory otherwise, known at start-up.
        idle = idle_bound_note(bag.chain_at_batch, bag.chain_at_tokens, max_running,
                               getattr(ns, "max_total_tokens", None))
        return notes + [idle] if idle else notes
    return [n for n in notes if n != chain_note(bag)] + [not_applied_note(bag.chain_at_batch, reason,
                                                                          bag.chain_at_tokens)]


def family_unknown_notes(bag: DetSpecConfig, ns: argparse.Namespace) -> list[str]:
    """A note when the dry run cannot read the target's ``config.json`` (``model_family`` is None).

    The claim then follows the attention backend alone, as for a dense
    target; the server reads the model and states its own claim.
    """
    from ..model_family import bitwise_backends

    if bag.model_family is not None or bag.logits != "bitwise":  # a 'tokens' claim assumes nothing of the model
        return []
    model = getattr(ns, "model_path", None)
    # A Hugging Face repository id (owner/name, no local folder of that name): say how to fetch its config alone.
    fetch = (f"; `hf download {model} config.json` puts it in the Hugging Face cache, where the dry run reads it "
             "(a gated repository: `hf auth login` first)"
             if model and HF_REPO_ID.fullmatch(model) and not os.path.exists(model) else "")
    if missing_model_paths(argparse.Namespace(model_path=model)):
        fetch = ": no such file or folder on this machine (a real start stops on it)"
    return [f"the target's config.json could not be read here ({model!r}{fetch}): the claim above "
            "assumes a dense target with full attention and a head size the attention path takes (with the split, "
            "the default, up to 256; on fa3 without it 65 to 128); quantized targets claim 'tokens' (FP8 MLA targets "
            f"with experts but on {' and '.join(bitwise_backends('mla+moe+fp8'))}), as do "
            f"MLA targets outside {' and '.join(bitwise_backends('mla+moe'))} and MoE targets outside "
            f"{' and '.join(bitwise_backends('moe'))} or on another MoE runner than SGLang's Triton one, "
            "and so do servers past those head sizes (the server's start-up line states the claim for the model it "
            "loads)" + ("; an MLA target's tree is served as the chain of its depth (NGRAM on it is refused at "
                        "start-up, refusal mla_tree)" if bag.verifies_trees else "")]


def clauses(note: str) -> list[str]:
    """``note`` split at each ``;`` outside parentheses, the clauses stripped."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(note):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == ";" and depth == 0:
            parts.append(note[start:i].strip())
            start = i + 1
    return parts + [note[start:].strip()]


def brief_note(note: str) -> str:
    """``note`` shortened for the dry run: its first clause (:func:`clauses`) and each later clause that says
    what no run measured (:data:`UNMEASURED_WORDS`), once each, in order, with :data:`CUT_MARK` where clauses
    were left out; the whole note where none was.

    The notes open with what the server does and follow with the runs and figures behind it, clause by clause;
    what was not measured qualifies what the server does, so it stays.
    """
    parts = clauses(note)
    pieces, seen, cut = [], set(), False
    for i, part in enumerate(parts):
        if i == 0 or (part not in seen and any(word in part for word in UNMEASURED_WORDS)):
            pieces.append(f"{CUT_MARK} {part}" if cut else part)
            seen.add(part)
            cut = False
        else:
            cut = True
    if len(pieces) == len(parts):
        return note
    return "; ".join(pieces) + (f" {CUT_MARK}" if cut else "")


def served_claim(bag: DetSpecConfig, **changes) -> str:
    """What start-up would claim for ``bag`` with ``changes`` (fields of the bag): the logits claim as a repr,
    after the server defaults and an MLA tree served as its chain, or that start-up refuses it (its codes)."""
    from ..config import with_server_defaults

    other = with_server_defaults(dataclasses.replace(bag, **changes))
    refused = other.refusals()
    if refused:
        return f"refused at start-up ({', '.join(r.code for r in refused)})"
    if other.mla_tree_as_chain:
        other = other.as_chain()
    return repr(other.logits)


def dense_assumed_mark(bag: DetSpecConfig) -> str:
    """The claim line's mark where the target's ``config.json`` was not read: :data:`DENSE_ASSUMED`, then what the
    other families of :data:`ASSUMED_FAMILIES` would claim with these flags (:func:`served_claim`)."""
    claims = [f"{words} {served_claim(bag, model_family=family)}" for family, words in ASSUMED_FAMILIES]
    return f"{DENSE_ASSUMED}; {', '.join(claims)}"


# The backends the claim line names where none was: SGLang's pick on Hopper under deterministic inference, and
# the other one every suite runs.
NAMED_BACKENDS = ("fa3", "triton")


def named_backend_mark(bag: DetSpecConfig) -> str:
    """The claim line's mark without ``--attention-backend``: what the flags claim with each of
    :data:`NAMED_BACKENDS` named (:func:`served_claim`)."""
    claims = [f"{backend} {served_claim(bag, attention_backend=backend)}" for backend in NAMED_BACKENDS]
    # Unread, the family is taken as dense, as the backend rules alone claim; the notes say what others claim.
    named = "named, for a dense target (its config.json was not read)" if bag.model_family is None else "named"
    return f"no --attention-backend, so the server's pick decides; {named}: {', '.join(claims)}"


def missing_model_paths(ns: argparse.Namespace) -> list[str]:
    """The model flags written as file-system paths (:data:`LOCAL_PATH_PREFIXES`) that name nothing here, one
    message each: SGLang would stop on them after loading its modules, so a real start stops first (a dry run,
    which may run on another machine than the server's, notes the target's instead)."""
    missing = []
    for flag in ("model_path", "speculative_draft_model_path"):
        path = getattr(ns, flag, None)
        if isinstance(path, str) and path.startswith(LOCAL_PATH_PREFIXES) and not os.path.exists(
                os.path.expanduser(path)):
            missing.append(f"--{flag.replace('_', '-')} {path}: no such file or folder")
    return missing


def fa3_head_size_notes(bag: DetSpecConfig) -> list[str]:
    """With no backend named, what FA3 (SGLang's pick on Hopper) would claim at the target's head size.

    A named ``fa3`` needs none: the claim's own reason says it. The head size
    is the bag's, from the target's ``config.json`` (none: no note). The
    claim is the bag's own with fa3 named (every rule: backend, draft shape,
    settings, model family).
    """
    if not bag.active or bag.attention_backend is not None or bag.head_dim is None:
        return []
    from ..config import TREE_SETTING_ENVS, with_server_defaults
    from ..sglang_plugin.resolve import sglang_backend_switch

    if sglang_backend_switch(argparse.Namespace(attention_backend="fa3", kv_cache_dtype=bag.kv_cache_dtype)):
        return []  # SGLang would not serve its fa3 pick on FA3 with this KV cache (its own rule, asked)
    # Every rule of the claim, the family's included, and the tree settings' FA3 defaults.
    fa3 = with_server_defaults(dataclasses.replace(bag, attention_backend="fa3"))
    claim, reason = fa3.logits, fa3.logits_reason
    if not reason and claim == "tokens":  # the attention rule gave 'bitwise': the family's rule set the claim
        reason = f"a {bag.model_family} target, not measured yet"
    why = f" ({reason})" if reason else ""
    taken = fa3.fa3_defaults_taken
    defaults = (f", with the FA3 tree defaults for its tree settings not set ("
                f"{' '.join(f'{TREE_SETTING_ENVS[f]}={getattr(fa3, f)}' for f in taken)})" if taken else "")
    return [f"on Hopper SGLang picks fa3 here, and at this target's head size ({bag.head_dim}) an FA3 server "
            f"claims {claim!r}{why}{defaults} (name --attention-backend fa3 or triton for the dry run to state the "
            "claim)"]


def gemm_warmup_notes(bag: DetSpecConfig) -> list[str]:
    """What start-up will spend warming DeepGEMM (``gemm_warmup_hook``), for a deterministic run of the plugin."""
    from ..config import GEMM_WARMUP_ENV

    if not bag.deterministic:
        return []
    # SGLang's own pre-compile for FP8 block-quantized weights comes before the plugin's warm-up.
    fp8 = (["FP8 weights: block-quantized ones (DeepSeek-V3's format) go through DeepGEMM, whose kernels SGLang "
            "pre-compiles first at start-up (3.3 minutes on an H100 for the tiny FP8 DeepSeek-V3, four servers "
            "starting together); `python -m sglang.compile_deep_gemm` with the server's arguments fills DeepGEMM's "
            "cache ahead of time"] if "fp8" in bag.family_traits else [])
    if not bag.gemm_warmup_s:
        return fp8 + [f"{GEMM_WARMUP_ENV}=0: DeepGEMM's matmul kernels compile at first use, inside requests"]
    return fp8 + [f"on a Hopper GPU start-up spends up to {bag.gemm_warmup_s:g} s compiling DeepGEMM's matmul "
                  f"kernels for the batch sizes it will meet ({GEMM_WARMUP_ENV}; 0 turns it off); kernels already "
                  "in DeepGEMM's disk cache load instead"]


def kv_move_warmup_notes(bag: DetSpecConfig) -> list[str]:
    """A note where start-up compiles SGLang's KV move of accepted tree paths (``kv_move_warmup``)."""
    from ..sglang_plugin.kv_move_warmup import moves_accepted_kv

    if not (bag.active and moves_accepted_kv(bag)):
        return []
    return ["this server verifies trees: start-up also compiles SGLang's move of each verify's accepted KV slots "
            "for every batch size it verifies trees at (one launch per Triton variant its batches reach), which "
            "SGLang would otherwise compile inside the first large batches (the 256-slot variants 4-5 s each on an "
            "H200)"]


def parallel_sizes(ns: argparse.Namespace) -> list[str]:
    """The tensor, data, attention-data and pipeline parallel sizes above 1 as typed: ``["--tp-size 2", ...]``."""
    sizes = {flag: getattr(ns, name, 1) or 1 for flag, name in (
        ("--tp-size", "tp_size"), ("--dp-size", "dp_size"), ("--attn-dp-size", "attn_dp_size"),
        ("--pp-size", "pp_size"))}
    return [f"{flag} {size}" for flag, size in sizes.items() if isinstance(size, int) and size > 1]


def parallelism_notes(ns: argparse.Namespace) -> list[str]:
    """A note for tensor, data, attention-data or pipeline parallelism: not measured with the plugin (docs/results.md)."""
    named = parallel_sizes(ns)
    if not named:
        return []
    return [f"{', '.join(named)}: not yet measured with the plugin, and one earlier --dp-size 2 audit (rejection mode) "
            "had 1 of 61 requests change output between batches, cause not known (docs/results.md, 'Not measured "
            "yet'): do not count on reproducible outputs across batches here yet; audit the server (detspec audit)"]


def prefill_graph_notes(ns: argparse.Namespace, traits: tuple[str, ...] = ()) -> list[str]:
    """A note when SGLang's prefill CUDA graphs stay on (its default): which committed runs had them on.

    ``traits``: the target's family traits (``DetSpecConfig.family_traits``); ``fp8`` among them adds
    :data:`PREFILL_GRAPH_FP8`.
    ``ns``: SGLang's parsed ``launch_server`` arguments, read in SGLang's
    order of precedence: a ``--cuda-graph-config`` decides (not read here:
    no note), then ``--cuda-graph-backend-prefill`` (off: ``disabled``),
    then ``--disable-prefill-cuda-graph`` or ``--disable-cuda-graph``.
    """
    if getattr(ns, "cuda_graph_config", None):
        return []
    backend = getattr(ns, "cuda_graph_backend_prefill", None)
    if backend is not None:
        off = str(backend).lower() == "disabled"
    else:
        off = bool(getattr(ns, "disable_prefill_cuda_graph", False) or getattr(ns, "disable_cuda_graph", False))
    if off:
        return []
    fp8 = f"; {PREFILL_GRAPH_FP8}" if "fp8" in traits else ""
    return ["SGLang's prefill CUDA graphs are on (its default, which the plugin keeps): the serving benchmark and "
            f"{PREFILL_GRAPH_SUITES} ran with them, {PREFILL_GRAPH_OFF_RUNS}{fp8}"]


def served_algorithm_note(bag: DetSpecConfig, record) -> str | None:
    """A note when SGLang's resolution (run here) serves another speculative algorithm than the flags name.

    SGLang 0.5.23 serves NEXTN as EAGLE: the server's start-up line names
    the resolved one, the dry run's line the typed one. None where they agree.
    """
    from ..sglang_plugin.resolve import config_from_server_args

    served = config_from_server_args(record).algorithm
    if served == bag.algorithm:
        return None
    return f"SGLang serves --speculative-algorithm {bag.algorithm} as {served}, as the server's start-up line shows"


# How the dry run words an assert of SGLang's own resolution on the flags (a warning, not a note).
FAILED_CHECK = "SGLang's own argument resolution failed one of its checks on these flags here"


def unresolved_line(unresolved: str) -> str:
    """The message for why SGLang's resolution did not finish here: a warning for a failed check, else a note."""
    return f"{'warning' if unresolved.startswith(FAILED_CHECK) else 'note'}: {unresolved}"


def missing_draft_warning(bag: DetSpecConfig, record) -> str | None:
    """A warning when SGLang's resolution (run here) left a draft-model server without a draft model path.

    The algorithms whose draft is a model of its own (``config.TOPK_SHAPE_ALGORITHMS``); SGLang's resolution
    fills the path in only for targets that carry their draft layer (DeepSeek-V3, GLM-4.5 and a few others).
    The server would then fail when it loads its draft, after the target;
    None where a draft path is set or filled, or where the resolution did not run here.
    """
    from ..config import TOPK_SHAPE_ALGORITHMS

    if record is None or str(bag.algorithm or "").upper() not in TOPK_SHAPE_ALGORITHMS:
        return None
    from sglang.srt.arg_groups.overrides import resolved_view

    if getattr(resolved_view(record), "speculative_draft_model_path", None):
        return None
    return (f"--speculative-algorithm {bag.algorithm} without --speculative-draft-model-path, and SGLang's "
            "resolution did not fill it in (it does for targets whose checkpoint carries the draft layer, such as "
            "DeepSeek-V3): the server would fail loading its draft; pass the draft's path (for a MiMo-style "
            "target with its own multi-token-prediction layer, the target's path)")


def filled_shape_note(record) -> str:
    """The draft shape SGLang's resolution (run here) filled in for flags that leave it to SGLang, as a note."""
    from sglang.srt.arg_groups.overrides import resolved_view

    view = resolved_view(record)
    return (f"SGLang resolves these flags to --speculative-num-steps {view.speculative_num_steps} "
            f"--speculative-eagle-topk {view.speculative_eagle_topk} --speculative-num-draft-tokens "
            f"{view.speculative_num_draft_tokens} for this model (its own resolution, run here)")


def report(bag: DetSpecConfig, record, unresolved: str | None, ns: argparse.Namespace, env: Mapping[str, str], *,
           verbose: bool = False) -> None:
    """Print the dry run's account of an active server: the config line, warnings, notes, then the claim.

    Args:
        bag: the flags' bag from the start-up check (``serve.startup_check``).
        record: SGLang's resolved ``ServerArgs`` where its resolution ran here, else None.
        unresolved: why SGLang's resolution did not run or finish here, or None.
        ns: the flags as SGLang's ``launch_server`` parser reads them.
        env: the server's environment (the ``SGLANG_DETSPEC_*`` settings).
        verbose: print each note whole; by default a note keeps its first clause and what is not measured
            (:func:`brief_note`).
    """
    from ..config import TOPK_SHAPE_ALGORITHMS

    if record is not None and (bag.eagle_topk is None or bag.adaptive_steps) and bag.algorithm in (
            TOPK_SHAPE_ALGORITHMS) and bag.attention_backend is not None:
        # SGLang fills the draft shape (its per-model pick, or an adaptive chain): describe the server its
        # resolution gives, as start-up reads it. Without a backend named the resolution here would have
        # picked this machine's backend, so the flags' bag stays.
        from ..sglang_plugin.resolve import config_from_server_args

        renamed = served_algorithm_note(bag, record)
        say(f"note: {filled_shape_note(record)}; the line below describes that server"
             + (f" ({renamed})" if renamed else ""))
        bag = config_from_server_args(record, env)
    elif record is not None:
        renamed = served_algorithm_note(bag, record)
        if renamed:
            say(f"note: {renamed}; the line below names the algorithm as typed")
    missing = missing_draft_warning(bag, record)
    if missing:
        say(f"warning: {missing}")
    if bag.mla_tree_as_chain:
        from ..sglang_plugin.startup_notes import mla_chain_note

        # What the server's start-up declares for this tree before SGLang builds anything.
        say(f"note: {mla_chain_note(bag)}; the command below keeps the flags as typed, the server's "
             "start-up declares the chain's")
        bag = bag.as_chain()
    if bag.wants_sampled_drafts():
        from ..sglang_plugin.resolve import flag_blockers, sampled_draft_blockers
        from ..sglang_plugin.startup_notes import sampled_drafts_unavailable_note

        # Start-up's own check on SGLang's resolution where it ran here, else on the flags as typed.
        blockers = sampled_draft_blockers(record) if record is not None else flag_blockers(ns)
        if blockers:
            say(f"note: {sampled_drafts_unavailable_note(blockers)}")
        else:
            # What the server's start-up does to this chain wherever SGLang admits the flag.
            bag = dataclasses.replace(bag, rejection_sampling=True)
            say("note: start-up turns SGLang's sampled-draft path on for this coupled chain: the draft "
                "samples its proposals instead of taking its argmax (SGLang ties that path to its "
                "rejection-sampling flag, hence rejection_sampling=True below); verification stays coupled, "
                "not SGLang's rejection sampling")
    say(f"flags check passed (the GPU checks run when the server starts): {bag.describe()}")
    # Right under the claim it qualifies, not at the end of the notes.
    warnings = parallelism_notes(ns)
    for warning in warnings:
        say(f"warning: {warning}")
    from ..config import REJECTION_ALGORITHMS

    # Without any shape flag SGLang picks all three per model (partial sets are refused above);
    # under --speculative-adaptive it serves a chain.
    picks_shape = bag.algorithm in REJECTION_ALGORITHMS and bag.eagle_topk is None and not bag.adaptive_steps
    if picks_shape and record is not None:
        say(f"note: {filled_shape_note(record)}; the claim follows from that shape and the backend SGLang "
             "picks on the server's GPU, which its start-up line states")
    elif picks_shape:
        # The EAGLE drafts: SGLang picks their tree shape from the model's config at start-up
        # (Llama: top-k 4); STANDALONE always gets a chain, NGRAM its BFS breadth (resolved_eagle_topk).
        say("note: the logits claim above assumes a chain: with --speculative-eagle-topk unset SGLang "
             "picks the top-k per model at start-up (a tree for some, e.g. Llama's top-k 4), and a tree's "
             "claim follows the tree rules (bitwise on the split on fa3 and triton, and on fa3 at head "
             "sizes 65-128 on the FA3 tree default's node path); the server's start-up line states the "
             "claim and the tree settings it serves")
    if bag.attention_backend is None:
        say("note: the logits claim above assumes nothing of the attention backend: without "
             "--attention-backend SGLang picks it on the GPU at start-up (fa3 on Hopper under "
             "deterministic inference, triton with --kv-cache-dtype fp8_e5m2), and the server's start-up "
             "line states the claim it serves")
        from ..config import kv_cache_reason

        kv_reason = kv_cache_reason(bag.kv_cache_dtype)
        if kv_reason:  # the KV cache alone decides the claim, whatever the backend turns out to be
            say(f"note: on every backend logits='tokens' because of {kv_reason}")
    from ..sglang_plugin.startup_notes import setting_notes, unmeasured_notes
    from ..sglang_plugin.resolve import sglang_backend_switch

    switched = sglang_backend_switch(ns)
    # Explicit --prefill / --decode-attention-backend flags win over the switched one: say it only where
    # the bag (which startup_check built with the switch) serves the switched backend.
    if switched is not None and bag.attention_backend == switched:
        say(f"note: SGLang serves --attention-backend {ns.attention_backend} with --kv-cache-dtype "
             f"{ns.kv_cache_dtype} on {switched} (FA3 reads FP8 as e4m3 only): the fields above are "
             f"{switched}'s")
    dense_assumed = family_unknown_notes(bag, ns)
    notes = (setting_notes(bag) + switch_notes(bag, unmeasured_notes(bag), ns)
             + prefill_graph_notes(ns, bag.family_traits) + dense_assumed + fa3_head_size_notes(bag)
             + gemm_warmup_notes(bag) + kv_move_warmup_notes(bag))
    shown = notes if verbose else [brief_note(note) for note in notes]
    for note in shown:
        say(f"note: {note}")
    if shown != notes:
        say(f"note: {CUT_NOTE}")
    # The notes run long: the claim again as the last line before the command, with what qualifies it.
    if unresolved:
        say(unresolved_line(unresolved))
    # The claim is the one-GPU rule's; under parallelism nothing measured it (the warning says why).
    parallel = ", ".join(parallel_sizes(ns))
    marks = ([f"on one GPU; at {parallel} not measured, see the warning above"] * bool(parallel)
             + [dense_assumed_mark(bag)] * bool(dense_assumed)
             + [named_backend_mark(bag)] * (bag.attention_backend is None))
    say(f"claim: logits={bag.logits!r}" + (f" ({'; '.join(marks)})" if marks else ""))
