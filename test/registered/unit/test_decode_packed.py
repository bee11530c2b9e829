"""The packed decode tile's argument layout (sglang_plugin.decode_attention.decode_packed), in Triton's interpreter.

SGLang's real single-pass kernel (``_fwd_kernel_unified``) runs here on CPU
under ``TRITON_INTERPRET=1`` (in a subprocess: the switch is read when
Triton is imported) with fp16 (the interpreter has no bf16 arithmetic). The
packed call (a query-head group as rows of one KV head) must give softmax
attention over each request's keys, and the same values as the one-row-per-
head call SGLang's verify shares. Whether the two agree bit for bit in the
GPU's matrix instructions is the GPU suite's
(``test/registered/cuda/test_decode_attention_cuda.py``) and the start-up
check's (``sglang_plugin.decode_attention.packed_matches``).
"""

import sys

import pytest
from sglang.test.ci.ci_register import register_cpu_ci

from _interpreter import run_interpreted

register_cpu_ci(est_time=90, suite="detspec-unit-cpu")

SCRIPT = r'''
import sys, torch
from sglang.kernels.ops.attention import extend_attention as ext
from sglang_detspec.sglang_plugin.decode_attention import decode_as_extend, decode_packed, packable
heads, kv_heads, dim, page = (int(x) for x in sys.argv[1:5])
lens = [1, 5, 64, 70]
slots = sum(lens) + 1
g = torch.Generator().manual_seed(0)
k = torch.randn(slots, kv_heads, dim, generator=g).half()
v = torch.randn(slots, kv_heads, dim, generator=g).half()
q = torch.randn(len(lens), heads, dim, generator=g).half()
indices = (torch.randperm(slots - 1, generator=g) + 1)[: sum(lens)].to(torch.int32)
indptr = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32)
rows = torch.arange(len(lens) + 1)
blocks = ext._get_block_sizes_for_extend_attention(dim, dim)
hopper = (blocks[0], blocks[1], blocks[2], 128, 64, 8)  # what SGLang picks on Hopper; CPU has no capability
assert packable(hopper, (9, 0)) and not packable(hopper, (8, 0)) and not packable(hopper[:3] + (64, 64, 4), (9, 0))
assert not packable(hopper, (9, 5), hip=True)  # ROCm's gfx9 reports major 9 too
out = decode_packed(ext._fwd_kernel_unified, hopper, rows, q, k, v, torch.empty_like(q), indptr, indices,
                    dim ** -0.5, 1.0, 1.0, page_size=page)
given = decode_packed(ext._fwd_kernel_unified, hopper, rows, q, k, v, torch.empty_like(q), indptr, indices,
                      dim ** -0.5, 1.0, 1.0, page_size=page, group_rows=rows * (heads // kv_heads))
assert torch.equal(given, out)  # offsets made once by the caller: the same call
one_row = decode_as_extend(ext.extend_attention_fwd_unified, rows, q, k, v, torch.empty_like(q), indptr, indices,
                           dim ** -0.5, 1.0, 1.0, page_size=page)
group = heads // kv_heads
worst = 0.0
for i in range(len(lens)):
    keys = indices[indptr[i]:indptr[i + 1]].long()
    kk = k[keys].float().repeat_interleave(group, dim=1)
    vv = v[keys].float().repeat_interleave(group, dim=1)
    w = torch.softmax(torch.einsum("hd,nhd->hn", q[i].float(), kk) * dim ** -0.5, -1)
    worst = max(worst, (out[i].float() - torch.einsum("hn,nhd->hd", w, vv)).abs().max().item())
print("max_abs", worst, "equal_one_row", torch.equal(out, one_row))
'''


# (132, 2, 16): a group of 66 query heads per KV head spans two 64-row tiles; page 16: paged KV addressing;
# (8, 1, 32): one KV head, the output written in place.
@pytest.mark.parametrize("heads, kv_heads, dim, page", [(8, 2, 64, 1), (4, 4, 32, 1), (132, 2, 16, 1), (8, 2, 32, 16),
                                                        (8, 1, 32, 1)])
def test_the_packed_tile_is_attention_over_each_requests_keys(heads, kv_heads, dim, page):
    done = run_interpreted(SCRIPT, str(heads), str(kv_heads), str(dim), str(page), timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    fields = done.stdout.split()
    assert float(fields[fields.index("max_abs") + 1]) < 2e-3, done.stdout
    assert fields[fields.index("equal_one_row") + 1] == "True", done.stdout


MLA_SCRIPT = r'''
import sys, torch
from sglang.kernels.ops.attention import extend_attention as ext
from sglang_detspec.sglang_plugin.decode_attention import decode_as_extend, decode_packed, packable, packed_tile
heads, rank, rope = (int(x) for x in sys.argv[1:4])
lens = [1, 5, 64, 70]
slots = sum(lens) + 1
g = torch.Generator().manual_seed(0)
latent = torch.randn(slots, 1, rank + rope, generator=g).half()
value = latent[..., :rank]  # SGLang's MLA value: a view of the latent cache's first kv_lora_rank dims
q = torch.randn(len(lens), heads, rank + rope, generator=g).half()
indices = (torch.randperm(slots - 1, generator=g) + 1)[: sum(lens)].to(torch.int32)
indptr = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32)
rows = torch.arange(len(lens) + 1)
hopper = (512, 64, 512, 32, 64, 8)  # SGLang's blocks for the 576 / 512 latent on Hopper
assert packable(hopper, (9, 0)) and packable(hopper, (10, 0)) and not packable(hopper, (9, 0), hip=True)
assert packed_tile(hopper) == (32, 8) and packed_tile((128, 0, 128, 128, 64, 8)) == (64, 4)
# The blocks SGLang's one-row call takes on this machine (its key tile decides the rounding): the packed call the same.
own = ext._get_block_sizes_for_extend_attention(rank + rope, rank)
assert own[1] == rope and packed_tile(own) == (own[3], own[5])
o = q.new_empty(len(lens), heads, rank)
out = decode_packed(ext._fwd_kernel_unified, own, rows, q, latent, value, o, indptr, indices, 0.1, 1.0, 1.0)
one_row = decode_as_extend(ext.extend_attention_fwd_unified, rows, q, latent, value, torch.empty_like(o), indptr,
                           indices, 0.1, 1.0, 1.0)
worst = 0.0
for i in range(len(lens)):
    keys = latent[indices[indptr[i]:indptr[i + 1]].long(), 0].float()
    w = torch.softmax(q[i].float() @ keys.T * 0.1, -1)
    worst = max(worst, (out[i].float() - w @ keys[:, :rank]).abs().max().item())
print("max_abs", worst, "equal_one_row", torch.equal(out, one_row))
'''


# SGLang's Hopper tile for the latent key (32 rows): 40 heads span two tiles of the one latent head.
@pytest.mark.parametrize("heads", [4, 40])
def test_mla_heads_share_sglangs_own_tile_for_the_latent_key(heads):
    # rank / rope as the blocks' BLOCK_DMODEL / BLOCK_DPE (the kernel reads 512 + 64 dims of the latent key).
    done = run_interpreted(MLA_SCRIPT, str(heads), "512", "64", timeout=400)
    assert done.returncode == 0, done.stderr[-2000:]
    fields = done.stdout.split()
    assert float(fields[fields.index("max_abs") + 1]) < 5e-3, done.stdout
    assert fields[fields.index("equal_one_row") + 1] == "True", done.stdout


def test_blocks_made_for_other_head_dims_are_refused_before_any_launch():
    import torch

    from sglang_detspec.sglang_plugin.decode_attention import decode_packed, packed_shape

    q, kv = torch.zeros(2, 8, 128, dtype=torch.float16), torch.zeros(16, 2, 128, dtype=torch.float16)
    blocks_64 = (64, 0, 64, 128, 64, 8)  # SGLang's blocks for head dim 64
    with pytest.raises(ValueError, match=r"head dims \(128, 128\) must be at most .*BLOCK_DMODEL \+ BLOCK_DPE \(64\)"):
        decode_packed(None, blocks_64, torch.arange(3), q, kv, kv, torch.empty_like(q), torch.tensor([0, 1, 2]),
                      torch.tensor([0, 1]), 0.1, 1.0, 1.0)
    with pytest.raises(ValueError, match=r"q heads \(8\) must be a multiple of the KV heads \(3\)"):
        decode_packed(None, (128, 0, 128, 128, 64, 8), torch.arange(3), q, torch.zeros(16, 3, 128), kv,
                      torch.empty_like(q), torch.tensor([0, 1, 2]), torch.tensor([0, 1]), 0.1, 1.0, 1.0)
    with pytest.raises(ValueError, match="must be 3-D"):
        decode_packed(None, (128, 0, 128, 128, 64, 8), torch.arange(3), q, kv.view(16, 1, 2, 128), kv,
                      torch.empty_like(q), torch.tensor([0, 1, 2]), torch.tensor([0, 1]), 0.1, 1.0, 1.0)
    assert packed_shape(q, kv, kv[..., :64]) == (8, 2, 128, 64, torch.float16)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
