"""Run ``sglang.bench_serving`` against one server: repeated runs per concurrency level, in one process.

Each run is exactly ``python -m sglang.bench_serving <args>`` (its own
``cli_main`` with that argument vector; the equivalent command line is recorded
in every row); running them in one process pays SGLang's import time once per
server instead of once per run.

Per concurrency level (a cell), runs follow ``RepeatSettings`` of
``serving_configs.py``: until ``repeats`` runs lasted at least ``min_seconds``
(bench_serving's ``duration``); a shorter run is kept as a warm-up
(``valid: false, warmup: true``) and the next one gets more prompts; a cell
stops early at ``max_attempts`` runs, at ``max_cell_s`` or at the server's
time limit (``time_left_s`` of the spec), with a ``note`` row saying why. A
spec without ``repeat`` runs each level once (every run valid).

Every finished run is appended at once to ``<out>/results.jsonl``
(bench_serving's result plus ``key``, ``name``, ``title``, ``concurrency``,
``rep`` (the run's number in its cell, from 1, warm-ups included),
``num_prompts``, ``duration_s``, ``wall_s``, ``valid``, ``warmup`` and
``command``), so a run cut short keeps what it measured.

    python serving_driver.py --spec JSON      # one server
    python serving_driver.py --serve          # one spec per stdin line (serving_run.py)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serving_configs import LoadSettings, RepeatSettings, bench_args, shell_line  # noqa: E402
from serving_interleave import common_prompts, pairable, schedule  # noqa: E402


def import_bench_serving():
    """``sglang.bench_serving``, importable without the Hugging Face ``datasets`` package.

    Its dataset registry imports the MMMU loader, which does ``from datasets
    import load_dataset`` at import time; these runs use the ``random-ids``
    dataset only. Where ``datasets`` is missing, a placeholder module stands in
    whose ``load_dataset`` raises ImportError, so only an MMMU run would fail.
    """
    import importlib.machinery
    import importlib.util
    import types

    if "datasets" not in sys.modules and importlib.util.find_spec("datasets") is None:
        placeholder = types.ModuleType("datasets")

        def load_dataset(*args, **kwargs):
            raise ImportError("the Hugging Face datasets package is not installed")

        placeholder.load_dataset = load_dataset
        # A spec, so later availability checks (find_spec) see a module instead of raising.
        placeholder.__spec__ = importlib.machinery.ModuleSpec("datasets", None)
        sys.modules["datasets"] = placeholder
    import sglang.bench_serving

    return sglang.bench_serving


def run_level(argv: list[str]) -> None:
    """One ``bench_serving`` run with ``argv`` (SystemExit from its parser becomes RuntimeError)."""
    cli_main = import_bench_serving().cli_main

    saved = sys.argv
    sys.argv = ["sglang.bench_serving", *argv]
    try:
        cli_main()
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise RuntimeError(f"bench_serving exited with {exc.code}") from None
    finally:
        sys.argv = saved


def last_json_line(path: str) -> dict | None:
    if not os.path.exists(path):
        return None
    lines = [line for line in open(path).read().splitlines() if line.strip()]
    return json.loads(lines[-1]) if lines else None


def serve() -> int:
    """Persistent mode: import bench_serving once, then run one spec per stdin line.

    Protocol on the original stdout: ``ready`` once imported, ``done <rc>`` after each spec;
    everything bench_serving prints goes to stderr (the caller's log).
    """
    protocol = sys.stdout
    sys.stdout = sys.stderr
    import_bench_serving()  # the import the caller wants paid before measuring

    protocol.write("ready\n")
    protocol.flush()
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            rc = run_spec(json.loads(line))
        except Exception:
            traceback.print_exc()
            rc = 2
        protocol.write(f"done {rc}\n")
        protocol.flush()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", help="JSON: url, tokenizer, out, key, name, title, concurrencies, load; "
                        "optional: repeat, time_left_s, profile_dir, profile_steps (see run_spec)")
    parser.add_argument("--serve", action="store_true", help="read one spec per stdin line (see serve())")
    args = parser.parse_args(argv)
    if args.serve:
        return serve()
    if not args.spec:
        parser.error("spec: required unless --serve")
    return run_spec(json.loads(args.spec))


def run_bench(argv: list[str], raw_file: str) -> dict:
    """One bench_serving run; its result line without ``server_info`` (RuntimeError when it wrote none)."""
    run_level(argv)
    result = last_json_line(raw_file)
    if result is None:
        raise RuntimeError("bench_serving wrote no result line")
    result.pop("server_info", None)  # the full server arguments: in meta.json once, not per row
    return result


def _append(path: str, row: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")


def _merge_result(row: dict, result: dict) -> None:
    """bench_serving's ``result`` into ``row`` (keys ``row`` already has are kept)."""
    # bench_serving's "concurrency" is the measured mean of requests in flight; ours is the limit.
    result["measured_concurrency"] = result.pop("concurrency", None)
    row.update({k: v for k, v in result.items() if k not in row})


def _timed_run(row: dict, args: list[str], raw_file: str, repeat: RepeatSettings, *, counts: bool, run, clock,
               results: str) -> bool:
    """One measured run: its result, ``duration_s``, ``valid``, ``warmup`` and ``wall_s`` in ``row``, the row
    appended to ``results``; False when it failed (``error`` in the row, ``valid: false``).

    ``valid``: ``counts`` (False for a run that is a warm-up whatever its length) and ``repeat.is_valid``
    of bench_serving's ``duration`` in seconds; a run with no positive duration has failed.
    """
    started = clock()
    ok = True
    try:
        result = run(args, raw_file)
        _merge_result(row, result)
        duration = result.get("duration")
        if isinstance(duration, bool) or not isinstance(duration, (int, float)) or not duration > 0:
            raise RuntimeError(f"bench_serving reported no positive duration: {duration!r}")
        row["duration_s"] = round(float(duration), 3)
        row["valid"] = counts and repeat.is_valid(duration)
        row["warmup"] = not row["valid"]
    except Exception as exc:  # the caller's other cells are still worth measuring
        ok = False
        row.update({"error": f"{type(exc).__name__}: {exc}", "valid": False, "warmup": False,
                    "duration_s": None})
        traceback.print_exc()
    row["wall_s"] = round(clock() - started, 2)
    _append(results, row)
    return ok


def measure_cell(spec: dict, conc: int, load: LoadSettings, repeat: RepeatSettings, *, deadline: float,
                 run=run_bench, clock=time.monotonic) -> tuple[int, int]:
    """The runs of one concurrency level, rows appended to ``<out>/results.jsonl``; returns (valid, failed).

    ``run(argv, raw_file) -> result`` and ``clock`` are bench_serving and
    ``time.monotonic`` except in tests. A failed run ends the cell (a server
    that answers with errors would fail the next run too); when the cell ends
    with fewer than ``repeat.repeats`` valid runs, a row with ``note`` (and
    ``valid: false``, no metrics) says why.
    """
    out = spec["out"]
    raw = os.path.join(out, "raw")
    os.makedirs(raw, exist_ok=True)
    results = os.path.join(out, "results.jsonl")
    base = {"key": spec["key"], "name": spec["name"], "title": spec["title"], "concurrency": conc}
    start = repeat.start_prompts(load, conc)
    runs: list[dict] = []
    failed = 0
    cell_started = clock()
    while True:
        prompts, why = repeat.next_attempt(runs, start, conc, cell_elapsed_s=clock() - cell_started,
                                           time_left_s=deadline - clock())
        if prompts is None:
            break
        rep = len(runs) + 1
        tag = f"{spec['name']}_c{conc}_r{rep}"
        raw_file = os.path.join(raw, f"{tag}.jsonl")
        # The runs after the first follow one at the same concurrency: the server is warm.
        args = bench_args(spec["url"], spec["tokenizer"], conc, load, output_file=raw_file, tag=tag,
                          num_prompts=prompts, warmup_requests=None if rep == 1 else 0)
        row = {**base, "rep": rep, "num_prompts": prompts,
               "command": shell_line([sys.executable, "-m", "sglang.bench_serving", *args])}
        if not _timed_run(row, args, raw_file, repeat, counts=True, run=run, clock=clock, results=results):
            failed += 1
        print(f"[driver] {spec['name']} c={conc} run {rep} ({prompts} prompts): "
              + (row.get("error") or f"{row.get('duration_s')} s{'' if row['valid'] else ' (warm-up, short)'}, "
                 f"{row.get('output_throughput', 0):.1f} tok/s, mean ITL {row.get('mean_itl_ms', 0):.2f} ms, "
                 f"accept {row.get('accept_length')}"), flush=True)
        if "error" in row:
            why = f"run {rep} failed ({row['error'][:200]})"
            break
        runs.append({"num_prompts": prompts, "duration_s": row["duration_s"], "wall_s": row["wall_s"],
                     "valid": row["valid"]})
    valid = sum(1 for r in runs if r["valid"])
    if valid < repeat.repeats:
        _append(results, {**base, "valid": False, "note": f"{valid} valid run(s) of {repeat.repeats}: {why}"})
        print(f"[driver] {spec['name']} c={conc}: {valid} valid run(s) of {repeat.repeats}: {why}", flush=True)
    return valid, failed


def run_profile(spec: dict, conc: int, load: LoadSettings) -> int:
    """One run at ``conc`` with SGLang's profiler on, its row in ``<out>/profile_runs.jsonl``; 1 if it failed."""
    out = spec["out"]
    raw = os.path.join(out, "raw")
    os.makedirs(raw, exist_ok=True)
    tag = f"{spec['name']}_c{conc}_profile"
    raw_file = os.path.join(raw, f"{tag}.jsonl")
    args = bench_args(spec["url"], spec["tokenizer"], conc, load, output_file=raw_file, tag=tag,
                      profile_dir=spec["profile_dir"], profile_steps=spec.get("profile_steps", 6))
    row = {"key": spec["key"], "name": spec["name"], "title": spec["title"], "concurrency": conc,
           "num_prompts": load.prompts_for(conc),
           "command": shell_line([sys.executable, "-m", "sglang.bench_serving", *args])}
    started = time.monotonic()
    try:
        _merge_result(row, run_bench(args, raw_file))
    except Exception as exc:
        row["error"] = f"{type(exc).__name__}: {exc}"
        traceback.print_exc()
    row["wall_s"] = round(time.monotonic() - started, 2)
    _append(os.path.join(out, "profile_runs.jsonl"), row)
    return 1 if "error" in row else 0


def run_interleaved(spec: dict, *, run=run_bench, clock=time.monotonic) -> int:
    """The interleaved protocol (``serving_interleave.py``) over several servers; 1 if some run failed.

    ``spec``: ``mode: "interleave"``, ``servers`` ({key: {url, name, title}}),
    ``tokenizer``, ``out``, ``concurrencies``, ``load`` and ``repeat``
    (LoadSettings / RepeatSettings fields: ``min_seconds``, ``margin`` and
    the first-run prompt rule apply), ``rounds``, optionally ``time_left_s``.
    Every run is one row of ``<out>/results.jsonl`` with ``round`` (0:
    calibration, a warm-up never counted) and ``interleaved: true``; the
    runs of one (round, concurrency) have the same ``num_prompts``
    (``serving_interleave.common_prompts``). A (round, concurrency) group
    starts only when all of it is predicted to end before the time limit
    (from each configuration's last run: seconds per prompt plus the call's
    overhead) and only with configurations that can still be paired (a
    server that failed a run leaves the later rounds, and so does a
    configuration whose reference left); a cell left with fewer valid
    rounds than ``rounds`` gets a ``note`` row saying why. ``run`` and
    ``clock`` are bench_serving and ``time.monotonic`` except in tests.
    """
    load = LoadSettings(**spec["load"])
    repeat = RepeatSettings(**spec["repeat"])
    servers = spec["servers"]
    rounds = int(spec["rounds"])
    deadline = clock() + float(spec.get("time_left_s", float("inf")))
    out = spec["out"]
    raw = os.path.join(out, "raw")
    os.makedirs(raw, exist_ok=True)
    results = os.path.join(out, "results.jsonl")
    plan = schedule(list(servers), list(spec["concurrencies"]), rounds)
    prompts: dict[int, int] = {}  # concurrency -> every configuration's prompt count
    cost: dict[tuple[str, int], tuple[float, float]] = {}  # seconds per prompt, overhead per call
    valid: dict[tuple[str, int], int] = {}
    skipped: dict[tuple[str, int], str] = {}
    failed: dict[str, str] = {}  # key -> why its server left the protocol
    failures = 0
    groups: dict[tuple[int, int], list[str]] = {}
    for rnd, conc, key in plan:
        groups.setdefault((rnd, conc), []).append(key)
    for (rnd, conc), planned in groups.items():
        keys = pairable([k for k in planned if k not in failed])
        if len(keys) < 2:
            alone = f"round {rnd}: no pair left (failed: {', '.join(failed)})"
            for k in planned:
                skipped.setdefault((k, conc), failed.get(k) or alone)
            continue
        if rnd > 0:
            if conc not in prompts:
                continue  # not calibrated: the reason is recorded already
            predicted = sum(cost[(k, conc)][0] * prompts[conc] + cost[(k, conc)][1] for k in keys)
            if predicted > deadline - clock():
                for k in keys:
                    skipped.setdefault((k, conc), f"round {rnd} predicted to take {predicted:.0f} s, "
                                                  f"{max(0.0, deadline - clock()):.0f} s left")
                continue
        elif deadline - clock() < max(repeat.min_seconds, 1.0):
            for k in keys:
                skipped.setdefault((k, conc), "no time left to calibrate")
            continue
        n = repeat.start_prompts(load, conc) if rnd == 0 else prompts[conc]
        durations = []
        for key in keys:
            server = servers[key]
            tag = f"{server['name']}_c{conc}_i{rnd}"
            raw_file = os.path.join(raw, f"{tag}.jsonl")
            args = bench_args(server["url"], spec["tokenizer"], conc, load, output_file=raw_file, tag=tag,
                              num_prompts=n, warmup_requests=None if rnd == 0 else 0)
            row = {"key": key, "name": server["name"], "title": server["title"], "concurrency": conc,
                   "round": rnd, "rep": rnd, "interleaved": True, "num_prompts": n,
                   "command": shell_line([sys.executable, "-m", "sglang.bench_serving", *args])}
            # Round 0 calibrates: a warm-up, never counted.
            if not _timed_run(row, args, raw_file, repeat, counts=rnd > 0, run=run, clock=clock, results=results):
                failures += 1
            print(f"[driver] interleaved round {rnd} {server['name']} c={conc} ({n} prompts): "
                  + (row.get("error") or f"{row['duration_s']} s, {row.get('output_throughput', 0):.1f} tok/s"),
                  flush=True)
            if "error" in row:
                failed[key] = f"round {rnd} c={conc} failed ({row['error'][:200]})"  # no more runs of it
                skipped[(key, conc)] = failed[key]
                continue
            duration = row["duration_s"]
            durations.append(duration)
            cost[(key, conc)] = (duration / n, max(0.0, row["wall_s"] - duration))
            valid[(key, conc)] = valid.get((key, conc), 0) + int(row["valid"])
            if rnd > 0 and not row["valid"]:
                skipped.setdefault((key, conc), f"round {rnd} lasted {duration:g} s, less than min_seconds "
                                                f"({repeat.min_seconds:g} s)")
        # Calibrate (again) from the fastest run: after round 0, or when a round's fastest run was short.
        if durations and (rnd == 0 or min(durations) < repeat.min_seconds):
            prompts[conc] = common_prompts(repeat, n, durations, conc)
        elif rnd == 0:
            for k in keys:
                skipped.setdefault((k, conc), "calibration failed")
    for key, server in servers.items():
        for conc in spec["concurrencies"]:
            got = valid.get((key, conc), 0)
            if got < rounds:
                why = skipped.get((key, conc)) or failed.get(key) or "not reached"
                _append(results, {"key": key, "name": server["name"], "title": server["title"],
                                  "concurrency": conc, "interleaved": True, "valid": False,
                                  "note": f"{got} valid round(s) of {rounds}: {why}"})
    return 1 if failures else 0


def run_spec(spec: dict) -> int:
    """Every concurrency level of ``spec``; 1 when some run failed, else 0.

    ``spec``: ``url``, ``tokenizer``, ``out``, ``key``, ``name``, ``title``,
    ``concurrencies``, ``load`` (LoadSettings fields), optionally ``repeat``
    (RepeatSettings fields; without it one run per level), ``time_left_s``
    (seconds this server may take; no run starts that is predicted to end
    later), ``profile_dir`` and ``profile_steps`` (one profiled run per level
    instead, in ``profile_runs.jsonl``). A spec with ``mode: "interleave"``
    goes to :func:`run_interleaved`.
    """
    if spec.get("mode") == "interleave":
        return run_interleaved(spec)
    load = LoadSettings(**spec["load"])
    if spec.get("profile_dir"):
        return 1 if sum(run_profile(spec, conc, load) for conc in spec["concurrencies"]) else 0
    repeat = RepeatSettings(**spec["repeat"]) if spec.get("repeat") else RepeatSettings.single()
    deadline = time.monotonic() + float(spec.get("time_left_s", float("inf")))
    failures = 0
    for conc in spec["concurrencies"]:
        _, failed = measure_cell(spec, conc, load, repeat, deadline=deadline)
        failures += failed
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
