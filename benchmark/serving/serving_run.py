"""The end-to-end serving benchmark in one command: models, servers, bench_serving, profile, report.

Schedule (it must fit one command of at most 600 s on one or two GPUs):

1. Write the 8B-shape target and its EAGLE draft (``serving_models.py``,
   in a child process so its GPU memory is released), unless present.
2. Start up to ``--max-servers-per-gpu`` (3) servers per GPU at once, each with a
   fixed KV pool (``--max-total-tokens``), configurations assigned round-robin
   in priority order (``--configs``, default ``bdeicagfh``: the ratios survive a
   run cut short). Fewer where the GPU's memory holds fewer (``gpu_fit``'s
   estimate: 3 on an H200, 2 on an H100 at the defaults); an interleaved
   command whose servers cannot all be up at once stops before any starts.
3. Measure one server at a time (``serving_driver.py``: ``bench_serving`` at
   each concurrency until ``--repeats`` runs of at least ``--min-seconds``
   each, shorter runs kept as warm-ups; see ``RepeatSettings``), so
   measurements never overlap, and only on a GPU where no server is starting;
   a measured server is stopped and the next waiting configuration starts in
   its place.
4. For the configurations in ``--profile``, one more run at the largest
   concurrency with SGLang's profiler on (decode steps only), summarised by
   ``serving_trace.py``.
5. The report (``serving_report.py``) is rewritten after every server, so
   whatever was measured before a time limit is on disk.

Every wait has a time limit and the whole run stops at ``--budget-s``: then
servers are stopped and the report is written from what was measured.

    python benchmark/serving/serving_run.py --out OUT --models DIR [--budget-s 560] [--configs bdei]

Several commands, each measuring (b) beside its own configurations, make one
report with ``serving_report.py OUT1 OUT2 --out MERGED`` (ratios to (b)
within each command).

Two other modes share the models, server plans, time limits and report
rewriting:

- ``--breakdown`` (default configurations ``adefg``): the servers start
  together (``--max-servers-per-gpu`` of them per GPU), and each ready server
  in turn, the others idle, runs one breakdown cell per concurrency
  (``serving_breakdown.py``: a lockstep wave of c requests, a few decode
  steps profiled, the kernels classified by ``serving_kernels.py``); then it
  is stopped. Writes ``breakdown.json`` / ``.md`` / ``.png`` after every cell
  and ``breakdown/<key>_<name>_c<c>.json`` with each cell's largest kernels.
  A cell not measured (time, a failed server, a wave that never filled) is
  listed with the reason; a cell whose kernel sequence does not fit the layer
  pattern is still measured, by kernel name only (marked ``*``).
- ``--interleave`` (default ``abd``; at most three servers, each with its
  reference: (a), or (g) for (f)): every server is started at once; when
  none is starting any more, the driver runs the interleaved protocol over
  the ready ones (``serving_interleave.py``: the order alternates from
  round to round, every configuration runs the same prompt count) and
  ``serving.json`` gains ``ratio_to_a`` (and to (b), (g)) from runs of the
  same round and ``rounds``, the rounds measured per cell.
- ``--breakdown --interleave`` (default ``ade``; at most three servers):
  both on the same servers, started once, all at once. Every breakdown
  cell runs first (one server at a time, the others idle); the time left then goes to
  the interleaved protocol over ``--interleave-configs`` (default: all) at
  ``--interleave-concurrency`` (default: ``--concurrency``), calibration
  first, then as many rounds as fit. Writes ``breakdown.json`` and
  ``serving.json`` (each with its ``.md``) into the one result folder; a
  cell of either part that did not fit is listed as missing with the reason.

With either interleaved mode, ``--window-profile C,...`` then profiles one
serving window per server and concurrency, requests arriving as others end
(``serving_window.py``: wall time by prefill / extend, draft, verify, draft
extend, the rest and GPU idle; ``window.json`` / ``.md``); the rounds get
the command's time less ``WINDOW_CELL_S`` per window.

``--server-env KEY=VALUE`` (repeatable) and ``--server-args '...'`` reach
every configuration that runs the plugin, never (a), (b) or (g), so one
harness measures a plugin setting on and off. ``--sleep-on-idle`` reaches
every server: SGLang's flag that lets a scheduler without requests sleep
instead of polling on a CPU core, for the servers that wait their turn.
Every server keeps SGLang's prefill CUDA graphs (its default);
``--no-prefill-graphs`` turns them off on every server, so each prefill runs
eagerly (the setting of every serving command before 2026-12-05's last).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import glob
import importlib.metadata
import json
import os
import select
import shlex
import signal
import subprocess
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from serving_configs import (  # noqa: E402
    ATTENTION_BACKENDS, CONFIGS, DEFAULT_CONCURRENCIES, DEFAULT_ORDER, LoadSettings, RepeatSettings, ServerSettings,
    SLEEP_ON_IDLE, parse_env_pairs, parse_int_list, parse_keys, plugin_overrides, server_command, shell_line,
)
from serving_breakdown import CaptureSettings  # noqa: E402
from serving_interleave import MAX_SERVERS, pairable, schedule  # noqa: E402
from serving_models import SHAPES  # noqa: E402
from gpu_fit import gpu_memory_gib, kv_tokens, pool_that_fits, server_gib  # noqa: E402
import serving_host  # noqa: E402

REPORT_RESERVE_S = 15  # kept back at the end for stopping servers and writing the report
DRIVER_WRAP_UP_S = 5  # the driver starts no run predicted to end later than this before its limit
DEFAULT_PROFILE = "dc"  # profiled unless --profile says otherwise, where --configs has them
# --configs when it is not given ("combined": --breakdown --interleave)
DEFAULT_MODE_CONFIGS = {"breakdown": "adefg", "interleave": "abd", "combined": "ade"}
BREAKDOWN_MIN_CELL_S = 30  # no breakdown cell starts with less left (warm-up, wave, profile export, parse)
BREAKDOWN_TRACES = os.path.join("/tmp", "detspec-breakdown-traces")  # large traces stay out of the result folder
WINDOW_TRACES = os.path.join("/tmp", "detspec-window-traces")  # as BREAKDOWN_TRACES: the traces stay on the machine
WINDOW_CELL_S = 45  # kept per serving window: the load's first requests, the profiled steps, the trace's export
# No server starts with less left: it needs 80-200 s to become healthy, so it would only delay the report.
START_RESERVE_S = 150


@dataclasses.dataclass
class Server:
    key: str
    gpu: int
    port: int
    argv: list
    env: dict
    log_path: str
    process: subprocess.Popen | None = None
    started: float = 0.0
    ready_s: float | None = None
    state: str = "waiting"  # waiting -> starting -> ready -> done | failed


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="result folder (created)")
    p.add_argument("--models", required=True,
                   help="model folder, written when missing (about 16 GB; keep it outside --out)")
    p.add_argument("--accept", type=float, default=0.85,
                   help="draft per-token acceptance (serving_models.py; default %(default)s)")
    p.add_argument("--shape", default="llama-8b", choices=sorted(SHAPES),
                   help="target shape serving_models.py writes into --models (default llama-8b); a --models "
                        "folder written with another shape is refused")
    p.add_argument("--configs", default=None,
                   help="configuration keys in priority order (default bdeicagfh; adefg with --breakdown, "
                        f"abd with --interleave, ade with both; at most {MAX_SERVERS} with --interleave): "
                        + "; ".join(CONFIGS[k].title for k in sorted(CONFIGS)))
    p.add_argument("--breakdown", action="store_true",
                   help="instead of bench_serving cells: GPU time per decode step by kernel class at each "
                        "concurrency (serving_breakdown.py), one configuration at a time; writes breakdown.json. "
                        "With --interleave: both on the same servers, the breakdown first")
    p.add_argument("--interleave", action="store_true",
                   help="every server up at once, each cell's runs in rounds of alternating order with equal "
                        "prompt counts (serving_interleave.py); serving.json gains ratio_to_a (ratio_to_b, "
                        "ratio_to_g) and rounds")
    p.add_argument("--interleave-configs", default=None,
                   help="--breakdown --interleave: configuration keys of the interleaved part, a subset of "
                        "--configs holding each one's reference (default: all of --configs)")
    p.add_argument("--interleave-concurrency", default=None,
                   help="--breakdown --interleave: concurrencies of the interleaved part, a subset of "
                        "--concurrency (default: all of --concurrency)")
    p.add_argument("--alternations", type=int, default=3,
                   help="--interleave: rounds per cell after the calibration run (default 3; cut by the budget)")
    p.add_argument("--server-env", action="append", default=[], metavar="KEY=VALUE",
                   help="environment of every configuration that runs the plugin (repeatable)")
    p.add_argument("--server-args", default="", metavar="'ARGS'",
                   help="extra launch_server arguments of every configuration that runs the plugin, one "
                        "shell-quoted string (write --server-args='--flag' for a single flag)")
    p.add_argument("--breakdown-output-len", type=int, default=192,
                   help="--breakdown: new tokens per request of the measured wave (default 192)")
    p.add_argument("--breakdown-start-tokens", type=int, default=64,
                   help="--breakdown: tokens every request has streamed when the profile starts (default 64: "
                        "the context then matches the cells' mean, input + output / 2)")
    p.add_argument("--host-profile", default="",
                   help="--breakdown: concurrencies at which the scheduler process is also sampled with py-spy "
                        "during a lockstep wave (serving_host.py; e.g. 1,8); writes host.json. Default: none")
    p.add_argument("--host-seconds", type=float, default=3.0,
                   help="--host-profile: seconds of py-spy sampling per cell (default 3)")
    p.add_argument("--host-output-len", type=int, default=4096,
                   help="--host-profile: new tokens per request of the sampled wave; it must outlast the "
                        "recording (default 4096: a chain at one request streams about 500 tokens/s)")
    p.add_argument("--window-profile", default="",
                   help="with --interleave, after the rounds: at these concurrencies (comma list, each in "
                        "--concurrency) one profiled serving window per server, requests arriving as others end "
                        "(their first requests staggered; serving_window.py: wall time by prefill / extend, "
                        "decode, verify, draft, draft extend, the rest and GPU idle, and the scheduler thread's "
                        "time inside and outside SGLang's spans; window.json / window.md). Each window keeps "
                        f"{WINDOW_CELL_S} s "
                        "of --budget-s back from the rounds. The profiler records host activities, which adds "
                        "host time to every launch: compare windows with each other, not with the rounds")
    p.add_argument("--window-steps", type=int, default=40,
                   help="--window-profile: scheduler iterations per window, 5-400 (default 40)")
    p.add_argument("--breakdown-steps", type=int, default=8,
                   help="--breakdown: forwards profiled per cell (default 8; the first is left out)")
    p.add_argument("--concurrency", default=",".join(map(str, DEFAULT_CONCURRENCIES)),
                   help="requests in flight per cell, comma-separated (default %(default)s)")
    p.add_argument("--profile", default=None,
                   help="configuration keys profiled at the largest concurrency ('' for none; "
                        f"default: whichever of the keys {', '.join(DEFAULT_PROFILE)} --configs holds)")
    p.add_argument("--profile-steps", type=int, default=6,
                   help="--profile: forwards recorded by SGLang's profiler per profiled server (default 6)")
    p.add_argument("--gpus", type=int, default=None,
                   help="how many GPUs to use, a count (default: all nvidia-smi lists; 2 for --dry-run)")
    p.add_argument("--max-servers-per-gpu", type=int, default=3,
                   help="servers held on one GPU at once (default 3: about 30 GB each at 8B)")
    p.add_argument("--budget-s", type=float, default=560.0,
                   help="wall-clock limit of the whole run in seconds (default %(default)s)")
    p.add_argument("--server-timeout-s", type=float, default=330.0,
                   help="seconds one server may take to become healthy (default %(default)s)")
    p.add_argument("--driver-timeout-s", type=float, default=300.0,
                   help="limit for one server's measurements, all concurrencies and repetitions (default 300)")
    p.add_argument("--port-base", type=int, default=31000,
                   help="first server's port; the server of priority index i takes port_base + 10 i (default 31000)")
    p.add_argument("--input-len", type=int, default=128, help="prompt tokens per request (default 128)")
    p.add_argument("--output-len", type=int, default=128, help="new tokens per request (default 128)")
    p.add_argument("--rounds", type=int, default=2,
                   help="waves of requests (concurrency prompts each) of a cell's first run (default 2); "
                        "not interleaved rounds, which are --alternations")
    p.add_argument("--min-prompts", type=int, default=4,
                   help="prompts of a cell's first run at least (default %(default)s)")
    p.add_argument("--repeats", type=int, default=2,
                   help="valid runs per (configuration, concurrency) cell (default %(default)s)")
    p.add_argument("--min-seconds", type=float, default=8.0,
                   help="a run counts when bench_serving's duration is at least this (s); shorter: a warm-up "
                        "(default %(default)s)")
    p.add_argument("--max-attempts", type=int, default=4,
                   help="runs per cell at most, warm-ups included (default %(default)s)")
    p.add_argument("--cell-timeout-s", type=float, default=60.0,
                   help="wall-clock limit of one cell in seconds: no run starts that is predicted to end later "
                        "(default %(default)s)")
    p.add_argument("--attention-backend", choices=ATTENTION_BACKENDS, default="fa3",
                   help="every server's --attention-backend (default fa3, deterministic mode's choice on Hopper; "
                        "triton where SGLang's FA3 library is missing)")
    p.add_argument("--label", default=None,
                   help="this command's name in merged reports (default: the --out folder's name)")
    p.add_argument("--max-total-tokens", type=int, default=65536,
                   help="each server's KV pool in tokens (SGLang's --max-total-tokens, default 65536)")
    p.add_argument("--gpu-gib", type=float, default=None,
                   help="GPU memory the servers are fitted to (default: nvidia-smi's; unknown: no check)")
    p.add_argument("--mem-fraction-static", type=float, default=0.88,
                   help="each server's SGLang --mem-fraction-static (default 0.88)")
    p.add_argument("--sleep-on-idle", action="store_true",
                   help="every server, (a) included, gets SGLang's --sleep-on-idle: a server waiting for its turn "
                        "sleeps instead of polling its sockets on a CPU core (several servers share one machine "
                        "in the interleaved modes; a user's single server has none beside it)")
    p.add_argument("--prefill-graphs", action=argparse.BooleanOptionalAction, default=True,
                   help="every server keeps SGLang's prefill CUDA graphs (default, as SGLang's: breakable graphs "
                        "over about 58 token counts up to the prefill chunk; each start takes 13-16 s longer at "
                        "the 8B shape). --no-prefill-graphs: off on every server, so each prefill, and the "
                        "arrivals' extends while serving, runs eagerly")
    p.add_argument("--dry-run", action="store_true", help="print the plan (commands) and exit")
    return p


def written_shape(models: str) -> str | None:
    """The ``--shape`` a models folder was written with (``serving_models.py``); None when none is written yet."""
    path = os.path.join(models, "models.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f).get("shape_name") or "llama-8b"  # folders from before --shape hold the 8B shape


def validate(args) -> dict:
    """Parsed and checked settings; ValueError naming the argument otherwise."""
    written = written_shape(args.models)
    if written is not None and written != args.shape:
        raise ValueError(f"--models {args.models} holds the {written} shape but --shape is {args.shape}: "
                         "name another --models folder (MODELS= for run_h200.sh)")
    mode = ("combined" if args.breakdown and args.interleave else "breakdown" if args.breakdown
            else "interleave" if args.interleave else "cells")
    keys = parse_keys(args.configs if args.configs is not None else DEFAULT_MODE_CONFIGS.get(mode, DEFAULT_ORDER))
    concs = parse_int_list(args.concurrency, "concurrency", maximum=1024)
    il_keys, il_concs = interleave_subset(args, mode, keys, concs)
    if mode != "cells":
        if args.profile:
            flags = "--breakdown --interleave" if mode == "combined" else f"--{mode}"
            raise ValueError(f"profile: not used with {flags} (pass --profile '' or leave it out)")
        profile = []
    elif args.profile is None:
        profile = [k for k in DEFAULT_PROFILE if k in keys]
    else:
        profile = parse_keys(args.profile) if args.profile.strip() else []
    if not set(profile) <= set(keys):
        raise ValueError(f"profile: keys {sorted(set(profile) - set(keys))} are not in configs {''.join(keys)}")
    if not 1 <= args.max_servers_per_gpu <= 16:
        raise ValueError(f"max_servers_per_gpu must lie in [1, 16], got {args.max_servers_per_gpu}")
    if args.gpus is not None and not 1 <= args.gpus <= 64:
        raise ValueError(f"gpus must lie in [1, 64], got {args.gpus}")
    if not 30 <= args.budget_s <= 86400:
        raise ValueError(f"budget_s must lie in [30, 86400], got {args.budget_s}")
    if not 1 <= args.profile_steps <= 100:
        raise ValueError(f"profile_steps must lie in [1, 100], got {args.profile_steps}")
    for name in ("server_timeout_s", "driver_timeout_s", "cell_timeout_s"):
        if not 1 <= getattr(args, name) <= 3600:
            raise ValueError(f"{name} must lie in [1, 3600], got {getattr(args, name)}")
    if not 1024 <= args.port_base <= 65535 - 600:
        raise ValueError(f"port_base must lie in [1024, 64935], got {args.port_base}")
    server_env = parse_env_pairs(args.server_env, "server_env")
    try:
        server_args = shlex.split(args.server_args)
    except ValueError as exc:
        raise ValueError(f"server_args: {exc}") from None
    capture = None
    if mode in ("interleave", "combined"):
        if len(keys) > MAX_SERVERS:  # every server of the command stays up while the rounds run
            raise ValueError(f"configs: --interleave starts at most {MAX_SERVERS} servers per command, "
                             f"got {len(keys)} ({''.join(keys)})")
        schedule(il_keys, il_concs, args.alternations)  # raises on a missing reference or a bad round count
        gpus = gpus_in_use(args)
        if len(keys) > args.max_servers_per_gpu * gpus:
            raise ValueError(f"configs: --interleave holds every server at once: {len(keys)} servers need "
                             f"max_servers_per_gpu x gpus >= {len(keys)}, got {args.max_servers_per_gpu} x {gpus}")
    window_concs = (parse_int_list(args.window_profile, "window_profile", maximum=1024)
                    if args.window_profile.strip() else [])
    if window_concs:
        if mode not in ("interleave", "combined"):
            raise ValueError("window_profile: only with --interleave (the windows follow the interleaved rounds)")
        if not set(window_concs) <= set(concs):
            raise ValueError(f"window_profile: {sorted(set(window_concs) - set(concs))} not in concurrency "
                             f"{','.join(map(str, concs))}")
    if not 5 <= args.window_steps <= 400:
        raise ValueError(f"window_steps must lie in [5, 400], got {args.window_steps}")
    host_concs = parse_int_list(args.host_profile, "host_profile", maximum=1024) if args.host_profile.strip() else []
    if host_concs:
        if mode not in ("breakdown", "combined"):
            raise ValueError("host_profile: only with --breakdown (the host cells follow the breakdown cells)")
        if not set(host_concs) <= set(concs):
            raise ValueError(f"host_profile: {sorted(set(host_concs) - set(concs))} not in concurrency "
                             f"{','.join(map(str, concs))}")
        if not serving_host.MIN_SECONDS <= args.host_seconds <= serving_host.MAX_SECONDS:
            raise ValueError(f"host_seconds must lie in [{serving_host.MIN_SECONDS}, {serving_host.MAX_SECONDS}], "
                             f"got {args.host_seconds}")
        if not 256 <= args.host_output_len <= 32768:
            raise ValueError(f"host_output_len must lie in [256, 32768], got {args.host_output_len}")
    if mode in ("breakdown", "combined"):
        capture = CaptureSettings(input_len=args.input_len, output_len=args.breakdown_output_len,
                                  start_tokens=args.breakdown_start_tokens, profile_steps=args.breakdown_steps)
    load = LoadSettings(input_len=args.input_len, output_len=args.output_len, rounds=args.rounds,
                        min_prompts=args.min_prompts)
    repeat = RepeatSettings(repeats=args.repeats, min_seconds=args.min_seconds, max_attempts=args.max_attempts,
                            max_cell_s=args.cell_timeout_s)
    settings = ServerSettings(target=os.path.join(args.models, "target"), draft=os.path.join(args.models, "eagle"),
                              max_total_tokens=args.max_total_tokens, max_running_requests=max(concs),
                              mem_fraction_static=args.mem_fraction_static, attention_backend=args.attention_backend,
                              extra=SLEEP_ON_IDLE if args.sleep_on_idle else (),
                              prefill_graphs=args.prefill_graphs)
    needed = max(capture.kv_tokens(max(concs)) if capture else 0,
                 kv_tokens(max(host_concs, default=0), args.input_len, args.host_output_len),
                 0 if mode == "breakdown" else kv_tokens(max(il_concs + window_concs), args.input_len, args.output_len))
    if args.max_total_tokens < needed:
        limits = {"--breakdown-output-len": capture.kv_tokens(max(concs)) if capture else 0,
                  "--host-output-len": kv_tokens(max(host_concs, default=0), args.input_len, args.host_output_len)}
        source = next((f", output: {flag}" for flag, tokens in limits.items() if tokens == needed), "")
        raise ValueError(f"max_total_tokens must be >= {needed} (largest concurrency x (input + output + 16)"
                         f"{source}), got {args.max_total_tokens}")
    if args.gpu_gib is not None and not 1 <= args.gpu_gib <= 4096:
        raise ValueError(f"gpu_gib must lie in [1, 4096], got {args.gpu_gib}")
    total_gib = args.gpu_gib if args.gpu_gib is not None else gpu_memory_gib()
    slots, fit_note = servers_that_fit(keys if mode in ("interleave", "combined") else None, keys, args, total_gib,
                                       needed)
    if args.label is not None and not args.label.strip():
        raise ValueError("label must not be empty")
    label = args.label or os.path.basename(os.path.normpath(args.out)) or "run"
    return {"keys": keys, "concs": concs, "profile": profile, "load": load, "repeat": repeat, "settings": settings,
            "label": label, "mode": mode, "server_env": server_env, "server_args": server_args, "capture": capture,
            "il_keys": il_keys, "il_concs": il_concs, "host_concs": host_concs, "window_concs": window_concs,
            "max_servers_per_gpu": slots, "gpu_gib": total_gib, "fit_note": fit_note}


def gpus_in_use(args) -> int:
    """The GPUs a run spreads its servers over: ``--gpus``, else every GPU ``nvidia-smi`` lists (1 without it)."""
    return args.gpus or max(1, gpu_facts()[0])


def servers_that_fit(held: list[str] | None, keys: list[str], args, total_gib: float | None,
                     needed: int) -> tuple[int, str | None]:
    """``(servers per GPU at once, note)`` where the GPU's memory allows what the flags ask (``gpu_fit`` estimate).

    ``held``: the configurations every GPU's share of must hold at once (the
    interleaved modes, GPUs assigned round-robin), else None: servers come and
    go, ``--max-servers-per-gpu`` at a time, lowered to what fits the
    heaviest configurations (the note says so). ``total_gib`` None: unknown,
    the flags stand. ``needed``: the smallest pool (tokens) the load needs.

    Raises:
        ValueError: an interleaved command whose servers do not fit, or one
            server alone that does not, naming the estimate and a pool that would fit.
    """
    slots = args.max_servers_per_gpu
    if total_gib is None:
        return slots, None
    shape = SHAPES[args.shape]
    gib = {k: server_gib(shape, args.max_total_tokens, CONFIGS[k].speculative) for k in keys}

    def hint(group: list[str]) -> str:
        fits = pool_that_fits(shape, [CONFIGS[k].speculative for k in group], total_gib)
        if fits >= max(needed, 1024):
            return f"; --max-total-tokens {max(needed, 1024)} (the load's need) fits"
        return "; name fewer configs" if len(group) > 1 else "; it needs a GPU with more memory"

    if held is not None:
        gpus = gpus_in_use(args)
        for gpu in range(gpus):
            on = [k for i, k in enumerate(held) if i % gpus == gpu]
            need = sum(gib[k] for k in on)
            if need > total_gib:
                raise ValueError(f"configs: {''.join(on)} are held at once on GPU {gpu}: about {need:.1f} GiB at "
                                 f"--max-total-tokens {args.max_total_tokens} (gpu_fit estimate), more than its "
                                 f"{total_gib:.1f} GiB{hint(on)}")
        return slots, None
    heaviest = sorted(keys, key=gib.get, reverse=True)
    fit = next((n for n in range(min(slots, len(keys)), 0, -1) if sum(gib[k] for k in heaviest[:n]) <= total_gib), 0)
    if fit == 0:
        raise ValueError(f"max_total_tokens: one ({heaviest[0]}) server needs about {gib[heaviest[0]]:.1f} GiB "
                         f"(gpu_fit estimate), more than the GPU's {total_gib:.1f} GiB{hint(heaviest[:1])}")
    if fit < min(slots, len(keys)):
        return fit, (f"{fit} servers per GPU at once, not {slots}: the heaviest configurations "
                     f"({''.join(heaviest[:fit + 1])}) need about {sum(gib[k] for k in heaviest[:fit + 1]):.1f} GiB "
                     f"at --max-total-tokens {args.max_total_tokens}, more than the GPU's {total_gib:.1f} GiB "
                     "(gpu_fit estimate)")
    return slots, None


def interleave_subset(args, mode: str, keys: list[str], concs: list[int]) -> tuple[list[str], list[int]]:
    """The configurations and concurrencies of the interleaved runs: ``--interleave-configs`` /
    ``--interleave-concurrency`` in the combined mode, else all of ``keys`` / ``concs``.

    Raises:
        ValueError: either option outside the combined mode, or naming a key or concurrency
            that ``--configs`` / ``--concurrency`` lacks.
    """
    il_keys, il_concs = keys, concs
    for name, value in (("interleave_configs", args.interleave_configs),
                        ("interleave_concurrency", args.interleave_concurrency)):
        if value is not None and mode != "combined":
            raise ValueError(f"{name}: only with --breakdown --interleave")
    if args.interleave_configs is not None:
        try:
            il_keys = parse_keys(args.interleave_configs)
        except ValueError as exc:
            raise ValueError(f"interleave_configs: {exc}") from None
        if not set(il_keys) <= set(keys):
            raise ValueError(f"interleave_configs: keys {sorted(set(il_keys) - set(keys))} are not in "
                             f"configs {''.join(keys)}")
        il_keys = [k for k in keys if k in il_keys]  # --configs order: the servers' priority order
    if args.interleave_concurrency is not None:
        il_concs = parse_int_list(args.interleave_concurrency, "interleave_concurrency", maximum=1024)
        if not set(il_concs) <= set(concs):
            raise ValueError(f"interleave_concurrency: {sorted(set(il_concs) - set(concs))} not in "
                             f"concurrency {','.join(map(str, concs))}")
    return il_keys, il_concs


def plan_servers(keys: list[str], gpus: int, settings: ServerSettings, *, port_base: int, out: str,
                 profile: list[str], max_conc: int, server_env: dict | None = None,
                 server_args: list[str] = ()) -> list[Server]:
    """One :class:`Server` per configuration, GPUs assigned round-robin in priority order.

    The server with priority index i gets GPU ``i % gpus``, port ``port_base + 10 i`` and NCCL
    port ``port_base + 500 + i`` (explicit, so servers started together never race for one; the
    gap of 10 leaves room for ports SGLang derives from a server's port). ``server_env`` and
    ``server_args`` go to the configurations that run the plugin (``plugin_overrides``).
    """
    if gpus < 1:
        raise ValueError(f"gpus must be >= 1, got {gpus}")
    servers = []
    for i, key in enumerate(keys):
        config = CONFIGS[key]
        port = port_base + 10 * i
        argv = server_command(config, settings, port=port) + ["--nccl-port", str(port_base + 500 + i)]
        argv, env = plugin_overrides(config, argv, dict(config.env), server_env=server_env or {},
                                     server_args=list(server_args))
        env["CUDA_VISIBLE_DEVICES"] = str(i % gpus)
        if key in profile:
            # Profile decode steps only once the whole largest-concurrency batch is admitted.
            env["SGLANG_PROFILE_BY_STAGE_DECODE_MIN_BS"] = str(max_conc)
        servers.append(Server(key, i % gpus, port, argv, env, os.path.join(out, "logs", f"server_{config.name}.log")))
    return servers


def gpu_facts() -> tuple[int, str | None]:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout.strip().splitlines()
        return len(out), "; ".join(out) or None
    except (OSError, subprocess.SubprocessError):
        return 0, None


def versions() -> dict:
    facts = {}
    for dist, field in (("torch", "torch_version"), ("triton", "triton_version"), ("sglang", "sglang_version"),
                        ("sglang-detspec", "sglang_detspec_version"), ("nvidia-nccl-cu13", "nccl_wheel_version")):
        try:
            facts[field] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            facts[field] = None
    try:  # the plugin is installed beside SGLang wherever its servers run
        from sglang_detspec.revision import run_revision
    except ImportError:
        facts["code_revision"] = None
    else:
        facts["code_revision"] = run_revision()
    return facts


def healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=3) as r:
            return r.status == 200
    except Exception:
        return False


def stop(server: Server) -> None:
    """Stop the server's whole process group (it was started in its own session)."""
    if server.process is None or server.process.poll() is not None:
        return
    try:
        os.killpg(server.process.pid, signal.SIGTERM)
        server.process.wait(timeout=15)
    except (subprocess.TimeoutExpired, ProcessLookupError):
        try:
            os.killpg(server.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def deepgemm_kernels() -> int | None:
    """Kernels in DeepGEMM's JIT cache folder (SGLang's ``SGLANG_DG_CACHE_DIR``, default under ``~/.cache/sglang``).

    One folder per compiled kernel, shared by every server of the machine:
    the same count before and after the measured runs means no server
    compiled a DeepGEMM kernel inside a request (the count before any server
    starts says what earlier runs on the machine left). Read from this
    process's environment: a ``--server-env`` that moves the servers' cache
    elsewhere is not seen. None where the folder does not exist (no server
    compiled one yet, or another cache location).
    """
    from sglang.srt.environ import envs  # SGLang's own resolution of the folder (read at call time)

    folder = os.path.join(envs.SGLANG_DG_CACHE_DIR.get(), "cache")
    return len(os.listdir(folder)) if os.path.isdir(folder) else None


def log_tail(path: str, lines: int = 25) -> str:
    try:
        return "\n".join(open(path, errors="replace").read().splitlines()[-lines:])
    except OSError:
        return ""


class Run:
    def __init__(self, args, plan: dict):
        self.args, self.plan = args, plan
        self.t0 = time.monotonic()
        self.out = os.path.abspath(args.out)
        os.makedirs(os.path.join(self.out, "logs"), exist_ok=True)
        self.events = open(os.path.join(self.out, "events.log"), "a")
        self.servers: list[Server] = []
        self.meta: dict = {}
        self._driver: subprocess.Popen | None = None
        self._driver_ready = False
        self.bd_rows: list[dict] = []  # breakdown.json rows so far
        self.bd_missing: list[dict] = []  # breakdown cells not measured, with the reason
        self.bd_anomalies: list[dict] = []
        self.host_rows: list[dict] = []  # host.json rows so far
        self.host_missing: list[dict] = []

    def left(self) -> float:
        return self.args.budget_s - (time.monotonic() - self.t0)

    def log(self, text: str) -> None:
        line = f"[{time.monotonic() - self.t0:6.1f}s] {text}"
        print(line, flush=True)
        self.events.write(line + "\n")
        self.events.flush()

    def write_meta(self) -> None:
        with open(os.path.join(self.out, "meta.json"), "w") as f:
            json.dump(self.meta, f, indent=1)

    def report(self, with_plots: bool) -> None:
        import serving_report

        rows_path = os.path.join(self.out, "results.jsonl")
        # Failed runs and cell notes stay in: the report names them beside the missing cells.
        rows = serving_report.load_rows(rows_path) if os.path.exists(rows_path) else []
        try:
            serving_report.write_report(rows, self.meta, self.out, with_plots=with_plots)
        except Exception as exc:  # the raw rows stay on disk either way
            self.log(f"report failed: {type(exc).__name__}: {exc}")

    def ensure_models(self) -> None:
        self.log(f"DeepGEMM kernels cached before any server starts: {deepgemm_kernels()}")
        models = self.args.models
        if os.path.exists(os.path.join(models, "models.json")):  # its shape was checked by validate()
            self.meta["models"] = json.load(open(os.path.join(models, "models.json")))
            return
        self.log(f"writing models into {models}")
        cmd = [sys.executable, os.path.join(HERE, "serving_models.py"), models, "--accept", str(self.args.accept),
               "--shape", self.args.shape]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=max(30.0, min(240.0, self.left() - 60)))
        if done.returncode != 0:
            raise RuntimeError(f"model writing failed: {done.stderr[-3000:]}")
        self.meta["models"] = json.load(open(os.path.join(models, "models.json")))
        self.log(f"models written: {self.meta['models']}")

    def launch(self, server: Server) -> None:
        env = {**os.environ, **server.env}
        server.started = time.monotonic()
        with open(server.log_path, "w") as log:
            server.process = subprocess.Popen(server.argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                              start_new_session=True)
        server.state = "starting"
        self.log(f"started ({server.key}) {CONFIGS[server.key].name} on GPU {server.gpu}, port {server.port}")

    def fill_slots(self) -> None:
        """Start waiting servers where a GPU has room, if there is time for a start and a measurement."""
        for s in self.servers:
            if s.state != "waiting":
                continue
            busy = sum(1 for o in self.servers if o.gpu == s.gpu and o.state in ("starting", "ready"))
            if busy < self.plan["max_servers_per_gpu"] and self.left() > START_RESERVE_S:
                self.launch(s)

    def poll(self) -> None:
        for s in self.servers:
            if s.state != "starting":
                continue
            if s.process.poll() is not None:
                s.state = "failed"
                self.record_failure(s, f"exited with {s.process.returncode} before becoming healthy")
            elif healthy(s.port):
                s.state, s.ready_s = "ready", time.monotonic() - s.started
                self.log(f"({s.key}) healthy after {s.ready_s:.0f} s")
            elif time.monotonic() - s.started > self.args.server_timeout_s:
                stop(s)
                s.state = "failed"
                self.record_failure(s, f"not healthy within {self.args.server_timeout_s:.0f} s")

    def record_failure(self, s: Server, why: str) -> None:
        tail = log_tail(s.log_path)
        self.log(f"({s.key}) FAILED: {why}; log tail:\n{tail}")
        self.meta.setdefault("failures", {})[s.key] = {"why": why, "log_tail": tail[-4000:]}
        self.write_meta()

    def driver(self) -> subprocess.Popen:
        """The persistent driver process (started at once, so its import overlaps server starts)."""
        if self._driver is None or self._driver.poll() is not None:
            self._driver_log = open(os.path.join(self.out, "logs", "driver.log"), "a")
            self._driver = subprocess.Popen([sys.executable, os.path.join(HERE, "serving_driver.py"), "--serve"],
                                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._driver_log,
                                            text=True, bufsize=1)
            self._driver_ready = False
        return self._driver

    def _read_line(self, proc: subprocess.Popen, timeout: float) -> str | None:
        ready, _, _ = select.select([proc.stdout], [], [], max(0.0, timeout))
        return proc.stdout.readline() if ready else None

    def stop_driver(self) -> None:
        if self._driver is not None and self._driver.poll() is None:
            self._driver.kill()
            self._driver.wait()
        self._driver = None

    def drive(self, s: Server, concs: list[int], profile_dir: str | None = None) -> int:
        config = CONFIGS[s.key]
        limit = min(self.args.driver_timeout_s, self.left() - REPORT_RESERVE_S)
        if limit < 10:
            self.log(f"({s.key}) skipped: {self.left():.0f} s left")
            return -1
        spec = {"url": f"http://127.0.0.1:{s.port}", "tokenizer": self.plan["settings"].target, "out": self.out,
                "key": s.key, "name": config.name, "title": config.title, "concurrencies": concs,
                "load": dataclasses.asdict(self.plan["load"]), "repeat": dataclasses.asdict(self.plan["repeat"]),
                "profile_dir": profile_dir, "profile_steps": self.args.profile_steps}
        return self.send(spec, limit, s.key)

    def send(self, spec: dict, limit: float, who: str) -> int:
        """Hand ``spec`` to the driver and wait up to ``limit`` s for its ``done``; -2 on a time limit."""
        deadline = time.monotonic() + limit
        proc = self.driver()
        while not self._driver_ready:  # the import, when it has not finished yet
            line = self._read_line(proc, deadline - time.monotonic())
            if not line:
                self.log(f"({who}) driver not ready within {limit:.0f} s (see logs/driver.log)")
                self.stop_driver()
                return -2
            self._driver_ready = line.strip() == "ready"
        # Taken now, after any wait for the import: the driver counts it from when it reads the spec.
        spec["time_left_s"] = max(1.0, deadline - time.monotonic() - DRIVER_WRAP_UP_S)
        proc.stdin.write(json.dumps(spec) + "\n")
        proc.stdin.flush()
        while True:
            line = self._read_line(proc, deadline - time.monotonic())
            if not line:  # time limit or the driver died: a fresh one serves the next server
                self.log(f"({who}) driver stopped after {limit:.0f} s (see logs/driver.log)")
                self.stop_driver()
                return -2
            if line.startswith("done "):
                return int(line.split()[1])

    def profile(self, s: Server) -> None:
        conc = max(self.plan["concs"])
        pdir = os.path.join("/tmp", "detspec-serving-profile", CONFIGS[s.key].name)
        os.makedirs(pdir, exist_ok=True)
        rc = self.drive(s, [conc], profile_dir=pdir)
        # SGLang exports the decode trace when the step count is reached; wait briefly for the file.
        deadline = time.monotonic() + min(60.0, max(0.0, self.left() - REPORT_RESERVE_S))
        traces = []
        while time.monotonic() < deadline:
            traces = sorted(glob.glob(os.path.join(pdir, "**", "*DECODE*.trace.json.gz"), recursive=True),
                            key=os.path.getmtime)
            if traces:
                break
            time.sleep(2)
        if not traces:
            self.log(f"({s.key}) no decode trace under {pdir} (driver rc {rc})")
            return
        time.sleep(2)  # the export may still be flushing
        import serving_trace

        try:
            summary = serving_trace.summarize(serving_trace.load_events(traces[-1]), steps=self.args.profile_steps)
        except Exception as exc:
            self.log(f"({s.key}) trace summary failed: {type(exc).__name__}: {exc}")
            return
        title = (f"{CONFIGS[s.key].title}: {self.args.profile_steps} decode steps at concurrency {conc}, "
                 f"trace {os.path.basename(traces[-1])}")
        base = os.path.join(self.out, f"profile_{CONFIGS[s.key].name}")
        with open(base + ".txt", "w") as f:
            f.write(serving_trace.render(summary, title))
        with open(base + ".json", "w") as f:
            json.dump(summary, f, indent=1)
        self.log(f"({s.key}) sampler + verify share {100 * summary['share_union']:.2f}% of kernel time")

    def run(self) -> int:
        gpus_seen, gpu_text = gpu_facts()
        gpus = self.args.gpus or max(1, gpus_seen)
        p = self.plan
        self.meta.update({
            "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "gpu": gpu_text, "gpus_used": gpus, **versions(),
            "label": p["label"], "attention_backend": p["settings"].attention_backend,
            "every_server_args": list(p["settings"].extra),
            "prefill_cuda_graphs": p["settings"].prefill_graphs,
            "load": dataclasses.asdict(p["load"]), "repeat": dataclasses.asdict(p["repeat"]),
            "repeats": p["repeat"].repeats, "min_seconds": p["repeat"].min_seconds, "concurrencies": p["concs"],
            "configs": {k: CONFIGS[k].to_json() for k in p["keys"]},
            "mode": p["mode"], "server_env": p["server_env"], "server_args": p["server_args"],
            "gpu_gib": p["gpu_gib"], "max_servers_per_gpu": p["max_servers_per_gpu"],
        })
        if p["fit_note"]:
            self.log(p["fit_note"])
        if p["mode"] in ("interleave", "combined"):
            self.meta.update({"interleaved": True, "alternations": self.args.alternations,
                              "repeats": self.args.alternations})
        if p["mode"] == "combined":  # serving.json plans the interleaved cells; breakdown.json all of them
            self.meta.update({"configs": {k: CONFIGS[k].to_json() for k in p["il_keys"]},
                              "concurrencies": p["il_concs"], "breakdown_configs": "".join(p["keys"]),
                              "breakdown_concurrencies": p["concs"]})
        if p["capture"] is not None:
            self.meta["breakdown"] = dataclasses.asdict(p["capture"])
        self.servers = plan_servers(p["keys"], gpus, p["settings"], port_base=self.args.port_base, out=self.out,
                                    profile=p["profile"], max_conc=max(p["concs"]), server_env=p["server_env"],
                                    server_args=p["server_args"])
        self.meta["server_commands"] = {s.key: {"env": s.env, "argv": shell_line(s.argv)} for s in self.servers}
        self.write_meta()
        if p["mode"] != "breakdown":
            self.driver()  # imports bench_serving while the models are written and the servers start
        try:
            self.ensure_models()
            self.write_meta()
            self.loop()
        finally:
            self.stop_driver()
            for s in self.servers:
                stop(s)
            self.meta["server_ready_s"] = {s.key: s.ready_s for s in self.servers}
            self.meta["server_states"] = {s.key: s.state for s in self.servers}
            self.meta["wall_s"] = round(time.monotonic() - self.t0, 1)
            self.write_meta()
            if p["mode"] in ("breakdown", "combined"):
                self.write_breakdown(with_plot=True)
            if p["mode"] != "breakdown":
                self.report(with_plots=True)
            self.log("report written")
        return 0 if all(s.state == "done" for s in self.servers) else 1

    def measure(self, s: Server) -> None:
        """The measurements of one ready server (bench_serving cells, or the breakdown cells)."""
        if self.plan["mode"] == "breakdown":
            self.breakdown(s)
            return
        before = deepgemm_kernels()
        rc = self.drive(s, self.plan["concs"])
        self.log(f"({s.key}) measured (driver rc {rc}); DeepGEMM kernels cached: {before} before, "
                 f"{deepgemm_kernels()} after")
        if s.key in self.plan["profile"] and self.left() > 60:
            self.profile(s)

    def breakdown(self, s: Server) -> None:
        """One breakdown cell per concurrency (``serving_breakdown.capture``), rows kept in ``self.bd_rows``."""
        import serving_breakdown

        config = CONFIGS[s.key]
        for conc in self.plan["concs"]:
            left = self.left() - REPORT_RESERVE_S
            if left < BREAKDOWN_MIN_CELL_S:
                self.bd_missing.append({"config": s.key, "concurrency": conc,
                                        "why": f"{self.left():.0f} s left of the command's budget"})
                continue
            pid = f"{config.name}_c{conc}_{int(time.time())}"
            try:
                result = serving_breakdown.capture(f"http://127.0.0.1:{s.port}",
                                                   os.path.join(BREAKDOWN_TRACES, config.name), pid, conc,
                                                   self.plan["capture"], time_left_s=left)
            except Exception as exc:  # the other cells are still worth measuring
                why = f"{type(exc).__name__}: {exc}"
                self.bd_missing.append({"config": s.key, "concurrency": conc, "why": why[:500]})
                self.log(f"({s.key}) breakdown c={conc} failed: {why[:300]}")
                continue
            self.bd_rows += serving_breakdown.cell_rows(s.key, conc, result)
            self.bd_anomalies += [{"config": s.key, "concurrency": conc, "text": t} for t in result["anomalies"]]
            os.makedirs(os.path.join(self.out, "breakdown"), exist_ok=True)
            with open(os.path.join(self.out, "breakdown", f"{s.key}_{config.name}_c{conc}.json"), "w") as f:
                json.dump(result, f, indent=1)
            top = sorted(((c, v) for c, v in result["gpu_ms_per_step"].items() if v > 0), key=lambda cv: -cv[1])[:4]
            how = " (layer pattern not found: by kernel name)" if result.get("classified_by") == "kernel_name" else ""
            self.log(f"({s.key}) breakdown c={conc}{how}: step {result['step_ms']:.3f} ms over "
                     f"{result['steps']} steps, "
                     + ", ".join(f"{c} {v:.3f}" for c, v in top) + f" ({result['wall_s']:.0f} s)")
            self.write_breakdown()
            if conc in self.plan["host_concs"]:
                self.host_cell(s, conc, result)

    def host_cell(self, s: Server, conc: int, bd: dict) -> None:
        """The scheduler's host time at ``conc`` (``serving_host.capture``), beside breakdown cell ``bd``."""
        config, capture = CONFIGS[s.key], self.plan["capture"]
        left = self.left() - REPORT_RESERVE_S
        why = None
        if left < BREAKDOWN_MIN_CELL_S:
            why = f"{self.left():.0f} s left of the command's budget"
        elif serving_host.py_spy() is None:
            why = "py-spy is not on PATH"
        if why is None:
            stacks = os.path.join(self.out, "host", f"{s.key}_{config.name}_c{conc}.txt")
            os.makedirs(os.path.dirname(stacks), exist_ok=True)
            try:
                result = serving_host.capture(
                    f"http://127.0.0.1:{s.port}", s.process.pid, conc, stacks, seconds=self.args.host_seconds,
                    input_len=capture.input_len, output_len=self.args.host_output_len,
                    start_tokens=capture.start_tokens, vocab=capture.vocab, seed=capture.seed + 7,
                    time_left_s=min(left, 90.0))
            except Exception as exc:  # the other cells are still worth measuring
                why = f"{type(exc).__name__}: {exc}"[:500]
        if why is not None:
            self.host_missing.append({"config": s.key, "concurrency": conc, "why": why})
            self.log(f"({s.key}) host c={conc} not measured: {why[:300]}")
        else:
            self.host_rows.append(serving_host.host_row(s.key, conc, result, bd["gpu_ms_per_step"].get("idle"),
                                                        bd.get("step_ms")))
            self.log(f"({s.key}) host c={conc}: {result['samples']} samples, split {result['split']}, "
                     f"top {result['top_host_functions'][:3]}")
        serving_host.write_host(self.out, {"date_utc": self.meta.get("date_utc"),
                                           "machine": self.meta.get("gpu") or "unknown", "rows": self.host_rows,
                                           "missing": self.host_missing, "label": self.plan["label"],
                                           "server_env": self.plan["server_env"],
                                           "server_args": self.plan["server_args"]})

    def write_breakdown(self, with_plot: bool = False) -> None:
        import serving_breakdown

        measured = {(r["config"], r["concurrency"]) for r in self.bd_rows}
        missing = list(self.bd_missing)
        noted = {(m["config"], m["concurrency"]) for m in missing}
        for s in self.servers:
            for conc in self.plan["concs"]:
                if (s.key, conc) not in measured and (s.key, conc) not in noted:
                    why = (self.meta.get("failures") or {}).get(s.key, {}).get("why") or f"server {s.state}"
                    missing.append({"config": s.key, "concurrency": conc, "why": why})
        doc = {"date_utc": self.meta.get("date_utc"), "machine": self.meta.get("gpu") or "unknown",
               "rows": self.bd_rows, "missing": missing, "anomalies": self.bd_anomalies,
               "configs": {k: CONFIGS[k].title for k in self.plan["keys"]},
               "settings": {**self.meta.get("breakdown", {}), "attention_backend": self.meta.get("attention_backend"),
                            "sglang_version": self.meta.get("sglang_version"),
                            "sglang_detspec_version": self.meta.get("sglang_detspec_version"),
                            "code_revision": self.meta.get("code_revision")},
               "server_env": self.plan["server_env"], "server_args": self.plan["server_args"],
               "label": self.plan["label"], "wall_s": round(time.monotonic() - self.t0, 1)}
        try:
            serving_breakdown.write_breakdown(self.out, doc, with_plot=with_plot)
        except Exception as exc:  # the per-cell JSON files stay on disk either way
            self.log(f"breakdown report failed: {type(exc).__name__}: {exc}")

    def start_all(self) -> list[Server]:
        """Start every server at once; the ready ones when none is starting any more, in ``--configs`` order."""
        while self.left() > REPORT_RESERVE_S:
            self.fill_slots()
            self.poll()
            if not any(s.state in ("waiting", "starting") for s in self.servers):
                break
            if not any(s.state == "starting" for s in self.servers):
                self.log("no time left to start the waiting configurations")
                break
            time.sleep(1.0)
        return [s for s in self.servers if s.state == "ready"]

    def interleave(self) -> None:
        """Every server started at once; when none is starting any more, the interleaved runs over the ready ones."""
        ready = self.start_all()
        self.interleave_ready(ready)
        self.windows(ready)
        for s in ready:
            stop(s)
            s.state = "done"

    def combined(self) -> None:
        """``--breakdown --interleave``: every server started once; all breakdown cells, then interleaved rounds.

        The breakdown goes first (its cells are the ones planned in full); the interleaved part gets
        whatever time is left, and the driver starts only the rounds predicted to fit.
        """
        ready = self.start_all()
        for s in ready:  # one server at a time, the others idle
            self.log(f"({s.key}) breakdown")
            self.breakdown(s)
            self.write_breakdown()
        self.interleave_ready([s for s in ready if s.key in self.plan["il_keys"]])
        self.windows([s for s in ready if s.key in self.plan["il_keys"]])
        for s in ready:
            stop(s)
            s.state = "done"

    def interleave_ready(self, ready: list[Server]) -> None:
        """The interleaved protocol over ``ready`` (the driver), or note rows saying why it could not run."""
        # The serving windows come after the rounds: their time is kept back from the driver.
        limit = self.left() - REPORT_RESERVE_S - WINDOW_CELL_S * len(ready) * len(self.plan["window_concs"])
        concs = self.plan["il_concs"]
        why = None
        keys = pairable([s.key for s in ready])
        ready = [s for s in ready if s.key in keys]
        if len(keys) < 2:
            why = "interleaving needs a configuration and its reference ready; ready: " + "".join(
                s.key for s in self.servers if s.state == "ready")
        elif limit < max(self.plan["repeat"].min_seconds, 1.0) + DRIVER_WRAP_UP_S:
            why = f"no time left to interleave ({self.left():.0f} s of the command's budget)"
        if why is not None:
            self.log(why)
            self.note_cells([s for s in self.servers if s.key in self.plan["il_keys"]], concs, why)
            return
        spec = {"mode": "interleave", "tokenizer": self.plan["settings"].target, "out": self.out,
                "servers": {s.key: {"url": f"http://127.0.0.1:{s.port}", "name": CONFIGS[s.key].name,
                                    "title": CONFIGS[s.key].title} for s in ready},
                "concurrencies": concs, "load": dataclasses.asdict(self.plan["load"]),
                "repeat": dataclasses.asdict(self.plan["repeat"]), "rounds": self.args.alternations}
        self.log(f"interleaving {''.join(s.key for s in ready)}, {limit:.0f} s left; DeepGEMM kernels cached: "
                 f"{deepgemm_kernels()}")
        rc = self.send(spec, limit, "interleave")
        self.log(f"interleaved runs done (driver rc {rc}); DeepGEMM kernels cached: {deepgemm_kernels()}")

    def windows(self, ready: list[Server]) -> None:
        """``--window-profile``: one profiled serving window per ready server and concurrency, then window.json/md."""
        import serving_window

        if not self.plan["window_concs"]:
            return
        rows, missing = [], []
        for s in ready:
            config = CONFIGS[s.key]
            for conc in self.plan["window_concs"]:
                left = self.left() - REPORT_RESERVE_S
                if left < WINDOW_CELL_S:
                    missing.append({"config": s.key, "concurrency": conc,
                                    "why": f"{self.left():.0f} s left of the command's budget"})
                    continue
                pid = f"{config.name}_window_c{conc}_{int(time.time())}"
                try:
                    result = serving_window.capture(
                        f"http://127.0.0.1:{s.port}", os.path.join(WINDOW_TRACES, config.name), pid, conc,
                        input_len=self.args.input_len, output_len=self.args.output_len,
                        vocab=SHAPES[self.args.shape].vocab, steps=self.args.window_steps,
                        time_left_s=min(left, WINDOW_CELL_S))
                except Exception as exc:  # the other cells are still worth measuring
                    why = f"{type(exc).__name__}: {exc}"[:500]
                    missing.append({"config": s.key, "concurrency": conc, "why": why})
                    self.log(f"({s.key}) window c={conc} failed: {why[:300]}")
                    continue
                # The trace stays on the machine (large); its name is enough to find it there.
                rows.append({"config": s.key, **result, "trace": os.path.basename(result["trace"])})
                stages = ", ".join(f"{k} {v['share']:.0%}" for k, v in result["stages"].items() if v["share"] > 0)
                self.log(f"({s.key}) window c={conc}: {result['window_ms']:.0f} ms, idle {result['idle_share']:.0%}, "
                         f"{stages}")
        with open(os.path.join(self.out, "window.json"), "w") as f:
            json.dump({"date_utc": self.meta.get("date_utc"), "machine": self.meta.get("gpu") or "unknown",
                       "iterations": self.args.window_steps, "rows": rows, "missing": missing}, f, indent=1)
        with open(os.path.join(self.out, "window.md"), "w") as f:
            f.write(serving_window.report(rows, {k: CONFIGS[k].title for k in CONFIGS}, missing))

    def note_cells(self, servers: list[Server], concs: list[int], why: str) -> None:
        """One ``note`` row per (server, concurrency) in ``results.jsonl``: the report lists it as missing."""
        with open(os.path.join(self.out, "results.jsonl"), "a") as f:
            for s in servers:
                for conc in concs:
                    f.write(json.dumps({"key": s.key, "name": CONFIGS[s.key].name, "title": CONFIGS[s.key].title,
                                        "concurrency": conc, "interleaved": True, "valid": False,
                                        "note": why}) + "\n")

    def loop(self) -> None:
        if self.plan["mode"] == "interleave":
            self.interleave()
            return
        if self.plan["mode"] == "combined":
            self.combined()
            return
        while self.left() > REPORT_RESERVE_S:
            self.fill_slots()
            self.poll()
            # A server starting on a GPU (weights, CUDA graph capture) would disturb a measurement
            # there: measure only servers whose GPU has none starting.
            ready = [s for s in self.servers if s.state == "ready" and not any(
                o.gpu == s.gpu and o.state == "starting" for o in self.servers)]
            if ready:
                s = ready[0]  # priority order: the list is in --configs order
                self.log(f"({s.key}) measuring")
                self.measure(s)
                stop(s)
                s.state = "done"
                self.report(with_plots=False)
                continue
            if all(s.state in ("done", "failed") for s in self.servers):
                return
            if not any(s.state == "starting" for s in self.servers) and not any(
                    s.state == "waiting" for s in self.servers):
                return
            if not any(s.state == "starting" for s in self.servers) and self.left() <= START_RESERVE_S:
                self.log("no time left to start the waiting configurations")
                return
            time.sleep(1.0)
        self.log(f"budget reached ({self.args.budget_s:.0f} s)")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        plan = validate(args)
    except ValueError as exc:
        parser.error(str(exc))
    if args.dry_run:
        gpus = args.gpus or 2
        if plan["fit_note"]:
            print(f"# {plan['fit_note']}")
        if plan["window_concs"]:
            print(f"# after the rounds: one serving window per server at c = "
                  f"{','.join(map(str, plan['window_concs']))}, {args.window_steps} scheduler iterations each; "
                  f"{WINDOW_CELL_S * len(plan['il_keys']) * len(plan['window_concs'])} s kept back from the rounds")
        for s in plan_servers(plan["keys"], gpus, plan["settings"], port_base=args.port_base, out=args.out,
                              profile=plan["profile"], max_conc=max(plan["concs"]), server_env=plan["server_env"],
                              server_args=plan["server_args"]):
            print(f"# ({s.key}) GPU {s.gpu} env {s.env}\n{shell_line(s.argv)}")
        return 0
    run = Run(args, plan)

    def on_signal(signum, frame):  # a time limit of the caller: stop servers, write what was measured
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_signal)
    try:
        return run.run()
    except KeyboardInterrupt as exc:
        run.log(f"interrupted: {exc}")
        return 3


if __name__ == "__main__":
    sys.exit(main())
