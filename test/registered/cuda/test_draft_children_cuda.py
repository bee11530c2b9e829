"""The draft children's fused tail (``ops.draft_children_triton``) == the torch path, bit for bit.

``ops.draft_children`` on CUDA runs the race, then one kernel for the relative
scores, the dense [R, V] tensor and the greedy rows' q; the torch path runs
``relative_scores`` and a scatter. Cases: every row sampled, greedy rows,
top-k cut rows with fewer positive weights than children (zero scores), a
reduced draft vocabulary spread onto target ids (children off the draft
vocabulary drop out), k = 1, vocabularies off the tile size, and CUDA-graph
replay with new inputs.
"""

import pytest
import torch

from _register import register_cuda_ci
from sglang_detspec.ops.draft_children import draft_children, draft_children_topk

register_cuda_ci(est_time=30, suite="detspec-kernels-cuda")

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU (the fused tail is a Triton kernel)", allow_module_level=True)

DEV = "cuda"


def inputs(rows, v, gen, greedy_every=0, cut=False):
    logits = torch.randn(rows, v, generator=gen, device=DEV) * 3
    temps = torch.rand(rows, 1, generator=gen, device=DEV) + 0.5
    top_ks = torch.full((rows,), v, dtype=torch.int32, device=DEV)
    if greedy_every:
        top_ks[::greedy_every] = 1
    seeds = torch.randint(-(1 << 62), 1 << 62, (rows,), generator=gen, device=DEV)
    pos = torch.randint(0, 1 << 30, (rows,), generator=gen, device=DEV)
    cut_args = (None, None, None)
    if cut:  # top-k 2 on every other row: fewer positive weights than 4 children
        top_ks = torch.where(torch.arange(rows, device=DEV) % 2 == 0, 2, top_ks).to(torch.int32)
        cut_args = (top_ks, torch.ones(rows, device=DEV), None)
    return logits, temps, top_ks, seeds, pos, cut_args


@pytest.mark.parametrize("rows, v, k, greedy_every, cut", [
    (64, 128256, 4, 0, False),
    (33, 32000, 4, 3, False),
    (16, 1000, 8, 0, True),
    (128, 4097, 1, 5, False),
    (7, 151936, 10, 2, True),
])
def test_fused_tail_equals_the_torch_path(rows, v, k, greedy_every, cut):
    gen = torch.Generator(device=DEV).manual_seed(rows * v + k)
    logits, temps, top_ks, seeds, pos, cut_args = inputs(rows, v, gen, greedy_every, cut)
    got = draft_children(logits, temps, top_ks, seeds, pos, k, cut=cut_args, kernel="triton")
    want = draft_children(logits, temps, top_ks, seeds, pos, k, cut=cut_args, kernel="torch")
    assert got.dtype == want.dtype == torch.float32 and torch.equal(got, want)
    sampled = top_ks > 1
    assert int((got[sampled] > 0).sum(1).max()) <= k  # the dense tensor holds at most k children per row


@pytest.mark.parametrize("rows, v, k, greedy_every, cut", [
    (64, 128256, 4, 3, False),
    (16, 1000, 4, 0, True),
    (7, 151936, 10, 2, True),
    (128, 4097, 1, 5, False),
])
def test_the_ranking_is_sglangs_top_k_of_the_dense_tensor(rows, v, k, greedy_every, cut):
    """draft_children_topk: the values and ids SGLang's top-k of the dense tensor gives (one pass, no top-k), on
    both paths; the dense tensor unchanged. Cut rows with fewer positive weights than children compare their
    positive entries only (which zero columns a top-k returns is not defined)."""
    gen = torch.Generator(device=DEV).manual_seed(rows + v + k)
    logits, temps, top_ks, seeds, pos, cut_args = inputs(rows, v, gen, greedy_every, cut)
    for kernel in ("triton", "torch"):
        parts = draft_children_topk(logits, temps, top_ks, seeds, pos, k, cut=cut_args, kernel=kernel)
        assert torch.equal(parts.dense, draft_children(logits, temps, top_ks, seeds, pos, k, cut=cut_args,
                                                       kernel=kernel))
        want = torch.topk(parts.dense, k, dim=-1)
        assert torch.equal(parts.values, want.values)
        positive = parts.values > 0
        assert torch.equal(parts.indices[positive], want.indices[positive])
        assert int(parts.indices.min()) >= 0 and int(parts.indices.max()) < v
        assert all(len(set(row)) == k for row in parts.indices.tolist())
    triton_parts = draft_children_topk(logits, temps, top_ks, seeds, pos, k, cut=cut_args, kernel="triton")
    assert torch.equal(triton_parts.values, parts.values) and torch.equal(triton_parts.indices, parts.indices)


def test_a_nan_row_ranks_inside_the_vocabulary():
    """A row of NaN logits gives no id outside [0, V) to SGLang (the race finds none inside it)."""
    gen = torch.Generator(device=DEV).manual_seed(3)
    logits, temps, top_ks, seeds, pos, _ = inputs(8, 3000, gen, greedy_every=4)
    logits[1] = float("nan")
    logits[4] = float("nan")  # a greedy row
    parts = draft_children_topk(logits, temps, top_ks, seeds, pos, 4, kernel="triton")
    assert int(parts.indices.min()) >= 0 and int(parts.indices.max()) < 3000


def test_reduced_draft_vocabulary():
    gen = torch.Generator(device=DEV).manual_seed(5)
    target_vocab, v, rows = 4096, 3000, 24
    hot = torch.randperm(target_vocab, generator=gen, device=DEV)[:v]
    logits, temps, top_ks, seeds, pos, _ = inputs(rows, v, gen, greedy_every=4)
    kwargs = dict(hot_token_id=hot, target_vocab=target_vocab)
    got = draft_children(logits, temps, top_ks, seeds, pos, 4, kernel="triton", **kwargs)
    want = draft_children(logits, temps, top_ks, seeds, pos, 4, kernel="torch", **kwargs)
    assert torch.equal(got, want)


def test_cuda_graph_replay_sees_new_inputs():
    gen = torch.Generator(device=DEV).manual_seed(9)
    bufs = list(inputs(32, 32000, gen, greedy_every=5)[:5])
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        draft_children(*bufs, 4, kernel="triton")  # compile outside capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = draft_children(*bufs, 4, kernel="triton")
    for seed in (1, 2):
        new = inputs(32, 32000, torch.Generator(device=DEV).manual_seed(seed), greedy_every=3)[:5]
        for dst, src in zip(bufs, new):
            dst.copy_(src)
        graph.replay()
        assert torch.equal(out, draft_children(*new, 4, kernel="torch")), seed


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__, "-v"]))
