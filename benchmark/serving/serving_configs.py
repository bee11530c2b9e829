"""The server configurations of the end-to-end serving benchmark and the command lines that run them.

Nineteen configurations, one SGLang 0.5.23 server each, on the same target and
EAGLE draft (``serving_models.py``):

==== ================= ============================================================
key  name               what
==== ================= ============================================================
a    spec_fast          chain EAGLE, rejection sampling, no deterministic inference
b    spec_sglang_det    (a) + ``--enable-deterministic-inference``, plugin disabled
                        (``SGLANG_DETSPEC_DISABLE=1``): SGLang's own seeded path
c    plugin_rejection   (a) + deterministic inference, plugin in rejection mode
d    plugin_coupled     chain EAGLE, deterministic, plugin coupled (its default coupled
                        drafts: start-up turns SGLang's sampled-draft path on)
e    plugin_tree        EAGLE tree (3 steps, top-k 4, 8 draft tokens), coupled, coupled drafts
i    plugin_tree_16     EAGLE tree (5 steps, top-k 4, 16 draft tokens), coupled, coupled drafts
h    plugin_coupled_race (d) with the user's own rejection flag and
                        ``SGLANG_DETSPEC_VERIFY=coupled`` (what (d) needed before coupled
                        drafts became the default; now the same path as (d))
j    plugin_tree_nodes  (e) with ``SGLANG_DETSPEC_TREE_ATTENTION=nodes`` and
                        ``SGLANG_DETSPEC_DECODE_ATTENTION=sglang``: the FA3 tree verify as one
                        decode query per node instead of the default prefix / tail split
k    spec_fast_tree     (e)'s tree shape, no deterministic inference, no plugin: SGLang's own tree
f    plugin_no_spec     deterministic inference without speculative decoding
g    baseline           no speculative decoding, no deterministic inference
l    plugin_coupled_adaptive (d) with ``--speculative-adaptive``
m    plugin_tree_switch (e) drafting a 3-step chain above 16 requests
                        (``SGLANG_DETSPEC_TREE_CHAIN_BATCH=16``)
n    plugin_coupled_sglang_attention (d) with ``SGLANG_DETSPEC_DECODE_ATTENTION=sglang``
o    plugin_tree_switch_nodes (m) with (j)'s settings: SGLang's FA3 calls, trees
                        verified per node
p    plugin_tree_switch_tokens (o) drafting the chain also for decode batches longer
                        than 12,288 summed tokens
                        (``SGLANG_DETSPEC_TREE_CHAIN_TOKENS=12288``): the FA3 tree default
                        at head sizes 65-128 since 2026-12-06
q    plugin_coupled_deep (d) drafting 5 steps (6 draft tokens): what a deeper chain
                        gives the coupling back at large batches
r    spec_fast_deep     (a) drafting 5 steps (6 draft tokens): SGLang's own gain from it
s    plugin_tree_narrow (p) with a top-k 2 tree of 6 draft tokens, the chain above 48
                        requests: a tree where (p) drafts its chain
==== ================= ============================================================

Every tree configuration names all four tree settings (:func:`tree_env`), so
each runs what it says whatever the plugin's defaults.

Everything here is pure Python (no SGLang, no torch) so the CPU suite checks
the command lines this module builds.
"""

from __future__ import annotations

import dataclasses
import math
import re
import sys

CHAIN = ("--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3",
         "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4")
TREE = ("--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3",
        "--speculative-eagle-topk", "4", "--speculative-num-draft-tokens", "8")
DEEP_CHAIN = ("--speculative-algorithm", "EAGLE", "--speculative-num-steps", "5",
              "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "6")
WIDE_TREE = ("--speculative-algorithm", "EAGLE", "--speculative-num-steps", "5",
             "--speculative-eagle-topk", "4", "--speculative-num-draft-tokens", "16")
NARROW_TREE = ("--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3",
               "--speculative-eagle-topk", "2", "--speculative-num-draft-tokens", "6")
REJECTION = ("--speculative-use-rejection-sampling",)
DETERMINISTIC = ("--enable-deterministic-inference",)
# SGLang's scheduler polls its sockets in a loop while no request is running unless told to sleep; in the
# interleaved modes two or three servers wait while one is measured (serving_run.py --sleep-on-idle).
SLEEP_ON_IDLE = ("--sleep-on-idle",)
COUPLED = (("SGLANG_DETSPEC_VERIFY", "coupled"),)


def tree_env(attention: str, decode: str, batch: int, tokens: int) -> tuple[tuple[str, str], ...]:
    """A coupled tree's four tree settings, every one named: since 2026-12-06 an FA3 tree server at head sizes
    65-128 (the 8B shape's 128) takes (p)'s for those unset (``config.FA3_TREE_DEFAULTS``), so a configuration
    that leaves one out would change with that default."""
    return COUPLED + (("SGLANG_DETSPEC_TREE_ATTENTION", attention), ("SGLANG_DETSPEC_DECODE_ATTENTION", decode),
                      ("SGLANG_DETSPEC_TREE_CHAIN_BATCH", str(batch)), ("SGLANG_DETSPEC_TREE_CHAIN_TOKENS", str(tokens)))


# The plain tree (the FA3 prefix / tail split verifies it, no bound), the settings (e) and (i) have always run.
PLAIN_TREE = tree_env("cascade", "split", 0, 0)
# SGLang's prefill CUDA graphs are on by default, and so in the harness; serving_run.py --no-prefill-graphs
# turns them off on every server (every serving command before 2026-12-05's last ran so).
PREFILL_GRAPHS_OFF = ("--cuda-graph-backend-prefill", "disabled")


@dataclasses.dataclass(frozen=True)
class BenchConfig:
    """One server configuration.

    Attributes:
        key: one letter, ``a``..``s``.
        name: file-name-safe identifier.
        title: one line for tables and plots.
        spec_args: speculative-decoding flags (without the draft path).
        deterministic: whether ``--enable-deterministic-inference`` is passed.
        env: extra environment of the server process.
        plugin_expected: whether the plugin must log itself active.
    """

    key: str
    name: str
    title: str
    spec_args: tuple[str, ...]
    deterministic: bool
    env: tuple[tuple[str, str], ...]
    plugin_expected: bool

    @property
    def speculative(self) -> bool:
        return bool(self.spec_args)

    def to_json(self) -> dict:
        return {"key": self.key, "name": self.name, "title": self.title, "spec_args": list(self.spec_args),
                "deterministic": self.deterministic, "env": dict(self.env), "plugin_expected": self.plugin_expected}


CONFIGS: dict[str, BenchConfig] = {c.key: c for c in (
    BenchConfig("a", "spec_fast", "(a) EAGLE chain, rejection, not deterministic",
                CHAIN + REJECTION, False, (), False),
    BenchConfig("b", "spec_sglang_det", "(b) EAGLE chain, rejection, SGLang deterministic (plugin off)",
                CHAIN + REJECTION, True, (("SGLANG_DETSPEC_DISABLE", "1"),), False),
    BenchConfig("c", "plugin_rejection", "(c) EAGLE chain, plugin rejection mode",
                CHAIN + REJECTION, True, (("SGLANG_DETSPEC_VERIFY", "rejection"),), True),
    BenchConfig("d", "plugin_coupled", "(d) EAGLE chain, plugin coupled",
                CHAIN, True, (("SGLANG_DETSPEC_VERIFY", "coupled"),), True),
    BenchConfig("e", "plugin_tree", "(e) EAGLE tree topk 4 / 8 tokens, plugin coupled",
                TREE, True, PLAIN_TREE, True),
    BenchConfig("i", "plugin_tree_16", "(i) EAGLE tree 5 steps, topk 4 / 16 tokens, plugin coupled",
                WIDE_TREE, True, PLAIN_TREE, True),
    BenchConfig("f", "plugin_no_spec", "(f) no speculation, plugin deterministic",
                (), True, (), True),
    BenchConfig("g", "baseline", "(g) no speculation, not deterministic",
                (), False, (), False),
    # Not in the default order: SGLang's own tree, not deterministic: what the tree costs SGLang itself
    # (its host time per step beside (e)'s).
    BenchConfig("k", "spec_fast_tree", "(k) EAGLE tree topk 4 / 8 tokens, not deterministic",
                TREE, False, (), False),
    # Not in the default order: the node path's cost, measured beside (e) (--configs bej).
    # The node path runs only without the prefix / tail split (the default on FA3), so (j) turns the split off.
    BenchConfig("j", "plugin_tree_nodes", "(j) (e) with FA3 tree verify as decode queries per node",
                TREE, True, tree_env("nodes", "sglang", 0, 0), True),
    # Not one of (a)-(g): before coupled drafts became the default, the coupled chain with
    # raced drafts needed the user's rejection flag; it now takes the same path as (d).
    BenchConfig("h", "plugin_coupled_race", "(h) EAGLE chain, plugin coupled, coupled-race drafts",
                CHAIN + REJECTION, True, (("SGLANG_DETSPEC_VERIFY", "coupled"),), True),
    # Not in the default order: (d) with SGLang's adaptive speculation (draft steps by batch size
    # and accept rate, its default table), which coupled verify keeps out of the tokens (--configs adl).
    BenchConfig("l", "plugin_coupled_adaptive", "(l) (d) with --speculative-adaptive, plugin coupled",
                CHAIN + ("--speculative-adaptive",), True, (("SGLANG_DETSPEC_VERIFY", "coupled"),), True),
    # Not in the default order: (e) drafting a chain of its depth for decode batches of more than 16
    # requests (sglang_plugin/shape_hook.py), which coupled verify keeps out of the tokens (--configs aem).
    BenchConfig("m", "plugin_tree_switch", "(m) (e) drafting a 3-step chain above 16 requests, plugin coupled",
                TREE, True, tree_env("cascade", "split", 16, 0), True),
    # Not in the default order: (d) with SGLang's FA3 calls named. At head sizes 65-128 (the 8B shape's 128)
    # (d) keeps SGLang's FA3 calls by default since 2026-12-05 (fa3_split_hook.own_calls_serve, where its
    # start-up check passes), so there (n) runs what (d) runs; at other head sizes it shows what the split adds.
    BenchConfig("n", "plugin_coupled_sglang_attention", "(n) (d) with SGLang's FA3 calls, not the split",
                CHAIN, True, (("SGLANG_DETSPEC_VERIFY", "coupled"), ("SGLANG_DETSPEC_DECODE_ATTENTION", "sglang")),
                True),
    # Not in the default order: (m) on the attention arithmetic its chain state shares with (d) at head sizes
    # 65-128 (where (d)'s log reads that the FA3 split stands down): SGLang's FA3 calls everywhere and trees
    # verified per node as decode queries (the node path), bitwise there by the plugin's rules; above 16
    # requests its target's attention is (d)'s, its draft extend still the tree's (--interleave --configs ado
    # on an H200; on an H100 --interleave --configs ao beside an --configs ad run).
    BenchConfig("o", "plugin_tree_switch_nodes",
                "(o) (m) on SGLang's FA3 calls, trees verified per node (the node path)",
                TREE, True, tree_env("nodes", "sglang", 16, 0), True),
    # Not in the default order: (o) drafting the chain also where the batch is long, since the node path reads
    # each node's whole context. The bound sits between the two 2048-token points of docs/determinism_tax.md
    # (about 2,100 and 17,000 summed tokens; --interleave --configs adp --input-len 2048).
    BenchConfig("p", "plugin_tree_switch_tokens",
                "(p) (o) drafting the chain also above 12,288 summed tokens",
                TREE, True, tree_env("nodes", "sglang", 16, 12288), True),
    # Not in the default order: the coupled chain at 5 steps beside (d) (--interleave --configs adq) and
    # SGLang's own at 5 steps (--configs aqr). Coupled verify accepts each draft token at least at
    # (1 - TV) / (1 + TV), rejection at 1 - TV (docs/design.md): on the benchmark's models a chain of 3 steps
    # commits 2.96 tokens per step against (a)'s 3.20 (about 0.80 against 0.85 per position). A deeper draft
    # wins back tokens per step where a step's cost grows less than its accepted tokens, which these measure;
    # coupled verify keeps the tokens whatever the depth, so a server may draft deeper at large batches without
    # changing an output. The benchmark's draft accepts each position at one fixed rate (serving_models.py); a
    # real draft's rate falls with depth, so these figures bound a real draft's gain from above.
    BenchConfig("q", "plugin_coupled_deep", "(q) EAGLE chain 5 steps, plugin coupled",
                DEEP_CHAIN, True, (("SGLANG_DETSPEC_VERIFY", "coupled"),), True),
    BenchConfig("r", "spec_fast_deep", "(r) EAGLE chain 5 steps, rejection, not deterministic",
                DEEP_CHAIN + REJECTION, False, (), False),
    # Not in the default order: a narrower tree where (p) drafts the chain. At 32 requests (p) serves its chain,
    # 0.955 of (a) (docs/determinism_tax.md), and its 8-token tree cost more than it accepted there; top-k 2 with 6
    # draft tokens verifies 6 tokens per request against the chain's 4 and the tree's 8, so it may accept more
    # than the chain for less than the tree's step. The node path and (p)'s token bound, the chain above 48
    # requests (--interleave --configs aps --concurrency 8,32).
    BenchConfig("s", "plugin_tree_narrow", "(s) EAGLE tree topk 2 / 6 tokens, node path, chain above 48 requests",
                NARROW_TREE, True, tree_env("nodes", "sglang", 48, 12288), True),
)}

# Measured first: the ratios against (b) of the plugin's configurations survive a run cut short.
DEFAULT_ORDER = "bdeicagfh"
DEFAULT_CONCURRENCIES = (1, 8, 32, 128)
# fa3 first: what --enable-deterministic-inference picks on Hopper when no backend is given,
# so what a user gets; triton for a machine (or wheel kit) without SGLang's FA3 library.
ATTENTION_BACKENDS = ("fa3", "triton")


def parse_keys(text: str) -> list[str]:
    """``"bdc"`` or ``"b,d,c"`` -> ``["b", "d", "c"]``; ValueError on unknown or repeated keys."""
    keys = [k for k in text.replace(",", "").strip()]
    if not keys:
        raise ValueError(f"configs must name at least one of {''.join(sorted(CONFIGS))}")
    unknown = [k for k in keys if k not in CONFIGS]
    if unknown:
        raise ValueError(f"configs: unknown keys {unknown} (known: {''.join(CONFIGS)})")
    if len(set(keys)) != len(keys):
        raise ValueError(f"configs: repeated keys in {text!r}")
    return keys


def parse_int_list(text: str, name: str, *, minimum: int = 1, maximum: int = 4096) -> list[int]:
    """``"1,8,32"`` -> ``[1, 8, 32]``; ValueError naming ``name`` and the bounds otherwise."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"{name} must be comma-separated integers, got {text!r}") from None
    if not values:
        raise ValueError(f"{name} must list at least one integer")
    bad = [v for v in values if not minimum <= v <= maximum]
    if bad:
        raise ValueError(f"{name} values must lie in [{minimum}, {maximum}], got {bad}")
    return values


ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def parse_env_pairs(pairs: list[str], name: str = "server_env") -> dict[str, str]:
    """``["K=V", ...]`` -> ``{"K": "V"}`` (the value may hold ``=``); ValueError naming ``name`` otherwise.

    A key must be a shell variable name; a key given twice is an error.
    """
    env: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not ENV_NAME.fullmatch(key):
            raise ValueError(f"{name} entries must be KEY=VALUE with KEY a variable name, got {pair!r}")
        if key in env:
            raise ValueError(f"{name}: {key} given twice")
        env[key] = value
    return env


def plugin_overrides(config: BenchConfig, argv: list[str], env: dict[str, str], *, server_env: dict[str, str],
                     server_args: list[str]) -> tuple[list[str], dict[str, str]]:
    """``argv`` and ``env`` of ``config``'s server with the caller's plugin settings added.

    Only configurations that run the plugin (``plugin_expected``) get them:
    a setting of the plugin has no effect elsewhere, and the references
    (a), (b), (g) stay what they measure. ``server_env`` wins over the
    configuration's own variables of the same name; ``server_args`` are
    appended to the command line.
    """
    if not config.plugin_expected:
        return list(argv), dict(env)
    return list(argv) + list(server_args), {**env, **server_env}


@dataclasses.dataclass(frozen=True)
class ServerSettings:
    """Flags every server shares (see :func:`server_command`).

    ``attention_backend`` is one of ``ATTENTION_BACKENDS`` (ValueError otherwise).
    """

    target: str
    draft: str
    max_total_tokens: int = 65536
    max_running_requests: int = 128
    mem_fraction_static: float = 0.88
    attention_backend: str = "fa3"
    extra: tuple[str, ...] = ()
    prefill_graphs: bool = True

    def __post_init__(self):
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise ValueError(f"attention_backend must be one of {', '.join(ATTENTION_BACKENDS)}, "
                             f"got {self.attention_backend!r}")
        if not 1024 <= self.max_total_tokens <= 10_000_000:
            raise ValueError(f"max_total_tokens must lie in [1024, 1e7], got {self.max_total_tokens}")
        if not 1 <= self.max_running_requests <= 4096:
            raise ValueError(f"max_running_requests must lie in [1, 4096], got {self.max_running_requests}")
        if not 0.05 <= self.mem_fraction_static <= 0.95:
            raise ValueError(f"mem_fraction_static must lie in [0.05, 0.95], got {self.mem_fraction_static}")


def server_command(config: BenchConfig, settings: ServerSettings, *, port: int, python: str = sys.executable,
                   tp_size: int = 1, dp_size: int = 1) -> list[str]:
    """The ``python -m sglang.launch_server`` command line of ``config``.

    Why these shared flags: ``--attention-backend`` explicit and the same for
    every configuration (``settings.attention_backend``: ``fa3`` by default,
    which deterministic mode would pick on Hopper anyway, so (a) and (g)
    run the same attention kernels as the deterministic configurations;
    ``triton`` where SGLang's FA3 library is missing);
    ``--cuda-graph-backend-prefill disabled`` only where
    ``settings.prefill_graphs`` is off (SGLang 0.5.23 captures prefill CUDA
    graphs by default, about 58 token counts up to the prefill chunk, 13-16 s
    more per start at the 8B shape; with them a prefill that fits a captured
    count replays it, otherwise it runs eagerly, launch by launch, which cost
    the plugin's chain 16-21% of its throughput at c = 8 and 32 on an H100,
    11-12% against (a), in two back-to-back commands);
    a fixed KV pool (``--max-total-tokens``)
    so several servers share one GPU whatever order they profile memory in;
    ``--max-running-requests`` and ``--cuda-graph-max-bs-decode`` at the
    largest concurrency, so every measured batch runs in a captured graph
    and no request waits for a slot.

    Raises:
        ValueError: port outside [1024, 65535], tp_size or dp_size below 1.
    """
    if not 1024 <= port <= 65535:
        raise ValueError(f"port must lie in [1024, 65535], got {port}")
    if tp_size < 1 or dp_size < 1:
        raise ValueError(f"tp_size and dp_size must be >= 1, got {tp_size}, {dp_size}")
    cmd = [python, "-m", "sglang.launch_server", "--model-path", settings.target,
           "--host", "127.0.0.1", "--port", str(port),
           "--attention-backend", settings.attention_backend,
           *(() if settings.prefill_graphs else PREFILL_GRAPHS_OFF),
           "--mem-fraction-static", f"{settings.mem_fraction_static:g}",
           "--max-total-tokens", str(settings.max_total_tokens),
           "--max-running-requests", str(settings.max_running_requests),
           "--cuda-graph-max-bs-decode", str(settings.max_running_requests)]
    if tp_size > 1:
        cmd += ["--tp-size", str(tp_size)]
    if dp_size > 1:
        cmd += ["--dp-size", str(dp_size)]
    if config.speculative:
        cmd += [*config.spec_args, "--speculative-draft-model-path", settings.draft]
    if config.deterministic:
        cmd += list(DETERMINISTIC)
    return cmd + list(settings.extra)


@dataclasses.dataclass(frozen=True)
class LoadSettings:
    """What ``bench_serving`` sends: random token-id prompts of fixed length, sampled at temperature 1.

    ``prompts_for(c)``: ``rounds`` full waves of ``c`` requests, at least
    ``min_prompts``, so every concurrency measures a full batch more than once.
    """

    input_len: int = 128
    output_len: int = 128
    rounds: int = 2
    min_prompts: int = 4
    temperature: float = 1.0
    seed: int = 1

    def __post_init__(self):
        for name in ("input_len", "output_len"):
            value = getattr(self, name)
            if not 1 <= value <= 32768:
                raise ValueError(f"{name} must lie in [1, 32768], got {value}")
        if not 1 <= self.rounds <= 100:
            raise ValueError(f"rounds must lie in [1, 100], got {self.rounds}")
        if not 1 <= self.min_prompts <= 10000:
            raise ValueError(f"min_prompts must lie in [1, 10000], got {self.min_prompts}")
        if not (math.isfinite(self.temperature) and 0.0 <= self.temperature <= 10.0):
            raise ValueError(f"temperature must lie in [0, 10], got {self.temperature}")

    def prompts_for(self, concurrency: int) -> int:
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        return max(self.min_prompts, self.rounds * concurrency)


@dataclasses.dataclass(frozen=True)
class RepeatSettings:
    """How many ``bench_serving`` runs measure one (server, concurrency) cell, and how long each must last.

    A run counts (``valid``) when its ``duration`` (bench_serving's field:
    seconds from the first measured request sent to the last answer, its
    warm-up requests excluded) is at least ``min_seconds``. A shorter run is
    kept in the results as a warm-up, never counted, and the next run's
    prompt count is scaled from it (:meth:`next_prompts`). A cell stops at
    ``repeats`` valid runs, after ``max_attempts`` runs, or before a run
    predicted to end past ``max_cell_s`` seconds of the cell or past the
    server's time limit (:meth:`next_attempt`), so one slow server cannot
    eat the command's budget.

    Attributes:
        repeats: valid runs wanted per cell.
        min_seconds: shortest ``duration`` (s) that counts; 0 counts every run.
        max_attempts: runs per cell at most, warm-ups included.
        max_cell_s: wall-clock seconds per cell at most (predicted before each run).
        batched_prompts: prompts of a first run at least, from concurrency
            ``batched_from`` up (one prompt count of 64 at c = 8 is 8 waves).
        batched_from: the concurrency from which ``batched_prompts`` applies.
        margin: a scaled run aims at ``margin x min_seconds``, so a little
            noise does not make it short again.
        max_prompts: prompts per run at most (rounded down to full waves).
    """

    repeats: int = 2
    min_seconds: float = 8.0
    max_attempts: int = 4
    max_cell_s: float = 60.0
    batched_prompts: int = 64
    batched_from: int = 8
    margin: float = 1.25
    max_prompts: int = 20000

    def __post_init__(self):
        if not 1 <= self.repeats <= 50:
            raise ValueError(f"repeats must lie in [1, 50], got {self.repeats}")
        if not (math.isfinite(self.min_seconds) and 0.0 <= self.min_seconds <= 600.0):
            raise ValueError(f"min_seconds must lie in [0, 600], got {self.min_seconds}")
        if not self.repeats <= self.max_attempts <= 100:
            raise ValueError(f"max_attempts must lie in [repeats={self.repeats}, 100], got {self.max_attempts}")
        if not (math.isfinite(self.max_cell_s) and 1.0 <= self.max_cell_s <= 3600.0):
            raise ValueError(f"max_cell_s must lie in [1, 3600], got {self.max_cell_s}")
        if not 1 <= self.batched_prompts <= 100000 or not 1 <= self.batched_from <= 4096:
            raise ValueError(f"batched_prompts and batched_from must lie in [1, 100000] and [1, 4096], "
                             f"got {self.batched_prompts}, {self.batched_from}")
        if not (math.isfinite(self.margin) and 1.0 <= self.margin <= 4.0):
            raise ValueError(f"margin must lie in [1, 4], got {self.margin}")
        if not 1 <= self.max_prompts <= 1_000_000:
            raise ValueError(f"max_prompts must lie in [1, 1e6], got {self.max_prompts}")

    @classmethod
    def single(cls) -> "RepeatSettings":
        """One run per cell, every run valid: the driver's behaviour for a spec without ``repeat``."""
        return cls(repeats=1, min_seconds=0.0, max_attempts=1, batched_prompts=1)

    def is_valid(self, duration_s: float | None) -> bool:
        """Whether a run of ``duration_s`` seconds counts (False for a missing or non-finite duration)."""
        if isinstance(duration_s, bool) or not isinstance(duration_s, (int, float)) or not math.isfinite(duration_s):
            return False
        return duration_s >= self.min_seconds

    def _full_waves(self, prompts: float, concurrency: int) -> int:
        waves = max(1, math.ceil(prompts / concurrency - 1e-9))
        cap = max(1, self.max_prompts // concurrency)
        return min(waves, cap) * concurrency

    def start_prompts(self, load: LoadSettings, concurrency: int) -> int:
        """Prompts of a cell's first run: ``max(rounds x c, min_prompts, batched_prompts when c >= batched_from)``.

        Raised to full waves of ``concurrency`` when the floor is not one already.

        Raises:
            ValueError: concurrency below 1.
        """
        n = load.prompts_for(concurrency)
        if concurrency >= self.batched_from and n < self.batched_prompts:
            n = self._full_waves(self.batched_prompts, concurrency)
        return n

    def next_prompts(self, prompts: int, duration_s: float, concurrency: int) -> int:
        """Prompts of the run after a short one: ``prompts x margin x min_seconds / duration_s``, up to full waves.

        Always more than ``prompts`` (at least one more wave), at most ``max_prompts``.

        Raises:
            ValueError: ``duration_s`` not a positive finite number, ``prompts`` or ``concurrency`` below 1.
        """
        if prompts < 1 or concurrency < 1:
            raise ValueError(f"prompts and concurrency must be >= 1, got {prompts}, {concurrency}")
        if isinstance(duration_s, bool) or not isinstance(duration_s, (int, float)) or not (
                math.isfinite(duration_s) and duration_s > 0):
            raise ValueError(f"duration_s must be a positive number of seconds, got {duration_s!r}")
        scaled = prompts * self.margin * max(self.min_seconds, 1e-3) / duration_s
        return self._full_waves(max(scaled, prompts + concurrency), concurrency)

    def next_attempt(self, runs: list[dict], start: int, concurrency: int, *, cell_elapsed_s: float,
                     time_left_s: float) -> tuple[int | None, str]:
        """The prompt count of a cell's next run, or ``(None, why the cell stops)``.

        Args:
            runs: the cell's finished runs in order, each with ``num_prompts``,
                ``duration_s`` (bench_serving's duration), ``wall_s`` (the whole
                bench_serving call, warm-up requests and tokenizer load included)
                and ``valid``.
            start: the first run's prompt count (:meth:`start_prompts`).
            concurrency: the cell's concurrency.
            cell_elapsed_s: wall-clock seconds spent on the cell so far.
            time_left_s: seconds left to this server's measurements.

        The next run repeats the last count after a valid run and scales it
        after a short one; its wall time is predicted from the last run
        (duration per prompt times prompts, plus the last run's overhead).
        """
        valid = sum(1 for r in runs if r.get("valid"))
        if valid >= self.repeats:
            return None, "done"
        if len(runs) >= self.max_attempts:
            return None, f"{len(runs)} runs, the most per cell (max_attempts)"
        if not runs:
            if time_left_s < max(self.min_seconds, 1.0):
                return None, f"{time_left_s:.0f} s left to this server, less than one run"
            return start, ""
        last = runs[-1]
        if last["valid"]:
            prompts = int(last["num_prompts"])
        else:
            prompts = self.next_prompts(int(last["num_prompts"]), last["duration_s"], concurrency)
        overhead = max(0.0, float(last["wall_s"]) - float(last["duration_s"]))
        predicted = float(last["duration_s"]) * prompts / int(last["num_prompts"]) + overhead
        if cell_elapsed_s + predicted > self.max_cell_s:
            return None, (f"next run of {prompts} prompts predicted to take {predicted:.0f} s, past the cell's "
                          f"{self.max_cell_s:.0f} s (max_cell_s; {cell_elapsed_s:.0f} s spent)")
        if predicted > time_left_s:
            return None, (f"next run of {prompts} prompts predicted to take {predicted:.0f} s, "
                          f"{time_left_s:.0f} s left to this server")
        return prompts, ""


def bench_args(url: str, tokenizer: str, concurrency: int, load: LoadSettings, *, output_file: str,
               tag: str, profile_dir: str | None = None, profile_steps: int = 6, num_prompts: int | None = None,
               warmup_requests: int | None = None) -> list[str]:
    """Arguments of ``python -m sglang.bench_serving`` for one concurrency level.

    ``random-ids`` with ``--tokenize-prompt`` sends token ids (no ShareGPT
    download, exact prompt lengths); the tokenizer is still loaded by the
    client (it reads ``vocab_size`` to draw ids and re-encodes the streamed
    text), and the server must detokenize: SGLang's ``sglang`` backend of
    bench_serving counts a streamed chunk only when it carries ``text``, so a
    ``--skip-tokenizer-init`` server would yield no latencies. With
    ``range_ratio 1`` every request has exactly ``input_len`` / ``output_len``
    tokens and ``ignore_eos`` (bench_serving's default) keeps them that long.

    ``num_prompts`` defaults to ``load.prompts_for(concurrency)``;
    ``warmup_requests`` (bench_serving's unmeasured requests before the run) to
    ``min(concurrency, 8)``: a repetition right after another run at the same
    concurrency passes 0, the server being warm already.

    With ``profile_dir``, SGLang's profiler records ``profile_steps`` decode
    steps once the decode batch holds ``concurrency`` requests (``--profile
    --profile-by-stage``; the server needs
    ``SGLANG_PROFILE_BY_STAGE_DECODE_MIN_BS``, see ``serving_run.py``).

    Raises:
        ValueError: concurrency or num_prompts below 1, warmup_requests below 0,
            profile_steps outside [1, 100].
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    num_prompts = load.prompts_for(concurrency) if num_prompts is None else num_prompts
    warmup_requests = min(concurrency, 8) if warmup_requests is None else warmup_requests
    if num_prompts < 1 or warmup_requests < 0:
        raise ValueError(f"num_prompts must be >= 1 and warmup_requests >= 0, got {num_prompts}, {warmup_requests}")
    # --model: without it bench_serving asks /v1/models; the served name is the model path.
    args = ["--backend", "sglang", "--base-url", url, "--model", tokenizer, "--tokenizer", tokenizer,
            "--dataset-name", "random-ids", "--tokenize-prompt",
            "--random-input-len", str(load.input_len), "--random-output-len", str(load.output_len),
            "--random-range-ratio", "1.0", "--num-prompts", str(num_prompts),
            "--max-concurrency", str(concurrency), "--request-rate", "inf",
            "--temperature", f"{load.temperature:g}", "--seed", str(load.seed),
            "--warmup-requests", str(warmup_requests), "--ready-check-timeout-sec", "0",
            "--disable-tqdm", "--output-file", output_file, "--tag", tag]
    if profile_dir is not None:
        if not 1 <= profile_steps <= 100:
            raise ValueError(f"profile_steps must lie in [1, 100], got {profile_steps}")
        args += ["--profile", "--profile-by-stage",
                 "--profile-num-steps", str(profile_steps), "--profile-output-dir", profile_dir]
    return args


def shell_line(argv: list[str]) -> str:
    """A copy-pasteable shell rendering of ``argv`` (for the result files)."""
    import shlex

    return " ".join(shlex.quote(a) for a in argv)
