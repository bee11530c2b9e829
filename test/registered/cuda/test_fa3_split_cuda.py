"""FA3 under the prefix / tail split: every row the same bits in decode, prefill, chunked prefill and verify.

``sglang_plugin/fa3_split.split_attention`` (two FA3 calls per row, keys
``[0, S(L))`` and ``[S(L), L)``, merged by the fused kernel of
``ops/prefix_split``) on one sequence of 1,100 tokens in scattered cache
slots: the decode of every position (one batch in order, one permuted, and
edge positions one request at a time) against the rows of one prefill, of
chunked prefills (chunks of 100, 256 and 300 tokens), of short prefills
whose tables are too narrow for a prefix part (the tail call alone), of
batched chain verifies of
4 tokens at starts around the split edges, and each tree node's verify row
(three trees, prefixes across split edges) against the decode of its path;
the decode again under CUDA-graph replay with new data (layout built inside
the capture), chain and tree verify layouts built inside a capture and
replayed with other requests' data against their decode,
and a prefix call through FA3's page-table row indices against the same
call on copied rows.
Across attention shapes: the 8B Llama's (32 / 8 heads, head size 128), the
tiny suite models' (4 / 4, 64), head size 256 and 96. Rows are compared by
the bit patterns of the merged float32 result (before its rounding to bf16,
which would hide most differences). Positive controls (the comparison can
fail): at head size 64 SGLang's own one-call decode and one-call prefill
part rows, and a merge of the same parts in the other order parts rows.
Values: within bf16 rounding of one FA3 prefill without the split.
"""

import dataclasses
import random
import sys

import pytest
import torch

from _fa3 import fa3_or_skip
from _register import register_cuda_ci

register_cuda_ci(est_time=90, suite="detspec-kernels-cuda")

fa = fa3_or_skip()

from sglang_detspec.ops import prefix_split as ps  # noqa: E402
from sglang_detspec.ops.split_limits import PREFIX_SPLIT_BLOCK as B  # noqa: E402
from sglang_detspec.ops.split_limits import PREFIX_SPLIT_DEPTH as D  # noqa: E402
from sglang_detspec.sglang_plugin.fa3_split import fa3_part, split_attention  # noqa: E402

DEV = "cuda"
LENGTH = 1100
SHAPES = [(32, 8, 128), (4, 4, 64), (8, 2, 256), (28, 4, 96)]
I32 = dict(dtype=torch.int32, device=DEV)


def setup(heads, kv_heads, dim, seed=0, extra=0):
    gen = torch.Generator(device=DEV).manual_seed(seed)
    slots_total = LENGTH + extra + 16
    k = torch.randn(slots_total, 1, kv_heads, dim, generator=gen, device=DEV).to(torch.bfloat16)
    v = torch.randn(slots_total, 1, kv_heads, dim, generator=gen, device=DEV).to(torch.bfloat16)
    q = torch.randn(LENGTH, heads, dim, generator=gen, device=DEV).to(torch.bfloat16)
    slots = torch.randperm(slots_total, generator=gen, device=DEV).to(torch.int32)
    return q, k, v, slots


def f32(rows, q):
    return torch.empty(rows, q.shape[1], q.shape[2], device=DEV)


def run(q, k, v, split):
    return split_attention(q, k, v, split, q.shape[-1] ** -0.5, out=f32(split.has_prefix.shape[0], q))


def rows_apart(a, b) -> list[int]:
    return (a.view(torch.int32) != b.view(torch.int32)).flatten(1).any(1).nonzero().flatten().tolist()


def decode(q, k, v, slots, positions):
    """Row j: the decode of position ``positions[j]`` (its keys ``slots[:p + 1]``), all in one batch."""
    pos = torch.tensor(positions, **I32)
    width = int(pos.max()) + 1
    table = slots[:width].unsqueeze(0).expand(len(positions), width).contiguous()
    return run(q[pos.long()], k, v, ps.decode_split(table, pos + 1))


def extend(q, k, v, slots, start, n):
    """Rows ``start .. start + n - 1`` as one extend after ``start`` cached keys."""
    split = ps.extend_split(slots[:start + n].unsqueeze(0), torch.tensor([start], **I32),
                            torch.tensor([n], **I32), n, n)
    return run(q[start:start + n], k, v, split)


@pytest.fixture(scope="module", params=SHAPES, ids=lambda s: f"{s[0]}x{s[1]}x{s[2]}")
def case(request):
    heads, kv_heads, dim = request.param
    q, k, v, slots = setup(heads, kv_heads, dim, extra=48)  # 48 slots for tree nodes
    return q, k, v, slots, decode(q, k, v, slots, list(range(LENGTH)))


def test_decode_equals_one_prefill_row_by_row(case):
    q, k, v, slots, dec = case
    assert rows_apart(dec, extend(q, k, v, slots, 0, LENGTH)) == []


def test_decode_is_batch_invariant(case):
    q, k, v, slots, dec = case
    order = torch.randperm(LENGTH, generator=torch.Generator().manual_seed(1)).tolist()
    permuted = decode(q, k, v, slots, order)
    assert rows_apart(permuted, dec[torch.tensor(order)]) == []
    for p in (0, D, D + 1, D + B - 1, D + B, D + 2 * B, 700, LENGTH - 1):
        p = min(p, LENGTH - 1)
        assert rows_apart(decode(q, k, v, slots, [p]), dec[p:p + 1]) == [], p


def test_a_short_prefill_runs_the_tail_alone_and_equals_decode(case):
    """Tables of at most D + B columns drop the prefix call (ops.prefix_split.prefix_free): its rows must be the
    full split's rows bit for bit (the decode's table is the sequence's width)."""
    q, k, v, slots, dec = case
    for n in (1, 100, D + B):
        split = ps.extend_split(slots[:n].unsqueeze(0), torch.zeros(1, **I32), torch.tensor([n], **I32), n, n)
        assert split.prefix is None
        assert rows_apart(run(q[:n], k, v, split), dec[:n]) == [], n
        # FA3 writing straight into an output buffer of q's dtype (a server's path): the tail's bf16 rows.
        direct = torch.empty(n, q.shape[1], q.shape[2], dtype=q.dtype, device=DEV)
        assert split_attention(q[:n], k, v, split, q.shape[-1] ** -0.5, out=direct) is direct
        assert rows_apart(direct.float(), dec[:n]) == [], n
    pos = [0, 5, D + B - 1]
    short = ps.decode_split(slots[:D + B].unsqueeze(0).expand(3, D + B).contiguous(), torch.tensor(pos, **I32) + 1)
    assert short.prefix is None
    assert rows_apart(run(q[torch.tensor(pos, device=DEV)], k, v, short), dec[pos]) == []


@pytest.mark.parametrize("chunk", [100, 256, 300])
def test_chunked_prefill_equals_decode(case, chunk):
    q, k, v, slots, dec = case
    rows = torch.cat([extend(q, k, v, slots, lo, min(chunk, LENGTH - lo)) for lo in range(0, LENGTH, chunk)])
    assert rows_apart(rows, dec) == []


def test_chain_verifies_equal_decode(case):
    q, k, v, slots, dec = case
    starts = sorted({0, 1, D - 3, D, D + B - 3, D + B - 1, D + B, D + 2 * B - 2, *range(5, LENGTH - 4, 37)})
    n = 4
    table = slots[:LENGTH].unsqueeze(0).expand(len(starts), LENGTH).contiguous()
    split = ps.extend_split(table, torch.tensor(starts, **I32), torch.full((len(starts),), n, **I32), n,
                            n * len(starts))
    rows = run(torch.cat([q[s:s + n] for s in starts]), k, v, split)
    want = torch.cat([dec[s:s + n] for s in starts])
    assert rows_apart(rows, want) == []


def tree_case(slots, n, max_depth, seed):
    """A batch of trees: request b's prefix ``slots[:P_b]``, its nodes in slots after the sequence's; node queries."""
    gen = random.Random(seed)
    prefixes = [min(gen.choice([3, D + B - 2, D + B + 5, 2 * B + D - 20, 700, LENGTH - 80]), LENGTH - 80)
                for _ in range(6)]
    node_slots = slots[LENGTH:LENGTH + n].tolist()
    anc, keys, queries = [], [], []
    for b, p in enumerate(prefixes):
        parents, depth = [-1], [0]
        for _ in range(1, n):
            par = gen.choice([i for i in range(len(parents)) if depth[i] < max_depth])
            parents.append(par)
            depth.append(depth[par] + 1)
        for i in range(n):
            path, j = [], i
            while j >= 0:
                path.append(j)
                j = parents[j]
            anc.append([node_slots[j] for j in path[::-1]])
            keys.append(slots[:p].tolist() + anc[-1])
            queries.append((b * 131 + i * 17) % LENGTH)
    return prefixes, anc, keys, queries


def table_of(lists):
    width = max(len(x) for x in lists)
    t = torch.zeros(len(lists), width, **I32)
    for i, x in enumerate(lists):
        t[i, :len(x)] = torch.tensor(x, **I32)
    return t


@pytest.mark.parametrize("n, max_depth, seed", [(8, 3, 0), (16, 6, 1), (40, D, 2)])
def test_tree_nodes_equal_their_path_decode(case, n, max_depth, seed):
    q, k, v, slots, _ = case
    prefixes, anc, keys, queries = tree_case(slots, n, max_depth, seed)
    qn = q[torch.tensor(queries, device=DEV)]
    split = ps.tree_split(table_of([slots[:p].tolist() or [0] for p in prefixes]), torch.tensor(prefixes, **I32),
                          table_of(anc), torch.tensor([len(a) for a in anc], **I32), n)
    tree = run(qn, k, v, split)
    dec = run(qn, k, v, ps.decode_split(table_of(keys), torch.tensor([len(x) for x in keys], **I32)))
    assert rows_apart(tree, dec) == []


def own_rows(slots, rows: int, seed: int) -> torch.Tensor:
    """int32 ``[rows, LENGTH]``: each row its own order of the sequence's slots (row 0 the sequence's own)."""
    gen = torch.Generator(device=DEV).manual_seed(seed)
    perms = [torch.arange(LENGTH, device=DEV)] + [torch.randperm(LENGTH, generator=gen, device=DEV)
                                                 for _ in range(rows - 1)]
    return torch.stack([slots[:LENGTH][p] for p in perms]).contiguous()


def test_a_prefix_call_through_row_indices_equals_one_on_copied_rows(case):
    """FA3's ``cache_batch_idx`` only addresses the page table: the same bits as a table with a row per element."""
    q, k, v, slots, _ = case
    starts = [0, D + B - 3, 300, 700]
    n = 300
    table = own_rows(slots, len(starts), seed=4)  # a row read through the wrong index gives other keys
    split = ps.extend_split(table, torch.tensor(starts, **I32), torch.full((len(starts),), n, **I32), n,
                            n * len(starts))
    indexed = split.prefix
    copied = dataclasses.replace(indexed, page_table=table.index_select(0, indexed.table_rows.long()),
                                 table_rows=None)
    qs = torch.cat([q[s:s + n] for s in starts])
    o1, l1 = fa3_part(qs, k, v, indexed, q.shape[-1] ** -0.5)
    o2, l2 = fa3_part(qs, k, v, copied, q.shape[-1] ** -0.5)
    m = split.has_prefix  # rows with prefix keys (FA3 need not write the others)
    assert int(m.sum()) > 0
    assert torch.equal(o1[m].view(torch.int16), o2[m].view(torch.int16))
    assert torch.equal(l1[:, m].view(torch.int32), l2[:, m].view(torch.int32))


def test_cuda_graph_replays_equal_eager(case):
    q, k, v, slots, dec = case
    bs = 48
    table = torch.zeros(bs, LENGTH, **I32)
    lens = torch.ones(bs, **I32)
    qb = torch.zeros(bs, q.shape[1], q.shape[2], dtype=q.dtype, device=DEV)
    out = f32(bs, q)

    def step():
        split_attention(qb, k, v, ps.decode_split(table, lens), q.shape[-1] ** -0.5, out=out)

    step()  # compile and warm outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    gen = torch.Generator().manual_seed(3)
    for _ in range(3):
        pos = torch.randint(0, LENGTH, (bs,), generator=gen).to(DEV)
        table.copy_(slots[:LENGTH].unsqueeze(0).expand(bs, LENGTH))
        lens.copy_((pos + 1).to(torch.int32))
        qb.copy_(q[pos])
        graph.replay()
        torch.cuda.synchronize()
        assert rows_apart(out, dec[pos]) == []


@pytest.mark.parametrize("mode", ["chain", "tree"])
def test_verify_layouts_built_inside_a_capture_replay_as_their_decode(case, mode):
    """A verify's layout (row-indexed prefix calls included) captured once, replayed with other requests' data."""
    q, k, v, slots, dec = case
    bs, n = 6, (4 if mode == "chain" else 8)
    table = torch.zeros(bs, LENGTH, **I32)
    prefix = torch.ones(bs, **I32)
    anc = torch.zeros(bs * n, n, **I32)
    anc_lens = torch.ones(bs * n, **I32)
    qb = torch.zeros(bs * n, q.shape[1], q.shape[2], dtype=q.dtype, device=DEV)
    out = f32(bs * n, q)

    def step():
        if mode == "chain":
            split = ps.extend_split(table, prefix, torch.full((bs,), n, **I32), n, bs * n)
        else:
            split = ps.tree_split(table, prefix, anc, anc_lens, n)
        split_attention(qb, k, v, split, q.shape[-1] ** -0.5, out=out)

    step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for seed in range(3):
        if mode == "chain":
            gen = random.Random(seed)
            starts = [gen.choice([0, D - 2, D + B - 3, D + B, 500, LENGTH - n]) for _ in range(bs)]
            table.copy_(own_rows(slots, bs, seed))  # each request its own slots: a mis-addressed row shows
            prefix.copy_(torch.tensor(starts, **I32))
            qb.copy_(torch.cat([q[s:s + n] for s in starts]))
            rows = [(b, s + i) for b, s in enumerate(starts) for i in range(n)]
            want = run(qb.clone(), k, v, ps.decode_split(table[torch.tensor([b for b, _ in rows], device=DEV)],
                                                         torch.tensor([p + 1 for _, p in rows], **I32)))
        else:
            prefixes, paths, _, queries = tree_case(slots, n, 3, seed)
            table.copy_(own_rows(slots, bs, seed))  # each request its own prefix slots
            keys = [table[b, :p].tolist() + paths[b * n + i] for b, p in enumerate(prefixes) for i in range(n)]
            prefix.copy_(torch.tensor(prefixes, **I32))
            anc.zero_()
            for r, a in enumerate(paths):
                anc[r, :len(a)] = torch.tensor(a, **I32)
            anc_lens.copy_(torch.tensor([len(a) for a in paths], **I32))
            qb.copy_(q[torch.tensor(queries, device=DEV)])
            want = run(qb.clone(), k, v, ps.decode_split(table_of(keys), torch.tensor([len(x) for x in keys], **I32)))
        graph.replay()
        torch.cuda.synchronize()
        assert rows_apart(out, want) == [], seed


def test_values_are_attention(case):
    q, k, v, slots, dec = case
    one = torch.tensor([0, LENGTH], **I32)
    ref = fa.flash_attn_with_kvcache(q=q, k_cache=k, v_cache=v, page_table=slots[:LENGTH].unsqueeze(0),
                                     cache_seqlens=torch.tensor([LENGTH], **I32), cu_seqlens_q=one,
                                     cu_seqlens_k_new=one, max_seqlen_q=LENGTH, softmax_scale=q.shape[-1] ** -0.5,
                                     causal=True, num_splits=1, ver=3)
    assert torch.allclose(dec, ref.float(), atol=2e-2, rtol=2e-2)


def test_positive_controls_can_fail():
    # SGLang's own calls at head size 64: one-row causal decode against one causal prefill part rows.
    q, k, v, slots = setup(4, 4, 64, seed=5)
    one = torch.tensor([0, LENGTH], **I32)
    pre = fa.flash_attn_with_kvcache(q=q, k_cache=k, v_cache=v, page_table=slots[:LENGTH].unsqueeze(0),
                                     cache_seqlens=torch.tensor([LENGTH], **I32), cu_seqlens_q=one,
                                     cu_seqlens_k_new=one, max_seqlen_q=LENGTH, softmax_scale=0.125, causal=True,
                                     num_splits=1, ver=3)
    table = slots[:LENGTH].unsqueeze(0).expand(LENGTH, LENGTH).contiguous()
    dec = fa.flash_attn_with_kvcache(q=q, k_cache=k, v_cache=v, page_table=table,
                                     cache_seqlens=torch.arange(1, LENGTH + 1, **I32),
                                     cu_seqlens_q=torch.arange(LENGTH + 1, **I32), max_seqlen_q=1, softmax_scale=0.125,
                                     causal=True, num_splits=1, ver=3)
    assert rows_apart(pre.float(), dec.float()) != []
    # The same two parts merged the other way round (tail weighed first) part rows: the merge order shows.
    split = ps.decode_split(table, torch.arange(1, LENGTH + 1, **I32))
    o1, l1 = fa3_part(q, k, v, split.prefix, 0.125)
    o2, l2 = fa3_part(q, k, v, split.tail, 0.125)
    out = f32(LENGTH, q)
    ps.merge_parts(o1, l1, o2, l2, split.has_prefix, out=out)
    has = split.has_prefix.view(-1, 1, 1)
    l1t = torch.where(has[:, :, 0], l1.T, float("-inf")).unsqueeze(-1)
    l2t = l2.T.unsqueeze(-1)
    m = torch.maximum(l1t, l2t)
    w1, w2 = torch.exp(l1t - m), torch.exp(l2t - m)
    # Weights normalised before the products: the same mathematics, other roundings.
    swapped = torch.where(has, o1.float() * (w1 / (w1 + w2)), 0.0) + o2.float() * (w2 / (w1 + w2))
    assert rows_apart(out, swapped) != []



@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}x{s[2]}")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_the_start_up_check_passes_on_this_gpu(shape, dtype):
    """Every FA3 server with the split (the default) runs this check at start-up; where it fails it keeps
    SGLang's calls, so a failure here would silently take the split away."""
    from sglang_detspec.sglang_plugin.fa3_split import split_modes_agree

    heads, kv_heads, dim = shape
    assert split_modes_agree(heads, kv_heads, dim, dtype, torch.device(DEV))


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
