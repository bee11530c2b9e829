"""Plumbing shared by the end-to-end suites: models, one real SGLang server at a time, audits, results.

The suites launch real SGLang 0.5.23 servers with SGLang's own test helpers
(``sglang.test.test_utils.popen_launch_server`` runs ``sglang serve``, which
loads the installed ``detspec`` plugin; ``sglang.srt.utils.kill_process_tree``
stops it) and talk to them over HTTP with
:class:`sglang_detspec.auditing.http_backend.HttpBackend`. SGLang and torch are imported
inside functions, so the test files collect (and skip) where there is no GPU.

Settings, all read from the environment, all optional:

============================ ===================================================
``DETSPEC_E2E_TARGET``        chain-EAGLE target model (default: the tiny Llama
                              ``target/`` of ``scripts/make_tiny_models.py``)
``DETSPEC_E2E_EAGLE``         its EAGLE draft (default: the tiny copying draft
                              ``eagle/``, a high-acceptance pair)
``DETSPEC_E2E_EAGLE_RANDOM``  a second, unrelated EAGLE draft for the same target
                              (default: the tiny ``eagle_random/``)
``DETSPEC_E2E_MTP``           model served with ``--enable-multi-layer-eagle``
                              (default: the tiny Step3p5 ``mtp/``, 2 MTP layers)
``DETSPEC_E2E_MTP_DRAFT``     its ``--speculative-draft-model-path`` (default:
                              ``DETSPEC_E2E_MTP``: the MTP layers are in it)
``DETSPEC_E2E_EAGLE3``        EAGLE3 draft of the target over a reduced vocabulary
                              (default: the tiny ``eagle3/``, with its token map)
``DETSPEC_E2E_EAGLE3_FULL``   EAGLE3 draft over the whole vocabulary (default:
                              the tiny ``eagle3_full/``)
``DETSPEC_E2E_MIMO``          model served with ``--speculative-algorithm NEXTN``,
                              its own MTP layer the draft (default: the tiny
                              MiMo ``mimo/``)
``DETSPEC_E2E_MODELS``        folder for the tiny models: written when missing,
                              reused when present (default: a temporary folder)
``DETSPEC_E2E_OUT``           folder for the JSON results and server logs
                              (default: a temporary folder, printed at the end);
                              give each pytest process its own when several run
                              at once (server logs are named by configuration)
``DETSPEC_E2E_SERVER_ARGS``   flags for every server (default
                              :data:`DEFAULT_SERVER_ARGS`)
``DETSPEC_E2E_MTP_SERVER_ARGS`` flags added after those for multi-layer EAGLE
                              servers (default :func:`default_mtp_server_args`:
                              FA3 attention when sgl-kernel ships it)
``DETSPEC_E2E_TRIALS``        audit trials per server (default 25, at least 24)
``DETSPEC_E2E_MAX_NEW_TOKENS`` probe length in the audits (default 32)
``DETSPEC_E2E_CONCURRENCY``   concurrent ``/generate`` senders per sub-batch
                              (default 2)
``DETSPEC_E2E_LAUNCH_TIMEOUT`` seconds to wait for a server's health (default 480)
``DETSPEC_E2E_SEEDS_FAMILY``  server family of ``test_request_seeds.py`` (default
                              ``coupled_chain``; e.g. ``no_spec``)
============================ ===================================================

Server configurations come in families (:data:`FAMILIES`): which model, which
draft, which speculative flags, which verify mode the plugin must log.

A flag given twice reaches SGLang's ``argparse`` twice and the last one wins,
so the two ``*_SERVER_ARGS`` settings can override the defaults (for example
``DETSPEC_E2E_MTP_SERVER_ARGS="--disable-hybrid-swa-memory --attention-backend fa3"``).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import datetime
import functools
import importlib.util
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import types
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]
MIN_TRIALS = 24  # the bar: the probe in at least 24 changing batches

# --max-total-tokens: SGLang sizes its KV pool from the GPU memory free when the server starts;
# a fixed pool (about 1 GiB for the tiny Llama pair, 13 GiB for the tiny MTP model, and room
# for the 256-request load without retraction) lets the suite files' servers share one GPU.
# --mem-fraction-static 0.6: SGLang 0.5.23 refuses to start ("Loaded weights leave no GPU memory
# for the KV cache") when, at its pool sizing, less than (1 - fraction) of the memory it saw free
# before loading its weights is still free; the servers of one file start together and fill the
# card meanwhile. At 0.4 one server of test_accept_lengths.py and the one of test_controls.py
# failed it on an H100 (SGLang named 0.407 and 0.426 the minimum; docs/e2e/2026-12-06-h100-final-code/).
# At 0.6 the others may take 60% of what a server saw free. The fraction also sizes a pool below
# the --max-total-tokens cap when memory is short (the tiny MTP model's got 46,502 of 262,144 tokens
# at 0.4), so pools may grow by a few GiB; each server still leaves 40% of what it saw free.
# Prefill CUDA graphs stay at SGLang's default (on), as a user's server runs them: the serving
# benchmark found them worth 19-27% to the coupled chain (two back-to-back commands). Every
# committed suite run up to docs/e2e/2026-12-05-h100-ranking added
# --cuda-graph-backend-prefill disabled (DETSPEC_E2E_SERVER_ARGS restores it).
DEFAULT_SERVER_ARGS = (
    "--attention-backend triton "
    "--skip-tokenizer-init --mem-fraction-static 0.6 --max-total-tokens 262144"
)
# SGLang counts Step3p5 (the tiny MTP model) as a hybrid sliding-window model
# whatever its layer types; all its layers use full attention, so the ordinary
# KV pool serves it (see scripts/make_tiny_models.py, write_mtp).
DEFAULT_MTP_SERVER_ARGS = "--disable-hybrid-swa-memory"
# SGLang 0.5.23 captures the multi-layer draft-extend step as one CUDA graph only with an
# attention backend that stages draft-extend metadata (FA3 on Hopper); with triton it falls
# back to one graph per step. FA3 is used whenever SGLang's kernel package ships it.
FA3_SERVER_ARGS = "--attention-backend fa3"


@functools.lru_cache(maxsize=1)
def fa3_installed() -> bool:
    """Whether sgl-kernel's FlashAttention-3 library is installed and loads (it is a separate shared object).

    A kit that cut the library can leave a file of that name behind that does
    not import ("cannot import name 'flash_ops' from 'sgl_kernel'"), so the
    import itself is the test.
    """
    spec = importlib.util.find_spec("sgl_kernel")
    if spec is None or not spec.submodule_search_locations:
        return False
    if not any(any(Path(folder).glob("flash_ops*.so")) for folder in spec.submodule_search_locations):
        return False
    try:
        from sgl_kernel import flash_ops  # noqa: F401
    except Exception:  # an ImportError, or a loader error of the shared object
        return False
    return True


def default_mtp_server_args() -> str:
    """The multi-layer servers' extra flags when ``DETSPEC_E2E_MTP_SERVER_ARGS`` is unset."""
    return f"{DEFAULT_MTP_SERVER_ARGS} {FA3_SERVER_ARGS}" if fa3_installed() else DEFAULT_MTP_SERVER_ARGS

EAGLE = ("--speculative-algorithm", "EAGLE")
EAGLE3 = ("--speculative-algorithm", "EAGLE3")
NEXTN = ("--speculative-algorithm", "NEXTN")
CHAIN_SHAPE = ("--speculative-num-steps", "3", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4")
TREE_SHAPE = ("--speculative-num-steps", "3", "--speculative-eagle-topk", "4", "--speculative-num-draft-tokens", "8")
WIDE_TREE_SHAPE = ("--speculative-num-steps", "5", "--speculative-eagle-topk", "4", "--speculative-num-draft-tokens", "16")
MULTI_LAYER_SHAPE = (
    "--enable-multi-layer-eagle",
    "--speculative-num-steps", "2", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "3",
)
REJECTION_FLAG = ("--speculative-use-rejection-sampling",)
CHAIN_EAGLE_ARGS = (*EAGLE, *CHAIN_SHAPE, *REJECTION_FLAG)
MULTI_LAYER_EAGLE_ARGS = (*EAGLE, *MULTI_LAYER_SHAPE, *REJECTION_FLAG)


@dataclasses.dataclass(frozen=True)
class Family:
    """What a server family serves and how it decodes.

    Attributes:
        model: the :class:`Models` field of ``--model-path``.
        draft: the :class:`Models` field of ``--speculative-draft-model-path``;
            None for a server without speculative decoding.
        spec_args: the speculative-decoding flags (empty without it).
        verify: the verify mode the plugin must log at start-up on a
            deterministic server (``verify='...'`` in its line); None where
            there is no verify (no speculative decoding).
        env: extra environment variables for the server.
    """

    model: str
    draft: str | None
    spec_args: tuple[str, ...]
    verify: str | None
    env: tuple[tuple[str, str], ...] = ()


# The verify mode comes from SGLANG_DETSPEC_VERIFY=auto (unset) everywhere except the
# coupled-race chain: auto picks rejection with --speculative-use-rejection-sampling and
# coupled without it, so these servers also check that rule.
FAMILIES = {
    # seeded rejection sampling (DESIGN.md section 4), chain EAGLE and multi-layer EAGLE
    "chain_eagle": Family("target", "eagle", CHAIN_EAGLE_ARGS, "rejection"),
    "multi_layer_eagle": Family("mtp", "mtp_draft", MULTI_LAYER_EAGLE_ARGS, "rejection"),
    # the plugin active without speculative decoding: every token is the TARGET-stream race
    "no_spec": Family("target", None, (), None),
    "mtp_no_spec": Family("mtp", None, (), None),
    # coupled verification (section 5) with its default coupled drafts: a chain races q on the
    # TARGET stream (start-up turns SGLang's sampled-draft path on), a tree takes q's Gumbel-top-k
    "coupled_chain": Family("target", "eagle", (*EAGLE, *CHAIN_SHAPE), "coupled"),
    "coupled_tree": Family("target", "eagle", (*EAGLE, *TREE_SHAPE), "coupled"),
    "coupled_tree_16": Family("target", "eagle", (*EAGLE, *WIDE_TREE_SHAPE), "coupled"),
    # the tree drafting as a chain of its depth for decode batches of more than 3 requests (shape_hook)
    "coupled_tree_chain_switch": Family("target", "eagle", (*EAGLE, *TREE_SHAPE), "coupled",
                                        (("SGLANG_DETSPEC_TREE_CHAIN_BATCH", "3"),)),
    # the same tree drafting the chain for decode batches longer than 100 summed tokens, whatever
    # their size (a single request crosses it as it grows)
    "coupled_tree_token_switch": Family("target", "eagle", (*EAGLE, *TREE_SHAPE), "coupled",
                                        (("SGLANG_DETSPEC_TREE_CHAIN_TOKENS", "100"),)),
    # the same on SGLang's own FA3 calls, its trees verified one decode query per node (the serving
    # benchmark's (o); the FA3 tree default adds the token bound; its claim needs fa3 at head sizes 65-128)
    "coupled_tree_switch_nodes": Family("target", "eagle", (*EAGLE, *TREE_SHAPE), "coupled",
                                        (("SGLANG_DETSPEC_TREE_CHAIN_BATCH", "3"),
                                         ("SGLANG_DETSPEC_TREE_ATTENTION", "nodes"),
                                         ("SGLANG_DETSPEC_DECODE_ATTENTION", "sglang"))),
    "coupled_chain_random_draft": Family("target", "eagle_random", (*EAGLE, *CHAIN_SHAPE), "coupled"),
    # SGLang's adaptive speculation: the draft step count follows the batch size and accept rate
    # (its default table), a change of drafts that coupled verify keeps out of the tokens
    "coupled_chain_adaptive": Family("target", "eagle", (*EAGLE, *CHAIN_SHAPE, "--speculative-adaptive"), "coupled"),
    "mtp_coupled": Family("mtp", "mtp_draft", (*EAGLE, *MULTI_LAYER_SHAPE), "coupled"),
    # coupled verification with drafts that race q on the TARGET stream (the chain sampler)
    "coupled_race_chain": Family("target", "eagle", CHAIN_EAGLE_ARGS, "coupled", (("SGLANG_DETSPEC_VERIFY", "coupled"),)),
    # the drafts users deploy: EAGLE3 over a reduced vocabulary (coupled only: rejection mode
    # refuses it) and over the whole vocabulary, and a model's own MTP layer as NEXTN
    "eagle3_chain": Family("target", "eagle3", (*EAGLE3, *CHAIN_SHAPE), "coupled"),
    "eagle3_tree": Family("target", "eagle3", (*EAGLE3, *TREE_SHAPE), "coupled"),
    "eagle3_full_chain": Family("target", "eagle3_full", (*EAGLE3, *CHAIN_SHAPE), "coupled"),
    "eagle3_full_tree": Family("target", "eagle3_full", (*EAGLE3, *TREE_SHAPE), "coupled"),
    "eagle3_full_rejection": Family("target", "eagle3_full", (*EAGLE3, *CHAIN_SHAPE, *REJECTION_FLAG), "rejection"),
    "mimo_no_spec": Family("mimo", None, (), None),
    "nextn_chain": Family("mimo", "mimo", (*NEXTN, *CHAIN_SHAPE), "coupled"),
    "nextn_tree": Family("mimo", "mimo", (*NEXTN, *TREE_SHAPE), "coupled"),
    "nextn_rejection": Family("mimo", "mimo", (*NEXTN, *CHAIN_SHAPE, *REJECTION_FLAG), "rejection"),
}

# The plugin's start-up line (sglang_plugin/resolve.py): "sglang-detspec active: ..."
# or "sglang-detspec inactive (SGLang's own sampling runs): ...".
PLUGIN_ACTIVE = "sglang-detspec active"
PLUGIN_INACTIVE = "sglang-detspec inactive"
# The verify mode in the active line: "... DetSpecConfig(active=True, ..., verify='coupled', ...)".
VERIFY_FIELD = re.compile(r"verify='(\w+)'")
# The logits guarantee in the active line (config.logits_guarantee): "... logits='bitwise' ...".
LOGITS_FIELD = re.compile(r"logits='(\w+)'")

# How much of a server log comes back with the results: its start (flags,
# plugin line, CUDA-graph capture) and its end (the last requests, shutdown).
LOG_HEAD_BYTES = 96 * 1024
LOG_TAIL_BYTES = 64 * 1024


def env_str(name: str, default: str) -> str:
    value = os.environ.get(name)
    return default if value is None or value.strip() == "" else value


def env_int(name: str, default: int, minimum: int = 1) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {raw!r}") from None
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


# -- results -------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def out_dir() -> Path:
    """Where results go: ``DETSPEC_E2E_OUT`` or one temporary folder per process."""
    fixed = os.environ.get("DETSPEC_E2E_OUT")
    folder = Path(fixed) if fixed else Path(tempfile.mkdtemp(prefix="detspec-e2e-"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@functools.lru_cache(maxsize=1)
def machine_facts() -> dict:
    """GPU, versions, date and the plugin's code revision (``code_revision``, the installed copy's stamp:
    ``sglang_detspec.revision.run_revision``) for every result file (nvidia-smi: no CUDA context in the test
    process)."""
    facts = {"date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
             # nvidia-smi lists every GPU; the servers of this process use these.
             "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
    try:
        query = ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"]
        facts["gpu"] = subprocess.run(query, capture_output=True, text=True, timeout=30).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        facts["gpu"] = None
    for module in ("sglang", "torch", "triton", "sglang_detspec"):
        try:
            facts[f"{module}_version"] = getattr(__import__(module), "__version__", None)
        except ImportError:
            facts[f"{module}_version"] = None
    try:
        from sglang_detspec.revision import run_revision
    except ImportError:
        facts["code_revision"] = None
    else:
        facts["code_revision"] = run_revision()
    return facts


def write_result(name: str, payload: dict) -> Path:
    """Write ``payload`` (with the machine facts) to ``<out>/<name>.json``; returns the path.

    Tests write before they assert, so a failing check is on disk with its numbers.
    """
    path = out_dir() / f"{name}.json"
    with open(path, "w") as f:
        json.dump({"name": name, **machine_facts(), **payload}, f, indent=1)
    return path


# -- models --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Models:
    """Model paths for the suites (see the module docstring for the variables)."""

    target: str
    eagle: str
    eagle_random: str
    mtp: str
    mtp_draft: str
    eagle3: str
    eagle3_full: str
    mimo: str
    tiny_dir: str | None  # where the tiny models were written or reused; None when all came from the environment

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


TINY_FOLDERS = ("target", "eagle", "eagle_random", "mtp", "eagle3", "eagle3_full", "mimo")
# Files whose absence means a tiny-model folder is from an older generator (the target's
# tokenizer serves the OpenAI endpoints of the request-seed suite; the MoE / MLA / FP8 family
# folders of scripts/tiny_families.py serve test_model_families.py; its version file marks the
# family targets whose layer outputs reach the logits, tiny_families.VERSION_FILE).
TOKENIZER_FILES = ("target/tokenizer.json", "target/tokenizer_config.json")
FAMILY_FILES = ("deepseek_v3_fp8/model.safetensors", "qwen3_moe_eagle3/model.safetensors", "tiny_families-v3.json")
TINY_FILES = TOKENIZER_FILES + FAMILY_FILES


@functools.cache
def tiny_models_script():
    """``scripts/make_tiny_models.py`` as a module (it is a script, not part of the package)."""
    spec = importlib.util.spec_from_file_location("make_tiny_models", REPO_ROOT / "scripts" / "make_tiny_models.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_tiny_models(folder: Path, vocab: int | None = None, attention_scale: float | None = None) -> None:
    """Run ``scripts/make_tiny_models.py`` into ``folder`` (fixed seed, no download; None: its defaults)."""
    module = tiny_models_script()
    module.main(str(folder), module.VOCAB if vocab is None else vocab,
                module.TARGET_ATTENTION_SCALE if attention_scale is None else attention_scale)


def tiny_models_complete(folder: Path, families: bool = True) -> bool:
    """Whether ``folder`` holds every tiny model this suite serves.

    ``families`` False: a set written for a vocabulary or attention scale of
    its own (:func:`tiny_models_with_vocab`), which ``make_tiny_models.py``
    writes without the MoE / MLA / FP8 family folders.
    """
    files = TINY_FILES if families else TOKENIZER_FILES
    return all((folder / sub / "model.safetensors").is_file() for sub in TINY_FOLDERS) and all(
        (folder / name).is_file() for name in files)


def resolve_models(make_temp_dir) -> Models:
    """Model paths from the environment, the tiny models filling in what is not set.

    Args:
        make_temp_dir: called with no argument for a fresh folder when the tiny
            models are needed and ``DETSPEC_E2E_MODELS`` is unset.
    """
    given = {key: os.environ.get(f"DETSPEC_E2E_{key.upper()}") or None for key in TINY_FOLDERS}
    tiny = None
    if not all(given.values()):
        fixed = os.environ.get("DETSPEC_E2E_MODELS")
        tiny = Path(fixed) if fixed else Path(make_temp_dir())
        if not tiny_models_complete(tiny):
            write_tiny_models(tiny)
    paths = {key: value or str(tiny / key) for key, value in given.items()}
    draft = os.environ.get("DETSPEC_E2E_MTP_DRAFT") or paths["mtp"]
    return Models(paths["target"], paths["eagle"], paths["eagle_random"], paths["mtp"], draft, paths["eagle3"],
                  paths["eagle3_full"], paths["mimo"], None if tiny is None else str(tiny))


def tiny_models_with_vocab(base: Path, vocab: int, attention_scale: float | None = None) -> Models:
    """The tiny models at a vocabulary of ``vocab`` tokens, in ``base/vocab<vocab>``, written when missing.

    For a suite whose requests need a larger vocabulary than the default set's
    (the ``DETSPEC_E2E_<MODEL>`` variables do not apply to it). ``attention_scale``
    (``make_tiny_models.py --attention-scale``; None: its default) names the
    folder ``vocab<vocab>-attention<scale>`` when given. The set is
    written into a sibling folder of this process and renamed into place, so
    two processes that need it at once never write one folder together: the
    later rename fails and its copy is removed.
    """
    name = f"vocab{vocab}" if attention_scale is None else f"vocab{vocab}-attention{attention_scale:g}"
    folder = base / name
    if not tiny_models_complete(folder, families=False):
        staging = base / f".{name}.{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        write_tiny_models(staging, vocab, attention_scale)
        try:
            os.rename(staging, folder)
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)
            if not tiny_models_complete(folder, families=False):
                raise
    paths = {key: str(folder / key) for key in TINY_FOLDERS}
    return Models(**paths, mtp_draft=paths["mtp"], tiny_dir=str(folder))


def vocab_size(model_path: str) -> int:
    """The model's vocabulary size from its ``config.json`` (SGLang's /server_info does not report it)."""
    with open(Path(model_path) / "config.json") as f:
        config = json.load(f)
    size = config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")
    if not isinstance(size, int) or size < 1:
        raise ValueError(f"no vocab_size in {model_path}/config.json")
    return size


# -- servers -------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ServerConfig:
    """One server configuration: what the tests compare is keyed by ``name``.

    ``verify`` is the verify mode the plugin must log (None: not checked);
    ``env`` the extra environment variables of the server process.
    """

    name: str
    model: str
    args: tuple[str, ...]
    deterministic: bool
    cuda_graph: bool
    env: tuple[tuple[str, str], ...] = ()
    verify: str | None = None

    def to_json(self) -> dict:
        return {"name": self.name, "model": self.model, "args": list(self.args), "env": dict(self.env),
                "deterministic": self.deterministic, "cuda_graph": self.cuda_graph, "verify": self.verify}


def family(name: str) -> Family:
    """The :class:`Family` called ``name``.

    Raises:
        ValueError: no such family (the message lists them).
    """
    if name not in FAMILIES:
        raise ValueError(f"unknown server family {name!r}; known: {', '.join(FAMILIES)}")
    return FAMILIES[name]


def served_model(family_name: str, models: Models) -> str:
    """The model folder a family serves (its vocabulary bounds the prompts)."""
    return getattr(models, family(family_name).model)


def server_config(family_name: str, models: Models, *, deterministic: bool = True, cuda_graph: bool = True,
                  extra_args: tuple[str, ...] = (), tag: str = "", tokenizer: bool = False,
                  extra_env: tuple[tuple[str, str], ...] = ()) -> ServerConfig:
    """The flags of the family ``family_name`` (see :data:`FAMILIES`) with the chosen switches.

    ``deterministic`` adds ``--enable-deterministic-inference`` (the plugin is
    active only then); ``cuda_graph=False`` adds ``--disable-cuda-graph``;
    ``extra_args`` come last (so they override earlier flags, e.g.
    ``--max-total-tokens``); ``tokenizer=True`` drops ``--skip-tokenizer-init``
    (SGLang's OpenAI endpoints build their responses' text with the
    tokenizer); ``tag`` tells apart configurations of one family that differ
    in ``extra_args``, ``extra_env`` or ``tokenizer``; ``extra_env`` adds
    environment variables for the server after the family's.
    """
    fam = family(family_name)
    common = common_args()
    if tokenizer:
        common = [a for a in common if a != "--skip-tokenizer-init"]
    args = [*fam.spec_args]
    if fam.draft is not None:
        args += ["--speculative-draft-model-path", getattr(models, fam.draft)]
    args += ["--device", "cuda", *common]
    if fam.model == "mtp":
        args += shlex.split(env_str("DETSPEC_E2E_MTP_SERVER_ARGS", default_mtp_server_args()))
    args += list(extra_args)
    if deterministic:
        args.append("--enable-deterministic-inference")
    if not cuda_graph:
        args.append("--disable-cuda-graph")
    parts = [family_name, tag, "det" if deterministic else "control", "cuda_graph" if cuda_graph else "no_cuda_graph"]
    return ServerConfig("_".join(p for p in parts if p), served_model(family_name, models), tuple(args),
                        deterministic, cuda_graph, env=(*fam.env, *extra_env), verify=fam.verify if deterministic else None)


def common_args() -> list[str]:
    """The flags every server gets: ``DETSPEC_E2E_SERVER_ARGS``, or :data:`DEFAULT_SERVER_ARGS` where unset."""
    return shlex.split(env_str("DETSPEC_E2E_SERVER_ARGS", DEFAULT_SERVER_ARGS))


def common_flag(flag: str) -> str | None:
    """The value every server's flags give ``flag`` (:func:`common_args`), or None.

    The last ``flag value`` or ``flag=value`` wins, as in SGLang's argument
    parser; a flag the suite does not pass gives None (SGLang's default).
    """
    args, value = common_args(), None
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
    return value


def served_page_size() -> int:
    """The KV page size every server runs at: ``--page-size`` of the suite's flags, else SGLang's default of 1.

    Raises:
        ValueError: ``--page-size`` is given something other than a positive integer.
    """
    value = common_flag("--page-size")
    if value is None:
        return 1
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"DETSPEC_E2E_SERVER_ARGS: --page-size must be a positive integer, got {value!r}")
    return int(value)


@functools.lru_cache(maxsize=1)
def sglang_test_helpers() -> types.SimpleNamespace:
    """SGLang's ``popen_launch_server`` and ``kill_process_tree``.

    ``sglang.test.test_utils`` imports SGLang's benchmark client, whose MMMU
    loader does ``from datasets import load_dataset`` at import time. Where the
    Hugging Face ``datasets`` package is absent (it is not a dependency of
    serving), a stand-in module whose ``load_dataset`` raises is registered so
    the helpers import; these suites load no dataset.
    """
    try:
        from sglang.test import test_utils
    except ModuleNotFoundError as exc:
        if exc.name != "datasets":
            raise
        stand_in = types.ModuleType("datasets")

        def load_dataset(*args, **kwargs):
            raise ImportError("the Hugging Face datasets package is not installed")

        stand_in.load_dataset = load_dataset
        sys.modules["datasets"] = stand_in
        from sglang.test import test_utils
    from sglang.srt.utils import kill_process_tree

    return types.SimpleNamespace(popen_launch_server=test_utils.popen_launch_server,
                                 kill_process_tree=kill_process_tree)


def ensure_sglang_command() -> str:
    """The ``sglang`` command that ``popen_launch_server`` runs: on PATH, or next to this Python.

    A venv's Python run by path (``.venv/bin/python -m pytest``) does not put
    the venv's ``bin`` on PATH; its console scripts sit next to the
    interpreter, so that folder is added to PATH (the servers inherit it).
    """
    found = shutil.which("sglang")
    if found:
        return found
    beside = Path(sys.executable).parent / "sglang"
    if beside.is_file() and os.access(beside, os.X_OK):
        os.environ["PATH"] = f"{beside.parent}{os.pathsep}{os.environ.get('PATH', '')}"
        return str(beside)
    raise RuntimeError(
        "SGLang's popen_launch_server runs the `sglang` command (console script sglang.cli.main:main), "
        "which is neither on PATH nor next to this Python; install SGLang with pip or put a script "
        "running sglang.cli.main.main on PATH"
    )


def free_port() -> int:
    """A TCP port nothing listens on now (a fresh one per server: a stopped server's ports may linger)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LogSink:
    """File sink for the server's output, written from SGLang's reader threads.

    ``popen_launch_server`` copies each output line to the sinks it is given
    from two threads (stdout, stderr) that outlive a killed server by a few
    lines; writes after :meth:`close` are dropped instead of raising there.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file = open(path, "w")
        self._lock = threading.Lock()
        self.last_write = time.monotonic()

    def write(self, text: str) -> None:
        with self._lock:
            if self._file is not None:
                self._file.write(text)
                self.last_write = time.monotonic()

    def flush(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.flush()

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


def trim_log(path: Path) -> None:
    """Keep the start and the end of a long server log, marking the cut."""
    data = path.read_bytes()
    if len(data) <= LOG_HEAD_BYTES + LOG_TAIL_BYTES:
        return
    cut = len(data) - LOG_HEAD_BYTES - LOG_TAIL_BYTES
    path.write_bytes(data[:LOG_HEAD_BYTES] + f"\n[... {cut} bytes cut ...]\n".encode() + data[-LOG_TAIL_BYTES:])


class RunningServer:
    """A server started by :meth:`Servers.ensure`: its URL, process and log."""

    def __init__(self, config: ServerConfig, url: str, process, sink: LogSink, launch_s: float) -> None:
        self.config = config
        self.url = url
        self.process = process
        self.sink = sink
        self.launch_s = launch_s

    def log_text(self) -> str:
        self.sink.flush()
        return self.sink.path.read_text(errors="replace")

    def log_lines(self, needle: str) -> list[str]:
        return [line.strip() for line in self.log_text().splitlines() if needle in line]

    def dump_stacks(self, reason: str) -> Path:
        """Every Python thread's stack in the server's processes, via ``py-spy dump``: the file written.

        For a request that hangs: the file says where each process of the
        server (launcher, tokenizer, scheduler, detokenizer) waits. Without
        ``py-spy`` on PATH the file says so.
        """
        import psutil

        path = out_dir() / f"stacks_{self.config.name}_{reason}.txt"
        spy = shutil.which("py-spy")
        parts = []
        try:
            procs = [psutil.Process(self.process.pid), *psutil.Process(self.process.pid).children(recursive=True)]
        except psutil.Error as exc:
            procs, parts = [], [f"server process gone: {exc}"]
        for proc in procs:
            if spy is None:
                parts.append("py-spy is not on PATH: no stacks")
                break
            try:
                name = " ".join(proc.cmdline())[:120]
            except psutil.Error:
                name = "?"
            run = subprocess.run([spy, "dump", "--pid", str(proc.pid)], capture_output=True, text=True, timeout=60)
            parts.append(f"== pid {proc.pid} {name}\n{run.stdout}{run.stderr}")
        path.write_text("\n".join(parts))
        return path

    def facts(self) -> dict:
        """What a result file records about the server."""
        return {**self.config.to_json(), "url": self.url, "launch_s": round(self.launch_s, 1),
                "log": self.sink.path.name, "plugin_lines": self.log_lines("sglang-detspec")[:8]}


def server_env(config_env) -> dict | None:
    """The environment a server is launched with, over this process's: ``config_env``, and offline as ``ON``.

    SGLang's ``popen_launch_server`` launches a server that fails to start a second
    time, online, when ``HF_HUB_OFFLINE`` is exactly ``"1"``; the suites' models are
    local and the GPU machine has no network, so that second start only doubles the
    cost of a failure. ``ON`` is the same setting to huggingface_hub (it reads 1, ON,
    YES and TRUE alike) without that retry.
    """
    env = dict(config_env)
    if env.get("HF_HUB_OFFLINE", os.environ.get("HF_HUB_OFFLINE")) == "1":
        env["HF_HUB_OFFLINE"] = "ON"
    return env or None


class Servers:
    """The SGLang servers a test module runs, and what was measured on each configuration.

    :meth:`ensure` keeps one server at a time (a configuration that is not
    running stops the others, unless it already failed to start: that raises
    its error and stops nothing); :meth:`ensure_group` starts several at once, in parallel (the tiny
    models share a GPU: each server's KV pool is fixed by
    ``--max-total-tokens``). Tests of one configuration sit next to each other
    in a file, so each configuration starts once per module; results are
    memoised by key so a later test reuses them instead of restarting a server.
    """

    def __init__(self, label: str = "") -> None:
        # Prefixes log and pid file names: two modules of one process may start the same configuration.
        self.label = f"{label}-" if label else ""
        self.running: dict[str, RunningServer] = {}
        self.memo: dict = {}
        # Configurations that did not start, with the error: every later test of one fails at
        # once with it, instead of spending another launch timeout and overwriting its log.
        self.failed: dict[str, str] = {}

    def ensure(self, config: ServerConfig) -> RunningServer:
        """The running server of ``config``; if it is not running, it starts and every other one stops.

        Raises:
            RuntimeError: the server did not become healthy (now or earlier in the module).
        """
        running = self.running.get(config.name)
        if running is not None and running.config == config and running.process.poll() is None:
            return running  # started with others by ensure_group: keep them all
        if config.name in self.failed:
            # Before ensure_group, which would stop every other server for a start it does not retry.
            raise RuntimeError(self.failed[config.name])
        outcome = self.ensure_group([config])[config.name]
        if isinstance(outcome, str):
            raise RuntimeError(outcome)
        return outcome

    def ensure_group(self, configs) -> dict:
        """Servers of all ``configs`` running at once: name -> :class:`RunningServer`, or the start error (str).

        Servers of other configurations are stopped first; the missing ones start
        in parallel; one that does not start does not stop the others.
        """
        wanted = {c.name: c for c in configs}
        if len(wanted) != len(configs):
            raise ValueError("configs must have distinct names")
        for name, server in list(self.running.items()):
            # A server that died is started again; its new log shows why it died.
            if wanted.get(name) != server.config or server.process.poll() is not None:
                self._stop(name)
        missing = [c for c in configs if c.name not in self.running and c.name not in self.failed]
        if missing:
            # Resolved once here: the lookups write sys.modules and os.environ, not thread-safe.
            helpers = sglang_test_helpers()
            ensure_sglang_command()
            with concurrent.futures.ThreadPoolExecutor(len(missing)) as pool:
                outcomes = list(pool.map(lambda c: self._launch(c, helpers), missing))
            for config, outcome in zip(missing, outcomes):
                if isinstance(outcome, RunningServer):
                    self.running[config.name] = outcome
                else:
                    self.failed[config.name] = outcome
        return {c.name: self.running.get(c.name) or self.failed[c.name] for c in configs}

    def _launch(self, config: ServerConfig, helpers):
        url = f"http://127.0.0.1:{free_port()}"
        sink = LogSink(self._log_path(config))
        timeout = env_int("DETSPEC_E2E_LAUNCH_TIMEOUT", 480)
        started = time.monotonic()
        try:
            process = helpers.popen_launch_server(
                config.model, url, timeout=timeout, other_args=list(config.args),
                env=server_env(config.env),  # merged over this process's environment
                return_stdout_stderr=(sink, sink), device="cuda",  # --device is in the args already
            )
        except Exception as exc:
            self._close_log(sink)
            return f"server {config.name} did not become healthy within {timeout} s: {exc} (log: {sink.path})"
        server = RunningServer(config, url, process, sink, time.monotonic() - started)
        # Lets a wrapper that had to kill pytest (a per-command time limit) stop this server too.
        self._pid_file(config).write_text(str(process.pid))
        return server

    def _log_path(self, config: ServerConfig) -> Path:
        """The server's log file; a restart of the same server writes ``.2.log``, ``.3.log``, ... beside the first."""
        stem = out_dir() / f"server_{self.label}{config.name}"
        path, start = stem.with_name(stem.name + ".log"), 2
        while path.exists():
            path, start = stem.with_name(f"{stem.name}.{start}.log"), start + 1
        return path

    def stop(self) -> None:
        """Stop every running server."""
        for name in list(self.running):
            self._stop(name)

    def _stop(self, name: str) -> None:
        server = self.running.pop(name)
        sglang_test_helpers().kill_process_tree(server.process.pid)
        self._pid_file(server.config).unlink(missing_ok=True)
        self._close_log(server.sink)

    def _pid_file(self, config: ServerConfig) -> Path:
        return out_dir() / f"server_{self.label}{config.name}.pid"

    @staticmethod
    def _close_log(sink: LogSink) -> None:
        # The reader threads drain what the dead processes left in the pipes.
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline and time.monotonic() - sink.last_write < 0.5:
            time.sleep(0.1)
        sink.close()
        trim_log(sink.path)

    def remember(self, key: str, compute):
        """``compute()`` once per key for the module's lifetime."""
        if key not in self.memo:
            self.memo[key] = compute()
        return self.memo[key]


def plugin_state(server: RunningServer) -> tuple[bool, list[str]]:
    """(the plugin logged itself active and never inactive, its log lines)."""
    lines = server.log_lines("sglang-detspec")
    active = any(PLUGIN_ACTIVE in line for line in lines) and not any(PLUGIN_INACTIVE in line for line in lines)
    return active, lines


def verify_modes(lines) -> list[str]:
    """The ``verify='...'`` values in the plugin's active start-up lines among ``lines``."""
    return [m for line in lines if PLUGIN_ACTIVE in line for m in VERIFY_FIELD.findall(line)]


def plugin_verify_modes(server: RunningServer) -> list[str]:
    """The verify modes the plugin logged at start-up (one per process that logged its line)."""
    return verify_modes(server.log_lines(PLUGIN_ACTIVE))


def claimed_logits(server: RunningServer) -> list[str]:
    """The logits guarantees (``bitwise`` / ``tokens``) the plugin's start-up lines claim, sorted, each once."""
    return sorted({m for line in server.log_lines(PLUGIN_ACTIVE) for m in LOGITS_FIELD.findall(line)})


def hopper() -> bool:
    """The suites run on a Hopper GPU (compute capability 9.x), where the DeepGEMM warm-up must run."""
    import torch

    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


def split_can_serve(backend: str, page_size: int, kv_cache_dtype: str | None) -> bool:
    """Whether the plugin's split can serve a ``backend`` server with these flags (its start-up lines say which).

    The split kernels read pages of one token (``config.SPLIT_PAGE_SIZE``) of a
    16-bit KV cache; the FA3 split takes SGLang's ``auto`` KV dtype only
    (``fa3_split.backend_problem``), the Triton one a 16-bit buffer (``auto`` or
    an explicit ``bf16``). Elsewhere every server logs the split not used.
    """
    from sglang_detspec.config import EXPLICIT_16_BIT_KV_CACHE_DTYPES, MEASURED_KV_CACHE_DTYPE, SPLIT_PAGE_SIZE

    if page_size > SPLIT_PAGE_SIZE:
        return False
    if kv_cache_dtype in (None, MEASURED_KV_CACHE_DTYPE):
        return True
    return backend == "triton" and kv_cache_dtype in EXPLICIT_16_BIT_KV_CACHE_DTYPES


def fa3_path_problem(server: RunningServer, decode_attention: str, head_dim: int | None,
                     verifies_trees: bool, split_serves: bool = True) -> str | None:
    """What is wrong with an FA3 server's attention-path lines under ``decode_attention`` (None: nothing).

    With ``split`` (the default) a server that verifies no trees at a head
    size of 65-128 must log that the split stands down for SGLang's own calls
    (``config.fa3_own_calls_exact``); every other server must log the split
    taking the target, and none may log it not used. Where the split cannot
    serve the server's flags (``split_serves`` False: :func:`split_can_serve`)
    every server must log it not used and none taking the target.
    """
    if decode_attention != "split":
        return None
    from sglang_detspec.config import fa3_own_calls_exact
    from sglang_detspec.sglang_plugin.fa3_split_hook import SPLIT_OFF, SPLIT_ON, STANDS_DOWN

    if not split_serves:
        if server.log_lines(SPLIT_OFF) and not server.log_lines(SPLIT_ON):
            return None
        return (f"{server.config.name}: expected the start-up line {SPLIT_OFF!r} (the split cannot serve these "
                f"flags); its lines: {(server.log_lines('FA3 split') + server.log_lines('DECODE_ATTENTION=split'))[:2]}")
    want = STANDS_DOWN if fa3_own_calls_exact(head_dim, verifies_trees) else SPLIT_ON
    if server.log_lines(want) and not server.log_lines(SPLIT_OFF):
        return None
    seen = server.log_lines("FA3 split") + server.log_lines("DECODE_ATTENTION=split")
    return (f"{server.config.name}: expected the start-up line {want!r} at head size {head_dim} "
            f"({'a tree' if verifies_trees else 'no trees'}); its lines: {seen[:2]}")


def node_path_problem(server: RunningServer) -> str | None:
    """What is wrong with the start-up lines of a server that must verify its trees by the FA3 node path, or None.

    It must log the node path taking the target (``NODE_PATH_ON``) and never
    the cascade kept (``NODE_PATH_OFF``: a backend the node path turned down).
    """
    from sglang_detspec.sglang_plugin.tree_attention_hook import NODE_PATH_OFF, NODE_PATH_ON

    if server.log_lines(NODE_PATH_ON) and not server.log_lines(NODE_PATH_OFF):
        return None
    return f"the node path did not run (its start-up lines: {server.log_lines('FA3 tree verify')[:2]})"


def plugin_problems(server: RunningServer) -> list[str]:
    """What is wrong with the plugin's start-up lines of a deterministic server (empty: nothing).

    The plugin must log itself active (never inactive), no failed start-up
    warm-up, its DeepGEMM warm-up (done, or why not; done on Hopper unless
    the configuration turns it off), and, where the configuration names a
    verify mode, log that mode and no other.
    """
    active, lines = plugin_state(server)
    if not active:
        shown = "; ".join(lines[:2]) or "no sglang-detspec line at all"
        return [f"{server.config.name}: the plugin did not log itself active and only active ({shown})"]
    from sglang_detspec.config import GEMM_WARMUP_ENV
    from sglang_detspec.sglang_plugin import gemm_warmup_hook as gemms  # imports torch: only where servers ran

    failed = [line for line in lines if "warm-up failed" in line]
    if failed:
        return [f"{server.config.name}: a start-up warm-up failed ({failed[0]})"]
    if not any(gemms.WARMED_LOG in line or gemms.SKIPPED_LOG in line for line in lines):
        return [f"{server.config.name}: no DeepGEMM warm-up line ('{gemms.WARMED_LOG}' or '{gemms.SKIPPED_LOG}')"]
    if hopper() and dict(server.config.env).get(GEMM_WARMUP_ENV, "").strip() not in ("0", "0.0") and not any(
            gemms.WARMED_LOG in line for line in lines):
        skipped = next(line for line in lines if gemms.SKIPPED_LOG in line)
        return [f"{server.config.name}: DeepGEMM was not warmed on Hopper ({skipped})"]
    want = server.config.verify
    modes = plugin_verify_modes(server)
    if want is not None and (not modes or set(modes) != {want}):
        return [f"{server.config.name}: the plugin logged verify modes {sorted(set(modes))}, expected only {want!r}"]
    return []


# -- audits --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class AuditRun:
    """One audit of one server configuration."""

    config: ServerConfig
    plan: object  # sglang_detspec.auditing.batch.AuditPlan
    summary: object  # sglang_detspec.auditing.batch.RunSummary
    report: dict  # sglang_detspec.auditing.batch.build_report(...) plus the server facts
    plugin_active: bool
    plugin_problems: tuple[str, ...] = ()  # plugin_problems() of the server (deterministic configs)

    def probe_outputs(self) -> set[tuple[int, ...]]:
        return {o.probe.output_ids for o in self.summary.outcomes}


def audit_plan(vocab: int):
    """The trial schedule every server runs: same probe, same fillers, batch sizes 1..32."""
    from sglang_detspec.auditing.batch import build_plan

    trials = env_int("DETSPEC_E2E_TRIALS", 25, minimum=MIN_TRIALS)
    return build_plan(trials, seed=0, max_new_tokens=env_int("DETSPEC_E2E_MAX_NEW_TOKENS", 32), vocab_size=vocab)


def run_audit(servers: Servers, config: ServerConfig, vocab: int) -> AuditRun:
    """The changing-batch audit on ``config``'s server, once per module (memoised).

    A server that does not start, or an audit that stops on an error, writes
    ``<config>_audit_error.json`` with the error, and every test that asks for
    this audit then fails with it (the error is memoised too).
    """

    def compute():
        try:
            return audit(servers, config, vocab)
        except Exception as exc:  # recorded, then raised again to every caller
            message = f"{type(exc).__name__}: {exc}"
            write_result(f"{config.name}_audit_error", {"passed": False, "problems": [message],
                                                        "config": config.to_json()})
            return RuntimeError(f"{config.name}: the audit did not complete: {message}")

    outcome = servers.remember(f"audit:{config.name}", compute)
    if isinstance(outcome, Exception):
        raise outcome
    return outcome


def audit(servers: Servers, config: ServerConfig, vocab: int) -> AuditRun:
    """Start ``config``'s server if needed and run the audit plan on it (not memoised)."""
    from sglang_detspec.auditing.batch import build_report, judge, run_plan
    from sglang_detspec.auditing.http_backend import HttpBackend, avg_spec_accept_length

    server = servers.ensure(config)
    plan = audit_plan(vocab)
    concurrency = env_int("DETSPEC_E2E_CONCURRENCY", 2)
    # With the plugin active the server admits seeds in [0, 2**64) as they are; a control
    # server checks them as stock SGLang does and needs the int64 bits of seeds >= 2**63.
    encoding = "uint64" if config.deterministic else "int64"
    with HttpBackend(server.url, concurrency=concurrency, seed_encoding=encoding) as backend:
        info = backend.server_info()
        summary = run_plan(backend, plan)
        # Asked after the trials so the server's lifetime counters include them.
        summary = dataclasses.replace(summary, server_avg_accept_length=avg_spec_accept_length(backend.server_info()))
    active, _ = plugin_state(server)
    settings = {
        "trials": len(plan.trials), "max_new_tokens": plan.probe.max_new_tokens, "seed": 0,
        "vocab_size": vocab, "concurrency": concurrency, "seed_encoding": encoding,
        "server_info": {k: info.get(k) for k in (
            "version", "model_path", "speculative_algorithm", "speculative_num_steps",
            "speculative_num_draft_tokens", "enable_multi_layer_eagle", "enable_deterministic_inference",
            "speculative_use_rejection_sampling", "attention_backend", "disable_cuda_graph",
            "disable_radix_cache", "max_running_requests")},
    }
    report = build_report(plan, [summary], judge(summary), settings)
    report["server"] = server.facts()
    problems = tuple(plugin_problems(server)) if config.deterministic else ()
    return AuditRun(config, plan, summary, report, active, problems)


def audit_numbers(run: AuditRun) -> dict:
    """The headline numbers of an audit, for result files and assertion messages."""
    s = run.summary
    return {
        "trials": len(s.outcomes), "unique_probe_outputs": s.unique_probe_outputs,
        "probe_logprobs_identical": s.probe_logprobs_identical, "unique_probe_logprobs": s.unique_probe_logprobs,
        "mean_accept_length": s.mean_accept_length, "server_avg_accept_length": s.server_avg_accept_length,
        "varying_requests": s.varying_requests, "num_requests": s.num_requests,
        "plugin_active": run.plugin_active, "wall_time_s": round(s.wall_time_s, 2),
        "plugin_verify_modes": sorted(set(verify_modes(run.report["server"]["plugin_lines"]))),
    }


def check_deterministic_audit(run: AuditRun, result_name: str) -> None:
    """Write ``run``'s result and assert the seeded probe was batch-invariant.

    Pass: the plugin logged itself active (in the configuration's verify
    mode, :func:`plugin_problems`), at least :data:`MIN_TRIALS` trials,
    exactly 1 unique probe output, bitwise-equal probe logprobs, and 0
    varying requests: every filler request too gave one output in every
    batch it ran in.
    """
    numbers = audit_numbers(run)
    problems = list(run.plugin_problems)
    if numbers["trials"] < MIN_TRIALS:
        problems.append(f"only {numbers['trials']} trials (at least {MIN_TRIALS} required)")
    if numbers["unique_probe_outputs"] != 1:
        problems.append(f"{numbers['unique_probe_outputs']} unique probe outputs (1 required)")
    if numbers["probe_logprobs_identical"] is not True:
        problems.append(
            f"probe logprobs not bitwise equal across trials ({numbers['unique_probe_logprobs']} distinct sequences)"
        )
    if numbers["varying_requests"]:
        problems.append(f"{numbers['varying_requests']} of {numbers['num_requests']} requests (fillers included) "
                        "changed output between batches (0 required)")
    path = write_result(result_name, {"passed": not problems, "problems": problems, "measured": numbers,
                                      "audit": run.report})
    assert not problems, f"{run.config.name}: " + "; ".join(problems) + f" ({path})"


def check_control_audit(run: AuditRun, result_name: str) -> None:
    """Write ``run``'s result and assert the control (no deterministic inference) varied: > 1 unique output."""
    numbers = audit_numbers(run)
    problems = []
    if run.plugin_active:
        problems.append("the plugin logged itself active on a server without --enable-deterministic-inference")
    if numbers["unique_probe_outputs"] <= 1:
        problems.append(
            f"{numbers['unique_probe_outputs']} unique probe output: the trials showed no batch dependence to guard against"
        )
    path = write_result(result_name, {"passed": not problems, "problems": problems, "measured": numbers,
                                      "audit": run.report})
    assert not problems, f"{run.config.name}: " + "; ".join(problems) + f" ({path})"


def check_same_tokens(runs: list[AuditRun], result_name: str) -> None:
    """Write and assert: every run's probe gave the same tokens (CUDA graphs on/off, across a restart).

    Logprob equality across the runs is recorded, not required: the issue asks
    for the same tokens across configurations and bitwise logprobs within one.
    """
    outputs = set().union(*(r.probe_outputs() for r in runs))
    # repr keeps -0.0 apart from 0.0: the audit's notion of bitwise equal.
    logprobs = {tuple(map(repr, o.probe.output_logprobs or ())) for r in runs for o in r.summary.outcomes}
    measured = {
        "configs": [r.config.name for r in runs],
        "unique_probe_outputs_per_config": {r.config.name: len(r.probe_outputs()) for r in runs},
        "unique_probe_outputs_across_configs": len(outputs),
        "unique_probe_logprob_sequences_across_configs": len(logprobs),
        "probe_output_ids": [list(t) for t in sorted(outputs)],
        "launch_s": {r.config.name: r.report["server"]["launch_s"] for r in runs},
    }
    passed = len(outputs) == 1
    path = write_result(result_name, {"passed": passed, "measured": measured})
    assert passed, (
        f"the probe gave {len(outputs)} different outputs across {', '.join(measured['configs'])} "
        f"(1 required) ({path})"
    )


def backend_list(variable: str, raw: str, known, noun: str = "backend", plural: str = "backends") -> tuple[str, ...]:
    """``raw``, the comma-separated value of the environment variable ``variable``, as a tuple of names.

    ``noun`` and ``plural`` say what the names are (backends, families), for the messages.

    Raises:
        ValueError: a name outside ``known``, a name given twice, or no name
            at all (e.g. ``","``); the message names the variable and the allowed values.
    """
    names = [part.strip() for part in raw.split(",")]
    allowed = f"allowed: {', '.join(known)}, comma-separated"
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"{variable}={raw!r} names unknown {plural} {unknown} ({allowed})")
    if len(set(names)) != len(names):
        raise ValueError(f"{variable}={raw!r} names a {noun} twice ({allowed})")
    return tuple(names)
