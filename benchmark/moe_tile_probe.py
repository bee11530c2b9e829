"""Which single fixed fused-MoE tile config is fastest at decode/verify sizes and keeps each token's bits? (CUDA GPU)

Under ``--enable-deterministic-inference`` SGLang 0.5.23's fused-MoE Triton path ignores its tuned
per-batch-size config files and runs, at every batch size, the one config ``get_default_config``
returns in that mode (BLOCK_SIZE_M 64, N 64, K 32, GROUP_SIZE_M 8). A fixed config is what keeps a
token's row independent of the batch (no split-K; rows do not mix in a tile). The tuned files for 128
experts and intermediate 768 on the H100 use BLOCK_SIZE_M 16 and BLOCK_SIZE_K 128/256 at small M. On
one H100 a Qwen3-30B-A3B-like MoE target (hidden 2048, 128 experts, top-8, 24 layers) serving EAGLE
chain speculation reached only 0.79x of the non-deterministic server at concurrency 8..128, while a
dense 8B target's step costs were equal: the fixed MoE tile is the prime suspect.

For one bf16 MoE layer (random weights and inputs; router logits of a fixed seed -> softmax -> top-k,
renormalised, as Qwen3-MoE routes) it calls SGLang's own ``fused_experts`` (``moe_runner/triton_utils``,
``inplace`` as the server's runner config) for each row:
``sglang_deterministic`` (deterministic mode, batch-invariant mode on as the model runner turns it on,
SGLang's own choice); ``m{BM}_n{BN}_k{BK}_w{warps}_s{stages}`` (the same mode, that config forced at
every M through SGLang's ``override_config``); ``sglang_tuned`` (both modes off: SGLang's tuned files,
nearest batch-size key, its down-projection file and TMA where they say so: the speed reference); and
``sglang_tuned_invariant_combine`` (information: the tuned configs with batch-invariant mode's combine,
i.e. whether an M-dependent tile choice changes a token's bits).

Time (ms per call): a CUDA graph of back-to-back calls (decode runs in CUDA graphs; a plain loop
would time the launches), replayed between CUDA events, median; each call first copies its M x hidden
input into the buffer the inplace call overwrites (the same small cost in every row). Invariance
(bits: ``torch.equal`` on the byte view): tokens alone, shuffled subsets of sizes straddling multiples
of 16/32/64, all 512 permuted and scattered in a batch of 2048 must give the rows of the 512 tokens in
one batch. ``same_bits_as``: rows whose 512-token outputs have the same bits. Best: among invariant
fixed configs, the lowest sum of ms over the decode sizes (M <= 512). Writes ``moe_tile.json`` and
``moe_tile.md``; asserts nothing.

    python benchmark/moe_tile_probe.py --out DIR [--tokens 4,8,...] [--experts 128 --hidden 2048 \\
        --intermediate 768 --topk 8] [--candidates LABEL,...] [--budget-s 220] [--dry-run]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

from bench_rmsnorm import graph_timed  # benchmark/ is on the path when run as a script
from sglang_detspec.config import MOE_TILE_ENV, MOE_TILE_FIELDS, moe_tile_problem

DEV = "cuda"
DEFAULT_TOKENS = "4,8,16,32,64,128,256,512,1024,2048,8192"
DECODE_MAX = 512  # decode/verify sizes: concurrency up to 128 x 4 draft tokens
REF_SIZE, BIG_SIZE = 512, 2048  # invariance: the reference batch, the larger batch it hides in
STRADDLE = (2, 3, 4, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 256, 257)
BLOCK_M = (16, 32, 64)
# (BLOCK_SIZE_N, BLOCK_SIZE_K, num_warps, num_stages), after the tuned files' entries for M <= 128 and 1024
TILES = ((64, 128, 4, 3), (128, 64, 4, 3), (128, 128, 4, 2), (128, 128, 8, 4), (128, 256, 8, 3))
# kind -> (deterministic inference, batch-invariant mode, one config at every M)
KINDS = {"default": (True, True, True), "fixed": (True, True, True), "tuned": (False, False, False),
         "tuned_invariant_combine": (False, True, False)}
REFERENCES = ("sglang_deterministic", "sglang_tuned")


def parse_args(argv=None) -> argparse.Namespace:
    """The command line, validated: a bad value exits with status 2 and a message naming its flag."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, help="folder for moe_tile.json and moe_tile.md")
    p.add_argument("--tokens", default=DEFAULT_TOKENS, help="token counts M, comma-separated")
    for flag, default in (("experts", 128), ("hidden", 2048), ("intermediate", 768), ("topk", 8),
                          ("repeats", 10), ("seed", 0)):
        p.add_argument(f"--{flag}", type=int, default=default)
    p.add_argument("--candidates", default="", help="grid labels to run (the SGLang rows always run)")
    p.add_argument("--budget-s", type=float, default=220.0, help="start no row after this many seconds")
    p.add_argument("--dry-run", action="store_true", help="print the plan; needs no GPU")
    args = p.parse_args(argv)
    try:
        args.tokens = sorted({int(v) for v in args.tokens.split(",") if v.strip()})
    except ValueError:
        p.error(f"--tokens takes comma-separated integers, got {args.tokens!r}")
    if not args.tokens or args.tokens[0] < 1:
        p.error(f"--tokens values must be >= 1, got {args.tokens}")
    for flag in ("experts", "hidden", "intermediate", "topk", "repeats"):
        if getattr(args, flag) < 1:
            p.error(f"--{flag} must be >= 1, got {getattr(args, flag)}")
    if args.topk > args.experts:
        p.error(f"--topk ({args.topk}) must not exceed --experts ({args.experts})")
    if args.budget_s <= 0:
        p.error(f"--budget-s must be > 0, got {args.budget_s}")
    args.candidates = [c.strip() for c in args.candidates.split(",") if c.strip()]
    unknown = set(args.candidates) - {label for label, _ in grid()}
    if unknown:
        p.error(f"--candidates: unknown {sorted(unknown)}; the grid: {[label for label, _ in grid()]}")
    return args


def grid() -> list[tuple[str, dict]]:
    """The fixed configs, ``(label, config)``, smallest BLOCK_SIZE_M first; GROUP_SIZE_M 1 (it only orders tiles).

    Only tiles the server setting accepts (``config.moe_tile_problem``, its shared-memory bound among them): a
    pick must be one a server can run.
    """
    return [(f"m{bm}_n{bn}_k{bk}_w{w}_s{s}", dict(zip(MOE_TILE_FIELDS, (bm, bn, bk, 1, w, s))))
            for bm in BLOCK_M for bn, bk, w, s in TILES if moe_tile_problem((bm, bn, bk, 1, w, s)) is None]


@contextlib.contextmanager
def sglang_mode(deterministic: bool, batch_invariant: bool = False):
    """A published default SGLang config, its ``enable_deterministic_inference`` leaf set so; batch-invariant mode on/off.

    ``get_moe_configs`` caches its answer whatever the mode: its cache is cleared on the way in and out.
    """
    from sglang.srt.batch_invariant_ops import disable_batch_invariant_mode, enable_batch_invariant_mode
    from sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe_triton_config import get_moe_configs
    from sglang.srt.runtime_context import get_context, get_exec

    get_moe_configs.cache_clear()
    with get_context().override_server_args(), \
            get_exec().deterministic.override(enable_deterministic_inference=deterministic):
        (enable_batch_invariant_mode if batch_invariant else disable_batch_invariant_mode)()
        try:
            yield
        finally:
            disable_batch_invariant_mode()
            get_moe_configs.cache_clear()


def deterministic_default(experts: int, hidden: int, intermediate: int, topk: int) -> dict:
    """The config SGLang's ``get_default_config`` gives a bf16 MoE in deterministic mode (the same at every M)."""
    from sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe_triton_config import get_default_config

    with sglang_mode(True):
        return dict(get_default_config(1, experts, intermediate, hidden, topk, None, False))


def candidates(det_config: dict, keep=()) -> list[dict]:
    """The rows in run order, ``{"config_label", "config", "kind"}`` (``config`` None: SGLang chooses per M)."""
    rows = [{"config_label": "sglang_deterministic", "config": det_config, "kind": "default"},
            {"config_label": "sglang_tuned", "config": None, "kind": "tuned"},
            {"config_label": "sglang_tuned_invariant_combine", "config": None, "kind": "tuned_invariant_combine"}]
    return rows + [{"config_label": label, "config": cfg, "kind": "fixed"} for label, cfg in grid()
                   if not keep or label in keep]


def invariance_cases(ref_size: int, big: int, seed: int = 0) -> list[tuple[str, torch.Tensor]]:
    """``(name, token ids in batch order)`` whose rows must equal those of tokens ``0..ref_size-1`` in one batch.

    Tokens alone, shuffled subsets of sizes straddling tile multiples, all permuted, and the reference
    tokens scattered in a batch of ``big`` (ids >= ``ref_size`` are not compared).
    """
    g = torch.Generator().manual_seed(seed)
    cases = [(f"token {t} alone", torch.tensor([t])) for t in (0, 1, ref_size // 2, ref_size - 1)]
    cases += [(f"{m} of the {ref_size} tokens, shuffled", torch.randperm(ref_size, generator=g)[:m])
              for m in STRADDLE if m < ref_size]
    cases.append((f"all {ref_size} tokens permuted", torch.randperm(ref_size, generator=g)))
    cases.append((f"the {ref_size} tokens scattered in a batch of {big}", torch.randperm(big, generator=g)))
    return cases


def first_difference(out: torch.Tensor, ref: torch.Tensor, idx: torch.Tensor) -> str | None:
    """None when each row i of ``out`` [m, hidden] has the bits of ``ref[idx[i]]`` (``idx[i] < len(ref)``), else how not."""
    keep = idx < ref.shape[0]
    a, b = out[keep.to(out.device)], ref[idx[keep].to(ref.device)]
    if torch.equal(a.view(torch.uint8), b.view(torch.uint8)):
        return None
    bad = (a.view(torch.uint8) != b.view(torch.uint8)).any(-1).nonzero().flatten().cpu()
    worst = (a.float() - b.float()).abs().max().item()
    return f"{bad.numel()} of {a.shape[0]} rows differ, first token {idx[keep][bad[0]].item()}, max |diff| {worst:.3g}"


def pick_best(rows: list[dict], decode_max: int = DECODE_MAX) -> dict | None:
    """Among invariant fixed-config rows (no error) timed at each decode size (M <= ``decode_max``), the least sum of ms.

    Rows: ``{"config_label", "fixed", "invariant", "ms": {str(M): ms}}``. None when no row qualifies.
    """
    sizes = sorted({int(m) for r in rows for m in r.get("ms", {}) if int(m) <= decode_max})
    ok = [r for r in rows if r.get("fixed") is True and r.get("invariant") is True and not r.get("error")
          and all(str(m) in r.get("ms", {}) for m in sizes)]
    if not sizes or not ok:
        return None
    total = lambda r: sum(r["ms"][str(m)] for m in sizes)  # noqa: E731
    best = min(ok, key=total)
    out = {"decode_weighted": best["config_label"], "config": best.get("config"), "decode_sizes": sizes,
           "rule": f"lowest sum of ms over M <= {decode_max} among invariant fixed configs",
           "decode_sum_ms": round(total(best), 5),
           "prefill_ms": {m: v for m, v in best["ms"].items() if int(m) > decode_max}}
    # The server setting that runs this tile (sglang_plugin/moe_tile_hook.py); SGLang's own row is its default.
    if best["config_label"] == REFERENCES[0]:
        out["setting"] = f"{MOE_TILE_ENV}=sglang"
    elif best.get("config"):
        out["setting"] = f"{MOE_TILE_ENV}=" + ",".join(str(best["config"][f]) for f in MOE_TILE_FIELDS)
    for ref in (r for r in rows if r["config_label"] in REFERENCES):
        if all(str(m) in ref.get("ms", {}) for m in sizes):
            name = ref["config_label"]
            out[f"decode_ratio_to_{name}"] = round(total(best) / total(ref), 4)
            out[f"prefill_ratio_to_{name}"] = {m: round(v / ref["ms"][m], 4)
                                               for m, v in out["prefill_ms"].items() if m in ref["ms"]}
    return out


def plan_text(args: argparse.Namespace, rows: list[dict]) -> str:
    """The rows with their configs, the sizes, the number of timed cells and a rough time (1.5 s a Triton compile)."""
    n_fixed = sum(KINDS[r["kind"]][2] for r in rows)
    estimate = 30 + 1.5 * (4 * n_fixed + 30) + len(rows) * (0.15 * len(args.tokens) + 0.5)
    lines = [f"shape: experts {args.experts}, hidden {args.hidden}, intermediate {args.intermediate}, "
             f"topk {args.topk}, bf16", f"tokens M: {args.tokens}"]
    lines += [f"  {r['config_label']:31s} {r['kind']:24s} {json.dumps(r['config']) if r['config'] else 'SGLang per M'}"
              for r in rows]
    lines.append(f"{len(rows)} rows x {len(args.tokens)} sizes = {len(rows) * len(args.tokens)} timed cells, "
                 f"{len(invariance_cases(REF_SIZE, BIG_SIZE))} invariance batches a row; estimated {estimate:.0f} s "
                 f"(4 compiles a fixed config, ~30 for the tuned files), budget {args.budget_s:.0f} s")
    return "\n".join(lines)


class MoeLayer:
    """One bf16 MoE layer on ``DEV``: w13 [E, 2N, K], w2 [E, K, N], tokens x [P, K] with top-k ids/weights [P, topk]."""

    def __init__(self, args: argparse.Namespace, pool: int):
        from sglang.srt.layers.moe.moe_runner import MoeRunnerConfig

        g, gd = torch.Generator().manual_seed(args.seed), torch.Generator(device=DEV).manual_seed(args.seed)
        e, k, n = args.experts, args.hidden, args.intermediate
        self.x = torch.randn(pool, k, generator=g).to(DEV, torch.bfloat16)
        w, ids = torch.softmax(torch.randn(pool, e, generator=g), dim=-1).topk(args.topk, dim=-1)
        self.w, self.ids = (w / w.sum(-1, keepdim=True)).to(DEV), ids.to(DEV, torch.int32)
        self.w13 = torch.empty(e, 2 * n, k, dtype=torch.bfloat16, device=DEV).normal_(0, k ** -0.5, generator=gd)
        self.w2 = torch.empty(e, k, n, dtype=torch.bfloat16, device=DEV).normal_(0, n ** -0.5, generator=gd)
        self.cfg = MoeRunnerConfig(num_experts=e, num_local_experts=e, hidden_size=k, top_k=args.topk,
                                   intermediate_size_per_partition=n, params_dtype=torch.bfloat16, inplace=True)

    def call(self, x: torch.Tensor, w: torch.Tensor, ids: torch.Tensor, buf: torch.Tensor) -> torch.Tensor:
        """SGLang's ``fused_experts`` on a copy of ``x`` [m, K] in ``buf``, which it overwrites with the output."""
        from sglang.srt.layers.moe.moe_runner.triton_utils import fused_experts
        from sglang.srt.layers.moe.topk import StandardTopKOutput

        buf.copy_(x)
        return fused_experts(buf, self.w13, self.w2, StandardTopKOutput(w, ids, None), self.cfg)

    def run(self, idx: torch.Tensor) -> torch.Tensor:
        """The output rows (bf16 [len(idx), K]) of the tokens ``idx`` run as one batch in that order."""
        i = idx.to(DEV)
        x = self.x[i].contiguous()
        return self.call(x, self.w[i].contiguous(), self.ids[i].contiguous(), torch.empty_like(x)).clone()

    def timed(self, m: int):
        """A call of the first ``m`` tokens with fixed buffers (for CUDA-graph capture)."""
        x, w, ids, buf = self.x[:m], self.w[:m], self.ids[:m], torch.empty_like(self.x[:m])
        return lambda: self.call(x, w, ids, buf)

    def reference(self, idx: torch.Tensor) -> torch.Tensor:
        """The same MoE in float32 torch (silu(gate) * up, then down, weighted sum), [len(idx), K]."""
        out = torch.zeros(len(idx), self.x.shape[1], device=DEV)
        for row, t in enumerate(idx.tolist()):
            for e, w in zip(self.ids[t].tolist(), self.w[t].tolist()):
                gate, up = (self.w13[e].float() @ self.x[t].float()).chunk(2)
                out[row] += w * (self.w2[e].float() @ (torch.nn.functional.silu(gate) * up))
        return out


def run_row(row: dict, layer: MoeLayer, args: argparse.Namespace, cases) -> torch.Tensor:
    """Times ``row`` at every M and checks its bits, filling its fields; returns its output for the reference batch."""
    from sglang.srt.layers.moe.moe_runner import triton_utils
    from sglang.srt.layers.moe.moe_runner.triton_utils import override_config, try_get_optimal_moe_config

    det, bi, row["fixed"] = KINDS[row["kind"]]
    try:
        with sglang_mode(det, bi), override_config(row["config"] if row["kind"] == "fixed" else None):
            if not row["fixed"]:  # what SGLang chooses per M: up-projection config, down one (None: the same)
                row["config"] = {}
                for m in args.tokens:
                    up, (down, _) = try_get_optimal_moe_config(layer.w13.shape, layer.w2.shape, args.topk, None, m,
                                                               return_down_config=True)
                    row["config"][str(m)] = {"up": dict(up), "down": dict(down) if down else None}
            # ms per call: a CUDA graph of 20 calls (5 above DECODE_MAX), replayed --repeats times
            row["ms"] = {str(m): round(graph_timed(layer.timed(m), 20 if m <= DECODE_MAX else 5,
                                                   args.repeats)["median_us"] / 1000, 5) for m in args.tokens}
            ref = layer.run(torch.arange(REF_SIZE))
            row["max_abs_err_vs_fp32_torch"] = round((ref[:4].float() - layer.fp32_rows).abs().max().item(), 5)
            first = next((f"{name}: {d}" for name, idx in cases
                          if (d := first_difference(layer.run(idx), ref, idx))), None)
            row["invariant"], row["first_difference"] = first is None, first
        return ref
    finally:  # SGLang's override_config restores its slot on a clean exit only; a row Triton cannot build raises
        triton_utils._config = None


def machine_info() -> dict:
    """GPU name, memory (GiB), SM count and driver (nvidia-smi's; None without it)."""
    props = torch.cuda.get_device_properties(0)
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=30).stdout.split("\n")[0].strip() or None
    except (OSError, subprocess.SubprocessError):
        driver = None
    return {"gpu": torch.cuda.get_device_name(0), "memory_gib": round(props.total_memory / 2 ** 30, 1),
            "sm_count": props.multi_processor_count, "driver": driver}


def add_ratios(rows: list[dict], refs: dict) -> None:
    """Per row: its ms over the SGLang rows' at each M (below 1: faster), and the rows with the same reference bits."""
    by = {r["config_label"]: r for r in rows}
    for r in rows:
        for key, name in (("ratio_to_deterministic", "sglang_deterministic"), ("ratio_to_tuned", "sglang_tuned")):
            base = by[name].get("ms", {}) if name in by else {}
            r[key] = {m: round(v / base[m], 4) for m, v in r.get("ms", {}).items() if m in base}
        if r["config_label"] in refs:
            mine = refs[r["config_label"]].view(torch.uint8)
            r["same_bits_as"] = [o for o, t in refs.items()
                                 if o != r["config_label"] and torch.equal(t.view(torch.uint8), mine)]


def markdown(doc: dict) -> str:
    """A short table: invariance and ms per M per row, the decode sum over the deterministic row's, then the pick."""
    sizes, rows = [str(m) for m in doc["tokens"]], doc["rows"]
    dec = [m for m in sizes if int(m) <= DECODE_MAX]
    det = next((r.get("ms", {}) for r in rows if r["config_label"] == "sglang_deterministic"), {})
    head = ["config", "invariant"] + [f"M={m}" for m in sizes] + ["decode sum / deterministic"]
    lines = [f"# Fused-MoE tile probe, {doc['machine'].get('gpu')}, {doc['date_utc']}", "",
             f"Shape {doc['shape']}; SGLang {doc['sglang_version']}, torch {doc['torch_version']}, "
             f"Triton {doc['triton_version']}. ms per MoE-layer call ({doc['timing']}).", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        ms = r.get("ms", {})
        ratio = (f"{sum(ms[m] for m in dec) / sum(det[m] for m in dec):.3f}"
                 if dec and all(m in ms and m in det for m in dec) else "-")
        cells = [r["config_label"], r.get("error") or r.get("skipped") or str(r.get("invariant"))]
        lines.append("| " + " | ".join(cells + [f"{ms[m]:.4f}" if m in ms else "-" for m in sizes] + [ratio]) + " |")
    lines += ["", f"Best: `{json.dumps(doc['best'])}`", ""]
    lines += [f"- {r['config_label']}: {r['first_difference']}" for r in rows if r.get("first_difference")]
    return "\n".join(lines) + "\n"


def write(doc: dict, out: Path | None) -> None:
    """``moe_tile.json`` and ``moe_tile.md`` under ``out`` (nothing without it)."""
    if out:
        out.mkdir(parents=True, exist_ok=True)
        (out / "moe_tile.json").write_text(json.dumps(doc, indent=1) + "\n")
        (out / "moe_tile.md").write_text(markdown(doc))


def cuda_ok() -> bool:
    """Whether torch sees a CUDA GPU."""
    return torch.cuda.is_available()


def main(argv=None) -> int:
    t0 = time.monotonic()
    args = parse_args(argv)
    rows = candidates(deterministic_default(args.experts, args.hidden, args.intermediate, args.topk), args.candidates)
    print(plan_text(args, rows), flush=True)
    if args.dry_run:
        return 0
    if not cuda_ok():
        print("moe_tile_probe: needs a CUDA GPU (torch.cuda.is_available() is False); "
              "--dry-run prints the plan without one", file=sys.stderr)
        return 2
    import importlib.metadata

    import triton

    layer, cases = MoeLayer(args, max(max(args.tokens), BIG_SIZE)), invariance_cases(REF_SIZE, BIG_SIZE, args.seed)
    layer.fp32_rows = layer.reference(torch.arange(4))  # outside batch-invariant mode, which replaces torch's matmuls
    doc = {"date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "machine": machine_info(), "sglang_version": importlib.metadata.version("sglang"),
           "torch_version": torch.__version__, "triton_version": triton.__version__,
           "shape": {"experts": args.experts, "hidden": args.hidden, "intermediate": args.intermediate,
                     "topk": args.topk, "dtype": "bfloat16"}, "tokens": args.tokens, "rows": rows, "best": None,
           "timing": "CUDA graph of 20 calls (5 above M=512), median of --repeats replays, input copy included"}
    refs = {}
    for row in rows:
        if time.monotonic() - t0 > args.budget_s:
            row["skipped"] = f"not started within --budget-s {args.budget_s:.0f}"
            continue
        try:
            with torch.no_grad():  # as the server runs (SGLang's op wrappers then skip the dispatcher)
                refs[row["config_label"]] = run_row(row, layer, args, cases)
        except Exception as e:  # a config Triton cannot build (shared memory, say): recorded, the rest run
            row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        print(f"[{time.monotonic() - t0:6.1f} s] {row['config_label']}: invariant {row.get('invariant')} "
              f"{row.get('error') or ''} ms {row.get('ms')}", flush=True)
        add_ratios(rows, refs)
        doc["best"] = pick_best(rows)
        write(doc, args.out)
    print(markdown(doc), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
