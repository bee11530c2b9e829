"""DeepGEMM JIT compiles in SGLang server logs: how many at start-up, how many while serving, and when.

A server started with ``DG_JIT_DEBUG=1`` (``run_h200.sh --server-env
DG_JIT_DEBUG=1``) logs ptxas's ``Compiling entry function`` line for each
kernel DeepGEMM compiles; those lines carry no time, so each takes the time
of the last timestamped SGLang line before it. A compile after SGLang's
``The server is fired up`` line happened inside a request.

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


def compiles(lines) -> dict:
    """Count DeepGEMM compiles in one server log's lines (an iterable of str).

    Returns ``{"ready_at": str | None, "at_start_up": int, "while_serving": int,
    "serving_times": {time: count}}``; a compile counts as serving when the
    ready line came before it. Times are the log's (UTC, second resolution).
    """
    last, ready, start, serving = None, None, 0, collections.Counter()
    for line in lines:
        stamp = STAMP.match(line)
        if stamp:
            last = stamp.group(1)
        if READY in line and ready is None:
            ready = last
        elif COMPILE in line:
            if ready is None:
                start += 1
            else:
                serving[last] += 1
    return {"ready_at": ready, "at_start_up": start, "while_serving": sum(serving.values()),
            "serving_times": dict(serving)}


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
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
