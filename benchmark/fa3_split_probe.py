"""Would a positional split make FA3 tree verify bitwise at the cascade's price? A kernel-level probe (Hopper GPU).

The node path (``sglang_plugin/tree_attention_hook.py``) makes each tree
node's verify the decode call of its token, so every node reads its
request's whole prefix: ``N`` prefix reads per request where SGLang's
cascade reads it once. The alternative probed here changes the decode too,
so that a shared prefix read becomes possible everywhere:

    every query row whose key list has ``L`` keys (itself last) is computed as
    an FA3 call over the keys ``[0, S(L))`` (non-causal) and one over
    ``[S(L), L)`` (causal), merged in fp32 by log-sum-exp and rounded once,
    with ``S(L) = B * floor(max(L - 1 - D, 0) / B)``.

``S`` depends on the row's own length only, so decode, chain verify, tree
verify, prefill and extend would all split a row at the same key; ``D``
bounds a tree's depth, so every node of a request splits at or before its
prefix, at one of at most two keys while the tree is shallower than ``B``:
the nodes can share a prefix call per split point (query rows over the same
keys), while each node's short tail goes through its own page-table row.
The probe makes one shared call per request at node 0's split
(``nodes_share_split`` says whether that is every node's), so where it is
false the prefix and merged counts include nodes that read other keys. For the rows to agree bit for bit, FA3's result for one query row must
not depend on the call's shape: how many rows share the keys (1 for decode,
``N`` for a tree's prefix call, a chunk for prefill), whether SGLang's
FA3 packs query heads (it does for decode), or which rows are causal
neighbours. This probe measures exactly that, per part, on random KV:

- ``prefix``: the prefix call's output and LSE per row, decode-shaped (one
  row per batch element) against tree-shaped (``N`` rows) and
  prefill-shaped (``--chunk`` rows) calls over the same keys;
- ``tail``: the causal tail per row, decode-shaped against a prefill
  chunk's rows (one causal call over the chunk's tail keys);
- ``merged``: the rows after the merge, decode against tree verify.

It also times one layer call of each tree verify (SGLang's cascade, the
node path, the split) and each decode (SGLang's one call, the split) per
batch and context, with CUDA events. It writes ``probe.json``; it asserts
nothing (a measurement, for deciding what to build).

    python benchmark/fa3_split_probe.py [--out DIR] [--batches 1,8,32,128] [--contexts 128,2048,8192]
"""

from __future__ import annotations

import argparse
import json
import os

import torch

HEADS, KV_HEADS, DIM = 32, 8, 128
PARENTS = [-1, 0, 0, 0, 0, 1, 1, 2]  # SGLang's EAGLE order for top-k 4, 8 draft tokens
N = len(PARENTS)
DEV = "cuda"


def split_point(length: torch.Tensor, block: int, depth: int) -> torch.Tensor:
    """``S(L) = block * floor(max(L - 1 - depth, 0) / block)`` (int32, elementwise)."""
    return (torch.clamp(length - 1 - depth, min=0) // block * block).to(torch.int32)


def merge(o1: torch.Tensor, lse1: torch.Tensor, o2: torch.Tensor, lse2: torch.Tensor) -> torch.Tensor:
    """Two partial attentions ``[rows, heads, dim]`` with LSEs ``[rows, heads]`` joined in fp32, rounded once.

    A part with LSE ``-inf`` (no keys) weighs 0, so the other part comes back exactly.
    """
    m = torch.maximum(lse1, lse2)
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    w1, w2 = torch.exp(lse1 - m).unsqueeze(-1), torch.exp(lse2 - m).unsqueeze(-1)
    # A part without keys may hold anything in its output (0 * NaN is NaN): leave it out, not times 0.
    t1 = torch.where(w1 > 0, o1.float() * w1, torch.zeros((), device=o1.device))
    t2 = torch.where(w2 > 0, o2.float() * w2, torch.zeros((), device=o2.device))
    return ((t1 + t2) / (w1 + w2)).to(o1.dtype)


def ancestors(i: int) -> list[int]:
    out = []
    while i >= 0:
        out.append(i)
        i = PARENTS[i]
    return out[::-1]


class Case:
    """Random KV and, per request, its prefix slots and its tree's draft slots."""

    def __init__(self, batch: int, context: int, seed: int):
        gen = torch.Generator(device=DEV).manual_seed(seed)
        slots = batch * (context + N) + 64
        self.k = torch.randn(slots, 1, KV_HEADS, DIM, generator=gen, device=DEV).to(torch.bfloat16)
        self.v = torch.randn(slots, 1, KV_HEADS, DIM, generator=gen, device=DEV).to(torch.bfloat16)
        order = torch.randperm(slots, generator=gen, device=DEV).to(torch.int32)
        self.batch, self.context = batch, context
        # Prefix lengths vary around the context so rows fall on both sides of split and tile edges.
        self.prefix = [max(1, context - (37 * b) % max(1, context // 4)) for b in range(batch)]
        self.rows = []  # per request: prefix slots ++ draft slots
        at = 0
        for p in self.prefix:
            self.rows.append(order[at:at + p + N])
            at += p + N
        self.q = torch.randn(batch * N, HEADS, DIM, generator=gen, device=DEV).to(torch.bfloat16)
        self.scale = DIM ** -0.5

    def node_keys(self, b: int, i: int) -> torch.Tensor:
        p = self.prefix[b]
        return torch.cat([self.rows[b][:p], self.rows[b][p + torch.tensor(ancestors(i), device=DEV)]])


def fa3(q, k, v, table, lens, cu_q, max_q, *, causal, lse=True):
    from sglang.kernels.ops.attention.flash_attention import flash_attn_with_kvcache

    out = flash_attn_with_kvcache(q=q, k_cache=k, v_cache=v, page_table=table, cache_seqlens=lens, cu_seqlens_q=cu_q,
                                  max_seqlen_q=max_q, softmax_scale=DIM ** -0.5, causal=causal,
                                  return_softmax_lse=lse, num_splits=1, ver=3)
    if not lse:
        return out
    return out[0], out[1].T.contiguous()  # FA3's varlen LSE is [heads, rows]; as [rows, heads]


def table_of(rows: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(1, max(r.numel() for r in rows))
    t = torch.zeros(len(rows), width, dtype=torch.int32, device=DEV)
    for i, r in enumerate(rows):
        t[i, :r.numel()] = r
    return t, torch.tensor([r.numel() for r in rows], dtype=torch.int32, device=DEV)


def arange(n, step=1):
    return torch.arange(0, n * step + 1, step, dtype=torch.int32, device=DEV)


def equal_rows(a: torch.Tensor, b: torch.Tensor) -> tuple[int, int]:
    """(rows that differ in any bit, rows compared) of two ``[rows, ...]`` tensors."""
    diff = (a.view(a.shape[0], -1) != b.view(b.shape[0], -1)).any(dim=1)
    return int(diff.sum()), a.shape[0]


def probe_bits(case: Case, block: int, depth: int, chunk: int) -> dict:
    """Row-by-row equality of each part across call shapes (see the module docstring)."""
    bs = case.batch
    keys = [[case.node_keys(b, i) for i in range(N)] for b in range(bs)]
    lens = torch.tensor([[k.numel() for k in ks] for ks in keys], dtype=torch.int32, device=DEV)  # [bs, N]
    s = split_point(lens, block, depth)  # [bs, N]
    out = {}
    # Nodes of one request must split alike for one shared prefix call.
    out["nodes_share_split"] = bool((s == s[:, :1]).all())
    s_req = s[:, 0]
    # Prefix part, decode-shaped: one row per batch element.
    dec_tab, _ = table_of([keys[b][i][: int(s[b, i])] for b in range(bs) for i in range(N)])
    dec_o, dec_l = fa3(case.q, case.k, case.v, dec_tab, s.flatten().contiguous(), arange(bs * N), 1, causal=False)
    # Prefix part, tree-shaped: N rows of a request in one element.
    tree_tab, _ = table_of([case.rows[b][: int(s_req[b])] for b in range(bs)])
    tree_o, tree_l = fa3(case.q, case.k, case.v, tree_tab, s_req.contiguous(), arange(bs, N), N, causal=False)
    out["prefix_tree_vs_decode"] = equal_rows(torch.cat([tree_o.flatten(1), tree_l], 1),
                                              torch.cat([dec_o.flatten(1), dec_l], 1))
    # Prefix part, prefill-shaped: the same row among `chunk` rows over the same keys.
    reps = chunk // N
    q_chunk = case.q.view(bs, N, HEADS, DIM).repeat(1, reps, 1, 1).reshape(-1, HEADS, DIM)
    pre_o, pre_l = fa3(q_chunk, case.k, case.v, tree_tab, s_req.contiguous(), arange(bs, N * reps), N * reps,
                       causal=False)
    pre_o = pre_o.view(bs, reps, N, HEADS, DIM)[:, reps - 1].reshape(-1, HEADS, DIM)
    pre_l = pre_l.view(bs, reps, N, HEADS)[:, reps - 1].reshape(-1, HEADS)
    out["prefix_prefill_vs_decode"] = equal_rows(torch.cat([pre_o.flatten(1), pre_l], 1),
                                                 torch.cat([dec_o.flatten(1), dec_l], 1))
    # Tail part, decode-shaped: each node's keys from its split point, causal, one row.
    tail_tab, tail_lens = table_of([keys[b][i][int(s[b, i]):] for b in range(bs) for i in range(N)])
    tail_o, tail_l = fa3(case.q, case.k, case.v, tail_tab, tail_lens, arange(bs * N), 1, causal=True)
    # Tail part, prefill-shaped: a chain (node 0's path extended by draft slots 1.. as consecutive tokens) as one
    # causal chunk from the split point; its last rows are the decode rows of those tokens.
    chain_rows, chain_q, chain_dec, want_rows = [], [], [], []
    for b in range(bs):
        p = case.prefix[b]
        full = case.rows[b][: p + N]  # prefix then all N draft slots, read as a chain
        start = int(split_point(torch.tensor(p + N), block, depth))
        if start > p:  # the chain's first rows would split later than its last: not one group
            continue
        chain_rows.append(full[start:])
        for t in range(N):
            chain_dec.append(full[start: p + t + 1])
        want_rows.append(case.q[b * N:(b + 1) * N])
    if chain_rows:
        ctab, clens = table_of(chain_rows)
        cq = torch.cat(want_rows)
        co, cl = fa3(cq, case.k, case.v, ctab, clens, arange(len(chain_rows), N), N, causal=True)
        dtab, dlens = table_of(chain_dec)
        do, dl = fa3(cq, case.k, case.v, dtab, dlens, arange(cq.shape[0]), 1, causal=True)
        out["tail_chain_vs_decode"] = equal_rows(torch.cat([co.flatten(1), cl], 1), torch.cat([do.flatten(1), dl], 1))
    # Merged rows: tree verify (shared prefix call + per-node tails) against decode (both parts per row).
    tree_merged = merge(tree_o, tree_l, tail_o, tail_l)
    dec_merged = merge(dec_o, dec_l, tail_o, tail_l)
    out["merged_tree_vs_decode"] = equal_rows(tree_merged, dec_merged)
    # How far the split lands from SGLang's one-call decode (the rounding a split decode would change).
    full_tab, full_lens = table_of([k for ks in keys for k in ks])
    one = fa3(case.q, case.k, case.v, full_tab, full_lens, arange(bs * N), 1, causal=True, lse=False)
    out["merged_vs_one_call_max_abs"] = float((dec_merged.float() - one.float()).abs().max())
    return out


def timed(fn, reps: int = 20, blocks: int = 5) -> float:
    """Median over blocks of the mean time per call, microseconds (``bench_attention_paths.timed``)."""
    from bench_attention_paths import timed as timed_blocks

    return timed_blocks(fn, reps, blocks)["median_us"]


def probe_time(case: Case, block: int, depth: int) -> dict:
    """One layer call of each tree verify and each decode, microseconds (tables built outside the timing)."""
    from sgl_kernel import merge_state_v2

    bs = case.batch
    keys = [case.node_keys(b, i) for b in range(bs) for i in range(N)]
    lens = torch.tensor([k.numel() for k in keys], dtype=torch.int32, device=DEV)
    s = split_point(lens, block, depth)
    s_req = s.view(bs, N)[:, 0].contiguous()
    node_tab, node_lens = table_of(keys)
    pre_tab, _ = table_of([case.rows[b][: case.prefix[b]] for b in range(bs)])
    pre_lens = torch.tensor(case.prefix, dtype=torch.int32, device=DEV)
    anc_tab, anc_lens = table_of([case.rows[b][case.prefix[b] + torch.tensor(ancestors(i), device=DEV)]
                                  for b in range(bs) for i in range(N)])
    sp_tab, _ = table_of([case.rows[b][: int(s_req[b])] for b in range(bs)])
    tail_tab, tail_lens = table_of([k[int(s[r]):] for r, k in enumerate(keys)])
    q = case.q

    def cascade():
        o1, l1 = fa3(q, case.k, case.v, pre_tab, pre_lens, arange(bs, N), N, causal=False)
        o2, l2 = fa3(q, case.k, case.v, anc_tab, anc_lens, arange(bs * N), 1, causal=False)
        merge_state_v2(o1, l1, o2, l2)

    def nodes():
        fa3(q, case.k, case.v, node_tab, node_lens, arange(bs * N), 1, causal=True, lse=False)

    def split_tree():
        o1, l1 = fa3(q, case.k, case.v, sp_tab, s_req, arange(bs, N), N, causal=False)
        o2, l2 = fa3(q, case.k, case.v, tail_tab, tail_lens, arange(bs * N), 1, causal=True)
        merge(o1, l1, o2, l2)

    dq = q.view(bs, N, HEADS, DIM)[:, 0].contiguous()
    d_tab, d_lens = table_of([keys[b * N] for b in range(bs)])
    d_s = s.view(bs, N)[:, 0].contiguous()
    d_pre, _ = table_of([keys[b * N][: int(d_s[b])] for b in range(bs)])
    d_tail, d_tail_lens = table_of([keys[b * N][int(d_s[b]):] for b in range(bs)])

    def decode_one():
        fa3(dq, case.k, case.v, d_tab, d_lens, arange(bs), 1, causal=True, lse=False)

    def decode_split():
        o1, l1 = fa3(dq, case.k, case.v, d_pre, d_s, arange(bs), 1, causal=False)
        o2, l2 = fa3(dq, case.k, case.v, d_tail, d_tail_lens, arange(bs), 1, causal=True)
        merge(o1, l1, o2, l2)

    return {"tree_cascade_us": timed(cascade), "tree_nodes_us": timed(nodes), "tree_split_us": timed(split_tree),
            "decode_one_call_us": timed(decode_one), "decode_split_us": timed(decode_split)}


def _sizes(text: str, name: str, maximum: int) -> list[int]:
    """``"1,8,32"`` -> ``[1, 8, 32]``; ValueError naming ``name`` and the bounds otherwise."""
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{name} must be comma-separated integers, got {text!r}") from None
    if not values or any(not 1 <= v <= maximum for v in values):
        raise ValueError(f"{name} must list integers in [1, {maximum}], got {text!r}")
    return values


def validate(args) -> tuple[list[int], list[int]]:
    """``(batches, contexts)`` of checked arguments; ValueError naming the argument and its bound otherwise."""
    batches = _sizes(args.batches, "batches", 4096)
    contexts = _sizes(args.contexts, "contexts", 131072)
    if not 1 <= args.block <= 65536:
        raise ValueError(f"block must lie in [1, 65536], got {args.block}")
    if not 0 <= args.depth <= 65536:
        raise ValueError(f"depth must lie in [0, 65536], got {args.depth}")
    if args.chunk % N or not N <= args.chunk <= 65536:
        raise ValueError(f"chunk must be a multiple of {N} in [{N}, 65536], got {args.chunk}")
    return batches, contexts


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", default="1,8,32,128")
    p.add_argument("--contexts", default="128,2048,8192")
    p.add_argument("--block", type=int, default=128, help="split granularity B (keys)")
    p.add_argument("--depth", type=int, default=64, help="deepest tree node D (keys past the prefix)")
    p.add_argument("--chunk", type=int, default=64, help="rows of the prefill-shaped calls (a multiple of 8)")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    try:
        batches, contexts = validate(args)
    except ValueError as exc:
        print(f"fa3_split_probe: {exc}")
        return 2
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        print("fa3_split_probe: needs a Hopper GPU (FA3 is built for sm90)")
        return 2
    rows = []
    for batch in batches:
        for context in contexts:
            case = Case(batch, context, seed=batch * 7919 + context)
            row = {"batch": batch, "context": context}
            for part in (lambda: probe_bits(case, args.block, args.depth, args.chunk),
                         lambda: probe_time(case, args.block, args.depth)):
                try:
                    row.update(part())
                except Exception as exc:  # recorded: a call shape FA3 refuses is itself a finding
                    row.setdefault("errors", []).append(repr(exc)[:300])
            rows.append(row)
            print(json.dumps(row), flush=True)
    result = {"block": args.block, "depth": args.depth, "chunk": args.chunk, "device": torch.cuda.get_device_name(),
              "torch": torch.__version__, "rows": rows}
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "probe.json"), "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
