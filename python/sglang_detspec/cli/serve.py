"""``detspec serve -- <launch_server args>``: SGLang's server with the plugin on.

Runs ``python -m sglang.launch_server`` with the given arguments, adds
``--enable-deterministic-inference`` if it is missing, and makes sure SGLang's
plugin loader picks up this plugin: ``SGLANG_PLUGINS`` is a whitelist of
entry-point names, so when it is set our name is appended; when it is unset
every installed plugin loads, ours included.

Before anything starts, the arguments are read by SGLang's own
``launch_server`` parser (so abbreviated flags, ``--config`` files and
argument errors are SGLang's), and the plugin's start-up check
(:meth:`sglang_detspec.config.DetSpecConfig.refusals`) runs on the
config bag built from them, as the server's first check does with the flags
as typed, beside the refusal SGLang's own resolution makes of an
``--attention-backend`` outside its deterministic set
(:func:`sglang_detspec.sglang_plugin.resolve.sglang_refusals`). A
combination the server would refuse stops here with the same messages and
exit status 2. The server checks again after SGLang resolved
its flags (which needs the model), so ``--dry-run`` passing is necessary,
not sufficient.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..config import DetSpecConfig

DETERMINISTIC = "--enable-deterministic-inference"
HELP_FLAGS = ("-h", "--help")
SHUTDOWN_GRACE_S = 30  # after Ctrl-C, before the server is sent SIGTERM

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
# Where the dry run cut a note short (first_clause); --verbose prints the notes whole.
CUT_MARK = "[...]"
# A --model-path or --speculative-draft-model-path written as a file-system path (a repository id is owner/name).
LOCAL_PATH_PREFIXES = ("/", "./", "../", "~")
PREFILL_GRAPH_OFF_RUNS = "except the two-GPU file (never run)"
# ... and for an FP8 target, whose passing family rows ran with them off (prefill_graph_notes).
PREFILL_GRAPH_FP8 = ("the model families' FP8 rows passed on triton with them on and DeepGEMM's pre-compile on "
                     "(four tiny FP8 servers started within 450 s, docs/e2e/2026-12-07-h100-fp8-triton), on fa3 "
                     "with both off (with the graphs on, four were not healthy within 300 s: each prefill size "
                     "compiled its FP8 kernels at capture, docs/e2e/2026-12-07-h100-families-backends); allow a "
                     "longer start-up")
# The width of the help's hand-wrapped paragraphs, for the ones built from the names above.
HELP_WIDTH = 76
# Lines broken at flag boundaries, with shell continuations, so the example can be copied as is.
EXAMPLE = """\
  detspec serve -- --model-path M --speculative-algorithm EAGLE \\
      --speculative-draft-model-path D --speculative-num-steps 3 \\
      --speculative-eagle-topk 1 --speculative-num-draft-tokens 4 \\
      --attention-backend fa3"""
# Why the example's dry run claims what it claims (config.logits_guarantee), and what no server measured.
CLAIM_NOTE = """\
Claims. The server's start-up line claims logits='bitwise' (speculative
decoding on gives the logits of decoding without it, bit for bit) or
logits='tokens' (the same tokens, except where a draw is a near-tie inside
one bf16 rounding step). The dry run states the claim its flags give;
without --attention-backend it states 'tokens' (see below).

  bitwise   by default for chains and trees of dense targets with
            unquantized weights on triton and fa3 attention, as in the
            example above: every target forward runs the positional split
            (SGLANG_DETSPEC_DECODE_ATTENTION=split, the default)
            - triton: KV page size 1, --kv-cache-dtype auto, head sizes up
              to 256, at most 64 query heads per KV head, no sliding-window
              layers, up to 256 draft tokens;
            - fa3 (not FA4): KV page size 1, --kv-cache-dtype auto, no MLA
              or sliding-window layers, head sizes up to 256, trees of up
              to 65 draft tokens;
            - fa3 servers that verify no trees (a chain, multi-layer EAGLE,
              no speculative decoding) at target head sizes 65 to 128
              keep SGLang's own FA3 calls instead, which run every
              forward mode on one causal kernel there (its start-up
              check of them decides; measured bitwise with SGLang's
              harness at head size 128);
            - fa3 EAGLE / EAGLE3 / NEXTN trees at target head sizes 65 to
              128 (no attention data or pipeline parallelism) take the FA3
              tree default instead: SGLang's FA3 calls,
              each tree node verified as one decode query (the node path),
              a chain drafted above 16 requests or 12,288 summed tokens
              (for the tree settings not set in the environment).
  tokens    other backends; any --kv-cache-dtype other than auto;
            quantized targets (but FP8 MLA targets with experts on
            triton), MLA targets outside triton and
            mixture-of-experts targets outside fa3 and triton (measured
            bitwise there: the runs of 2026-12-07 in docs/results.md)
            or on another --moe-runner-backend than auto / triton or any
            --moe-a2a-backend;
            a run without --attention-backend (SGLang
            picks the backend on the GPU, so the dry run cannot know it;
            where it can read the target's config.json it notes what fa3
            would claim).

A server past one of these limits, or whose start-up check fails, keeps
SGLang's FA3 calls (on triton the one-pass decode) and says which claim
that leaves: 'tokens', except triton chains, which stay 'bitwise' on the
one-pass decode (with --kv-cache-dtype auto, KV page size 1 and no
sliding-window layers).

Turning the split off: SGLANG_DETSPEC_DECODE_ATTENTION=one_pass (triton
chains stay 'bitwise') or sglang. Trees then claim 'tokens' (fa3 on the node
path apart, head sizes 65 to 128, as in the FA3 tree default), and so do fa3
chains outside head sizes 65 to 128 and, with sglang, triton chains.

Draft shape: SGLANG_DETSPEC_TREE_CHAIN_BATCH=B and
SGLANG_DETSPEC_TREE_CHAIN_TOKENS=T make a coupled tree draft a chain of its
depth for decode batches above B requests or T summed tokens (0 by default;
16 and 12288 in the FA3 tree default); the tokens stay the same
(docs/usage.md). An MLA target's tree is served as the chain of its
depth (start-up sets --speculative-eagle-topk 1: its tree verify, SGLang's
own MLA tree attention, was measured apart from decode); NGRAM on it,
verified as trees at any breadth, is refused (refusal mla_tree).

Mixture-of-experts speed: deterministic inference gives SGLang's fused-MoE
kernel one tile at every batch size (64 x 64 x 32); an unquantized MoE
target on SGLang's Triton MoE runner runs the plugin's tile instead
(32,64,128,1,4,3 by default), with which the coupled chain served
0.91-0.98x SGLang's non-deterministic chain on a Qwen3-30B-A3B-like shape
with 128-token prompts (0.79-0.89x with SGLang's tile); its MoE calls at
2,048 / 8,192-token prefills take 1.14x / 1.29x SGLang's tile's time.
SGLANG_DETSPEC_MOE_TILE=M,N,K,G,W,S runs another fixed tile, =sglang
SGLang's (docs/usage.md).

Measured: both splits bitwise on an H200 (docs/forward_modes.md). Serving
the 8B shape the FA3 split cost the plain tree 0.92-1.06x SGLang's
inter-token latency and the chain 0.99-1.21x; at that shape's head size
of 128 neither pays it by default (the chain keeps SGLang's FA3 calls, the
tree takes the FA3 tree default). The Triton split served without
speculative decoding at 0.97-1.13x SGLang's deterministic Triton
inter-token latency; with speculative decoding its cost is not measured.

""" + textwrap.fill(
    "Prefill CUDA graphs: SGLang's default, kept in the example. They were on in the serving benchmark (where the "
    "coupled chain served 19-27% more tokens/s with them at 8 and 32 concurrent requests, two back-to-back "
    f"commands) and in {PREFILL_GRAPH_SUITES}, {PREFILL_GRAPH_OFF_RUNS}.", HELP_WIDTH,
    break_on_hyphens=False, break_long_words=False)
DESCRIPTION = f"""\
Run SGLang's server (python -m sglang.launch_server) with the arguments given
after '--', adding {DETERMINISTIC} if it is missing, with this
plugin admitted by SGLang's plugin loader (appended to SGLANG_PLUGINS when that
whitelist is set).

First SGLang's own launch_server parser reads the arguments and the plugin's
start-up check runs on them, with SGLang's refusal of attention backends it
does not admit under deterministic inference: a combination the server would
refuse stops here with the server's message and exit status 2.

example:
{EXAMPLE}"""
# The claims come after the options: the example and the usage line are what a first reader needs.
EPILOG = CLAIM_NOTE
USAGE_HINT = "put '--' before SGLang's launch_server arguments: detspec serve [--dry-run] -- --model-path M ..."


class _Refused(Exception):
    """SGLang's parser refused the arguments; the message is argparse's."""


class _RefusingParser(argparse.ArgumentParser):
    # argparse prints and exits on bad arguments; serve reports them in its own words instead.
    def error(self, message):
        raise _Refused(message)


@functools.lru_cache(maxsize=1)

def sglang_parser() -> argparse.ArgumentParser:
    """SGLang's ``launch_server`` parser, raising instead of exiting (imports SGLang).

    Built without ``-h``: help is left to SGLang itself (see :func:`_run`).
    """
    from sglang.srt.server_args import ServerArgs

    parser = _RefusingParser(prog="sglang.launch_server", add_help=False)
    ServerArgs.add_cli_args(parser)
    return parser


def read_launch_args(launch_args: Sequence[str]) -> argparse.Namespace:
    """``launch_args`` as SGLang's ``launch_server`` reads them.

    A ``--config`` YAML file is merged in first, as SGLang does.

    Raises:
        ValueError: SGLang's parser refuses the arguments, or the ``--config``
            file cannot be read; the message is SGLang's.
    """
    parser, argv = sglang_parser(), list(launch_args)
    try:
        if "--config" in argv:
            from sglang.srt.utils.server_args_config_parser import ConfigArgumentMerger

            argv = ConfigArgumentMerger(parser).merge_config_with_args(argv)
        return parser.parse_args(argv)
    except (_Refused, OSError, ValueError) as exc:
        raise ValueError(f"SGLang's launch_server refuses these arguments: {exc}") from None


def server_command(launch_args: Sequence[str], python: str = sys.executable) -> list[str]:
    """The ``launch_server`` command, with ``--enable-deterministic-inference`` added if missing.

    Args:
        launch_args: SGLang's arguments, without the leading ``--``.
        python: the interpreter to run SGLang with.

    Raises:
        ValueError: SGLang's parser refuses ``launch_args`` (see :func:`read_launch_args`).
    """
    args = list(launch_args)
    if not read_launch_args(args).enable_deterministic_inference:
        args.append(DETERMINISTIC)
    return [python, "-m", "sglang.launch_server", *args]


def startup_check(launch_args: Sequence[str], environ: Mapping[str, str], *,
                  check_hooks: bool = True) -> tuple[DetSpecConfig, list[str]]:
    """``(bag, problems)``: the plugin's start-up check on ``launch_args`` as typed.

    The bag is built as the server's first start-up check builds it (from
    the flags before SGLang resolves them, with the top-k SGLang gives NGRAM
    (``resolve.resolved_eagle_topk``), and the ``SGLANG_DETSPEC_*`` settings
    of ``environ``), except for the attention backend of an FA3 server with
    an ``fp8_e5m2`` KV cache: the one SGLang's resolution switches it to, as
    the server's resolved bag sees it (``resolve.sglang_backend_switch``); ``problems`` is what SGLang's own resolution
    refuses among these flags under deterministic inference
    (``resolve.sglang_refusals``: an ``--attention-backend`` outside SGLang's
    deterministic set, even with the plugin disabled), its
    :meth:`~sglang_detspec.config.DetSpecConfig.refusals` (``--tokenizer-worker-num``
    above 1 among them) and, with ``check_hooks`` for a run that is ours, the
    required SGLang symbols the plugin would not find: one message per
    problem, empty when the server would start.

    Raises:
        ValueError: SGLang's parser refuses ``launch_args``, or a bad
            ``SGLANG_DETSPEC_*`` setting in ``environ``.
    """
    from ..sglang_plugin.resolve import bag_from, sglang_backend_switch, sglang_refusals

    ns = read_launch_args(launch_args)
    switched = sglang_backend_switch(ns)
    view = ns if switched is None else argparse.Namespace(**{**vars(ns), "attention_backend": switched})
    bag = bag_from(view, ns.enable_deterministic_inference, "raw_args", environ)
    problems = sglang_refusals(ns) + bag.refusals()
    if bag.ours and check_hooks:
        problems += _hooks_not_in_place()
    return bag, problems


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


def first_clause(note: str) -> str:
    """``note`` up to its first ``;`` outside parentheses, then :data:`CUT_MARK`; the whole note where it has none.

    The notes open with what the server does and follow with the runs and figures behind it, clause by clause;
    the dry run shows the first clause unless ``--verbose``.
    """
    depth = 0
    for i, char in enumerate(note):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == ";" and depth == 0:
            return f"{note[:i]} {CUT_MARK}"
    return note


def dense_assumed_mark(bag: DetSpecConfig) -> str:
    """The claim line's mark where the target's ``config.json`` was not read: :data:`DENSE_ASSUMED`, then what the
    other families of :data:`ASSUMED_FAMILIES` would claim with these flags (the bag's rules, family swapped in)."""
    claims = []
    for family, words in ASSUMED_FAMILIES:
        other = dataclasses.replace(bag, model_family=family)
        if other.refusals():
            claims.append(f"{words} refused at start-up ({', '.join(r.code for r in other.refusals())})")
            continue
        if other.mla_tree_as_chain:  # as start-up serves it
            other = other.as_chain()
        claims.append(f"{words} {other.logits!r}")
    return f"{DENSE_ASSUMED}; {', '.join(claims)}"


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
    """The tensor, data and pipeline parallel sizes above 1 as typed: ``["--tp-size 2", ...]``."""
    sizes = {flag: getattr(ns, name, 1) or 1 for flag, name in (("--tp-size", "tp_size"), ("--dp-size", "dp_size"),
                                                                  ("--pp-size", "pp_size"))}
    return [f"{flag} {size}" for flag, size in sizes.items() if size > 1]


def parallelism_notes(ns: argparse.Namespace) -> list[str]:
    """A note for tensor, data or pipeline parallelism: not measured with the plugin (docs/results.md)."""
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


def _hooks_not_in_place() -> list[str]:
    """The required SGLang symbols the plugin would not find (the server's own check also sees unpatched ones)."""
    from ..sglang_plugin import hook_problems

    return hook_problems(applied=False)


def server_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment with ``SGLANG_PLUGINS`` admitting this plugin."""
    from ..sglang_plugin import ENTRY_POINT_NAME

    env = dict(environ)
    names = [n.strip() for n in env.get("SGLANG_PLUGINS", "").split(",") if n.strip()]
    if names and ENTRY_POINT_NAME not in names:
        env["SGLANG_PLUGINS"] = ",".join([*names, ENTRY_POINT_NAME])
    return env


def dry_run_command(cmd: list[str], env: Mapping[str, str]) -> str:
    """The shell line ``--dry-run`` prints: the ``SGLANG_PLUGINS`` and ``SGLANG_DETSPEC_*`` settings checked, then ``cmd``."""
    from ..config import ENV_PREFIX

    names = sorted(n for n in env if n.startswith(ENV_PREFIX))
    if env.get("SGLANG_PLUGINS"):
        names.insert(0, "SGLANG_PLUGINS")
    return "".join(f"{n}={shlex.quote(env[n])} " for n in names) + shlex.join(cmd)


def plugin_installed() -> bool:
    """True when SGLang's loader can discover the entry point (installed dist metadata)."""
    from importlib.metadata import entry_points

    from ..sglang_plugin import ENTRY_POINT_GROUP, ENTRY_POINT_NAME

    return any(ep.name == ENTRY_POINT_NAME for ep in entry_points(group=ENTRY_POINT_GROUP))


def _why_inactive(bag: DetSpecConfig) -> str:
    from ..config import DISABLE_ENV

    if bag.disabled:
        return f"{DISABLE_ENV}=1 is set"
    if not bag.deterministic:
        return "--enable-deterministic-inference is off"
    return "; ".join(bag.refusals())


def _stderr_columns() -> int:
    """The width of the terminal stderr writes to: ``COLUMNS`` where set, else stderr's own (stdout may be a file
    the printed command goes to), else 80."""
    if os.environ.get("COLUMNS", "").isdigit():
        return int(os.environ["COLUMNS"])
    try:
        return os.get_terminal_size(sys.stderr.fileno()).columns
    except (OSError, ValueError, AttributeError):  # no descriptor (a test's stand-in) or not a terminal
        return shutil.get_terminal_size().columns


def _say(message: str) -> None:
    """One message on stderr; on a terminal wrapped to its width (the notes run to a few hundred words),
    elsewhere written as built (one line, or the lines of a list) so logs and scripts keep each message whole."""
    line = f"detspec: {message}"
    if sys.stderr.isatty():
        width = max(40, _stderr_columns() - 1)
        line = "\n".join(textwrap.fill(part, width, subsequent_indent="    ", break_on_hyphens=False,
                                        break_long_words=False) for part in line.split("\n"))
    print(line, file=sys.stderr)


def _fail(message: str) -> int:
    """Print ``message`` as an error, with the prefix every ``detspec`` error has; exit status 2."""
    _say(f"error: {message}")
    return 2


def _run(args) -> int:
    launch = list(args.launch_args)
    if launch and launch[0] == "--":
        launch = launch[1:]
    if not launch:
        return _fail(f"give SGLang's launch_server arguments after '--', e.g.\n{EXAMPLE}")
    if importlib.util.find_spec("sglang") is None:
        return _fail("SGLang is not installed in this environment (make demo's light venv has none): run "
                     "`make setup` and use .venv/bin/detspec, or pip install sglang==0.5.23")
    if not plugin_installed():
        return _fail("the 'detspec' entry point of group sglang.srt.plugins is not installed; "
                     "install this package (pip install -e <checkout>) so SGLang's loader can find it")
    env = server_env(os.environ)
    if any(a in HELP_FLAGS for a in launch):
        cmd = [sys.executable, "-m", "sglang.launch_server", *launch]  # SGLang prints its own help
    else:
        try:
            cmd = server_command(launch)
            # A dry run may run on another machine than the server's: there a missing path is only noted.
            missing = [] if args.dry_run else missing_model_paths(read_launch_args(cmd[3:]))
            if missing:
                return _fail("; ".join(missing))
            # The symbol check imports every hooked SGLang module (about half a minute on a CPU):
            # --dry-run runs it; a real start leaves it to the server's own start-up check.
            bag, problems = startup_check(cmd[3:], env, check_hooks=args.dry_run)
        except ValueError as exc:
            return _fail(str(exc))
        if problems:
            lines = [f"{p} [refusal: {p.code}]" if hasattr(p, "code") else p for p in problems]
            return _fail("this server would stop at start-up:\n  - " + "\n  - ".join(lines))
        unresolved = record = None
        if args.dry_run:
            refusal, unresolved, record = _sglang_verdict(cmd[3:])
            if refusal:
                # SGLang's rules that read the GPU: its backend pick when none is named, fa4's architecture check
                # (on the typed --attention-backend, whatever the prefill / decode flags add).
                typed = getattr(read_launch_args(cmd[3:]), "attention_backend", None)
                hedge = (" (only a rule that reads the GPU, such as fa4's for an absorbed-MLA target or SGLang's "
                         "pick of a backend, can decide otherwise on the server's GPU)"
                         if typed in (None, "fa4") else "")
                return _fail(f"SGLang's own argument resolution, run here as on a CUDA device, refuses these flags: "
                             f"{refusal}{hedge}")
        if not bag.active:
            _say(f"note: sglang-detspec stays inactive ({_why_inactive(bag)}): SGLang's own sampling runs")
            if unresolved:
                _say(f"note: {unresolved}")
        elif args.dry_run:
            from ..config import TOPK_SHAPE_ALGORITHMS

            if record is not None and (bag.eagle_topk is None or bag.adaptive_steps) and bag.algorithm in (
                    TOPK_SHAPE_ALGORITHMS) and bag.attention_backend is not None:
                # SGLang fills the draft shape (its per-model pick, or an adaptive chain): describe the server its
                # resolution gives, as start-up reads it. Without a backend named the resolution here would have
                # picked this machine's backend, so the flags' bag stays.
                from ..sglang_plugin.resolve import config_from_server_args

                renamed = served_algorithm_note(bag, record)
                _say(f"note: {filled_shape_note(record)}; the line below describes that server"
                     + (f" ({renamed})" if renamed else ""))
                bag = config_from_server_args(record, env)
            elif record is not None:
                renamed = served_algorithm_note(bag, record)
                if renamed:
                    _say(f"note: {renamed}; the line below names the algorithm as typed")
            if bag.mla_tree_as_chain:
                from ..sglang_plugin.startup_notes import mla_chain_note

                # What the server's start-up declares for this tree before SGLang builds anything.
                _say(f"note: {mla_chain_note(bag)}; the command below keeps the flags as typed, the server's "
                     "start-up declares the chain's")
                bag = bag.as_chain()
            if bag.wants_sampled_drafts():
                # What the server's start-up does to this chain wherever SGLang admits the flag.
                bag = dataclasses.replace(bag, rejection_sampling=True)
                _say("note: start-up turns SGLang's sampled-draft path on for this coupled chain: the draft "
                     "samples its proposals instead of taking its argmax (SGLang ties that path to its "
                     "rejection-sampling flag, hence rejection_sampling=True below); verification stays coupled, "
                     "not SGLang's rejection sampling")
            _say(f"flags check passed (the GPU checks run when the server starts): {bag.describe()}")
            ns = read_launch_args(cmd[3:])
            # Right under the claim it qualifies, not at the end of the notes.
            warnings = parallelism_notes(ns)
            for warning in warnings:
                _say(f"warning: {warning}")
            from ..config import REJECTION_ALGORITHMS

            # Without any shape flag SGLang picks all three per model (partial sets are refused above);
            # under --speculative-adaptive it serves a chain.
            picks_shape = bag.algorithm in REJECTION_ALGORITHMS and bag.eagle_topk is None and not bag.adaptive_steps
            if picks_shape and record is not None:
                _say(f"note: {filled_shape_note(record)}; the claim follows from that shape and the backend SGLang "
                     "picks on the server's GPU, which its start-up line states")
            elif picks_shape:
                # The EAGLE drafts: SGLang picks their tree shape from the model's config at start-up
                # (Llama: top-k 4); STANDALONE always gets a chain, NGRAM its BFS breadth (resolved_eagle_topk).
                _say("note: the logits claim above assumes a chain: with --speculative-eagle-topk unset SGLang "
                     "picks the top-k per model at start-up (a tree for some, e.g. Llama's top-k 4), and a tree's "
                     "claim follows the tree rules (bitwise on the split on fa3 and triton, and on fa3 at head "
                     "sizes 65-128 on the FA3 tree default's node path); the server's start-up line states the "
                     "claim and the tree settings it serves")
            if bag.attention_backend is None:
                _say("note: the logits claim above assumes nothing of the attention backend: without "
                     "--attention-backend SGLang picks it on the GPU at start-up (fa3 on Hopper under "
                     "deterministic inference, triton with --kv-cache-dtype fp8_e5m2), and the server's start-up "
                     "line states the claim it serves")
                from ..config import kv_cache_reason

                kv_reason = kv_cache_reason(bag.kv_cache_dtype)
                if kv_reason:  # the KV cache alone decides the claim, whatever the backend turns out to be
                    _say(f"note: on every backend logits='tokens' because of {kv_reason}")
            from ..sglang_plugin.startup_notes import setting_notes, unmeasured_notes
            from ..sglang_plugin.resolve import sglang_backend_switch

            switched = sglang_backend_switch(ns)
            # Explicit --prefill / --decode-attention-backend flags win over the switched one: say it only where
            # the bag (which startup_check built with the switch) serves the switched backend.
            if switched is not None and bag.attention_backend == switched:
                _say(f"note: SGLang serves --attention-backend {ns.attention_backend} with --kv-cache-dtype "
                     f"{ns.kv_cache_dtype} on {switched} (FA3 reads FP8 as e4m3 only): the fields above are "
                     f"{switched}'s")
            dense_assumed = family_unknown_notes(bag, ns)
            notes = (setting_notes(bag) + switch_notes(bag, unmeasured_notes(bag), ns)
                     + prefill_graph_notes(ns, bag.family_traits) + dense_assumed + fa3_head_size_notes(bag)
                     + gemm_warmup_notes(bag) + kv_move_warmup_notes(bag))
            shown = notes if args.verbose else [first_clause(note) for note in notes]
            for note in shown:
                _say(f"note: {note}")
            if shown != notes:
                _say(f"note: notes cut at their first clause end ({CUT_MARK}); --verbose prints them whole, with "
                     "the runs behind each figure")
            # The notes run long: the claim again as the last line before the command, with what qualifies it.
            if unresolved:
                _say(f"note: {unresolved}")
            # The claim is the one-GPU rule's; under parallelism nothing measured it (the warning says why).
            parallel = ", ".join(parallel_sizes(ns))
            marks = ([f"on one GPU; at {parallel} not measured, see the warning above"] * bool(parallel)
                     + [dense_assumed_mark(bag)] * bool(dense_assumed))
            _say(f"claim: logits={bag.logits!r}" + (f" ({'; '.join(marks)})" if marks else ""))
    if args.dry_run:
        print(dry_run_command(cmd, env))
        return 0
    return _serve(cmd, env)


def _sglang_verdict(launch_args: list[str]):
    """What SGLang's own argument resolution, run here, says of the flags: (its refusal or None, why it did not
    run or finish here or None, the resolved ``ServerArgs`` or None)."""
    from ..sglang_plugin.resolve import sglang_resolution

    try:
        refusal, record = sglang_resolution(read_launch_args(launch_args))
        return refusal, None, record
    except LookupError as exc:
        return None, f"SGLang's own argument resolution not run here ({exc}); the server runs it at start-up", None
    except Exception as exc:  # SGLang's resolution, on a machine that is not the server's
        return None, (f"SGLang's own argument resolution did not finish here ({type(exc).__name__}: {exc}); the "
                      "server runs it at start-up"), None


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


def filled_shape_note(record) -> str:
    """The draft shape SGLang's resolution (run here) filled in for flags that leave it to SGLang, as a note."""
    from sglang.srt.arg_groups.overrides import resolved_view

    view = resolved_view(record)
    return (f"SGLang resolves these flags to --speculative-num-steps {view.speculative_num_steps} "
            f"--speculative-eagle-topk {view.speculative_eagle_topk} --speculative-num-draft-tokens "
            f"{view.speculative_num_draft_tokens} for this model (its own resolution, run here)")


def _serve(cmd: list[str], env: Mapping[str, str]) -> int:
    """Run the server; its exit status, or 130 (128 + SIGINT) after Ctrl-C."""
    proc = subprocess.Popen(cmd, env=env)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        # Ctrl-C reached the server too (same process group): give it time to stop its
        # scheduler processes itself (subprocess.call would SIGKILL it and orphan them).
        try:
            proc.wait(timeout=SHUTDOWN_GRACE_S)
        except (subprocess.TimeoutExpired, KeyboardInterrupt):
            proc.terminate()
            proc.wait()
        return 130


def register(subparsers) -> None:
    """Add the ``serve`` subcommand."""
    p = subparsers.add_parser(
        "serve",
        help="launch SGLang's server with sglang-detspec on",
        # argparse's own usage line would hide the '--' that every run needs.
        usage="%(prog)s [-h] [--dry-run [--verbose]] -- LAUNCH_SERVER_ARGS ...",
        description=DESCRIPTION,
        epilog=EPILOG,
        # Keeps the line breaks above: the default formatter would wrap inside the example's flags.
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--dry-run", action="store_true",
                   help="run the checks and print the command instead of running it")
    p.add_argument("--verbose", action="store_true",
                   help="with --dry-run: print each note whole, with the runs and figures behind it (by default a "
                        "note stops at its first clause)")
    p.add_argument("launch_args", nargs=argparse.REMAINDER,
                   help="'--' then the arguments of python -m sglang.launch_server")
    # Without '--', argparse reads SGLang's flags as unknown flags of serve; cli.main adds this hint.
    p.set_defaults(handler=_run, unrecognized_hint=USAGE_HINT)
