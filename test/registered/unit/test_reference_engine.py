"""Reference engine: batch invariance, the ops wiring, draft shapes, and the global-RNG control."""

import pytest
import torch
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_detspec.auditing import build_plan
from sglang_detspec.config import DetSpecConfig
from sglang_detspec.ops import Stream, coupled_verify_chain, exponential_race, verify_chain
from sglang_detspec.reference import (
    DraftShape,
    GlobalRngSampler,
    KeyedSampler,
    ProbsMemo,
    ReferenceEngine,
    Request,
    build_model_pair,
    next_token_probs,
)

register_cpu_ci(est_time=60, suite="detspec-unit-cpu")
pytestmark = pytest.mark.usefixtures("one_intra_op_thread")  # conftest.py

K = 3


@pytest.fixture(scope="module")
def engine(models):
    """The default engine (coupled verify, the config bag's default) for mode-agnostic tests."""
    return ReferenceEngine(models, K)


@pytest.fixture(scope="module")
def rejection_engine(models):
    """Rejection verify, for the tests of rejection mode (the coupled ones name verify="coupled")."""
    return ReferenceEngine(models, K, verify="rejection")


@pytest.fixture(scope="module")
def plan(models):
    return build_plan(13, seed=7, max_new_tokens=8, vocab_size=models.vocab_size, max_batch=9)


def run_trial(engine, trial):
    """Map each request of the trial to its output tokens."""
    out = {}
    for batch in trial.batches:
        for req, res in zip(batch, engine.generate(batch)):
            out.setdefault(req, []).append(res.output_ids)
    return out


def test_models_are_reproducible_and_leave_global_rng_alone(models):
    state = torch.get_rng_state()
    again = build_model_pair()
    assert torch.equal(torch.get_rng_state(), state)
    for (name, a), (_, b) in zip(models.target.state_dict().items(), again.target.state_dict().items()):
        assert torch.equal(a, b), name
    for (name, a), (_, b) in zip(models.draft.state_dict().items(), again.draft.state_dict().items()):
        assert torch.equal(a, b), name
    assert not torch.equal(models.draft.lm_head.weight, models.target.lm_head.weight)
    assert models.target.lm_head.weight.dtype == torch.float32


def test_same_seed_same_tokens_in_every_batch_shape(rejection_engine, plan):
    # Rejection mode; test_coupled_mode_same_seed_same_tokens_in_every_batch_shape is coupled mode's.
    kinds = {t.kind for t in plan.trials}
    assert kinds == {"solo", "batch", "permuted", "split"}
    outputs = {}
    for trial in plan.trials:
        for req, outs in run_trial(rejection_engine, trial).items():
            outputs.setdefault(req, set()).update(outs)
    assert len(outputs[plan.probe]) == 1
    # Every filler met other batches too; none may change either.
    assert all(len(v) == 1 for v in outputs.values()), {r.sampling_seed: len(v) for r, v in outputs.items()}
    (probe_out,) = outputs[plan.probe]
    assert len(probe_out) == plan.probe.max_new_tokens


def test_duplicate_rows_get_identical_outputs(engine, plan):
    fillers = [r for r in plan.trials[-1].batches[0] if r != plan.probe][:3]
    batch = [plan.probe, *fillers, plan.probe]
    results = engine.generate(batch)
    assert results[0] == results[-1]
    assert results[0] == engine.generate([plan.probe])[0]


def test_different_seeds_give_different_tokens(engine):
    reqs = [Request((5, 6, 7, 8), 12, 1.0, seed) for seed in (0, 1, 2, 3, 2**63, 2**64 - 1)]
    outs = [r.output_ids for r in engine.generate(reqs)]
    assert len(set(outs)) == len(outs)


def test_control_depends_on_the_batch(models, plan):
    # Rejection mode; test_coupled_mode_same_seed_same_tokens_in_every_batch_shape checks coupled mode's control.
    control = ReferenceEngine.control(models, K, seed=7, verify="rejection")
    probe_outputs = set()
    for trial in plan.trials:
        probe_outputs.update(run_trial(control, trial)[plan.probe])
    assert len(probe_outputs) > 1
    # The control reseeds per call, so the same batch repeats exactly: the
    # variation above comes from the batch composition alone.
    batch = plan.trials[1].batches[0]
    assert control.generate(batch) == control.generate(batch)


def random_round(b, k, v, seed):
    """Draft tokens, draft probs [B, K, V] and target probs [B, K+1, V] of one verify round."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.softmax(2 * torch.randn(b, k, v, generator=gen), dim=-1)
    p = torch.softmax(2 * torch.randn(b, k + 1, v, generator=gen), dim=-1)
    x = torch.multinomial(q.reshape(-1, v), 1, generator=gen).reshape(b, k)
    return x, q, p


def test_control_is_the_keyed_sampler_keyed_by_the_global_rng():
    b, v = 6, 40
    x, q, p = random_round(b, K, v, seed=0)
    positions = torch.arange(b, dtype=torch.int64) * 5 + 3
    row_seeds = [11, 12, 13, 14, 15, 16]
    control = GlobalRngSampler(seed=4)
    with control.session():
        drafted = control.draft(q[:, 1], row_seeds, positions + 1, 1)
        verified = control.verify(x, q, p, row_seeds, positions)
    # The same keyed ops, keyed by seeds drawn from torch's global RNG in the
    # same order: the control differs from the seeded sampler in nothing else.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(4)
        draft_keys = GlobalRngSampler.global_rng_seeds(b)
        verify_keys = GlobalRngSampler.global_rng_seeds(b)
    keyed = KeyedSampler()
    assert torch.equal(drafted, keyed.draft(q[:, 1], draft_keys, positions + 1, 1))
    want_tokens, want_accepted = keyed.verify(x, q, p, verify_keys, positions)
    assert torch.equal(verified[0], want_tokens) and torch.equal(verified[1], want_accepted)
    # ... and it does ignore the rows' own seeds.
    own_tokens, _ = keyed.verify(x, q, p, row_seeds, positions)
    assert not torch.equal(verified[0], own_tokens)


def test_global_rng_seeds_come_from_the_global_rng_and_span_uint64():
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        a = GlobalRngSampler.global_rng_seeds(256)
        torch.manual_seed(1)
        again = GlobalRngSampler.global_rng_seeds(256)
        torch.manual_seed(2)
        other = GlobalRngSampler.global_rng_seeds(256)
    assert a == again and a != other
    assert all(0 <= s < 2**64 for s in a) and len(set(a)) == 256
    # Both 32-bit halves are drawn: the high one reaches the top bit, the low one varies.
    assert any(s >= 2**63 for s in a) and any(s < 2**63 for s in a)
    assert len({s & 0xFFFFFFFF for s in a}) == 256


def test_generate_leaves_global_rng_alone(models, engine):
    reqs = [Request((1, 2, 3), 5, 1.0, 11), Request((4,), 5, 0.7, 12)]
    for eng in (engine, ReferenceEngine.control(models, K, seed=3)):
        state = torch.get_rng_state()
        eng.generate(reqs)
        assert torch.equal(torch.get_rng_state(), state), eng.name


def replay_alone(models, req, k, verify="rejection"):
    """Spec (docs/design.md §2-5) for one request, written out with batch-of-one op calls.

    Every distribution is one forward over exactly its prefix, as the engine defines it.
    """
    seq = list(req.prompt_ids)
    out, lengths = [], []
    while len(out) < req.max_new_tokens:
        t = len(seq)
        drafts, qs = [], []
        for j in range(k):
            q = next_token_probs(models.draft, seq + drafts, req.temperature)
            if verify == "coupled":
                x = exponential_race(q, [req.sampling_seed], [t + j], stream=Stream.TARGET)
            else:
                x = exponential_race(q, [req.sampling_seed], [t + j], stream=Stream.DRAFT, draft_step=j)
            drafts.append(int(x[0, 0]))
            qs.append(q[0])
        p = torch.cat([next_token_probs(models.target, seq + drafts[:j], req.temperature) for j in range(k + 1)])
        if verify == "coupled":
            toks, acc = coupled_verify_chain(torch.tensor([drafts]), p.unsqueeze(0), [req.sampling_seed], [t])
        else:
            toks, acc = verify_chain(
                torch.tensor([drafts]), torch.stack(qs).unsqueeze(0), p.unsqueeze(0), [req.sampling_seed], [t]
            )
        new = toks[0, : int(acc[0]) + 1].tolist()[: req.max_new_tokens - len(out)]
        out += new
        seq += new
        lengths.append(len(new))
    return tuple(out), tuple(lengths)


REPLAY_REQUESTS = [
    Request((3, 1, 4, 1, 5), 9, 1.0, 2024),
    Request((9,), 4, 0.0, 5),
    Request(tuple(range(20, 40)), 7, 0.7, 2**64 - 3),
    Request((2, 7), 1, 1.3, 77),
    Request((100, 200, 300), 10, 1.0, 0),
]


@pytest.mark.parametrize("verify", ["rejection", "coupled"])
def test_batched_engine_equals_per_request_ops(models, verify):
    results = ReferenceEngine(models, K, verify=verify).generate(REPLAY_REQUESTS)
    for req, res in zip(REPLAY_REQUESTS, results):
        assert (res.output_ids, res.accept_lengths) == replay_alone(models, req, K, verify)


def test_one_distribution_per_prefix():
    # The engine's p_t is a forward over exactly the t-token prefix. A longer forward
    # is not a substitute on the CPU: its rows differ in the last bits, and coupled
    # invariance needs bitwise-equal distributions.
    small = build_model_pair()
    memo = ProbsMemo(max_entries=2)
    seq = [5, 6, 7, 8]
    first = memo(small.target, seq, 1.0)
    assert torch.equal(first, next_token_probs(small.target, seq, 1.0)[0])
    assert memo(small.target, seq, 1.0) is first and (memo.hits, memo.misses) == (1, 1)
    assert not torch.equal(memo(small.target, seq, 0.5), first)
    assert not torch.equal(memo(small.draft, seq, 1.0), first)
    # Least recently used goes first: (target, 1.0) was oldest.
    assert len(memo) == 2
    memo(small.target, seq, 1.0)
    assert memo.misses == 4
    with pytest.raises(ValueError, match="max_entries"):
        ProbsMemo(0)


class RecordingSampler(KeyedSampler):
    def __init__(self):
        super().__init__()
        self.calls = []

    def draft(self, probs, seeds, positions, draft_step):
        self.calls.append(("draft", probs.shape[0], draft_step, positions.tolist()))
        return super().draft(probs, seeds, positions, draft_step)

    def verify(self, draft_tokens, draft_probs, target_probs, seeds, positions):
        self.calls.append(("verify", draft_tokens.shape[0], None, positions.tolist()))
        return super().verify(draft_tokens, draft_probs, target_probs, seeds, positions)


def test_sampler_runs_once_per_step_on_the_whole_batch(models):
    sampler = RecordingSampler()
    # RecordingSampler records rejection mode's calls (draft, verify); coupled mode's are
    # test_coupled_sampler_calls_per_round's.
    eng = ReferenceEngine(models, K, sampler, verify="rejection")
    prompts = [(1,), (2, 3, 4), (5, 6)]
    reqs = [Request(p, 6, 1.0, i) for i, p in enumerate(prompts)]
    results = eng.generate(reqs)
    first_round = sampler.calls[: K + 1]
    starts = [len(p) for p in prompts]
    assert first_round == [("draft", 3, j, [s + j for s in starts]) for j in range(K)] + [
        ("verify", 3, None, starts)
    ]
    rounds = max(len(r.accept_lengths) for r in results)
    assert sum(c[0] == "verify" for c in sampler.calls) == rounds
    assert sum(c[0] == "draft" for c in sampler.calls) == rounds * K


def test_greedy_request_equals_plain_target_greedy(models, engine):
    req = Request((10, 20, 30), 12, 0.0, 1)
    seq = list(req.prompt_ids)
    with torch.inference_mode():
        for _ in range(req.max_new_tokens):
            seq.append(int(models.target(input_ids=torch.tensor([seq])).logits[0, -1].argmax()))
    (res,) = engine.generate([req])
    assert res.output_ids == tuple(seq[3:])


@pytest.mark.parametrize("k", [1, 2, 5])
def test_exact_length_and_accept_lengths(models, k):
    # Rejection mode (the 1.3 tokens per round is its acceptance); test_coupled_lengths_and_stats is coupled mode's.
    eng = ReferenceEngine(models, k, verify="rejection")
    reqs = [Request((7, 8, 9), n, 1.0, 100 + n) for n in (1, 2, 3, 5, 8, 13)]
    results = eng.generate(reqs)
    rounds = tokens = 0
    for req, res in zip(reqs, results):
        assert len(res.output_ids) == req.max_new_tokens
        assert sum(res.accept_lengths) == req.max_new_tokens
        assert all(1 <= a <= k + 1 for a in res.accept_lengths)
        assert all(0 <= t < models.vocab_size for t in res.output_ids)
        rounds += len(res.accept_lengths)
        tokens += len(res.output_ids)
    # The draft agrees with the target often enough for speculation to pay.
    assert tokens / rounds > 1.3


def test_empty_batch(engine):
    assert engine.generate([]) == []


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(prompt_ids=(), max_new_tokens=4, temperature=1.0, sampling_seed=0), "at least one"),
        (dict(prompt_ids=(1, -2), max_new_tokens=4, temperature=1.0, sampling_seed=0), r"prompt_ids\[1\]"),
        (dict(prompt_ids=(1,), max_new_tokens=0, temperature=1.0, sampling_seed=0), "max_new_tokens"),
        (dict(prompt_ids=(1,), max_new_tokens=4, temperature=-0.5, sampling_seed=0), "temperature"),
        (dict(prompt_ids=(1,), max_new_tokens=4, temperature=float("nan"), sampling_seed=0), "temperature"),
        (dict(prompt_ids=(1,), max_new_tokens=4, temperature=1.0, sampling_seed=2**64), "sampling_seed"),
        (dict(prompt_ids=(1,), max_new_tokens=4, temperature=1.0, sampling_seed=-1), "sampling_seed"),
    ],
)
def test_bad_requests_are_rejected(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Request(**kwargs)


def test_engine_refuses_requests_past_the_models_positions():
    small = build_model_pair()
    for model in (small.target, small.draft):
        model.config.max_position_embeddings = 16
    assert small.max_positions == 16
    eng = ReferenceEngine(small, K)
    # prompt 4 + max_new_tokens 9 + K 3 = 16 positions: fits exactly.
    (res,) = eng.generate([Request((1, 2, 3, 4), 9, 1.0, 0)])
    assert len(res.output_ids) == 9
    message = r"requests\[1\]: prompt \(4\) \+ max_new_tokens \(10\) \+ draft depth \(3\) = 17 exceeds"
    with pytest.raises(ValueError, match=message + " the models' 16 positions"):
        eng.generate([Request((1,), 2, 1.0, 0), Request((1, 2, 3, 4), 10, 1.0, 0)])


def test_default_models_take_4096_positions(models):
    assert models.max_positions == models.target.config.max_position_embeddings == 4096


def test_engine_rejects_bad_input(models, engine):
    with pytest.raises(ValueError, match="outside the vocabulary"):
        engine.generate([Request((models.vocab_size,), 2, 1.0, 0)])
    with pytest.raises(ValueError, match="must be a Request"):
        engine.generate([((1, 2), 2, 1.0, 0)])
    with pytest.raises(ValueError, match=r"draft must be a DraftShape or an int K >= 1"):
        ReferenceEngine(models, 0)
    with pytest.raises(ValueError, match="draft must be a DraftShape"):
        ReferenceEngine(models, "tree")
    with pytest.raises(ValueError, match="verify must be one of"):
        ReferenceEngine(models, 2, verify="greedy")
    with pytest.raises(ValueError, match=r"tree 2x2 needs verify='coupled'"):
        ReferenceEngine(models, DraftShape.tree(2, 2), verify="rejection")
    # The default verify is the runtime config bag's, which serves trees.
    assert ReferenceEngine(models, DraftShape.tree(2, 2)).verify == DetSpecConfig().verify == "coupled"
    assert ReferenceEngine.control(models, 2).verify == DetSpecConfig().verify
    with pytest.raises(ValueError, match="memo must be a ProbsMemo"):
        ReferenceEngine(models, 2, memo={})
    with pytest.raises(ValueError, match="kernel must be one of"):
        KeyedSampler(None)


@pytest.mark.parametrize(
    "args, match",
    [
        (("chain", 0), "depth must be >= 1 for a chain"),
        (("tree", 2, 0), "branching must be >= 1"),
        (("chain", 2, 2), "a chain has branching 1"),
        (("none", 1), "no draft has depth 0"),
        (("beam", 2), "kind must be one of"),
        (("tree", 2.0, 2), "depth must be an int"),
        (("tree", 10, 2), "2046 draft nodes, more than 1024"),
    ],
)
def test_bad_draft_shapes(args, match):
    with pytest.raises(ValueError, match=match):
        DraftShape(*args)


def test_draft_shapes():
    assert DraftShape.none().label == "off" and DraftShape.none().num_nodes == 0
    assert DraftShape.chain(4).label == "chain K=4" and DraftShape.chain(4).num_nodes == 4
    assert DraftShape.tree(3, 2).label == "tree 3x2" and DraftShape.tree(3, 2).num_nodes == 14


@pytest.mark.parametrize("draft", [DraftShape.chain(2), DraftShape.tree(2, 2), DraftShape.none()])
def test_coupled_mode_same_seed_same_tokens_in_every_batch_shape(models, draft):
    plan = build_plan(7, seed=3, max_new_tokens=6, vocab_size=models.vocab_size, max_batch=6)
    eng = ReferenceEngine(models, draft, verify="coupled")
    outputs = {}
    for trial in plan.trials:
        for req, outs in run_trial(eng, trial).items():
            outputs.setdefault(req, set()).update(outs)
    assert all(len(v) == 1 for v in outputs.values())
    control = ReferenceEngine.control(models, draft, seed=7, verify="coupled")
    probe_outputs = set()
    for trial in plan.trials:
        probe_outputs.update(run_trial(control, trial)[plan.probe])
    assert len(probe_outputs) > 1


class CoupledRecordingSampler(KeyedSampler):
    def __init__(self):
        super().__init__()
        self.calls = []

    def propose(self, probs, seeds, positions, num_samples=1):
        self.calls.append(("propose", probs.shape[0], num_samples, positions.tolist()))
        return super().propose(probs, seeds, positions, num_samples)

    def sample(self, probs, seeds, positions):
        self.calls.append(("sample", probs.shape[0], None, positions.tolist()))
        return super().sample(probs, seeds, positions)

    def coupled_verify(self, draft_tokens, target_probs, seeds, positions):
        self.calls.append(("chain", draft_tokens.shape[0], None, positions.tolist()))
        return super().coupled_verify(draft_tokens, target_probs, seeds, positions)

    def coupled_verify_tree(self, candidates, next_token, next_sibling, target_probs, seeds, positions):
        self.calls.append(("tree", candidates.shape[0], candidates.shape[1], positions.tolist()))
        return super().coupled_verify_tree(candidates, next_token, next_sibling, target_probs, seeds, positions)


def test_coupled_sampler_calls_per_round(models):
    prompts = [(1,), (2, 3, 4), (5, 6)]
    starts = [len(p) for p in prompts]
    sampled = [Request(p, 5, 1.0, i) for i, p in enumerate(prompts)]

    rec = CoupledRecordingSampler()
    ReferenceEngine(models, 2, rec, verify="coupled").generate(sampled)
    assert rec.calls[:3] == [
        ("propose", 3, 1, starts),
        ("propose", 3, 1, [s + 1 for s in starts]),
        ("chain", 3, None, starts),
    ]

    rec = CoupledRecordingSampler()
    ReferenceEngine(models, DraftShape.tree(2, 3), rec, verify="coupled").generate(sampled)
    # Level 0: one race per root; level 1: one per child, all 9 at position t + 1.
    assert rec.calls[:3] == [
        ("propose", 3, 3, starts),
        ("propose", 9, 3, [s + 1 for s in starts for _ in range(3)]),
        ("tree", 3, 13, starts),
    ]

    # A greedy row's one-hot q gives one child per node, in a call of its own.
    rec = CoupledRecordingSampler()
    mixed = [Request((1,), 5, 0.0, 0), Request((2, 3, 4), 5, 1.0, 1)]
    ReferenceEngine(models, DraftShape.tree(2, 3), rec, verify="coupled").generate(mixed)
    assert rec.calls[:5] == [
        ("propose", 1, 1, [1]),
        ("propose", 1, 3, [3]),
        ("propose", 1, 1, [2]),
        ("propose", 3, 3, [4, 4, 4]),
        ("tree", 2, 13, [1, 3]),
    ]

    rec = CoupledRecordingSampler()
    results = ReferenceEngine(models, DraftShape.none(), rec, verify="coupled").generate(sampled)
    assert rec.calls[0] == ("sample", 3, None, starts)
    assert len(rec.calls) == 5 and all(c[0] == "sample" for c in rec.calls)
    assert all(r.accept_lengths == (1,) * 5 for r in results)


@pytest.mark.parametrize("draft", [DraftShape.chain(2), DraftShape.tree(2, 2)])
def test_coupled_lengths_and_stats(models, draft):
    eng = ReferenceEngine(models, draft, verify="coupled")
    reqs = [Request((7, 8, 9), n, t, 100 + n) for n, t in ((1, 1.0), (3, 0.0), (7, 0.7), (9, 1.0))]
    stats = []
    results = eng.generate(reqs, stats=stats)
    assert len(stats) == len(reqs)
    for req, res, st in zip(reqs, results, stats):
        assert len(res.output_ids) == req.max_new_tokens == sum(res.accept_lengths)
        assert all(1 <= a <= draft.depth + 1 for a in res.accept_lengths)
        assert st.rounds == len(res.accept_lengths)
        # Every round tests at least one position and at most the depth.
        assert st.rounds <= st.tested <= st.rounds * draft.depth
        assert 0 <= st.accepted <= st.tested
        assert st.coupled_bound_sum <= st.coupled_match_sum + 1e-9 <= st.overlap_sum + 2e-9


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__, "-v"]))
