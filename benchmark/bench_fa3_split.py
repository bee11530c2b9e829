"""What FA3 under the prefix / tail split costs per layer call, against SGLang's own FA3 calls (Hopper GPU).

An 8B Llama's attention shape (32 query heads, 8 KV heads, head dim 128,
bf16, page size 1), per batch size and context length, each cell replayed
from a CUDA graph (as a server runs decode and verify) and timed side by
side in one run with CUDA events (``bench_attention_paths.timed``: the
median block's time per call and the spread of the blocks):

- **decode**: SGLang's one FA3 call (one causal query row per request)
  against the split (``sglang_plugin.fa3_split.split_attention``: the prefix
  call, the tail call, the fused merge);
- **chain verify** (4 draft tokens): SGLang's one causal call against the split;
- **tree verify** (top-k 4, 8 draft tokens): SGLang's cascade (prefix call,
  ancestors call, ``merge_state_v2``), the node path (one decode query per
  node over its own key list) and the split (one prefix call shared by a
  request's nodes per split key, a short tail per node);
- **prefill** (one request, eager): one causal call against the split.

The split's layout (``ops.prefix_split``) is built once per forward, not per
layer: it is timed apart (``layout_us``). The split changes every mode's
rounding, so a server would take it in all of them; a step's attention cost
changes by the decode's (or verify's) ratio per layer.

    python benchmark/bench_fa3_split.py [--batches 1,8,32,128] [--contexts 128,2048,8192]
        [--out docs/benchmarks/fa3_split/<run>/fa3_split]
"""

from __future__ import annotations

import argparse

import torch

from bench_attention_paths import DIM, HEADS, KV_HEADS, PARENTS, add_sweep_args, check_timing_args, timed, write_results

I32 = dict(dtype=torch.int32, device="cuda")
CHAIN = 4


def _fa3():
    from sglang.kernels.ops.attention.flash_attention import flash_attn_with_kvcache

    return flash_attn_with_kvcache


def graphed(fn):
    """``fn`` captured once into a CUDA graph; returns the replay (as a server replays a decode or verify step)."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def _setup(bs: int, ctx: int, extra: int, gen):
    slots = bs * (ctx + extra) + 1
    k = torch.randn(slots, 1, KV_HEADS, DIM, generator=gen, device="cuda").to(torch.bfloat16)
    v = torch.randn(slots, 1, KV_HEADS, DIM, generator=gen, device="cuda").to(torch.bfloat16)
    table = (torch.randperm(slots - 1, generator=gen, device="cuda")[: bs * (ctx + extra)] + 1).to(torch.int32)
    return k, v, table.view(bs, ctx + extra)


def _call(q, k, v, table, lens, cu, max_q, causal, lse=False):
    out = _fa3()(q=q, k_cache=k, v_cache=v, page_table=table, cache_seqlens=lens, cu_seqlens_q=cu,
                 max_seqlen_q=max_q, softmax_scale=DIM ** -0.5, causal=causal, return_softmax_lse=lse,
                 num_splits=1, ver=3)
    return (out[0], out[1]) if lse else out


def _split_cell(q, k, v, make_split, reps, blocks) -> dict:
    from sglang_detspec.sglang_plugin.fa3_split import split_attention

    split = make_split()
    out = torch.empty_like(q)
    res = {"plugin_split": timed(graphed(lambda: split_attention(q, k, v, split, DIM ** -0.5, out=out)),
                                 reps, blocks)}
    res["layout_us"] = timed(graphed(make_split), reps, blocks)["median_us"]
    return res


def decode_cell(bs: int, ctx: int, reps: int, blocks: int) -> dict:
    from sglang_detspec.ops.prefix_split import decode_split

    gen = torch.Generator(device="cuda").manual_seed(bs * 7 + ctx)
    k, v, table = _setup(bs, ctx, 0, gen)
    lens = torch.full((bs,), ctx, **I32)
    q = torch.randn(bs, HEADS, DIM, generator=gen, device="cuda").to(torch.bfloat16)
    cu = torch.arange(bs + 1, **I32)
    res = {"sglang_one_call": timed(graphed(lambda: _call(q, k, v, table, lens, cu, 1, True)), reps, blocks)}
    res.update(_split_cell(q, k, v, lambda: decode_split(table, lens), reps, blocks))
    return res


def chain_cell(bs: int, ctx: int, reps: int, blocks: int) -> dict:
    from sglang_detspec.ops.prefix_split import extend_split

    gen = torch.Generator(device="cuda").manual_seed(bs * 11 + ctx)
    k, v, table = _setup(bs, ctx, CHAIN, gen)
    lens = torch.full((bs,), ctx + CHAIN, **I32)
    q = torch.randn(bs * CHAIN, HEADS, DIM, generator=gen, device="cuda").to(torch.bfloat16)
    cu = torch.arange(0, bs * CHAIN + 1, CHAIN, **I32)
    prefix, ext = torch.full((bs,), ctx, **I32), torch.full((bs,), CHAIN, **I32)
    res = {"sglang_one_call": timed(graphed(lambda: _call(q, k, v, table, lens, cu, CHAIN, True)), reps, blocks)}
    res.update(_split_cell(q, k, v, lambda: extend_split(table, prefix, ext, CHAIN, bs * CHAIN), reps, blocks))
    return res


def _paths() -> list[list[int]]:
    out = []
    for i in range(len(PARENTS)):
        path, j = [], i
        while j >= 0:
            path.append(j)
            j = PARENTS[j]
        out.append(path[::-1])
    return out


def tree_cell(bs: int, ctx: int, reps: int, blocks: int) -> dict:
    from sgl_kernel import merge_state_v2

    from sglang_detspec.ops.node_rows import node_key_lists
    from sglang_detspec.ops.prefix_split import tree_split

    n = len(PARENTS)
    gen = torch.Generator(device="cuda").manual_seed(bs * 13 + ctx)
    k, v, table = _setup(bs, ctx, n, gen)
    prefix_table = table[:, :ctx].contiguous()
    prefix_lens = torch.full((bs,), ctx, **I32)
    anc = torch.zeros(bs * n, n, **I32)
    anc_lens = torch.zeros(bs * n, **I32)
    for b in range(bs):
        for i, path in enumerate(_paths()):
            anc[b * n + i, :len(path)] = table[b, ctx + torch.tensor(path, device="cuda")]
            anc_lens[b * n + i] = len(path)
    q = torch.randn(bs * n, HEADS, DIM, generator=gen, device="cuda").to(torch.bfloat16)
    cu_tree = torch.arange(0, bs * n + 1, n, **I32)
    cu_node = torch.arange(bs * n + 1, **I32)

    def cascade():
        o1, l1 = _call(q, k, v, prefix_table, prefix_lens, cu_tree, n, False, lse=True)
        o2, l2 = _call(q, k, v, anc, anc_lens, cu_node, 1, False, lse=True)
        merge_state_v2(o1, l1.T.contiguous(), o2, l2.T.contiguous())

    node_table, node_lens = node_key_lists(prefix_table, prefix_lens, anc, anc_lens, n)
    res = {"sglang_cascade": timed(graphed(cascade), reps, blocks),
           "node_path": timed(graphed(lambda: _call(q, k, v, node_table, node_lens, cu_node, 1, True)), reps,
                              blocks)}
    res.update(_split_cell(q, k, v, lambda: tree_split(prefix_table, prefix_lens, anc, anc_lens, n), reps, blocks))
    return res


def prefill_cell(ctx: int, reps: int, blocks: int) -> dict:
    from sglang_detspec.ops.prefix_split import extend_split
    from sglang_detspec.sglang_plugin.fa3_split import split_attention

    gen = torch.Generator(device="cuda").manual_seed(ctx)
    k, v, table = _setup(1, ctx, 0, gen)
    q = torch.randn(ctx, HEADS, DIM, generator=gen, device="cuda").to(torch.bfloat16)
    lens, cu = torch.tensor([ctx], **I32), torch.tensor([0, ctx], **I32)
    split = extend_split(table, torch.zeros(1, **I32), lens, ctx, ctx)
    return {"sglang_one_call": timed(lambda: _call(q, k, v, table, lens, cu, ctx, True), reps, blocks),
            "plugin_split": timed(lambda: split_attention(q, k, v, split, DIM ** -0.5), reps, blocks)}


def _fmt(c: dict) -> str:
    return f"{c['median_us']:.1f} ({c['min_us']:.1f}-{c['max_us']:.1f})"


def _ratio(cell: dict, a: str, b: str) -> str:
    return f"{cell[a]['median_us'] / cell[b]['median_us']:.2f}x"


def table(rows: list[dict]) -> str:
    out = ["| batch | context | decode: one call / split, us | chain: one call / split, us | "
           "tree: cascade / nodes / split, us | layout, us (decode / chain / tree) | prefill: one call / split, us |",
           "|---|---|---|---|---|---|---|"]
    for r in rows:
        d, c, t = r["decode"], r["chain"], r["tree"]
        pre = "-"
        if "prefill" in r:
            p = r["prefill"]
            pre = f"{_fmt(p['sglang_one_call'])} / {_fmt(p['plugin_split'])} ({_ratio(p, 'plugin_split', 'sglang_one_call')})"
        out.append(f"| {r['batch']} | {r['context']} | {_fmt(d['sglang_one_call'])} / {_fmt(d['plugin_split'])} "
                   f"({_ratio(d, 'plugin_split', 'sglang_one_call')}) | {_fmt(c['sglang_one_call'])} / "
                   f"{_fmt(c['plugin_split'])} ({_ratio(c, 'plugin_split', 'sglang_one_call')}) | "
                   f"{_fmt(t['sglang_cascade'])} / {_fmt(t['node_path'])} / {_fmt(t['plugin_split'])} "
                   f"({_ratio(t, 'plugin_split', 'sglang_cascade')}) | {d['layout_us']:.1f} / {c['layout_us']:.1f} / "
                   f"{t['layout_us']:.1f} | {pre} |")
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_sweep_args(p)
    p.add_argument("--out", default="docs/benchmarks/fa3_split/fa3_split",
                   help="output path without suffix: .json and .md are written")
    args = p.parse_args(argv)
    check_timing_args(p, args)
    if torch.cuda.get_device_capability()[0] != 9:
        p.error("needs a Hopper GPU (FA3 is built for sm90)")
    rows = []
    for ctx in (int(x) for x in args.contexts.split(",")):
        for bs in (int(x) for x in args.batches.split(",")):
            if bs * ctx > args.max_tokens:
                continue
            row = {"batch": bs, "context": ctx, "decode": decode_cell(bs, ctx, args.reps, args.blocks),
                   "chain": chain_cell(bs, ctx, args.reps, args.blocks),
                   "tree": tree_cell(bs, ctx, args.reps, args.blocks)}
            if bs == 1:
                row["prefill"] = prefill_cell(ctx, args.reps, args.blocks)
            rows.append(row)
            print(table([row]).splitlines()[-1], flush=True)
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "shape": {"heads": HEADS, "kv_heads": KV_HEADS, "head_dim": DIM, "dtype": "bfloat16"}}
    write_results(args.out, meta, rows, table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
