"""The positional-split attention kernels (ops/split_attention.py) on CPU: their logic, their reference, their errors.

The kernels run here under ``TRITON_INTERPRET=1`` (in a subprocess: the
switch is read when Triton is imported) with fp16 (the interpreter has no
bf16 arithmetic). The interpreter multiplies tiles with numpy, whose BLAS
may round a row differently by its place in the matrix; the GPU's matrix
instructions do not (that is the GPU suite's to prove,
``test/registered/cuda/test_split_attention_cuda.py``). So the subprocess
makes the interpreter's tile product row by row: what is left to compare is
the kernels' own structure (which keys each row sees in which segment and
tile, the fold order), and there each request's decoded last token, its
rows in one prefill, in a chunked prefill, in an extend of its last tokens
and in a chain's verify (through SGLang's verify mask) must hold the same
bits, and a tree verify each node the bits of its path's decode. Outputs are compared in float32 (before their rounding to
fp16, which would hide most differences), bit pattern by bit pattern.
"""

import json
import sys

import pytest
import torch
from sglang.test.ci.ci_register import register_cpu_ci

from _interpreter import run_interpreted

from sglang_detspec.ops import split_attention as sa

register_cpu_ci(est_time=90, suite="detspec-unit-cpu")

SCRIPT = r'''
import json, sys
import numpy as np
import torch
from triton.runtime import interpreter as itp


def row_by_row(self, a, b, d, input_precision, max_num_imprecise_acc):
    rows = [np.matmul(a.data[i:i + 1].astype(np.float32), b.data.astype(np.float32))[0] for i in range(a.data.shape[0])]
    return itp.TensorHandle(np.stack(rows).astype(d.data.dtype) + d.data, d.dtype.scalar)


itp.InterpreterBuilder.create_dot = row_by_row
from sglang_detspec.ops import split_attention as sa

heads, kv_heads, dim, v_dim = (int(x) for x in sys.argv[1:5])
lens = [1, 64, 65, 256, 257, 513]
g = torch.Generator().manual_seed(0)
slots = sum(lens) + 1
k = torch.randn(slots, kv_heads, dim, generator=g).half()
v = torch.randn(slots, kv_heads, v_dim, generator=g).half()
order = (torch.randperm(slots - 1, generator=g) + 1).to(torch.int64)
starts = [sum(lens[:i]) for i in range(len(lens))]
q_all = torch.randn(sum(lens), heads, dim, generator=g).half()
scale = dim ** -0.5


def run(perm, tail):
    ls = [lens[i] for i in perm]
    cum = [0] + torch.tensor(ls).cumsum(0).tolist()
    indptr = torch.tensor(cum, dtype=torch.int32)
    indices = torch.cat([order[starts[i]:starts[i] + lens[i]] for i in perm])
    q = torch.cat([q_all[starts[i]:starts[i] + lens[i]] for i in perm])
    prefill = sa.split_extend(q, torch.empty(q.shape[0], heads, v_dim), k, v, indptr, indptr, indices,
                              torch.zeros(len(ls), dtype=torch.int32), max(ls), scale)
    last = torch.tensor([c - 1 for c in cum[1:]])
    segs = sa.segments_for(max(ls)) + 1  # one spare segment: the grid's extra programs must write nothing
    decode = sa.split_decode(q[last].contiguous(), torch.empty(len(ls), heads, v_dim), k, v, indptr, indices,
                             torch.full((len(ls), heads, segs, v_dim), float("nan")),
                             torch.full((len(ls), heads, segs), float("nan")), scale)
    tails = [min(tail, n) for n in ls]
    rows = torch.cat([torch.arange(c - t, c) for c, t in zip(cum[1:], tails)])
    qo = torch.tensor([0] + torch.tensor(tails).cumsum(0).tolist(), dtype=torch.int32)
    extend = sa.split_extend(q[rows].contiguous(), torch.empty(rows.numel(), heads, v_dim), k, v, qo, indptr,
                             indices, torch.tensor([n - t for n, t in zip(ls, tails)], dtype=torch.int32),
                             max(tails), scale)
    by_request = {i: prefill[cum[j]:cum[j + 1]] for j, i in enumerate(perm)}
    return prefill, decode, extend, last, rows, by_request


out = {}
prefill, decode, extend, last, rows, first = run(list(range(len(lens))), 4)
first_prefill = prefill  # the identity order: rows as in q_all
out["decode_equals_prefill"] = sa.same_bits(decode, prefill[last])
out["extend_equals_prefill"] = sa.same_bits(extend, prefill[rows])
# A chain's verify as SGLang's Triton backend calls it (its verify mask): each request's last 4 tokens as the draft.
chain = [i for i, n in enumerate(lens) if n > 4]
layout, _ = sa.tree_verify_layout([-1, 0, 1, 2], [lens[i] - 4 for i in chain],
                                  [order[starts[i]:starts[i] + lens[i]] for i in chain])
chain_rows = torch.cat([torch.arange(starts[i] + lens[i] - 4, starts[i] + lens[i]) for i in chain])
verify = sa.split_tree_verify(q_all[chain_rows].contiguous(), torch.empty(chain_rows.numel(), heads, v_dim), k, v,
                              max_len_extend=4, sm_scale=scale, **layout)
out["chain_verify_equals_prefill"] = sa.same_bits(verify, first_prefill[chain_rows])
_, _, chunk, _, chunk_rows, _ = run(list(range(len(lens))), 200)  # a chunk that starts inside a segment
out["chunk_equals_prefill"] = sa.same_bits(chunk, prefill[chunk_rows])
_, _, _, _, _, second = run(list(reversed(range(len(lens)))), 4)
indptr_all = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32)
wide = sa.split_extend(q_all, torch.empty(q_all.shape[0], heads, v_dim), k, v, indptr_all, indptr_all,
                       torch.cat([order[starts[i]:starts[i] + lens[i]] for i in range(len(lens))]),
                       torch.zeros(len(lens), dtype=torch.int32), max(lens), scale, tile_rows=128)
out["tile_128_equals_64"] = sa.same_bits(wide, prefill)
out["prefill_batch_order_free"] = all(sa.same_bits(first[i], second[i]) for i in first)
worst = 0.0
for i, n in enumerate(lens):
    keys, vals = k[order[starts[i]:starts[i] + n]], v[order[starts[i]:starts[i] + n]]
    for row in sorted({0, n // 2, n - 1}):
        want = sa.split_attention_reference(q_all[starts[i] + row], keys, vals, row + 1, scale)
        worst = max(worst, (first[i][row].float() - want).abs().max().item())
out["max_abs_vs_reference"] = worst
short = (1, 65, 257, 513)  # the interpreter is slow; the GPU check runs sa.CHECK_LENGTHS
# A tree verify (EAGLE's numbering: parents first) after prefixes on both sides of segment edges: each node's
# rows against the decode of its path.
parents = [-1, 0, 0, 1, 1, 2, 4, 6]
n_tree = len(parents)
tree_prefixes = [3, 250, 255, 256, 300]
tk = torch.randn(sum(tree_prefixes) + n_tree * len(tree_prefixes) + 1, kv_heads, dim, generator=g).half()
tv = torch.randn(tk.shape[0], kv_heads, v_dim, generator=g).half()
t_order = (torch.randperm(tk.shape[0] - 1, generator=g) + 1).to(torch.int64)
tq = torch.randn(n_tree * len(tree_prefixes), heads, dim, generator=g).half()
cuts = torch.tensor([p + n_tree for p in tree_prefixes]).cumsum(0).tolist()
layout, lists = sa.tree_verify_layout(parents, tree_prefixes,
                                      [t_order[a:b] for a, b in zip([0] + cuts[:-1], cuts)])
tree = sa.split_tree_verify(tq, torch.empty(tq.shape[0], heads, v_dim), tk, tv, max_len_extend=n_tree,
                            sm_scale=scale, **layout)
lens_t = [len(x) for x in lists]
segs = sa.segments_for(max(lens_t))
path_decode = sa.split_decode(tq, torch.empty_like(tree), tk, tv,
                              torch.tensor([0] + torch.tensor(lens_t).cumsum(0).tolist(), dtype=torch.int32),
                              torch.cat(lists), torch.empty(len(lens_t), heads, segs, v_dim),
                              torch.empty(len(lens_t), heads, segs), scale)
out["tree_nodes_equal_their_path_decode"] = sa.same_bits(tree, path_decode)
half = sa.split_tree_verify(tq, torch.empty(tq.shape[0], heads, v_dim).half(), tk, tv, max_len_extend=n_tree,
                            sm_scale=scale, **layout)
out["half_output_is_the_rounded_float32_one"] = sa.same_bits(half, tree.half())
for r in (0, 7, len(lists) - 1):
    want = sa.split_attention_reference(tq[r], tk[lists[r]], tv[lists[r]], lens_t[r], scale)
    worst = max(worst, (tree[r].float() - want).abs().max().item())
out["max_abs_vs_reference"] = worst
out["start_up_check"] = sa.split_modes_agree(heads, kv_heads, dim, v_dim, torch.float16, torch.device("cpu"),
                                             lengths=short)
true_decode = sa.split_decode
def off_by_one_bit(*args, **kwargs):
    o = true_decode(*args, **kwargs)
    o.view(torch.int32)[-1, -1, -1] ^= 1  # one bit of one float32 output
    return o
sa.split_decode = off_by_one_bit
out["start_up_check_sees_one_bit"] = not sa.split_modes_agree(heads, kv_heads, dim, v_dim, torch.float16,
                                                              torch.device("cpu"), lengths=short)
print("RESULT " + json.dumps(out))
'''


# (8, 2, 64, 64): GQA; (3, 3, 40, 24): MHA, head dims below their power-of-two blocks, v != k.
@pytest.mark.parametrize("heads, kv_heads, dim, v_dim", [(8, 2, 64, 64), (3, 3, 40, 24)])
def test_every_mode_gives_a_row_the_same_bits_in_the_interpreter(heads, kv_heads, dim, v_dim):
    done = run_interpreted(SCRIPT, str(heads), str(kv_heads), str(dim), str(v_dim), timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.split("RESULT ", 1)[1])
    for check in ("decode_equals_prefill", "extend_equals_prefill", "chain_verify_equals_prefill", "chunk_equals_prefill",
                  "prefill_batch_order_free", "tile_128_equals_64", "tree_nodes_equal_their_path_decode",
                  "half_output_is_the_rounded_float32_one", "start_up_check",
                  "start_up_check_sees_one_bit"):
        assert result[check] is True, (check, result)
    assert result["max_abs_vs_reference"] < 2e-3, result  # fp16 output rounding


@pytest.mark.parametrize("visible", [1, 2, 255, 256, 257, 700])
def test_the_reference_is_softmax_attention_over_the_visible_keys(visible):
    gen = torch.Generator().manual_seed(visible)
    q = torch.randn(4, 16, generator=gen, dtype=torch.float64)
    keys = torch.randn(800, 2, 16, generator=gen, dtype=torch.float64)
    values = torch.randn(800, 2, 8, generator=gen, dtype=torch.float64)
    got = sa.split_attention_reference(q, keys, values, visible, 0.3)
    kk, vv = keys[:visible].repeat_interleave(2, dim=1), values[:visible].repeat_interleave(2, dim=1)
    want = torch.einsum("hn,nhd->hd", (torch.einsum("hd,nhd->hn", q, kk) * 0.3).softmax(-1), vv)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def test_tree_paths_run_root_first_and_refuse_other_numberings():
    assert sa.tree_paths([-1, 0, 0, 1, 3]) == [[0], [0, 1], [0, 2], [0, 1, 3], [0, 1, 3, 4]]
    for bad in ([], [0, -1], [-1, 1], [-1, 0, 3, 0], [-1, -1]):
        with pytest.raises(ValueError, match="parents must start with -1 and number each parent before its child"):
            sa.tree_paths(bad)


def test_the_tree_layout_is_sglangs_verify_layout():
    """Mask rows of prefix + draft length, the prefix visible, each node its path; its decode keys in path order."""
    slots = [torch.arange(10, 15), torch.arange(20, 24)]  # prefixes 2 and 1, three draft tokens each
    layout, paths = sa.tree_verify_layout([-1, 0, 0], [2, 1], slots)
    assert layout["qo_indptr"].tolist() == [0, 3, 6] and layout["kv_indptr"].tolist() == [0, 5, 9]
    assert layout["prefix_lens"].tolist() == [2, 1] and layout["mask_indptr"].tolist() == [0, 15, 27]
    first = layout["custom_mask"][:15].view(3, 5).int().tolist()
    assert first == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 0, 1]]
    assert [p.tolist() for p in paths] == [[10, 11, 12], [10, 11, 12, 13], [10, 11, 12, 14], [20, 21],
                                           [20, 21, 22], [20, 21, 23]]


def test_the_reference_names_bad_arguments():
    q, kv = torch.zeros(4, 8), torch.zeros(10, 2, 8)
    with pytest.raises(ValueError, match=r"visible must be in \[1, 10\], got 0"):
        sa.split_attention_reference(q, kv, kv, 0, 1.0)
    with pytest.raises(ValueError, match=r"q heads \(4\) must be a multiple of the KV heads \(3\)"):
        sa.split_attention_reference(q, torch.zeros(10, 3, 8), kv, 5, 1.0)


@pytest.mark.parametrize("shape, reason", [
    ((8, 3, 64, 64, torch.bfloat16), r"query heads \(8\) must be a positive multiple of the KV heads \(3\)"),
    ((130, 2, 64, 64, torch.bfloat16), "65 query heads per KV head: the decode tile holds at most 64"),
    ((8, 2, 512, 64, torch.bfloat16), r"head_dim must be in \[1, 256\], got 512"),
    ((8, 2, 64, 0, torch.bfloat16), r"v_head_dim must be in \[1, 256\], got 0"),
    ((8, 2, 64, 64, torch.float32), "dtype must be bfloat16 or float16, got torch.float32"),
])
def test_shapes_out_of_scope_are_named(shape, reason):
    import re

    assert re.fullmatch(reason, sa.unsupported(*shape))


def test_shapes_in_scope_pass():
    assert sa.unsupported(32, 8, 128, 128, torch.bfloat16) is None
    assert sa.unsupported(64, 1, 256, 256, torch.float16) is None
    assert sa.segments_for(1) == 1 and sa.segments_for(256) == 1 and sa.segments_for(257) == 2


def _args(n=2, heads=4, kv_heads=2, dim=16, dtype=torch.float16):
    q = torch.zeros(n, heads, dim, dtype=dtype)
    kv = torch.zeros(8, kv_heads, dim, dtype=dtype)
    return q, torch.empty_like(q), kv, kv.clone()


def test_the_ops_refuse_bad_arguments_before_any_launch():
    q, o, k, v = _args()
    indptr, idx = torch.tensor([0, 1, 2], dtype=torch.int32), torch.tensor([1, 2])
    with pytest.raises(ValueError, match="must share a dtype"):
        sa.split_extend(q.bfloat16(), o, k, v, indptr, indptr, idx, torch.zeros(2, dtype=torch.int32), 1, 1.0)
    with pytest.raises(ValueError, match="must be 3-D"):
        sa.split_extend(q[0], o, k, v, indptr, indptr, idx, torch.zeros(2, dtype=torch.int32), 1, 1.0)
    with pytest.raises(ValueError, match=r"o must be \[2, 4, 16\]"):
        sa.split_extend(q, o[:, :2], k, v, indptr, indptr, idx, torch.zeros(2, dtype=torch.int32), 1, 1.0)
    with pytest.raises(ValueError, match=r"tile_rows must be one of 64 or 128, got 32"):
        sa.split_extend(q, o, k, v, indptr, indptr, idx, torch.zeros(2, dtype=torch.int32), 1, 1.0, tile_rows=32)
    with pytest.raises(ValueError, match="max_len_extend must be an int >= 1, got 0"):
        sa.split_extend(q, o, k, v, indptr, indptr, idx, torch.zeros(2, dtype=torch.int32), 0, 1.0)
    with pytest.raises(ValueError, match="q's last dimension must be contiguous"):
        sa.split_extend(q.transpose(0, 2).contiguous().transpose(0, 2), o, k, v, indptr, indptr, idx,
                        torch.zeros(2, dtype=torch.int32), 1, 1.0)
    with pytest.raises(ValueError, match="part_o and part_lse must be float32"):
        sa.split_decode(q, o, k, v, indptr, idx, torch.zeros(2, 4, 1, 16, dtype=torch.float16),
                        torch.zeros(2, 4, 1), 1.0)
    with pytest.raises(ValueError, match=r"part_o must be \[>= 2, 4, S, >= 16\] and part_lse \[>= 2, 4, >= S\]"):
        sa.split_decode(q, o, k, v, indptr, idx, torch.zeros(2, 4, 2, 16), torch.zeros(2, 4, 1), 1.0)
    with pytest.raises(ValueError, match="must be a positive multiple"):
        sa.split_modes_agree(4, 3, 16, 16, torch.float16, torch.device("cpu"))
    with pytest.raises(ValueError, match=r"lengths must be key counts >= 1, got \(0, 5\)"):
        sa.split_modes_agree(4, 2, 16, 16, torch.float16, torch.device("cpu"), lengths=(0, 5))


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
