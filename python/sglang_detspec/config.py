"""The resolved runtime config bag: resolve once, read everywhere.

Every wired site reads :func:`current_config`; none reads SGLang's server
arguments or the environment on its own. The plugin resolves the bag from
SGLang and pushes it here with :func:`install_config` at definite points of
each process (``sglang_plugin/resolve.py`` says which); this module calls
nothing back. Until then the bag holds the ``SGLANG_DETSPEC_*`` environment
settings and says deterministic sampling is off.

Which runs are ours, and what is refused in them, is decided here and
nowhere else: :attr:`DetSpecConfig.ours`, :meth:`DetSpecConfig.refusals`,
:attr:`DetSpecConfig.active`.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import threading
from collections.abc import Mapping

from .model_family import TRAIT_NAMES, family_claim, label_traits, unmeasured_moe_runner
from .ops.kernel_choice import KERNELS
from .ops.split_limits import MAX_HEAD_DIM as SPLIT_MAX_HEAD_DIM
from .ops.split_limits import MAX_TREE_NODES as SPLIT_MAX_TREE_NODES
from .ops.split_limits import PAGE_SIZE as SPLIT_PAGE_SIZE
from .ops.split_limits import FA3_MAX_HEAD_DIM, PREFIX_SPLIT_MAX_TREE_TOKENS
from .ops.choices import one_of

KERNEL_ENV = "SGLANG_DETSPEC_KERNEL"
DISABLE_ENV = "SGLANG_DETSPEC_DISABLE"
VERIFY_ENV = "SGLANG_DETSPEC_VERIFY"
VERIFY_SETTINGS = ("auto", "coupled", "rejection")
VERIFY_MODES = ("coupled", "rejection")
TREE_ATTENTION_ENV = "SGLANG_DETSPEC_TREE_ATTENTION"
# cascade: SGLang's tree verify attention (FA3: prefix and draft parts merged in bf16);
# nodes: one decode query per tree node over its own key list (sglang_plugin/tree_attention_hook.py).
TREE_ATTENTION_SETTINGS = ("cascade", "nodes")
TREE_CHAIN_BATCH_ENV = "SGLANG_DETSPEC_TREE_CHAIN_BATCH"
# Largest accepted value: SGLang's own batch-size fields stay far below it.
MAX_TREE_CHAIN_BATCH = 1 << 20
TREE_CHAIN_TOKENS_ENV = "SGLANG_DETSPEC_TREE_CHAIN_TOKENS"
# Largest accepted value: far above any KV pool SGLang sizes on one node.
MAX_TREE_CHAIN_TOKENS = 1 << 40
GEMM_WARMUP_ENV = "SGLANG_DETSPEC_GEMM_WARMUP_S"
# Seconds the start-up DeepGEMM warm-up may take (sglang_plugin/gemm_warmup_hook.py); 0 turns it off.
# Bounded because each new kernel is a JIT compile: what the budget leaves compiles at first use
# (and DeepGEMM's on-disk cache carries what was compiled to the next start on the machine).
DEFAULT_GEMM_WARMUP_S = 60.0
MAX_GEMM_WARMUP_S = 3600.0
MOE_TILE_ENV = "SGLANG_DETSPEC_MOE_TILE"
# off (the default): the tile above serves every batch size. checked: SGLang's tuned per-batch-size tables serve
# each expert shape where a start-up check on the server's GPU finds their rows bit for bit the tile's
# (sglang_plugin/moe_tables.py); elsewhere the tile.
MOE_TABLES_ENV = "SGLANG_DETSPEC_MOE_TABLES"
MOE_TABLES_SETTINGS = ("off", "checked")
# The fields of SGLang's fused-MoE Triton config a tile sets, in the order the setting lists them
# (sglang_plugin/moe_tile_hook.py), and the values each may take: tile sides SGLang's tuned tables use,
# a program-grouping width, warps per program and software-pipeline stages.
MOE_TILE_FIELDS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")
MOE_TILE_VALUES = ((16, 32, 64, 128, 256), (16, 32, 64, 128, 256), (16, 32, 64, 128, 256), tuple(range(1, 65)),
                   (1, 2, 4, 8, 16), tuple(range(1, 9)))
# Shared memory a tile's pipeline takes (moe_tile_smem) may not pass Hopper's 227 KiB per block, the most any
# GPU SGLang's Triton MoE runner serves on offers: Triton would refuse the kernel inside the CUDA-graph capture
# instead. Start-up checks the server's own GPU, which may offer less (sglang_plugin/moe_tile_hook.py). The
# estimate counts one A and one B tile per stage, an upper bound: Triton's pipeliner may hold a stage fewer, and
# some of SGLang's tuned H100 tiles pass the bound by this count (not calibrated against compiled kernels).
MOE_TILE_MAX_SMEM = 227 * 1024
MOE_TILE_SMEM_RULE = "num_stages x (BLOCK_SIZE_M x BLOCK_SIZE_K + BLOCK_SIZE_K x BLOCK_SIZE_N) x 2 bytes"
# The tile an unquantized mixture-of-experts target runs with SGLANG_DETSPEC_MOE_TILE unset: the pick of
# benchmark/moe_tile_probe.py on one H100 at a Qwen3-30B-A3B-like expert shape (decode-size calls 0.80x the
# time of SGLang's deterministic tile, 0.99x its tuned tables'; prefill calls of 2,048 / 8,192 tokens 1.14x /
# 1.29x the deterministic tile's: docs/benchmarks/moe_tile_probe/2026-12-07-h100),
# measured on servers (docs/benchmarks/determinism_tax/2026-12-07-h100-moe-tile,
# docs/e2e/2026-12-07-h100-moe-default-tile, -h100-mla-packed-default-tile). 'sglang' keeps SGLang's deterministic
# tile.
DEFAULT_MOE_TILE = (32, 64, 128, 1, 4, 3)
# The top-k a breadth-1 NGRAM draft is claimed as: SGLang pads a short match with root children (a tree).
NGRAM_TREE_TOPK = 2
DECODE_ATTENTION_ENV = "SGLANG_DETSPEC_DECODE_ATTENTION"
# What an MLA target's one-pass decode costs per layer call against SGLang's split-KV MLA decode (one H100, 16 and
# 128 query heads), by how its heads run: in SGLang's tile where the start-up check lets them, else one row per head.
MLA_DECODE_COST = {
    "packed": ("1.08-1.2x SGLang's split-KV decode per layer call at 128 query heads and 32-128 requests, "
               "1.8-7.1x at 16 heads and 32-128 requests, 2.5-14.6x at 1-8 requests, where one program reads a "
               "request's context in order (2,048-8,192 keys; docs/benchmarks/mla_decode/2026-12-07-h100-packed)"),
    "one_row": ("3.8-37x SGLang's split-KV decode per layer call at 2,048-8,192 keys "
                "(docs/benchmarks/mla_decode/2026-12-07-h100)"),
}
# split (the default): decode, prefill, extend and chain and tree verify all run the plugin's
# positional-split kernels on Triton (ops/split_attention.py: split-KV decode with the bits of the prefill, each
# tree node with its path's decode bits; where their start-up check fails the one-pass decode serves and trees
# keep SGLang's verify, 'tokens'), and on FA3 the prefix / tail split (sglang_plugin/fa3_split_hook.py); measured
# bitwise on the H200 (FA3's serving cost: docs/benchmarks/attention_cost/2026-12-05-h200-split). one_pass: on
# Triton the target's decode runs the single-pass kernel its verify and prefill run
# (sglang_plugin/attention_hook.py), so chain logits are bitwise; sglang:
# SGLang's split-KV decode kernel (logits 'tokens' on Triton). On FA3 both keep SGLang's calls.
DECODE_ATTENTION_SETTINGS = ("one_pass", "sglang", "split")
# Every target forward mode through the positional split where the backend has one (triton, fa3): decode =
# prefill = verify bit for bit, trees included; one_pass and sglang turn it off.
DEFAULT_DECODE_ATTENTION = "split"
# The settings whose Triton decode equals the verify's and the prefill's bit for bit.
BITWISE_DECODE_ATTENTION = ("one_pass", "split")
# What the four tree settings are where an FA3 tree server does not qualify for FA3_TREE_DEFAULTS (or sets them).
PLAIN_TREE_DEFAULTS = {"tree_attention": "cascade", "decode_attention": DEFAULT_DECODE_ATTENTION,
                       "tree_chain_batch": 0, "tree_chain_tokens": 0}
# ... and what an FA3 tree server at head sizes 65-128 takes for each it leaves unset
# (DetSpecConfig.takes_fa3_tree_defaults): the switching tree on the node path. On the 8B shape (head size 128)
# it served above the plain tree (the split) and the coupled chain at 1 request and at 4 of 2048 tokens, level with
# them within the rounds' spread at 8 of 2048 tokens, above the chain at 1 and 8 short requests, level with it at 32
# and about 1% below at 128, where both draft the chain (docs/determinism_tax.md, "The token bound on one H100" and
# "The FA3 tree default on servers").
FA3_TREE_DEFAULTS = {"tree_attention": "nodes", "decode_attention": "sglang",
                     "tree_chain_batch": 16, "tree_chain_tokens": 12288}
# Why an MLA target's tree is served as the chain of its depth (DetSpecConfig.mla_tree_as_chain), written once.
MLA_TREE_EVIDENCE = ("on fa3 the tiny DeepSeek-V3 target's tree verify moved every logprob after each sequence's "
                     "first (up to 0.067) and 2 of 8 sequences took other tokens, while its chain gave the decode's "
                     "bits (one H100, docs/e2e/2026-12-07-h100-model-families)")
# ... read from these variables.
TREE_SETTING_ENVS = {"tree_attention": TREE_ATTENTION_ENV, "decode_attention": DECODE_ATTENTION_ENV,
                     "tree_chain_batch": TREE_CHAIN_BATCH_ENV, "tree_chain_tokens": TREE_CHAIN_TOKENS_ENV}
# Settings that no longer exist: setting one is an error, so a run never silently lacks what it asked for.
REMOVED_ENV = {
    "SGLANG_DETSPEC_GEMM": "the plugin's split-K GEMM is no longer part of the package (measured slower than "
                           "SGLang's deterministic GEMM; benchmark/gemm_splitk/ keeps it as an experiment); "
                           "SGLang's own batch-invariant matmul always runs",
}
# A removed setting at the value that was its default asked for what now always happens: accepted, so
# scripts that spelled the old default out keep working.
REMOVED_DEFAULTS = {"SGLANG_DETSPEC_GEMM": "sglang"}
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")
# Every variable name the plugin reads starts so; a name with the prefix outside ENV_NAMES is refused (with the
# nearest name) rather than ignored, so a typo never silently serves the default.
ENV_PREFIX = "SGLANG_DETSPEC_"
ENV_NAMES = (KERNEL_ENV, DISABLE_ENV, VERIFY_ENV, TREE_ATTENTION_ENV, DECODE_ATTENTION_ENV, TREE_CHAIN_BATCH_ENV,
             TREE_CHAIN_TOKENS_ENV, GEMM_WARMUP_ENV, MOE_TILE_ENV, MOE_TABLES_ENV, *REMOVED_ENV)

# Algorithms whose verify and draft go through the hooked SGLang paths, per mode.
# Coupled: everything that verifies through eagle_utils.eagle_sample with the tree
# root at seq_lens (NEXTN is SGLang's alias of EAGLE). Rejection: the chain sampler
# needs a target-vocab draft distribution, which only the EAGLE draft workers give.
COUPLED_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM")
REJECTION_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN")
CHAIN_FLAGS = ("--speculative-num-steps", "--speculative-eagle-topk", "--speculative-num-draft-tokens")
# The algorithms whose trees can draft a chain of their depth (sglang_plugin/shape_hook.py): SGLang's EAGLEWorkerV2
# serves them (NEXTN is SGLang's alias of EAGLE: flags as typed in a dry run still say NEXTN).
SHAPE_SWITCH_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN")
# The algorithms whose tree flags start-up can resolve to a chain (--speculative-eagle-topk 1): every one whose draft
# shape is top-k, steps and draft tokens (NGRAM's comes from its own match flags).
TOPK_SHAPE_ALGORITHMS = SHAPE_SWITCH_ALGORITHMS + ("STANDALONE",)
# Bag fields that mean something only with speculative decoding on (DetSpecConfig.shown_fields).
SPECULATIVE_FIELDS = ("verify", "tree_attention", "num_steps", "eagle_topk", "num_draft_tokens",
                      "rejection_sampling", "multi_layer_eagle", "block_verification", "reduced_draft_vocab",
                      "adaptive_steps", "tree_chain_batch", "tree_chain_tokens")
# ... and only with a draft model (NGRAM copies its drafts from earlier text).
DRAFT_MODEL_FIELDS = ("multi_layer_eagle", "reduced_draft_vocab")


@dataclasses.dataclass(frozen=True)
class DetSpecConfig:
    """Frozen settings every wired site reads.

    Attributes:
        kernel: ``auto`` (Triton on CUDA, torch elsewhere), ``torch`` or
            ``triton``; passed to every op call as its ``kernel`` argument.
        disabled: ``SGLANG_DETSPEC_DISABLE``: keep SGLang's own code even under
            deterministic inference.
        verify: ``coupled`` (drafter-invariant: every emitted token is the
            TARGET-stream race of the target distribution) or ``rejection``
            (seeded rejection sampling, chains only), resolved from
            ``SGLANG_DETSPEC_VERIFY`` by :func:`resolve_verify`.
        deterministic: SGLang's ``enable_deterministic_inference``.
        algorithm: speculative algorithm name (``EAGLE``, ``EAGLE3``, ``NEXTN``,
            ``STANDALONE``, ``NGRAM``, ...) or None when speculative decoding is off.
        num_steps: ``speculative_num_steps`` (draft steps / MTP layers).
        eagle_topk: ``speculative_eagle_topk``.
        num_draft_tokens: ``speculative_num_draft_tokens``.
        adaptive_steps: the draft step counts SGLang's ``--speculative-adaptive``
            switches among with the running batch size and accept rate
            (sorted, 0 = no drafts), from its candidate config; empty when
            adaptive speculation is off. Coupled verify keeps the tokens the
            same whichever count drafts them.
        tree_chain_batch: ``SGLANG_DETSPEC_TREE_CHAIN_BATCH``: a coupled tree
            drafts as a chain of its step count (top-k 1, steps + 1 draft
            tokens) for decode batches of more than this many requests
            (``sglang_plugin/shape_hook.py``); 0 (the default, except on the
            servers of :attr:`takes_fa3_tree_defaults`) keeps the tree at
            every batch size. Coupled verify keeps the tokens the same
            whichever shape drafts them. See :attr:`chain_at_batch` for the
            servers it applies to.
        tree_chain_tokens: ``SGLANG_DETSPEC_TREE_CHAIN_TOKENS``: a coupled
            tree drafts as that chain also for decode batches whose summed
            sequence length (the KV tokens the verify reads, counted on the
            host: ``shape_hook.batch_kv_tokens``) is above this many tokens,
            whatever their request count; 0 (the default, except on the servers
            of :attr:`takes_fa3_tree_defaults`) leaves the shape to the batch
            size alone. See :attr:`chain_at_tokens`.
        gemm_warmup_s: ``SGLANG_DETSPEC_GEMM_WARMUP_S``: seconds the start-up
            warm-up of DeepGEMM's matmul kernels may take under deterministic
            inference (``sglang_plugin/gemm_warmup_hook.py``), in
            [0, :data:`MAX_GEMM_WARMUP_S`]; 0 turns it off. Shown in the
            start-up line only when not :data:`DEFAULT_GEMM_WARMUP_S`.
        moe_tile: ``SGLANG_DETSPEC_MOE_TILE``: one fused-MoE Triton tile
            (the values of :data:`MOE_TILE_FIELDS`, e.g. ``16,128,128,1,4,3``)
            run at every batch size in place of SGLang's deterministic tile
            by an unquantized MoE target (``sglang_plugin/moe_tile_hook.py``);
            unset: :data:`DEFAULT_MOE_TILE`; None (``sglang``) keeps SGLang's.
            Shown in the start-up line for targets that take it and where set
            to another tile.
        moe_tables: ``SGLANG_DETSPEC_MOE_TABLES``: ``off`` (the default) or
            ``checked``: SGLang's tuned fused-MoE tables serve each expert
            shape of a target that takes a tile where a start-up check finds
            their rows bit for bit those of ``moe_tile`` (SGLang's tile where
            that is None) at every batch size where their config changes
            (``sglang_plugin/moe_tables.py``); the tile elsewhere. Shown in
            the start-up line where not ``off``.
        moe_runner: SGLang's ``--moe-runner-backend`` as resolved (``auto``,
            ``triton``, ``flashinfer_cutlass``, ...; None: not read). A
            runner outside ``model_family.MEASURED_MOE_RUNNERS`` makes a
            MoE family claim ``tokens`` and reads no plugin tile; shown in
            the start-up line then (for a target with expert layers).
        moe_a2a: SGLang's ``--moe-a2a-backend`` as resolved (``none``,
            ``deepep``, ``megamoe``, ...; None: not read); the same rule
            with ``model_family.MEASURED_MOE_A2A``.
        rejection_sampling: SGLang's rejection-sampling verify flag.
        multi_layer_eagle: SGLang's multi-layer EAGLE (MTP) flag.
        block_verification: SGLang's block-verification flag (not supported).
        rl_on_policy: SGLang's ``rl_on_policy_target`` is set (not supported: its
            bf16 log-softmax sampling path bypasses the target-sampler hook).
        tokenizer_workers: ``--tokenizer-worker-num`` (more than 1 is not
            supported: SGLang's tokenizer worker processes load no plugins).
        reduced_draft_vocab: the draft proposes over a reduced (hot-token)
            vocabulary (EAGLE3 ``draft_vocab_size``, ``--speculative-token-map``);
            rejection mode cannot serve it.
        tree_attention: ``SGLANG_DETSPEC_TREE_ATTENTION``: ``cascade`` (SGLang's
            tree verify attention; the default, except in the FA3 tree default)
            or ``nodes`` (on FA3, each tree node's verify runs as the decode
            query of that token, so tree verify logits equal decode logits
            bit for bit).
        decode_attention: ``SGLANG_DETSPEC_DECODE_ATTENTION``: ``split``
            (the default, except in the FA3 tree default, which takes
            ``sglang``: every target forward mode runs the positional
            split, Triton's kernels or FA3's prefix / tail split, so decode,
            prefill and chain and tree verify logits agree bit for bit),
            ``one_pass`` (on Triton the target's decode runs the verify's
            single-pass kernel: chains bitwise) or ``sglang`` (SGLang's
            split-KV decode, logits ``tokens`` on Triton); on FA3 both of
            these keep SGLang's calls.
        attention_backend: the target's decode attention backend as SGLang
            resolved it (``triton``, ``fa3``, ...; None when unknown).
        page_size: the KV cache's page size as SGLang resolved it (None when unknown).
        kv_cache_dtype: SGLang's ``--kv-cache-dtype`` (``auto``, ``bf16``, ``fp8_e4m3``, ...;
            None when unknown); any value but ``auto`` claims ``tokens`` (:func:`kv_cache_reason`).
        head_dim: the target's attention head size from its ``config.json``
            (``model_family.head_dim_of``; None when unknown or MLA).
        model_family: the target's family (``model_family.ModelTraits.label``:
            ``dense``, ``moe``, ``mla+moe+fp8``, ...), None when its config was not read.
        source: ``env`` before resolution; ``server_args``, ``raw_args`` or
            ``runtime_context`` after the plugin resolved it from SGLang.
        parallel_reason: the parallel layout that keeps this server's draft
            shape fixed (attention data or pipeline parallelism,
            ``sglang_plugin/shape_rules.parallel_reason``), None otherwise.
        set_tree_settings: which of the four tree settings
            (:data:`TREE_SETTING_ENVS`, in its order) the environment set; the others take
            their server's default (:func:`with_server_defaults`).

    The four tree settings' defaults depend on the server: an FA3 tree at
    head sizes 65-128 takes :data:`FA3_TREE_DEFAULTS` for those unset
    (:attr:`takes_fa3_tree_defaults`), every other server
    :data:`PLAIN_TREE_DEFAULTS`.
    """

    kernel: str = "auto"
    disabled: bool = False
    verify: str = "coupled"
    tree_attention: str = "cascade"
    decode_attention: str = DEFAULT_DECODE_ATTENTION
    deterministic: bool = False
    algorithm: str | None = None
    num_steps: int | None = None
    eagle_topk: int | None = None
    num_draft_tokens: int | None = None
    adaptive_steps: tuple[int, ...] = ()
    tree_chain_batch: int = 0
    tree_chain_tokens: int = 0
    gemm_warmup_s: float = DEFAULT_GEMM_WARMUP_S
    moe_tile: tuple[int, ...] | None = DEFAULT_MOE_TILE
    moe_tables: str = "off"
    moe_runner: str | None = None
    moe_a2a: str | None = None
    rejection_sampling: bool = False
    multi_layer_eagle: bool = False
    block_verification: bool = False
    rl_on_policy: bool = False
    tokenizer_workers: int = 1
    reduced_draft_vocab: bool = False
    attention_backend: str | None = None
    page_size: int | None = None
    kv_cache_dtype: str | None = None
    head_dim: int | None = None
    model_family: str | None = None
    source: str = "env"
    set_tree_settings: tuple[str, ...] = ()
    parallel_reason: str | None = None

    @property
    def ours(self) -> bool:
        """Deterministic inference is on and the plugin is not disabled: the run is ours to check.

        Start-up's question, asked before the refusals are known (they are
        computed only for such runs; the CLI's dry run checks its hooks). No
        hook tests it: hooks test :attr:`active`, which adds "and nothing
        refused". A refused run stops at start-up, so in a serving process
        the two agree.
        """
        return self.deterministic and not self.disabled

    @property
    def coupled(self) -> bool:
        """The verify mode is coupled (docs/design.md, "Coupled verification")."""
        return self.verify == "coupled"

    def refusals(self) -> list[Refusal]:
        """Why an ours run cannot be made deterministic: one :class:`Refusal` per problem, naming what to change.

        Empty for runs that are not ours (SGLang's own code runs for them).
        """
        if not self.ours:
            return []
        problems = []
        algo = self.algorithm
        if self.coupled and algo is not None and algo not in COUPLED_ALGORITHMS:
            problems.append(Refusal("algorithm_not_covered",
                f"--speculative-algorithm {algo} is not covered: its verify does not go through "
                f"eagle_sample with the tree root at seq_lens; use one of {one_of(COUPLED_ALGORITHMS)} "
                "(or set SGLANG_DETSPEC_DISABLE=1 to keep SGLang's own sampling)"
            ))
        if not self.coupled:
            problems.extend(self._rejection_refusals())
        elif self.reduced_draft_vocab and self.rejection_sampling:
            # The user's own flag (start-up never declares it for such drafts): SGLang would refuse it
            # only after loading the weights.
            problems.append(Refusal("reduced_draft_vocab", REDUCED_VOCAB_REFUSAL))
        if self.rl_on_policy:
            problems.append(Refusal("rl_on_policy",
                "--rl-on-policy-target is not supported (its bf16 log-softmax sampling path makes a seeded "
                "request's first token depend on its batch): drop the flag"
            ))
        if self.tokenizer_workers > 1:
            problems.append(Refusal("tokenizer_workers",
                f"--tokenizer-worker-num {self.tokenizer_workers} is not supported: SGLang's tokenizer worker "
                "processes load no plugins, so requests they admit would get no seed checks, no fresh seeds "
                "(every unseeded request would draw with seed 42), identical parallel samples and no "
                "sampling_seed in responses; use --tokenizer-worker-num 1"
            ))
        if self.block_verification:
            problems.append(Refusal("block_verification",
                "--speculative-use-block-verification is not supported (sglang-detspec implements the classic "
                "chain verify and coupled verify): drop the flag"
            ))
        shape = self.draft_shape_problem
        if shape:
            problems.append(Refusal("draft_shape", shape))
        why = self.mla_tree_verify_reason
        if why:
            problems.append(Refusal("mla_tree",
                "an MLA target's tree verify runs SGLang's own MLA tree attention, which is not its decode's "
                f"computation ({MLA_TREE_EVIDENCE}), and this server would verify trees: {why}; draft a chain "
                "with EAGLE or NEXTN (--speculative-num-steps S --speculative-eagle-topk 1 "
                "--speculative-num-draft-tokens S+1)"
            ))
        return problems

    @property
    def draft_shape_problem(self) -> str | None:
        """Which draft-shape flag an EAGLE / EAGLE3 / NEXTN / STANDALONE server lacks, or None.

        SGLang 0.5.23 picks the three shape flags per model only when none is
        given (``_handle_eagle_family``), and stops without a message on the
        others: a bare assertion for ``--speculative-eagle-topk`` or
        ``--speculative-num-draft-tokens`` without ``--speculative-num-steps``,
        a ``TypeError`` for steps without a top-k; a tree without its draft
        tokens passes resolution without the count the tree verify sizes each
        batch by (``EAGLEWorkerV2``).
        Only flags as typed (``source='raw_args'``: the start-up check before
        SGLang's resolution, the dry run) are read: a resolved record always
        has the three. Under ``--speculative-adaptive`` (chains: :attr:`adaptive_steps`)
        SGLang fills the chain's flags itself. An MLA target's tree served as
        its chain gets its draft tokens from start-up (:attr:`mla_tree_as_chain`).
        """
        if self.source != "raw_args" or self.algorithm not in TOPK_SHAPE_ALGORITHMS or self.adaptive_steps:
            return None  # a resolved record carries SGLang's own pick
        given = [flag for flag, value in (("--speculative-eagle-topk", self.eagle_topk),
                                          ("--speculative-num-draft-tokens", self.num_draft_tokens)) if value is not None]
        if self.num_steps is None and given:
            return (f"{' and '.join(given)} without --speculative-num-steps: give the number of draft steps too, or "
                    "none of the three flags (SGLang then picks all three for the model); SGLang 0.5.23 would stop "
                    "here on a bare assertion")
        if self.num_steps is not None and self.eagle_topk is None:
            return ("--speculative-num-steps without --speculative-eagle-topk: give the top-k too (1 for a chain), or "
                    "none of the three flags; SGLang 0.5.23 would stop here on a TypeError")
        if (self.eagle_topk or 1) > 1 and self.num_draft_tokens is None and not self.mla_tree_as_chain:
            return (f"a tree (--speculative-eagle-topk {self.eagle_topk}) without --speculative-num-draft-tokens: "
                    "give the number of draft tokens it verifies (SGLang 0.5.23 resolves such flags without the "
                    "count its tree verify sizes each batch by)")
        return None

    @property
    def mla_tree_verify_reason(self) -> str | None:
        """Why an MLA target's coupled tree server would verify trees, or None.

        None where the target is not MLA, the server verifies no trees, or
        start-up serves the tree as the chain of its depth
        (:attr:`mla_tree_as_chain`), or a tree typed without its depth
        (:attr:`draft_shape_problem` refuses that one). Otherwise one clause:
        NGRAM, whose drafts are verified as trees at any breadth.
        """
        if not self._mla_tree or self.mla_tree_as_chain or self.algorithm in TOPK_SHAPE_ALGORITHMS:
            # A tree typed without its steps: draft_shape_problem names the flag to give.
            return None
        return (f"{self.algorithm} drafts are verified as trees at any breadth (SGLang pads a short match with root "
                "children)")

    @property
    def mla_tree_as_chain(self) -> bool:
        """Whether start-up serves this MLA target's coupled tree as the chain of its depth.

        An MLA target's tree verify runs SGLang's own MLA tree attention
        (neither the positional split nor the node path serves MLA), which is
        not its decode's computation, while its chain verify is
        (:data:`MLA_TREE_EVIDENCE`). Coupled verify makes the tokens
        independent of the draft shape, so start-up resolves such a tree's
        flags to ``--speculative-eagle-topk 1`` and ``num_steps + 1`` draft
        tokens (``sglang_plugin.startup``): the server is the chain server,
        with no tree KV reserve or tree CUDA graphs. Holds for the algorithms
        of :data:`TOPK_SHAPE_ALGORITHMS` with ``num_steps`` given; NGRAM
        servers and trees without their steps are refused instead
        (:attr:`mla_tree_verify_reason`).
        """
        return bool(self._mla_tree and self.algorithm in TOPK_SHAPE_ALGORITHMS and self.num_steps)

    @property
    def _mla_tree(self) -> bool:
        # Not `active`, which reads refusals(), which reads this.
        return bool(self.ours and self.coupled and self.verifies_trees and "mla" in self.family_traits)

    def as_chain(self) -> "DetSpecConfig":
        """This bag with the chain of its depth: ``eagle_topk`` 1 and ``num_steps + 1`` draft tokens.

        What start-up resolves an MLA target's tree to (:attr:`mla_tree_as_chain`).

        Raises:
            ValueError: ``num_steps`` unset (no depth to keep).
        """
        if not self.num_steps:
            raise ValueError(f"num_steps must be set to keep the tree's depth, got {self.num_steps!r}")
        return dataclasses.replace(self, eagle_topk=1, num_draft_tokens=self.num_steps + 1)

    def _rejection_refusals(self) -> list[Refusal]:
        algo = self.algorithm
        if algo is None:
            return []
        problems = []
        if self.reduced_draft_vocab:
            # The flag it would otherwise ask for is refused for such drafts.
            return [Refusal("reduced_draft_vocab", REDUCED_VOCAB_REFUSAL)]
        if not self.rejection_sampling:
            problems.append(Refusal("rejection_needs_flag",
                f"{VERIFY_ENV}=rejection needs --speculative-use-rejection-sampling (SGLang hands the draft "
                f"distributions to the verify only then); add the flag or set {VERIFY_ENV}=coupled"
            ))
        if algo not in REJECTION_ALGORITHMS:
            problems.append(Refusal("rejection_algorithm",
                f"--speculative-algorithm {algo} is not supported in rejection mode; use EAGLE, EAGLE3 or "
                f"NEXTN, or {VERIFY_ENV}=coupled"
            ))
        chain = dict(zip(CHAIN_FLAGS, (self.num_steps, self.eagle_topk, self.num_draft_tokens)))
        unset = [flag for flag, value in chain.items() if value is None]
        if algo in REJECTION_ALGORITHMS and unset:
            # Left unset, SGLang picks the three per model, a tree (topk > 1) for some (Llama: steps
            # 5, topk 4, 8 draft tokens), and then refuses rejection sampling in its own words.
            problems.append(Refusal("rejection_chain_unset",
                f"{', '.join(unset)} not set: rejection mode verifies chains, so give all three, e.g. "
                "--speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4 "
                "(draft tokens = steps + 1)"
            ))
        if self.eagle_topk is not None and int(self.eagle_topk) > 1:
            # The way to coupled verify from here: the flag where it asked for rejection mode, else the setting.
            to_coupled = (f"drop --speculative-use-rejection-sampling (with {VERIFY_ENV} unset or coupled: "
                          "coupled verify serves trees)" if self.rejection_sampling
                          else f"set {VERIFY_ENV}=coupled or unset it (coupled verify serves trees)")
            problems.append(Refusal("rejection_tree",
                f"--speculative-eagle-topk {self.eagle_topk} drafts a tree; rejection mode verifies chains "
                f"only: set --speculative-eagle-topk 1, or {to_coupled}"
            ))
        return problems

    @functools.cached_property
    def active(self) -> bool:
        """True when our seeded streams and request rules replace SGLang's: ours and nothing refused.

        The one test every hook makes before it acts (and the start-up log's "active").

        Cached on the (frozen) bag: hooks on every layer's call (the RMSNorm
        hook) read it, and the refusal rules never change for one bag.
        """
        return self.ours and not self.refusals()

    @property
    def coupled_drafts(self) -> bool:
        """Chain draft proposals race q on the TARGET stream (SGLang's sampled-draft path in coupled mode).

        In coupled mode start-up turns that path on for EAGLE-family chains
        (:meth:`wants_sampled_drafts`) wherever SGLang admits it, so this holds
        for them with or without the user's ``--speculative-use-rejection-sampling``;
        where SGLang refuses it, :attr:`topk_drafts` covers the chain instead.
        """
        return self.active and self.coupled and self.rejection_sampling

    @property
    def topk_drafts(self) -> bool:
        """The plugin draws coupled drafts where SGLang's draft worker picks them by top-k.

        Trees (``topk > 1``: each node's children are q's Gumbel-top-k on the
        TARGET stream), and coupled chains that SGLang's sampled-draft path does
        not serve (its flag stays off, e.g. for a reduced draft vocabulary: the
        chain's draft is then the race winner instead of q's argmax).
        """
        return (self.active and self.coupled and self.algorithm is not None
                and ((self.eagle_topk or 1) > 1 or not self.rejection_sampling))

    @property
    def verifies_trees(self) -> bool:
        """The target verifies draft trees: a speculative algorithm with ``topk > 1``, or NGRAM (SGLang pads a
        short match with root children at any breadth, so its drafts are verified as trees)."""
        return self.algorithm is not None and (self.algorithm == "NGRAM" or (self.eagle_topk or 1) > 1)

    @property
    def chain_at_batch(self) -> int:
        """The batch size above which this tree server drafts as a chain; 0: its tree at every size.

        :attr:`tree_chain_batch` where it applies: an active coupled EAGLE /
        EAGLE3 / NEXTN tree (``topk > 1``, SGLang's ``EAGLEWorkerV2``: not multi-layer
        EAGLE) with a KV page size of 1 (above it SGLang lays a tree's draft
        slots out per branch) and at least ``steps + 1`` draft tokens (SGLang
        sizes the verify's logits buffers to the published draft tokens, and a
        chain of the tree's depth verifies ``steps + 1`` rows per request).
        Coupled verify is what makes the switch free: the tokens do not depend
        on the drafts. The serving process also leaves it off under attention
        data parallelism and pipeline parallelism (``shape_hook.install_shapes``).
        """
        return self.tree_chain_batch if self.can_switch_shape else 0

    @property
    def chain_at_tokens(self) -> int:
        """The summed sequence length (tokens) above which this tree server drafts as a chain; 0: no such bound.

        :attr:`tree_chain_tokens` on the servers :attr:`chain_at_batch`
        applies to. Its reason: the node path (``tree_attention='nodes'``)
        reads each node's whole context, so a tree's verify attention grows
        with the batch's KV length faster than a chain's.
        """
        return self.tree_chain_tokens if self.can_switch_shape else 0

    @property
    def family_traits(self) -> tuple[str, ...]:
        """The target family's traits (``model_family`` split at ``+``: ``("mla", "moe")``); empty when dense or unknown."""
        return label_traits(self.model_family)

    @property
    def moe_tile_chosen(self) -> bool:
        """Whether ``SGLANG_DETSPEC_MOE_TILE`` named a tile other than :data:`DEFAULT_MOE_TILE` (not ``sglang``)."""
        return self.moe_tile not in (None, DEFAULT_MOE_TILE)

    @property
    def moe_tile_skip(self) -> str | None:
        """Why a ``moe_tile`` set to another than :data:`DEFAULT_MOE_TILE` is not applied to this target (one
        clause), or None where it is, or where the setting is the default or ``sglang``.

        A tile applies to a mixture-of-experts target without quantized
        weights on SGLang's Triton MoE runner; an unknown family (None) gets no reason (the hook reads the
        family in the server process, where it is known).
        """
        return self._moe_setting_skip(self.moe_tile_chosen)

    @property
    def moe_tables_skip(self) -> str | None:
        """Why ``moe_tables`` ``checked`` does not apply to this target (one clause), or None where it does, where
        it is ``off``, or where the family is unknown."""
        return self._moe_setting_skip(self.moe_tables == "checked")

    def _moe_setting_skip(self, asked: bool) -> str | None:
        """Why a MoE setting the user ``asked`` for does not apply to this target, or None (not asked, family
        unknown, or the target takes a tile)."""
        if not asked or self.model_family is None or self.takes_moe_tile:
            return None
        if "moe" not in self.family_traits:
            return "this target has no expert layers"
        return self._moe_not_taken

    @property
    def takes_moe_tile(self) -> bool:
        """Whether a ``moe_tile`` would serve this target: expert layers, no quantized weights (traits beyond
        the structural ones of ``model_family.TRAIT_NAMES`` are quantizations) and SGLang's Triton MoE runner
        (``moe_runner`` None, ``auto`` or ``triton``)."""
        traits = set(self.family_traits)
        return "moe" in traits and traits <= set(TRAIT_NAMES) and not self.moe_path_flag

    @property
    def moe_path_flag(self) -> str | None:
        """The MoE flag (``--moe-runner-backend X`` / ``--moe-a2a-backend X``) that serves this target's expert
        layers on a path no run used (``model_family.unmeasured_moe_runner``), or None."""
        return unmeasured_moe_runner(self.model_family, self.moe_runner, self.moe_a2a)

    @property
    def _moe_not_taken(self) -> str:
        """Why an MoE target takes no tile (one clause), for the skip reasons below."""
        if set(self.family_traits) <= set(TRAIT_NAMES):
            return f"{self.moe_path_flag} runs its expert layers on kernels that read no fused-MoE tile"
        return (f"its weights are quantized ({self.model_family}), whose fused-MoE kernels need K tiles that "
                "divide the quantization blocks")

    @property
    def switches_shape(self) -> bool:
        """Whether this server builds the chain state beside its tree: a batch bound or a token bound applies."""
        return bool(self.chain_at_batch or self.chain_at_tokens)

    @property
    def can_switch_shape(self) -> bool:
        """Whether ``SGLANG_DETSPEC_TREE_CHAIN_BATCH`` and ``SGLANG_DETSPEC_TREE_CHAIN_TOKENS`` would apply to
        this server: every condition of :attr:`chain_at_batch` but the settings themselves."""
        return bool(self.active and self.coupled and self.algorithm in SHAPE_SWITCH_ALGORITHMS
                    and (self.eagle_topk or 1) > 1 and self.num_steps and not self.multi_layer_eagle
                    and self.page_size in (None, 1)
                    and (self.num_draft_tokens is None or self.num_draft_tokens >= self.num_steps + 1))

    @property
    def takes_fa3_tree_defaults(self) -> bool:
        """Whether the tree settings this server leaves unset take :data:`FA3_TREE_DEFAULTS`.

        An FA3 server whose tree can draft a chain (:attr:`can_switch_shape`)
        at a target head size of 65-128 (read from its ``config.json``; where
        SGLang's own FA3 decode call and the node path are bitwise,
        :func:`fa3_head_size_reason`), on pages of one token in SGLang's
        default KV dtype, whose family the attention claim speaks for (dense,
        or measured bitwise), and whose parallel layout lets its draft shape
        switch (:attr:`parallel_reason`: elsewhere it would be the node path
        at every batch size). None of the four tree settings enters this
        test, so it holds or not whatever they are.
        """
        if not (self.can_switch_shape and self.parallel_reason is None and self.attention_backend == "fa3"
                and self.head_dim is not None):
            return False
        # Where the node path on SGLang's FA3 calls would claim bitwise (every rule of the claim, written once).
        node_path = dataclasses.replace(self, tree_attention=FA3_TREE_DEFAULTS["tree_attention"],
                                        decode_attention=FA3_TREE_DEFAULTS["decode_attention"])
        return node_path.logits == "bitwise"

    @property
    def fa3_defaults_taken(self) -> tuple[str, ...]:
        """The tree settings this server took from :data:`FA3_TREE_DEFAULTS`, in its order (empty: none)."""
        return tuple(f for f in FA3_TREE_DEFAULTS if self.setting_origin(f) == "the FA3 tree default")

    def setting_origin(self, field: str) -> str:
        """How one of the four tree settings got its value: ``set``, ``the FA3 tree default`` or ``the default``."""
        if field in self.set_tree_settings:
            return "set"
        if self.takes_fa3_tree_defaults and getattr(self, field) == FA3_TREE_DEFAULTS[field]:
            return "the FA3 tree default"
        return "the default"

    @property
    def kv_layout_problem(self) -> str | None:
        """The KV page size or cache dtype that turns down both FA3 paths (the split and the node path) and
        the Triton split, or None: they read pages of one token in SGLang's default KV dtype (``auto``)."""
        if (self.page_size or 1) != 1:
            return f"KV page size {self.page_size}"
        if kv_cache_reason(self.kv_cache_dtype) is not None:
            return f"--kv-cache-dtype {self.kv_cache_dtype}"
        return None

    @property
    def node_path_verifies(self) -> bool:
        """Whether the FA3 node path verifies this server's trees (``tree_attention='nodes'``).

        Where the prefix / tail split serves (``decode_attention='split'``,
        the default, and a tree it takes, :func:`fa3_split_takes`) it verifies
        the trees and the node path stands by; elsewhere the node path serves
        on a KV layout of pages of one token in SGLang's default KV dtype. The
        serving process decides the same from its backend
        (``sglang_plugin/tree_attention_hook.py``), which can also turn it down.
        """
        split_takes = self.decode_attention == "split" and fa3_split_takes(self.eagle_topk, self.num_draft_tokens)
        return bool(self.active and self.tree_attention == "nodes" and self.attention_backend in
                    BITWISE_NODE_TREE_BACKENDS and self.algorithm and (self.eagle_topk or 1) > 1 and not split_takes
                    and self.kv_layout_problem is None)

    def wants_sampled_drafts(self) -> bool:
        """Whether start-up should turn on SGLang's sampled-draft path for this coupled chain.

        SGLang draws chain drafts by sampling (and hands the draft sites seeds
        and positions, also inside draft CUDA graphs) only under its
        rejection-sampling flag; without it a chain drafts q's argmax, which a
        coupled verify at temperature 1 rarely accepts. The flag's verify
        then still runs coupled (the plugin hooks it). Only EAGLE / EAGLE3 /
        NEXTN chains: SGLang refuses the flag for trees (start-up also
        checks what SGLang refuses it for beyond the bag's fields, e.g. a
        reduced draft vocabulary).
        """
        return (self.active and self.coupled and not self.rejection_sampling
                and self.algorithm in REJECTION_ALGORITHMS and self.eagle_topk == 1)

    @property
    def logits(self) -> str:
        """What "spec on = spec off" holds down to here: :func:`logits_guarantee`, then the target family's rule.

        A family no run measured (MoE, MLA, quantized weights: ``model_family.family_claim``) claims ``tokens``.
        """
        return family_claim(self.model_family, self._attention_guarantee()[0], self.attention_backend,
                            self.moe_runner, self.moe_a2a)

    @property
    def logits_reason(self) -> str | None:
        """Why the attention rule gives ``tokens`` (:func:`guarantee_and_reason`), or None where it gives ``bitwise``.

        A family's own ``tokens`` has its note in ``model_family.family_note``.
        """
        return self._attention_guarantee()[1]

    def _attention_guarantee(self) -> tuple[str, str | None]:
        topk = self.eagle_topk if self.algorithm else None
        if self.algorithm == "NGRAM" and (topk or 1) == 1:
            # SGLang pads a short n-gram match with children of the root (its result.cpp), so even a breadth-1
            # NGRAM draft is verified as a tree.
            claim, reason = guarantee_and_reason(self.attention_backend, NGRAM_TREE_TOPK, self.tree_attention,
                                                 self.decode_attention, self.page_size, self.head_dim,
                                                 self.num_draft_tokens, self.kv_cache_dtype)
            tree = reason and reason.replace(f"a tree (top-k {NGRAM_TREE_TOPK})", "a tree")
            return claim, tree and f"NGRAM at breadth 1 (a short match pads its draft with root children): {tree}"
        return guarantee_and_reason(self.attention_backend, topk, self.tree_attention, self.decode_attention,
                                    self.page_size, self.head_dim, self.num_draft_tokens, self.kv_cache_dtype)

    def shown_fields(self) -> dict[str, object]:
        """The fields that apply to this server, by the name :meth:`describe` prints them under.

        Left out: the speculative settings (:data:`SPECULATIVE_FIELDS`) without
        speculative decoding; NGRAM's draft-model fields (it has no draft
        model), and its top-k shown as ``ngram_max_bfs_breadth`` (SGLang sets
        the top-k to that flag whatever ``--speculative-eagle-topk`` says);
        ``decode_attention`` on a known decode backend it does not change
        (neither :data:`ONE_PASS_DECODE_BACKENDS` nor :data:`FA3_SPLIT_BACKENDS`); ``tree_attention`` on a known
        backend other than :data:`BITWISE_NODE_TREE_BACKENDS`, or for a chain;
        ``tree_chain_batch`` for a chain and for NGRAM, ``tree_chain_tokens``
        there and at 0; ``gemm_warmup_s`` at its default; ``moe_tile`` at its default or ``sglang`` for a
        target that does not take a tile (or whose family is unknown); ``moe_tables`` at ``off``. An unknown backend
        or top-k (None: SGLang picks it at start-up) keeps the field.
        """
        skip = set()
        algo, backend, topk = self.algorithm, self.attention_backend, self.eagle_topk
        if algo is None:
            skip.update(SPECULATIVE_FIELDS)
        elif algo == "NGRAM":
            skip.update(DRAFT_MODEL_FIELDS)
        decode_backend = backend.split("/")[-1] if backend else None
        if decode_backend is not None and decode_backend not in ONE_PASS_DECODE_BACKENDS + FA3_SPLIT_BACKENDS:
            skip.add("decode_attention")
        if (backend is not None and backend not in BITWISE_NODE_TREE_BACKENDS) or topk == 1:
            skip.add("tree_attention")
        if topk == 1 or algo == "NGRAM":
            skip.update(("tree_chain_batch", "tree_chain_tokens"))
        if not self.tree_chain_tokens:
            skip.add("tree_chain_tokens")
        if self.gemm_warmup_s == DEFAULT_GEMM_WARMUP_S:
            skip.add("gemm_warmup_s")
        if not (self.moe_tile_chosen or self.takes_moe_tile):
            skip.add("moe_tile")
        if self.moe_tables == "off":
            skip.add("moe_tables")
        unmeasured = unmeasured_moe_runner(self.model_family, self.moe_runner, self.moe_a2a) or ""
        if not unmeasured.startswith("--moe-runner-backend"):
            skip.add("moe_runner")
        if not unmeasured.startswith("--moe-a2a-backend"):
            skip.add("moe_a2a")
        if backend != "fa3":  # the head-size rule reads it on FA3 only
            skip.add("head_dim")
        skip.add("set_tree_settings")  # the start-up note on the FA3 tree defaults says it
        if self.parallel_reason is None or not self.can_switch_shape:  # it speaks of a switching draft shape
            skip.add("parallel_reason")
        if kv_cache_reason(self.kv_cache_dtype) is None:  # auto or unknown: no rule reads it
            skip.add("kv_cache_dtype")
        names = {"eagle_topk": "ngram_max_bfs_breadth"} if algo == "NGRAM" else {}
        return {names.get(f.name, f.name): getattr(self, f.name)
                for f in dataclasses.fields(self) if f.name not in skip}

    def describe(self) -> str:
        """One line with every field that applies to this server (:meth:`shown_fields`), for the start-up log."""
        fields = ", ".join(f"{name}={value!r}" for name, value in self.shown_fields().items())
        claim = f"logits={self.logits!r}, " if self.active else ""  # an inactive run promises nothing
        return f"DetSpecConfig(active={self.active}, {claim}{fields})"


# Attention backends whose target decode, chain verify and prefill forwards give bitwise-equal
# logits in deterministic mode: triton through the plugin's decode hook (attention_hook.py),
# fa3 through the prefix / tail split (the default, FA3_SPLIT_BACKENDS below), or without it through one causal
# call over the same key tiles in all three (at head sizes above FA3_UNMASKED_DECODE_MAX_HEAD_DIM up to
# FA3_CAUSAL_KEPT_MAX_HEAD_DIM only). Measured: docs/e2e/ forward_modes.json; the reading behind it:
# docs/forward_modes.md.
BITWISE_CHAIN_BACKENDS = ("triton", "fa3")
# ... and whose tree verify does too, with SGLANG_DETSPEC_TREE_ATTENTION=nodes (tree_attention_hook.py).
BITWISE_NODE_TREE_BACKENDS = ("fa3",)
# ... whose decode is bitwise only through the plugin's one-pass decode hook (SGLANG_DETSPEC_DECODE_ATTENTION).
ONE_PASS_DECODE_BACKENDS = ("triton",)
# At head sizes up to this FA3 runs a one-row causal call (decode) on its unmasked kernel, whose bits part
# from a prefill's or a verify's past 128 keys (measured on the H200: docs/forward_modes.md; passing such
# calls max_seqlen_q 2 left them as far apart, docs/e2e/2026-12-05-h200-default/), so an FA3 server at such
# a head size without the split claims tokens (guarantee_and_reason).
FA3_UNMASKED_DECODE_MAX_HEAD_DIM = 64
# ... FA3 keeps the causal flag of a one-row call for paged KV from there up to this head size; above it
# FA3 drops the flag again (mha_fwd) and no run has measured decode against prefill.
FA3_CAUSAL_KEPT_MAX_HEAD_DIM = 128
# ... where SGLANG_DETSPEC_DECODE_ATTENTION=split runs every forward mode of the target as two calls over key
# ranges chosen from each row's own length (sglang_plugin/fa3_split_hook.py): trees bitwise, and decode on the
# prefill's causal kernel at every head size (the default, measured bitwise on the H200:
# docs/e2e/2026-12-05-h200-default, serving cost in docs/benchmarks/attention_cost/2026-12-05-h200-split; its
# start-up check decides on each GPU, and where it fails the server keeps SGLang's calls and states the claim that
# leaves). A server that
# verifies no trees at head sizes 65-128 keeps SGLang's own calls instead (fa3_own_calls_exact).
FA3_SPLIT_BACKENDS = ("fa3",)


def logits_guarantee(attention_backend: str | None, eagle_topk: int | None, tree_attention: str = "cascade",
                     decode_attention: str = DEFAULT_DECODE_ATTENTION, page_size: int | None = None,
                     head_dim: int | None = None, num_draft_tokens: int | None = None,
                     kv_cache_dtype: str | None = None) -> str:
    """How far "speculative decoding on = off" holds for a server: ``bitwise`` or ``tokens``.

    ``bitwise``: the target's logits, hence the logprobs and the tokens, are
    the same bits in decode, verify, prefill, re-prefill after a retraction
    and extend after a radix-cache hit (on fa3 with the split, the default, at
    head sizes up to 256; without it at head sizes from
    :data:`FA3_UNMASKED_DECODE_MAX_HEAD_DIM` + 1 to :data:`FA3_CAUSAL_KEPT_MAX_HEAD_DIM`
    only). ``tokens``: the forwards may round one
    logit apart (about one bf16 step), so a token equals the other mode's
    unless its race is a near-tie inside that gap. Trees (``eagle_topk`` > 1)
    are ``tokens`` (their verify masks interleave other branches' keys, or, on
    fa3, merge two partial attentions in bf16) except on fa3 with
    ``tree_attention="nodes"``, where each node's verify is the decode query
    of its token, and with ``decode_attention="split"``: on triton each node's
    verify rows run its token's decode segments, on fa3 each node's two key
    ranges are its decode's (and there the head-size rule does not apply). The
    rule assumes full attention without MLA at SGLang's
    default page size; the hooks log where a model falls outside it
    (``sglang_plugin/attention_hook.py``, ``tree_attention_hook.py``, ``fa3_split_hook.py``).

    Args:
        attention_backend: SGLang's resolved decode attention backend, or None (unknown).
        eagle_topk: ``speculative_eagle_topk``, or None without speculative decoding.
        tree_attention: ``cascade`` or ``nodes`` (:data:`TREE_ATTENTION_SETTINGS`).
        decode_attention: one of :data:`DECODE_ATTENTION_SETTINGS`; with ``sglang`` a Triton server
            keeps SGLang's split-KV decode, which rounds apart from its verify (``one_pass`` and
            ``split`` do not: :data:`BITWISE_DECODE_ATTENTION`); ``split`` on fa3 makes trees bitwise
            and lifts the head-size rule (:data:`FA3_SPLIT_BACKENDS`).
        page_size: the KV cache's page size (None: unknown, taken as SGLang's default of 1). FA3 with
            pages of more than one token is ``tokens``: its paged loads can pick another key tile in
            decode than in prefill (``docs/forward_modes.md``), and that case is not measured.
        head_dim: the target's attention head size (None: unknown, no head-size rule). FA3 at a head
            size up to :data:`FA3_UNMASKED_DECODE_MAX_HEAD_DIM` or above :data:`FA3_CAUSAL_KEPT_MAX_HEAD_DIM`
            is ``tokens`` (:func:`fa3_head_size_reason`).
        num_draft_tokens: draft tokens per verify (None: unknown); with ``split``, Triton trees above the
            kernels' bound are ``tokens`` (:func:`split_tree_rule`).
        kv_cache_dtype: ``--kv-cache-dtype`` (None: unknown, taken as ``auto``); any other value
            is ``tokens`` on every backend (:func:`kv_cache_reason`).
    """
    return guarantee_and_reason(attention_backend, eagle_topk, tree_attention, decode_attention, page_size,
                                head_dim, num_draft_tokens, kv_cache_dtype)[0]


def guarantee_and_reason(attention_backend: str | None, eagle_topk: int | None, tree_attention: str = "cascade",
                         decode_attention: str = DEFAULT_DECODE_ATTENTION, page_size: int | None = None,
                         head_dim: int | None = None, num_draft_tokens: int | None = None,
                         kv_cache_dtype: str | None = None) -> tuple[str, str | None]:
    """:func:`logits_guarantee` (same arguments) and, for ``tokens``, why: one clause naming the rule that applied.

    The reason is None for ``bitwise``. The start-up notes and the dry run
    print it (``sglang_plugin/startup_notes.setting_notes``). The KV-cache rule
    (:func:`kv_cache_reason`) and the head-size rule (:func:`fa3_head_size_reason`)
    apply to what would otherwise be ``bitwise``.
    """
    claim, reason = _backend_and_shape_rule(attention_backend, eagle_topk, tree_attention, decode_attention, page_size,
                                            head_dim, num_draft_tokens)
    kv_reason = kv_cache_reason(kv_cache_dtype)
    if claim == "bitwise" and kv_reason is not None:
        return "tokens", kv_reason
    # Under the prefix / tail split every FA3 call runs the prefill's kernel, at every head size FA3 takes
    # (where the split serves: a tree past its bound runs the node path, under the head-size rule).
    split_serves = decode_attention == "split" and fa3_split_takes(eagle_topk, num_draft_tokens)
    if claim == "bitwise" and attention_backend == "fa3":
        if split_serves:
            reason = (None if head_dim is None or head_dim <= FA3_MAX_HEAD_DIM else
                      f"fa3 at head size {head_dim}: FA3 takes head sizes up to {FA3_MAX_HEAD_DIM}, so the prefix / "
                      "tail split cannot serve it")
        else:
            reason = fa3_head_size_reason(head_dim)
        if reason is not None:
            return "tokens", reason
    return claim, reason


# The --kv-cache-dtype every measured server ran: the KV cache in the model's own dtype ("auto"; a checkpoint whose
# quantization config asks for FP8 KV is a quantized family, 'tokens' by model_family.family_claim).
MEASURED_KV_CACHE_DTYPE = "auto"
# ... and the names SGLang takes for a 16-bit (not quantized) KV cache given explicitly.
EXPLICIT_16_BIT_KV_CACHE_DTYPES = ("bf16", "bfloat16")


def kv_cache_reason(kv_cache_dtype: str | None) -> str | None:
    """Why a server with this ``--kv-cache-dtype`` claims ``tokens``, or None (unknown, or ``auto``).

    The plugin's exact attention paths (the positional splits, the FA3 node
    path, the Triton one-pass decode's packed tile) read a KV cache in the
    model's 16-bit dtype; the FA3 paths take SGLang's ``auto`` only
    (``sglang_plugin/fa3_split.backend_problem``); SGLang's own calls on a
    quantized KV cache (fp8, fp4: descaled loads) have not been measured
    decode against prefill or verify. So any value but ``auto`` claims
    ``tokens`` (an explicit ``bf16`` too: no server has run it).
    """
    if kv_cache_dtype is None or kv_cache_dtype == MEASURED_KV_CACHE_DTYPE:
        return None
    if kv_cache_dtype in EXPLICIT_16_BIT_KV_CACHE_DTYPES:
        why = "no server has run an explicit 16-bit KV cache, and the FA3 paths take auto only"
    else:
        why = "SGLang's own calls on a quantized KV cache (descaled loads) are not measured decode against prefill"
    return (f"--kv-cache-dtype {kv_cache_dtype}: the plugin's exact attention paths are measured with SGLang's "
            f"default KV cache (auto, the model's own dtype) only; {why}")


def fa3_split_takes(eagle_topk: int | None, num_draft_tokens: int | None) -> bool:
    """Whether the FA3 prefix / tail split serves this draft shape: chains, and trees of at most
    :data:`PREFIX_SPLIT_MAX_TREE_TOKENS` draft tokens (every node within its request's cached prefix's
    reach). An unknown token count (None) takes no rule; the server's start-up hook decides from its own."""
    return (eagle_topk or 1) <= 1 or num_draft_tokens is None or num_draft_tokens <= PREFIX_SPLIT_MAX_TREE_TOKENS


def fa3_own_calls_exact(head_dim: int | None, verifies_trees: bool) -> bool:
    """Whether SGLang's own FA3 calls are one arithmetic for this target, so the prefix / tail split stands down.

    A target that verifies no trees (a chain, or no speculative decoding) at a head size from
    :data:`FA3_UNMASKED_DECODE_MAX_HEAD_DIM` + 1 to :data:`FA3_CAUSAL_KEPT_MAX_HEAD_DIM`: there FA3 runs decode,
    prefill, chunked prefill and a chain's verify on its causal kernel over the same key tiles (0 rows apart
    at head size 128 in the kernel probe, ``docs/benchmarks/fa3_chunk_probe/``), so the split would add cost
    (up to 1.21x SGLang's inter-token latency on the 8B shape) and change no claim. Each server's start-up
    check of SGLang's calls decides on its GPU (``sglang_plugin/fa3_own_calls.py``); where it finds a row
    apart the split serves. An unknown head size (None) is not taken: the server decides from its own.
    """
    return (not verifies_trees and head_dim is not None
            and FA3_UNMASKED_DECODE_MAX_HEAD_DIM < head_dim <= FA3_CAUSAL_KEPT_MAX_HEAD_DIM)


def fa3_head_size_reason(head_dim: int | None) -> str | None:
    """Why an FA3 server at this target head size claims ``tokens``, or None where FA3 is ``bitwise``.

    FA3 drops the causal flag of a one-row (decode) call at head sizes up to
    :data:`FA3_UNMASKED_DECODE_MAX_HEAD_DIM` and above :data:`FA3_CAUSAL_KEPT_MAX_HEAD_DIM`
    (its ``mha_fwd``): at 64 its decode parted from a prefill past 128 keys on
    the H200, also with ``max_seqlen_q`` 2 passed to keep the flag; above 128
    nothing is measured. None (unknown head size): no rule, as for an
    unread config's family (the dry run notes it).
    """
    if head_dim is None or FA3_UNMASKED_DECODE_MAX_HEAD_DIM < head_dim <= FA3_CAUSAL_KEPT_MAX_HEAD_DIM:
        return None
    if head_dim <= FA3_UNMASKED_DECODE_MAX_HEAD_DIM:
        return (f"fa3 at head size {head_dim} (<= {FA3_UNMASKED_DECODE_MAX_HEAD_DIM}): FA3 runs a decode step on "
                "another kernel than a prefill or a verify there, and their bits part past 128 keys "
                "(docs/forward_modes.md); the prefix / tail split (SGLANG_DETSPEC_DECODE_ATTENTION=split, the "
                "default) and Triton chains are bitwise at every head size up to 256")
    return (f"fa3 at head size {head_dim} (> {FA3_CAUSAL_KEPT_MAX_HEAD_DIM}): FA3 runs a decode step on another "
            "kernel than a prefill there too, and decode against prefill is not measured at that size "
            "(docs/forward_modes.md); the prefix / tail split (SGLANG_DETSPEC_DECODE_ATTENTION=split, the default) "
            "and Triton chains are bitwise at every head size up to 256")


def split_tree_rule(page_size: int | None, head_dim: int | None,
                    num_draft_tokens: int | None = None) -> tuple[str, str | None]:
    """A Triton tree's claim with ``SGLANG_DETSPEC_DECODE_ATTENTION=split``: ``bitwise`` where the kernels run.

    Each node's verify rows run its decode's segments (``ops/split_attention.py``)
    at pages of one token, head sizes and draft tokens up to the kernels'
    bounds (``ops/split_limits.py``); elsewhere the server keeps SGLang's
    tree verify.
    An unknown head size (None) takes no rule; the start-up check settles the
    rest and lowers the claim where it fails (``sglang_plugin/attention_hook.py``).
    """
    if (page_size or 1) != SPLIT_PAGE_SIZE:
        return "tokens", (f"a tree on triton with a KV page size of {page_size}: the split kernels read pages of "
                          f"{SPLIT_PAGE_SIZE} token, so the server keeps the one-pass decode and SGLang's tree verify")
    if head_dim is not None and head_dim > SPLIT_MAX_HEAD_DIM:
        return "tokens", (f"a tree on triton at head size {head_dim}: the split kernels take head sizes up to "
                          f"{SPLIT_MAX_HEAD_DIM}, so the server keeps the one-pass decode and SGLang's tree verify")
    if num_draft_tokens is not None and num_draft_tokens > SPLIT_MAX_TREE_NODES:
        return "tokens", (f"a tree of {num_draft_tokens} draft tokens on triton: the split kernels verify at most "
                          f"{SPLIT_MAX_TREE_NODES}, so the server keeps the one-pass decode and SGLang's tree verify")
    return "bitwise", None


def _backend_and_shape_rule(attention_backend: str | None, eagle_topk: int | None, tree_attention: str,
                            decode_attention: str, page_size: int | None, head_dim: int | None = None,
                            num_draft_tokens: int | None = None) -> tuple[str, str | None]:
    """The claim from the backend, the page size, the decode kernel and the draft shape (no FA3 head-size rule)."""
    if attention_backend not in BITWISE_CHAIN_BACKENDS:
        proven = " or ".join(BITWISE_CHAIN_BACKENDS)
        if attention_backend is not None and "/" in attention_backend:
            return "tokens", (f"prefill / decode attention {attention_backend}: two backends, which round apart; "
                              f"bitwise verify = decode is proven only where one backend, {proven}, serves every "
                              "forward mode")
        which = "no attention backend named yet" if attention_backend is None else f"{attention_backend} attention"
        return "tokens", (f"{which}: bitwise verify = decode is proven on {' and '.join(BITWISE_CHAIN_BACKENDS)} "
                          "only")
    # The claimed bitwise runs used KV pages of one token (SGLang's default). FA3's decode and prefill were seen to
    # tile keys apart at pages of 128 tokens; Triton's single-pass kernels tile keys by index whatever the page,
    # and the Triton forward-mode matrix at pages of 16 tokens was 0 apart on the tiny models' head size of 64
    # (docs/e2e/2026-12-07-h100-triton-page16-claims): one page size at one head size, no rule yet (a tree:
    # split_tree_rule below).
    if (page_size or 1) > SPLIT_PAGE_SIZE and attention_backend in FA3_SPLIT_BACKENDS:
        return "tokens", (f"{attention_backend} with a KV page size of {page_size}: decode and prefill were seen to "
                          "tile keys apart at pages of 128 tokens, smaller pages are not measured, and the prefix / "
                          "tail split and the node path read pages of one token (bitwise needs a page size of 1)")
    if (page_size or 1) > SPLIT_PAGE_SIZE and attention_backend in ONE_PASS_DECODE_BACKENDS and (eagle_topk or 1) == 1:
        return "tokens", (f"a chain on {attention_backend} with a KV page size of {page_size}: measured only at pages "
                          "of 16 tokens on one head size (64; 0 apart in every forward mode, "
                          "docs/e2e/2026-12-07-h100-triton-page16-claims), which makes no rule for other page or "
                          "head sizes; the single-pass kernels tile keys by index whatever the page"
                          + ("; the positional split reads pages of one token" if decode_attention == "split" else ""))
    if attention_backend in ONE_PASS_DECODE_BACKENDS and decode_attention not in BITWISE_DECODE_ATTENTION:
        return "tokens", (f"SGLANG_DETSPEC_DECODE_ATTENTION={decode_attention}: SGLang's split-KV decode rounds "
                          "apart from its verify")
    if (eagle_topk or 1) == 1:
        return "bitwise", None
    if attention_backend in ONE_PASS_DECODE_BACKENDS and decode_attention == "split":
        return split_tree_rule(page_size, head_dim, num_draft_tokens)
    if attention_backend in FA3_SPLIT_BACKENDS and decode_attention == "split":
        if fa3_split_takes(eagle_topk, num_draft_tokens):
            return "bitwise", None  # each node over its decode's two key ranges (sglang_plugin/fa3_split_hook.py)
        if tree_attention != "nodes":
            return "tokens", (f"a tree of {num_draft_tokens} draft tokens on fa3: the prefix / tail split covers "
                              f"trees of up to {PREFIX_SPLIT_MAX_TREE_TOKENS}, so the server keeps SGLang's cascade")
        # ... and where it declines, the node path asked for serves (below).
    if tree_attention == "nodes" and attention_backend in BITWISE_NODE_TREE_BACKENDS:
        return "bitwise", None
    if attention_backend in BITWISE_NODE_TREE_BACKENDS:
        return "tokens", (f"a tree (top-k {eagle_topk}) verified with SGLang's cascade attention: "
                          "SGLANG_DETSPEC_DECODE_ATTENTION=split makes it bitwise at head sizes up to 256, "
                          "SGLANG_DETSPEC_TREE_ATTENTION=nodes at head sizes 65 to 128")
    hint = ("; SGLANG_DETSPEC_DECODE_ATTENTION=split makes it bitwise"
            if attention_backend in ONE_PASS_DECODE_BACKENDS else "")
    return "tokens", (f"a tree (top-k {eagle_topk}) on {attention_backend}: its verify mask interleaves other "
                      f"branches' keys{hint}")


class Refusal(str):
    """A refusal: its message (it is that ``str``) and a stable machine-readable :attr:`code`.

    Codes name the rule, not the wording, so clients and tests can match them
    while the message is free to change: ``algorithm_not_covered``,
    ``reduced_draft_vocab``, ``rl_on_policy``, ``tokenizer_workers``,
    ``block_verification``, ``rejection_needs_flag``, ``rejection_algorithm``,
    ``rejection_chain_unset``, ``rejection_tree``, ``draft_shape``, ``mla_tree``; and ``attention_backend``,
    SGLang's own refusal as ``detspec serve`` states it up front
    (``sglang_plugin/resolve.py``, ``sglang_refusals``).
    """

    code: str

    def __new__(cls, code: str, message: str) -> "Refusal":
        obj = super().__new__(cls, message)
        obj.code = code
        return obj

    def __getnewargs__(self) -> tuple[str, str]:  # pickling (str would pass the message alone)
        return self.code, str(self)


REDUCED_VOCAB_REFUSAL = (
    "the draft proposes over a reduced vocabulary (EAGLE3 draft_vocab_size or --speculative-token-map): "
    "rejection sampling needs q over the target's whole vocabulary, and SGLang refuses "
    "--speculative-use-rejection-sampling for such drafts; use coupled mode (the default), which serves "
    f"them: drop --speculative-use-rejection-sampling and leave {VERIFY_ENV} unset (or set it to coupled)"
)


def resolve_verify(setting: str, rejection_sampling: bool) -> str:
    """The verify mode for an ``SGLANG_DETSPEC_VERIFY`` setting.

    ``auto`` gives ``rejection`` when SGLang's rejection-sampling flag is on
    (SGLang then hands the draft distributions to the verify), else ``coupled``.

    Raises:
        ValueError: ``setting`` not in auto|coupled|rejection.
    """
    if setting not in VERIFY_SETTINGS:
        raise ValueError(f"{VERIFY_ENV} must be one of {one_of(VERIFY_SETTINGS)}, got {setting!r}")
    if setting == "auto":
        return "rejection" if rejection_sampling else "coupled"
    return setting


def _word(env: Mapping[str, str], name: str, default: str, allowed: tuple[str, ...]) -> str:
    value = env.get(name, default).strip().lower() or default
    if value not in allowed:
        # An empty value always reads as the default, so it is no word to offer.
        raise ValueError(f"{name} must be one of {one_of(a for a in allowed if a)}, got {env.get(name)!r}")
    return value


# A variable whose name is a setting's suffix behind a prefix within the edits (Levenshtein) given here of one of
# these prefixes is taken for a typo of that setting (SGLANG_DETPSEC_VERIFY, SGLAN_DETSPEC_VERIFY,
# SGL_DETSPEC_VERIFY, DETSPEC_VERIFY, lower case); DETSPEC_E2E_VERIFY (4 edits from DETSPEC_) and
# MY_DETSPEC_VERIFY (3) are other programs' names. SGL_DETSPEC_ (SGLang's older SGL_ spelling) is a prefix of
# its own: the 3 edits it lies from SGLANG_DETSPEC_ would also take SGLang's SGLANG_SPEC_* names for settings.
MISSPELT_PREFIXES = {ENV_PREFIX: 2, ENV_PREFIX.removeprefix("SGLANG_"): 2, "SGL_DETSPEC_": 1}


def _edits(a: str, b: str) -> int:
    """Levenshtein distance between ``a`` and ``b`` (insertions, deletions, substitutions)."""
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (x != y))
    return row[-1]


def misspelt_setting(name: str) -> str | None:
    """The setting ``name`` was meant as, where it is a setting's suffix behind a misspelt prefix; else None.

    Case is ignored; the prefix must be within its number of edits of one of
    :data:`MISSPELT_PREFIXES` (so ``SGLANG_DETSPEC_VERIFY`` typed in lower case, ``SGLANGDETSPEC_VERIFY``
    and ``DETSPEC_VERIFY`` are found, ``DETSPEC_E2E_VERIFY`` is not). A name of :data:`ENV_NAMES` gives None.
    """
    if name in ENV_NAMES:
        return None
    upper = name.upper()
    for setting in sorted((n for n in ENV_NAMES if n not in REMOVED_ENV), key=len, reverse=True):
        suffix = setting.removeprefix(ENV_PREFIX)
        if upper.endswith(suffix) and any(_edits(upper[:-len(suffix)], p) <= edits
                                          for p, edits in MISSPELT_PREFIXES.items()):
            return setting
    return None


def unknown_env_names(environ: Mapping[str, str]) -> list[str]:
    """One message per variable of ``environ`` meant as a setting that the plugin does not read; in name order.

    Meant as a setting: named ``SGLANG_DETSPEC_*`` but not in :data:`ENV_NAMES`, or
    a setting's name with its prefix misspelt (:func:`misspelt_setting`). Each
    message names the nearest setting where one is close (difflib's ratio after the prefix).
    """
    import difflib

    current = [name for name in ENV_NAMES if name not in REMOVED_ENV]
    # Compared without the prefix every name shares, which would make any two names look close.
    suffixes = {name.removeprefix(ENV_PREFIX): name for name in current}
    messages = []
    for name in sorted(n for n in environ if n not in ENV_NAMES):
        if name.startswith(ENV_PREFIX):
            near = [suffixes[n] for n in
                    difflib.get_close_matches(name.removeprefix(ENV_PREFIX).upper(), suffixes, n=1, cutoff=0.7)]
        else:
            near = [meant] if (meant := misspelt_setting(name)) else []
            if not near:
                continue
        hint = f"did you mean {near[0]}? " if near else ""
        messages.append(f"{name} is not a setting of sglang-detspec ({hint}its settings: {', '.join(current)})")
    return messages


def env_settings(environ: Mapping[str, str] | None = None) -> dict:
    """The plugin's own ``SGLANG_DETSPEC_*`` settings, checked.

    Returns ``{"kernel", "disabled", "verify", "tree_attention", "decode_attention", "tree_chain_batch",
    "tree_chain_tokens", "gemm_warmup_s", "moe_tile", "moe_tables", "set_tree_settings"}`` with ``verify`` as set
    (``auto`` unresolved; see :func:`resolve_verify`), the four tree settings at their plain defaults where unset (the server's own
    defaults come with :func:`with_server_defaults`) and ``set_tree_settings`` naming those set.

    Raises:
        ValueError: ``SGLANG_DETSPEC_KERNEL`` not in auto|torch|triton,
            ``SGLANG_DETSPEC_DISABLE`` not a boolean word,
            ``SGLANG_DETSPEC_VERIFY`` not in auto|coupled|rejection,
            ``SGLANG_DETSPEC_TREE_ATTENTION`` not in cascade|nodes,
            ``SGLANG_DETSPEC_DECODE_ATTENTION`` not in one_pass|sglang|split,
            ``SGLANG_DETSPEC_TREE_CHAIN_BATCH`` not an integer in
            [0, :data:`MAX_TREE_CHAIN_BATCH`],
            ``SGLANG_DETSPEC_TREE_CHAIN_TOKENS`` not an integer in
            [0, :data:`MAX_TREE_CHAIN_TOKENS`],
            ``SGLANG_DETSPEC_GEMM_WARMUP_S`` not a number of seconds in
            [0, :data:`MAX_GEMM_WARMUP_S`],
            ``SGLANG_DETSPEC_MOE_TILE`` neither ``sglang`` nor six integers
            each in its range of :data:`MOE_TILE_VALUES` whose pipeline fits
            :data:`MOE_TILE_MAX_SMEM`,
            ``SGLANG_DETSPEC_MOE_TABLES`` not in off|checked, or
            a removed setting (:data:`REMOVED_ENV`) set to anything but
            its old default (:data:`REMOVED_DEFAULTS`, accepted: it asks for
            what now always runs), or a ``SGLANG_DETSPEC_*`` name outside
            :data:`ENV_NAMES` (:func:`unknown_env_names`). Every wrong
            setting is named in the one error, one per line after the first
            where there are several.
    """
    env = os.environ if environ is None else environ
    problems = [f"{name} is set ({env[name]!r}) but was removed: {why}; unset it"
                for name, why in REMOVED_ENV.items()
                if name in env and env[name].strip().lower() != REMOVED_DEFAULTS.get(name)]
    problems += unknown_env_names(env)

    def checked(read, *args):
        try:
            return read(*args)
        except ValueError as exc:  # every wrong setting in one message, not one per attempt
            problems.append(str(exc))
            return None

    settings = {
        "kernel": checked(_word, env, KERNEL_ENV, "auto", KERNELS),
        "disabled": checked(_word, env, DISABLE_ENV, "", _TRUE + _FALSE) in _TRUE,
        "verify": checked(_word, env, VERIFY_ENV, "auto", VERIFY_SETTINGS),
        "tree_attention": checked(_word, env, TREE_ATTENTION_ENV, PLAIN_TREE_DEFAULTS["tree_attention"],
                                  TREE_ATTENTION_SETTINGS),
        "decode_attention": checked(_word, env, DECODE_ATTENTION_ENV, PLAIN_TREE_DEFAULTS["decode_attention"],
                                    DECODE_ATTENTION_SETTINGS),
        "tree_chain_batch": checked(_count, env, TREE_CHAIN_BATCH_ENV, MAX_TREE_CHAIN_BATCH, "batch size"),
        "tree_chain_tokens": checked(_count, env, TREE_CHAIN_TOKENS_ENV, MAX_TREE_CHAIN_TOKENS, "token count"),
        "gemm_warmup_s": checked(_seconds, env, GEMM_WARMUP_ENV, DEFAULT_GEMM_WARMUP_S, MAX_GEMM_WARMUP_S),
        "moe_tile": checked(_moe_tile, env),
        "moe_tables": checked(_word, env, MOE_TABLES_ENV, "off", MOE_TABLES_SETTINGS),
        "set_tree_settings": tuple(field for field, name in TREE_SETTING_ENVS.items() if env.get(name, "").strip()),
    }
    if len(problems) == 1:
        raise ValueError(problems[0])
    if problems:
        raise ValueError(f"{len(problems)} sglang-detspec settings are wrong:\n  - " + "\n  - ".join(problems))
    return settings


def with_server_defaults(config: DetSpecConfig) -> DetSpecConfig:
    """``config`` with each tree setting the environment left unset at its server's default.

    Where :attr:`DetSpecConfig.takes_fa3_tree_defaults` holds, the unset
    settings complete the node path: tree attention ``nodes``, decode
    attention ``sglang`` beside it (the split otherwise), and the two bounds of
    :data:`FA3_TREE_DEFAULTS` only where the node path then verifies the
    trees (tree attention ``nodes`` and a decode attention other than
    ``split``, which would verify them itself). So a tree attention set to
    ``cascade``, or a decode attention set to ``split``, with the others
    unset, gives the plain tree, the configuration measured beside it.
    Elsewhere the unset settings take :data:`PLAIN_TREE_DEFAULTS`. Settings
    in ``config.set_tree_settings`` keep their value. Idempotent, and it
    reads no unset tree setting to decide, so it may run again after the
    backend or head size is filled in.

    Args:
        config: a bag whose ``set_tree_settings`` says which of the four the environment set.

    Returns:
        The same bag where nothing changes, else a copy with the unset settings replaced.
    """
    unset = [field for field in FA3_TREE_DEFAULTS if field not in config.set_tree_settings]
    values = {field: PLAIN_TREE_DEFAULTS[field] for field in unset}
    if config.takes_fa3_tree_defaults:
        def chosen(field):
            return values[field] if field in values else getattr(config, field)

        split_set = "decode_attention" not in values and config.decode_attention == PLAIN_TREE_DEFAULTS["decode_attention"]
        if "tree_attention" in values and not split_set:  # the split asked for verifies the trees: no node path
            values["tree_attention"] = FA3_TREE_DEFAULTS["tree_attention"]
        nodes = chosen("tree_attention") == FA3_TREE_DEFAULTS["tree_attention"]
        if "decode_attention" in values and nodes:
            values["decode_attention"] = FA3_TREE_DEFAULTS["decode_attention"]
        if nodes and chosen("decode_attention") != PLAIN_TREE_DEFAULTS["decode_attention"]:
            for bound in ("tree_chain_batch", "tree_chain_tokens"):
                if bound in values:
                    values[bound] = FA3_TREE_DEFAULTS[bound]
    if all(getattr(config, field) == value for field, value in values.items()):
        return config
    return dataclasses.replace(config, **values)


def switch_settings(batch: int, tokens: int = 0) -> str:
    """The draft-shape switching settings as set, for notes: ``SGLANG_DETSPEC_TREE_CHAIN_BATCH=16``, the token
    bound's, or both joined by "and"; "" for neither."""
    parts = [f"{TREE_CHAIN_BATCH_ENV}={batch}"] if batch else []
    parts += [f"{TREE_CHAIN_TOKENS_ENV}={tokens}"] if tokens else []
    return " and ".join(parts)


def _count(env: Mapping[str, str], name: str, bound: int, what: str) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return 0
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if not 0 <= value <= bound:
        raise ValueError(f"{name} must be an integer {what} in [0, {bound}] (0: off), got {raw!r}")
    return value


def _seconds(env: Mapping[str, str], name: str, default: float, bound: float) -> float:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= bound:  # NaN fails both
        raise ValueError(f"{name} must be a number of seconds in [0, {bound:g}] (0: off), got {raw!r}")
    return value


def moe_tile_smem(tile: tuple[int, ...]) -> int:
    """Bytes of shared memory the fused-MoE kernel's pipeline takes with ``tile`` (six integers in
    :data:`MOE_TILE_FIELDS` order), estimated by :data:`MOE_TILE_SMEM_RULE` (an A and a B tile of bf16 per
    stage: an upper bound, since Triton's pipeliner may hold a stage fewer).

    Raises:
        ValueError: ``tile`` does not hold six values.
    """
    m, n, k, _, _, stages = tile
    return stages * (m * k + k * n) * 2


def moe_tile_problem(tile: tuple[int, ...]) -> str | None:
    """Why ``tile`` (six integers in :data:`MOE_TILE_FIELDS` order) cannot be a fused-MoE tile here, or None.

    Each value must be in its range of :data:`MOE_TILE_VALUES`, and the pipeline's shared memory
    (:func:`moe_tile_smem`) at most :data:`MOE_TILE_MAX_SMEM`.
    """
    for name, value, allowed in zip(MOE_TILE_FIELDS, tile, MOE_TILE_VALUES):
        if value not in allowed:
            bound = f"in [{allowed[0]}, {allowed[-1]}]" if allowed == tuple(range(allowed[0], allowed[-1] + 1)) \
                else f"one of {one_of(allowed)}"
            return f"{name} must be {bound}, got {value}"
    smem = moe_tile_smem(tile)
    if smem > MOE_TILE_MAX_SMEM:
        return (f"{MOE_TILE_SMEM_RULE} must be at most {MOE_TILE_MAX_SMEM} ({MOE_TILE_MAX_SMEM // 1024} KiB of shared "
                f"memory), got {smem}")
    return None


def _moe_tile(env: Mapping[str, str]) -> tuple[int, ...] | None:
    raw = env.get(MOE_TILE_ENV, "").strip()
    if not raw:
        return DEFAULT_MOE_TILE
    if raw.lower() == "sglang":
        return None
    parts = [p.strip() for p in raw.split(",")]
    if len(parts) != len(MOE_TILE_FIELDS) or not all(p.isascii() and p.isdigit() for p in parts):
        raise ValueError(f"{MOE_TILE_ENV} must be 'sglang' or six integers {','.join(MOE_TILE_FIELDS)}, got {raw!r}")
    tile = tuple(int(p) for p in parts)
    problem = moe_tile_problem(tile)
    if problem:
        raise ValueError(f"{MOE_TILE_ENV}: {problem} (in {raw!r})")
    return tile


_lock = threading.Lock()
_current: DetSpecConfig | None = None


def current_config() -> DetSpecConfig:
    """The bag in force; the one getter every wired site reads.

    The bag the plugin installed with :func:`install_config`, else the
    environment-only bag (inactive), built from the ``SGLANG_DETSPEC_*``
    settings on first read and kept until a bag is installed.

    Raises:
        ValueError: no bag is installed and a ``SGLANG_DETSPEC_*`` setting is bad.
    """
    global _current
    bag = _current
    if bag is not None:
        return bag
    with _lock:
        if _current is None:
            settings = env_settings()
            settings["verify"] = resolve_verify(settings["verify"], False)
            _current = DetSpecConfig(**settings)
        return _current


def install_config(config: DetSpecConfig) -> DetSpecConfig:
    """Make ``config`` the bag in force, replacing any before it.

    The plugin calls this where it resolves the bag: in the launcher after
    SGLang resolves its arguments, and in every process when SGLang publishes
    its runtime context.

    Raises:
        ValueError: ``config`` is not a :class:`DetSpecConfig`.
    """
    global _current
    if not isinstance(config, DetSpecConfig):
        raise ValueError(f"config must be a DetSpecConfig, got {type(config).__name__}")
    with _lock:
        _current = config
    return config


def reset_config() -> None:
    """Forget the bag in force: the next read gives the environment-only bag until one is installed."""
    global _current
    with _lock:
        _current = None
