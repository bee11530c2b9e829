"""What a bitwise attention path costs a server: its inter-token latency against SGLang's own path, interleaved.

Each pair is two servers that differ only in the target's attention path,
both up at once on one GPU; every cell (prompt length, concurrency) runs one
``bench_serving`` call per server per round, the order alternating between
rounds (A B, then B A) so drift hits both alike, and the cost is the median
over rounds of the per-round ratio ``itl(path) / itl(sglang)``:

===================== ======== =============== ==============================================
pair                  backend  path            the two servers
===================== ======== =============== ==============================================
fa3_tree_nodes        fa3      nodes           (e) coupled EAGLE tree top-k 4 / 8 tokens with
                                               ``SGLANG_DETSPEC_TREE_ATTENTION=nodes``
                                               against the same server with SGLang's cascade
                                               (both ``SGLANG_DETSPEC_DECODE_ATTENTION=sglang``)
triton_one_pass       triton   one_pass_decode (f) no speculative decoding,
                                               ``SGLANG_DETSPEC_DECODE_ATTENTION=one_pass``
                                               against ``=sglang`` (SGLang's split-KV decode)
fa3_split_tree        fa3      split           (e) with the prefix / tail split (the default,
                                               ``=split``) against SGLang's calls (``=sglang``)
fa3_split_chain       fa3      split           (d) coupled chain, the same two
triton_split          triton   split           (f) the positional-split kernels (the default)
                                               against ``=sglang``
===================== ======== =============== ==============================================

Every arm names its ``SGLANG_DETSPEC_DECODE_ATTENTION``. The default pairs
are the three split pairs; the other two run when named (``--pairs``). Every
server keeps SGLang's prefill CUDA graphs (its default; ``cost.json``'s
``settings.prefill_cuda_graphs``) unless ``--no-prefill-graphs``.

Every server's KV pool is what the largest planned cell needs (at most
``--max-total-tokens``). The pairs run in waves: as many pairs at once as
``gpu_fit`` estimates the GPU holds (the two FA3 pairs together on an H200,
one pair at a time on an H100), each wave's servers stopped before the next
starts; where even one pair does not fit, the pool is lowered and the cells
above it are skipped. A cell larger than the pool a server logged is
skipped too.

(The Triton decode hook costs only servers that decode on the target, so
its pair has no speculative decoding; the node path costs only tree
verify.) A cell whose requests cannot all hold their KV at once
(``concurrency x (prompt + output + 16) > --max-total-tokens``) is skipped and
listed as such, so a figure never comes from a queue instead of a batch.

``itl_ms`` is ``bench_serving``'s ``mean_itl_ms`` (per output token: SGLang's
client spreads a chunk's gap over its tokens), the median over rounds.
Writes ``cost.json`` (the layout below), ``cost.md`` and every run in
``runs.jsonl``. Round 0 (a warm-up of both arms, never counted) opens every
cell::

    {"date_utc": str, "machine": str, "settings": {...},
     "rows": [{"pair", "backend", "path", "concurrency", "prompt_len", "itl_ms", "itl_ms_sglang",
               "ratio", "ratio_min", "ratio_max", "rounds", "output_tokens_per_s",
               "output_tokens_per_s_sglang"}],
     "skipped": [{"pair", "concurrency", "prompt_len", "why"}], "notes": [str]}

    python benchmark/serving/attention_cost.py --out DIR --models DIR [--pairs fa3_split_chain,triton_split]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from serving_configs import (CONFIGS, LoadSettings, ServerSettings, bench_args, parse_int_list,  # noqa: E402
                             server_command)
from gpu_fit import (SLACK_TOKENS, gpu_memory_gib, kv_tokens, logged_pool_tokens, pool_that_fits,  # noqa: E402
                     server_gib)
from serving_models import CONTEXT_LEN, SHAPES  # noqa: E402
from serving_run import gpu_facts, healthy, written_shape  # noqa: E402

TREE_NODES_ENV = ("SGLANG_DETSPEC_TREE_ATTENTION", "nodes")
SGLANG_DECODE_ENV = ("SGLANG_DETSPEC_DECODE_ATTENTION", "sglang")
ONE_PASS_ENV = ("SGLANG_DETSPEC_DECODE_ATTENTION", "one_pass")
SPLIT_ENV = ("SGLANG_DETSPEC_DECODE_ATTENTION", "split")


@dataclasses.dataclass(frozen=True)
class Pair:
    """Two servers of one configuration: ``path_env`` turns the plugin's path on, ``sglang_env`` keeps SGLang's."""

    name: str
    backend: str
    path: str
    config: str  # a key of serving_configs.CONFIGS
    path_env: tuple[tuple[str, str], ...]
    sglang_env: tuple[tuple[str, str], ...]


PAIRS = {p.name: p for p in (
    # Both arms name their decode setting: the split is the default, and the node path runs only without it.
    Pair("fa3_tree_nodes", "fa3", "nodes", "e", (TREE_NODES_ENV, SGLANG_DECODE_ENV), (SGLANG_DECODE_ENV,)),
    Pair("triton_one_pass", "triton", "one_pass_decode", "f", (ONE_PASS_ENV,), (SGLANG_DECODE_ENV,)),
    Pair("fa3_split_tree", "fa3", "split", "e", (SPLIT_ENV,), (SGLANG_DECODE_ENV,)),
    Pair("fa3_split_chain", "fa3", "split", "d", (SPLIT_ENV,), (SGLANG_DECODE_ENV,)),
    Pair("triton_split", "triton", "split", "f", (SPLIT_ENV,), (SGLANG_DECODE_ENV,)),
)}
DEFAULT_PAIRS = ("fa3_split_chain", "fa3_split_tree", "triton_split")
ARMS = ("sglang", "path")


def parse_pairs(text: str) -> list[Pair]:
    """``"fa3_split_chain,triton_split"`` -> the pairs; ValueError naming unknown or repeated ones."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise ValueError(f"pairs must name at least one of {', '.join(PAIRS)}")
    unknown = [n for n in names if n not in PAIRS]
    if unknown:
        raise ValueError(f"pairs: unknown {unknown} (known: {', '.join(PAIRS)})")
    if len(set(names)) != len(names):
        raise ValueError(f"pairs: repeated names in {text!r}")
    return [PAIRS[n] for n in names]


def plan_cells(pairs: list[Pair], prompt_lens: list[int], concurrencies: list[int], output_len: int,
               max_total_tokens: int, context_len: int = CONTEXT_LEN,
               pool_label: str = "the largest pool allowed, --max-total-tokens",
               ) -> tuple[list[tuple[Pair, int, int]], list[dict]]:
    """``(cells, skipped)``: ``(pair, prompt_len, concurrency)`` in run order, and the cells that cannot run.

    A cell is skipped when its requests' KV does not fit the pool at once, or
    when a request is longer than the model's context (SGLang refuses it).
    Prompt lengths go outermost, so a command cut short has the short prompts
    of every pair first.
    """
    cells, skipped = [], []
    for prompt_len in prompt_lens:
        for pair in pairs:
            for conc in concurrencies:
                need = kv_tokens(conc, prompt_len, output_len)
                if prompt_len + output_len > context_len:
                    skipped.append({"pair": pair.name, "concurrency": conc, "prompt_len": prompt_len,
                                    "why": f"{prompt_len} + {output_len} tokens exceed the model's context of "
                                           f"{context_len}"})
                elif need > max_total_tokens:
                    skipped.append({"pair": pair.name, "concurrency": conc, "prompt_len": prompt_len,
                                    "why": f"{conc} x ({prompt_len} + {output_len} + {SLACK_TOKENS}) = {need} tokens "
                                           f"of KV exceed {pool_label} {max_total_tokens}"})
                else:
                    cells.append((pair, prompt_len, conc))
    return cells, skipped


def pool_for(cells: list[tuple[Pair, int, int]], output_len: int) -> int:
    """The KV pool (tokens) for ``cells``: the largest one's need, rounded up to a multiple of 1024, plus 1024."""
    need = max((kv_tokens(conc, prompt_len, output_len) for _, prompt_len, conc in cells), default=1)
    return -(-need // 1024) * 1024 + 1024


def plan_waves(pairs: list[Pair], pool: int, total_gib: float | None, shape) -> list[list[Pair]]:
    """The pairs in order, grouped into waves whose servers (two per pair) fit ``total_gib`` at ``pool`` tokens.

    ``total_gib`` None (GPU memory unknown): one wave. A pair too large alone
    still gets a wave of its own (the caller lowers the pool first).
    """
    if total_gib is None:
        return [list(pairs)]
    waves, current, used = [], [], 0.0
    for pair in pairs:
        need = 2 * server_gib(shape, pool, CONFIGS[pair.config].speculative)
        if current and used + need > total_gib:
            waves.append(current)
            current, used = [], 0.0
        current.append(pair)
        used += need
    waves.append(current)
    return waves


def model_context_len(models: str) -> int:
    """Positions the target in ``models`` takes: its ``config.json``'s, else what ``serving_models.py`` writes.

    A folder written by an older ``serving_models.py`` keeps its own context
    (8192 before 16384), so the plan skips what that server would refuse.
    """
    path = os.path.join(models, "target", "config.json")
    if not os.path.exists(path):
        return CONTEXT_LEN
    with open(path) as f:
        return int(json.load(f)["max_position_embeddings"])


def arm_order(round_index: int) -> tuple[str, str]:
    """Round 1 runs SGLang's path first, round 2 the plugin's, and so on (A B, B A, ...)."""
    return ARMS if round_index % 2 == 1 else ARMS[::-1]


def server_argv(pair: Pair, arm: str, settings: ServerSettings, port: int) -> tuple[list[str], dict[str, str]]:
    """Command line and extra environment of one arm's server."""
    config = CONFIGS[pair.config]
    settings = dataclasses.replace(settings, attention_backend=pair.backend)
    env = dict(config.env)
    env.update(pair.path_env if arm == "path" else pair.sglang_env)
    return server_command(config, settings, port=port) + ["--nccl-port", str(port + 500)], env


def summarize(runs: list[dict], pair: Pair, prompt_len: int, conc: int) -> dict | None:
    """One ``cost.json`` row from a cell's runs (None when no round has both arms)."""
    by = {(r["round"], r["arm"]): r for r in runs if r["pair"] == pair.name and r["prompt_len"] == prompt_len
          and r["concurrency"] == conc and (r.get("mean_itl_ms") or 0) > 0}  # None: the result had none
    rounds = sorted({rnd for rnd, _ in by if (rnd, "path") in by and (rnd, "sglang") in by})
    if not rounds:
        return None
    path = [by[(r, "path")] for r in rounds]
    ref = [by[(r, "sglang")] for r in rounds]
    ratios = [p["mean_itl_ms"] / s["mean_itl_ms"] for p, s in zip(path, ref)]
    med = statistics.median
    return {"pair": pair.name, "backend": pair.backend, "path": pair.path, "concurrency": conc,
            "prompt_len": prompt_len,
            "itl_ms": med(p["mean_itl_ms"] for p in path), "itl_ms_sglang": med(s["mean_itl_ms"] for s in ref),
            "ratio": med(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios), "rounds": len(rounds),
            "output_tokens_per_s": med(p["output_throughput"] for p in path),
            "output_tokens_per_s_sglang": med(s["output_throughput"] for s in ref)}


def render_markdown(cost: dict) -> str:
    lines = [f"# Attention-path cost, {cost['date_utc']}, {cost['machine']}", "",
             "Mean inter-token latency of the plugin's bitwise path against SGLang's own, same command, "
             "interleaved rounds (median; ratio min-max over rounds). Measured, not asserted.", "",
             "| pair | backend | path | prompt | c | itl ms (path) | itl ms (SGLang) | ratio (min-max, rounds) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in cost["rows"]:
        lines.append(f"| {r.get('pair', '')} | {r['backend']} | {r['path']} | {r['prompt_len']} | {r['concurrency']} | "
                     f"{r['itl_ms']:.2f} | "
                     f"{r['itl_ms_sglang']:.2f} | {r['ratio']:.3f} ({r['ratio_min']:.3f}-{r['ratio_max']:.3f}, "
                     f"{r['rounds']}) |")
    if cost["skipped"]:
        lines += ["", "Skipped (KV pool or context):", ""] + [f"- {s['pair']} prompt {s['prompt_len']} c={s['concurrency']}: "
                                                   f"{s['why']}" for s in cost["skipped"]]
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    pairs = "\n".join(f"  {p.name:16} {p.backend:7} {CONFIGS[p.config].title}: "
                      f"{' '.join('='.join(e) for e in p.path_env)} against "
                      f"{' '.join('='.join(e) for e in p.sglang_env)}" for p in PAIRS.values())
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=f"pairs:\n{pairs}",
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="result folder (created)")
    p.add_argument("--models", required=True, help="model folder (serving_models.py), written when missing")
    p.add_argument("--pairs", default=",".join(DEFAULT_PAIRS),
                   help=f"comma-separated, of the pairs below (default {','.join(DEFAULT_PAIRS)})")
    p.add_argument("--prompt-lens", default="128,2048,8192", help="prompt lengths, tokens (default 128,2048,8192)")
    p.add_argument("--concurrency", default="1,8,32,128", help="concurrencies (default 1,8,32,128)")
    p.add_argument("--output-len", type=int, default=64, help="output tokens per request (default 64)")
    p.add_argument("--alternations", "--rounds", dest="rounds", type=int, default=2, metavar="N",
                   help="interleaved rounds per cell, as serving_run.py's --alternations (default 2; --rounds is "
                        "the older name)")
    p.add_argument("--waves", type=int, default=1,
                   help="requests per run: waves x concurrency, and at least 4 requests (default 1)")
    p.add_argument("--max-total-tokens", type=int, default=100000,
                   help="largest KV pool of a server, tokens (default 100000); each gets what the largest planned "
                        "cell needs")
    p.add_argument("--gpu-gib", type=float, default=None,
                   help="GPU memory the server groups are planned for (default: nvidia-smi's free memory; unknown: "
                        "one group)")
    p.add_argument("--mem-fraction-static", type=float, default=0.93,
                   help="SGLang's static-memory fraction (default 0.93); the pool is capped as above")
    p.add_argument("--budget-s", type=float, default=560.0,
                   help="wall-clock limit of the whole command, seconds (default 560)")
    p.add_argument("--server-timeout-s", type=float, default=300.0,
                   help="limit for a group's servers to become healthy, seconds (default 300)")
    p.add_argument("--port-base", type=int, default=32000,
                   help="first server port; each server takes port_base + 10 i (default 32000)")
    p.add_argument("--prefill-graphs", action=argparse.BooleanOptionalAction, default=True,
                   help="every server keeps SGLang's prefill CUDA graphs (default, as SGLang's); "
                        "--no-prefill-graphs turns them off, as in the runs of docs/benchmarks/attention_cost/ "
                        "dated 2026-12-05 or earlier")
    p.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    return p


def validate(args) -> dict:
    """Checked settings; ValueError naming the argument and its bound otherwise."""
    pairs = parse_pairs(args.pairs)
    prompt_lens = parse_int_list(args.prompt_lens, "prompt_lens", maximum=32768)
    concs = parse_int_list(args.concurrency, "concurrency", maximum=1024)
    if not 1 <= args.output_len <= 4096:
        raise ValueError(f"output_len must lie in [1, 4096], got {args.output_len}")
    if not 1 <= args.rounds <= 20:
        raise ValueError(f"--alternations (--rounds) must lie in [1, 20], got {args.rounds}")
    if not 1 <= args.waves <= 50:
        raise ValueError(f"waves must lie in [1, 50], got {args.waves}")
    if not 60 <= args.budget_s <= 86400:
        raise ValueError(f"budget_s must lie in [60, 86400], got {args.budget_s}")
    if not 1024 <= args.max_total_tokens <= 10_000_000:
        raise ValueError(f"max_total_tokens must lie in [1024, 1e7], got {args.max_total_tokens}")
    if args.gpu_gib is not None and not 1 <= args.gpu_gib <= 4096:
        raise ValueError(f"gpu_gib must lie in [1, 4096], got {args.gpu_gib}")
    total_gib = args.gpu_gib if args.gpu_gib is not None else gpu_memory_gib()
    shape = SHAPES[written_shape(args.models) or "llama-8b"]
    context = model_context_len(args.models)
    notes = []
    cap, cap_label = args.max_total_tokens, "the largest pool allowed, --max-total-tokens"
    if total_gib is not None:
        fits = min(pool_that_fits(shape, [CONFIGS[p.config].speculative] * 2, total_gib) for p in pairs)
        if fits < cap:
            notes.append(f"pool at most {fits} tokens, not {cap}: a pair's two servers fit the GPU's "
                         f"{total_gib:.1f} GiB only so (gpu_fit estimate)")
            cap, cap_label = fits, f"the largest pool a pair's two servers fit in {total_gib:.1f} GiB,"
    cells, skipped = plan_cells(pairs, prompt_lens, concs, args.output_len, cap, context, cap_label)
    if not cells:
        raise ValueError(f"no cell fits a KV pool of {cap} tokens and a context of {context}: "
                         "lower --prompt-lens or --concurrency")
    pool = min(pool_for(cells, args.output_len), cap)
    waves = plan_waves(pairs, pool, total_gib, shape)
    if len(waves) > 1:
        groups = "; ".join(", ".join(p.name for p in w) for w in waves)
        notes.append(f"{len(waves)} server groups, one after the other ({groups}): "
                     f"all pairs at once do not fit the GPU's {total_gib:.1f} GiB at a pool of {pool} tokens "
                     "(gpu_fit estimate)")
    settings = ServerSettings(target=os.path.join(args.models, "target"), draft=os.path.join(args.models, "eagle"),
                              max_total_tokens=pool, max_running_requests=max(concs),
                              mem_fraction_static=args.mem_fraction_static, prefill_graphs=args.prefill_graphs)
    return {"pairs": pairs, "cells": cells, "skipped": skipped, "settings": settings, "waves": waves,
            "pool": pool, "gpu_gib": total_gib, "notes": notes}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        plan = validate(args)
    except ValueError as exc:
        print(f"attention_cost: {exc}", file=sys.stderr)
        return 2
    servers = {}
    port = args.port_base
    for pair in plan["pairs"]:
        for arm in ARMS:
            servers[(pair.name, arm)] = (port, *server_argv(pair, arm, plan["settings"], port))
            port += 10
    if args.dry_run:
        gib = "unknown" if plan["gpu_gib"] is None else f"{plan['gpu_gib']:.1f} GiB"
        print(f"GPU memory {gib}; KV pool {plan['pool']} tokens per server")
        for i, wave in enumerate(plan["waves"]):
            print(f"server group {i + 1}: {', '.join(p.name for p in wave)}")
        if len(plan["waves"]) > 1:
            print(f"note: a group starts only with {WAVE_START_RESERVE_S} s of --budget-s ({args.budget_s:.0f}) left "
                  "and its servers take minutes to start: one --pairs per command fits the budget best")
        for note in plan["notes"]:
            print(f"note: {note}")
        for (name, arm), (p, cmd, env) in servers.items():
            print(f"{name} {arm} :{p} env={env} {' '.join(cmd)}")
        for pair, prompt_len, conc in plan["cells"]:
            print(f"cell {pair.name} prompt={prompt_len} c={conc}")
        for s in plan["skipped"]:
            print(f"skip {s['pair']} prompt={s['prompt_len']} c={s['concurrency']}: {s['why']}")
        return 0
    return run(args, plan, servers)


def start_servers(args, keys: list, servers: dict) -> dict:
    """Start the servers of ``keys`` (``(pair name, arm)``), each logging to ``logs/server_<pair>_<arm>.log``."""
    procs = {}
    for key in keys:
        port, cmd, env = servers[key]
        log = open(log_path(args, key), "w")
        procs[key] = subprocess.Popen(cmd, env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT,
                                      start_new_session=True)
    return procs


def stop_servers(procs: dict, grace_s: float = 60.0) -> None:
    """Stop every server's process group and wait until no process of it is left.

    SGLang's scheduler and detokenizer are children in the server's group and
    hold its GPU memory until they exit, so the next wave starts only after
    every group is gone (SIGKILL for what outlives ``grace_s``).
    """
    def alive(pgid: int) -> bool:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # a recycled id owned by someone else: ours is gone
            return False
        return True

    for proc in procs.values():
        try:
            os.killpg(proc.pid, 15)
        except ProcessLookupError:
            pass
    for signal_number, wait_s in ((None, grace_s), (9, 30.0)):
        if signal_number is not None:
            for proc in procs.values():
                if alive(proc.pid):
                    os.killpg(proc.pid, signal_number)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            for proc in procs.values():
                proc.poll()  # reap the group leader
            if not any(alive(proc.pid) for proc in procs.values()):
                return
            time.sleep(0.5)


def log_path(args, key: tuple[str, str]) -> str:
    return os.path.join(args.out, "logs", f"server_{key[0]}_{key[1]}.log")


def logged_pools(args, keys: list) -> dict:
    """``(pair, arm) -> tokens``: the KV pool each server's log reports (servers without the line left out)."""
    pools = {}
    for key in keys:
        try:
            with open(log_path(args, key), errors="replace") as f:
                tokens = logged_pool_tokens(f.read())
        except OSError:
            tokens = None
        if tokens is not None:
            pools[key] = tokens
    return pools


# No wave starts with less of the budget left: four 8B-shape servers took 219 s to become healthy (2026-12-05).
WAVE_START_RESERVE_S = 240


def skip_cells(plan: dict, pairs, why: str) -> None:
    """List every planned cell of ``pairs`` as skipped, with ``why``."""
    for pair, prompt_len, conc in plan["cells"]:
        if pair in pairs:
            plan["skipped"].append({"pair": pair.name, "concurrency": conc, "prompt_len": prompt_len, "why": why})


def run(args, plan: dict, servers: dict) -> int:
    start = time.monotonic()
    left = lambda: args.budget_s - (time.monotonic() - start)  # noqa: E731
    os.makedirs(os.path.join(args.out, "logs"), exist_ok=True)
    if not os.path.exists(os.path.join(args.models, "models.json")):
        subprocess.run([sys.executable, os.path.join(HERE, "serving_models.py"), args.models], check=True,
                       timeout=max(30.0, min(300.0, left() - 120)))
    runs_path = os.path.join(args.out, "runs.jsonl")
    runs, notes = [], list(plan["notes"])
    try:
        for i, wave in enumerate(plan["waves"]):
            if left() < WAVE_START_RESERVE_S:
                for later in plan["waves"][i:]:
                    skip_cells(plan, later, f"not started: {left():.0f} s of the budget left for a group of servers")
                notes.append(f"budget: {len(plan['waves']) - i} server group(s) not started")
                break
            keys = [(pair.name, arm) for pair in wave for arm in ARMS]
            procs = start_servers(args, keys, servers)
            try:
                run_wave(args, plan, servers, wave, keys, procs, left, runs, notes, runs_path, start)
            finally:
                stop_servers(procs, grace_s=max(5.0, min(60.0, left() - 10)))
    except TimeoutError:
        pass
    finally:
        write(args, plan, runs, notes)
    return 0


def wait_for_servers(servers: dict, keys: list, procs: dict, limit_s: float) -> list:
    """Wait until every server of ``keys`` is healthy, one exits, or ``limit_s``; the keys of those not up.

    A server that exits drops out of the wait; the others keep their chance.
    """
    deadline = time.monotonic() + limit_s
    waiting = set(keys)
    while waiting and time.monotonic() < deadline:
        waiting -= {k for k in waiting if procs[k].poll() is not None or healthy(servers[k][0])}
        if waiting:
            time.sleep(2)
    return [k for k in keys if not healthy(servers[k][0])]


def run_wave(args, plan, servers, wave, keys, procs, left, runs, notes, runs_path, start) -> None:
    """One wave: wait for its servers, then every cell of its pairs, interleaved; TimeoutError at the budget.

    A pair with a server that did not come up has its cells listed as skipped;
    so has a cell larger than the KV pool a server of its pair logged.
    """
    down = wait_for_servers(servers, keys, procs, min(args.server_timeout_s, left() - 60))
    up = [k for k in keys if k not in down]
    if down:
        notes.append(f"servers not healthy after {time.monotonic() - start:.0f} s: "
                     f"{['/'.join(k) for k in down]}")
        skip_cells(plan, [p for p in wave if any(k[0] == p.name for k in down)],
                   "a server of the pair did not become healthy (its log in logs/)")
    if up:
        notes.append(f"servers {['/'.join(k) for k in up]} ready after {time.monotonic() - start:.0f} s")
    pools = logged_pools(args, keys)
    from serving_driver import run_bench

    tokenizer = plan["settings"].target
    for pair, prompt_len, conc in plan["cells"]:
        if pair not in wave or any(k[0] == pair.name for k in down):
            continue
        need = kv_tokens(conc, prompt_len, args.output_len)
        logged = min((pools[(pair.name, arm)] for arm in ARMS if (pair.name, arm) in pools), default=None)
        if logged is not None and need > logged:
            plan["skipped"].append({"pair": pair.name, "concurrency": conc, "prompt_len": prompt_len,
                                    "why": f"{need} tokens of KV exceed the pool of {logged} a server logged"})
            continue
        load = LoadSettings(input_len=prompt_len, output_len=args.output_len, rounds=args.waves)
        # Round 0, a warm-up of each arm (not counted), at every cell: the first run at a new batch size can
        # compile kernels in one arm only (measured: ratios from 0.10 to 1.48 at one cell without it).
        for rnd in range(args.rounds + 1):
            for arm in arm_order(max(rnd, 1)):
                if left() < 30:
                    notes.append(f"budget: stopped before {pair.name} prompt {prompt_len} c={conc} round {rnd}")
                    raise TimeoutError
                port = servers[(pair.name, arm)][0]
                raw = os.path.join(args.out, "raw.jsonl")
                argv = bench_args(f"http://127.0.0.1:{port}", tokenizer, conc, load, output_file=raw,
                                  tag=f"{pair.name}_{arm}", num_prompts=conc if rnd == 0 else None,
                                  warmup_requests=0 if rnd else None)
                row = {"pair": pair.name, "arm": arm, "prompt_len": prompt_len, "concurrency": conc, "round": rnd}
                t0 = time.monotonic()
                try:
                    result = run_bench(argv, raw)
                    row.update({k: result.get(k) for k in ("mean_itl_ms", "median_itl_ms", "p90_itl_ms",
                                                          "output_throughput", "duration", "completed")})
                except Exception as exc:  # a failed run is recorded; the cell's other runs still count
                    row["error"] = repr(exc)[:500]
                row["wall_s"] = round(time.monotonic() - t0, 2)
                if rnd:
                    runs.append(row)
                with open(runs_path, "a") as f:
                    f.write(json.dumps(row) + "\n")


def write(args, plan: dict, runs: list[dict], notes: list[str]) -> None:
    rows = [r for pair, prompt_len, conc in plan["cells"] if (r := summarize(runs, pair, prompt_len, conc))]
    listed = {(s["pair"], s["prompt_len"], s["concurrency"]) for s in plan["skipped"]}
    measured = {(r["pair"], r["prompt_len"], r["concurrency"]) for r in rows}
    for pair, prompt_len, conc in plan["cells"]:
        if (pair.name, prompt_len, conc) not in listed | measured:
            plan["skipped"].append({"pair": pair.name, "concurrency": conc, "prompt_len": prompt_len,
                                    "why": "not measured: no round with both arms (the budget ended first, or "
                                           "failed runs in runs.jsonl)"})
    cost = {"date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%MZ"),
            "machine": gpu_facts()[1] or "unknown GPU",
            "settings": {"pairs": [dataclasses.asdict(p) for p in plan["pairs"]], "output_len": args.output_len,
                         "rounds": args.rounds, "waves": args.waves, "max_total_tokens": plan["pool"],
                         "gpu_gib": plan["gpu_gib"], "server_waves": [[p.name for p in w] for w in plan["waves"]],
                         "prefill_cuda_graphs": plan["settings"].prefill_graphs,
                         "model": "8B-shape Llama target with an EAGLE draft (serving_models.py)"},
            "rows": rows, "skipped": plan["skipped"], "notes": notes}
    with open(os.path.join(args.out, "cost.json"), "w") as f:
        json.dump(cost, f, indent=1)
    with open(os.path.join(args.out, "cost.md"), "w") as f:
        f.write(render_markdown(cost))
    print(render_markdown(cost))


if __name__ == "__main__":
    sys.exit(main())
