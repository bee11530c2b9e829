"""What the start-up warm-up compiles for a server (sglang_plugin.warmup_hook.plan_for, ops.warmup.WarmupPlan)."""

import dataclasses
import sys

import pytest
import torch
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_detspec import sglang_plugin
from sglang_detspec.config import DetSpecConfig
from sglang_detspec.ops.warmup import WarmupPlan, warm_up
from sglang_detspec.sglang_plugin import warmup_hook

register_cpu_ci(est_time=10, suite="detspec-unit-cpu")


def bag(**kw):
    return DetSpecConfig(deterministic=True, **kw)


def test_plans_follow_the_draft_shape():
    assert warmup_hook.plan_for(bag(), 1000) == WarmupPlan((1000,))
    chain = warmup_hook.plan_for(bag(algorithm="EAGLE", num_steps=3, eagle_topk=1, num_draft_tokens=4), 1000)
    assert chain == WarmupPlan((1000,), draft_tokens=3, tree_nodes=4, topk=1, rejection=False, accept_width=4)
    rejection = bag(algorithm="EAGLE", num_steps=3, eagle_topk=1, num_draft_tokens=4, verify="rejection")
    assert warmup_hook.plan_for(rejection, 1000).rejection
    tree = warmup_hook.plan_for(bag(algorithm="EAGLE", num_steps=3, eagle_topk=4, num_draft_tokens=8), 1000, 300)
    assert tree == WarmupPlan((1000, 300), draft_tokens=0, tree_nodes=8, topk=4, rejection=False, accept_width=4)
    assert warmup_hook.plan_for(bag(algorithm="EAGLE3", eagle_topk=1, num_draft_tokens=4), 1000, 1000).vocabs == (1000,)


def test_a_tree_that_drafts_chains_at_large_batches_warms_the_chain_too():
    tree = bag(algorithm="EAGLE", num_steps=3, eagle_topk=4, num_draft_tokens=8, tree_chain_batch=16, page_size=1)
    plans = warmup_hook.plans_for(tree, 1000)
    assert plans == [warmup_hook.plan_for(tree, 1000),
                     WarmupPlan((1000,), draft_tokens=3, tree_nodes=4, topk=1, rejection=False, accept_width=4)]
    # Where the switch does not apply (a KV page size above 1), the tree alone.
    assert len(warmup_hook.plans_for(dataclasses.replace(tree, page_size=16), 1000)) == 1
    # A token bound alone builds the chain state too.
    assert warmup_hook.plans_for(dataclasses.replace(tree, tree_chain_batch=0, tree_chain_tokens=8192), 1000) == plans


def test_only_a_rejection_verify_builds_sglangs_renorms():
    chain = bag(algorithm="EAGLE", num_steps=3, eagle_topk=1, num_draft_tokens=4)
    assert warmup_hook.renorms_in_verify(dataclasses.replace(chain, verify="rejection"))
    assert not warmup_hook.renorms_in_verify(chain)  # coupled: probs_hook skips them
    assert not warmup_hook.renorms_in_verify(bag(verify="rejection"))  # no speculative decoding, no verify


def test_adaptive_chains_warm_every_step_count_they_may_switch_to():
    chain = bag(algorithm="EAGLE", num_steps=3, eagle_topk=1, num_draft_tokens=4, adaptive_steps=(0, 1, 3, 5, 7))
    plans = warmup_hook.plans_for(chain, 1000)
    # Step 0 still verifies one token per request (SGLang's trivial verify input): the first plan warms it.
    assert plans[0] == dataclasses.replace(warmup_hook.plan_for(chain, 1000), one_token_verify=True)
    assert [(p.draft_tokens, p.tree_nodes, p.accept_width) for p in plans] == [(3, 4, 4), (1, 2, 2), (5, 6, 6), (7, 8, 8)]
    assert [p.one_token_verify for p in plans] == [True, False, False, False]
    no_zero = dataclasses.replace(chain, adaptive_steps=(1, 3))
    assert [p.one_token_verify for p in warmup_hook.plans_for(no_zero, 1000)] == [False, False]
    fixed = bag(algorithm="EAGLE", num_steps=3, eagle_topk=1, num_draft_tokens=4)
    assert warmup_hook.plans_for(fixed, 1000) == [warmup_hook.plan_for(fixed, 1000)]


def test_ngram_accept_index_is_as_wide_as_its_draft_tokens():
    """SGLang sizes NGRAM's accept_index to max_tree_depth = draft_token_num (no depth cap), not num_steps + 1."""
    ngram = bag(algorithm="NGRAM", num_steps=2, eagle_topk=8, num_draft_tokens=16)
    assert warmup_hook.plan_for(ngram, 1000).accept_width == 16


def test_plan_bounds_name_the_field():
    with pytest.raises(ValueError, match="vocabs must be a non-empty tuple of ints >= 1"):
        WarmupPlan((0,))
    with pytest.raises(ValueError, match=r"tree_nodes must be an int in \[0, 4096\], got -1"):
        WarmupPlan((5,), tree_nodes=-1)
    with pytest.raises(ValueError, match=r"accept_width must be an int in \[0, 4096\], got -2"):
        WarmupPlan((5,), accept_width=-2)


def test_the_torch_reference_compiles_nothing():
    assert warm_up(WarmupPlan((50,), draft_tokens=3, tree_nodes=4), torch.device("cpu")) == 0


def test_the_hook_runs_before_cuda_graph_capture():
    rows = [r for r in sglang_plugin.hook_table() if r.hook is warmup_hook.compile_kernels]
    assert [(r.target, r.kind) for r in rows] == [(warmup_hook.TARGET, "BEFORE")]
    from sglang.srt.managers.scheduler import Scheduler

    assert callable(Scheduler.init_all_cuda_graphs)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
