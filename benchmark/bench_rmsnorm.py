"""What an RMSNorm costs under deterministic inference: the plugin's fused kernel against SGLang's (CUDA GPU).

Per hidden size, form (``norm(x)`` and the decoder layers' ``norm(x, residual)``)
and row count M, and for the per-head q / k norms of Qwen3-style attention
(``qk_norm``: ``norm(x)`` over rows of one head's ``head_dim``, M = tokens x
heads, as SGLang's ``apply_qk_norm`` calls it under deterministic inference),
three implementations are timed side by side in one run:

- **plugin**: ``ops.rms_norm`` / ``ops.fused_add_rms_norm`` (one Triton
  program per row, batch-invariant; the norm hook runs the fused add + norm
  only, the plain ``ops.rms_norm`` is timed to show where it would win);
- **SGLang deterministic**: what SGLang 0.5.23's ``RMSNorm.forward_cuda``
  runs under ``--enable-deterministic-inference``, called directly: its
  ``rms_norm_batch_invariant`` for ``norm(x)``, and ``RMSNorm.forward_native``
  with SGLang's batch-invariant mode on (its ``mean`` kernel) for
  ``norm(x, residual)``;
- **SGLang default**: sgl_kernel's ``rmsnorm`` / ``fused_add_rmsnorm``, the
  non-deterministic path (in place).

Each cell is captured as a CUDA graph of ``--reps`` calls (as decode runs
under SGLang's CUDA graphs, so Python launch overhead is not counted) and
replayed ``--blocks`` times; the table gives the median block's GPU time per
call and the spread (min..max). Bandwidth is effective: the bytes the fused
form must move (read x, residual and weight, write the output and the new
residual) over the time; inputs of small M stay in L2, as they do between a
GEMM and the norm after it. H200 HBM peak: 4.8 TB/s.

    python benchmark/bench_rmsnorm.py [--hidden 4096,8192] [--rows 1,8,32,128,512,4096]
        [--head-dim 128] [--heads 32,8] [--tokens 1,8,32,128,512,4096] [--out docs/benchmarks/rmsnorm_<date>]

``--heads ''`` leaves the per-head rows out.
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import statistics

import torch

EPS = 1e-5
IMPLS = ("plugin", "sglang_deterministic", "sglang_default")


def graph_timed(fn, reps: int, blocks: int) -> dict:
    """Median and spread over ``blocks`` replays of a CUDA graph of ``reps`` calls: microseconds per call."""
    fn()  # compile and warm up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    per_call = []
    for _ in range(blocks):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        per_call.append(start.elapsed_time(end) * 1000 / reps)
    return {"median_us": statistics.median(per_call), "min_us": min(per_call), "max_us": max(per_call)}


def moved_bytes(m: int, h: int, residual: bool, itemsize: int) -> int:
    """The least a fused norm reads and writes: x (and residual) in, output (and new residual) out, the weight."""
    rows = 4 if residual else 2
    return (rows * m * h + h) * itemsize


def implementations(residual: bool, x, r, w):
    """name -> (callable, None) or (None, why it is missing)."""
    from sglang_detspec.ops.rmsnorm import fused_add_rms_norm, rms_norm

    impls = {"plugin": ((lambda: fused_add_rms_norm(x, r, w, EPS, kernel="triton")) if residual
                        else (lambda: rms_norm(x, w, EPS, kernel="triton")), None)}
    try:
        from sglang.srt.batch_invariant_ops.batch_invariant_ops import rms_norm_batch_invariant
        from sglang.srt.layers.layernorm import RMSNorm
    except ImportError as err:
        impls["sglang_deterministic"] = (None, f"SGLang not importable: {err}")
    else:
        if residual:
            layer = RMSNorm(x.shape[-1], eps=EPS).to(device=x.device, dtype=x.dtype)
            layer.weight.data.copy_(w)
            impls["sglang_deterministic"] = (lambda: RMSNorm.forward_native(layer, x, r), None)
        else:
            impls["sglang_deterministic"] = (lambda: rms_norm_batch_invariant(x, w, EPS), None)
    try:
        from sgl_kernel import fused_add_rmsnorm, rmsnorm
    except ImportError as err:
        impls["sglang_default"] = (None, f"sgl_kernel not importable: {err}")
    else:
        # In place: x becomes the output and r the running sum; the values stay finite over a block.
        impls["sglang_default"] = ((lambda: fused_add_rmsnorm(x, r, w, EPS)) if residual
                                   else (lambda: rmsnorm(x, w, EPS)), None)
    return impls


def measure(h: int, m: int, residual: bool, reps: int, blocks: int) -> dict:
    from sglang_detspec.ops.rmsnorm import fused_add_rms_norm, rms_norm

    gen = torch.Generator(device="cuda").manual_seed(m * 7 + h)
    x = torch.randn(m, h, generator=gen, device="cuda").to(torch.bfloat16)
    r = torch.randn(m, h, generator=gen, device="cuda").to(torch.bfloat16)
    w = (torch.rand(h, generator=gen, device="cuda") + 0.5).to(torch.bfloat16)
    ours = (fused_add_rms_norm(x, r, w, EPS, kernel="triton")[0] if residual
            else rms_norm(x, w, EPS, kernel="triton"))
    nbytes = moved_bytes(m, h, residual, x.element_size())
    row = {"hidden": h, "rows": m, "form": "add_norm" if residual else "norm", "dtype": "bfloat16",
           "bytes": nbytes, "reps": reps}
    for name, (fn, missing) in implementations(residual, x.clone(), r.clone(), w).items():
        if fn is None:
            row[name] = {"missing": missing}
            continue
        if name == "sglang_deterministic" and residual:
            from sglang.srt.batch_invariant_ops import disable_batch_invariant_mode, enable_batch_invariant_mode

            enable_batch_invariant_mode()  # forward_native's mean goes to SGLang's batch-invariant kernel
            try:
                cell = graph_timed(fn, reps, blocks)
            finally:
                disable_batch_invariant_mode()
        else:
            cell = graph_timed(fn, reps, blocks)
        cell["gb_per_s"] = nbytes / (cell["median_us"] * 1e3)
        row[name] = cell
    if "median_us" in row["sglang_default"]:  # sanity: the same norm up to rounding (fresh inputs, SGLang in place)
        from sgl_kernel import fused_add_rmsnorm, rmsnorm

        xs, rs = x.clone(), r.clone()
        if residual:
            fused_add_rmsnorm(xs, rs, w, EPS)  # writes the normalised rows into xs
            theirs = xs
        else:
            theirs = rmsnorm(xs, w, EPS)
        row["max_abs_diff_vs_sglang_default"] = float((ours.float() - theirs.float()).abs().max())
    return row


def cell(c: dict) -> str:
    if "median_us" not in c:
        return "n/a"
    return f"{c['median_us']:.2f} ({c['min_us']:.2f}..{c['max_us']:.2f})"


def ratio(row: dict, a: str, b: str) -> str:
    if "median_us" not in row[a] or "median_us" not in row[b]:
        return "n/a"
    return f"{row[a]['median_us'] / row[b]['median_us']:.2f}"


def gbs(c: dict) -> str:
    return f"{c['gb_per_s']:.0f}" if "gb_per_s" in c else "n/a"


def table(rows: list[dict]) -> str:
    out = ["| hidden | form | M | plugin, us | SGLang deterministic, us | SGLang default, us | plugin / SGLang det. "
           "| plugin / SGLang default | plugin GB/s | SGLang default GB/s |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        m = f"{r['tokens']} x {r['heads']}" if "heads" in r else r["rows"]
        out.append(f"| {r['hidden']} | {r['form']} | {m} | {cell(r['plugin'])} | "
                   f"{cell(r['sglang_deterministic'])} | {cell(r['sglang_default'])} | "
                   f"{ratio(r, 'plugin', 'sglang_deterministic')} | {ratio(r, 'plugin', 'sglang_default')} | "
                   f"{gbs(r['plugin'])} | {gbs(r['sglang_default'])} |")
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--hidden", default="4096,8192", help="hidden sizes, comma-separated (1..32768)")
    p.add_argument("--rows", default="1,8,32,128,512,4096", help="row counts M, comma-separated (>= 1)")
    p.add_argument("--head-dim", type=int, default=128, help="head_dim of the per-head q / k norm rows (1..32768)")
    p.add_argument("--heads", default="32,8",
                   help="head counts of the per-head rows (q heads, KV heads), comma-separated; '' for none")
    p.add_argument("--tokens", default="1,8,32,128,512,4096", help="token counts of the per-head rows (>= 1)")
    p.add_argument("--reps", type=int, default=100, help="calls per CUDA graph (>= 1)")
    p.add_argument("--blocks", type=int, default=5, help="graph replays per cell (>= 2)")
    p.add_argument("--out", default=f"docs/benchmarks/rmsnorm_{datetime.date.today()}",
                   help="output path without suffix: .json and .md are written")
    args = p.parse_args(argv)
    try:
        hidden = [int(x) for x in args.hidden.split(",")]
        rows_m = [int(x) for x in args.rows.split(",")]
        heads = [int(x) for x in args.heads.split(",")] if args.heads.strip() else []
        tokens = [int(x) for x in args.tokens.split(",")]
    except ValueError:
        p.error(f"--hidden, --rows, --heads and --tokens must be comma-separated integers, got {args.hidden!r}, "
                f"{args.rows!r}, {args.heads!r} and {args.tokens!r}")
    if not all(1 <= h <= 32768 for h in hidden) or not all(m >= 1 for m in rows_m):
        p.error(f"--hidden values must lie in [1, 32768] and --rows values be >= 1, got {hidden} and {rows_m}")
    if not 1 <= args.head_dim <= 32768 or not all(n >= 1 for n in heads + tokens):
        p.error(f"--head-dim must lie in [1, 32768] and --heads / --tokens values be >= 1, got {args.head_dim}, "
                f"{heads} and {tokens}")
    if args.reps < 1 or args.blocks < 2:
        p.error(f"--reps must be >= 1 and --blocks >= 2, got {args.reps} and {args.blocks}")
    if not torch.cuda.is_available():
        p.error("needs a CUDA GPU")
    rows = []
    for h in hidden:
        for residual in (False, True):
            for m in rows_m:
                # Fewer calls per graph for large cells: SGLang's decomposed path allocates float32 temporaries.
                reps = args.reps if m * h <= 2**22 else max(10, args.reps // 10)
                row = measure(h, m, residual, reps, args.blocks)
                rows.append(row)
                print(table([row]).splitlines()[-1], flush=True)
    for n_heads in heads:
        for t in tokens:
            m = t * n_heads
            reps = args.reps if m * args.head_dim <= 2**22 else max(10, args.reps // 10)
            row = {**measure(args.head_dim, m, False, reps, args.blocks), "form": "qk_norm", "tokens": t,
                   "heads": n_heads}
            rows.append(row)
            print(table([row]).splitlines()[-1], flush=True)
    meta = {"date_utc": str(datetime.datetime.now(datetime.timezone.utc).date()),
            "device": torch.cuda.get_device_name(), "torch": torch.__version__, "dtype": "bfloat16", "eps": EPS,
            "reps": args.reps, "blocks": args.blocks, "head_dim": args.head_dim,
            "timing": "CUDA graph of each row's reps calls, median of blocks replays"}
    try:
        import triton

        meta["triton"] = triton.__version__
    except ImportError:
        pass
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({**meta, "rows": rows}, indent=1))
    out.with_suffix(".md").write_text(
        f"# RMSNorm under deterministic inference, {meta['date_utc']}, {meta['device']}, torch {meta['torch']}\n\n"
        f"bf16; GPU time per call from a CUDA graph of {args.reps} calls ({max(10, args.reps // 10)} where "
        f"M x H > 2**22), median of {args.blocks} replays "
        "(min..max). `norm` is `norm(x)`, `add_norm` is `norm(x, residual)`, `qk_norm` is `norm(x)` over rows of "
        "one head (hidden = head_dim, M = tokens x heads). SGLang deterministic: "
        "`rms_norm_batch_invariant` (norm) and `RMSNorm.forward_native` in batch-invariant mode (add_norm), what "
        "`forward_cuda` runs under `--enable-deterministic-inference`; SGLang default: sgl_kernel's `rmsnorm` / "
        "`fused_add_rmsnorm` (not batch-invariant). GB/s: the bytes a fused norm must move over the time.\n\n"
        f"{table(rows)}\n")
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
