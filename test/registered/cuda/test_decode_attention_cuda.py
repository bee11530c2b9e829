"""Decode attention through the verify's kernel: bitwise equal to every row of a chain verify and a prefill.

``sglang_plugin.decode_attention.decode_as_extend`` runs a decode step through SGLang's
``extend_attention_fwd_unified`` (the single-pass kernel deterministic mode
runs for prefill and target verify), one query per request. Oracle: SGLang's
own kernel called the way its Triton backend calls it for a chain verify
(prefix from the cache, K + 1 draft tokens, causal) and for a prefill without
prefix: the decode of the token at each row's position must give that row's
output bit for bit, whatever the batch around it. SGLang's split-KV decode
kernel is run beside it to record (not assert) how far it lands.
"""

import pytest
import torch

from _register import register_cuda_ci

register_cuda_ci(est_time=30, suite="detspec-kernels-cuda")

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU (SGLang's attention kernels are Triton)", allow_module_level=True)
extend_mod = pytest.importorskip("sglang.kernels.ops.attention.extend_attention",
                                 reason="needs SGLang's Triton attention kernels")
decode_mod = pytest.importorskip("sglang.kernels.ops.attention.decode_attention",
                                 reason="needs SGLang's Triton attention kernels")

from sglang_detspec.sglang_plugin.decode_attention import decode_as_extend, decode_packed, packable  # noqa: E402

DEV = "cuda"
UNIFIED = extend_mod.extend_attention_fwd_unified
PREFIXES = [1, 37, 63, 64, 255, 256, 700]
DRAFT = 4  # K + 1 verify rows per request
SLOTS = 8192


def cache(heads, kv_heads, dim, seed):
    gen = torch.Generator(device=DEV).manual_seed(seed)
    k = torch.randn(SLOTS, kv_heads, dim, generator=gen, device=DEV).to(torch.bfloat16)
    v = torch.randn(SLOTS, kv_heads, dim, generator=gen, device=DEV).to(torch.bfloat16)
    # Each request's keys sit in scattered cache slots, as in a paged pool.
    order = torch.randperm(SLOTS - 1, generator=gen, device=DEV).to(torch.int32) + 1
    q = torch.randn(len(PREFIXES) * DRAFT, heads, dim, generator=gen, device=DEV).to(torch.bfloat16)
    return k, v, order, q


def slots_of(order):
    """Per request: its prefix slots and its DRAFT extend slots (disjoint ranges of ``order``)."""
    out, at = [], 0
    for p in PREFIXES:
        out.append((order[at:at + p], order[at + p:at + p + DRAFT]))
        at += p + DRAFT
    return out


def indptr(lengths):
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=DEV)


def verify_rows(k, v, q, slots, dim, masked=False, kernel=None):
    """SGLang's chain verify: prefix + DRAFT new tokens per request, one call.

    ``masked``: as SGLang's target verify calls it with the draft tree's mask
    (a chain's: causal), uint8 and flattened per request, int64 indices.
    ``kernel``: what runs the call (SGLang's ``extend_attention_fwd_unified`` unless given).
    """
    o = q.new_empty(*q.shape[:2], v.shape[-1])
    kv = torch.cat([torch.cat([pre, ext]) for pre, ext in slots])
    kv_indptr = indptr([len(p) + DRAFT for p, _ in slots])
    extra = {}
    if masked:
        masks = []
        for pre, _ in slots:
            rows = torch.ones(DRAFT, len(pre) + DRAFT, dtype=torch.uint8, device=DEV)
            rows[:, len(pre):] = torch.tril(torch.ones(DRAFT, DRAFT, dtype=torch.uint8, device=DEV))
            masks.append(rows.flatten())
        extra = dict(custom_mask=torch.cat(masks),
                     mask_indptr=torch.tensor([0, *torch.tensor([m.numel() for m in masks]).cumsum(0).tolist()],
                                              dtype=torch.int64, device=DEV))
        kv, kv_indptr = kv.long(), kv_indptr.long()
    (kernel or UNIFIED)(q, o, k, v, 1.0, 1.0, indptr([DRAFT] * len(slots)).long(), kv_indptr,
                        kv, torch.tensor([len(p) for p, _ in slots], dtype=torch.int32, device=DEV), DRAFT,
                        sm_scale=dim ** -0.5, is_causal=True, **extra)
    return o


def decode_rows(k, v, q, slots, dim, pick, path="one_row"):
    """Our decode for the (request, row) pairs in ``pick``: keys = prefix + extend tokens up to the row.

    ``path``: ``one_row`` (``decode_as_extend``, a query row per head) or
    ``packed`` (``decode_packed``, a query-head group per tile).
    """
    lists = [torch.cat([slots[i][0], slots[i][1][:j + 1]]) for i, j in pick]
    rows_q = torch.stack([q[i * DRAFT + j] for i, j in pick])
    o = rows_q.new_empty(*rows_q.shape[:2], v.shape[-1])
    rows = torch.arange(len(pick) + 1, dtype=torch.int64, device=DEV)
    if path == "packed":
        blocks = extend_mod._get_block_sizes_for_extend_attention(dim, dim)
        if not packable(blocks, torch.cuda.get_device_capability()):
            pytest.skip(f"the packed tile applies to Hopper with SGLang's 128-row tile (blocks {blocks})")
        decode_packed(extend_mod._fwd_kernel_unified, blocks, rows, rows_q, k, v, o, indptr([len(x) for x in lists]),
                      torch.cat(lists), dim ** -0.5, 1.0, 1.0)
    else:
        decode_as_extend(UNIFIED, rows, rows_q, k, v, o, indptr([len(x) for x in lists]), torch.cat(lists),
                         dim ** -0.5, 1.0, 1.0)
    return o, lists, rows_q


SHAPES = [(4, 4, 64), (32, 8, 128)]  # the tiny E2E models; an 8B Llama's attention


PATHS = ["one_row", "packed"]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("masked", [False, True], ids=["causal", "tree_mask"])
@pytest.mark.parametrize("heads,kv_heads,dim", SHAPES)
def test_decode_equals_every_chain_verify_row_bitwise(heads, kv_heads, dim, masked, path):
    k, v, order, q = cache(heads, kv_heads, dim, seed=heads)
    slots = slots_of(order)
    verify = verify_rows(k, v, q, slots, dim, masked)
    pick = [(i, j) for i in range(len(PREFIXES)) for j in range(DRAFT)]
    decoded, _, _ = decode_rows(k, v, q, slots, dim, pick, path)
    want = torch.stack([verify[i * DRAFT + j] for i, j in pick])
    assert torch.equal(decoded, want)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("heads,kv_heads,dim", SHAPES)
def test_decode_row_does_not_depend_on_its_batch(heads, kv_heads, dim, path):
    k, v, order, q = cache(heads, kv_heads, dim, seed=7)
    slots = slots_of(order)
    pick = [(i, DRAFT - 1) for i in range(len(PREFIXES))]
    alone = torch.cat([decode_rows(k, v, q, slots, dim, [p], path)[0] for p in pick])
    together, _, _ = decode_rows(k, v, q, slots, dim, list(reversed(pick)), path)
    assert torch.equal(alone, together.flip(0))
    # Row permutations and batch sizes across the 128-row tile (two batches of 70 and 200 requests).
    gen = torch.Generator().manual_seed(3)
    for size in (70, 200):
        many = [pick[int(x)] for x in torch.randint(0, len(pick), (size,), generator=gen)]
        batched, _, _ = decode_rows(k, v, q, slots, dim, many, path)
        for r, p in enumerate(many):
            assert torch.equal(batched[r], alone[pick.index(p)]), (size, r, p)


def test_the_start_up_check_accepts_the_packed_tile_here():
    """``packed_matches`` (run at start-up before the hook uses the packed tile) passes on this GPU at both shapes."""
    from sglang_detspec.sglang_plugin.decode_attention import packed_matches

    checked = 0
    for heads, kv_heads, dim in SHAPES:
        blocks = extend_mod._get_block_sizes_for_extend_attention(dim, dim)
        if packable(blocks, torch.cuda.get_device_capability()):
            assert packed_matches(UNIFIED, extend_mod._fwd_kernel_unified, blocks, heads, kv_heads, dim, dim,
                                  torch.bfloat16, DEV), (heads, kv_heads, dim)
            checked += 1
    if not checked:
        pytest.skip("the packed tile applies to Hopper with SGLang's 128-row, 8-warp tile (head dims 65-128)")


@pytest.mark.parametrize("heads,kv_heads,dim", SHAPES)
def test_decode_equals_the_last_row_of_a_prefill_bitwise(heads, kv_heads, dim):
    """A re-prefill after retraction (no cached prefix): its last row is the decode of that token."""
    k, v, order, q = cache(heads, kv_heads, dim, seed=3)
    slots = slots_of(order)
    gen = torch.Generator(device=DEV).manual_seed(11)
    for i, (pre, ext) in enumerate(slots):
        keys = torch.cat([pre, ext])
        n = len(keys)
        q_all = torch.randn(n, heads, dim, generator=gen, device=DEV).to(torch.bfloat16)
        o = torch.empty_like(q_all)
        UNIFIED(q_all, o, k, v, 1.0, 1.0, indptr([n]).long(), indptr([n]), keys,
                torch.zeros(1, dtype=torch.int32, device=DEV), n, sm_scale=dim ** -0.5, is_causal=True)
        last = torch.empty_like(q_all[-1:])
        decode_as_extend(UNIFIED, torch.arange(2, device=DEV), q_all[-1:], k, v, last, indptr([n]), keys,
                         dim ** -0.5, 1.0, 1.0)
        assert torch.equal(last[0], o[-1]), f"request {i} (prefix {len(pre)})"
        blocks = extend_mod._get_block_sizes_for_extend_attention(dim, dim)
        if packable(blocks, torch.cuda.get_device_capability()):
            packed = torch.empty_like(q_all[-1:])
            decode_packed(extend_mod._fwd_kernel_unified, blocks, torch.arange(2, device=DEV), q_all[-1:], k, v,
                          packed, indptr([n]), keys, dim ** -0.5, 1.0, 1.0)
            assert torch.equal(packed[0], o[-1]), f"packed, request {i} (prefix {len(pre)})"


# Absorbed MLA as SGLang's Triton backend calls it: the latent cache is one KV head of kv_lora_rank + rope dims,
# the value its first kv_lora_rank dims (a view); the tiny DeepSeek-V3's 4 heads and a TP-8 DeepSeek-V3's 16.
MLA_RANK, MLA_ROPE = 512, 64


@pytest.mark.parametrize("masked", [False, True], ids=["causal", "tree_mask"])
@pytest.mark.parametrize("heads", [4, 16])
def test_mla_decode_equals_every_chain_verify_row_and_a_prefill_bitwise(heads, masked, record_property):
    """attention_hook._mla_one_pass: an MLA decode through the extend kernel gives its verify and prefill rows.

    ``tree_mask``: the verify as SGLang's backend calls it, with the chain's mask, through what the hook
    installs on an MLA chain target (``_causal_chain_verify``); SGLang's masked path on the same call, which
    the hook replaces, is recorded beside it (2026-12-07, one H100: not the causal path's bits).
    """
    from sglang_detspec.sglang_plugin.attention_hook import _causal_chain_verify

    dim = MLA_RANK + MLA_ROPE
    gen = torch.Generator(device=DEV).manual_seed(heads)
    latent = torch.randn(SLOTS, 1, dim, generator=gen, device=DEV).to(torch.bfloat16)
    value = latent[..., :MLA_RANK]
    order = torch.randperm(SLOTS - 1, generator=gen, device=DEV).to(torch.int32) + 1
    q = torch.randn(len(PREFIXES) * DRAFT, heads, dim, generator=gen, device=DEV).to(torch.bfloat16)
    slots = slots_of(order)
    verify = verify_rows(latent, value, q, slots, dim, masked, _causal_chain_verify(UNIFIED) if masked else None)
    if masked:
        sglangs = verify_rows(latent, value, q, slots, dim, masked)
        differing = int(((sglangs != verify).flatten(1).any(1)).sum())
        record_property("sglang_masked_rows_differing", differing)
        print(f"SGLang's masked path, {heads} heads: {differing} of {len(verify)} verify rows differ")  # -rA shows it
    pick = [(i, j) for i in range(len(PREFIXES)) for j in range(DRAFT)]
    decoded, lists, _ = decode_rows(latent, value, q, slots, dim, pick)
    assert torch.equal(decoded, torch.stack([verify[i * DRAFT + j] for i, j in pick]))
    # The same rows decoded in another order and batch size.
    shuffled = [pick[int(x)] for x in torch.randperm(len(pick), generator=torch.Generator().manual_seed(2))][:11]
    again, _, _ = decode_rows(latent, value, q, slots, dim, shuffled)
    for r, p in enumerate(shuffled):
        assert torch.equal(again[r], decoded[pick.index(p)]), p
    # A prefill of a whole request (no cached prefix): its last row is that token's decode.
    pre, ext = slots[3]
    keys = torch.cat([pre, ext])
    q_all = torch.randn(len(keys), heads, dim, generator=gen, device=DEV).to(torch.bfloat16)
    o = q_all.new_empty(len(keys), heads, MLA_RANK)
    UNIFIED(q_all, o, latent, value, 1.0, 1.0, indptr([len(keys)]).long(), indptr([len(keys)]), keys,
            torch.zeros(1, dtype=torch.int32, device=DEV), len(keys), sm_scale=dim ** -0.5, is_causal=True)
    last = q_all.new_empty(1, heads, MLA_RANK)
    decode_as_extend(UNIFIED, torch.arange(2, device=DEV), q_all[-1:], latent, value, last, indptr([len(keys)]),
                     keys, dim ** -0.5, 1.0, 1.0)
    assert torch.equal(last[0], o[-1])


def test_mla_decode_through_the_hooks_wrapper_with_sglangs_arguments(record_property, monkeypatch):
    """The decode function ``attention_hook._mla_one_pass`` installs, called as SGLang's MLA ``forward_decode``
    calls it (its MLA keyword arguments included), runs the query heads in one tile (its start-up check passed
    at the cache's one latent head, though the backend's num_kv_head follows the config) and gives the verify's
    rows; SGLang's split-KV MLA decode on the same rows is recorded beside it (not asserted bit for bit)."""
    import types

    from sglang_detspec.sglang_plugin import attention_hook

    heads, dim = 16, MLA_RANK + MLA_ROPE
    gen = torch.Generator(device=DEV).manual_seed(5)
    latent = torch.randn(SLOTS, 1, dim, generator=gen, device=DEV).to(torch.bfloat16)
    value = latent[..., :MLA_RANK]
    order = torch.randperm(SLOTS - 1, generator=gen, device=DEV).to(torch.int32) + 1
    q = torch.randn(len(PREFIXES) * DRAFT, heads, dim, generator=gen, device=DEV).to(torch.bfloat16)
    slots = slots_of(order)
    verify = verify_rows(latent, value, q, slots, dim)
    pick = [(i, DRAFT - 1) for i in range(len(PREFIXES))]
    lists = [torch.cat([slots[i][0], slots[i][1][:j + 1]]) for i, j in pick]
    rows_q = torch.stack([q[i * DRAFT + j] for i, j in pick])
    kv_indptr, kv_indices = indptr([len(x) for x in lists]), torch.cat(lists).long()  # SGLang's decode: int64
    split_tile = 256  # SGLang's deterministic split tile (SGLANG_TRITON_DECODE_SPLIT_TILE_SIZE)
    max_splits = (max(len(x) for x in lists) + split_tile - 1) // split_tile
    splits = torch.tensor([(len(x) + split_tile - 1) // split_tile for x in lists], dtype=torch.int32, device=DEV)
    logits = torch.empty(len(pick), heads, max_splits, MLA_RANK, dtype=torch.float32, device=DEV)
    lse = torch.empty(len(pick), heads, max_splits, dtype=torch.float32, device=DEV)
    from sglang_detspec import config

    sglangs = decode_mod.decode_attention_fwd
    # What the hook installs on an MLA target's backend (the attribute _mla_one_pass replaces); the pool's first
    # layer is this latent cache, so the start-up check of the packed tile runs at these shapes.
    pool = types.SimpleNamespace(start_layer=0, get_key_buffer=lambda layer: latent,
                                 get_value_buffer=lambda layer: value)
    backend = types.SimpleNamespace(decode_attention_fwd=sglangs, kv_indptr=kv_indptr, num_head=heads, page_size=1,
                                    token_to_kv_pool=pool)
    # Its config's num_key_value_heads, as SGLang's num_kv_head follows it: not the latent cache's one head.
    backend.num_kv_head = heads
    packed_calls = []
    packed = attention_hook.decode_packed
    monkeypatch.setattr(attention_hook, "decode_packed", lambda *a, **k: packed_calls.append(1) or packed(*a, **k))
    try:
        attention_hook._mla_one_pass(backend, config.DetSpecConfig(deterministic=True, attention_backend="triton",
                                                                   model_family="mla+moe"),
                                     UNIFIED, torch.arange(len(pick) + 1, device=DEV))
    finally:
        config.reset_config()
    decode = backend.decode_attention_fwd
    assert decode is not sglangs
    args = (latent, value)
    ours, theirs = (rows_q.new_empty(len(pick), heads, MLA_RANK) for _ in range(2))
    for fn, out in ((decode, ours), (sglangs, theirs)):
        fn(rows_q, *args, out, kv_indptr, kv_indices, logits, lse, splits, max_splits, dim ** -0.5, 1.0, 1.0,
           logit_cap=0.0, sinks=None, xai_temperature_len=-1, has_mla=True, use_pdl=False, page_size=1,
           score_mod=None, aux_tensors=None, enable_lean=False, lean_Mp=None, lean_Lp=None, lean_Op=None,
           lean_locks=None, uneven_batch=None)
    assert packed_calls == [1]  # the heads-in-one-tile path served the call
    assert torch.equal(ours, torch.stack([verify[i * DRAFT + j] for i, j in pick]))
    diff = (ours.float() - theirs.float()).abs()
    record_property("mla_rows_differing", int((diff.flatten(1).amax(1) > 0).sum()))
    record_property("mla_max_abs", float(diff.max()))
    assert torch.allclose(ours.float(), theirs.float(), atol=2e-2, rtol=2e-2)  # the same attention, rounded apart


@pytest.mark.parametrize("heads", [4, 16, 128])
def test_the_start_up_check_accepts_mla_heads_in_sglangs_own_tile(heads):
    """``packed_matches`` for absorbed MLA (one latent KV head for every query head, SGLang's own tile for the
    576 / 512 dims): the tiny DeepSeek-V3's 4 heads, a TP-8 DeepSeek-V3's 16, one GPU's 128 (four tiles)."""
    from sglang_detspec.sglang_plugin.decode_attention import packed_matches

    dim = MLA_RANK + MLA_ROPE
    blocks = extend_mod._get_block_sizes_for_extend_attention(dim, MLA_RANK)
    assert packable(blocks, torch.cuda.get_device_capability())
    assert packed_matches(UNIFIED, extend_mod._fwd_kernel_unified, blocks, heads, 1, dim, MLA_RANK, torch.bfloat16,
                          DEV)


def test_sglang_split_kv_decode_differs_in_the_last_bits(record_property):
    """What the hook replaces: SGLang's two-stage decode on the same rows (recorded, not asserted)."""
    heads, kv_heads, dim = 32, 8, 128
    k, v, order, q = cache(heads, kv_heads, dim, seed=5)
    slots = slots_of(order)
    pick = [(i, DRAFT - 1) for i in range(len(PREFIXES))]
    ours, lists, rows_q = decode_rows(k, v, q, slots, dim, pick)
    split_tile = 256  # SGLang's deterministic split tile (SGLANG_TRITON_DECODE_SPLIT_TILE_SIZE)
    max_splits = (max(len(x) for x in lists) + split_tile - 1) // split_tile
    splits = torch.tensor([(len(x) + split_tile - 1) // split_tile for x in lists], dtype=torch.int32, device=DEV)
    logits = torch.empty(len(pick), heads, max_splits, dim, dtype=torch.float32, device=DEV)
    lse = torch.empty(len(pick), heads, max_splits, dtype=torch.float32, device=DEV)
    theirs = torch.empty_like(rows_q)
    decode_mod.decode_attention_fwd(rows_q, k, v, theirs, indptr([len(x) for x in lists]), torch.cat(lists), logits,
                                    lse, splits, max_splits, dim ** -0.5, 1.0, 1.0)
    diff = (ours.float() - theirs.float()).abs()
    record_property("rows_differing", int((diff.flatten(1).amax(1) > 0).sum()))
    record_property("max_abs", float(diff.max()))
    assert torch.allclose(ours.float(), theirs.float(), atol=2e-2, rtol=2e-2)  # the same attention, rounded apart


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__, "-v"]))
