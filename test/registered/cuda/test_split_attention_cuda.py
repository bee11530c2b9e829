"""Positional-split attention on the GPU: every row the same bits in decode, prefill, chunked prefill and verify.

``ops/split_attention.py``'s kernels, row by row on a CUDA device: each of
1,100 prefixes of one sequence decoded (one batch, in two orders, and one
request at a time) against the rows of one prefill of the whole sequence,
of a chunked prefill (chunks of 256 and 300 tokens: one aligned with the
segments, one not) and of chain verifies of 4 tokens, and each tree
node's verify rows against the decode of its path (two trees, prefixes
across segment edges, under CUDA-graph replay too); across the
attention shapes of the served models (GQA and MHA, head dims 64 / 128 /
256, bf16 and fp16), batch sizes and row permutations, and under a CUDA
graph replay of the decode. Positive controls: SGLang's own deterministic
split-KV decode against its single-pass prefill, and its tree verify
against the path decodes, part rows on the same data (the comparisons can
fail). Values: the torch reference of the same
segments within bf16 rounding.
"""

import pytest
import torch

from _register import register_cuda_ci

register_cuda_ci(est_time=60, suite="detspec-kernels-cuda")

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU (the kernels are Triton)", allow_module_level=True)

from sglang_detspec.ops import split_attention as sa  # noqa: E402

DEV = "cuda"
LENGTH = 1100  # past four segments and across 64-key tiles
# (heads, KV heads, head dim, dtype): the 8B Llama's, the tiny suite models', MHA, a group of 8 at head dim
# 256, fp16; a group of 7 at a head dim below its power-of-two block (96); one KV head for 64 query heads.
SHAPES = [(32, 8, 128, torch.bfloat16), (8, 2, 64, torch.bfloat16), (16, 16, 128, torch.bfloat16),
          (8, 1, 256, torch.bfloat16), (32, 8, 128, torch.float16), (28, 4, 96, torch.bfloat16),
          (64, 1, 64, torch.bfloat16)]


def f32(q, rows=None):
    """A float32 output for ``q``'s rows: the kernels' output before its rounding, which every comparison reads."""
    return torch.empty(q.shape[0] if rows is None else rows, q.shape[1], q.shape[2], device=DEV)


def rows_apart(a, b) -> list[int]:
    """Rows of two float32 outputs whose bit patterns differ anywhere (zero signs included)."""
    return (a.view(torch.int32) != b.view(torch.int32)).flatten(1).any(1).nonzero().flatten().tolist()


def sequence(heads, kv_heads, dim, dtype, seed=0):
    gen = torch.Generator(device=DEV).manual_seed(seed)
    k = torch.randn(LENGTH + 1, kv_heads, dim, generator=gen, device=DEV).to(dtype)
    v = torch.randn(LENGTH + 1, kv_heads, dim, generator=gen, device=DEV).to(dtype)
    slots = torch.randperm(LENGTH, generator=gen, device=DEV) + 1  # scattered cache slots, slot 0 unused
    q = torch.randn(LENGTH, heads, dim, generator=gen, device=DEV).to(dtype)
    return q, k, v, slots


def ptr(lengths):
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=DEV)


def prefill(q, k, v, slots, scale, tile_rows=sa.TILE_ROWS):
    out = f32(q)
    one = ptr([LENGTH])
    return sa.split_extend(q, out, k, v, one, one, slots, torch.zeros(1, dtype=torch.int32, device=DEV), LENGTH,
                           scale, tile_rows=tile_rows)


def chunked(q, k, v, slots, scale, chunk):
    out = f32(q)
    for lo in range(0, LENGTH, chunk):
        hi = min(LENGTH, lo + chunk)
        sa.split_extend(q[lo:hi], out[lo:hi], k, v, ptr([hi - lo]), ptr([hi]), slots[:hi],
                        torch.tensor([lo], dtype=torch.int32, device=DEV), hi - lo, scale)
    return out


def decode_prefixes(q, k, v, slots, scale, order, segs=None):
    """Row j = the decode of position ``order[j]`` (its ``order[j] + 1`` keys), the prefixes batched in that order.

    ``segs``: the scratch's segments (default: what the longest prefix needs; a server's is its context's).
    """
    n = len(order)
    lens = [r + 1 for r in order]
    indices = torch.cat([slots[:m] for m in lens])
    segs = segs or sa.segments_for(LENGTH)
    out = f32(q, n)
    sa.split_decode(q[torch.tensor(order, device=DEV)].contiguous(), out, k, v, ptr(lens), indices,
                    torch.empty(n, q.shape[1], segs, q.shape[2], device=DEV), torch.empty(n, q.shape[1], segs,
                                                                                        device=DEV), scale)
    return out


@pytest.mark.parametrize("heads, kv_heads, dim, dtype", SHAPES)
def test_decode_equals_prefill_and_chunked_prefill_row_by_row(heads, kv_heads, dim, dtype):
    q, k, v, slots = sequence(heads, kv_heads, dim, dtype)
    scale = dim ** -0.5
    whole = prefill(q, k, v, slots, scale)
    rows = list(range(LENGTH))
    for order in (rows, rows[::-1], torch.randperm(LENGTH, generator=torch.Generator().manual_seed(1)).tolist()):
        got = decode_prefixes(q, k, v, slots, scale, order)
        apart = rows_apart(got, whole[torch.tensor(order, device=DEV)])
        assert not apart, f"{len(apart)} rows apart, first {apart[:5]}"
    for chunk in (256, 300):
        apart = rows_apart(chunked(q, k, v, slots, scale, chunk), whole)
        assert not apart, f"chunk {chunk}: {len(apart)} rows apart, first {apart[:5]}"
    for r in (0, 255, 256, 257, LENGTH - 1):  # alone: a batch of one
        assert sa.same_bits(decode_prefixes(q, k, v, slots, scale, [r])[0], whole[r])
    # A scratch sized for a far longer context (a server's: its context length): the extra segments' programs
    # write nothing and the fold reads only the request's own.
    assert not rows_apart(decode_prefixes(q, k, v, slots, scale, rows, segs=4 * sa.segments_for(LENGTH)), whole)
    # The serving dtype's output is the float32 one rounded.
    rounded = sa.split_extend(q, torch.empty_like(q), k, v, ptr([LENGTH]), ptr([LENGTH]), slots,
                              torch.zeros(1, dtype=torch.int32, device=DEV), LENGTH, scale)
    assert sa.same_bits(rounded, whole.to(dtype))


@pytest.mark.parametrize("heads, kv_heads, dim, dtype", SHAPES[:2])
def test_the_128_row_extend_tile_gives_the_64_row_tiles_bits(heads, kv_heads, dim, dtype):
    """The wider extend tile (two warpgroups) must give every row the one-tile shape's bits to be usable."""
    q, k, v, slots = sequence(heads, kv_heads, dim, dtype, seed=21)
    scale = dim ** -0.5
    assert not rows_apart(prefill(q, k, v, slots, scale, tile_rows=128), prefill(q, k, v, slots, scale))


@pytest.mark.parametrize("batch", [1, 3, 16, 64])
def test_chain_verify_rows_equal_prefill_and_decode_at_every_batch_size(batch):
    """A chain's verify as SGLang's Triton backend calls it: 4 draft tokens per request, its verify mask."""
    heads, kv_heads, dim, dtype = SHAPES[0]
    q, k, v, slots = sequence(heads, kv_heads, dim, dtype, seed=batch)
    scale = dim ** -0.5
    whole = prefill(q, k, v, slots, scale)
    gen = torch.Generator().manual_seed(batch)
    prefixes = torch.randint(0, LENGTH - 4, (batch,), generator=gen).tolist()
    # Each request a prefix of the one sequence, then 4 draft tokens (their keys cached, as before a verify).
    layout, paths = sa.tree_verify_layout([-1, 0, 1, 2], prefixes, [slots[:p + 4] for p in prefixes])
    rows = torch.cat([torch.arange(p, p + 4, device=DEV) for p in prefixes])
    qv = q[rows].contiguous()
    out = sa.split_tree_verify(qv, f32(qv), k, v, max_len_extend=4, sm_scale=scale, **layout)
    assert not rows_apart(out, whole[rows])
    assert not rows_apart(out, path_decode(qv, k, v, paths, scale))


def test_decode_replayed_in_a_cuda_graph_equals_eager():
    heads, kv_heads, dim, dtype = SHAPES[0]
    q, k, v, slots = sequence(heads, kv_heads, dim, dtype, seed=7)
    scale = dim ** -0.5
    n, segs = 8, sa.segments_for(LENGTH)
    lens = [1, 64, 256, 257, 513, 700, 1000, 1100]
    indptr, indices = ptr(lens), torch.cat([slots[:m] for m in lens])
    qd = q[torch.tensor([m - 1 for m in lens], device=DEV)].contiguous()
    out = f32(qd)
    part_o = torch.empty(n, heads, segs, dim, device=DEV)
    part_lse = torch.empty(n, heads, segs, device=DEV)
    eager = sa.split_decode(qd, f32(qd), k, v, indptr, indices, part_o, part_lse, scale)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        sa.split_decode(qd, out, k, v, indptr, indices, part_o, part_lse, scale)
    out.zero_()
    graph.replay()
    assert sa.same_bits(out, eager)


def test_values_are_attention_within_bf16_rounding():
    heads, kv_heads, dim, dtype = SHAPES[0]
    q, k, v, slots = sequence(heads, kv_heads, dim, dtype, seed=3)
    whole = prefill(q, k, v, slots, dim ** -0.5)
    for r in (0, 100, 257, LENGTH - 1):
        want = sa.split_attention_reference(q[r].cpu(), k[slots[:r + 1]].cpu(), v[slots[:r + 1]].cpu(), r + 1,
                                            dim ** -0.5)
        torch.testing.assert_close(whole[r].float().cpu(), want, rtol=2e-2, atol=2e-2)


# SGLang's EAGLE numbering (a parent before its children): top-k 4 with 8 draft tokens, and a deeper tree.
TREES = {"topk4_8": (-1, 0, 0, 0, 0, 1, 1, 2),
         "deep_16": (-1, 0, 0, 1, 1, 2, 3, 3, 4, 5, 6, 7, 8, 9, 12, 13),
         "wide_40": tuple([-1] + [(i - 1) // 4 for i in range(1, 40)])}  # past 32 nodes: a 64-wide mask row
TREE_PREFIXES = [1, 200, 255, 256, 257, 700, 1024]


def tree_batch(parents, prefixes, seed, heads=32, kv_heads=8, dim=128, dtype=torch.bfloat16):
    """SGLang's verify layout for one tree per request, and each node's path key list (its decode's keys)."""
    n = len(parents)
    gen = torch.Generator(device=DEV).manual_seed(seed)
    slots = sum(prefixes) + n * len(prefixes) + 1
    k = torch.randn(slots, kv_heads, dim, generator=gen, device=DEV).to(dtype)
    v = torch.randn(slots, kv_heads, dim, generator=gen, device=DEV).to(dtype)
    order = torch.randperm(slots - 1, generator=gen, device=DEV) + 1
    q = torch.randn(n * len(prefixes), heads, dim, generator=gen, device=DEV).to(dtype)
    cuts = torch.tensor([p + n for p in prefixes]).cumsum(0).tolist()
    layout, lists = sa.tree_verify_layout(parents, prefixes, [order[a:b] for a, b in zip([0] + cuts[:-1], cuts)])
    return q, k, v, layout, lists


def path_decode(q, k, v, lists, scale):
    lens = [len(x) for x in lists]
    segs = sa.segments_for(max(lens))
    return sa.split_decode(q, f32(q), k, v, ptr(lens), torch.cat(lists),
                           torch.empty(len(lens), q.shape[1], segs, v.shape[2], device=DEV),
                           torch.empty(len(lens), q.shape[1], segs, device=DEV), scale)


@pytest.mark.parametrize("tree", sorted(TREES))
@pytest.mark.parametrize("reverse", [False, True])
def test_tree_verify_nodes_equal_the_decode_of_their_paths(tree, reverse):
    parents = TREES[tree]
    prefixes = TREE_PREFIXES[::-1] if reverse else TREE_PREFIXES
    q, k, v, layout, lists = tree_batch(parents, prefixes, seed=5)
    scale = 128 ** -0.5
    out = sa.split_tree_verify(q, f32(q), k, v, max_len_extend=len(parents), sm_scale=scale, **layout)
    want = path_decode(q, k, v, lists, scale)
    apart = rows_apart(out, want)
    assert not apart, f"{len(apart)} node rows apart, first {apart[:5]}"


def test_tree_verify_replayed_in_a_cuda_graph_equals_eager():
    q, k, v, layout, _ = tree_batch(TREES["topk4_8"], TREE_PREFIXES, seed=9)
    scale = 128 ** -0.5
    eager = sa.split_tree_verify(q, f32(q), k, v, max_len_extend=8, sm_scale=scale, **layout)
    out = f32(q)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        sa.split_tree_verify(q, out, k, v, max_len_extend=8, sm_scale=scale, **layout)
    out.zero_()
    graph.replay()
    assert sa.same_bits(out, eager)


def test_positive_control_sglangs_tree_verify_parts_from_the_path_decode():
    """SGLang's single-pass kernel with the tree mask (the ``tokens`` default) against the same path decodes."""
    extend_mod = pytest.importorskip("sglang.kernels.ops.attention.extend_attention", reason="needs SGLang")
    q, k, v, layout, lists = tree_batch(TREES["topk4_8"], TREE_PREFIXES, seed=13)
    scale = 128 ** -0.5
    theirs = torch.empty_like(q)
    extend_mod.extend_attention_fwd_unified(
        q, theirs, k, v, 1.0, 1.0, layout["qo_indptr"], layout["kv_indptr"], layout["kv_indices"].to(torch.int64),
        layout["prefix_lens"], 8, custom_mask=layout["custom_mask"], mask_indptr=layout["mask_indptr"],
        sm_scale=scale)
    apart = (theirs != path_decode(q, k, v, lists, scale).to(theirs.dtype)).any(-1).any(-1).sum().item()
    assert apart > 0, "SGLang's tree verify matched the path decodes everywhere: the control shows nothing"


@pytest.mark.parametrize("heads, kv_heads, dim, dtype", SHAPES)
def test_the_start_up_check_passes_on_this_gpu(heads, kv_heads, dim, dtype):
    assert sa.split_modes_agree(heads, kv_heads, dim, dim, dtype, torch.device(DEV))


def test_positive_control_sglangs_split_decode_parts_from_its_prefill():
    """The row comparison can fail: SGLang's deterministic decode (splits of 256, its own merge) against its prefill."""
    extend_mod = pytest.importorskip("sglang.kernels.ops.attention.extend_attention", reason="needs SGLang")
    decode_mod = pytest.importorskip("sglang.kernels.ops.attention.decode_attention", reason="needs SGLang")
    heads, kv_heads, dim, dtype = SHAPES[0]
    q, k, v, slots = sequence(heads, kv_heads, dim, dtype, seed=11)
    scale = dim ** -0.5
    one = ptr([LENGTH])
    whole = torch.empty_like(q)
    extend_mod.extend_attention_fwd_unified(q, whole, k, v, 1.0, 1.0, one, one, slots.to(torch.int64),
                                            torch.zeros(1, dtype=torch.int32, device=DEV), LENGTH, sm_scale=scale)
    rows = list(range(256, LENGTH))
    lens = [r + 1 for r in rows]
    segs = sa.segments_for(LENGTH)
    n = len(rows)
    out = torch.empty(n, heads, dim, dtype=dtype, device=DEV)
    decode_mod.decode_attention_fwd(
        q[256:].contiguous(), k, v, out, ptr(lens), torch.cat([slots[:m] for m in lens]).to(torch.int64),
        torch.empty(n, heads, segs, dim, device=DEV), torch.empty(n, heads, segs, device=DEV),
        torch.tensor([sa.segments_for(m) for m in lens], dtype=torch.int32, device=DEV), segs, scale, 1.0, 1.0)
    apart = (out != whole[256:]).any(-1).any(-1).sum().item()
    assert apart > 0, "SGLang's split-KV decode matched its prefill everywhere: the control shows nothing"


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__, "-v"]))
