"""The server configurations of the end-to-end serving benchmark and the command lines that run them.

Nine configurations, one SGLang 0.5.23 server each, on the same target and
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
f    plugin_no_spec     deterministic inference without speculative decoding
g    baseline           no speculative decoding, no deterministic inference
==== ================= ============================================================

Everything here is pure Python (no SGLang, no torch) so the CPU suite checks
the command lines this module builds.
"""

from __future__ import annotations

import dataclasses
import math
import sys

CHAIN = ("--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3",
         "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4")
TREE = ("--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3",
        "--speculative-eagle-topk", "4", "--speculative-num-draft-tokens", "8")
WIDE_TREE = ("--speculative-algorithm", "EAGLE", "--speculative-num-steps", "5",
             "--speculative-eagle-topk", "4", "--speculative-num-draft-tokens", "16")
REJECTION = ("--speculative-use-rejection-sampling",)
DETERMINISTIC = ("--enable-deterministic-inference",)


@dataclasses.dataclass(frozen=True)
class BenchConfig:
    """One server configuration.

    Attributes:
        key: one letter, ``a``..``i``.
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
                TREE, True, (("SGLANG_DETSPEC_VERIFY", "coupled"),), True),
    BenchConfig("i", "plugin_tree_16", "(i) EAGLE tree 5 steps, topk 4 / 16 tokens, plugin coupled",
                WIDE_TREE, True, (("SGLANG_DETSPEC_VERIFY", "coupled"),), True),
    BenchConfig("f", "plugin_no_spec", "(f) no speculation, plugin deterministic",
                (), True, (), True),
    BenchConfig("g", "baseline", "(g) no speculation, not deterministic",
                (), False, (), False),
    # Not one of (a)-(g): before coupled drafts became the default, the coupled chain with
    # raced drafts needed the user's rejection flag; it now takes the same path as (d).
    BenchConfig("h", "plugin_coupled_race", "(h) EAGLE chain, plugin coupled, coupled-race drafts",
                CHAIN + REJECTION, True, (("SGLANG_DETSPEC_VERIFY", "coupled"),), True),
)}

# Measured first: the ratios against (b) of the plugin's configurations survive a run cut short.
DEFAULT_ORDER = "bdeicagfh"
DEFAULT_CONCURRENCIES = (1, 8, 32, 128)


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


@dataclasses.dataclass(frozen=True)
class ServerSettings:
    """Flags every server shares (see :func:`server_command`)."""

    target: str
    draft: str
    max_total_tokens: int = 65536
    max_running_requests: int = 128
    mem_fraction_static: float = 0.88
    extra: tuple[str, ...] = ()

    def __post_init__(self):
        if not 1024 <= self.max_total_tokens <= 10_000_000:
            raise ValueError(f"max_total_tokens must lie in [1024, 1e7], got {self.max_total_tokens}")
        if not 1 <= self.max_running_requests <= 4096:
            raise ValueError(f"max_running_requests must lie in [1, 4096], got {self.max_running_requests}")
        if not 0.05 <= self.mem_fraction_static <= 0.95:
            raise ValueError(f"mem_fraction_static must lie in [0.05, 0.95], got {self.mem_fraction_static}")


def server_command(config: BenchConfig, settings: ServerSettings, *, port: int, python: str = sys.executable,
                   tp_size: int = 1, dp_size: int = 1) -> list[str]:
    """The ``python -m sglang.launch_server`` command line of ``config``.

    Why these shared flags: ``--attention-backend triton`` (the GPU kit has no
    FA3, and deterministic mode would pick it on Hopper);
    ``--cuda-graph-backend-prefill disabled`` (prefill graphs cost minutes of
    Triton compilation at start); a fixed KV pool (``--max-total-tokens``)
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
           "--attention-backend", "triton", "--cuda-graph-backend-prefill", "disabled",
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


def bench_args(url: str, tokenizer: str, concurrency: int, load: LoadSettings, *, output_file: str,
               tag: str, profile_dir: str | None = None, profile_steps: int = 6) -> list[str]:
    """Arguments of ``python -m sglang.bench_serving`` for one concurrency level.

    ``random-ids`` with ``--tokenize-prompt`` sends token ids (no ShareGPT
    download, exact prompt lengths); the tokenizer is still loaded by the
    client (it reads ``vocab_size`` to draw ids and re-encodes the streamed
    text), and the server must detokenize: SGLang's ``sglang`` backend of
    bench_serving counts a streamed chunk only when it carries ``text``, so a
    ``--skip-tokenizer-init`` server would yield no latencies. With
    ``range_ratio 1`` every request has exactly ``input_len`` / ``output_len``
    tokens and ``ignore_eos`` (bench_serving's default) keeps them that long.

    With ``profile_dir``, SGLang's profiler records ``profile_steps`` decode
    steps once the decode batch holds ``concurrency`` requests (``--profile
    --profile-by-stage``; the server needs
    ``SGLANG_PROFILE_BY_STAGE_DECODE_MIN_BS``, see ``serving_run.py``).

    Raises:
        ValueError: concurrency below 1, profile_steps outside [1, 100].
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    # --model: without it bench_serving asks /v1/models; the served name is the model path.
    args = ["--backend", "sglang", "--base-url", url, "--model", tokenizer, "--tokenizer", tokenizer,
            "--dataset-name", "random-ids", "--tokenize-prompt",
            "--random-input-len", str(load.input_len), "--random-output-len", str(load.output_len),
            "--random-range-ratio", "1.0", "--num-prompts", str(load.prompts_for(concurrency)),
            "--max-concurrency", str(concurrency), "--request-rate", "inf",
            "--temperature", f"{load.temperature:g}", "--seed", str(load.seed),
            "--warmup-requests", str(min(concurrency, 8)), "--ready-check-timeout-sec", "0",
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
