"""The prefix / tail split (ops/prefix_split.py) on CPU: its layouts, its merge, its reference, its errors.

What the CPU can prove: every forward mode's layout hands each query row the
same two key lists, ``[0, S(L))`` and ``[S(L), L)`` of the row's own keys, in
the same order (checked entry by entry against the row's key list, built
independently here); through the torch statement of the kernel's contract
(``part_call_reference``, each row computed alone), decode, one prefill, a
chunked prefill, a chain verify and each tree node's verify therefore give a
row the same float32 bits, and the merged result is softmax attention over
all the row's keys (float64 oracle). The fused merge kernel runs under
Triton's interpreter against its torch statement. That FA3 gives a row the
same bits whatever else shares its call is the GPU suite's to prove
(``test/registered/cuda/test_fa3_split_cuda.py``).
"""

import json
import random
import sys

import pytest
import torch
from sglang.test.ci.ci_register import register_cpu_ci

from _interpreter import run_interpreted

from sglang_detspec.ops import prefix_split as ps
from sglang_detspec.ops.split_limits import PREFIX_SPLIT_BLOCK as B
from sglang_detspec.ops.split_limits import PREFIX_SPLIT_DEPTH as D
from sglang_detspec.ops.split_limits import PREFIX_SPLIT_TAIL_KEYS

register_cpu_ci(est_time=60, suite="detspec-unit-cpu")


def split_key(length: int) -> int:
    """S(L) by its definition, integers only (the oracle for ``ps.split_point``)."""
    return B * (max(length - 1 - D, 0) // B)


def call_keys(call: ps.PartCall, call_row: int) -> list[int]:
    """The key slots one call row reads, by the kernel's contract (element, length, causal alignment)."""
    cu = call.cu_seqlens_q.tolist()
    e = next(i for i in range(len(cu) - 1) if cu[i] <= call_row < cu[i + 1])
    n = int(call.seqlens[e])
    seen = n - (cu[e + 1] - 1 - call_row) if call.causal else n
    t = e if call.table_rows is None else int(call.table_rows[e])
    return call.page_table[t, :max(seen, 0)].tolist()


def check_rows(split: ps.PrefixSplit, row_keys: list[list[int]]):
    """Each output row r reads row_keys[r][:S] as its prefix part and row_keys[r][S:] as its tail."""
    assert split.has_prefix.shape[0] >= len(row_keys)
    for r, keys in enumerate(row_keys):
        s = split_key(len(keys))
        assert bool(split.has_prefix[r]) == (s > 0), r
        tail = call_keys(split.tail, r)
        assert tail == keys[s:], (r, len(keys), s)
        assert len(tail) <= PREFIX_SPLIT_TAIL_KEYS
        if s > 0:
            call_row = r if split.prefix_index is None else int(split.prefix_index[r])
            q_row = call_row if split.prefix.rows is None else int(split.prefix.rows[call_row])
            assert q_row == r, (r, q_row)  # the prefix call's row holds this row's query
            assert call_keys(split.prefix, call_row) == keys[:s], r


def table_of(lists: list[list[int]], width: int | None = None) -> torch.Tensor:
    width = width or max(1, max(len(x) for x in lists))
    t = torch.zeros(len(lists), width, dtype=torch.int32)
    for i, x in enumerate(lists):
        t[i, :len(x)] = torch.tensor(x, dtype=torch.int32)
    return t


def test_split_point_matches_its_definition_and_bounds_the_tail():
    lengths = torch.arange(1, 3000, dtype=torch.int32)
    got = ps.split_point(lengths).tolist()
    for length, s in zip(lengths.tolist(), got):
        assert s == split_key(length)
        assert s % B == 0 and 1 <= length - s <= PREFIX_SPLIT_TAIL_KEYS
    assert ps.split_point(lengths).dtype == torch.int32


def random_sequences(gen: random.Random, bs: int, max_len: int) -> list[list[int]]:
    """Each request's cache slots: disjoint random slots of a shared pool (no slot order to lean on)."""
    lens = [gen.randint(1, max_len) for _ in range(bs)]
    pool = list(range(sum(lens) + 50))
    gen.shuffle(pool)
    out, at = [], 0
    for n in lens:
        out.append(pool[at:at + n])
        at += n
    return out


@pytest.mark.parametrize("seed", range(4))
def test_decode_rows_read_their_two_key_ranges(seed):
    gen = random.Random(seed)
    seqs = random_sequences(gen, 12, 900)
    split = ps.decode_split(table_of(seqs), torch.tensor([len(s) for s in seqs], dtype=torch.int32))
    assert split.prefix.rows is None and split.prefix_index is None
    check_rows(split, seqs)


@pytest.mark.parametrize("seed", range(6))
def test_extend_rows_read_their_two_key_ranges(seed):
    gen = random.Random(100 + seed)
    seqs = random_sequences(gen, 7, 1000)
    prefix = [gen.randint(0, len(s) - 1) for s in seqs]
    prefix[0] = 0  # a whole prefill among them
    ext = [len(s) - p for s, p in zip(seqs, prefix)]
    ext[-1] = 0  # a request with nothing to extend
    seqs[-1] = seqs[-1][:prefix[-1]] or seqs[-1][:1]
    prefix[-1] = len(seqs[-1])
    pad = seed % 3  # rows past the extend (a padded batch) are neither call's
    split = ps.extend_split(table_of(seqs), torch.tensor(prefix), torch.tensor(ext), max(ext), sum(ext) + pad)
    row_keys = [s[:p + i + 1] for s, p, n in zip(seqs, prefix, ext) for i in range(n)]
    check_rows(split, row_keys)
    assert split.has_prefix.shape[0] == sum(ext) + pad
    assert int(split.tail.cu_seqlens_q[-1]) == sum(ext)
    assert split.prefix.cu_seqlens_q.shape[0] == len(seqs) * ps.groups_per_request(max(ext)) + 1


def test_chain_verify_windows_straddling_a_split_key():
    # Draft rows at positions around a group edge (D + kB): one request's rows in two groups.
    seqs, prefix = [], []
    pool = iter(range(10 ** 6))
    for p in (0, 1, D - 2, D + B - 3, D + B, D + 2 * B - 1, 1000):
        prefix.append(p)
        seqs.append([next(pool) for _ in range(p + 4)])
    split = ps.extend_split(table_of(seqs), torch.tensor(prefix), torch.full((len(seqs),), 4), 4, 4 * len(seqs))
    check_rows(split, [s[:p + i + 1] for s, p in zip(seqs, prefix) for i in range(4)])


def test_a_table_too_narrow_for_a_prefix_part_drops_the_prefix_call():
    # S(L) = 0 up to L = D + B keys, and no row reads past its table's width.
    assert split_key(D + B) == 0 and split_key(D + B + 1) == B
    for width, free in ((1, True), (D + B, True), (D + B + 1, False), (5000, False)):
        table = torch.zeros(3, width, dtype=torch.int32)
        lens = torch.full((3,), width, dtype=torch.int32)
        assert ps.prefix_free(table) is free
        assert (ps.decode_split(table, lens).prefix is None) is free
        assert (ps.extend_split(table, lens - 1, torch.ones(3, dtype=torch.int32), 1, 3).prefix is None) is free
    # Trees keep their prefix call (their nodes' keys run past the prefix table).
    tree = ps.tree_split(torch.zeros(1, 10, dtype=torch.int32), torch.tensor([10]),
                         torch.zeros(2, 2, dtype=torch.int32), torch.tensor([1, 2], dtype=torch.int32), 2)
    assert tree.prefix is not None


def test_prefix_calls_read_the_callers_table_without_a_copy():
    # A long context beside a chunk: a row per split group would copy the table (requests x groups) times.
    table = torch.arange(4 * 5000, dtype=torch.int32).view(4, 5000)
    split = ps.extend_split(table, torch.tensor([4000, 10, 0, 4990]), torch.tensor([1000, 900, 512, 10]), 1000, 2422)
    assert split.prefix.page_table.data_ptr() == table.data_ptr()
    g = ps.groups_per_request(1000)
    assert split.prefix.table_rows.tolist() == [b for b in range(4) for _ in range(g)]
    assert split.prefix.table_rows.dtype == torch.int32 and split.prefix.table_rows.is_contiguous()
    tree = ps.tree_split(table, torch.tensor([4000, 3, 300, 4900]), torch.zeros(4 * 5, 2, dtype=torch.int32),
                         torch.ones(4 * 5, dtype=torch.int32), 5)
    assert tree.prefix.page_table.data_ptr() == table.data_ptr()
    assert tree.prefix.table_rows.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    # The tails keep a copy of at most PREFIX_SPLIT_TAIL_KEYS slots per element, whatever the context.
    assert split.tail.page_table.shape == (4 * g, PREFIX_SPLIT_TAIL_KEYS)
    assert split.tail.table_rows is None and tree.tail.table_rows is None


def random_tree(gen: random.Random, n: int, max_depth: int) -> list[int]:
    """Parents of n nodes in SGLang's order (a parent precedes its children), node 0 the root."""
    parents, depth = [-1], [0]
    for _ in range(1, n):
        cands = [i for i in range(len(parents)) if depth[i] < max_depth]
        p = gen.choice(cands)
        parents.append(p)
        depth.append(depth[p] + 1)
    return parents


def paths(parents: list[int]) -> list[list[int]]:
    out = []
    for i in range(len(parents)):
        path, j = [], i
        while j >= 0:
            path.append(j)
            j = parents[j]
        out.append(path[::-1])
    return out


@pytest.mark.parametrize("seed, n, max_depth", [(0, 8, 3), (1, 16, 7), (2, 40, D), (3, 5, 1)])
def test_tree_nodes_read_the_ranges_of_their_paths_decode(seed, n, max_depth):
    gen = random.Random(seed)
    bs = 6
    prefixes = [gen.choice([1, 5, D, D + 1, B + D - 3, B + D + 1, 700, 2 * B + D - 40]) for _ in range(bs)]
    slot = iter(gen.sample(range(10 ** 6), sum(prefixes) + bs * n))
    prefix_slots = [[next(slot) for _ in range(p)] for p in prefixes]
    node_slots = [[next(slot) for _ in range(n)] for _ in range(bs)]
    anc, keys = [], []
    for b in range(bs):
        parents = random_tree(gen, n, max_depth)
        for path in paths(parents):
            anc.append([node_slots[b][j] for j in path])
            keys.append(prefix_slots[b] + anc[-1])
    split = ps.tree_split(table_of(prefix_slots), torch.tensor(prefixes), table_of(anc, n),
                          torch.tensor([len(a) for a in anc], dtype=torch.int32), n)
    check_rows(split, keys)
    # The prefix call: two elements per request, each node's query in one, no row twice.
    assert split.prefix.cu_seqlens_q.shape[0] == 2 * bs + 1
    assert sorted(split.prefix.rows.tolist()) == list(range(bs * n))


# --- numerics through the torch statement of the kernel's contract ---

HEADS, KV_HEADS, DIM = 4, 2, 16


def kv_pool(slots: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    k = torch.randn(slots, KV_HEADS, DIM, generator=gen).to(torch.bfloat16)
    v = torch.randn(slots, KV_HEADS, DIM, generator=gen).to(torch.bfloat16)
    return k, v


def attention_oracle(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """float64 softmax attention of one query row ``[heads, d]`` over ``[n, kv_heads, d]``."""
    group = q.shape[0] // k.shape[1]
    kk = k.double().repeat_interleave(group, 1)
    vv = v.double().repeat_interleave(group, 1)
    w = torch.softmax(torch.einsum("hd,nhd->hn", q.double(), kk) * scale, dim=1)
    return torch.einsum("hn,nhd->hd", w, vv)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.float().contiguous().view(torch.int32)


def test_every_mode_gives_a_row_the_same_bits_through_the_reference():
    length, scale = 460, DIM ** -0.5
    k, v = kv_pool(length + 64, 7)
    gen = torch.Generator().manual_seed(8)
    seq = torch.randperm(length + 64, generator=gen)[:length].tolist()
    q = torch.randn(length, HEADS, DIM, generator=gen).to(torch.bfloat16)
    # Decode: one request per position, its token last.
    dec = ps.prefix_split_reference(
        q, k, v, ps.decode_split(table_of([seq[:p + 1] for p in range(length)]),
                                 torch.arange(1, length + 1, dtype=torch.int32)), scale)
    # One prefill of every row.
    pre = ps.prefix_split_reference(
        q, k, v, ps.extend_split(table_of([seq]), torch.tensor([0]), torch.tensor([length]), length, length), scale)
    assert torch.equal(bits(dec), bits(pre))
    # A chunked prefill: chunks of 150 rows after the cached ones.
    chunks = []
    for start in range(0, length, 150):
        n = min(150, length - start)
        split = ps.extend_split(table_of([seq[:start + n]]), torch.tensor([start]), torch.tensor([n]), n, n)
        chunks.append(ps.prefix_split_reference(q[start:start + n], k, v, split, scale))
    assert torch.equal(bits(torch.cat(chunks)), bits(dec))
    # A short prefill (every row below the first split key): the tail call alone, rows as the decode's.
    short = ps.extend_split(table_of([seq[:D + B]]), torch.tensor([0]), torch.tensor([D + B]), D + B, D + B)
    assert short.prefix is None
    assert torch.equal(bits(ps.prefix_split_reference(q[:D + B], k, v, short, scale)), bits(dec[:D + B]))
    # Chain verifies of 5 rows, a batch of windows (one request each).
    starts = [0, D - 2, D + B - 2, 300, length - 5]
    split = ps.extend_split(table_of([seq[:s + 5] for s in starts]), torch.tensor(starts), torch.full((5,), 5), 5, 25)
    ver = ps.prefix_split_reference(torch.cat([q[s:s + 5] for s in starts]), k, v, split, scale)
    assert torch.equal(bits(ver), bits(torch.cat([dec[s:s + 5] for s in starts])))
    # The merge is attention over all the row's keys.
    for p in (0, D, D + B, length - 1):
        want = attention_oracle(q[p], k[seq[:p + 1]], v[seq[:p + 1]], scale)
        assert torch.allclose(dec[p].double(), want, atol=1e-5), p


def test_tree_nodes_get_their_path_decodes_bits_through_the_reference():
    scale, n, bs = DIM ** -0.5, 10, 4
    gen = random.Random(3)
    k, v = kv_pool(5000, 11)
    tq = torch.Generator().manual_seed(12)
    prefixes = [D + B - 2, 3, 2 * B + D - 5, 500]
    slot = iter(gen.sample(range(5000), sum(prefixes) + bs * n))
    prefix_slots = [[next(slot) for _ in range(p)] for p in prefixes]
    node_slots = [[next(slot) for _ in range(n)] for _ in range(bs)]
    anc, keys = [], []
    for b in range(bs):
        for path in paths(random_tree(gen, n, 4)):
            anc.append([node_slots[b][j] for j in path])
            keys.append(prefix_slots[b] + anc[-1])
    q = torch.randn(bs * n, HEADS, DIM, generator=tq).to(torch.bfloat16)
    split = ps.tree_split(table_of(prefix_slots), torch.tensor(prefixes), table_of(anc, n),
                          torch.tensor([len(a) for a in anc], dtype=torch.int32), n)
    tree = ps.prefix_split_reference(q, k, v, split, scale)
    dec = ps.prefix_split_reference(
        q, k, v, ps.decode_split(table_of(keys), torch.tensor([len(x) for x in keys], dtype=torch.int32)), scale)
    assert torch.equal(bits(tree), bits(dec))


def test_the_merge_leaves_a_missing_prefix_out_exactly():
    gen = torch.Generator().manual_seed(1)
    o2 = torch.randn(3, 2, 8, generator=gen).to(torch.bfloat16)
    l2 = torch.randn(2, 3, generator=gen)
    o1 = torch.full((3, 2, 8), float("nan")).to(torch.bfloat16)
    l1 = torch.randn(2, 3, generator=gen)
    out = ps.merge_parts(o1, l1, o2, l2, torch.zeros(3, dtype=torch.bool))
    assert torch.equal(out, o2)
    # A row neither call covered (no keys in either part): 0, not NaN.
    l2[:, 1] = float("-inf")
    out = ps.merge_parts(o1, l1, o2, l2, torch.zeros(3, dtype=torch.bool))
    assert torch.equal(out[1], torch.zeros_like(out[1]))


def test_bad_arguments_are_named():
    o = torch.zeros(3, 2, 8)
    lse = torch.zeros(2, 3)
    has = torch.ones(3, dtype=torch.bool)
    with pytest.raises(ValueError, match="o_prefix"):
        ps.merge_parts(torch.zeros(3, 2, 4), lse, o, lse, has)
    with pytest.raises(ValueError, match="lse_prefix"):
        ps.merge_parts(o, torch.zeros(3, 2), o, lse, has)
    with pytest.raises(ValueError, match="has_prefix"):
        ps.merge_parts(o, lse, o, lse, has[:2])
    with pytest.raises(ValueError, match="share a dtype"):
        ps.merge_parts(o.half(), lse, o, lse, has)
    with pytest.raises(ValueError, match="kernel"):
        ps.merge_parts(o, lse, o, lse, has, kernel="cuda")
    with pytest.raises(ValueError, match="max_rows"):
        ps.groups_per_request(0)
    with pytest.raises(ValueError, match="batch size"):
        ps.extend_split(torch.zeros(2, 4, dtype=torch.int32), torch.zeros(3), torch.zeros(2), 1, 1)
    with pytest.raises(ValueError, match="ancestor_table"):
        ps.tree_split(torch.zeros(2, 4, dtype=torch.int32), torch.zeros(2), torch.zeros(3, 2, dtype=torch.int32),
                      torch.ones(4), 2)


MERGE_SCRIPT = r'''
import json
import torch
from sglang_detspec.ops import prefix_split as ps
from sglang_detspec.ops.prefix_split_triton import merge_parts_triton

gen = torch.Generator().manual_seed(5)
result = {}
for dv, dtype in ((64, torch.float16), (40, torch.float16), (128, torch.float32)):
    rows, heads = 37, 3
    prow = rows
    o1 = torch.randn(prow, heads, dv, generator=gen).to(dtype)
    l1 = (torch.randn(heads, prow, generator=gen) * 4)
    o2 = torch.randn(rows, heads, dv, generator=gen).to(dtype)
    l2 = (torch.randn(heads, rows, generator=gen) * 4)
    has = torch.rand(rows, generator=gen) < 0.7
    idx = torch.randperm(rows, generator=gen)  # one prefix row per output row, as the layouts give
    o1[idx[~has]] = float("nan")  # never read where a row has no prefix
    l2[:, 5] = float("-inf"); has[5] = False
    got = merge_parts_triton(o1, l1, o2, l2, has, idx)
    want = ps.merge_parts_reference(o1, l1, o2, l2, has, idx)
    diff = (got.float() - want.float()).abs().max().item()
    result[f"{dv}-{dtype}"] = {"max_abs": diff, "no_prefix_exact": bool(torch.equal(got[~has], want[~has])),
                               "finite": bool(torch.isfinite(got).all())}
    # Transposed LSE views (FA3's varlen [heads, rows] read through strides) and no index.
    got2 = merge_parts_triton(o2, l2.T.contiguous().T, o2, l2, has, None)
    want2 = ps.merge_parts_reference(o2, l2, o2, l2, has, None)
    result[f"{dv}-{dtype}-strided"] = float((got2.float() - want2.float()).abs().max())
print("RESULT " + json.dumps(result))
'''


def test_the_merge_kernel_matches_its_reference_in_the_interpreter():
    done = run_interpreted(MERGE_SCRIPT, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.split("RESULT ", 1)[1])
    for dv in ("64-torch.float16", "40-torch.float16", "128-torch.float32"):
        assert result[dv]["no_prefix_exact"] and result[dv]["finite"], result
        # One rounding of the output apart at most (the interpreter's exp is numpy's, torch's its own).
        assert result[dv]["max_abs"] < (2e-3 if "16" in dv else 1e-5), result
        assert result[dv + "-strided"] < (2e-3 if "16" in dv else 1e-5), result


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
