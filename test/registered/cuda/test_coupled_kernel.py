"""Triton coupled verify (chain and tree) == torch reference, bit for bit, on the same CUDA device."""

import random

import pytest
import torch

from _register import register_cuda_ci
from sglang_detspec.ops import Stream, coupled_verify_chain, coupled_verify_tree, exponential_race, hash_uniform
from sglang_detspec.ops.verify_outputs import VerifyOutputs

register_cuda_ci(est_time=120, suite="detspec-kernels-cuda")

DEV = "cuda"
U32 = 1 << 32


def probs(b, n, v, gen, kind="softmax", dtype=torch.float32):
    if kind == "softmax":
        p = torch.softmax(torch.randn(b, n, v, generator=gen, device=DEV) * 3, -1)
    elif kind == "zeros":  # top-k filtered rows: mostly zero weights, not renormalised
        p = torch.rand(b, n, v, generator=gen, device=DEV)
        p[torch.rand(b, n, v, generator=gen, device=DEV) < 0.95] = 0
        p[..., v // 3] = 1e-3
    else:  # ties: equal weights, the hash and the tie rule decide
        p = torch.ones(b, n, v, device=DEV)
    return p.to(dtype)


def target_races(p, seeds, node_pos):
    """y of every node's row at its own position: int64 [B, N] (plain races, Triton)."""
    b, n, v = p.shape
    return exponential_race(p.reshape(b * n, v), seeds.repeat_interleave(n), node_pos.reshape(-1),
                            stream=Stream.TARGET, kernel="triton").view(b, n)


def chain_case(b, k, v, gen, match, kind="softmax", dtype=torch.float32):
    p = probs(b, k + 1, v, gen, kind, dtype)
    seeds = torch.randint(-(1 << 63), (1 << 63) - 1, (b,), generator=gen, device=DEV)
    pos = torch.randint(0, U32 - k - 1, (b,), generator=gen, device=DEV)
    y = target_races(p, seeds, pos.unsqueeze(1) + torch.arange(k + 1, device=DEV))
    x = y[:, :k].clone()
    flip = torch.rand(b, k, generator=gen, device=DEV) > match
    x[flip] = (x[flip] + 1) % v
    return x, p, seeds, pos


CHAIN_CASES = [
    # (B, K, V, per-token match, kind)
    (128, 3, 163840, 0.9, "softmax"),
    (512, 3, 4096, 0.7, "zeros"),
    (256, 7, 32000, 0.95, "softmax"),
    (64, 1, 151936, 0.5, "ties"),
    (4, 3, 262144, 0.9, "softmax"),
    (1000, 0, 777, 0.0, "softmax"),
    (2000, 2, 33, 0.8, "zeros"),
]


@pytest.mark.parametrize("b, k, v, match, kind", CHAIN_CASES)
def test_chain_kernel_equals_reference(b, k, v, match, kind):
    gen = torch.Generator(device=DEV).manual_seed(b + k + v)
    x, p, seeds, pos = chain_case(b, k, v, gen, match, kind)
    t1, a1 = coupled_verify_chain(x, p, seeds, pos, kernel="triton")
    t2, a2 = coupled_verify_chain(x, p, seeds, pos, kernel="torch")
    assert torch.equal(a1, a2) and torch.equal(t1, t2)
    if k and match >= 0.9:
        assert float(a1.double().mean()) > 0.5 * k


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_chain_other_dtypes(dtype):
    gen = torch.Generator(device=DEV).manual_seed(3)
    x, p, seeds, pos = chain_case(256, 3, 5000, gen, 0.8, dtype=dtype)
    t1, a1 = coupled_verify_chain(x, p, seeds, pos, kernel="triton")
    t2, a2 = coupled_verify_chain(x, p, seeds, pos, kernel="torch")
    assert torch.equal(t1, t2) and torch.equal(a1, a2)


def random_parents(n, rng, shape):
    if shape == "chain":
        return [-1] + list(range(n - 1))
    if shape == "star":
        return [-1] + [0] * (n - 1)
    if shape == "topk":  # SGLang-like: each level expands the first 4 nodes of the previous one
        parents, level = [-1], [0]
        while len(parents) < n:
            nxt = []
            for par in level:
                for _ in range(4):
                    if len(parents) < n:
                        parents.append(par)
                        nxt.append(len(parents) - 1)
            level = nxt[:4]
        return parents
    return [-1] + [rng.randrange(c) for c in range(1, n)]


def tree_case(b, n, v, gen, rng, shape, match, kind="softmax"):
    p = probs(b, n, v, gen, kind)
    seeds = torch.randint(-(1 << 63), (1 << 63) - 1, (b,), generator=gen, device=DEV)
    pos = torch.randint(0, 1 << 31, (b,), generator=gen, device=DEV)
    nxt, sib, par_rows, depth_rows = [], [], [], []
    for _ in range(b):
        parents = random_parents(n, rng, shape)
        kids = [[] for _ in range(n)]
        for c in range(1, n):
            kids[parents[c]].append(c)
        first, nsib = [-1] * n, [-1] * n
        for i, ks in enumerate(kids):
            rng.shuffle(ks)  # sibling order is arbitrary
            if ks:
                first[i] = ks[0]
                for a, c in zip(ks, ks[1:]):
                    nsib[a] = c
        depth = [0] * n
        for c in range(1, n):
            depth[c] = depth[parents[c]] + 1
        nxt.append(first)
        sib.append(nsib)
        par_rows.append(parents)
        depth_rows.append(depth)
    depth = torch.tensor(depth_rows, device=DEV)
    y = target_races(p, seeds, pos.unsqueeze(1) + depth)
    parents = torch.tensor(par_rows, device=DEV).clamp(min=0)
    cand = torch.randint(0, v, (b, n), generator=gen, device=DEV)
    take = torch.rand(b, n, generator=gen, device=DEV) < match
    cand = torch.where(take, y.gather(1, parents), cand)
    return cand, torch.tensor(nxt, device=DEV), torch.tensor(sib, device=DEV), p, seeds, pos


TREE_CASES = [
    # (B, N, V, shape, match, kind)
    (128, 8, 163840, "topk", 0.7, "softmax"),
    (512, 8, 4096, "topk", 0.5, "zeros"),
    (64, 16, 32000, "random", 0.6, "softmax"),
    (32, 64, 2000, "random", 0.8, "ties"),
    (16, 6, 262144, "star", 0.5, "softmax"),
    (100, 5, 1000, "chain", 0.9, "softmax"),
    (7, 1, 50, "chain", 0.0, "softmax"),
]


@pytest.mark.parametrize("b, n, v, shape, match, kind", TREE_CASES)
def test_tree_kernel_equals_reference(b, n, v, shape, match, kind):
    gen = torch.Generator(device=DEV).manual_seed(b * n + v)
    rng = random.Random(b * n)
    args = tree_case(b, n, v, gen, rng, shape, match, kind)
    got = coupled_verify_tree(*args, kernel="triton")
    want = coupled_verify_tree(*args, kernel="torch")
    for g, w in zip(got, want):
        assert torch.equal(g, w)
    if n > 1 and match >= 0.6:
        assert int(got[1].sum()) > 0


def test_adversarial_near_ties():
    # p proportional to E = -log(u) of that very stream: all scores nearly equal.
    gen = torch.Generator(device=DEV).manual_seed(23)
    b, k, v = 64, 2, 50000
    seeds = torch.randint(0, 1 << 62, (b,), generator=gen, device=DEV)
    pos = torch.randint(0, 1 << 31, (b,), generator=gen, device=DEV)
    rows = [(-torch.log(hash_uniform(seeds, pos + j, range(v), salt=Stream.TARGET))) for j in range(k + 1)]
    p = torch.stack([(e / e.sum(1, keepdim=True)).float() for e in rows], 1)
    x = torch.randint(0, v, (b, k), generator=gen, device=DEV)
    t1, a1 = coupled_verify_chain(x, p, seeds, pos, kernel="triton")
    t2, a2 = coupled_verify_chain(x, p, seeds, pos, kernel="torch")
    assert torch.equal(t1, t2) and torch.equal(a1, a2)


def capture(fn):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()  # compile outside capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


def test_chain_cuda_graph_replay_sees_new_inputs():
    gen = torch.Generator(device=DEV).manual_seed(21)
    b, k, v = 64, 3, 163840
    bufs = [t.clone() for t in chain_case(b, k, v, gen, 0.9)]
    graph, (tok, acc) = capture(lambda: coupled_verify_chain(*bufs, check=False, kernel="triton"))
    for _ in range(3):
        new = chain_case(b, k, v, gen, 0.9)
        for dst, src in zip(bufs, new):
            dst.copy_(src)
        graph.replay()
        t2, a2 = coupled_verify_chain(*new, kernel="torch")
        assert torch.equal(tok, t2) and torch.equal(acc, a2)


def test_tree_cuda_graph_replay_sees_new_inputs():
    gen = torch.Generator(device=DEV).manual_seed(22)
    rng = random.Random(22)
    b, n, v = 32, 8, 32000
    bufs = [t.clone() for t in tree_case(b, n, v, gen, rng, "topk", 0.7)]
    graph, out = capture(lambda: coupled_verify_tree(*bufs, check=False, kernel="triton"))
    for shape in ("random", "star", "topk"):  # new tree shapes, same buffers
        new = tree_case(b, n, v, gen, rng, shape, 0.7)
        for dst, src in zip(bufs, new):
            dst.copy_(src)
        graph.replay()
        want = coupled_verify_tree(*new, kernel="torch")
        for g, w in zip(out, want):
            assert torch.equal(g, w), shape


def sglang_buffers(b, n, width, gen, slot_dtype=torch.int64, out_dtype=torch.int32):
    """eagle_sample's buffers: distinct, shuffled slots and garbage where the verify writes nothing."""
    slots = torch.randperm(b * n + 5, generator=gen, device=DEV)[: b * n].view(b, n).to(slot_dtype)
    return VerifyOutputs(slots, torch.randint(-99, 99, (b * n + 5,), generator=gen, device=DEV, dtype=out_dtype),
                         torch.randint(-99, 99, (b, width), generator=gen, device=DEV, dtype=out_dtype),
                         torch.randint(-99, 99, (b,), generator=gen, device=DEV, dtype=out_dtype))


def twin(out):
    return VerifyOutputs(*(t.clone() for t in out))


@pytest.mark.parametrize("b, n, v, shape, match, kind", TREE_CASES)
@pytest.mark.parametrize("width, dtypes", [(4, (torch.int64, torch.int32)), (2, (torch.int32, torch.int64))])
def test_tree_kernel_writes_sglang_buffers_as_the_reference(b, n, v, shape, match, kind, width, dtypes):
    """The walk's own writes of predicts / accept_index / accept_token_num == the torch scatter, every entry."""
    gen = torch.Generator(device=DEV).manual_seed(b * n + v + width)
    args = tree_case(b, n, v, gen, random.Random(b * n), shape, match, kind)
    out = sglang_buffers(b, n, width, gen, *dtypes)
    want = twin(out)
    got = coupled_verify_tree(*args, kernel="triton", out=out)
    ref = coupled_verify_tree(*args, kernel="torch", out=want)
    assert all(torch.equal(g, w) for g, w in zip(got, ref))
    for name, g, w in zip(VerifyOutputs._fields, out, want):
        assert torch.equal(g, w), name


@pytest.mark.parametrize("b, k, v, match, kind", CHAIN_CASES)
def test_chain_kernel_writes_sglang_buffers_as_the_reference(b, k, v, match, kind):
    gen = torch.Generator(device=DEV).manual_seed(b + k + v + 1)
    x, p, seeds, pos = chain_case(b, k, v, gen, match, kind)
    out = sglang_buffers(b, k + 1, k + 1, gen)
    want = twin(out)
    got = coupled_verify_chain(x, p, seeds, pos, kernel="triton", out=out)
    ref = coupled_verify_chain(x, p, seeds, pos, kernel="torch", out=want)
    assert all(torch.equal(g, w) for g, w in zip(got, ref))
    for name, g, w in zip(VerifyOutputs._fields, out, want):
        assert torch.equal(g, w), name


def test_tree_cuda_graph_replay_writes_sglang_buffers():
    gen = torch.Generator(device=DEV).manual_seed(24)
    rng = random.Random(24)
    b, n, v = 32, 8, 32000
    bufs = [t.clone() for t in tree_case(b, n, v, gen, rng, "topk", 0.7)]
    out = sglang_buffers(b, n, 4, gen)
    graph, _ = capture(lambda: coupled_verify_tree(*bufs, check=False, kernel="triton", out=out))
    for shape in ("random", "star", "topk"):
        new = tree_case(b, n, v, gen, rng, shape, 0.7)
        for dst, src in zip(bufs, new):
            dst.copy_(src)
        fresh = sglang_buffers(b, n, 4, gen)
        for dst, src in zip(out, fresh):
            dst.copy_(src)
        graph.replay()
        coupled_verify_tree(*new, kernel="torch", out=fresh)
        for name, g, w in zip(VerifyOutputs._fields, out, fresh):
            assert torch.equal(g, w), (shape, name)


def test_unchecked_garbage_links_finish():
    # Cyclic and out-of-range links with check=False must not hang or fault.
    nxt = torch.tensor([[2, 0, 1, 7], [1, 2, 3, -1]], device=DEV)
    sib = torch.tensor([[-1, 1, 3, 2], [-1, 9, 1, -1]], device=DEV)
    p = torch.ones(2, 4, 10, device=DEV)
    out = coupled_verify_tree(torch.zeros(2, 4, dtype=torch.int64, device=DEV), nxt, sib, p, [0, 1], [0, 0],
                              check=False, kernel="triton")
    torch.cuda.synchronize()
    assert out[0].shape == (2, 4)


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__, "-v"]))
