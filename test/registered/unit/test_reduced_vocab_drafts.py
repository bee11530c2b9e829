"""Coupled drafts over a reduced draft vocabulary (EAGLE3 hot tokens): every draft races on its TARGET id.

A reduced draft's column j stands for target id ``hot[j]``. The plugin's
draft hook spreads q onto those target ids before the race, so a draft races
on the uniform of the target id it proposes. Oracles: the op layer's
Gumbel-top-k over the spread q (``exponential_race`` on ``Stream.TARGET``),
the same hook on a full-vocabulary draft with the same q (the drafted target
ids, hence acceptance, must be identical), and the reference engine's
reduced draft against the exact coupled match probability.
"""

import math

import pytest
import torch
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_detspec.auditing import build_plan
from sglang_detspec.ops import Stream, exponential_race
from sglang_detspec.reference import (
    DraftShape, ReferenceEngine, Request, reduced_draft_probs, with_reduced_draft_vocab,
)
from sglang_detspec.sglang_plugin import topk_draft_hook
from test_coupled_plugin import loaded, sampling_info  # noqa: F401

register_cpu_ci(est_time=60, suite="detspec-unit-cpu")

V, V_DRAFT = 300, 200


def reduced_case(rows=6, seed=5):
    gen = torch.Generator().manual_seed(seed)
    hot = torch.randperm(V, generator=gen)[:V_DRAFT]  # shuffled: draft index j is not target id j
    logits = torch.randn(rows, V_DRAFT, generator=gen) * 2
    seeds = torch.randint(-(1 << 62), 1 << 62, (rows,), generator=gen)
    positions = torch.randint(0, 1 << 20, (rows,), generator=gen)
    return hot, logits, seeds, positions


@pytest.mark.parametrize("k", [1, 4])
def test_reduced_vocab_children_are_the_target_id_race_over_the_spread_q(loaded, k):
    hot, logits, seeds, positions = reduced_case()
    info = sampling_info([V_DRAFT] * 6, [1.0] * 6, seeds, vocab=V_DRAFT)
    probs = topk_draft_hook.children_tensor(logits, info, positions, k, "torch", hot, V)
    assert probs.shape == (6, V_DRAFT)
    chosen = probs.topk(k, dim=-1).indices  # SGLang's fast_topk picks these draft columns
    q = torch.softmax(logits, dim=-1)
    spread = torch.zeros(6, V).index_copy_(1, hot, q)
    want = exponential_race(spread, seeds, positions, stream=Stream.TARGET, num_samples=k)
    assert torch.equal(hot[chosen], want)  # in race order: the first child is the coupled chain's draft
    assert torch.equal(probs.gather(1, chosen)[:, 0], torch.ones(6))


def test_reduced_vocab_gives_the_full_vocabulary_coupling_on_the_same_q(loaded):
    """A reduced draft and a full draft with the same q over target ids draft the same target ids."""
    hot, logits, seeds, positions = reduced_case(rows=8)
    full_logits = torch.full((8, V), -math.inf).index_copy_(1, hot, logits)  # q zero off the hot ids
    for temps, top_ks in (([1.0] * 8, [V] * 8), ([0.7] * 8, [20] * 8)):
        reduced_info = sampling_info(top_ks, temps, seeds, vocab=V_DRAFT)
        full_info = sampling_info(top_ks, temps, seeds, vocab=V)
        for k in (1, 3):
            reduced = topk_draft_hook.children_tensor(logits, reduced_info, positions, k, "torch", hot, V)
            full = topk_draft_hook.children_tensor(full_logits, full_info, positions, k, "torch")
            # With a top-k cut both keep the 20 most likely tokens (no ties in random logits).
            assert torch.equal(hot[reduced.topk(k, dim=-1).indices], full.topk(k, dim=-1).indices)


def test_reference_engine_reduced_draft_keeps_the_tokens_and_matches_the_exact_acceptance(models):
    hot = torch.randperm(models.vocab_size, generator=torch.Generator().manual_seed(3))[: models.vocab_size // 2]
    reduced = with_reduced_draft_vocab(models, hot.tolist())
    log_q = torch.log_softmax(torch.randn(models.vocab_size, generator=torch.Generator().manual_seed(4)), dim=-1)
    for temperature in (1.0, 0.05, 0.0):
        q = reduced_draft_probs(reduced, log_q, temperature)
        assert float(q.sum()) == pytest.approx(1.0) and not bool(q[~torch.isin(torch.arange(len(q)), hot)].any())
    assert int(reduced_draft_probs(reduced, log_q, 0.0).argmax()) == int(hot[log_q[hot].argmax()])
    plan = build_plan(6, seed=11, max_new_tokens=12, vocab_size=models.vocab_size, max_batch=6)
    requests = [r for trial in plan.trials for batch in trial.batches for r in batch][:6]
    assert any(r.temperature > 0 for r in requests)  # sampled rows: the reduced draft races them
    # A greedy row and a cold one: their draft distribution must stay finite over the hot ids alone.
    requests += [Request((5, 6, 7), 12, 0.0, 1), Request((8, 9), 12, 0.05, 2)]
    plain = ReferenceEngine(models, DraftShape.none(), verify="coupled").generate(requests)
    for draft in (DraftShape.chain(3), DraftShape.tree(2, 2)):
        stats = []
        got = ReferenceEngine(reduced, draft, verify="coupled").generate(requests, stats=stats)
        assert [r.output_ids for r in got] == [r.output_ids for r in plain]  # drafter invariance holds
        if draft.kind == "chain":
            tested = sum(s.tested for s in stats)
            accepted = sum(s.accepted for s in stats)
            expected = sum(s.coupled_match_sum for s in stats)
            sd = math.sqrt(sum(s.coupled_match_var_sum for s in stats))
            assert abs(accepted - expected) <= 4 * sd + 1, (accepted, expected, sd, tested)


def test_the_draft_worker_calls_the_hooked_top_k_sites(loaded):
    """eagle_worker_v2 calls the registry's wrappers of renorm_draft_probs and draft_topk1_postprocess."""
    from sglang.srt.speculative import eagle_worker_v2

    for name in ("renorm_draft_probs", "draft_topk1_postprocess"):
        assert hasattr(getattr(eagle_worker_v2, name), "__wrapped__"), f"eagle_worker_v2 calls {name} unhooked"


def test_chain_first_draft_after_verify_is_the_race_winner_eager_and_graph(loaded, monkeypatch):
    """The chain branch of the decode-extend hook, on both ways SGLang runs the draft forward.

    SGLang's ``_draft_extend_for_decode`` cannot run without a GPU worker; the
    stand-in does what the hook relies on (eagle_worker_v2.py:1207-1262): one
    draft forward, eager through ``draft_runner.forward`` (logits reassigned to
    the selected rows) or replayed through ``cuda_graph_runner_for_draft_extend
    .execute``, then a plain argmax into ``next_draft_input.topk_index``.
    """
    from types import SimpleNamespace as NS

    from sglang_detspec.config import DetSpecConfig

    bag = DetSpecConfig(deterministic=True, algorithm="EAGLE3", num_steps=3, eagle_topk=1, num_draft_tokens=4,
                        verify="coupled", source="server_args", kernel="torch")
    monkeypatch.setattr(topk_draft_hook, "current_config", lambda: bag)
    hot, logits, seeds, positions = reduced_case(rows=4)
    info = sampling_info([V_DRAFT, V_DRAFT, 1, V_DRAFT], [1.0] * 4, seeds, vocab=V_DRAFT)
    new_seq_lens = positions - 1  # the first draft after verify sits at new_seq_lens + 1

    class Runner:
        def forward(self, forward_batch):
            return NS(logits_output=NS(next_token_logits=logits.clone()))

    class Graphs:
        def execute(self, forward_batch, select_index):
            return NS(next_token_logits=logits.clone())

    def sglang_like(self, batch, batch_result, use_graph):
        out = (self.cuda_graph_runner_for_draft_extend.execute(None, None) if use_graph
               else self.draft_runner.forward(None).logits_output)
        batch_result.next_draft_input.topk_index = torch.argmax(out.next_token_logits, dim=-1, keepdim=True)

    spread = torch.zeros(4, V).index_copy_(1, hot, torch.softmax(logits, dim=-1))
    race = exponential_race(spread, seeds, positions, stream=Stream.TARGET, kernel="torch")[:, 0]
    column = {int(t): j for j, t in enumerate(hot.tolist())}
    want = [column[int(t)] for t in race]
    want[2] = int(logits[2].argmax())  # the greedy row keeps SGLang's argmax
    for use_graph in (False, True):
        runner, graphs = Runner(), Graphs()
        worker = NS(topk=1, hot_token_id=hot, draft_runner=runner, cuda_graph_runner_for_draft_extend=graphs,
                    target_worker=NS(model_runner=NS(model_config=NS(vocab_size=V))))
        result = NS(new_seq_lens=new_seq_lens, next_draft_input=NS(topk_index=None))
        topk_draft_hook.extend_decode_site(lambda s, b, r: sglang_like(s, b, r, use_graph), worker,
                                           NS(sampling_info=info), result)
        assert result.next_draft_input.topk_index.view(-1).tolist() == want
        assert "forward" not in vars(runner) and "execute" not in vars(graphs)  # the patches are gone


def test_reduced_draft_vocab_arguments_are_checked(models):
    with pytest.raises(ValueError, match="hot_token_ids must be distinct"):
        with_reduced_draft_vocab(models, [1, 1])
    with pytest.raises(ValueError, match="hot_token_ids must be distinct"):
        with_reduced_draft_vocab(models, [models.vocab_size])
    with pytest.raises(ValueError, match="pair must be a ModelPair"):
        with_reduced_draft_vocab(None, [1])


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__, "-v"]))
