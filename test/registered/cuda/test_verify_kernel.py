"""Triton chain verify == torch reference, bit for bit, on the same CUDA device."""

import pytest
import torch

from _register import register_cuda_ci
from sglang_detspec.ops import exponential_race, verify_chain

register_cuda_ci(est_time=90, suite="detspec-kernels-cuda")

DEV = "cuda"


def make_case(b, k, v, gen, accept, dtype=torch.float32):
    """Draft/target pair; ``accept`` in [0, 1] mixes q into p to raise acceptance."""
    q = torch.softmax(torch.randn(b, k, v, generator=gen, device=DEV) * 3, -1)
    p = torch.softmax(torch.randn(b, k + 1, v, generator=gen, device=DEV) * 3, -1)
    if k:
        p[:, :k] = (1 - accept) * p[:, :k] + accept * q
    x = (
        torch.multinomial(q.reshape(-1, v), 1, generator=gen).reshape(b, k)
        if k
        else torch.zeros(b, 0, dtype=torch.int64, device=DEV)
    )
    seeds = torch.randint(-(1 << 63), (1 << 63) - 1, (b,), generator=gen, device=DEV)
    pos = torch.randint(0, (1 << 32) - k - 1, (b,), generator=gen, device=DEV)
    return x, q.to(dtype), p.to(dtype), seeds, pos


CASES = [
    # (B, K, V, accept mix)
    (512, 3, 4096, 0.0),
    (512, 3, 4096, 0.95),
    (256, 7, 32000, 0.9),
    (128, 1, 151936, 0.5),
    (64, 7, 163840, 0.99),
    (4, 3, 262144, 0.9),
    (1000, 0, 777, 0.0),
    (2000, 2, 33, 0.8),
    (4000, 5, 8, 0.7),
]


@pytest.mark.parametrize("b, k, v, mix", CASES)
def test_kernel_equals_reference(b, k, v, mix):
    gen = torch.Generator(device=DEV).manual_seed(b + k + v)
    x, q, p, seeds, pos = make_case(b, k, v, gen, mix)
    t1, a1 = verify_chain(x, q, p, seeds, pos, kernel="triton")
    t2, a2 = verify_chain(x, q, p, seeds, pos, kernel="torch")
    assert torch.equal(a1, a2)
    assert torch.equal(t1, t2)
    if k and mix >= 0.9:
        assert float(a1.double().mean()) > 0.5 * k  # the accept and bonus paths are exercised


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_other_prob_dtypes(dtype):
    gen = torch.Generator(device=DEV).manual_seed(3)
    x, q, p, seeds, pos = make_case(512, 3, 5000, gen, 0.8, dtype)
    t1, a1 = verify_chain(x, q, p, seeds, pos, kernel="triton")
    t2, a2 = verify_chain(x, q, p, seeds, pos, kernel="torch")
    assert torch.equal(t1, t2) and torch.equal(a1, a2)


def test_all_zero_residual_fallback_and_bonus_stream():
    # Row 0: q == p one-hot elsewhere, draft token has q = p = 0 -> residual all zero.
    v = 3000
    q = torch.zeros(2, 1, v, device=DEV)
    p = torch.zeros(2, 2, v, device=DEV)
    q[0, 0, 5] = 1.0
    p[0, 0, 5] = 1.0
    p[:, 1] = torch.softmax(torch.randn(2, v, device=DEV), -1)
    q[1, 0] = p[1, 0] = torch.softmax(torch.randn(v, device=DEV), -1)  # row 1: q == p, always accepted
    x = torch.tensor([[7], [int(q[1, 0].argmax())]], device=DEV)
    seeds, pos = torch.tensor([1, 2], device=DEV), torch.tensor([10, 20], device=DEV)
    # q[x] = 0 is refused by the checks; the fallback is the unchecked (graph) path.
    t1, a1 = verify_chain(x, q, p, seeds, pos, check=False, kernel="triton")
    t2, a2 = verify_chain(x, q, p, seeds, pos, check=False, kernel="torch")
    assert torch.equal(t1, t2) and torch.equal(a1, a2)
    assert t1[0].tolist() == [5, -1] and a1.tolist() == [0, 1]
    bonus = exponential_race(p[1:, 1], seeds[1:], pos[1:] + 1, stream="bonus", kernel="triton")
    assert int(t1[1, 1]) == int(bonus)


def test_cuda_graph_replay_sees_new_inputs():
    gen = torch.Generator(device=DEV).manual_seed(21)
    b, k, v = 64, 3, 163840
    bufs = [t.clone() for t in make_case(b, k, v, gen, 0.9)]
    fn = lambda: verify_chain(*bufs, check=False, kernel="triton")  # noqa: E731
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tok, acc = fn()
    for _ in range(3):
        new = make_case(b, k, v, gen, 0.9)
        for dst, src in zip(bufs, new):
            dst.copy_(src)
        graph.replay()
        t2, a2 = verify_chain(*new, kernel="torch")
        assert torch.equal(tok, t2) and torch.equal(acc, a2)


def test_bonus_race_under_adversarial_near_ties():
    # K = 0: the bonus draw races p_0 at position t. p_i proportional to
    # -log(u_i) of that very stream makes every score nearly equal.
    from sglang_detspec.ops import Stream, hash_uniform

    gen = torch.Generator(device=DEV).manual_seed(23)
    b, v = 64, 50000
    seeds = torch.randint(0, 1 << 62, (b,), generator=gen, device=DEV)
    pos = torch.randint(0, 1 << 31, (b,), generator=gen, device=DEV)
    e = -torch.log(hash_uniform(seeds, pos, range(v), salt=Stream.BONUS))
    p = (e / e.sum(dim=1, keepdim=True)).float().unsqueeze(1)
    x = torch.zeros(b, 0, dtype=torch.int64, device=DEV)
    q = torch.zeros(b, 0, v, device=DEV)
    t1, a1 = verify_chain(x, q, p, seeds, pos, kernel="triton")
    t2, a2 = verify_chain(x, q, p, seeds, pos, kernel="torch")
    assert torch.equal(t1, t2) and torch.equal(a1, a2)


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__, "-v"]))
