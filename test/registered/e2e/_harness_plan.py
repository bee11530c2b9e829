"""What ``test_sglang_harness.py`` runs: SGLang's own determinism harness against the plugin's servers.

Plain data and small functions, no server and no GPU: the CPU unit tests
(``test/registered/unit/test_sglang_harness_plan.py``) read the same tables
and rules the GPU suite uses.

SGLang 0.5.23 ships the harness as ``sglang.test.test_deterministic``:
``test_deterministic(args)``, ``args`` a ``BenchArgs`` (``host``, ``port``,
``test_mode``, ``n_trials``, ``n_start``, ``return_logprob``; greedy,
``sampling_seed`` 42, 100 new tokens), sends ``/generate`` and
``/flush_cache`` requests to one server, prints what it compares and returns a
list of ints per mode (1 per comparison that held):

* ``single``: ``PROMPT_1`` in batches of 1 .. n_trials; ``[distinct output
  texts]``, 1 to pass;
* ``prefix``: batches of n_start .. n_start + n_trials - 1 prompts drawn
  from 4 prefixes of ``LONG_PROMPT`` (1, 511, 2048, 4097 characters);
  distinct output texts per prefix, each 1 to pass (with ``return_logprob``
  it also prints whether the logprobs agreed across batch sizes);
* ``radix_cache``: 100 token ids in [100, 50000], 2 new tokens, then prompt
  + first output token prefilled with that prefix cached and again after a
  flush; ``[1]`` when the two give the same token and logprob bits;
* ``p_vs_d``: trial i sends i prompts (``PROMPT_1``, ``PROMPT_2``, then
  slices of ``LONG_PROMPT`` up to 4095 characters), decoded with the
  logprobs of every position, then each prompt + output prefilled once;
  one 0 / 1 per sequence (the decode's logprobs are the prefill's, bit for
  bit), n(n+1)/2 in all.

What the test asserts follows each server's start-up claim (its
``logits='...'`` line, ``config.logits_guarantee``): ``single`` and
``prefix`` change only the batch, which every deterministic server promises
not to matter, so they are asserted everywhere; ``radix_cache`` (an extend
over a cached prefix against a whole prefill) and ``p_vs_d`` (decode or
verify against prefill) compare two forward modes, which only a ``bitwise``
claim covers, so they are asserted where the server claims ``bitwise`` and
recorded elsewhere.

The tiny models' word-level tokenizer knows only the words ``t<i>``: the
harness's English prompts become runs of ``<unk>`` (id 0), one per word (the
longest, 4097 characters, is 558 tokens), still long prompts for the
attention; ``radix_cache``'s random ids need a vocabulary above 50,000, so
the suite serves the tiny models written at :data:`VOCAB`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import _forward_plan
from sglang_detspec.config import DetSpecConfig, env_settings, with_server_defaults

# Modes of the harness, in the order they run on a server: single first, because SGLang's
# harness notes that a /flush_cache before any request can hang, and prefix flushes first.
MODES = ("single", "prefix", "radix_cache", "p_vs_d")
# Modes that compare two forward modes (covered by a bitwise claim only); the others change the batch.
FORWARD_MODE_PAIRS = ("radix_cache", "p_vs_d")
# n_trials per mode (radix_cache ignores it). p_vs_d at 4: 10 sequences, 3 of them long.
TRIALS = {"single": 8, "prefix": 8, "radix_cache": 1, "p_vs_d": 4}
MIN_P_VS_D_TRIALS = 4
# The prefix lengths of the harness's prefix mode (len_prefix in sglang/test/test_deterministic.py).
PREFIX_PROMPTS = 4
# Prefix mode draws its prompts from Python's global random without seeding it: seeded here.
PREFIX_SEED = 34
# radix_cache sends random.randint(100, 50000) ids; the vocabulary must hold them.
RADIX_MAX_TOKEN_ID = 50000
VOCAB = 128256
# The harness's longest prompt (characters) and its new tokens, which the context must hold.
LONGEST_PROMPT_CHARS, NEW_TOKENS = 4097, 100

# Server label -> family in _e2e.FAMILIES.
SERVERS = ("no_spec", "coupled_chain", "coupled_tree", "eagle3_tree")
BACKENDS = ("triton", "fa3")
# On fa3 these also serve a target of head size WIDE_HEAD_DIM (the tiny target's weights as WIDE_HEADS heads):
# there a server that verifies no trees keeps SGLang's own FA3 calls (config.fa3_own_calls_exact), a tree with no
# setting named takes the FA3 tree default (config.FA3_TREE_DEFAULTS: the node path, both bounds), and the switching
# tree on the node path (its own environment, _e2e.FAMILIES, a bound of 3 requests) SGLang's calls and one decode
# query per tree node: at head size 128 both claim 'bitwise', at the tiny target's 64 the latter would not.
WIDE_HEAD_SERVERS = ("no_spec", "coupled_chain", "coupled_tree", "coupled_tree_switch_nodes")
WIDE_HEAD_BACKEND = "fa3"
WIDE_HEADS, WIDE_HEAD_DIM = 2, 128
WIDE_SUFFIX = f"_head{WIDE_HEAD_DIM}"
# The harness runs as a new user would, with SGLang's own prefill CUDA graphs, even where
# DETSPEC_E2E_SERVER_ARGS turns them off for the other suites.
PREFILL_GRAPH_FLAG = "--cuda-graph-backend-prefill"
RESULT_FILE = "sglang_harness"


def selected_backends(environ=None, fa3_installed=None) -> tuple[str, ...]:
    """``DETSPEC_E2E_BACKENDS`` over :data:`BACKENDS` (``_forward_plan.selected_backends``: same rules, same errors)."""
    return _forward_plan.selected_backends(environ, fa3_installed, known=BACKENDS)


def expected_results(mode: str, trials: int) -> int:
    """How many ints the harness returns for ``mode`` at ``trials`` trials.

    Raises:
        ValueError: unknown ``mode`` (the message lists :data:`MODES`) or ``trials`` < 1.
    """
    check_mode(mode)
    if not isinstance(trials, int) or trials < 1:
        raise ValueError(f"trials must be an integer >= 1, got {trials!r}")
    return {"single": 1, "prefix": PREFIX_PROMPTS, "radix_cache": 1, "p_vs_d": trials * (trials + 1) // 2}[mode]


def check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")


def mode_passed(mode: str, results: list[int], trials: int, logprobs_identical: bool | None = None) -> bool:
    """Whether the harness's ``results`` for ``mode`` say the server passed.

    Every mode's results are 1 per comparison that held (``single``,
    ``prefix``: the number of distinct outputs, 1 when all agree), and there
    must be as many as the mode makes (:func:`expected_results`); a shorter
    list means comparisons went missing. ``prefix`` also needs its logprobs
    bitwise equal across batch sizes (``logprobs_identical``, read from the
    harness's verdict line by :func:`prefix_logprob_verdict`).

    Raises:
        ValueError: unknown ``mode`` or ``trials`` < 1.
    """
    want = expected_results(mode, trials)
    ok = len(results) == want and all(r == 1 for r in results)
    return ok and (mode != "prefix" or logprobs_identical is True)


def asserted(mode: str, claim: str | None) -> bool:
    """Whether a failing ``mode`` fails the test on a server that claims ``claim`` (module docstring).

    Raises:
        ValueError: unknown ``mode``.
    """
    check_mode(mode)
    return mode not in FORWARD_MODE_PAIRS or claim == "bitwise"


# The harness's verdict lines of prefix mode with return_logprob (sglang/test/test_deterministic.py).
PREFIX_LOGPROBS_SAME = "Logprobs are identical across all batch sizes"
PREFIX_LOGPROBS_APART = "Some logprobs differ across batch sizes"


def prefix_logprob_verdict(printed: str) -> bool | None:
    """The harness's prefix-mode logprob verdict in what it printed: True, False, or None (no verdict line).

    Raises:
        ValueError: both verdict lines are present (two runs in one text).
    """
    same, apart = PREFIX_LOGPROBS_SAME in printed, PREFIX_LOGPROBS_APART in printed
    if same and apart:
        raise ValueError("printed holds both prefix-mode logprob verdicts: pass one mode's output")
    return True if same else False if apart else None


def without_flag(args: tuple[str, ...], flag: str) -> tuple[str, ...]:
    """``args`` with every ``flag VALUE`` pair removed.

    Raises:
        ValueError: ``flag`` is the last argument (it has no value).
    """
    out, i = [], 0
    while i < len(args):
        if args[i] == flag:
            if i + 1 >= len(args):
                raise ValueError(f"{flag} ends the arguments without a value")
            i += 2
            continue
        out.append(args[i])
        i += 1
    return tuple(out)


@dataclasses.dataclass(frozen=True)
class ModeOutcome:
    """One mode's run on one server: the harness's return value, or the error that stopped it."""

    mode: str
    results: tuple[int, ...] = ()
    error: str | None = None
    logprobs_identical: bool | None = None  # prefix mode only


def row(backend: str, server: str, outcome: ModeOutcome, claim: str | None, log: str | None) -> dict:
    """One row of ``sglang_harness.json``: ``backend``, ``server``, ``mode``, ``results``, ``passed``, and why.

    ``passed`` is :func:`mode_passed` (False on an error); ``asserted``
    whether a failure fails the test (:func:`asserted`); ``claimed`` the
    server's start-up claim.
    """
    trials = TRIALS[outcome.mode]
    passed = outcome.error is None and mode_passed(outcome.mode, list(outcome.results), trials,
                                                   outcome.logprobs_identical)
    return {"backend": backend, "server": server, "mode": outcome.mode, "results": list(outcome.results),
            "passed": passed, "claimed": claim, "asserted": asserted(outcome.mode, claim), "trials": trials,
            "expected_results": expected_results(outcome.mode, trials),
            "logprobs_identical": outcome.logprobs_identical, "error": outcome.error, "log": log}


def failures(rows: list[dict]) -> list[str]:
    """One line per asserted row that did not pass (the test's problems)."""
    out = []
    for r in rows:
        if r["passed"] or not r["asserted"]:
            continue
        why = r["error"] or f"results {r['results']} (want {r['expected_results']} x 1)"
        if r["mode"] == "prefix" and r["logprobs_identical"] is not True and not r["error"]:
            why += f", logprobs identical across batch sizes: {r['logprobs_identical']}"
        out.append(f"{r['backend']} {r['server']} {r['mode']}: {why} (claimed {r['claimed']})")
    return out


def document(rows: list[dict], date_utc: str, machine: str, **extra) -> dict:
    """``sglang_harness.json``: ``{"date_utc", "machine", "rows", ...extra}``.

    Raises:
        ValueError: a row without the keys the layout fixes.
    """
    need = {"backend", "server", "mode", "results", "passed"}
    for r in rows:
        if not need <= set(r):
            raise ValueError(f"row {r!r} lacks {sorted(need - set(r))}")
    return {"date_utc": date_utc, "machine": machine, "rows": rows, **extra}


def wide_head_config(config: dict) -> dict:
    """The tiny target's ``config.json`` read as :data:`WIDE_HEADS` heads of :data:`WIDE_HEAD_DIM` (same weights).

    The projections are ``hidden x hidden`` either way; only the split of the
    hidden size into heads changes. Raises ValueError where the hidden size is
    not ``WIDE_HEADS * WIDE_HEAD_DIM``.
    """
    if config["hidden_size"] != WIDE_HEADS * WIDE_HEAD_DIM:
        raise ValueError(f"hidden_size {config['hidden_size']} is not {WIDE_HEADS} x {WIDE_HEAD_DIM}")
    return {**config, "num_attention_heads": WIDE_HEADS, "num_key_value_heads": WIDE_HEADS, "head_dim": WIDE_HEAD_DIM}


def server_bag(backend: str, label: str, env: Mapping[str, str], head_dim: int | None) -> DetSpecConfig:
    """The plugin's settings bag for a harness server, as its start-up would resolve them on a tiny target.

    ``env``: the environment the server runs with (the suite's, then its
    ``ServerConfig.env`` over it, as SGLang's launcher applies them); the
    speculative flags come from its family (``_e2e.FAMILIES``). The bag's
    :attr:`~DetSpecConfig.logits` is the claim the server must log, and its
    :attr:`~DetSpecConfig.node_path_verifies` whether it must log the node path.

    Raises:
        ValueError: an unknown family, or a setting the plugin refuses (its message names the variable).
    """
    settings = env_settings(env)
    family = base_label(label)
    algorithm = _forward_plan.spec_flag(family, "--speculative-algorithm")
    steps = _forward_plan.spec_flag(family, "--speculative-num-steps")
    tokens = _forward_plan.spec_flag(family, "--speculative-num-draft-tokens")
    # The server's own resolution fills in the tree settings it leaves unset (the FA3 tree defaults at head size 128).
    return with_server_defaults(DetSpecConfig(
        deterministic=True, attention_backend=backend, page_size=1, head_dim=head_dim,
        tree_attention=settings["tree_attention"], decode_attention=settings["decode_attention"],
        tree_chain_batch=settings["tree_chain_batch"], tree_chain_tokens=settings["tree_chain_tokens"],
        set_tree_settings=settings["set_tree_settings"], algorithm=algorithm,
        eagle_topk=_forward_plan.eagle_topk(family), num_steps=int(steps) if steps else None,
        num_draft_tokens=int(tokens) if tokens else None))


def base_label(label: str) -> str:
    """The family of a server label (``coupled_chain_head128`` -> ``coupled_chain``)."""
    return label[:-len(WIDE_SUFFIX)] if label.endswith(WIDE_SUFFIX) else label
