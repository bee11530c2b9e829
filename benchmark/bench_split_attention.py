"""What the positional-split kernels cost per layer call, against SGLang's deterministic Triton kernels (CUDA GPU).

An 8B Llama's attention shape (32 query heads, 8 KV heads, head dim 128,
bf16, page size 1), per batch size and context length, timed side by side
in one run with CUDA events (``bench_attention_paths.timed``: the median
block's time per call and the spread of the blocks):

- **decode**: SGLang's deterministic split-KV decode (splits of 256 keys,
  what ``SGLANG_DETSPEC_DECODE_ATTENTION=sglang`` keeps), the plugin's
  packed one-pass decode (``one_pass``), and the positional-split decode +
  merge (``split``, the default);
- **chain verify** (4 draft tokens after the context) and **tree verify**
  (top-k 4, 8 draft tokens): SGLang's single-pass kernel with its verify
  mask, as its Triton backend runs a verify, against the split verify
  (``split_tree_verify``: each draft token over its prefix and path, the
  prefix's whole segments read once per request);
- **prefill**: one request's whole context as one extend, the same two.

The ``split`` columns replace both sides of the bitwise pair (decode and
extend), so a server's step changes by the decode's and the verify's
differences together; the table gives each ratio to SGLang's kernel of
that mode. Each row also says whether the split decode's rows equal the
split prefill's last rows bit for bit on this GPU.

    python benchmark/bench_split_attention.py [--batches 1,8,32,128] [--contexts 128,2048,8192]
        [--out docs/benchmarks/split_attention/<run>/split]
"""

from __future__ import annotations

import argparse

import torch

from bench_attention_paths import (DIM, HEADS, KV_HEADS, PARENTS, SPLIT_TILE, add_sweep_args, check_timing_args,
                                   timed, write_results)

CHAIN = (-1, 0, 1, 2)  # a chain of 4 draft tokens (steps 3), as a verify mask lays it out


def _cache(tokens: int, gen):
    k = torch.randn(tokens + 1, KV_HEADS, DIM, generator=gen, device="cuda").to(torch.bfloat16)
    v = torch.randn(tokens + 1, KV_HEADS, DIM, generator=gen, device="cuda").to(torch.bfloat16)
    return k, v


def decode_cell(bs: int, ctx: int, reps: int, blocks: int, max_context: int) -> dict:
    """One decode step of ``bs`` requests of ``ctx`` keys; the split scratch sized as a server's (``max_context``).

    A server's decode grid launches one program per segment of its context
    length for every request and KV head (those past a request's keys exit
    at once), SGLang's deterministic split-KV decode likewise: both get the
    scratch of ``max_context`` keys.
    """
    from sglang.kernels.ops.attention import extend_attention as ext
    from sglang.kernels.ops.attention.decode_attention import decode_attention_fwd

    from sglang_detspec.ops import split_attention as sa
    from sglang_detspec.sglang_plugin.decode_attention import decode_packed, packable

    gen = torch.Generator(device="cuda").manual_seed(bs * 13 + ctx)
    k, v = _cache(bs * ctx, gen)
    q = torch.randn(bs, HEADS, DIM, generator=gen, device="cuda").to(torch.bfloat16)
    indices = (torch.randperm(bs * ctx, generator=gen, device="cuda") + 1).to(torch.int64)
    indptr = torch.arange(0, bs * ctx + 1, ctx, dtype=torch.int32, device="cuda")
    splits = -(-max(ctx, max_context) // SPLIT_TILE)
    logits = torch.empty(bs, HEADS, splits, DIM, dtype=torch.float32, device="cuda")
    lse = torch.empty(bs, HEADS, splits, dtype=torch.float32, device="cuda")
    num_splits = torch.full((bs,), -(-ctx // SPLIT_TILE), dtype=torch.int32, device="cuda")
    scale = DIM ** -0.5
    out = {name: torch.empty_like(q) for name in ("sglang", "packed", "split")}
    cells = {"sglang_split_kv": timed(lambda: decode_attention_fwd(
        q, k, v, out["sglang"], indptr, indices, logits, lse, num_splits, splits, scale, 1.0, 1.0), reps, blocks)}
    blocks_ = ext._get_block_sizes_for_extend_attention(DIM, DIM)
    if packable(blocks_, torch.cuda.get_device_capability()):
        rows = torch.arange(bs + 1, dtype=torch.int64, device="cuda")
        cells["plugin_packed_one_pass"] = timed(lambda: decode_packed(
            ext._fwd_kernel_unified, blocks_, rows, q, k, v, out["packed"], indptr, indices, scale, 1.0, 1.0),
            reps, blocks)
    cells["plugin_split"] = timed(lambda: sa.split_decode(q, out["split"], k, v, indptr, indices, logits, lse, scale),
                                  reps, blocks)
    # The same requests' last rows from one split prefill each: the decode must give them bit for bit.
    whole = torch.empty(bs * ctx, HEADS, DIM, dtype=torch.bfloat16, device="cuda")
    q_all = torch.randn(bs * ctx, HEADS, DIM, generator=gen, device="cuda").to(torch.bfloat16)
    last = torch.arange(ctx - 1, bs * ctx, ctx, device="cuda")
    q_all[last] = q
    sa.split_extend(q_all, whole, k, v, indptr, indptr, indices, torch.zeros(bs, dtype=torch.int32, device="cuda"),
                    ctx, scale)
    cells["split_decode_equals_split_prefill"] = bool(torch.equal(out["split"], whole[last]))
    return cells


def extend_cell(bs: int, ctx: int, rows: int, reps: int, blocks: int) -> dict:
    """An extend of ``rows`` tokens per request after ``ctx - rows`` cached keys (a prefill where they are equal):
    SGLang's single-pass kernel vs the split one, on 64- and 128-row tiles."""
    from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd_unified

    from sglang_detspec.ops import split_attention as sa

    gen = torch.Generator(device="cuda").manual_seed(bs * 17 + ctx + rows)
    k, v = _cache(bs * ctx, gen)
    q = torch.randn(bs * rows, HEADS, DIM, generator=gen, device="cuda").to(torch.bfloat16)
    indices = (torch.randperm(bs * ctx, generator=gen, device="cuda") + 1).to(torch.int64)
    kv_indptr = torch.arange(0, bs * ctx + 1, ctx, dtype=torch.int32, device="cuda")
    qo_indptr = torch.arange(0, bs * rows + 1, rows, dtype=torch.int32, device="cuda")
    prefix = torch.full((bs,), ctx - rows, dtype=torch.int32, device="cuda")
    scale = DIM ** -0.5
    o1, o2, o3 = torch.empty_like(q), torch.empty_like(q), torch.empty_like(q)
    return {"sglang_one_pass": timed(lambda: extend_attention_fwd_unified(
                q, o1, k, v, 1.0, 1.0, qo_indptr, kv_indptr, indices, prefix, rows, sm_scale=scale), reps, blocks),
            "plugin_split": timed(lambda: sa.split_extend(q, o2, k, v, qo_indptr, kv_indptr, indices, prefix, rows,
                                                          scale), reps, blocks),
            "plugin_split_128": timed(lambda: sa.split_extend(q, o3, k, v, qo_indptr, kv_indptr, indices, prefix,
                                                              rows, scale, tile_rows=128), reps, blocks),
            "tile_128_equals_64": bool(torch.equal(o2, o3))}


def verify_cell(bs: int, ctx: int, parents, reps: int, blocks: int) -> dict:
    """A verify of the draft ``parents`` after ``ctx`` cached keys per request: SGLang's masked kernel vs the split one."""
    from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd_unified

    from sglang_detspec.ops import split_attention as sa

    n = len(parents)
    gen = torch.Generator(device="cuda").manual_seed(bs * 19 + ctx + n)
    k, v = _cache(bs * (ctx + n), gen)
    q = torch.randn(bs * n, HEADS, DIM, generator=gen, device="cuda").to(torch.bfloat16)
    indices = (torch.randperm(bs * (ctx + n), generator=gen, device="cuda") + 1).to(torch.int64)
    layout, _ = sa.tree_verify_layout(parents, [ctx] * bs, list(indices.view(bs, ctx + n)))
    scale = DIM ** -0.5
    o1, o2 = torch.empty_like(q), torch.empty_like(q)
    return {"sglang_one_pass": timed(lambda: extend_attention_fwd_unified(
                q, o1, k, v, 1.0, 1.0, layout["qo_indptr"], layout["kv_indptr"], layout["kv_indices"],
                layout["prefix_lens"], n, custom_mask=layout["custom_mask"], mask_indptr=layout["mask_indptr"],
                sm_scale=scale), reps, blocks),
            "plugin_split": timed(lambda: sa.split_tree_verify(q, o2, k, v, max_len_extend=n, sm_scale=scale,
                                                               **layout), reps, blocks)}


def table(rows: list[dict]) -> str:
    def cell(t):
        return f"{t['median_us']:.1f} ({t['min_us']:.1f}..{t['max_us']:.1f})"

    def ratio(cells, ours, theirs):
        return f"{cells[ours]['median_us'] / cells[theirs]['median_us']:.2f}" if ours in cells else "-"

    out = ["| batch | context | decode: SGLang split-KV, us | packed one-pass, us (ratio) | split, us (ratio) "
           "| split decode = split prefill | chain verify x4: SGLang, us | split, us (ratio) "
           "| tree verify x8: SGLang, us | split, us (ratio) "
           "| prefill (batch 1): SGLang, us | split, us (ratio; 128-row tile ratio, bits) |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        d, vf, tr, pf = r["decode"], r["verify"], r["tree"], r.get("prefill")
        packed = (f"{cell(d['plugin_packed_one_pass'])} ({ratio(d, 'plugin_packed_one_pass', 'sglang_split_kv')})"
                  if "plugin_packed_one_pass" in d else "-")
        pre = (f"{cell(pf['sglang_one_pass'])} | {cell(pf['plugin_split'])} "
               f"({ratio(pf, 'plugin_split', 'sglang_one_pass')}; 128-row tile "
               f"{ratio(pf, 'plugin_split_128', 'sglang_one_pass')}, "
               f"{'same bits' if pf['tile_128_equals_64'] else 'OTHER BITS'})") if pf else "- | -"
        out.append(f"| {r['batch']} | {r['context']} | {cell(d['sglang_split_kv'])} | {packed} | "
                   f"{cell(d['plugin_split'])} ({ratio(d, 'plugin_split', 'sglang_split_kv')}) | "
                   f"{'yes' if d['split_decode_equals_split_prefill'] else 'NO'} | {cell(vf['sglang_one_pass'])} | "
                   f"{cell(vf['plugin_split'])} ({ratio(vf, 'plugin_split', 'sglang_one_pass')}) | "
                   f"{cell(tr['sglang_one_pass'])} | {cell(tr['plugin_split'])} "
                   f"({ratio(tr, 'plugin_split', 'sglang_one_pass')}) | {pre} |")
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_sweep_args(p)
    p.add_argument("--max-context", type=int, default=32768,
                   help="the served context length the decode scratch (and so the decode grid) is sized for")
    p.add_argument("--out", default="docs/benchmarks/split_attention/split",
                   help="output path without suffix: .json and .md are written")
    args = p.parse_args(argv)
    check_timing_args(p, args)
    rows = []
    for ctx in (int(x) for x in args.contexts.split(",")):
        for bs in (int(x) for x in args.batches.split(",")):
            if bs * ctx > args.max_tokens:
                continue
            row = {"batch": bs, "context": ctx,
                   "decode": decode_cell(bs, ctx, args.reps, args.blocks, args.max_context),
                   "verify": verify_cell(bs, ctx, CHAIN, args.reps, args.blocks),
                   "tree": verify_cell(bs, ctx, PARENTS, args.reps, args.blocks)}
            if bs == 1:
                row["prefill"] = extend_cell(1, ctx, ctx, args.reps, args.blocks)
            rows.append(row)
            print(table([row]).splitlines()[-1], flush=True)
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "max_context": args.max_context,
            "shape": {"heads": HEADS, "kv_heads": KV_HEADS, "head_dim": DIM, "dtype": "bfloat16"}}
    write_results(args.out, meta, rows, table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
