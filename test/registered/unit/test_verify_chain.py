"""Seeded chain verification: semantics, and losslessness against target sampling.

The lossless test decodes K + 1 positions (every position one round of K
drafts can commit: the accepted drafts, then the residual or bonus token)
with a Markov target and a Markov draft (next-token distributions depend on
the previous token), over 2·10^5 seeds as one batch, and compares the joint
distribution of every pair of consecutive committed tokens (and so every
committed position) with exact target sampling by a chi-square test. The
same test with a deliberately correlated stream must fail: that shows it can.
"""

import pytest
import torch
from scipy.stats import chisquare
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_detspec.ops import Stream, exponential_race, hash_uniform, verify_chain
from sglang_detspec.ops import verify_ref

register_cpu_ci(est_time=60, suite="detspec-unit-cpu")

N_SEEDS = 200_000
START = 1_000  # absolute position of the first decided token


def random_chain(v, gen, sharpness):
    """Markov chain rows [V, V] plus an initial distribution [V], float32."""
    trans = torch.softmax(torch.randn(v, v, generator=gen) * sharpness, dim=1)
    init = torch.softmax(torch.randn(v, generator=gen) * sharpness, dim=0)
    return init.float(), trans.float()


def decode(p_init, p_trans, q_init, q_trans, k, seeds, length):
    """The first ``length`` committed tokens per seed (chain drafting + verify_chain, as many rounds as needed)."""
    n = seeds.shape[0]
    committed = torch.full((n, length), -1, dtype=torch.int64)
    count = torch.zeros(n, dtype=torch.int64)
    prev = torch.full((n,), -1, dtype=torch.int64)  # -1: use the initial distributions
    while bool((count < length).any()):
        rows = (count < length).nonzero().squeeze(1)
        pos = START + count[rows]
        s = seeds[rows]
        last = prev[rows]
        drafts, qs, ps = [], [], []
        q_prev = torch.where(last.unsqueeze(1) >= 0, q_trans[last.clamp(min=0)], q_init)
        p_prev = torch.where(last.unsqueeze(1) >= 0, p_trans[last.clamp(min=0)], p_init)
        ps.append(p_prev)
        for j in range(k):
            x = exponential_race(q_prev, s, pos + j, stream=Stream.DRAFT, draft_step=j)[:, 0]
            drafts.append(x)
            qs.append(q_prev)
            q_prev, p_next = q_trans[x], p_trans[x]
            ps.append(p_next)
        tokens, acc = verify_chain(torch.stack(drafts, 1), torch.stack(qs, 1), torch.stack(ps, 1), s, pos)
        for c in range(k + 1):
            live = (c <= acc) & (count[rows] < length)
            r = rows[live]
            committed[r, count[r]] = tokens[live, c]
            prev[r] = tokens[live, c]
            count[r] += 1
    return committed


def pair_pvalue(p_init, p_trans, committed, j):
    """Chi-square p-value of committed tokens (j, j + 1) against exact target sampling's joint distribution."""
    v = p_init.shape[0]
    marginal = p_init.double() @ torch.linalg.matrix_power(p_trans.double(), j)  # the token at position j
    counts = torch.bincount(committed[:, j] * v + committed[:, j + 1], minlength=v * v).double()
    expected = (marginal.unsqueeze(1) * p_trans.double()).reshape(-1) * committed.shape[0]
    expected *= counts.sum() / expected.sum()  # float32 inputs: renormalise the tiny rounding
    keep = expected > 0
    return float(chisquare(counts[keep].numpy(), expected[keep].numpy()).pvalue)


def pvalues(p_init, p_trans, committed) -> list[float]:
    """One p-value per consecutive pair of committed positions: together they cover every position."""
    return [pair_pvalue(p_init, p_trans, committed, j) for j in range(committed.shape[1] - 1)]


CASES = [(4, 2, 1.0), (6, 3, 1.5), (8, 1, 0.7), (5, 3, 0.3)]


@pytest.mark.parametrize("v, k, sharpness", CASES)
def test_lossless_at_every_committed_position(v, k, sharpness):
    gen = torch.Generator().manual_seed(v * 10 + k)
    p_init, p_trans = random_chain(v, gen, sharpness)
    q_init, q_trans = random_chain(v, gen, sharpness)
    seeds = torch.arange(N_SEEDS, dtype=torch.int64) * 7919 + v
    committed = decode(p_init, p_trans, q_init, q_trans, k, seeds, max(k + 1, 2))
    # 2·10^5 samples over at most 64 cells per pair; fixed seeds make the
    # statistics deterministic, and p > 1e-3 (for each of at most 3 pairs)
    # separates a correct sampler from the broken ones below by many orders of magnitude.
    got = pvalues(p_init, p_trans, committed)
    assert min(got) > 1e-3, got


def coins_with_draft_salt(seeds, positions, num_draft):
    # Broken on purpose: the coin reuses the DRAFT stream's key space (token 0, step 0).
    pos = positions.unsqueeze(1) + torch.arange(num_draft)
    return torch.stack([hash_uniform(seeds, pos[:, j], [0], salt=Stream.DRAFT)[:, 0] for j in range(num_draft)], 1)


def coins_reused_across_positions(seeds, positions, num_draft):
    # Broken on purpose: one coin per round, reused for every draft position.
    u = hash_uniform(seeds, positions, [0], salt=Stream.ACCEPT)
    return u.expand(-1, num_draft)


@pytest.mark.parametrize("broken", [coins_with_draft_salt, coins_reused_across_positions])
def test_lossless_test_fails_on_correlated_streams(monkeypatch, broken):
    v, k = 4, 2
    gen = torch.Generator().manual_seed(99)
    # A draft that agrees with the target often, so coins matter at both positions.
    p_init, p_trans = random_chain(v, gen, 1.0)
    q_init = torch.softmax(p_init.log() + 0.8 * torch.randn(v, generator=gen), 0)
    q_trans = torch.softmax(p_trans.log() + 0.8 * torch.randn(v, v, generator=gen), 1)
    seeds = torch.arange(N_SEEDS, dtype=torch.int64) * 7919 + 3
    honest = decode(p_init, p_trans, q_init, q_trans, k, seeds, k + 1)
    assert min(pvalues(p_init, p_trans, honest)) > 1e-3
    monkeypatch.setattr(verify_ref, "accept_coins", broken)
    skewed = decode(p_init, p_trans, q_init, q_trans, k, seeds, k + 1)
    assert min(pvalues(p_init, p_trans, skewed)) < 1e-6


def test_accept_rule_and_positions_by_hand():
    q = torch.tensor([[0.2, 0.2, 0.2, 0.2, 0.2]] * 2).unsqueeze(0)  # [1, 2, 5]
    p = torch.tensor([[0.0, 0.5, 0.5, 0.0, 0.0]] * 3).unsqueeze(0)  # [1, 3, 5]
    seed, t = 77, 500
    # Draft token 0 has p = 0: always rejected; the residual draw lands on 1 or 2.
    tokens, acc = verify_chain(torch.tensor([[0, 1]]), q, p, [seed], [t])
    assert acc.tolist() == [0] and tokens[0, 1:].tolist() == [-1, -1] and tokens[0, 0] in (1, 2)
    resid = torch.clamp_min(p[0, 0] - q[0, 0], 0)
    want = exponential_race(resid.unsqueeze(0), [seed], [t], stream="resample")[0, 0]
    assert int(tokens[0, 0]) == int(want)
    # q[x] <= p[x] for both drafts: both accepted, bonus drawn at t + 2 on the BONUS stream.
    tokens, acc = verify_chain(torch.tensor([[1, 2]]), q, p, [seed], [t])
    assert acc.tolist() == [2]
    bonus = exponential_race(p[:, 2], [seed], [t + 2], stream="bonus")[0, 0]
    assert tokens[0].tolist() == [1, 2, int(bonus)]
    # The coin decides exactly by u * q[x] < p[x].
    p2 = p.clone()
    p2[0, 0] = torch.tensor([0.1, 0.1, 0.0, 0.4, 0.4])
    u = float(hash_uniform([seed], [t], [0], salt=Stream.ACCEPT))
    tokens, acc = verify_chain(torch.tensor([[1, 3]]), q, p2, [seed], [t])
    assert (int(acc) >= 1) == (u * 0.2 < 0.1)


def test_all_zero_residual_falls_back_to_target():
    # p == q, and the draft token has q[x] = p[x] = 0: the coin rejects
    # (u * 0 < 0 is false) and the residual max(p - q, 0) is all zero. The
    # checks refuse q[x] = 0 as input, so this fallback is only reachable
    # unchecked (the CUDA-graph path), where it must still emit a valid token.
    q = torch.tensor([[[0.0, 1.0, 0.0]]])
    p = torch.tensor([[[0.0, 1.0, 0.0], [0.2, 0.3, 0.5]]])
    with pytest.raises(ValueError, match=r"draft_tokens\[0, 0\] = 0 has draft probability 0"):
        verify_chain(torch.tensor([[0]]), q, p, [1], [0])
    tokens, acc = verify_chain(torch.tensor([[0]]), q, p, [1], [0], check=False)
    assert acc.tolist() == [0] and tokens[0].tolist() == [1, -1]


def test_batch_permutation_and_split_invariance():
    gen = torch.Generator().manual_seed(5)
    b, k, v = 40, 3, 50
    q = torch.softmax(torch.randn(b, k, v, generator=gen), -1)
    p = torch.softmax(torch.randn(b, k + 1, v, generator=gen), -1)
    x = torch.multinomial(q.reshape(-1, v), 1, generator=gen).reshape(b, k)
    seeds = torch.randint(0, 1 << 62, (b,), generator=gen)
    pos = torch.randint(0, 1 << 30, (b,), generator=gen)
    tok, acc = verify_chain(x, q, p, seeds, pos)
    perm = torch.randperm(b, generator=gen)
    tp, ap = verify_chain(x[perm], q[perm], p[perm], seeds[perm], pos[perm])
    assert torch.equal(tp, tok[perm]) and torch.equal(ap, acc[perm])
    ts, as_ = zip(*(verify_chain(x[s], q[s], p[s], seeds[s], pos[s]) for s in (slice(0, 7), slice(7, 40))))
    assert torch.equal(torch.cat(ts), tok) and torch.equal(torch.cat(as_), acc)
    # Padding is -1 exactly after the emitted token.
    for r in range(b):
        n = int(acc[r]) + 1
        assert (tok[r, :n] >= 0).all() and (tok[r, n:] == -1).all()
        assert tok[r, : int(acc[r])].tolist() == x[r, : int(acc[r])].tolist()


def test_zero_draft_tokens_is_a_bonus_draw():
    p = torch.softmax(torch.randn(3, 1, 9), -1)
    tok, acc = verify_chain(torch.zeros(3, 0, dtype=torch.int64), torch.zeros(3, 0, 9), p, [1, 2, 3], [4, 5, 6])
    assert acc.tolist() == [0, 0, 0]
    assert torch.equal(tok[:, 0], exponential_race(p[:, 0], [1, 2, 3], [4, 5, 6], stream="bonus")[:, 0])


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__, "-v"]))
