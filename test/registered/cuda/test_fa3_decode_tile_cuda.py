"""FA3 decode rewritten by the plugin gives each row a prefill's bits, at every batch size and order.

``sglang_plugin/fa3_decode_tile_hook.retiled_kwargs`` passes a decode-shaped
FA3 call (one query row per request, causal) at head sizes up to 64 a
``max_seqlen_q`` of 2, so FA3 keeps its causal flag and runs the kernel its
causal prefill runs. Oracle: one causal FA3 prefill of the whole sequence
(SGLang's extend call: ``cu_seqlens_k_new`` given, page size 1). Checked at
lengths on both sides of the 128- and 192-key block edges, with the decode
rows batched whole, one by one and in a permuted order (batch invariance),
and a positive control: the same decode without the rewrite differs from the
prefill at head size 64 (the comparison can see what the hook removes). At
head size 128 the rewrite does not apply and FA3's decode already matches.
The first rewrite (a whole-sequence attention chunk) failed this test on the
H200 (``docs/e2e/2026-12-04-h200-fa3-retile-suite/tile-test.log``).
"""

import sys

import pytest
import torch

from _fa3 import fa3_or_skip
from _register import register_cuda_ci

register_cuda_ci(est_time=30, suite="detspec-kernels-cuda")

fa = fa3_or_skip()

from sglang_detspec.sglang_plugin.fa3_decode_tile_hook import retiled_kwargs  # noqa: E402

DEV = "cuda"
LENGTH = 1100
EDGES = (1, 127, 128, 129, 191, 192, 193, 256, 257, 384, 385, 1099)  # positions around block edges


def setup(heads, kv_heads, dim, seed=0):
    gen = torch.Generator(device=DEV).manual_seed(seed)
    k = torch.randn(LENGTH + 16, 1, kv_heads, dim, generator=gen, device=DEV).to(torch.bfloat16)
    v = torch.randn(LENGTH + 16, 1, kv_heads, dim, generator=gen, device=DEV).to(torch.bfloat16)
    q = torch.randn(LENGTH, heads, dim, generator=gen, device=DEV).to(torch.bfloat16)
    slots = torch.randperm(LENGTH + 16, generator=gen, device=DEV)[:LENGTH].to(torch.int32)
    return q, k, v, slots


def prefill(q, k, v, slots):
    """One causal call over the whole sequence, as SGLang's FA3 ``forward_extend`` makes it."""
    i32 = dict(dtype=torch.int32, device=DEV)
    one = torch.tensor([0, LENGTH], **i32)
    return fa.flash_attn_with_kvcache(q=q, k_cache=k, v_cache=v, page_table=slots.unsqueeze(0),
                                      cache_seqlens=torch.tensor([LENGTH], **i32), cu_seqlens_q=one,
                                      cu_seqlens_k_new=one, max_seqlen_q=LENGTH, softmax_scale=q.shape[-1] ** -0.5,
                                      causal=True, num_splits=1, ver=3)


def decode(q, k, v, slots, positions, retile):
    """The decode rows of ``positions`` (row p: keys ``[0, p]``) in one FA3 call, as ``forward_decode`` makes it."""
    i32 = dict(dtype=torch.int32, device=DEV)
    pos = torch.tensor(positions, **i32)
    n = len(positions)
    width = int(pos.max()) + 1
    table = slots[:width].unsqueeze(0).expand(n, width).contiguous()
    kwargs = {"q": q[pos.long()], "k_cache": k, "v_cache": v, "page_table": table, "cache_seqlens": pos + 1,
              "cu_seqlens_q": torch.arange(n + 1, **i32), "max_seqlen_q": 1,
              "softmax_scale": q.shape[-1] ** -0.5, "causal": True, "window_size": (-1, -1), "softcap": 0.0,
              "num_splits": 1, "ver": 3, "scheduler_metadata": None}
    if retile:
        new = retiled_kwargs(kwargs["q"], kwargs)
        if new is not None:
            kwargs = new
    return fa.flash_attn_with_kvcache(**kwargs)


def apart(a, b):
    """Row indices whose bits differ."""
    bits_a = a.contiguous().view(torch.uint8).reshape(a.shape[0], -1)
    bits_b = b.contiguous().view(torch.uint8).reshape(b.shape[0], -1)
    return torch.nonzero((bits_a != bits_b).any(dim=1)).flatten().tolist()


@pytest.mark.parametrize("heads, kv_heads, dim", [(4, 4, 64), (8, 2, 64), (16, 1, 64), (32, 8, 128)])
def test_retiled_decode_gives_every_row_the_prefills_bits(heads, kv_heads, dim):
    q, k, v, slots = setup(heads, kv_heads, dim)
    ref = prefill(q, k, v, slots)
    rows = list(range(LENGTH))
    out = decode(q, k, v, slots, rows, retile=True)
    assert apart(out, ref) == []


@pytest.mark.parametrize("heads, kv_heads, dim", [(4, 4, 64), (32, 8, 128)])
def test_retiled_decode_is_batch_invariant(heads, kv_heads, dim):
    """Each row's bits whatever the batch: whole, the edge rows alone, one by one, permuted."""
    q, k, v, slots = setup(heads, kv_heads, dim, seed=1)
    ref = prefill(q, k, v, slots)
    gen = torch.Generator().manual_seed(2)
    perm = torch.randperm(LENGTH, generator=gen).tolist()
    permuted = decode(q, k, v, slots, perm, retile=True)
    assert apart(permuted, ref[perm]) == []
    edges = decode(q, k, v, slots, list(EDGES), retile=True)
    assert apart(edges, ref[list(EDGES)]) == []
    for p in EDGES:
        one = decode(q, k, v, slots, [p], retile=True)
        assert apart(one, ref[p:p + 1]) == [], f"position {p} alone"


def test_positive_control_fa3s_own_decode_rounds_apart_at_head_size_64():
    """Without the rewrite FA3's decode differs from the prefill past the first 128 keys (the effect removed)."""
    q, k, v, slots = setup(4, 4, 64)
    ref = prefill(q, k, v, slots)
    out = decode(q, k, v, slots, list(range(LENGTH)), retile=False)
    rows = apart(out, ref)
    assert rows, "FA3's own decode matched the prefill: the rewrite would have nothing to remove"
    assert min(rows) >= 128, "rows within the first block should agree either way"


def test_head_size_128_is_left_as_fa3_runs_it_and_already_matches():
    q, k, v, slots = setup(32, 8, 128)
    kwargs_q = q[:1]
    assert retiled_kwargs(kwargs_q, {"ver": 3, "causal": True, "max_seqlen_q": 1}) is None
    ref = prefill(q, k, v, slots)
    assert apart(decode(q, k, v, slots, list(range(LENGTH)), retile=False), ref) == []


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
