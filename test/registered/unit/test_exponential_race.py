"""Exponential race: oracle equality, batch invariance and distribution."""

import itertools
import math
import random
import struct

import mmh3
import pytest
import torch
from scipy.stats import chisquare
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_detspec.ops import Stream, exponential_race, hash_uniform
from sglang_detspec.ops import race_ref

register_cpu_ci(est_time=60, suite="detspec-unit-cpu")

U32, U64 = 1 << 32, 1 << 64


def mmh3_race(weights, seed, position, salt, column_offset=0):
    """Independent oracle: Python floats over mmh3 hashes, first maximum wins."""
    key = (seed + salt) % U64
    best, arg = -1.0, -1
    for i, w in enumerate(weights):
        h = mmh3.hash(struct.pack("<IIII", key & (U32 - 1), key >> 32, position, column_offset + i), 0, signed=False)
        score = float(w) * (1.0 / -math.log((h + 0.5) / U32))
        if score > best:
            best, arg = score, i
    return arg


def test_equals_mmh3_oracle():
    rng = random.Random(7)
    gen = torch.Generator().manual_seed(7)
    b, v = 24, 97
    w = torch.rand(b, v, generator=gen, dtype=torch.float64) ** 3
    w[:, ::5] = 0  # zero weights never win
    seeds = [rng.getrandbits(64) for _ in range(b)]
    positions = [rng.getrandbits(32) for _ in range(b)]
    for stream, step in [(Stream.DRAFT, 0), (Stream.DRAFT, 3), (Stream.RESAMPLE, 0), (Stream.BONUS, 0)]:
        got = exponential_race(w, seeds, positions, stream=stream, draft_step=step)[:, 0]
        want = [mmh3_race(w[i].tolist(), seeds[i], positions[i], stream.salt, step * v) for i in range(b)]
        assert got.tolist() == want, stream


def full_matrix_race(w, seeds, positions, stream, step=0, k=1):
    """The materialized definition: full [B, V] float64 score matrix, argmax / stable top-k."""
    v = w.shape[1]
    u = hash_uniform(seeds, positions, range(step * v, step * v + v), salt=stream)
    scores = w.double() * (1.0 / -torch.log(u))
    if k == 1:
        return scores.argmax(dim=1, keepdim=True)
    return torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :k]


@pytest.mark.parametrize("k", [1, 2, 5])
def test_chunked_walk_equals_full_matrix(monkeypatch, k):
    # Force many chunks, with V not a multiple of the chunk width.
    monkeypatch.setattr(race_ref, "CHUNK_ELEMENTS", 1 << 12)
    gen = torch.Generator().manual_seed(k)
    b, v = 9, 5000
    w = torch.rand(b, v, generator=gen)
    seeds, positions = list(range(100, 100 + b)), list(range(7, 7 + b))
    assert race_ref.chunk_size(b, v) < v
    got = exponential_race(w, seeds, positions, stream="draft", draft_step=2, num_samples=k)
    want = full_matrix_race(w, seeds, positions, Stream.DRAFT, step=2, k=k)
    assert torch.equal(got, want)


def test_replay_permutation_and_split_give_identical_draws():
    gen = torch.Generator().manual_seed(3)
    b, v = 32, 3000
    w = torch.softmax(torch.randn(b, v, generator=gen) * 3, dim=1)
    seeds = torch.randint(-(1 << 62), 1 << 62, (b,), generator=gen)
    positions = torch.randint(0, 1 << 20, (b,), generator=gen)
    full = exponential_race(w, seeds, positions, stream=Stream.DRAFT, num_samples=3)
    assert torch.equal(full, exponential_race(w, seeds, positions, stream=Stream.DRAFT, num_samples=3))
    perm = torch.randperm(b, generator=gen)
    permuted = exponential_race(w[perm], seeds[perm], positions[perm], stream=Stream.DRAFT, num_samples=3)
    assert torch.equal(permuted, full[perm])
    parts = [exponential_race(w[s], seeds[s], positions[s], stream=Stream.DRAFT, num_samples=3)
             for s in (slice(0, 1), slice(1, 13), slice(13, 32))]
    assert torch.equal(torch.cat(parts), full)


def test_different_seed_position_step_stream_give_different_draws():
    v = 1000
    w = torch.ones(256, v)
    seeds, positions = [11] * 256, list(range(256))
    base = exponential_race(w, seeds, positions, stream="draft")
    variants = [
        exponential_race(w, [12] * 256, positions, stream="draft"),
        exponential_race(w, seeds, [p + 1 for p in positions], stream="draft"),
        exponential_race(w, seeds, positions, stream="draft", draft_step=1),
        exponential_race(w, seeds, positions, stream="resample"),
        exponential_race(w, seeds, positions, stream="bonus"),
    ]
    for other in variants:
        # Uniform over 1000 tokens: agreeing on more than 5% of 256 rows would mean shared randomness.
        assert (other == base).float().mean() < 0.05


def test_draws_match_target_within_tv_0005():
    p = torch.tensor([0.1, 0.2, 0.7])
    n = 100_000
    for seeds, positions in [(range(n), [17] * n), ([123456789] * n, range(n))]:
        draws = exponential_race(p.expand(n, 3), list(seeds), list(positions), stream="bonus")[:, 0]
        freq = torch.bincount(draws, minlength=3).double() / n
        tv = 0.5 * float((freq - p.double()).abs().sum())
        assert tv < 0.005, (freq, tv)


def test_weights_need_not_be_normalised():
    w = torch.tensor([[1.0, 2.0, 7.0]]).expand(50, 3)
    a = exponential_race(w, range(50), [3] * 50, stream="draft")
    b = exponential_race(w / 10, range(50), [3] * 50, stream="draft")
    assert torch.equal(a, b)


def plackett_luce(w, seq):
    total, prob = sum(w), 1.0
    for i in seq:
        prob *= w[i] / total
        total -= w[i]
    return prob


@pytest.mark.parametrize("k", [2, 3, 4])
def test_top_k_matches_exact_plackett_luce(k):
    w = [0.4, 0.3, 0.2, 0.1]
    n = 60_000
    draws = exponential_race(torch.tensor(w).expand(n, 4), range(n), [99] * n, stream="draft", num_samples=k)
    assert all(len(set(r)) == k for r in draws.tolist()[:1000])
    seqs = list(itertools.permutations(range(4), k))
    index = {s: i for i, s in enumerate(seqs)}
    counts = torch.zeros(len(seqs))
    for row in draws.tolist():
        counts[index[tuple(row)]] += 1
    expected = torch.tensor([plackett_luce(w, s) for s in seqs]) * n
    assert abs(float(expected.sum()) - n) < 1e-6
    # Fixed seeds make the statistic deterministic; 1e-3 keeps a correct sampler far from the edge.
    assert chisquare(counts.numpy(), expected.numpy()).pvalue > 1e-3


def test_zero_weight_never_drawn():
    w = torch.tensor([[0.0, 1.0, 0.0, 1e-30]]).expand(5000, 4)
    d = exponential_race(w, range(5000), [0] * 5000, stream="draft")[:, 0]
    assert set(d.tolist()) <= {1, 3}


@pytest.mark.parametrize("k", [1, 4])
def test_unit_rows_rank_their_weights_and_leave_the_other_rows_drawn(k, monkeypatch):
    """unit_rows: the weights' own top-k (scores the float64 weights, ties to the smaller id, independently of
    the chunking), the other rows' draws and scores unchanged; a wrong unit_rows names itself."""
    gen = torch.Generator().manual_seed(3)
    w = torch.rand(6, 3000, generator=gen)
    w[2, 2900] = w[2, 17] = w[2, 1500] = 9.0  # a three-way tie at the top, across chunks below
    unit = torch.tensor([True, False, True, False, True, True])
    seeds, pos = list(range(6)), [41] * 6
    drawn = exponential_race(w, seeds, pos, stream=Stream.TARGET, num_samples=k, return_scores=True, kernel="torch")
    for chunk in (3000, 1024):
        monkeypatch.setattr(race_ref, "chunk_size", lambda b, v, c=chunk: c)
        ids, scores = exponential_race(w, seeds, pos, stream=Stream.TARGET, num_samples=k, return_scores=True,
                                       kernel="torch", unit_rows=unit)
        order = torch.sort(w.double(), dim=1, descending=True, stable=True)  # stable: ties to the smaller id
        assert torch.equal(ids[unit], order.indices[unit, :k]) and torch.equal(scores[unit], order.values[unit, :k])
        assert torch.equal(ids[~unit], drawn[0][~unit]) and torch.equal(scores[~unit], drawn[1][~unit])
        assert ids[2, :min(k, 3)].tolist() == [17, 1500, 2900][:k]
    with pytest.raises(ValueError, match="unit_rows must be a bool tensor of shape \\(6,\\)"):
        exponential_race(w, seeds, pos, stream=Stream.TARGET, unit_rows=unit[:3])
    with pytest.raises(ValueError, match="unit_rows"):
        exponential_race(w, seeds, pos, stream=Stream.TARGET, unit_rows=unit.int())


def test_empty_batch_returns_empty():
    out = exponential_race(torch.ones(0, 10), [], [], stream="draft", num_samples=2)
    assert out.shape == (0, 2) and out.dtype == torch.int64
    ids, scores = exponential_race(torch.ones(0, 10), [], [], stream="draft", num_samples=2, return_scores=True)
    assert ids.shape == scores.shape == (0, 2) and scores.dtype == torch.float64


@pytest.mark.parametrize("k", [1, 3])
def test_returned_scores_are_the_winners_race_keys_and_the_full_matrix_values(k, monkeypatch):
    """The scores the race returns are its winners' keys: the materialized score matrix's values there,
    and ``race_keys`` of the winners, bit for bit (the chunked walk keeps each value it compared)."""
    from sglang_detspec.ops import race_keys

    gen = torch.Generator().manual_seed(11)
    b, v = 9, 3000
    monkeypatch.setattr(race_ref, "CHUNK_ELEMENTS", 1)  # chunks of MIN_CHUNK = 1024 columns: three chunks
    w = torch.rand(b, v, generator=gen, dtype=torch.float32) ** 4
    w[:, ::7] = 0
    seeds = torch.randint(0, 2**62, (b,), generator=gen)
    pos = torch.randint(0, 2**31, (b,), generator=gen)
    ids, scores = exponential_race(w, seeds, pos, stream=Stream.TARGET, num_samples=k, return_scores=True)
    assert torch.equal(ids, exponential_race(w, seeds, pos, stream=Stream.TARGET, num_samples=k))
    u = hash_uniform(seeds.tolist(), pos.tolist(), range(v), salt=Stream.TARGET)
    matrix = w.double() * torch.reciprocal(-torch.log(u))
    assert torch.equal(scores, matrix.gather(1, ids))
    assert torch.equal(scores, race_keys(w.gather(1, ids), seeds, pos, ids, Stream.TARGET))
    assert bool((scores[:, :-1] >= scores[:, 1:]).all())  # in race order


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_low_precision_weights_are_read_exactly(dtype):
    w = torch.rand(6, 300, generator=torch.Generator().manual_seed(1)).to(dtype)
    got = exponential_race(w, range(6), range(6), stream="draft")
    assert torch.equal(got, full_matrix_race(w, range(6), range(6), Stream.DRAFT))


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__, "-v"]))
