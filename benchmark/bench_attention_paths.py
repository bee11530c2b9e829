"""What the bitwise attention paths cost per layer call, against the kernels SGLang runs there (CUDA GPU).

Two comparisons on an 8B Llama's attention shape (32 query heads, 8 KV heads,
head dim 128, bf16, page size 1), per batch size and context length, timed
side by side in one run with CUDA events:

- **Triton decode**: SGLang's deterministic split-KV decode
  (``decode_attention_fwd``, splits of 256 keys) against the plugin's decode
  hook (``sglang_plugin.decode_attention.decode_as_extend``: SGLang's single-pass
  ``extend_attention_fwd_unified``, one query per request) and its packed
  form on Hopper (``decode_packed``: a query-head group per 64-row tile; the
  table says whether its outputs equal the one-row form's bit for bit);
- **FA3 tree verify** (top-k 4, 8 draft tokens): SGLang's cascade (prefix
  call, ancestors call, ``merge_state_v2``) against the node path
  (``tree_attention_hook``: one decode query per node over its own page-table
  row), plus the node rows' construction, which runs once per verify forward
  rather than per layer, from a prefix table as wide as under CUDA graphs
  (``--table-width``, the context length; the Triton builder, and the torch
  one beside it).

Each cell is timed in ``--blocks`` blocks of ``--reps`` calls; the table gives
the median block's time per call and the spread (min..max of the blocks), and
the ratio of the medians. A verify or decode step runs one such call per
layer (32 on the 8B model) beside the matmuls, so the step-level cost is the
serving benchmark's (config (j) against (e)).

    python benchmark/bench_attention_paths.py [--batches 1,32,128] [--contexts 1024,4096]
        [--out docs/benchmarks/attention_paths_<date>]
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import statistics

import torch

HEADS, KV_HEADS, DIM = 32, 8, 128
PARENTS = [-1, 0, 0, 0, 0, 1, 1, 2]  # SGLang's EAGLE order for top-k 4, 8 draft tokens
N = len(PARENTS)
SPLIT_TILE = 256  # SGLang's deterministic Triton decode split (SGLANG_TRITON_DECODE_SPLIT_TILE_SIZE)


def timed(fn, reps: int, blocks: int) -> dict:
    """Median and spread over ``blocks`` of the mean time per call, microseconds."""
    fn()
    torch.cuda.synchronize()
    per_call = []
    for _ in range(blocks):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        torch.cuda.synchronize()
        per_call.append(start.elapsed_time(end) * 1000 / reps)
    return {"median_us": statistics.median(per_call), "min_us": min(per_call), "max_us": max(per_call)}


def add_sweep_args(parser: argparse.ArgumentParser) -> None:
    """The batch x context sweep and timing options the split benchmarks share (one set of defaults)."""
    parser.add_argument("--batches", default="1,8,32,128")
    parser.add_argument("--contexts", default="128,2048,8192")
    parser.add_argument("--reps", type=int, default=20, help="calls per timed block (>= 1)")
    parser.add_argument("--blocks", type=int, default=5, help="timed blocks per cell (>= 2)")
    parser.add_argument("--max-tokens", type=int, default=1 << 20,
                        help="skip cells whose batch x context exceeds this many cached tokens")


def write_results(out: str, meta: dict, rows: list[dict], table) -> None:
    """``out``.json (``meta`` and ``rows``) and ``out``.md (``meta``, then ``table(rows)``), and the table printed."""
    path = pathlib.Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.with_suffix(".json").write_text(json.dumps({**meta, "rows": rows}, indent=1))
    path.with_suffix(".md").write_text(f"{meta}\n\n{table(rows)}\n")
    print(table(rows))


def check_timing_args(parser: argparse.ArgumentParser, args) -> None:
    """Stop with the parser's error unless ``--reps`` >= 1, ``--blocks`` >= 2 and a CUDA GPU is present."""
    if args.reps < 1 or args.blocks < 2:
        parser.error(f"--reps must be >= 1 and --blocks >= 2, got {args.reps} and {args.blocks}")
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")


def cache(slots: int, gen):
    k = torch.randn(slots, 1, KV_HEADS, DIM, generator=gen, device="cuda").to(torch.bfloat16)
    v = torch.randn(slots, 1, KV_HEADS, DIM, generator=gen, device="cuda").to(torch.bfloat16)
    return k, v


def triton_decode(bs: int, ctx: int, reps: int, blocks: int) -> dict:
    from sglang.kernels.ops.attention.decode_attention import decode_attention_fwd
    from sglang.kernels.ops.attention import extend_attention as ext
    from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd_unified

    from sglang_detspec.sglang_plugin.decode_attention import decode_as_extend, decode_packed, packable

    gen = torch.Generator(device="cuda").manual_seed(bs * 7 + ctx)
    k, v = cache(bs * ctx, gen)
    k, v = k.view(-1, KV_HEADS, DIM), v.view(-1, KV_HEADS, DIM)
    q = torch.randn(bs, HEADS, DIM, generator=gen, device="cuda").to(torch.bfloat16)
    indices = torch.randperm(bs * ctx, generator=gen, device="cuda").to(torch.int32)
    indptr = torch.arange(0, bs * ctx + 1, ctx, dtype=torch.int32, device="cuda")
    splits = (ctx + SPLIT_TILE - 1) // SPLIT_TILE
    num_splits = torch.full((bs,), splits, dtype=torch.int32, device="cuda")
    logits = torch.empty(bs, HEADS, splits, DIM, dtype=torch.float32, device="cuda")
    lse = torch.empty(bs, HEADS, splits, dtype=torch.float32, device="cuda")
    out_sglang, out_hook = torch.empty_like(q), torch.empty_like(q)
    rows = torch.arange(bs + 1, dtype=torch.int64, device="cuda")
    scale = DIM ** -0.5
    sglang = timed(lambda: decode_attention_fwd(q, k, v, out_sglang, indptr, indices, logits, lse, num_splits,
                                                splits, scale, 1.0, 1.0), reps, blocks)
    hook = timed(lambda: decode_as_extend(extend_attention_fwd_unified, rows, q, k, v, out_hook, indptr, indices,
                                          scale, 1.0, 1.0), reps, blocks)
    out = {"sglang_split_kv": sglang, "plugin_one_pass": hook, "ratio": hook["median_us"] / sglang["median_us"]}
    kernel_blocks = ext._get_block_sizes_for_extend_attention(DIM, DIM)
    if packable(kernel_blocks, torch.cuda.get_device_capability()):
        out_packed = torch.empty_like(q)
        packed = timed(lambda: decode_packed(ext._fwd_kernel_unified, kernel_blocks, rows, q, k, v, out_packed, indptr,
                                             indices, scale, 1.0, 1.0), reps, blocks)
        out.update(plugin_packed=packed, ratio_packed=packed["median_us"] / sglang["median_us"],
                   packed_equal_one_pass=bool(torch.equal(out_packed, out_hook)))
    return out


def fa3_tree_verify(bs: int, ctx: int, reps: int, blocks: int, table_width: int) -> dict:
    from sgl_kernel import merge_state_v2
    from sglang.kernels.ops.attention.flash_attention import flash_attn_with_kvcache

    from sglang_detspec.ops.node_rows import ancestor_layout, node_key_lists

    gen = torch.Generator(device="cuda").manual_seed(bs * 11 + ctx)
    anc_rows, anc_len = ancestor_layout(PARENTS)
    k, v = cache(bs * (ctx + N), gen)
    order = torch.randperm(bs * (ctx + N), generator=gen, device="cuda").to(torch.int32).view(bs, ctx + N)
    prefix_table, draft = order[:, :ctx].contiguous(), order[:, ctx:]
    anc = draft[:, torch.tensor(anc_rows, device="cuda")].reshape(bs * N, N).contiguous()
    anc_lens = torch.tensor(anc_len, dtype=torch.int32, device="cuda").repeat(bs)
    prefix_lens = torch.full((bs,), ctx, dtype=torch.int32, device="cuda")
    q = torch.randn(bs * N, HEADS, DIM, generator=gen, device="cuda").to(torch.bfloat16)
    scale = DIM ** -0.5
    cu_prefix_q = torch.arange(0, bs * N + 1, N, dtype=torch.int32, device="cuda")
    cu_nodes = torch.arange(bs * N + 1, dtype=torch.int32, device="cuda")

    def cascade():
        o, lse, *_ = flash_attn_with_kvcache(
            q=q, k_cache=k, v_cache=v, page_table=prefix_table, cache_seqlens=prefix_lens, cu_seqlens_q=cu_prefix_q,
            max_seqlen_q=N, softmax_scale=scale, causal=False, return_softmax_lse=True, num_splits=1, ver=3)
        o2, lse2, *_ = flash_attn_with_kvcache(
            q=q, k_cache=k, v_cache=v, page_table=anc, cache_seqlens=anc_lens, cu_seqlens_q=cu_nodes, max_seqlen_q=1,
            softmax_scale=scale, causal=False, return_softmax_lse=True, num_splits=1, ver=3)
        return merge_state_v2(o, lse.T.contiguous(), o2, lse2.T.contiguous())

    table, lens = node_key_lists(prefix_table, prefix_lens, anc, anc_lens, N)
    # The rows as a CUDA-graph replay builds them: from SGLang's prefix buffer, context-length wide.
    wide = torch.zeros(bs, max(table_width, ctx), dtype=torch.int32, device="cuda")
    wide[:, :ctx] = prefix_table
    out = torch.empty(bs * N, wide.shape[1] + N, dtype=torch.int32, device="cuda")
    out_lens = torch.empty(bs * N, dtype=torch.int32, device="cuda")

    def nodes():
        return flash_attn_with_kvcache(q=q, k_cache=k, v_cache=v, page_table=table, cache_seqlens=lens,
                                       cu_seqlens_q=cu_nodes, max_seqlen_q=1, softmax_scale=scale, causal=True,
                                       num_splits=1, ver=3)

    sglang = timed(cascade, reps, blocks)
    ours = timed(nodes, reps, blocks)
    rows = {kernel: timed(lambda: node_key_lists(wide, prefix_lens, anc, anc_lens, N, out, out_lens, kernel=kernel),
                          reps, blocks) for kernel in ("triton", "torch")}
    return {"sglang_cascade": sglang, "plugin_nodes": ours, "node_rows_per_forward": rows["triton"],
            "node_rows_per_forward_torch": rows["torch"], "ratio": ours["median_us"] / sglang["median_us"]}


def table(rows: list[dict]) -> str:
    def cell(t):
        return f"{t['median_us']:.1f} ({t['min_us']:.1f}..{t['max_us']:.1f})"

    out = ["| batch | context | Triton decode: SGLang split-KV, us | plugin one-pass, us | ratio "
           "| plugin packed one-pass, us (ratio; bits equal to one-pass) "
           "| FA3 tree verify: SGLang cascade, us | plugin nodes, us | ratio | node rows per forward, us "
           "(torch builder) |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        t, f = r.get("triton_decode"), r.get("fa3_tree_verify")
        tri = f"{cell(t['sglang_split_kv'])} | {cell(t['plugin_one_pass'])} | {t['ratio']:.2f}" if t else "- | - | -"
        if t and "plugin_packed" in t:
            tri += (f" | {cell(t['plugin_packed'])} ({t['ratio_packed']:.2f}; "
                    f"{'yes' if t['packed_equal_one_pass'] else 'NO'})")
        else:
            tri += " | -"
        fa = (f"{cell(f['sglang_cascade'])} | {cell(f['plugin_nodes'])} | {f['ratio']:.2f} | "
              f"{cell(f['node_rows_per_forward'])} ({cell(f['node_rows_per_forward_torch'])})") if f else "- | - | - | -"
        out.append(f"| {r['batch']} | {r['context']} | {tri} | {fa} |")
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batches", default="1,32,128")
    p.add_argument("--contexts", default="1024,4096")
    p.add_argument("--table-width", type=int, default=131072,
                   help="prefix page-table width the node rows are built from (SGLang's graph buffers: the context length)")
    p.add_argument("--reps", type=int, default=50, help="calls per timed block (>= 1)")
    p.add_argument("--blocks", type=int, default=5, help="timed blocks per cell (>= 2)")
    p.add_argument("--out", default=f"docs/benchmarks/attention_paths_{datetime.date.today()}",
                   help="output path without suffix: .json and .md are written")
    args = p.parse_args(argv)
    check_timing_args(p, args)
    batches = [int(x) for x in args.batches.split(",")]
    contexts = [int(x) for x in args.contexts.split(",")]
    fa3 = torch.cuda.get_device_capability()[0] == 9
    rows = []
    for bs in batches:
        for ctx in contexts:
            row = {"batch": bs, "context": ctx, "triton_decode": triton_decode(bs, ctx, args.reps, args.blocks)}
            if fa3:
                row["fa3_tree_verify"] = fa3_tree_verify(bs, ctx, args.reps, args.blocks, args.table_width)
            rows.append(row)
            print(table([row]).splitlines()[-1], flush=True)
    meta = {"date": str(datetime.date.today()), "device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "shape": {"heads": HEADS, "kv_heads": KV_HEADS, "head_dim": DIM, "dtype": "bfloat16", "page_size": 1,
                      "tree_nodes": N}, "table_width": args.table_width, "reps": args.reps, "blocks": args.blocks}
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({**meta, "rows": rows}, indent=1))
    out.with_suffix(".md").write_text(
        f"# Attention paths, {meta['date']}, {meta['device']}, torch {meta['torch']}\n\n"
        f"8B shape ({HEADS} query heads, {KV_HEADS} KV heads, head dim {DIM}, bf16, page size 1); time per call, "
        f"median of {args.blocks} blocks of {args.reps} calls (min..max); ratio = plugin / SGLang.\n\n"
        f"{table(rows)}\n")
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
