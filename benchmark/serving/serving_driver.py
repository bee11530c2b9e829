"""Run ``sglang.bench_serving`` once per concurrency level against one server, in one process.

Each level is exactly ``python -m sglang.bench_serving <args>`` (its own
``cli_main`` with that argument vector; the equivalent command line is recorded
in every row); running them in one process pays SGLang's import time once per
server instead of once per level. Every finished level is appended at once to
``<out>/results.jsonl`` (bench_serving's result plus ``key``, ``name``,
``title``, ``concurrency``, ``command``), so a run cut short keeps what it measured.

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
from serving_configs import LoadSettings, bench_args, shell_line  # noqa: E402


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
    parser.add_argument("--spec", help="JSON: url, tokenizer, out, key, name, title, "
                        "concurrencies, load, profile_dir (optional), profile_steps")
    parser.add_argument("--serve", action="store_true", help="read one spec per stdin line (see serve())")
    args = parser.parse_args(argv)
    if args.serve:
        return serve()
    if not args.spec:
        parser.error("spec: required unless --serve")
    return run_spec(json.loads(args.spec))


def run_spec(spec: dict) -> int:
    """Every concurrency level of ``spec``; 1 when some level failed, else 0."""
    load = LoadSettings(**spec["load"])
    out = spec["out"]
    raw = os.path.join(out, "raw")
    os.makedirs(raw, exist_ok=True)
    failures = 0
    for conc in spec["concurrencies"]:
        suffix = "_profile" if spec.get("profile_dir") else ""
        raw_file = os.path.join(raw, f"{spec['name']}_c{conc}{suffix}.jsonl")
        args = bench_args(spec["url"], spec["tokenizer"], conc, load, output_file=raw_file,
                          tag=f"{spec['name']}_c{conc}{suffix}", profile_dir=spec.get("profile_dir"),
                          profile_steps=spec.get("profile_steps", 6))
        row = {"key": spec["key"], "name": spec["name"], "title": spec["title"], "concurrency": conc,
               "num_prompts": load.prompts_for(conc),
               "command": shell_line([sys.executable, "-m", "sglang.bench_serving", *args])}
        started = time.monotonic()
        try:
            run_level(args)
            result = last_json_line(raw_file)
            if result is None:
                raise RuntimeError("bench_serving wrote no result line")
            result.pop("server_info", None)  # the full server arguments: in meta.json once, not per row
            # bench_serving's "concurrency" is the measured mean of requests in flight; ours is the limit.
            result["measured_concurrency"] = result.pop("concurrency", None)
            row.update({k: v for k, v in result.items() if k not in row})
        except Exception as exc:  # keep going: the other levels are still worth measuring
            failures += 1
            row["error"] = f"{type(exc).__name__}: {exc}"
            traceback.print_exc()
        row["wall_s"] = round(time.monotonic() - started, 2)
        target = os.path.join(out, "profile_runs.jsonl" if suffix else "results.jsonl")
        with open(target, "a") as f:
            f.write(json.dumps(row) + "\n")
        print(f"[driver] {spec['name']} c={conc}: "
              + (row.get("error") or f"{row.get('output_throughput', 0):.1f} tok/s, "
                 f"mean ITL {row.get('mean_itl_ms', 0):.2f} ms, accept {row.get('accept_length')}"), flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
