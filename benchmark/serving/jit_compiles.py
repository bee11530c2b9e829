"""DeepGEMM JIT compiles in SGLang server logs: how many at start-up, how many while serving, and when.

A server started with ``DG_JIT_DEBUG=1`` (``run_h200.sh --server-env
DG_JIT_DEBUG=1``) logs ptxas's ``Compiling entry function`` line for each
kernel DeepGEMM compiles; those lines carry no time, so each takes the time
of the last timestamped SGLang line before it. A compile after SGLang's
``The server is fired up`` line happened inside a request. With
``DG_PRINT_CONFIGS=1`` as well (a second ``--server-env``) DeepGEMM prints
each GEMM shape's chosen configuration once (its ``GemmDesc(... m=, n=, k=
...)``); the shapes first printed after the ready line are the row counts
(M) that reached DeepGEMM first inside a request, which the start-up
warm-up (``sglang_plugin/gemm_warmup_hook.py``) and the CUDA-graph capture
did not meet.

    python benchmark/serving/jit_compiles.py OUT/logs/server_*.log [--json PATH]
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import sys

COMPILE = "Compiling entry function"
READY = "The server is fired up"
STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)")
# DG_PRINT_CONFIGS: one GemmDesc per new shape; its block sizes, where printed on the same line.
SHAPE = re.compile(r"GemmDesc\(.*?\bm=(\d+), n=(\d+), k=(\d+)")
BLOCK = re.compile(r"\bblock_(m|n)=(\d+)")


def compiles(lines) -> dict:
    """Count DeepGEMM compiles in one server log's lines (an iterable of str).

    Returns ``{"ready_at": str | None, "at_start_up": int, "while_serving": int,
    "serving_times": {time: count}, "shapes_at_start_up": int, "shapes_while_serving":
    [{"m", "n", "k", "block_m", "block_n", "time"}], "shapes_unread": int}``
    (``GemmDesc`` lines whose m, n, k did not parse); a compile or a shape
    counts as serving when the ready line came before it (block sizes None
    where the line does not print them). Times are the log's (UTC, second
    resolution).
    """
    last, ready, start, serving = None, None, 0, collections.Counter()
    shapes_start, shapes_serving, unread = 0, [], 0
    for line in lines:
        stamp = STAMP.match(line)
        if stamp:
            last = stamp.group(1)
        shape = SHAPE.search(line)
        if READY in line and ready is None:
            ready = last
        elif COMPILE in line:
            if ready is None:
                start += 1
            else:
                serving[last] += 1
        elif "GemmDesc(" in line and not shape:
            unread += 1
        elif shape:
            if ready is None:
                shapes_start += 1
            else:
                blocks = dict(BLOCK.findall(line))
                m, n, k = (int(v) for v in shape.groups())
                shapes_serving.append({"m": m, "n": n, "k": k, "block_m": _int(blocks.get("m")),
                                       "block_n": _int(blocks.get("n")), "time": last})
    return {"ready_at": ready, "at_start_up": start, "while_serving": sum(serving.values()),
            "serving_times": dict(serving), "shapes_at_start_up": shapes_start,
            "shapes_while_serving": shapes_serving, "shapes_unread": unread}


def _int(value: str | None) -> int | None:
    return None if value is None else int(value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("logs", nargs="+", help="SGLang server logs of servers started with DG_JIT_DEBUG=1")
    parser.add_argument("--json", help="also write the counts, by log path, to this file")
    args = parser.parse_args(argv)
    out = {}
    for path in args.logs:
        with open(path, errors="replace") as f:
            out[path] = compiles(f)
        row = out[path]
        print(f"{path}: {row['at_start_up']} at start-up, {row['while_serving']} while serving "
              f"(ready at {row['ready_at']}){' ' + str(row['serving_times']) if row['serving_times'] else ''}")
        rows = sorted({s["m"] for s in row["shapes_while_serving"]})
        print(f"  GEMM shapes printed (DG_PRINT_CONFIGS): {row['shapes_at_start_up']} at start-up, "
              f"{len(row['shapes_while_serving'])} first met while serving{', row counts ' + str(rows) if rows else ''}"
              f"{'; ' + str(row['shapes_unread']) + ' GemmDesc lines not read' if row['shapes_unread'] else ''}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
