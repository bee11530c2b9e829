"""What an MLA target's one-pass Triton decode costs per layer call, against SGLang's split-KV MLA decode (CUDA GPU).

Under deterministic inference SGLang 0.5.23 runs a DeepSeek-family target's
attention absorbed on Triton: the latent cache is one KV head of
``kv_lora_rank + rope`` = 512 + 64 dims, the value its first 512. It decodes
on its split-KV kernel (splits of 256 keys, merged by log-sum-exp), while
prefill, extend and verify run its single-pass kernel; the plugin's
``attention_hook._mla_one_pass`` runs the decode through that single-pass
kernel too, so a decoded token's logits equal its verify's and prefill's:
first with one query row per head (``decode_as_extend``: every head's
program reads the whole latent context), since with the query heads sharing
SGLang's own tile for the latent key (``decode_packed``: one program per
tile of heads reads it once; where the start-up check passes). The
single-pass kernel gives each request's tile one program over the whole
context, where the split-KV kernel spreads a long context over one program
per 256 keys: this benchmark measures what that costs, per layer call, at
DeepSeek-V3's head counts per GPU (16: tensor parallelism 8; 128: one GPU;
``--heads 4`` gives the tiny suite model's). Only servers without speculative decoding
pay it (a speculative server's target verifies and never decodes).

Each cell: the median of ``--blocks`` blocks of ``--reps`` calls, CUDA
events, the spread (min..max of the blocks) and the ratio of the medians;
asserts nothing.

    python benchmark/bench_mla_decode.py [--heads 16,128] [--batches 1,8,32,128] [--contexts 128,2048,8192]
        [--out docs/benchmarks/mla_decode_<date>/mla_decode]
"""

from __future__ import annotations

import argparse
import datetime

import torch

from bench_attention_paths import SPLIT_TILE, add_sweep_args, check_timing_args, timed, write_results

RANK, ROPE = 512, 64  # DeepSeek-V3's kv_lora_rank and qk_rope_head_dim


def mla_decode(heads: int, bs: int, ctx: int, reps: int, blocks: int) -> dict:
    """SGLang's split-KV MLA decode and the plugin's one-pass decodes on one batch: times (us) and ratios.

    Shapes: the latent cache ``[bs * ctx, 1, RANK + ROPE]`` bf16 (the value a view of its first RANK dims),
    queries ``[bs, heads, RANK + ROPE]``, outputs ``[bs, heads, RANK]``; each request's ``ctx`` keys at
    scattered slots. ``plugin_one_pass``: one query row per head; ``plugin_packed``: the heads in SGLang's own
    tile (None where ``packable`` does not hold). ``equal``: whether SGLang's and the one-row outputs agree bit
    for bit (they are not expected to); ``packed_equal``: whether the packed rows are the one-row rows (they
    must be: the start-up check asks the same).
    """
    from sglang.kernels.ops.attention.decode_attention import decode_attention_fwd
    from sglang.kernels.ops.attention.extend_attention import (_fwd_kernel_unified,
                                                                 _get_block_sizes_for_extend_attention,
                                                                 extend_attention_fwd_unified)

    from sglang_detspec.sglang_plugin.decode_attention import decode_as_extend, decode_packed, packable

    dim = RANK + ROPE
    gen = torch.Generator(device="cuda").manual_seed(heads * 1009 + bs * 7 + ctx)
    latent = torch.randn(bs * ctx, 1, dim, generator=gen, device="cuda").to(torch.bfloat16)
    value = latent[..., :RANK]
    q = torch.randn(bs, heads, dim, generator=gen, device="cuda").to(torch.bfloat16)
    indices = torch.randperm(bs * ctx, generator=gen, device="cuda")  # int64, as SGLang's decode metadata
    indptr = torch.arange(0, bs * ctx + 1, ctx, dtype=torch.int32, device="cuda")
    splits = (ctx + SPLIT_TILE - 1) // SPLIT_TILE
    num_splits = torch.full((bs,), splits, dtype=torch.int32, device="cuda")
    logits = torch.empty(bs, heads, splits, RANK, dtype=torch.float32, device="cuda")
    lse = torch.empty(bs, heads, splits, dtype=torch.float32, device="cuda")
    out_sglang, out_ours, out_packed = (q.new_empty(bs, heads, RANK) for _ in range(3))
    rows = torch.arange(bs + 1, dtype=torch.int64, device="cuda")
    scale = dim ** -0.5
    # SGLang's MLA forward_decode passes these keywords (the kernel test calls it the same way).
    mla = dict(logit_cap=0.0, sinks=None, xai_temperature_len=-1, has_mla=True, use_pdl=False, page_size=1,
               score_mod=None, aux_tensors=None, enable_lean=False, lean_Mp=None, lean_Lp=None, lean_Op=None,
               lean_locks=None, uneven_batch=None)
    sglang = timed(lambda: decode_attention_fwd(q, latent, value, out_sglang, indptr, indices, logits, lse, num_splits,
                                                splits, scale, 1.0, 1.0, **mla), reps, blocks)
    ours = timed(lambda: decode_as_extend(extend_attention_fwd_unified, rows, q, latent, value, out_ours, indptr,
                                          indices, scale, 1.0, 1.0), reps, blocks)
    blocks_ = _get_block_sizes_for_extend_attention(dim, RANK)
    packed = None
    if packable(blocks_, torch.cuda.get_device_capability(), hip=torch.version.hip is not None):
        group_rows = rows * heads
        packed = timed(lambda: decode_packed(_fwd_kernel_unified, blocks_, rows, q, latent, value, out_packed, indptr,
                                             indices, scale, 1.0, 1.0, group_rows=group_rows), reps, blocks)
    return {"sglang_split_kv": sglang, "plugin_one_pass": ours, "ratio": ours["median_us"] / sglang["median_us"],
            "plugin_packed": packed,
            "packed_ratio": packed["median_us"] / sglang["median_us"] if packed else None,
            "equal": bool(torch.equal(out_sglang, out_ours)),
            "packed_equal": bool(torch.equal(out_packed, out_ours)) if packed else None}


def table(rows: list[dict]) -> str:
    def cell(t):
        return f"{t['median_us']:.1f} ({t['min_us']:.1f}..{t['max_us']:.1f})" if t else "-"

    def ratio(x):
        return f"{x:.2f}" if x is not None else "-"

    out = ["| query heads | batch | context | SGLang split-KV MLA decode, us | plugin one row per head, us | ratio | "
           "plugin heads in one tile, us | ratio | tile rows = one-row rows |", "|---|---|---|---|---|---|---|---|---|"]
    out += [f"| {r['heads']} | {r['batch']} | {r['context']} | {cell(r['sglang_split_kv'])} | "
            f"{cell(r['plugin_one_pass'])} | {r['ratio']:.2f} | {cell(r.get('plugin_packed'))} | "
            f"{ratio(r.get('packed_ratio'))} | {r.get('packed_equal', '-')} |" for r in rows]
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--heads", default="16,128", help="query heads per GPU, comma-separated (>= 1 each)")
    add_sweep_args(p)
    p.add_argument("--out", default=f"docs/benchmarks/mla_decode_{datetime.date.today()}/mla_decode",
                   help="output path without suffix: .json and .md are written")
    args = p.parse_args(argv)
    try:
        heads = [int(x) for x in args.heads.split(",")]
        batches = [int(x) for x in args.batches.split(",")]
        contexts = [int(x) for x in args.contexts.split(",")]
    except ValueError:
        p.error(f"--heads, --batches and --contexts take comma-separated integers, got {args.heads!r}, "
                f"{args.batches!r}, {args.contexts!r}")
    if min(heads + batches + contexts) < 1:
        p.error("--heads, --batches and --contexts must be >= 1 each")
    check_timing_args(p, args)
    rows = []
    for h in heads:
        for bs in batches:
            for ctx in contexts:
                if bs * ctx > args.max_tokens:
                    continue
                rows.append({"heads": h, "batch": bs, "context": ctx,
                             **mla_decode(h, bs, ctx, args.reps, args.blocks)})
                print(table(rows[-1:]).splitlines()[-1], flush=True)
    meta = {"date": str(datetime.date.today()), "device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "shape": {"kv_lora_rank": RANK, "rope": ROPE, "kv_heads": 1, "dtype": "bfloat16", "page_size": 1},
            "split_tile": SPLIT_TILE, "reps": args.reps, "blocks": args.blocks}
    write_results(args.out, meta, rows, table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
