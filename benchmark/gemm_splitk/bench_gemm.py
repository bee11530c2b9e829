"""The batch-invariant GEMM against cuBLAS and SGLang's deterministic GEMM (CUDA GPU).

For every shape (``N x K``: 8B Llama target layers, the EAGLE draft's fc, a
70B-class dense model) and M, three things are timed on ``C = A @ W^T``:

- ``us``: the split-K GEMM (``gemm_splitk.gemm.linear``, the default table);
- ``cublas_us``: ``torch.nn.functional.linear`` with batch-invariant mode off;
- ``sglang_us``: SGLang's deterministic GEMM called directly, by the route its
  ``matmul_persistent`` takes for these arguments (``sglang_route``:
  ``deepgemm`` where DeepGEMM's JIT is on and the shape qualifies, else
  ``triton``, its persistent kernel); ``sglang_triton_us`` /
  ``sglang_deepgemm_us`` give both routes where both run.

Timing: CUDA graphs, each replay running the call over R rotating copies of
the inputs whose total exceeds 3x the L2 cache (so weights stream from HBM
as in a decode step), several calls per replay; the median of ``--replays``
replays, per call. ``gbps`` is the bytes moved (A, W, C once) over our
time; ``memory_bound`` marks cells below the H200's ridge point (spec sheet
989 dense bf16 TFLOP/s over 4.8 TB/s).

``bitwise_invariant``: every row of our result at M equals, bit for bit,
the same row computed at the largest M of the run (the same input rows);
``permuted_invariant``: the rows at the largest M in a random order give
the same rows in that order.

``--variants a,b`` (or ``all``) also times candidate tables of
``gemm_splitk.gemm_config.VARIANTS`` on the same inputs and checks each
against itself across M, so one command can choose the table
(``gemm_variants.json`` and a table per variant in ``gemm.md``).

    PYTHONPATH=$PWD/python python3 benchmark/gemm_splitk/bench_gemm.py [--quick] [--variants all]
        [--dtypes bf16,fp16] [--bias] [--sglang-routes deepgemm,triton|none] [--out DIR]

Writes ``DIR/gemm.json``, ``DIR/gemm.md`` (and ``DIR/gemm_variants.json``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import pathlib
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # benchmark/: the experiment's package
from gemm_splitk.gemm import linear  # noqa: E402
from gemm_splitk.gemm_config import DEFAULT_TABLE, REFERENCE_SHAPES, VARIANTS  # noqa: E402

SHAPES = REFERENCE_SHAPES  # name: (N, K)
QUICK_SHAPES = ("8b_qkv", "8b_o", "8b_gate_up", "8b_down", "8b_lm_head", "eagle_fc")
MS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096, 8192)
QUICK_MS = (1, 4, 16, 64, 128, 256, 1024, 8192)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
HBM_GBPS = 4800.0  # H200 spec sheet
RIDGE_FLOP_PER_BYTE = 989e12 / 4.8e12
GRAPH_TARGET_US = 3000.0  # GPU time per replay: long enough that replay launch cost is noise
MAX_CALLS_PER_GRAPH = 256


def sglang_routes():
    """SGLang's deterministic GEMM routes importable here: {name: fn(a, b_kn, bias)} and the module."""
    try:
        from sglang.srt.batch_invariant_ops import batch_invariant_ops as bio
    except Exception as exc:  # noqa: BLE001 - the benchmark still times ours and cuBLAS
        print(f"SGLang's batch-invariant ops do not import ({exc!r}): no sglang_us column", file=sys.stderr)
        return {}, None
    if bio.is_batch_invariant_mode_enabled():
        raise SystemExit("batch-invariant mode is on: cuBLAS would not be cuBLAS")
    routes = {}
    if hasattr(bio, "_matmul_persistent_triton"):
        routes["triton"] = lambda a, b, bias: bio._matmul_persistent_triton(a=a, b=b, bias=bias, out_dtype=a.dtype)
    if getattr(bio, "ENABLE_JIT_DEEPGEMM", False) and hasattr(bio, "_matmul_persistent_deepgemm"):
        routes["deepgemm"] = lambda a, b, bias: bio._matmul_persistent_deepgemm(a=a, b=b, bias=bias,
                                                                                out_dtype=a.dtype)
    return routes, bio


def route_taken(bio, a: torch.Tensor, b: torch.Tensor) -> str:
    """The route SGLang's ``matmul_persistent`` takes for (a, b): its own condition, read from its flags."""
    k, n = b.shape
    size = a.element_size()
    deepgemm = (getattr(bio, "_ENABLE_MM_DEEPGEMM", True) and getattr(bio, "ENABLE_JIT_DEEPGEMM", False)
                and a.dtype == torch.bfloat16 and a.is_contiguous() and b.transpose(0, 1).is_contiguous()
                and n >= 16 and (n * size) % 16 == 0 and (k * size) % 16 == 0)
    return "deepgemm" if deepgemm else "triton"


def time_call(call, sets, replays: int = 5) -> float:
    """Median microseconds per call over CUDA-graph replays that rotate through ``sets``."""
    for s in sets:  # compile / JIT outside the capture
        call(*s)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for s in sets:
        call(*s)
    end.record()
    torch.cuda.synchronize()
    rough = start.elapsed_time(end) * 1000 / len(sets)
    loops = max(1, min(MAX_CALLS_PER_GRAPH // len(sets), math.ceil(GRAPH_TARGET_US / max(rough, 1.0) / len(sets))))
    calls = loops * len(sets)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(loops):
            for s in sets:
                call(*s)
    graph.replay()
    torch.cuda.synchronize()
    per_call = []
    for _ in range(replays):
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        per_call.append(start.elapsed_time(end) * 1000 / calls)
    del graph
    return statistics.median(per_call)


def rotation(n: int, k: int, max_m: int, dtype, bias: bool, l2_bytes: int):
    """R input sets (A [max_m, K], W [N, K], bias [N] or None) totalling > 3x L2 at M = 1."""
    per_set = n * k * dtype.itemsize
    r = max(1, min(8, math.ceil(3 * l2_bytes / per_set)))
    gen = torch.Generator(device="cuda").manual_seed(n * 1_000_003 + k)
    sets = []
    for _ in range(r):
        a = torch.randn(max_m, k, device="cuda", dtype=torch.float32, generator=gen).to(dtype)
        w = (torch.randn(n, k, device="cuda", dtype=torch.float32, generator=gen) / math.sqrt(k)).to(dtype)
        b = torch.randn(n, device="cuda", dtype=torch.float32, generator=gen).to(dtype) if bias else None
        sets.append((a, w, b))
    return sets


def sliced(sets, m):
    return [(a[:m], w, b) for a, w, b in sets]


def attempt(what: str, fn):
    """``fn()``, or None after printing why: one failing kernel or route is a result, not the end of the run."""
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - see the docstring
        print(f"  {what} failed: {exc!r}"[:800], file=sys.stderr, flush=True)
        return None


def bench_shape(name, n, k, dtype, ms, args, tables, routes, bio, l2_bytes):
    rows, variant_rows = [], []
    max_m = max(ms)
    sets = rotation(n, k, max_m, dtype, args.bias, l2_bytes)
    a_max, w_max, b_max = sets[0]
    full = {t.name: attempt(f"{t.name} at {name} m={max_m}", lambda t=t: linear(a_max, w_max, b_max, table=t))
            for t in tables}
    # The same rows in another order: a row's bits follow the row, not its index.
    perm = torch.randperm(max_m, device="cuda", generator=torch.Generator(device="cuda").manual_seed(7))
    permuted_ok = {t.name: full[t.name] is not None
                   and bool(torch.equal(linear(a_max[perm], w_max, b_max, table=t), full[t.name][perm]))
                   for t in tables}
    for m in ms:
        cut = sliced(sets, m)
        a0, w0, b0 = cut[0]
        bytes_moved = (m * k + n * k + m * n) * dtype.itemsize
        memory_bound = 2.0 * m * n * k / bytes_moved < RIDGE_FLOP_PER_BYTE
        row = {"shape": f"{n}x{k}", "name": name, "m": m, "dtype": str(dtype).removeprefix("torch.")}
        for t in tables:
            inv, us = False, None
            if full[t.name] is not None:
                out = attempt(f"{t.name} at {name} m={m}", lambda t=t: linear(a0, w0, b0, table=t))
                inv = out is not None and bool(torch.equal(out, full[t.name][:m]))
                us = attempt(f"timing {t.name} at {name} m={m}",
                             lambda t=t: time_call(lambda a, w, b: linear(a, w, b, table=t), cut, replays=args.replays))
            tiling, order = t.bucket(m), t.k_order(n, k)
            vrow = {**row, "variant": t.name, "us": us, "bitwise_invariant": inv,
                    "permuted_invariant": permuted_ok[t.name],
                    "bucket": f"{tiling.schedule} {tiling.block_m}x{tiling.block_n}{' swap' if tiling.swap_ab else ''}",
                    "splits": order.splits, "block_k": order.block_k}
            variant_rows.append(vrow)
            if t is tables[0]:
                row.update({key: vrow[key] for key in ("us", "bitwise_invariant", "permuted_invariant", "bucket",
                                                        "splits", "block_k")})
        row["cublas_us"] = attempt(f"cuBLAS at {name} m={m}", lambda: time_call(F.linear, cut, replays=args.replays))
        by_route = {}
        for rname, fn in routes.items():
            if rname == "deepgemm" and route_taken(bio, a0, w0.t()) != "deepgemm":
                continue  # DeepGEMM refuses what SGLang would not send it (fp16, unaligned shapes)
            by_route[rname] = attempt(f"SGLang {rname} at {name} m={m}", lambda fn=fn: time_call(
                lambda a, w, b: fn(a, w.t(), b), cut, replays=args.replays))
            row[f"sglang_{rname}_us"] = by_route[rname]
        row["sglang_route"] = route_taken(bio, a0, w0.t()) if bio is not None else None
        row["sglang_us"] = by_route.get(row["sglang_route"])
        row["memory_bound"] = memory_bound
        if row["us"]:
            row["gbps"] = bytes_moved / (row["us"] * 1e-6) / 1e9
            row["hbm_fraction"] = row["gbps"] / HBM_GBPS
            row["tflops"] = 2.0 * m * n * k / (row["us"] * 1e-6) / 1e12
            if row["cublas_us"]:
                row["vs_cublas"] = row["cublas_us"] / row["us"]
            if row["sglang_us"]:
                row["vs_sglang"] = row["sglang_us"] / row["us"]
        rows.append(row)
        print(f"  {name:12s} m={m:5d} ours {fmt(row['us'])} us  cublas {fmt(row['cublas_us'])}  "
              f"sglang[{row['sglang_route']}] {fmt(row['sglang_us'])}  x{fmt(row.get('vs_cublas'), 2)} of cublas  "
              f"{fmt(row.get('gbps'), 0)} GB/s  bits {'ok' if row['bitwise_invariant'] else 'DIFFER'}", flush=True)
    return rows, variant_rows


def fmt(x, digits: int = 1) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def markdown(rows, variant_rows, tables, meta) -> str:
    out = [f"# Batch-invariant GEMM, {meta['machine']}, {meta['date_utc']}", "",
           f"Command: `{meta['command']}`", "",
           "us: median per call over CUDA-graph replays (inputs rotated past L2). x cuBLAS = cuBLAS time / ours "
           "(> 1: ours faster). bits: every row at M equals the same row at the largest M, and the rows at the "
           "largest M permuted give the same rows permuted.", "",
           "| shape | dtype | M | ours us | cuBLAS us | SGLang us (route) | x cuBLAS | x SGLang | GB/s | %HBM | bits |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        sg = f"{r['sglang_us']:.1f} ({r['sglang_route']})" if r.get("sglang_us") else "-"
        hbm = fmt(100 * r["hbm_fraction"], 0) if r["memory_bound"] and r.get("hbm_fraction") else "-"
        bits = "ok" if r["bitwise_invariant"] and r["permuted_invariant"] else "DIFFER"
        out.append(f"| {r['name']} {r['shape']} | {r['dtype']} | {r['m']} | {fmt(r['us'])} | {fmt(r['cublas_us'])} | "
                   f"{sg} | {fmt(r.get('vs_cublas'), 2)} | {fmt(r.get('vs_sglang'), 2)} | {fmt(r.get('gbps'), 0)} | "
                   f"{hbm} | {bits} |")
    if len(tables) > 1:
        names = [t.name for t in tables]
        out += ["", "## Variants (us per call; * = some row differs across M or under a row permutation)", "",
                "| shape | dtype | M | cuBLAS us | " + " | ".join(names) + " |",
                "|---|---|---|---|" + "---|" * len(names)]
        cells = {}
        for v in variant_rows:
            cells.setdefault((v["shape"], v["dtype"], v["m"]), {})[v["variant"]] = v
        cublas = {(r["shape"], r["dtype"], r["m"]): r["cublas_us"] for r in rows}
        for key, by in cells.items():
            vals = [fmt(by[n]["us"]) + ("" if by[n]["bitwise_invariant"] and by[n]["permuted_invariant"] else "*")
                    for n in names]
            out.append(f"| {key[0]} | {key[1]} | {key[2]} | {fmt(cublas[key])} | " + " | ".join(vals) + " |")
        out += ["", "Per variant: geometric mean over the cells of cuBLAS time / variant time, the worst cell, "
                "cells not invariant (bits across M or under a permutation), cells that failed:", ""]
        for name in names:
            mine = [v for v in variant_rows if v["variant"] == name]
            ratios = [cublas[(v["shape"], v["dtype"], v["m"])] / v["us"] for v in mine
                      if v["us"] and cublas[(v["shape"], v["dtype"], v["m"])]]
            bad = sum(1 for v in mine if not (v["bitwise_invariant"] and v["permuted_invariant"]))
            failed = sum(1 for v in mine if v["us"] is None)
            mean = math.exp(statistics.fmean(math.log(x) for x in ratios)) if ratios else float("nan")
            out.append(f"- {name}: {mean:.3f} (worst {min(ratios, default=float('nan')):.2f}); "
                       f"not invariant: {bad}; failed: {failed}")
    return "\n".join(out) + "\n"


def write(out: pathlib.Path, meta: dict, rows: list, variant_rows: list, tables) -> None:
    (out / "gemm.json").write_text(json.dumps({**meta, "rows": rows}, indent=1) + "\n")
    if len(tables) > 1:
        (out / "gemm_variants.json").write_text(json.dumps({**meta, "rows": variant_rows}, indent=1) + "\n")
    (out / "gemm.md").write_text(markdown(rows, variant_rows, tables, meta))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help=f"shapes {QUICK_SHAPES} and M in {QUICK_MS}")
    p.add_argument("--shapes", help=f"comma list of {sorted(SHAPES)}")
    p.add_argument("--ms", help="comma list of M (default: the issue's 13 values)")
    p.add_argument("--dtypes", default="bf16", help="comma list of bf16, fp16")
    p.add_argument("--bias", action="store_true", help="add a bias [N] (Llama has none)")
    p.add_argument("--variants", default="", help=f"comma list of {sorted(VARIANTS)}, or all")
    p.add_argument("--replays", type=int, default=5)
    p.add_argument("--sglang-routes", default="deepgemm,triton",
                   help="SGLang routes to time, comma list of deepgemm, triton, or none (DeepGEMM compiles per shape)")
    p.add_argument("--out", default=None, help="output folder (default: docs/benchmarks/determinism_tax/<date>-gemm)")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("bench_gemm.py needs a CUDA GPU")
    shapes = args.shapes.split(",") if args.shapes else list(QUICK_SHAPES if args.quick else SHAPES)
    for s in shapes:
        if s not in SHAPES:
            raise SystemExit(f"--shapes: {s!r} is not one of {sorted(SHAPES)}")
    ms = sorted({int(x) for x in args.ms.split(",")}) if args.ms else list(QUICK_MS if args.quick else MS)
    if not ms or ms[0] < 1:
        raise SystemExit(f"--ms must be integers >= 1, got {args.ms!r}")
    dtypes = []
    for d in args.dtypes.split(","):
        if d not in DTYPES:
            raise SystemExit(f"--dtypes: {d!r} is not one of {sorted(DTYPES)}")
        dtypes.append(DTYPES[d])
    names = [] if not args.variants else (sorted(VARIANTS) if args.variants == "all" else args.variants.split(","))
    for v in names:
        if v not in VARIANTS:
            raise SystemExit(f"--variants: {v!r} is not one of {sorted(VARIANTS)}")
    tables = [DEFAULT_TABLE] + [VARIANTS[v] for v in names if v != DEFAULT_TABLE.name]
    wanted = set() if args.sglang_routes == "none" else set(args.sglang_routes.split(","))
    if not wanted <= {"deepgemm", "triton"}:
        raise SystemExit(f"--sglang-routes: {args.sglang_routes!r} is not a comma list of deepgemm, triton, or none")
    routes, bio = sglang_routes() if wanted else ({}, None)
    routes = {name: fn for name, fn in routes.items() if name in wanted}
    props = torch.cuda.get_device_properties(0)
    l2_bytes = getattr(props, "L2_cache_size", 50 * 2**20)
    date = datetime.datetime.now(datetime.timezone.utc)
    meta = {"date_utc": date.strftime("%Y-%m-%dT%H:%M:%SZ"), "machine": f"{props.name}, {props.multi_processor_count} SMs",
            "command": "python3 benchmark/gemm_splitk/bench_gemm.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            "torch": torch.__version__, "sglang_routes": sorted(routes), "l2_bytes": l2_bytes,
            "tables": [t.name for t in tables]}
    print(f"{meta['machine']}; SGLang routes {sorted(routes)}; tables {meta['tables']}", flush=True)
    out = pathlib.Path(args.out or f"docs/benchmarks/determinism_tax/{date:%Y-%m-%d}-gemm")
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    rows, variant_rows = [], []
    for dtype in dtypes:
        for name in shapes:
            n, k = SHAPES[name]
            r, v = bench_shape(name, n, k, dtype, ms, args, tables, routes, bio, l2_bytes)
            rows += r
            variant_rows += v
            torch.cuda.empty_cache()
            # Written after every shape, so a run cut short by a time limit still leaves its rows.
            write(out, meta, rows, variant_rows, tables)
            print(f"{name} {dtype} done at {time.time() - t0:.0f} s", flush=True)
    bad = [r for r in rows if not (r["bitwise_invariant"] and r["permuted_invariant"])]
    print(f"wrote {out}/gemm.json ({len(rows)} rows, {len(bad)} not bitwise invariant) in {time.time() - t0:.0f} s")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
