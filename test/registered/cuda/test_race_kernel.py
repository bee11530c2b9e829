"""Triton exponential race == torch reference, bit for bit, on the same CUDA device."""

import struct

import pytest
import torch

from _register import register_cuda_ci
from sglang_detspec.ops import Stream, exponential_race, hash_uniform, keyed_hash

register_cuda_ci(est_time=120, suite="detspec-kernels-cuda")

DEV = "cuda"
U32 = 1 << 32


def make_case(b, v, gen, kind):
    if kind == "softmax":
        w = torch.softmax(torch.randn(b, v, generator=gen, device=DEV) * 4, dim=1)
    elif kind == "zeros":
        w = torch.rand(b, v, generator=gen, device=DEV)
        w[torch.rand(b, v, generator=gen, device=DEV) < 0.9] = 0
        w[:, v // 2] = 1e-3  # at least one positive entry per row
    elif kind == "ties":
        w = torch.ones(b, v, device=DEV)  # equal weights: the hash decides, ties go to the smaller id
    else:  # peaked: one dominant token
        w = torch.full((b, v), 1e-9, device=DEV)
        w[torch.arange(b), torch.randint(0, v, (b,), generator=gen, device=DEV)] = 1.0
    seeds = torch.randint(-(1 << 63), (1 << 63) - 1, (b,), generator=gen, device=DEV)
    pos = torch.randint(0, U32 - 1, (b,), generator=gen, device=DEV)
    return w, seeds, pos


CASES = [
    # (B, V, num_samples, draft_step, kind)
    (512, 1000, 1, 0, "softmax"),
    (512, 4097, 1, 3, "zeros"),
    (256, 32000, 1, 1, "ties"),
    (128, 151936, 1, 2, "softmax"),
    (64, 163840, 1, 0, "peaked"),
    (8, 262144, 1, 5, "softmax"),
    (1, 262144, 1, 0, "softmax"),
    (3, 1, 1, 7, "softmax"),
    (512, 2000, 2, 0, "softmax"),
    (300, 5003, 4, 1, "zeros"),
    (64, 163840, 8, 0, "softmax"),
    (16, 32000, 8, 2, "ties"),
    (2, 151936, 3, 0, "softmax"),
]


@pytest.mark.parametrize("b, v, k, step, kind", CASES)
@pytest.mark.parametrize("stream", list(Stream))
def test_kernel_equals_reference(b, v, k, step, kind, stream):
    gen = torch.Generator(device=DEV).manual_seed(b * 7 + v + k)
    w, seeds, pos = make_case(b, v, gen, kind)
    if stream is not Stream.DRAFT:
        step = 0
    kw = dict(stream=stream, draft_step=step, num_samples=k)
    got = exponential_race(w, seeds, pos, kernel="triton", **kw)
    want = exponential_race(w, seeds, pos, kernel="torch", **kw)
    assert got.device.type == "cuda"
    assert torch.equal(got, want)
    # The winners' scores, as the kernel compared them, are the reference's float64 values bit for bit.
    got_ids, got_scores = exponential_race(w, seeds, pos, kernel="triton", return_scores=True, **kw)
    want_ids, want_scores = exponential_race(w, seeds, pos, kernel="torch", return_scores=True, **kw)
    assert torch.equal(got_ids, got) and torch.equal(want_ids, want)
    assert got_scores.dtype == torch.float64 and torch.equal(got_scores, want_scores)


@pytest.mark.parametrize("b, v, k, kind", [(64, 128256, 4, "softmax"), (33, 32000, 4, "ties"), (8, 5003, 8, "zeros"),
                                        (128, 4097, 1, "softmax"), (3, 151936, 1, "ties")])
def test_unit_rows_equal_the_reference(b, v, k, kind):
    """Rows that rank their weights alone (greedy drafts) beside drawn rows: kernel == reference, ids and scores."""
    gen = torch.Generator(device=DEV).manual_seed(b + v + k)
    w, seeds, pos = make_case(b, v, gen, kind)
    unit = torch.arange(b, device=DEV) % 3 == 0
    kw = dict(stream=Stream.TARGET, num_samples=k, return_scores=True, unit_rows=unit)
    got_ids, got_scores = exponential_race(w, seeds, pos, kernel="triton", **kw)
    want_ids, want_scores = exponential_race(w, seeds, pos, kernel="torch", **kw)
    assert torch.equal(got_ids, want_ids) and torch.equal(got_scores, want_scores)
    order = torch.sort(w.double(), dim=1, descending=True, stable=True)
    assert torch.equal(got_ids[unit], order.indices[unit, :k]) and torch.equal(got_scores[unit], order.values[unit, :k])
    drawn = exponential_race(w, seeds, pos, stream=Stream.TARGET, num_samples=k, kernel="triton")
    assert torch.equal(got_ids[~unit], drawn[~unit])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("k", [1, 4])
def test_adversarial_near_ties(dtype, k):
    # w_i = -log(u_i) makes every score w_i / E_i equal up to rounding: the
    # float32 pre-filter sees near-ties everywhere and the tie rule decides.
    gen = torch.Generator(device=DEV).manual_seed(17)
    b, v = 64, 70000
    seeds = torch.randint(0, 1 << 62, (b,), generator=gen, device=DEV)
    pos = torch.randint(0, 1 << 31, (b,), generator=gen, device=DEV)
    u = hash_uniform(seeds, pos, range(v), salt=Stream.BONUS)
    w = (-torch.log(u)).to(dtype)
    w[:, ::7] *= 1 + 1e-7  # a few scores a hair above the rest
    a = exponential_race(w, seeds, pos, stream="bonus", num_samples=k, kernel="triton")
    assert torch.equal(a, exponential_race(w, seeds, pos, stream="bonus", num_samples=k, kernel="torch"))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_every_weight_dtype(dtype):
    gen = torch.Generator(device=DEV).manual_seed(11)
    w, seeds, pos = make_case(512, 3001, gen, "softmax")
    w = w.to(dtype)
    for k in (1, 3):
        a = exponential_race(w, seeds, pos, stream="draft", num_samples=k, kernel="triton")
        b = exponential_race(w, seeds, pos, stream="draft", num_samples=k, kernel="torch")
        assert torch.equal(a, b)


def test_non_contiguous_rows():
    gen = torch.Generator(device=DEV).manual_seed(2)
    big = torch.rand(64, 2, 5000, generator=gen, device=DEV)
    w = big[:, 1]  # row stride 10000
    seeds = torch.arange(64, device=DEV)
    pos = torch.arange(64, device=DEV) * 3
    a = exponential_race(w, seeds, pos, stream="draft", kernel="triton")
    assert torch.equal(a, exponential_race(w.contiguous(), seeds, pos, stream="draft", kernel="torch"))


def sglang_fast_sample_seeded(probs, seeds, positions, draft_step):
    """SGLang 0.5.23's seeded draft proposal as it is defined: the full [B, V]
    hash matrix of the salted seed, then float64 add 0.5, / 2**32, log, neg,
    reciprocal, * probs, argmax."""
    v = probs.shape[1]
    cols = range(draft_step * v, draft_step * v + v)
    hashed = keyed_hash(seeds, positions, cols, salt=Stream.DRAFT.salt)
    scores = hashed.to(torch.float64)
    scores.add_(0.5).div_(2.0**32).log_().neg_().reciprocal_()
    scores.mul_(probs)
    return scores.argmax(dim=-1, keepdim=True)


@pytest.mark.parametrize("b, v, step", [(128, 163840, 0), (32, 151936, 2), (512, 32000, 1)])
def test_draft_stream_equals_sglang_seeded_fast_sample(b, v, step):
    gen = torch.Generator(device=DEV).manual_seed(v + step)
    w, seeds, pos = make_case(b, v, gen, "softmax")
    ours = exponential_race(w, seeds, pos, stream=Stream.DRAFT, draft_step=step, kernel="triton")
    assert torch.equal(ours, sglang_fast_sample_seeded(w, seeds, pos, step))


def test_draft_stream_equals_sglang_fast_sample_itself():
    spec_utils = pytest.importorskip(
        "sglang.srt.speculative.spec_utils", reason="SGLang is not installed on this GPU machine"
    )
    fast_sample = getattr(spec_utils.fast_sample, "__wrapped__", spec_utils.fast_sample)  # unhooked
    gen = torch.Generator(device=DEV).manual_seed(31)
    w, seeds, pos = make_case(64, 151936, gen, "softmax")
    for step in (0, 3):
        _, idx = fast_sample(w, 1, sampling_seed=seeds, positions=pos, draft_step=step)
        ours = exponential_race(w, seeds, pos, stream=Stream.DRAFT, draft_step=step, kernel="triton")
        assert torch.equal(ours, idx)


def test_hash_on_cuda_matches_mmh3():
    mmh3 = pytest.importorskip("mmh3", reason="the mmh3 oracle is not installed")
    gen = torch.Generator(device=DEV).manual_seed(5)
    seeds = torch.randint(-(1 << 63), (1 << 63) - 1, (64,), generator=gen, device=DEV)
    pos = torch.randint(0, U32 - 1, (64,), generator=gen, device=DEV)
    cols = list(range(0, 1 << 32, (1 << 32) // 40))
    h = keyed_hash(seeds, pos, cols, salt=Stream.DRAFT).cpu()
    for i, (s, p) in enumerate(zip(seeds.tolist(), pos.tolist())):
        key = (s + Stream.DRAFT.salt) % (1 << 64)
        for j, c in enumerate(cols):
            msg = struct.pack("<IIII", key & (U32 - 1), key >> 32, p, c)
            assert int(h[i, j]) == mmh3.hash(msg, 0, signed=False)


def test_cuda_graph_replay_sees_new_seeds_and_positions():
    gen = torch.Generator(device=DEV).manual_seed(9)
    b, v = 32, 163840
    w, seeds, pos = make_case(b, v, gen, "softmax")
    static_w, static_s, static_p = w.clone(), seeds.clone(), pos.clone()
    for k in (1, 4):
        fn = lambda: exponential_race(static_w, static_s, static_p, stream="draft", draft_step=1,  # noqa: E731
                                      num_samples=k, check=False, kernel="triton")
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn()  # compile outside capture
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = fn()
        for trial in range(3):
            w2, s2, p2 = make_case(b, v, gen, "softmax")
            static_w.copy_(w2)
            static_s.copy_(s2)
            static_p.copy_(p2)
            graph.replay()
            eager = exponential_race(w2, s2, p2, stream="draft", draft_step=1, num_samples=k, kernel="triton")
            assert torch.equal(out, eager), (k, trial)
            assert torch.equal(out, exponential_race(w2, s2, p2, stream="draft", draft_step=1,
                                                     num_samples=k, kernel="torch"))


def test_cpu_and_cuda_disagree_only_on_one_ulp_near_ties():
    # torch's CPU float64 log differs from CUDA's by 1 ulp on a small fraction of
    # inputs; a draw may flip only where the best two CPU scores are that close.
    gen = torch.Generator(device=DEV).manual_seed(13)
    b, v = 256, 163840
    w, seeds, pos = make_case(b, v, gen, "softmax")
    gpu = exponential_race(w, seeds, pos, stream="draft", kernel="triton")[:, 0].cpu()
    cpu = exponential_race(w.cpu(), seeds.cpu(), pos.cpu(), stream="draft")[:, 0]
    flips = (gpu != cpu).nonzero().squeeze(1).tolist()
    for r in flips:
        u = hash_uniform(seeds[r : r + 1].cpu(), pos[r : r + 1].cpu(), range(v), salt=Stream.DRAFT)[0]
        scores = w[r].cpu().double() * (1.0 / -torch.log(u))
        a, c = float(scores[cpu[r]]), float(scores[gpu[r]])
        assert abs(a - c) <= 4 * torch.finfo(torch.float64).eps * abs(a), (r, a, c)
    print(f"CPU vs CUDA: {len(flips)} of {b} draws differ (V = {v})")


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__, "-v"]))
