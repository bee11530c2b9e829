"""Drafter invariance: coupled verification gives one output whatever the drafter; rejection does not."""

import json
import math

import pytest
import torch
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_detspec.auditing.invariance import CHAIN_LENGTHS, InvarianceReport, run_invariance
from sglang_detspec.ops import Stream, exponential_race
from sglang_detspec.reference import (
    DraftShape,
    KeyedSampler,
    ProbsMemo,
    ReferenceEngine,
    Request,
    next_token_probs,
    with_random_draft,
)
from sglang_detspec.reference.stats import coupled_match_probability

register_cpu_ci(est_time=90, suite="detspec-unit-cpu")
pytestmark = pytest.mark.usefixtures("one_intra_op_thread")  # conftest.py

ROW_NAMES = ["off", *(f"chain K={k}" for k in CHAIN_LENGTHS), "tree 3x2", "chain K=3, random draft"]


@pytest.fixture(scope="module")
def memo():
    # Runs over the same models share forwards: a distribution is a function of its prefix.
    return ProbsMemo()


@pytest.fixture(scope="module")
def coupled(models, memo):
    return run_invariance(models, mode="coupled", memo=memo)


@pytest.fixture(scope="module")
def rejection(models, memo):
    return run_invariance(models, mode="rejection", memo=memo)


def plain_target_sampling(models, req):
    """The spec of docs/design.md §5 for one request: y_t = race(p_t, TARGET, t), position by position."""
    seq = list(req.prompt_ids)
    with torch.inference_mode():
        while len(seq) < len(req.prompt_ids) + req.max_new_tokens:
            p = next_token_probs(models.target, seq, req.temperature)
            seq.append(int(exponential_race(p, [req.sampling_seed], [len(seq)], stream=Stream.TARGET)[0, 0]))
    return tuple(seq[len(req.prompt_ids) :])


def row(report, name):
    (found,) = [r for r in report.rows if r.name == name]
    return found


def test_coupled_mode_gives_one_output_across_every_drafter(models, coupled):
    assert isinstance(coupled, InvarianceReport)
    assert [r.name for r in coupled.rows] == ROW_NAMES
    assert coupled.passed and coupled.unique_outputs == 1
    assert coupled.unique_outputs_per_probe == (1,) * len(coupled.probes)
    for r in coupled.rows:
        assert r.available and r.unique_outputs == 1 and r.matching_probes == len(coupled.probes), r.name
    # The output is plain target sampling, computed here without the engine.
    for probe, out in zip(coupled.probes, coupled.reference_outputs):
        assert out == plain_target_sampling(models, probe)
    off = row(coupled, "off")
    assert off.mean_accept_length == 1.0 and off.acceptance_rate is None and off.tested_positions == 0
    # The drafters differ a lot in how much they get accepted, not in what is emitted.
    close, rand = row(coupled, "chain K=3"), row(coupled, "chain K=3, random draft")
    assert close.mean_accept_length > 1.5 > 1.1 > rand.mean_accept_length
    assert close.acceptance_rate > 0.4 > 0.1 > rand.acceptance_rate
    assert rand.one_minus_tv < 0.2 < close.one_minus_tv


def test_rejection_mode_outputs_depend_on_the_drafter(rejection):
    assert [r.name for r in rejection.rows] == ROW_NAMES
    assert not rejection.passed and rejection.unique_outputs > 1
    tree = row(rejection, "tree 3x2")
    assert not tree.available and "chains only" in tree.note
    assert tree.unique_outputs is None and tree.mean_accept_length is None
    # Speculative decoding off is plain target sampling in both modes.
    assert row(rejection, "off").matching_probes == len(rejection.probes)
    assert any(r.matching_probes < len(rejection.probes) for r in rejection.rows if r.available)


def test_probes_and_report_json(coupled, rejection):
    from sglang_detspec.auditing.batch import build_plan

    first = build_plan(1, seed=0, max_new_tokens=16, vocab_size=384, max_batch=2).probe
    assert coupled.probes[0] == first == rejection.probes[0]
    assert len({p.sampling_seed for p in coupled.probes}) == len(coupled.probes)
    data = json.loads(json.dumps(coupled.to_json()))
    assert data["mode"] == "coupled" and data["passed"] is True and data["unique_outputs"] == 1
    assert [r["name"] for r in data["rows"]] == ROW_NAMES
    assert set(data["rows"][1]) == {
        "name", "draft", "depth", "branching", "draft_model", "available", "note", "unique_outputs",
        "matching_probes", "mean_accept_length", "acceptance_rate", "expected_rate", "coupled_bound",
        "one_minus_tv", "tested_positions",
    }
    assert data["reference_outputs"] == [list(o) for o in coupled.reference_outputs]
    assert json.loads(json.dumps(rejection.to_json()))["rows"][6]["available"] is False


def test_run_is_deterministic_and_the_memo_changes_nothing(models, memo):
    strip = lambda d: {k: v for k, v in d.items() if k != "wall_time_s"}  # noqa: E731
    fresh = run_invariance(models, mode="coupled", seed=5, max_new_tokens=6, num_probes=1)
    shared = run_invariance(models, mode="coupled", seed=5, max_new_tokens=6, num_probes=1, memo=memo)
    assert strip(fresh.to_json()) == strip(shared.to_json())
    assert fresh.passed and fresh.probes[0].sampling_seed == 5


class DraftStreamProposals(KeyedSampler):
    """Coupled drafts raced on the DRAFT stream: independent of the target's race."""

    def propose(self, probs, seeds, positions, num_samples=1):
        return exponential_race(probs, list(seeds), positions, stream=Stream.DRAFT, num_samples=num_samples)


class OffByOneVerify(KeyedSampler):
    """A coupled verifier that keys the target race one position late."""

    def coupled_verify(self, draft_tokens, target_probs, seeds, positions):
        return super().coupled_verify(draft_tokens, target_probs, seeds, positions + 1)

    def coupled_verify_tree(self, candidates, next_token, next_sibling, target_probs, seeds, positions):
        return super().coupled_verify_tree(candidates, next_token, next_sibling, target_probs, seeds, positions + 1)


class TargetStreamDrafts(KeyedSampler):
    """Rejection-mode drafts drawn as the coupled race (TARGET stream): only the verifier differs."""

    def draft(self, probs, seeds, positions, draft_step):
        return self.propose(probs, seeds, positions)[:, 0]


def test_uncoupled_drafts_cost_acceptance_not_invariance(models, coupled, memo):
    report = run_invariance(models, mode="coupled", sampler=DraftStreamProposals(), memo=memo)
    assert report.passed and report.reference_outputs == coupled.reference_outputs
    close = row(report, "chain K=3")
    # Independent draws match far less often than the coupled race the figures assume.
    assert close.acceptance_rate < row(coupled, "chain K=3").acceptance_rate
    assert close.acceptance_rate < close.expected_rate - 0.15


def test_a_misplaced_target_race_breaks_invariance(models, memo):
    report = run_invariance(models, mode="coupled", num_probes=1, sampler=OffByOneVerify(), memo=memo)
    assert not report.passed and report.unique_outputs > 1


def test_the_rejection_verifier_breaks_invariance_even_with_coupled_drafts(models, memo):
    report = run_invariance(models, mode="rejection", num_probes=1, sampler=TargetStreamDrafts(), memo=memo)
    assert not report.passed and report.unique_outputs > 1


def acceptance_requests(n, max_new_tokens=20):
    gen = torch.Generator().manual_seed(5)
    return [
        Request(tuple(torch.randint(0, 384, (6,), generator=gen).tolist()), max_new_tokens, 1.0, 1000 + i)
        for i in range(n)
    ]


@pytest.mark.parametrize("verify", ["coupled", "rejection"])
def test_acceptance_rate_matches_the_exact_figures(models, verify):
    engine = ReferenceEngine(models, 3, verify=verify)
    stats = []
    engine.generate(acceptance_requests(10), stats=stats)
    n = sum(s.tested for s in stats)
    accepted = sum(s.accepted for s in stats)
    bound = sum(s.coupled_bound_sum for s in stats)
    overlap = sum(s.overlap_sum for s in stats)
    assert n >= 150
    if verify == "coupled":
        # Each tested draft is a Bernoulli of the exact coupling probability given its
        # prefix: the centred sum is a martingale, and a 5 sigma band is its slack.
        expected, var = sum(s.coupled_match_sum for s in stats), sum(s.coupled_match_var_sum for s in stats)
        assert abs(accepted - expected) < 5 * math.sqrt(var), (accepted, expected, var)
        # Daliri, Musco and Suresh: at least (1 - TV) / (1 + TV); no coupling beats 1 - TV.
        slack = 5 * math.sqrt(n / 4)
        assert bound - slack <= accepted <= overlap + slack
        assert bound <= expected <= overlap
    else:
        # Rejection sampling accepts each tested draft with probability exactly 1 - TV
        # (variance at most 1/4 each).
        assert abs(accepted - overlap) < 5 * math.sqrt(n / 4), (accepted, overlap)


def test_coupled_match_probability_against_the_race():
    gen = torch.Generator().manual_seed(3)
    v, draws = 5, 20000
    for _ in range(3):
        p = torch.softmax(torch.randn(v, generator=gen), 0)
        q = torch.softmax(torch.randn(v, generator=gen), 0)
        seeds = torch.randint(0, 2**62, (draws,), generator=gen)
        x = exponential_race(q.expand(draws, v), seeds, 7, stream=Stream.TARGET)[:, 0]
        y = exponential_race(p.expand(draws, v), seeds, 7, stream=Stream.TARGET)[:, 0]
        want = coupled_match_probability(p, q)
        got = float((x == y).double().mean())
        assert abs(got - want) < 5 * math.sqrt(want * (1 - want) / draws), (got, want)
        tv = 0.5 * float((p - q).abs().sum())
        assert (1 - tv) / (1 + tv) <= want <= 1 - tv + 1e-12
    same = torch.tensor([0.5, 0.25, 0.25, 0.0])
    assert coupled_match_probability(same, same) == pytest.approx(1.0)
    assert coupled_match_probability(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])) == 0.0


def test_tree_accepts_at_least_as_much_as_its_first_child_chain(models):
    reqs = acceptance_requests(4, 16) + [Request((3, 4), 12, 0.0, 9), Request((8, 9, 10), 12, 0.7, 10)]
    chain = ReferenceEngine(models, 3, verify="coupled").generate(reqs)
    tree = ReferenceEngine(models, DraftShape.tree(3, 2), verify="coupled").generate(reqs)
    thin = ReferenceEngine(models, DraftShape.tree(3, 1), verify="coupled").generate(reqs)
    for c, t, s in zip(chain, tree, thin):
        assert c.output_ids == t.output_ids == s.output_ids
        # The first child of every node is the chain's draft, so wherever the chain
        # is accepted the tree is too: never more rounds for the same tokens.
        assert len(t.accept_lengths) <= len(c.accept_lengths)
        # A tree of branching 1 is the chain itself, walked by the tree verifier.
        assert s.accept_lengths == c.accept_lengths
    assert sum(len(t.accept_lengths) for t in tree) < sum(len(c.accept_lengths) for c in chain)


def test_random_draft_shares_the_target_and_is_reproducible(models):
    state = torch.get_rng_state()
    a, b = with_random_draft(models), with_random_draft(models)
    assert torch.equal(torch.get_rng_state(), state)
    assert a.target is models.target and a.draft_kind == "random" and models.draft_kind == "close"
    for (name, x), (_, y) in zip(a.draft.state_dict().items(), b.draft.state_dict().items()):
        assert torch.equal(x, y), name
    assert not torch.equal(a.draft.lm_head.weight, models.draft.lm_head.weight)
    with pytest.raises(ValueError, match="pair must be a ModelPair"):
        with_random_draft(models.target)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(mode="greedy"), "mode must be one of"),
        (dict(mode=None), "mode must be one of"),
        (dict(mode="coupled", seed=-1), r"seed must be an int in \[0, 2\*\*64\)"),
        (dict(mode="coupled", seed=2**64), r"seed must be an int in \[0, 2\*\*64\)"),
        (dict(mode="coupled", max_new_tokens=0), "max_new_tokens must be an int >= 1"),
        (dict(mode="coupled", max_new_tokens=4096), "max_new_tokens must be at most 4083"),
        (dict(mode="coupled", num_probes=0), r"num_probes must be an int in \[1, 64\]"),
        (dict(mode="coupled", num_probes=65), r"num_probes must be an int in \[1, 64\]"),
        (dict(mode="coupled", kernel=None), "kernel must be one of"),
        (dict(mode="coupled", models="tiny"), "models must be a ModelPair"),
        (dict(mode="coupled", memo={}), "memo must be a ProbsMemo"),
    ],
)
def test_bad_arguments(models, kwargs, match):
    kwargs.setdefault("models", models)
    with pytest.raises(ValueError, match=match):
        run_invariance(**kwargs)


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__, "-v"]))
