"""FA3 tree verify as one decode query per node: bitwise equal to the decode step of each node's token.

``ops.node_rows.node_key_lists`` turns SGLang's cascade metadata (the
prefix page table and each node's ancestor slots) into one page-table row per
tree node. Oracle: FA3's ``flash_attn_with_kvcache`` called as SGLang's
``forward_decode`` calls it in deterministic mode (one query per request,
causal, ``num_splits=1``, page size 1), over the page table a server without
speculative decoding would have when it decodes that token: the prefix, then
the path from the root to the node. The node call must give every node's
output bit for bit. SGLang's cascade (prefix and ancestors in two calls, merged
by ``merge_state_v2``) is run beside it to record how far it lands (its
properties in the JUnit report; asserted only to be the same attention up to
rounding).
"""

import pytest
import torch

from _fa3 import fa3_or_skip
from _register import register_cuda_ci

register_cuda_ci(est_time=30, suite="detspec-kernels-cuda")

fa = fa3_or_skip()

from sglang_detspec.ops.node_rows import ancestor_layout, node_key_lists  # noqa: E402

DEV = "cuda"
PARENTS = [-1, 0, 0, 0, 0, 1, 1, 2]  # SGLang's EAGLE order for top-k 4, 8 draft tokens
N = len(PARENTS)
PREFIXES = [1, 37, 300, 1029]
SLOTS = 16384


ROWS, LENS = ancestor_layout(PARENTS)


def path(i):
    """Node i's ancestors, root first, itself last."""
    return ROWS[i][: LENS[i]]


def setup(heads, kv_heads, dim, seed):
    gen = torch.Generator(device=DEV).manual_seed(seed)
    k = torch.randn(SLOTS, 1, kv_heads, dim, generator=gen, device=DEV).to(torch.bfloat16)  # page size 1
    v = torch.randn(SLOTS, 1, kv_heads, dim, generator=gen, device=DEV).to(torch.bfloat16)
    q = torch.randn(len(PREFIXES) * N, heads, dim, generator=gen, device=DEV).to(torch.bfloat16)
    order = torch.randperm(SLOTS, generator=gen, device=DEV).to(torch.int32)
    width = max(PREFIXES)
    prefix_table = torch.zeros(len(PREFIXES), width, dtype=torch.int32, device=DEV)
    draft = []
    at = 0
    for b, p in enumerate(PREFIXES):
        prefix_table[b, :p] = order[at:at + p]
        draft.append(order[at + p:at + p + N])
        at += p + N
    draft = torch.stack(draft)  # [bs, N] slots of the tree's tokens
    anc = draft[:, torch.tensor(ROWS, device=DEV)].reshape(-1, N).to(torch.int32)  # SGLang's sorted expand rows
    anc_lens = torch.tensor(LENS, dtype=torch.int32, device=DEV).repeat(len(PREFIXES))
    prefix_lens = torch.tensor(PREFIXES, dtype=torch.int32, device=DEV)
    return k, v, q, prefix_table, prefix_lens, draft, anc, anc_lens


def decode(q, k, v, table, lens, scale, scheduled=False):
    """SGLang's forward_decode call in deterministic mode (FA3, page size 1).

    ``scheduled``: with the scheduler metadata a decode step precomputes
    (``FlashAttentionBackend._compute_scheduler_metadata``); the node path passes none.
    """
    rows = q.shape[0]
    cu_q = torch.arange(rows + 1, dtype=torch.int32, device=DEV)
    extra = {}
    if scheduled:
        from sgl_kernel.flash_attn import get_scheduler_metadata

        extra["scheduler_metadata"] = get_scheduler_metadata(
            batch_size=rows, max_seqlen_q=1, max_seqlen_k=table.shape[1], num_heads=q.shape[1],
            num_heads_k=k.shape[2], headdim=q.shape[2], cache_seqlens=lens, qkv_dtype=q.dtype, cu_seqlens_q=cu_q,
            page_size=1, causal=True, has_softcap=False, num_splits=1)
    return fa.flash_attn_with_kvcache(
        q=q, k_cache=k, v_cache=v, page_table=table, cache_seqlens=lens, cu_seqlens_q=cu_q, max_seqlen_q=1,
        softmax_scale=scale, causal=True, num_splits=1, ver=3, **extra,
    )


def test_triton_rows_equal_the_torch_rows():
    """The Triton builder writes each row up to its length; the torch one whole rows: equal up to the lengths."""
    _, _, _, prefix_table, prefix_lens, _, anc, anc_lens = setup(4, 4, 64, seed=1)
    wide = torch.nn.functional.pad(prefix_table, (0, 4096))  # a graph buffer's width, stale columns past the prefix
    for table_in in (prefix_table, wide):
        t_table, t_lens = node_key_lists(table_in, prefix_lens, anc, anc_lens, N, kernel="torch")
        out = torch.full((len(PREFIXES) * N + 5, table_in.shape[1] + N + 3), -1, dtype=torch.int32, device=DEV)
        out_lens = torch.full((len(PREFIXES) * N + 5,), -1, dtype=torch.int32, device=DEV)
        g_table, g_lens = node_key_lists(table_in, prefix_lens, anc, anc_lens, N, out, out_lens, kernel="triton")
        assert torch.equal(g_lens, t_lens) and (out_lens[len(PREFIXES) * N:] == -1).all()
        for r in range(len(PREFIXES) * N):
            n = int(t_lens[r])
            assert torch.equal(g_table[r, :n], t_table[r, :n]), r


@pytest.mark.parametrize("kernel", ["triton", "torch"])
@pytest.mark.parametrize("heads, kv_heads, dim", [(4, 4, 64), (32, 8, 128)])
def test_node_queries_equal_the_decode_step_of_each_node(heads, kv_heads, dim, kernel):
    k, v, q, prefix_table, prefix_lens, draft, anc, anc_lens = setup(heads, kv_heads, dim, seed=heads + dim)
    scale = dim ** -0.5
    table, lens = node_key_lists(prefix_table, prefix_lens, anc, anc_lens, N, kernel=kernel)
    nodes = decode(q, k, v, table, lens, scale)
    bs = len(PREFIXES)
    for i in range(N):
        # A decode batch of the bs requests, each at node i's token: prefix, then the path to it, in a
        # page table of another width (a decode step's is its own max length, or the context length
        # under CUDA graphs), with the scheduler metadata a decode step precomputes.
        width = 2 * max(PREFIXES) + 3
        rows = torch.zeros(bs, width, dtype=torch.int32, device=DEV)
        for b, p in enumerate(PREFIXES):
            keys = torch.cat([prefix_table[b, :p], draft[b, path(i)]])
            rows[b, : keys.numel()] = keys
        dec_lens = prefix_lens + len(path(i))
        want = decode(q.view(bs, N, heads, dim)[:, i].contiguous(), k, v, rows, dec_lens.to(torch.int32), scale, scheduled=True)
        got = nodes.view(bs, N, heads, dim)[:, i]
        assert torch.equal(got, want), (i, (got.float() - want.float()).abs().max().item())


def test_sglang_cascade_is_recorded_beside_it(record_property):
    """How far SGLang's cascade (two calls merged in bf16) lands from the decode step: recorded, only
    loosely asserted (the same attention up to rounding)."""
    from sgl_kernel import merge_state_v2

    heads, kv_heads, dim = 32, 8, 128
    k, v, q, prefix_table, prefix_lens, draft, anc, anc_lens = setup(heads, kv_heads, dim, seed=7)
    scale = dim ** -0.5
    table, lens = node_key_lists(prefix_table, prefix_lens, anc, anc_lens, N)
    nodes = decode(q, k, v, table, lens, scale)
    bs = len(PREFIXES)
    o, lse, *_ = fa.flash_attn_with_kvcache(
        q=q, k_cache=k, v_cache=v, page_table=prefix_table, cache_seqlens=prefix_lens,
        cu_seqlens_q=torch.arange(0, bs * N + 1, N, dtype=torch.int32, device=DEV), max_seqlen_q=N,
        softmax_scale=scale, causal=False, return_softmax_lse=True, num_splits=1, ver=3)
    o2, lse2, *_ = fa.flash_attn_with_kvcache(
        q=q, k_cache=k.view(-1, 1, kv_heads, dim), v_cache=v.view(-1, 1, kv_heads, dim), page_table=anc,
        cache_seqlens=anc_lens, cu_seqlens_q=torch.arange(bs * N + 1, dtype=torch.int32, device=DEV),
        max_seqlen_q=1, softmax_scale=scale, causal=False, return_softmax_lse=True, num_splits=1, ver=3)
    cascade, _ = merge_state_v2(o, lse.T.contiguous(), o2, lse2.T.contiguous())
    apart = (cascade.float() - nodes.float()).abs()
    record_property("outputs_apart", float((apart > 0).float().mean()))
    record_property("max_abs", float(apart.max()))
    assert torch.allclose(cascade.float(), nodes.float(), atol=2e-2)


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__, "-v"]))
