"""Coupled (drafter-invariant) verification: the committed tokens are the TARGET races.

Oracles: the plain per-position draw ``y_t = exponential_race(p_t, TARGET, t)``
computed one position at a time, a plain-Python tree walk, exact target
probabilities (chi-square), and the (1 - TV)/(1 + TV) coupling bound, which a
draft on another stream (no coupling) must fail.
"""

import random

import pytest
import torch
from hypothesis import given, settings, strategies as st
from scipy.stats import chisquare
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_detspec.ops import Stream, coupled_verify_chain, coupled_verify_tree, exponential_race
from sglang_detspec.ops.verify_outputs import VerifyOutputs, write_verify_outputs

register_cpu_ci(est_time=120, suite="detspec-unit-cpu")

U32, U64 = 1 << 32, 1 << 64


def y_at(p_row, seed, position):
    """The plain TARGET draw at one position: int."""
    return int(exponential_race(p_row.unsqueeze(0), [seed], [position], stream=Stream.TARGET)[0, 0])


# ---- chains -----------------------------------------------------------------


@pytest.mark.parametrize("b, k, v, match", [(16, 3, 40, 0.8), (8, 1, 7, 0.5), (12, 5, 100, 0.95), (5, 0, 9, 0.0)])
def test_chain_equals_per_position_races(b, k, v, match):
    gen = torch.Generator().manual_seed(b * 100 + k)
    rng = random.Random(k)
    p = torch.softmax(torch.randn(b, k + 1, v, generator=gen) * 2, -1)
    seeds = [rng.getrandbits(64) for _ in range(b)]
    pos = [rng.randrange(0, U32 - k - 1) for _ in range(b)]
    ys = [[y_at(p[r, j], seeds[r], pos[r] + j) for j in range(k + 1)] for r in range(b)]
    # Drafts agree with y with probability `match` per token, else differ.
    x = torch.tensor([[ys[r][j] if rng.random() < match else (ys[r][j] + 1) % v for j in range(k)] for r in range(b)],
                     dtype=torch.int64).reshape(b, k)
    tokens, acc = coupled_verify_chain(x, p, seeds, pos)
    for r in range(b):
        n = 0
        while n < k and int(x[r, n]) == ys[r][n]:
            n += 1
        assert int(acc[r]) == n
        assert tokens[r].tolist() == ys[r][: n + 1] + [-1] * (k - n)


# ---- trees ------------------------------------------------------------------


def tree_from_parents(parents, order_rng=None):
    """Links (next_token, next_sibling) from a parent list; sibling order shuffled by order_rng."""
    n = len(parents)
    children = [[] for _ in range(n)]
    for c in range(1, n):
        children[parents[c]].append(c)
    nxt, sib = [-1] * n, [-1] * n
    for i, kids in enumerate(children):
        if order_rng is not None:
            order_rng.shuffle(kids)
        if kids:
            nxt[i] = kids[0]
            for a, c in zip(kids, kids[1:]):
                sib[a] = c
    return nxt, sib


def topk_expansion(topk, depth, num_draft):
    """SGLang-like top-k expansion: each level expands the first `topk` nodes of the previous level."""
    parents, level = [-1], [0]
    while len(parents) < num_draft:
        nxt_level = []
        for par in level:
            for _ in range(topk):
                if len(parents) < num_draft:
                    parents.append(par)
                    nxt_level.append(len(parents) - 1)
        level = nxt_level[:topk]
        depth -= 1
        if depth == 0:
            break
    return parents


SHAPES = {
    "chain": [-1, 0, 1, 2, 3],
    "star": [-1, 0, 0, 0, 0, 0],
    "two_chains": [-1, 0, 0, 1, 2, 3, 4],
    "topk4_8": topk_expansion(4, 3, 8),
    "topk2_10": topk_expansion(2, 5, 10),
    "root_only": [-1],
}


def walk_oracle(parents, cand, p, seed, t):
    """Plain-Python walk: race per visited node at t + depth; smallest matching child."""
    n = len(parents)
    cur, depth, tokens, path = 0, 0, [], [0]
    while True:
        y = y_at(p[cur], seed, t + depth)
        tokens.append(y)
        hits = [c for c in range(1, n) if parents[c] == cur and cand[c] == y]
        if not hits:
            return tokens, len(path) - 1, path
        cur = min(hits)
        path.append(cur)
        depth += 1


def make_tree_case(parents, b, v, gen, rng, match):
    n = len(parents)
    p = torch.softmax(torch.randn(b, n, v, generator=gen) * 2, -1)
    seeds = [rng.getrandbits(64) for _ in range(b)]
    pos = [rng.randrange(0, 1 << 31) for _ in range(b)]
    depth = [0] * n
    for c in range(1, n):
        depth[c] = depth[parents[c]] + 1
    cand = []
    for r in range(b):
        row = [rng.randrange(v) for _ in range(n)]
        for c in range(1, n):  # make some children carry the target token of their parent's position
            if rng.random() < match:
                row[c] = y_at(p[r, parents[c]], seeds[r], pos[r] + depth[parents[c]])
        cand.append(row)
    return p, seeds, pos, cand


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_tree_equals_independent_walk_and_sibling_order_is_irrelevant(shape):
    parents = SHAPES[shape]
    n, b, v = len(parents), 10, 12
    gen = torch.Generator().manual_seed(n)
    rng = random.Random(shape)
    p, seeds, pos, cand = make_tree_case(parents, b, v, gen, rng, 0.6)
    results = []
    for order_seed in (None, 1, 2):
        links = [tree_from_parents(parents, None if order_seed is None else random.Random(order_seed))
                 for _ in range(b)]
        nxt = torch.tensor([l[0] for l in links])
        sib = torch.tensor([l[1] for l in links])
        results.append(coupled_verify_tree(torch.tensor(cand), nxt, sib, p, seeds, pos))
    tokens, acc, path = results[0]
    for r in range(b):
        want_tok, want_n, want_path = walk_oracle(parents, cand[r], p[r], seeds[r], pos[r])
        assert int(acc[r]) == want_n
        assert tokens[r].tolist() == want_tok + [-1] * (n - len(want_tok))
        assert path[r].tolist() == want_path + [-1] * (n - len(want_path))
    assert float(acc.double().mean()) > 0 or n == 1  # the accept path is exercised
    for other in results[1:]:
        assert all(torch.equal(a, c) for a, c in zip(results[0], other))


def test_chain_form_equals_tree_form():
    gen = torch.Generator().manual_seed(4)
    b, k, v = 20, 4, 6  # small V: many accepts
    p = torch.softmax(torch.randn(b, k + 1, v, generator=gen), -1)
    x = torch.randint(0, v, (b, k), generator=gen)
    seeds, pos = list(range(b)), [1000 + 3 * r for r in range(b)]
    tok_c, acc_c = coupled_verify_chain(x, p, seeds, pos)
    cand = torch.cat([torch.zeros(b, 1, dtype=torch.int64), x], 1)
    nxt = torch.tensor([list(range(1, k + 1)) + [-1]] * b)
    sib = torch.full((b, k + 1), -1)
    tok_t, acc_t, path = coupled_verify_tree(cand, nxt, sib, p, seeds, pos)
    assert torch.equal(tok_c, tok_t) and torch.equal(acc_c, acc_t)
    assert int(acc_c.sum()) > 0


# ---- drafter invariance (hypothesis) ----------------------------------------

V_MARKOV = 5
_MARKOV = torch.softmax(torch.randn(V_MARKOV, V_MARKOV, generator=torch.Generator().manual_seed(11)) * 1.5, -1)


def plain_sequence(seed, t, first_prev, length):
    """Plain autoregressive TARGET sampling of a Markov target: y_t, y_{t+1}, ..."""
    out, prev = [], first_prev
    for j in range(length):
        prev = y_at(_MARKOV[prev], seed, t + j)
        out.append(prev)
    return out


@st.composite
def any_tree(draw):
    n = draw(st.integers(1, 9))
    parents = [-1] + [draw(st.integers(0, c - 1)) for c in range(1, n)]
    cand = [draw(st.integers(0, V_MARKOV - 1)) for _ in range(n)]
    return parents, cand, draw(st.integers(0, 2**16)), draw(st.integers(0, U64 - 1)), draw(st.integers(0, U32 - 20))


@settings(max_examples=120, deadline=None)
@given(any_tree())
def test_any_draft_tree_commits_a_prefix_of_plain_sampling(case):
    parents, cand, order_seed, seed, t = case
    nxt, sib = tree_from_parents(parents, random.Random(order_seed))
    # target_probs row i: the Markov target after node i's token (the root holds the last committed token).
    p = _MARKOV[torch.tensor(cand)].unsqueeze(0)
    tokens, acc, _ = coupled_verify_tree(torch.tensor([cand]), torch.tensor([nxt]), torch.tensor([sib]), p, [seed], [t])
    n = int(acc[0])
    committed = tokens[0, : n + 1].tolist()
    assert committed == plain_sequence(seed, t, cand[0], n + 1)
    assert (tokens[0, n + 1 :] == -1).all()


# ---- acceptance vs the coupling bound, and losslessness ----------------------


def synthetic_pair(v, tv_scale, gen):
    p = torch.softmax(torch.randn(v, generator=gen) * 2, 0)
    q = torch.softmax(p.log() + tv_scale * torch.randn(v, generator=gen), 0)
    return p, q


@pytest.mark.parametrize("tv_scale", [0.1, 0.3, 0.6])
def test_coupled_race_drafts_meet_the_coupling_bound_and_other_streams_do_not(tv_scale):
    v, n = 30, 20_000
    gen = torch.Generator().manual_seed(int(tv_scale * 10))
    p, q = synthetic_pair(v, tv_scale, gen)
    tv = 0.5 * float((p - q).abs().sum())
    bound = (1 - tv) / (1 + tv)
    seeds = torch.arange(n, dtype=torch.int64) * 104729 + 17
    pos = torch.full((n,), 777, dtype=torch.int64)
    target = p.expand(n, 2, v)
    rates = {}
    for stream in (Stream.TARGET, Stream.DRAFT):
        x = exponential_race(q.expand(n, v), seeds, pos, stream=stream)
        _, acc = coupled_verify_chain(x, target, seeds, pos)
        rates[stream] = float(acc.double().mean())
    # Standard error at n = 2e4 is under 0.004: 0.015 below the bound is > 3.5 sigma.
    assert rates[Stream.TARGET] >= bound - 0.015, (rates, bound, tv)
    # Without coupling, acceptance is sum_i p_i q_i, far below the bound.
    indep = float((p * q).sum())
    assert abs(rates[Stream.DRAFT] - indep) < 0.02 and rates[Stream.DRAFT] < bound - 0.1, (rates, bound, indep)


def test_committed_tokens_follow_the_target_distribution():
    # First two committed tokens over many seeds (drafts: coupled races of a
    # different q), versus exact target probabilities: a Markov target.
    v, n = 6, 60_000
    gen = torch.Generator().manual_seed(8)
    p0 = torch.softmax(torch.randn(v, generator=gen), 0)
    trans = torch.softmax(torch.randn(v, v, generator=gen), 1)
    q0 = torch.softmax(p0.log() + 0.7 * torch.randn(v, generator=gen), 0)
    seeds = torch.arange(n, dtype=torch.int64) * 7919 + 5
    t = torch.full((n,), 50, dtype=torch.int64)
    x0 = exponential_race(q0.expand(n, v), seeds, t, stream=Stream.TARGET)[:, 0]
    x1 = exponential_race(trans[x0], seeds, t + 1, stream=Stream.TARGET)[:, 0]  # a draft that equals p on step 2
    probs = torch.stack([p0.expand(n, v), trans[x0]], 1)  # row 1 is the target after x0
    target = torch.cat([probs, trans[x1].unsqueeze(1)], 1)
    tokens, acc = coupled_verify_chain(torch.stack([x0, x1], 1), target, seeds, t)
    first = tokens[:, 0]
    second = torch.where(acc >= 1, tokens[:, 1], exponential_race(trans[first], seeds, t + 1, stream=Stream.TARGET)[:, 0])
    counts = torch.bincount(first * v + second, minlength=v * v).double()
    expected = (p0.double().unsqueeze(1) * trans.double()).reshape(-1) * n
    expected *= counts.sum() / expected.sum()
    assert chisquare(counts.numpy(), expected.numpy()).pvalue > 1e-3
    assert float(acc.double().mean()) > 0.3  # the accept path carries many of the samples


# ---- validation -------------------------------------------------------------

B, K, V = 2, 3, 6
X = torch.zeros(B, K, dtype=torch.int64)
P = torch.full((B, K + 1, V), 1 / V)


def with_value(t, idx, value):
    t = t.clone()
    t[idx] = value
    return t


def chain(**kw):
    args = dict(draft_tokens=X, target_probs=P, seeds=[1, 2], positions=[3, 4])
    args.update(kw)
    return coupled_verify_chain(**args)


CHAIN_CASES = [
    (dict(draft_tokens=X.float()), "draft_tokens must be an int64 or int32 tensor"),
    (dict(draft_tokens=X[0]), "draft_tokens must be 2-D"),
    (dict(draft_tokens=with_value(X, (1, 2), V)), r"draft_tokens holds 6, outside \[0, V = 6\)"),
    (dict(draft_tokens=with_value(X, (0, 0), -1)), r"draft_tokens holds -1"),
    (dict(target_probs=P[:, :3]), r"target_probs must be \[B, K\+1, V\] = \(2, 4, 6\)"),
    (dict(target_probs=P.long()), "target_probs must be a floating tensor"),
    (dict(target_probs=with_value(P, (0, 1, 2), float("nan"))), "target_probs contains NaN"),
    (dict(target_probs=with_value(P, (0, 1, 2), -1.0)), "target_probs contains negative"),
    (dict(target_probs=with_value(P, (1, 3), 0.0)), r"target_probs has an all-zero row at index \[1, 3\]"),
    (dict(seeds=[1, U64]), r"seeds\[1\] = 18446744073709551616 is outside uint64"),
    (dict(seeds=[1, 2, 3]), "seeds has 3 rows"),
    (dict(positions=[0, U32 - K]), r"positions\[1\] = 4294967293 is outside \[0, 2\*\*32 - 4\]"),
    (dict(positions=torch.tensor([0, U32 - K])), r"positions holds 4294967293.*4 consecutive"),
    (dict(kernel="cuda"), "kernel must be one of"),
    (dict(kernel=None), r"kernel must be one of auto, torch or triton, got None"),
    (dict(kernel="triton"), "kernel='triton' needs CUDA tensors"),
]


@pytest.mark.parametrize("kwargs, match", CHAIN_CASES)
def test_chain_rejects(kwargs, match):
    with pytest.raises(ValueError, match=match):
        chain(**kwargs)


N = 5
CAND = torch.zeros(B, N, dtype=torch.int64)
NXT = torch.tensor([[1, 3, -1, -1, -1]] * B)  # root -> 1 -> {3, 4}; root -> 2 via sibling of 1
SIB = torch.tensor([[-1, 2, -1, 4, -1]] * B)
PT = torch.full((B, N, V), 1 / V)


def tree(**kw):
    args = dict(candidates=CAND, retrieve_next_token=NXT, retrieve_next_sibling=SIB, target_probs=PT,
                seeds=[1, 2], positions=[3, 4])
    args.update(kw)
    return coupled_verify_tree(**args)


TREE_CASES = [
    (dict(candidates=CAND.float()), "candidates must be an int64 or int32 tensor"),
    (dict(candidates=CAND[:, :0]), r"candidates must be 2-D \[B, N\] with N >= 1"),
    (dict(candidates=with_value(CAND, (1, 3), V)), r"candidates\[:, 1:\] holds 6, outside \[0, V = 6\)"),
    (dict(target_probs=PT[:, :4]), r"target_probs must be \[B, N, V\] = \(2, 5, 6\)"),
    (dict(retrieve_next_token=NXT[:, :4]), r"retrieve_next_token must be \[B, N\] = \(2, 5\)"),
    (dict(retrieve_next_sibling=SIB.float()), "retrieve_next_sibling must be an int64 or int32 tensor"),
    (dict(retrieve_next_token=with_value(NXT, (0, 1), 5)), r"retrieve_next_token\[0, 1\] = 5 is outside \[-1, N = 5\)"),
    (dict(retrieve_next_sibling=with_value(SIB, (1, 3), -2)), r"retrieve_next_sibling\[1, 3\] = -2 is outside"),
    (dict(retrieve_next_token=with_value(NXT, (1, 3), 1)), r"node 1 has 2 incoming links"),
    (dict(retrieve_next_token=torch.tensor([[2, -1, 1, -1, -1]] * B), retrieve_next_sibling=torch.full((B, N), -1)),
     r"row 0: node 1 \(reached by retrieve_next_token\) is a child of node 2; a child index must be greater"),
    (dict(retrieve_next_sibling=with_value(SIB, (0, 0), 3)), r"retrieve_next_sibling\[0, 0\] = 3: the root"),
    (dict(retrieve_next_sibling=with_value(with_value(SIB, (0, 4), 3), (0, 1), -1)), "incoming links|cycle"),
    (dict(target_probs=with_value(PT, (0, 4), 0.0)), r"target_probs has an all-zero row at index \[0, 4\]"),
    (dict(target_probs=with_value(PT, (1, 2, 2), float("inf"))), "target_probs contains inf"),
    (dict(seeds=[-1, 2]), r"seeds\[0\] = -1 is outside uint64"),
    (dict(positions=[0, U32 - 2]), r"positions\[1\] = 4294967294 is outside \[0, 2\*\*32 - 3\]"),
    (dict(positions=torch.tensor([U32 - 2, 0])), r"positions holds 4294967294, outside \[0, 2\*\*32 - 3\]"),
    (dict(kernel=None), "kernel must be one of"),
]


@pytest.mark.parametrize("kwargs, match", TREE_CASES)
def test_tree_rejects(kwargs, match):
    with pytest.raises(ValueError, match=match):
        tree(**kwargs)


def test_sibling_cycle_among_unreachable_nodes_is_refused():
    nxt = torch.tensor([[1, -1, -1, -1]])
    sib = torch.tensor([[-1, -1, 3, 2]])  # nodes 2 <-> 3: a cycle no link from the root reaches
    with pytest.raises(ValueError, match="cycle"):
        coupled_verify_tree(torch.zeros(1, 4, dtype=torch.int64), nxt, sib, torch.ones(1, 4, 3), [0], [0])


def test_unchecked_garbage_links_terminate():
    # check=False (the CUDA-graph path) must still finish on bad links.
    nxt = torch.tensor([[2, 0, 1, 7]])
    sib = torch.tensor([[-1, 1, 3, 2]])
    tokens, acc, path = coupled_verify_tree(torch.zeros(1, 4, dtype=torch.int64), nxt, sib, torch.ones(1, 4, 3),
                                            [0], [0], check=False)
    assert tokens.shape == (1, 4) and 0 <= int(acc[0]) <= 3


def test_last_valid_position_and_empty_batch():
    tok, acc, path = tree(positions=[0, U32 - 3])  # max depth 2
    assert tok.shape == (B, N) and path[:, 0].tolist() == [0, 0]
    t, a = coupled_verify_chain(torch.zeros(0, 2, dtype=torch.int64), torch.ones(0, 3, 4), [], [])
    assert t.shape == (0, 3) and a.shape == (0,)


# ---- SGLang's verify buffers (out=) ------------------------------------------


def sglang_buffers(b, n, width, gen, slot_dtype=torch.int64):
    """Buffers as eagle_sample hands them, pre-filled with garbage the verify must keep where it does not write."""
    slots = torch.randperm(b * n + 3, generator=gen)[: b * n].view(b, n).to(slot_dtype)  # distinct, not arange
    return VerifyOutputs(slots, torch.randint(-9, 9, (b * n + 3,), generator=gen, dtype=torch.int32),
                         torch.randint(-9, 9, (b, width), generator=gen, dtype=torch.int32),
                         torch.randint(-9, 9, (b,), generator=gen, dtype=torch.int32))


def clone(out):
    return VerifyOutputs(*(t.clone() for t in out))


@pytest.mark.parametrize("width", [1, 3, 5])
def test_tree_out_writes_what_the_scatter_writes(width):
    parents = SHAPES["topk2_10"]
    n, b, v = len(parents), 12, 5  # small V: long accept paths, so width < depth + 1 truncates
    gen = torch.Generator().manual_seed(width)
    p, seeds, pos, cand = make_tree_case(parents, b, v, gen, random.Random(width), 0.9)
    nxt, sib = (torch.tensor([l[i] for l in [tree_from_parents(parents, None)] * b]) for i in (0, 1))
    out = sglang_buffers(b, n, width, gen)
    want = clone(out)
    result = coupled_verify_tree(torch.tensor(cand), nxt, sib, p, seeds, pos, out=out)
    write_verify_outputs(*result, *want)
    assert all(torch.equal(g, w) for g, w in zip(out, want))
    assert int(result[1].max()) + 1 > width or width == 5  # the narrow buffers did truncate a path


def test_chain_out_is_the_scatter_along_arange():
    gen = torch.Generator().manual_seed(8)
    b, k, v = 9, 3, 4
    p = torch.softmax(torch.randn(b, k + 1, v, generator=gen), -1)
    # Drafts equal to the target races up to a row-dependent depth: every accept length occurs.
    x = torch.tensor([[y_at(p[r, j], r, 50 + j) if j < r % (k + 1) else (y_at(p[r, j], r, 50 + j) + 1) % v
                       for j in range(k)] for r in range(b)])
    out = sglang_buffers(b, k + 1, k + 1, gen)
    want = clone(out)
    tokens, acc = coupled_verify_chain(x, p, list(range(b)), [50] * b, out=out)
    path = torch.where(torch.arange(k + 1) <= acc.view(-1, 1), torch.arange(k + 1), -1)
    write_verify_outputs(tokens, acc, path, *want)
    assert all(torch.equal(g, w) for g, w in zip(out, want))
    assert out.accept_token_num.tolist() == acc.tolist() == [r % (k + 1) for r in range(b)]


OUT_OK = VerifyOutputs(torch.arange(B * N).view(B, N), torch.zeros(B * N, dtype=torch.int32),
                       torch.zeros(B, 3, dtype=torch.int32), torch.zeros(B, dtype=torch.int32))

OUT_CASES = [
    ((1, 2, 3, 4), "out must be a VerifyOutputs, got tuple"),
    (OUT_OK._replace(predicts=OUT_OK.predicts.float()), r"out.predicts must be an int32 or int64 tensor, got torch.float32"),
    (OUT_OK._replace(retrive_index=OUT_OK.retrive_index[:, :4]), r"out.retrive_index must be \[B, N\] = \(2, 5\), got \(2, 4\)"),
    (OUT_OK._replace(predicts=OUT_OK.predicts[:9]), r"out.predicts must be 1-D with at least B\*N = 10 entries, got \(9,\)"),
    (OUT_OK._replace(accept_index=OUT_OK.accept_index[:, :0]), r"out.accept_index must be \[B, D\] with B = 2 and D >= 1"),
    (OUT_OK._replace(accept_token_num=OUT_OK.accept_token_num[:1]), r"out.accept_token_num must be \[B\] = \(2,\), got \(1,\)"),
]


@pytest.mark.parametrize("out, match", OUT_CASES)
def test_out_buffers_are_checked_before_anything_is_written(out, match):
    with pytest.raises(ValueError, match=match):
        tree(out=out)


def test_chain_out_is_sized_to_the_k_plus_1_nodes():
    with pytest.raises(ValueError, match=r"out.retrive_index must be \[B, N\] = \(2, 4\)"):
        chain(out=OUT_OK)


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__, "-v"]))
