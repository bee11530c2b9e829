"""Draft shape by batch size and length (sglang_plugin.shape_hook) against SGLang 0.5.23's own code, on the CPU.

The chain state is built and swapped on a GPU server only (the E2E file of
the same name); here: which bags switch, the setting's checks, the policy,
the draft's narrowing on SGLang's own ``EagleDraftInput`` and
``EagleDraftWorker``, that the swap covers every field SGLang's own adaptive
state swap writes, and that a failed build leaves the worker and SGLang's
published context as they were. (The serving-process checks on real
``ServerArgs`` sit in ``test_sglang_plugin.py``.)
"""

import ast
import dataclasses
import inspect
import sys
import textwrap
import types

import pytest
import torch
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_detspec.config import MAX_TREE_CHAIN_BATCH, MAX_TREE_CHAIN_TOKENS, DetSpecConfig, env_settings
from sglang_detspec.sglang_plugin import channels, shape_hook, startup_notes

register_cpu_ci(est_time=30, suite="detspec-unit-cpu")

TREE = dict(deterministic=True, algorithm="EAGLE", num_steps=3, eagle_topk=4, num_draft_tokens=8, page_size=1,
            tree_chain_batch=16)
TYPED = {**TREE, "source": "raw_args"}  # flags as typed, before SGLang's resolution


@pytest.mark.parametrize("name, field, bound, what, good", [
    ("SGLANG_DETSPEC_TREE_CHAIN_BATCH", "tree_chain_batch", MAX_TREE_CHAIN_BATCH, "batch size", (" 32 ", 32)),
    ("SGLANG_DETSPEC_TREE_CHAIN_TOKENS", "tree_chain_tokens", MAX_TREE_CHAIN_TOKENS, "token count", ("12288", 12288)),
])
def test_each_bound_is_a_count_and_names_its_range(name, field, bound, what, good):
    assert env_settings({})[field] == 0
    assert env_settings({name: good[0]})[field] == good[1]
    for bad in ("-1", "x", "1.5", "8k", "1e4", str(bound + 1)):
        with pytest.raises(ValueError, match=rf"{name} must be an integer {what} in \[0, {bound}\] \(0: off\), "
                                             rf"got '{bad}'"):
            env_settings({name: bad})


@pytest.mark.parametrize("change, applies", [
    ({}, True),
    ({"algorithm": "EAGLE3"}, True),
    ({"page_size": None}, True),  # not resolved yet: SGLang's default is 1
    ({"eagle_topk": 1, "num_draft_tokens": 4}, False),  # a chain
    ({"page_size": 16}, False),  # SGLang lays a tree's draft slots out per branch above page size 1
    ({"num_steps": 8, "num_draft_tokens": 6}, False),  # the chain would verify more rows than the tree
    ({"num_steps": 7, "num_draft_tokens": 8}, True),
    ({"multi_layer_eagle": True}, False),  # another worker
    ({"algorithm": "NGRAM"}, False),
    ({"verify": "rejection", "rejection_sampling": True}, False),  # refused anyway (a tree), never switched
    ({"deterministic": False}, False),  # SGLang's own code runs
    ({"tree_chain_batch": 0}, False),
])
def test_which_servers_switch(change, applies):
    bag = DetSpecConfig(**{**TREE, **change})
    assert bag.chain_at_batch == (bag.tree_chain_batch if applies else 0)
    # The token bound applies to the same servers, alone or beside the batch bound.
    alone = DetSpecConfig(**{**TREE, **change, "tree_chain_batch": 0, "tree_chain_tokens": 4096})
    applies_alone = applies or change == {"tree_chain_batch": 0}
    assert alone.chain_at_tokens == (4096 if applies_alone else 0) and alone.switches_shape is applies_alone
    assert alone.chain_at_batch == 0
    both = DetSpecConfig(**{**TREE, **change, "tree_chain_tokens": 4096})
    assert both.switches_shape is applies_alone


MLA_TREE = {**TREE, "tree_chain_batch": 0, "attention_backend": "fa3", "model_family": "mla+moe"}


@pytest.mark.parametrize("change, as_chain", [
    ({}, True),
    ({"model_family": "mla+moe+fp8", "attention_backend": "triton"}, True),  # not a backend rule: MLA's tree verify
    ({"algorithm": "EAGLE3"}, True),
    ({"algorithm": "STANDALONE"}, True),
    # What kept a tree's shape from switching does not keep it from being resolved to a chain at start-up.
    ({"set_tree_settings": ("tree_chain_batch",), "tree_chain_batch": 16}, True),
    ({"parallel_reason": "pipeline parallelism (only the last stage drafts)"}, True),
    ({"page_size": 16}, True),
    ({"multi_layer_eagle": True}, True),
    ({"num_draft_tokens": 3}, True),
    ({"model_family": "moe"}, False),  # dense attention: the split or the node path serves its trees
    ({"model_family": None}, False),
    ({"eagle_topk": 1, "num_draft_tokens": 4}, False),  # a chain already
    ({"verify": "rejection", "rejection_sampling": True}, False),  # rejection mode refuses trees itself
    ({"deterministic": False}, False),  # SGLang's own code runs
])
def test_an_mla_targets_tree_is_served_as_the_chain_of_its_depth(change, as_chain):
    bag = DetSpecConfig(**{**MLA_TREE, **change})
    assert bag.mla_tree_as_chain is as_chain
    if not as_chain:
        return
    assert bag.refusals() == [] and bag.mla_tree_verify_reason is None
    chain = bag.as_chain()
    assert (chain.eagle_topk, chain.num_steps, chain.num_draft_tokens) == (1, 3, 4)
    # The chain is what SGLang then builds: no tree, no draft-shape switch, no further rewrite.
    assert not chain.verifies_trees and not chain.switches_shape and not chain.mla_tree_as_chain
    assert chain.active and chain.coupled
    note = startup_notes.mla_chain_note(bag)
    assert "(top-k 4, " in note and "--speculative-eagle-topk 1 --speculative-num-draft-tokens 4, 3 steps" in note


@pytest.mark.parametrize("topk", [None, 1, 4])
def test_ngram_on_an_mla_target_is_refused_at_any_breadth(topk):
    bag = DetSpecConfig(**{**MLA_TREE, "algorithm": "NGRAM", "eagle_topk": topk, "num_steps": None})
    (refusal,) = bag.refusals()
    assert refusal.code == "mla_tree" and "NGRAM drafts are verified as trees at any breadth" in refusal
    assert "with EAGLE or NEXTN (--speculative-num-steps S --speculative-eagle-topk 1" in refusal
    assert not bag.active and not bag.mla_tree_as_chain


def test_an_mla_tree_without_its_depth_is_refused_with_the_flag_to_give():
    # SGLang 0.5.23 stops at top-k without steps with a bare assertion; the chain served in the tree's place needs them.
    bag = DetSpecConfig(**{**MLA_TREE, "num_steps": None, "source": "raw_args"})
    (refusal,) = bag.refusals()
    assert refusal.code == "draft_shape" and "without --speculative-num-steps" in refusal
    assert not bag.active and not bag.mla_tree_as_chain and bag.mla_tree_verify_reason is None
    # Its draft tokens may be left out: start-up declares the chain's.
    assert DetSpecConfig(**{**MLA_TREE, "num_draft_tokens": None, "source": "raw_args"}).refusals() == []
    # Without typed draft tokens the note names the top-k alone.
    note = startup_notes.mla_chain_note(DetSpecConfig(**{**MLA_TREE, "num_draft_tokens": None}))
    assert "(top-k 4) is served as the chain of its depth" in note and "None" not in note


@pytest.mark.parametrize("shape, flag", [
    ({"num_steps": None}, "--speculative-eagle-topk and --speculative-num-draft-tokens without --speculative-num-steps"),
    ({"num_steps": None, "eagle_topk": None}, "--speculative-num-draft-tokens without --speculative-num-steps"),
    ({"num_steps": None, "eagle_topk": 1, "num_draft_tokens": None}, "--speculative-eagle-topk without --speculative"),
    ({"eagle_topk": None}, "--speculative-num-steps without --speculative-eagle-topk"),
    ({"num_draft_tokens": None}, "a tree (--speculative-eagle-topk 4) without --speculative-num-draft-tokens"),
])
def test_a_partial_draft_shape_is_refused_naming_the_flag_to_give(shape, flag):
    bag = DetSpecConfig(**{**TYPED, **shape})
    (refusal,) = bag.refusals()
    assert refusal.code == "draft_shape" and flag in refusal and not bag.active
    # Where SGLang fills the shape itself, or the run is not the plugin's, nothing is refused.
    assert DetSpecConfig(**{**TYPED, **shape, "deterministic": False}).refusals() == []
    assert DetSpecConfig(**{**TYPED, **shape, "algorithm": "NGRAM"}).draft_shape_problem is None
    # A resolved record (SGLang's own pick filled in) is not read.
    assert DetSpecConfig(**{**TREE, **shape}).draft_shape_problem is None
    if (shape.get("eagle_topk") or 1) == 1:
        assert DetSpecConfig(**{**TYPED, **shape, "adaptive_steps": (1, 3, 7)}).draft_shape_problem is None


@pytest.mark.parametrize("algorithm", ["EAGLE", "NEXTN"])
def test_a_partial_adaptive_chain_is_not_refused(algorithm):
    # SGLang fills an adaptive chain's flags itself; NEXTN as typed is EAGLE by the time SGLang decides.
    from sglang_detspec.sglang_plugin.resolve import adaptive_steps

    typed = types.SimpleNamespace(speculative_adaptive=True, speculative_algorithm=algorithm,
                                  speculative_eagle_topk=None, enable_multi_layer_eagle=False,
                                  speculative_adaptive_config=None)
    steps = adaptive_steps(typed)
    assert steps
    bag = DetSpecConfig(**{**TYPED, "algorithm": algorithm, "eagle_topk": None, "num_draft_tokens": None,
                           "adaptive_steps": steps})
    assert bag.draft_shape_problem is None and bag.refusals() == []


@pytest.mark.parametrize("shape", [
    {"num_steps": None, "eagle_topk": None, "num_draft_tokens": None},  # SGLang's per-model pick
    {"eagle_topk": 1, "num_draft_tokens": None},  # a chain's draft tokens follow from its steps
    {},
])
def test_the_shapes_sglang_resolves_pass(shape):
    assert DetSpecConfig(**{**TYPED, **shape}).draft_shape_problem is None


def test_a_bound_on_an_mla_chain_says_there_is_nothing_to_bound():
    chain = DetSpecConfig(**{**MLA_TREE, "tree_chain_batch": 16, "set_tree_settings": ("tree_chain_batch",)}).as_chain()
    (note,) = [n for n in startup_notes.setting_notes(chain) if "SGLANG_DETSPEC_TREE_CHAIN_BATCH=16" in n]
    assert "an MLA target's trees are served as the chain of their depth" in note and "keeps its" not in note
    dense = dataclasses.replace(chain, model_family=None)
    assert any("this server keeps its draft shape" in n for n in startup_notes.setting_notes(dense))


def test_the_mla_chain_note_needs_such_a_tree():
    bag = DetSpecConfig(**{**MLA_TREE, "algorithm": "NGRAM", "eagle_topk": None, "num_steps": None})
    for not_one in (bag, DetSpecConfig(**{**MLA_TREE, "model_family": "moe"})):
        with pytest.raises(ValueError, match="must be an MLA target's tree served as a chain"):
            startup_notes.mla_chain_note(not_one)
    with pytest.raises(ValueError, match="num_steps must be set"):
        DetSpecConfig(**{**MLA_TREE, "num_steps": None}).as_chain()


def test_trees_of_other_families_and_mla_chains_are_not_refused():
    for change in ({}, {"model_family": "moe"}, {"model_family": None}, {"eagle_topk": 1, "num_draft_tokens": 4},
                   {"model_family": "moe", "set_tree_settings": ("tree_chain_batch",)}):
        assert DetSpecConfig(**{**MLA_TREE, **change}).refusals() == []


def test_the_fa3_tree_default_miss_names_mla():
    # The FA3 tree default's miss names MLA, not an unread head size (MLA targets have none to read).
    assert "an MLA target" in startup_notes.fa3_tree_defaults_note(DetSpecConfig(**MLA_TREE))


def test_the_start_up_says_what_the_setting_does_or_that_it_does_nothing():
    notes = startup_notes.unmeasured_notes(DetSpecConfig(**TREE))
    assert any("decode batches of more than 16 requests draft a chain of 3 steps" in n for n in notes)
    ignored = startup_notes.setting_notes(DetSpecConfig(**{**TREE, "page_size": 16}))
    assert any("this server keeps its draft shape" in n for n in ignored)
    assert not any("TREE_CHAIN" in n for n in startup_notes.setting_notes(DetSpecConfig(**TREE)))
    assert "tree_chain_batch=16" in DetSpecConfig(**TREE).describe()
    # A tree that keeps its shape at every batch size, where the setting would apply, hears what that costs at
    # large batches and of the setting; nowhere else.
    fixed = DetSpecConfig(**{**TREE, "tree_chain_batch": 0})
    assert startup_notes.tree_load_note(fixed) in startup_notes.unmeasured_notes(fixed)
    assert "verifies 8 rows per request, a chain of its depth 4" in startup_notes.tree_load_note(fixed)
    wide = DetSpecConfig(**{**TREE, "tree_chain_batch": 0, "num_steps": 5, "eagle_topk": 8, "num_draft_tokens": 80})
    assert "verifies 80 rows per request, a chain of its depth 6" in startup_notes.tree_load_note(wide)
    for change in ({}, {"eagle_topk": 1, "num_draft_tokens": 4}, {"page_size": 16}, {"multi_layer_eagle": True},
                   {"algorithm": "NGRAM"}, {"num_steps": 8, "num_draft_tokens": 6}, {"deterministic": False}):
        bag = DetSpecConfig(**{**TREE, **change, "tree_chain_batch": TREE["tree_chain_batch"] if not change else 0})
        assert not any(n.startswith("a tree verifies") for n in startup_notes.unmeasured_notes(bag)), change
    assert "tree_chain_batch" not in DetSpecConfig(**{**TREE, "eagle_topk": 1, "num_draft_tokens": 4}).describe()


def test_the_start_up_says_what_the_token_bound_does_or_that_it_does_nothing():
    long = DetSpecConfig(**{**TREE, "tree_chain_tokens": 12288})
    note = startup_notes.chain_note(long)
    assert note.startswith("SGLANG_DETSPEC_TREE_CHAIN_BATCH=16 and SGLANG_DETSPEC_TREE_CHAIN_TOKENS=12288: decode "
                           "batches of more than 16 requests or whose summed sequence length is above 12288 tokens "
                           "draft a chain of 3 steps")
    assert "the token bound, meant for trees on the node path" in note and "switching both ways on 100 tokens" in note
    assert "not yet run on a GPU" not in note
    assert note.count(startup_notes.LONG_PROMPT_NOTE) == 1 and note in startup_notes.unmeasured_notes(long)
    # The token bound alone: nothing of the batch bound's runs is quoted for it.
    alone = startup_notes.chain_note(DetSpecConfig(**{**TREE, "tree_chain_batch": 0, "tree_chain_tokens": 12288}))
    assert alone.startswith(
        "SGLANG_DETSPEC_TREE_CHAIN_TOKENS=12288: decode batches whose summed sequence length is above 12288 tokens")
    assert "the batch bound" not in alone and "1.13 / 1.07" not in alone and startup_notes.LONG_PROMPT_NOTE in alone
    # The batch bound alone points at the token bound for long prompts.
    batch_only = startup_notes.chain_note(DetSpecConfig(**TREE))
    assert "the token bound" not in batch_only and "which SGLANG_DETSPEC_TREE_CHAIN_TOKENS addresses" in batch_only
    assert "tree_chain_tokens=12288" in long.describe() and "tree_chain_tokens" not in DetSpecConfig(**TREE).describe()
    ignored = startup_notes.setting_notes(DetSpecConfig(**{**TREE, "tree_chain_batch": 0, "tree_chain_tokens": 12288,
                                                            "page_size": 16}))
    assert any(n.startswith("SGLANG_DETSPEC_TREE_CHAIN_TOKENS=12288 applies to coupled EAGLE / EAGLE3 / NEXTN trees")
               and "this server keeps its draft shape" in n for n in ignored)
    both = startup_notes.setting_notes(DetSpecConfig(**{**TREE, "tree_chain_tokens": 12288, "page_size": 16}))
    assert any(n.startswith("SGLANG_DETSPEC_TREE_CHAIN_BATCH=16 and SGLANG_DETSPEC_TREE_CHAIN_TOKENS=12288 apply to")
               for n in both)


def test_the_node_path_note_appears_only_where_the_node_path_verifies():
    """The node path's cost note: the FA3 tree with the split off, and no server where the node path stands by."""
    nodes = {**TREE, "attention_backend": "fa3", "tree_attention": "nodes", "decode_attention": "sglang"}
    assert startup_notes.NODE_PATH_NOTE in startup_notes.unmeasured_notes(DetSpecConfig(**nodes))
    # Where the split declines a tree (more draft tokens than it covers) the node path serves under the split too.
    declined = DetSpecConfig(**{**nodes, "decode_attention": "split", "num_steps": 5, "eagle_topk": 8,
                                "num_draft_tokens": 80})
    assert declined.node_path_verifies and startup_notes.NODE_PATH_NOTE in startup_notes.unmeasured_notes(declined)
    for change in ({"decode_attention": "split"},  # the split verifies the trees; the node path stands by
                   {"attention_backend": "triton"}, {"tree_attention": "cascade"},
                   {"eagle_topk": 1, "num_draft_tokens": 4},  # a chain verifies no tree
                   {"page_size": 16}, {"kv_cache_dtype": "fp8_e4m3"},  # the node path reads bf16 pages of one token
                   {"deterministic": False}):  # inactive: no notes at all
        bag = DetSpecConfig(**{**nodes, **change})
        assert not bag.node_path_verifies and startup_notes.NODE_PATH_NOTE not in startup_notes.unmeasured_notes(bag), change


def test_the_policy():
    tree, chain = object(), object()
    shapes = shape_hook.Shapes(tree, chain, threshold=16, active=tree)
    assert shapes.for_batch(True, 17) is chain and shapes.for_batch(True, 16) is tree
    assert shapes.for_batch(False, 200) is tree  # prefill and extend batches run the state the server started in
    assert shapes.for_batch(True, 2, kv_tokens=10**6) is tree  # no token bound: the length is not read
    long = shape_hook.Shapes(tree, chain, threshold=16, active=tree, tokens=8192)
    assert long.for_batch(True, 2, 8193) is chain and long.for_batch(True, 2, 8192) is tree
    assert long.for_batch(True, 17, 100) is chain  # either bound sends the batch to the chain
    assert long.for_batch(True, 2, None) is tree  # length not known: the batch size decides
    assert long.for_batch(False, 1, 10**6) is tree
    tokens_only = shape_hook.Shapes(tree, chain, threshold=0, active=tree, tokens=8192)
    assert tokens_only.for_batch(True, 1000, 10) is tree and tokens_only.for_batch(True, 1, 9000) is chain
    assert (shapes.bounds(), long.bounds(), tokens_only.bounds()) == ("bound 16", "bounds 16 / 8192 tokens",
                                                                      "bound 8192 tokens")


def test_the_length_is_read_on_the_host_where_sglang_keeps_it():
    """FA3 and Triton opt out of SGLang's host lengths under its overlap scheduler, so the requests' committed KV
    lengths (SGLang's own ``ReqKvInfo``) are what the bound reads there; host lengths, where a step has them, first."""
    import importlib.util

    from sglang.srt.managers.overlap_utils import FutureMap, decide_needs_cpu_seq_lens
    from sglang.srt.managers.schedule_batch import ReqKvInfo, ScheduleBatch
    from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

    assert "ScheduleBatch" in str(inspect.signature(EAGLEWorkerV2.forward_batch_generation).parameters["batch"])
    assert {"seq_lens_sum", "seq_lens_cpu", "reqs"} <= {f.name for f in dataclasses.fields(ScheduleBatch)}
    # Why the fallback exists: both backends say they need no host lengths, and then the overlap scheduler
    # clears them before each step.
    # (FA3's module needs sgl_kernel's CUDA library to import: its class body is read instead.)
    for module, cls in (("sglang.srt.layers.attention.flashattention_backend", "FlashAttentionBackend"),
                        ("sglang.srt.layers.attention.triton_backend", "TritonAttnBackend")):
        with open(importlib.util.find_spec(module).origin) as f:
            body = next(n for n in ast.parse(f.read()).body if isinstance(n, ast.ClassDef) and n.name == cls)
        declared = [ast.unparse(n) for n in body.body if isinstance(n, ast.AnnAssign)
                    and ast.unparse(n.target) == "needs_cpu_seq_lens"]
        assert declared == ["needs_cpu_seq_lens: bool = False"], (cls, declared)
    assert 'getattr(b, "needs_cpu_seq_lens", True)' in inspect.getsource(decide_needs_cpu_seq_lens)
    assert "batch.seq_lens_sum = None" in inspect.getsource(FutureMap.resolve_seq_lens_cpu)
    # ... and SGLang advances each request's committed length by the tokens its verify accepted.
    from sglang.srt.managers.scheduler_components.batch_result_processor import SchedulerBatchResultProcessor

    assert "kv_committed_len += num_accept_tokens" in inspect.getsource(
        SchedulerBatchResultProcessor._resolve_spec_v2_tokens)

    def request(committed):
        return types.SimpleNamespace(kv=ReqKvInfo(kv_committed_len=committed, kv_allocated_len=committed + 4))

    def batch(total, lens, reqs):
        return types.SimpleNamespace(seq_lens_sum=total, seq_lens_cpu=lens, reqs=reqs)

    reqs = [request(2100), request(2090), request(7)]
    assert shape_hook.batch_kv_tokens(batch(None, None, reqs)) == 4197  # FA3 / Triton under overlap
    assert shape_hook.batch_kv_tokens(batch(None, torch.tensor([100, 250], dtype=torch.int64), reqs)) == 350
    assert shape_hook.batch_kv_tokens(batch(300, torch.tensor([1, 2]), reqs)) == 300  # SGLang's sum first
    assert shape_hook.batch_kv_tokens(batch(None, None, [])) is None

def draft_input(rows: int, k: int):
    from sglang.srt.speculative.eagle_info import EagleDraftInput

    p = torch.rand(rows, k).sort(dim=1, descending=True).values
    index = torch.randint(0, 1000, (rows, k))
    return EagleDraftInput(topk_p=p, topk_index=index, hidden_states=torch.zeros(rows, 8))


def draft_worker(topk: int, draft_topk: int | None):
    from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker

    worker = object.__new__(EagleDraftWorker)  # SGLang's class; its __init__ loads a model
    worker.topk = topk
    if draft_topk is not None:
        channels.DRAFT_TOPK.write(worker, draft_topk)
    return worker


def test_a_chain_state_drafts_from_each_requests_first_child():
    info = draft_input(5, 4)
    first_p, first_index = info.topk_p[:, :1].clone(), info.topk_index[:, :1].clone()
    batch = type("Batch", (), {"spec_info": info})()
    worker = draft_worker(topk=4, draft_topk=1)
    seen = {}

    def sglang_draft(self, batch, **kwargs):
        seen.update(topk=self.topk, p=batch.spec_info.topk_p, index=batch.spec_info.topk_index, kwargs=kwargs)
        return "verify input"

    assert shape_hook.draft_in_shape(sglang_draft, worker, batch, with_topology=False) == "verify input"
    assert seen["topk"] == 1 and seen["kwargs"] == {"with_topology": False}
    assert torch.equal(seen["p"], first_p) and torch.equal(seen["index"], first_index)
    assert seen["p"].is_contiguous() and seen["index"].is_contiguous()
    assert worker.topk == 4  # the draft extend that follows keeps the tree's width


@pytest.mark.parametrize("draft_topk", [None, 4])
def test_a_tree_state_and_a_worker_that_never_switches_draft_as_sglang_does(draft_topk):
    info = draft_input(3, 4)
    batch = type("Batch", (), {"spec_info": info})()
    worker = draft_worker(topk=4, draft_topk=draft_topk)
    seen = {}
    shape_hook.draft_in_shape(lambda self, b: seen.update(topk=self.topk, p=b.spec_info.topk_p), worker, batch)
    assert seen["topk"] == 4 and seen["p"] is info.topk_p


def assigned_attributes(function) -> set[str]:
    """``owner.attr`` targets a function assigns (``self`` renamed ``worker``; SGLang's ``dw`` kept)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    names = set()
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else []
        for target in targets:
            for leaf in (target.elts if isinstance(target, ast.Tuple) else [target]):
                if isinstance(leaf, ast.Attribute):
                    names.add(ast.unparse(leaf).replace("self.", "worker."))
    return names


def test_the_swap_writes_every_field_sglangs_own_adaptive_swap_writes():
    """SGLang's ``apply_runtime_state`` lists what a draft-step state owns; ours owns that and the top-k."""
    from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

    sglang = assigned_attributes(EAGLEWorkerV2.apply_runtime_state)
    ours = assigned_attributes(shape_hook.apply_state)
    # SGLang reaches the target runner as self._target_worker.model_runner; ours through a local name.
    ours = {name.replace("runner.", "worker._target_worker.model_runner.") if name.startswith("runner.") else name
            for name in ours}
    assert sglang, "SGLang's apply_runtime_state assigns nothing any more: re-read it"
    assert sglang <= ours, sorted(sglang - ours)
    assert {"worker.topk", "dw.topk"} <= ours
    # The swap reads every field of the state.
    fields = {f.name for f in dataclasses.fields(shape_hook.ShapeState)}
    tree = ast.parse(textwrap.dedent(inspect.getsource(shape_hook.apply_state)))
    read = {node.attr for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "state"}
    assert read == fields, sorted(fields ^ read)


def state(tag: str, topk: int, tokens: int) -> shape_hook.ShapeState:
    """A state whose resources are strings naming them (what the swap moves is references)."""
    return shape_hook.ShapeState(topk, 3, tokens, *(f"{tag} {name}" for name in (
        "draft backend", "draft graph", "extend backend", "extend graph", "runner backend", "target backend",
        "verify graph")), (f"{tag} parents", f"{tag} scores"))


def switching_worker():
    """SGLang's EAGLEWorkerV2 and EagleDraftWorker, not initialised (their __init__ loads models), in the tree state."""
    from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker, EAGLEWorkerV2

    worker, draft = object.__new__(EAGLEWorkerV2), object.__new__(EagleDraftWorker)
    draft.draft_runner = type("Runner", (), {})()
    worker._draft_worker = draft
    worker._target_worker = type("Target", (), {"model_runner": type("Runner", (), {})()})()
    tree, chain = state("tree", 4, 8), state("chain", 1, 4)
    shape_hook.apply_state(worker, tree, 4)
    channels.DRAFT_SHAPES.write(worker, shape_hook.Shapes(tree, chain, threshold=3, active=tree))
    return worker, tree, chain


def test_each_step_runs_in_the_state_of_its_batch(caplog):
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    from sglang.srt.managers.utils import GenerationBatchResult

    worker, tree, chain = switching_worker()
    seen = []

    def sglang_step(self, batch, **kwargs):
        seen.append(shape_hook.current_state(self))
        # SGLang's result flags a replayed verify graph; here the chain's steps "replay" and the tree's not.
        return GenerationBatchResult(can_run_cuda_graph=self.topk == 1)

    def batch(mode, size):
        return type("Batch", (), {"forward_mode": mode, "is_extend_in_batch": False,
                                  "seq_lens": torch.zeros(size, dtype=torch.int64)})()

    caplog.set_level("INFO", logger="sglang_detspec")
    steps = [(ForwardMode.DECODE, 4), (ForwardMode.DECODE, 3), (ForwardMode.DECODE, 12), (ForwardMode.EXTEND, 12),
             (ForwardMode.DECODE, 5), (ForwardMode.IDLE, 0)]
    for mode, size in steps:
        assert isinstance(shape_hook.run_in_shape(sglang_step, worker, batch(mode, size)), GenerationBatchResult)
    assert seen == [chain, tree, chain, tree, chain, tree]
    draft = worker._draft_worker
    assert draft.topk == 4 and channels.DRAFT_TOPK.read(draft) == 4  # the draft extend keeps the tree's width
    shape_hook.run_in_shape(sglang_step, worker, batch(ForwardMode.DECODE, 9))
    assert worker.topk == 1 and draft.topk == 4 and channels.DRAFT_TOPK.read(draft) == 1
    assert draft.draft_runner.draft_attn_backend == "chain draft backend"
    assert worker._target_worker.model_runner.decode_cuda_graph_runner == "chain verify graph"
    logged = [r.getMessage() for r in caplog.records if shape_hook.SWITCH_LOG in r.getMessage()]
    assert logged == [f"{shape_hook.SWITCH_LOG} chain (decode batch of 4 requests, bound 3; "
                      f"{shape_hook.VERIFY_GRAPH_LOG} True)",
                      f"{shape_hook.SWITCH_LOG} tree (decode batch of 3 requests, bound 3; "
                      f"{shape_hook.VERIFY_GRAPH_LOG} False)"]
    assert channels.DRAFT_SHAPES.read(worker).switches == 7


def test_long_batches_of_any_size_run_the_chain_under_a_token_bound(caplog):
    from sglang.srt.managers.utils import GenerationBatchResult
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    worker, tree, chain = switching_worker()
    shapes = channels.DRAFT_SHAPES.read(worker)
    shapes.threshold, shapes.tokens = 0, 100
    seen = []

    def sglang_step(self, batch, **kwargs):
        seen.append(shape_hook.current_state(self))
        return GenerationBatchResult(can_run_cuda_graph=True)

    def batch(mode, lens):
        lens = torch.tensor(lens, dtype=torch.int64)
        return type("Batch", (), {"forward_mode": mode, "is_extend_in_batch": False, "seq_lens": lens.clone(),
                                  "seq_lens_cpu": lens, "seq_lens_sum": None})()

    caplog.set_level("INFO", logger="sglang_detspec")
    for mode, lens in [(ForwardMode.DECODE, [60, 30]), (ForwardMode.DECODE, [101]), (ForwardMode.EXTEND, [500]),
                       (ForwardMode.DECODE, [40] * 30), (ForwardMode.DECODE, [50, 50])]:
        shape_hook.run_in_shape(sglang_step, worker, batch(mode, lens))
    assert seen == [tree, chain, tree, chain, tree]
    # Above the batch bound the chain is decided by the size: the length is not read (requests without KV
    # records would raise if it were).
    shapes.threshold = 4
    unread = type("Batch", (), {"forward_mode": ForwardMode.DECODE, "is_extend_in_batch": False,
                                "seq_lens": torch.zeros(5, dtype=torch.int64), "seq_lens_cpu": None,
                                "seq_lens_sum": None, "reqs": [object()] * 5})()
    shape_hook.run_in_shape(sglang_step, worker, unread)
    assert seen[-1] == chain
    logged = [r.getMessage() for r in caplog.records if shape_hook.SWITCH_LOG in r.getMessage()]
    assert logged == [f"{shape_hook.SWITCH_LOG} chain (decode batch of 1 request and 101 tokens, bound 100 tokens; "
                      f"{shape_hook.VERIFY_GRAPH_LOG} True)",
                      f"{shape_hook.SWITCH_LOG} tree (prefill or extend batch of 1 request, bound 100 tokens)"]


def test_a_summary_counts_switches_and_steps_once_a_window_is_full(caplog, monkeypatch):
    """Every SUMMARY_S seconds of steps the worker logs its switches and its steps by kind, then starts a new window."""
    from sglang.srt.managers.utils import GenerationBatchResult
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    worker, tree, chain = switching_worker()
    shapes = channels.DRAFT_SHAPES.read(worker)
    clock = [1000.0]
    monkeypatch.setattr(shape_hook.time, "monotonic", lambda: clock[0])
    shapes.window_start = 1000.0

    def sglang_step(self, batch, **kwargs):
        return GenerationBatchResult(can_run_cuda_graph=True)

    def batch(mode, size):
        return type("Batch", (), {"forward_mode": mode, "is_extend_in_batch": False,
                                  "seq_lens": torch.zeros(size, dtype=torch.int64)})()

    caplog.set_level("INFO", logger="sglang_detspec")
    for mode, size in [(ForwardMode.DECODE, 4), (ForwardMode.DECODE, 5), (ForwardMode.EXTEND, 2),
                       (ForwardMode.DECODE, 2)]:
        shape_hook.run_in_shape(sglang_step, worker, batch(mode, size))
    assert not [r for r in caplog.records if shape_hook.SUMMARY_LOG in r.getMessage()]  # the window is not full
    clock[0] += shape_hook.SUMMARY_S
    shape_hook.run_in_shape(sglang_step, worker, batch(ForwardMode.DECODE, 6))
    lines = [r.getMessage() for r in caplog.records if shape_hook.SUMMARY_LOG in r.getMessage()]
    assert lines == [f"{shape_hook.SUMMARY_LOG} 60 s: 3 switches; steps: chain decode 3, tree decode 1, "
                     "prefill or extend 1"]
    assert shapes.window_switches == 0 and sum(shapes.window_steps.values()) == 0 and shapes.window_start == 1060.0


def test_the_start_up_line_names_the_chain_verify_graph_sizes():
    """SGLang logs no capture line for the chain's verify graph runner: the plugin's line is the record."""

    import inspect

    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner

    assert "self.capture_bs" in inspect.getsource(DecodeCudaGraphRunner.__init__)  # where SGLang keeps them

    class Runner:
        capture_bs = [48, 4, 5, 40]

    assert shape_hook.graph_sizes_note(Runner()) == "its target verify CUDA graphs at batch sizes 4..48 (4 sizes)"
    assert shape_hook.graph_sizes_note(None) == "its target verify eager (no decode CUDA graphs)"


def test_with_no_backend_named_the_tree_load_note_speaks_of_the_picks_other_than_fa3():
    """SGLang's fa3 pick at head size 65-128 takes the FA3 tree defaults (its own note): the plain tree's figures
    are then said of the other picks only; a named backend gets them plainly."""
    from sglang_detspec.config import DetSpecConfig

    def notes(backend, head_dim):
        bag = DetSpecConfig(deterministic=True, algorithm="EAGLE", num_steps=3, eagle_topk=4, num_draft_tokens=8,
                            attention_backend=backend, head_dim=head_dim, page_size=1, model_family="dense")
        return [n for n in startup_notes.unmeasured_notes(bag) if "rows per request" in n]

    other = "where SGLang picks a backend other than fa3 (its fa3 pick takes the FA3 tree defaults): "
    assert notes(None, 128)[0].startswith(other)
    assert notes("triton", 128)[0].startswith("a tree verifies 8 rows per request")
    assert notes(None, 64)[0].startswith("a tree verifies 8 rows per request")  # fa3 at 64 takes no defaults


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
