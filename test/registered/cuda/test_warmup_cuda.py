"""The start-up warm-up compiles every kernel the serving path launches eagerly: later batch sizes compile nothing.

A server's verify, draft-extend children and prefill samples run outside CUDA
graphs with a batch size that changes every step; a kernel specialised on a
batch-dependent argument (the split count, its power-of-two lane width)
would compile again inside a request. After ``ops.warmup.warm_up`` of a
plan, the same ops at batch sizes that cross every split-count change must
hit Triton's kernel cache only, and give the reference's bits.
"""

import sys

import pytest
import torch

from _register import register_cuda_ci
from sglang_detspec.ops import Stream, coupled_verify_chain, coupled_verify_tree, exponential_race
from sglang_detspec.ops import coupled_triton, draft_children_triton, race_triton, triton_config, verify_triton
from sglang_detspec.ops.draft_children import draft_children, draft_children_topk
from sglang_detspec.ops.verify import verify_chain
from sglang_detspec.ops.verify_outputs import VerifyOutputs
from sglang_detspec.ops.warmup import WarmupPlan, warm_up

register_cuda_ci(est_time=90, suite="detspec-kernels-cuda")

DEV = torch.device("cuda", 0)
KERNELS = (race_triton._race_argmax_kernel, race_triton._race_topk_kernel, race_triton._race_reduce_kernel,
           coupled_triton._coupled_walk_kernel, coupled_triton._tree_positions_kernel,
           verify_triton._verify_race_kernel, verify_triton._verify_emit_kernel,
           draft_children_triton._dense_children_kernel)


def compiled() -> int:
    """Kernels in Triton's in-process caches, over every device and every kernel above."""
    return sum(len(cache[0]) for k in KERNELS for cache in k.device_caches.values())


@pytest.mark.parametrize("vocab", [32000, 128256])
def test_no_batch_size_compiles_after_the_warm_up(vocab):
    plan = WarmupPlan((vocab,), draft_tokens=3, tree_nodes=8, topk=4, rejection=True, accept_width=4,
                      one_token_verify=True)
    assert warm_up(plan, DEV) > 0
    before = compiled()
    sm = torch.cuda.get_device_properties(DEV).multi_processor_count
    target = triton_config.PROGRAMS_PER_SM * sm
    # Batch sizes on both sides of the split count's changes, up to one split per row.
    sizes = sorted({1, 2, 3, 5, 7, 16, 33, 64, 100, 128, 255, target // 8, target // 3, target, target + 1})
    splits = {triton_config.plan_splits(b, vocab, DEV)[0] for b in sizes}
    assert len(splits) >= 6  # the sizes do cross many split counts
    gen = torch.Generator(device=DEV).manual_seed(vocab)
    for b in sizes:
        w = torch.rand(b, vocab, generator=gen, device=DEV) ** 8
        seeds = torch.randint(0, 2**62, (b,), generator=gen, device=DEV)
        pos = torch.randint(0, 2**31, (b,), generator=gen, device=DEV)
        for k in (1, 4):
            got = exponential_race(w, seeds, pos, stream=Stream.TARGET, num_samples=k, return_scores=True)
            want = exponential_race(w, seeds, pos, stream=Stream.TARGET, num_samples=k, return_scores=True,
                                    kernel="torch")
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), (b, k)
            assert torch.equal(exponential_race(w, seeds, pos, stream=Stream.TARGET, num_samples=k), want[0])
        # The draft extend's children as the tree hook asks for them: SGLang's int32 top-k.
        top_ks = torch.where(torch.arange(b, device=DEV) % 3 == 0, 1, 20).to(torch.int32)
        temps = torch.ones(b, 1, device=DEV)
        for k in (1, 4):
            got = draft_children(w, temps, top_ks, seeds, pos, k)
            assert torch.equal(got, draft_children(w, temps, top_ks, seeds, pos, k, kernel="torch")), (b, k)
        ranked = draft_children_topk(w, temps, top_ks, seeds, pos, 4)  # the tree sites' ranking
        want = draft_children_topk(w, temps, top_ks, seeds, pos, 4, kernel="torch")
        assert all(torch.equal(g, h) for g, h in zip(ranked, want)), b
        draft = exponential_race(w, seeds, pos, stream=Stream.DRAFT)
        assert torch.equal(draft, exponential_race(w, seeds, pos, stream=Stream.DRAFT, kernel="torch")), b
        rows = max(1, b // 8)
        p = torch.rand(rows, 8, vocab, generator=gen, device=DEV) ** 8
        x = torch.randint(0, vocab, (rows, 3), generator=gen, device=DEV)
        # The verify hook's call: SGLang's int32 buffers written in place.
        got = coupled_verify_chain(x, p[:, :4], seeds[:rows], pos[:rows], check=False, out=buffers(rows, 4))
        want = coupled_verify_chain(x, p[:, :4], seeds[:rows], pos[:rows], check=False, kernel="torch")
        assert all(torch.equal(g, h) for g, h in zip(got, want)), b
        nxt = torch.full((rows, 8), -1, dtype=torch.int64, device=DEV)
        nxt[:, :7] = torch.arange(1, 8, device=DEV)
        sib = torch.full((rows, 8), -1, dtype=torch.int64, device=DEV)
        cand = torch.randint(0, vocab, (rows, 8), generator=gen, device=DEV)
        got = coupled_verify_tree(cand, nxt, sib, p, seeds[:rows], pos[:rows], check=False, out=buffers(rows, 8))
        want = coupled_verify_tree(cand, nxt, sib, p, seeds[:rows], pos[:rows], check=False, kernel="torch")
        assert all(torch.equal(g, h) for g, h in zip(got, want)), b
        # A batch that drafted nothing (adaptive speculation at 0 steps): one node, every size 1.
        one = VerifyOutputs(torch.arange(b, device=DEV).view(b, 1), torch.zeros(b, dtype=torch.int32, device=DEV),
                            torch.full((b, 1), -1, dtype=torch.int32, device=DEV),
                            torch.zeros(b, dtype=torch.int32, device=DEV))
        got = coupled_verify_chain(torch.zeros(b, 0, dtype=torch.int64, device=DEV), w.view(b, 1, vocab),
                                   seeds, pos, check=False, out=one)
        want = exponential_race(w, seeds, pos, stream=Stream.TARGET, kernel="torch")[:, 0]
        assert torch.equal(got[0][:, 0], want) and torch.equal(one.predicts.long(), want), b
        assert not got[1].any() and not one.accept_token_num.any() and torch.equal(one.accept_index[:, 0].long(),
                                                                                   torch.arange(b, device=DEV))
        q = torch.rand(rows, 3, vocab, generator=gen, device=DEV) ** 8
        got = verify_chain(x, q, p[:, :4], seeds[:rows], pos[:rows], check=False)
        want = verify_chain(x, q, p[:, :4], seeds[:rows], pos[:rows], check=False, kernel="torch")
        assert all(torch.equal(g, h) for g, h in zip(got, want)), b
    assert compiled() == before, "a batch size compiled a kernel after the warm-up"


def buffers(rows: int, nodes: int) -> VerifyOutputs:
    """SGLang's verify buffers for ``rows`` requests of ``nodes`` nodes, accept_index 4 wide (num_steps + 1)."""
    return VerifyOutputs(torch.arange(rows * nodes, device=DEV).view(rows, nodes),
                         torch.zeros(rows * nodes, dtype=torch.int32, device=DEV),
                         torch.full((rows, 4), -1, dtype=torch.int32, device=DEV),
                         torch.zeros(rows, dtype=torch.int32, device=DEV))


def test_sglang_renorm_is_built_at_start_up():
    """A rejection server's start-up loads flashinfer's sampling module (a JIT build at its first call)."""
    sampling = pytest.importorskip("flashinfer.sampling", reason="SGLang's CUDA renorms are flashinfer's")
    from sglang_detspec.sglang_plugin import warmup_hook

    sampling.get_sampling_module.cache_clear()  # whatever loaded it earlier in this process
    assert warmup_hook.warm_sglang_renorm(DEV) == 2
    assert sampling.get_sampling_module.cache_info().currsize == 1


def test_sglang_kv_move_compiles_nothing_after_the_warm_up():
    """A tree server's move of accepted KV slots (SGLang's tiled copy, 2,048-byte rows as at the 8B shape):
    after ``warm_kv_move``, moves of 4 x b slots (steps 3) for b = 1 .. 300 hit Triton's cache only and move
    what they should; the warm-up itself leaves every KV slot as it was."""
    from sglang.kernels.ops.kvcache.cache_move import copy_all_layer_kv_cache_tiled
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    from sglang_detspec.sglang_plugin.kv_move_warmup import copy_bound, warm_kv_move

    pool = MHATokenToKVPool(size=4096, page_size=1, dtype=torch.bfloat16, head_num=8, head_dim=128, layer_num=2,
                            device="cuda", enable_memory_saver=False, enable_kv_cache_copy=True)
    assert copy_bound(pool) == 256
    gen = torch.Generator(device=DEV).manual_seed(5)
    for buf in (*pool.k_buffer, *pool.v_buffer):
        buf.copy_(torch.randn(buf.shape, generator=gen, device=DEV).to(buf.dtype))
    kept = [buf.clone() for buf in (*pool.k_buffer, *pool.v_buffer)]
    assert warm_kv_move(pool, 4, 300, DEV) == 12
    assert all(torch.equal(a, b) for a, b in zip(kept, (*pool.k_buffer, *pool.v_buffer)))

    def variants() -> int:
        return sum(len(cache[0]) for cache in copy_all_layer_kv_cache_tiled.device_caches.values())

    before = variants()
    for b in range(1, 301):
        slots = torch.randperm(4095, generator=gen, device=DEV)[: 8 * b] + 1  # slot 0 is SGLang's padding
        tgt, src = slots[: 4 * b], slots[4 * b:]
        want = pool.k_buffer[1][src].clone()
        pool.move_kv_cache(tgt, src)
        assert torch.equal(pool.k_buffer[1][tgt], want), b
    assert variants() == before, "a batch size compiled SGLang's KV move after the warm-up"


def test_plan_checks_its_fields():
    with pytest.raises(ValueError, match="vocabs must be a non-empty tuple"):
        WarmupPlan(())
    with pytest.raises(ValueError, match=r"topk must be an int in \[1, 4096\], got 0"):
        WarmupPlan((10,), topk=0)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
