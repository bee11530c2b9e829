"""Coupled drafts are the default in coupled mode: chains race q, trees take q's Gumbel-top-k, on TARGET.

Real ``ServerArgs`` resolved by SGLang: a coupled chain turns SGLang's
sampled-draft path on (its rejection-sampling flag) and keeps coupled verify;
a tree keeps the flag off and drafts through the tree hooks. The tree hook
runs on SGLang's own ``SamplingBatchInfo``, ``renorm_draft_probs`` and
``fast_topk``; its oracle is the op layer's Gumbel-top-k (``exponential_race``
with ``num_samples = k`` on ``Stream.TARGET``) at the drafted position. Tree
acceptance is checked against the chain of first children (never fewer) and
against a Monte Carlo of the same coupling on an independent RNG.
"""

import dataclasses
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from sglang_detspec.config import DetSpecConfig, current_config, reset_config
from sglang_detspec.ops import (
    Stream, coupled_verify_chain, coupled_verify_tree, exponential_race, race_keys, target_weights,
)
from sglang_detspec.sglang_plugin import positions, resolve, topk_draft_hook
from test_coupled_plugin import CHAIN, DET, TREE, eagle, loaded, sampling_info, server_args  # noqa: F401
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=60, suite="detspec-unit-cpu")

TREE_BAG = DetSpecConfig(deterministic=True, algorithm="EAGLE", num_steps=3, eagle_topk=4, num_draft_tokens=8,
                         verify="coupled", source="server_args")


# -- start-up: which draft path a coupled server takes ----------------------------------


def test_coupled_chain_turns_on_sampled_drafts_and_keeps_coupled_verify(loaded, model_dir):
    import pickle

    from sglang.srt.arg_groups.overrides import resolved_view
    from sglang.srt.runtime_context import publish, reset_context

    reset_config()
    sa = server_args(model_dir, f"{eagle(model_dir, CHAIN)} {DET}")
    assert resolved_view(sa).speculative_use_rejection_sampling  # SGLang's sampled-draft path
    assert "SGLANG_DETSPEC_VERIFY" not in os.environ  # nothing leaks into later servers of this process
    bag = current_config()
    assert bag.active and bag.coupled and bag.coupled_drafts and not bag.topk_drafts
    # A scheduler process gets the record pickled; its publish installs the same mode, resolved from
    # SGLang's runtime context.
    reset_config()
    publish(pickle.loads(pickle.dumps(sa)), role="test")
    try:
        scheduler_bag = current_config()
    finally:
        reset_context()
    assert scheduler_bag.source == "runtime_context"
    assert scheduler_bag.coupled and scheduler_bag.rejection_sampling and scheduler_bag.coupled_drafts
    # With the user's own flag and SGLANG_DETSPEC_VERIFY unset, auto still means rejection.
    reset_config()
    own = server_args(model_dir, f"{eagle(model_dir, CHAIN)} --speculative-use-rejection-sampling {DET}")
    assert current_config().verify == "rejection" and resolve.config_from_server_args(own).verify == "rejection"
    reset_config()


def test_coupled_tree_keeps_the_flag_off_and_uses_tree_drafts(loaded, model_dir):
    from sglang.srt.arg_groups.overrides import resolved_view

    reset_config()
    sa = server_args(model_dir, f"{eagle(model_dir, TREE)} {DET}")
    assert not resolved_view(sa).speculative_use_rejection_sampling
    bag = current_config()
    assert bag.active and bag.topk_drafts and not bag.coupled_drafts
    reset_config()


def eagle3_draft(folder, model_dir, **fields):
    folder.mkdir(parents=True)
    config = json.loads((Path(model_dir) / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **fields}))
    return str(folder)


def test_an_eagle3_draft_over_a_reduced_vocabulary_drafts_through_the_topk_hooks(loaded, model_dir, tmp_path):
    from sglang.srt.arg_groups.overrides import resolved_view

    draft = eagle3_draft(tmp_path / "eagle3", model_dir, draft_vocab_size=500)
    reset_config()
    sa = server_args(model_dir, f"--speculative-algorithm EAGLE3 --speculative-draft-model-path {draft} {CHAIN} {DET}")
    assert not resolved_view(sa).speculative_use_rejection_sampling  # SGLang would refuse the flag
    bag = current_config()
    assert bag.coupled and not bag.coupled_drafts and bag.topk_drafts and bag.reduced_draft_vocab
    reset_config()


def test_rejection_mode_refuses_a_reduced_draft_vocabulary_and_names_coupled_mode(loaded, model_dir, tmp_path):
    draft = eagle3_draft(tmp_path / "eagle3", model_dir, draft_vocab_size=500)
    reset_config()
    with pytest.raises(ValueError, match="reduced vocabulary.*use coupled mode"):
        server_args(model_dir, f"--speculative-algorithm EAGLE3 --speculative-draft-model-path {draft} {CHAIN} "
                               f"--speculative-use-rejection-sampling {DET}")
    reset_config()
    full = eagle3_draft(tmp_path / "full", model_dir)  # the same flags with a full-vocabulary draft start
    server_args(model_dir, f"--speculative-algorithm EAGLE3 --speculative-draft-model-path {full} {CHAIN} "
                           f"--speculative-use-rejection-sampling {DET}")
    assert current_config().verify == "rejection" and not current_config().reduced_draft_vocab
    reset_config()


def test_a_reduced_draft_vocabulary_is_refused_with_the_flag_in_either_mode_with_one_message():
    from sglang_detspec.config import REDUCED_VOCAB_REFUSAL

    chain = dataclasses.replace(TREE_BAG, eagle_topk=1, num_draft_tokens=4, reduced_draft_vocab=True)
    assert chain.refusals() == [] and chain.active  # coupled, no flag: served
    assert dataclasses.replace(chain, rejection_sampling=True).refusals() == [REDUCED_VOCAB_REFUSAL]
    for flag in (True, False):  # rejection mode: the one message, not also "add the flag"
        assert dataclasses.replace(chain, verify="rejection", rejection_sampling=flag).refusals() == [
            REDUCED_VOCAB_REFUSAL]
    assert "drop --speculative-use-rejection-sampling" in REDUCED_VOCAB_REFUSAL


def test_sampled_draft_blockers_mirror_sglangs_refusals(loaded, model_dir, tmp_path):
    import argparse

    from sglang.srt.server_args import ServerArgs

    def record(flags):
        parser = argparse.ArgumentParser()
        ServerArgs.add_cli_args(parser)
        argv = ["--model-path", model_dir, "--device", "cuda", *f"{flags} {CHAIN} {DET}".split()]
        return ServerArgs.from_cli_args(parser.parse_args(argv))

    assert resolve.sampled_draft_blockers(record(eagle(model_dir, ""))) == []
    assert resolve.sampled_draft_blockers(record(f"{eagle(model_dir, '')} --enable-watermark")) == [
        "--enable-watermark"]
    assert resolve.sampled_draft_blockers(
        record(f"{eagle(model_dir, '')} --speculative-accept-threshold-single 0.5")) == [
        "--speculative-accept-threshold-single / -acc"]
    from types import SimpleNamespace as Spec  # any object with SGLang's argument names

    full = eagle3_draft(tmp_path / "full", model_dir)
    reduced = eagle3_draft(tmp_path / "reduced", model_dir, draft_vocab_size=500)
    assert resolve.reduced_draft_vocab(Spec(speculative_algorithm="EAGLE3", speculative_draft_model_path=full)) is False
    assert resolve.reduced_draft_vocab(Spec(speculative_algorithm="EAGLE3", speculative_draft_model_path=reduced))
    # unreadable: unknown for EAGLE3 (most are reduced: the blockers count it), EAGLE drafts share the target's head
    assert resolve.reduced_draft_vocab(Spec(speculative_algorithm="EAGLE3", speculative_draft_model_path="org/x")) is None
    assert resolve.reduced_draft_vocab(Spec(speculative_algorithm="EAGLE", speculative_draft_model_path="org/x")) is False
    assert resolve.reduced_draft_vocab(Spec(speculative_algorithm="EAGLE", speculative_draft_model_path=full,
                                            speculative_token_map="map.pt"))
    assert resolve.sampled_draft_blockers(record(f"--speculative-algorithm EAGLE3 --speculative-draft-model-path "
                                                 f"{reduced}"))[0].startswith("the draft proposes over a reduced")


def test_draft_path_properties():
    chain = dataclasses.replace(TREE_BAG, eagle_topk=1, num_draft_tokens=4)
    assert chain.wants_sampled_drafts()
    assert not TREE_BAG.wants_sampled_drafts() and TREE_BAG.topk_drafts
    assert not dataclasses.replace(chain, algorithm="NGRAM").wants_sampled_drafts()
    assert not dataclasses.replace(TREE_BAG, verify="rejection").topk_drafts
    assert not dataclasses.replace(TREE_BAG, deterministic=False).topk_drafts
    # Chains whose sampled-draft path stays off draft through the top-k hooks: STANDALONE (SGLang
    # refuses the flag for it; its worker subclasses EAGLE v2's), and a chain start-up could not turn
    # the flag on for; a chain with the flag on does not.
    standalone = dataclasses.replace(chain, algorithm="STANDALONE")
    assert not standalone.wants_sampled_drafts() and standalone.topk_drafts
    assert chain.topk_drafts and not dataclasses.replace(chain, rejection_sampling=True).topk_drafts


def test_standalone_drafts_go_through_the_hooked_eagle_worker(loaded):
    """SGLang's STANDALONE draft worker is an EagleDraftWorker: the top-k draft hooks cover it."""
    from sglang.srt.speculative import eagle_worker_v2, standalone_worker_v2

    assert issubclass(standalone_worker_v2.StandaloneDraftWorker, eagle_worker_v2.EagleDraftWorker)
    for name in ("draft_forward", "_draft_extend_for_prefill", "_draft_extend_for_decode"):
        assert hasattr(getattr(standalone_worker_v2.StandaloneDraftWorker, name), "__wrapped__"), name


# -- the tree hook: Gumbel-top-k children on SGLang's own tensors --------------------


def tree_case(b=3, topk=4, v=400, seed=11):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(b * topk, v, generator=gen) * 2  # draft_forward: one row per expanded node
    seeds = torch.randint(-(1 << 62), 1 << 62, (b,), generator=gen)
    pos = torch.randint(10, 1 << 20, (b,), generator=gen).repeat_interleave(topk)  # forward_batch.positions
    return logits, seeds, pos


def run_renorm(logits, info, site_positions, k):
    from sglang.srt.speculative import eagle_worker_v2

    with positions.draft_site(positions.DraftSite(k, lambda: site_positions)):
        probs = eagle_worker_v2.renorm_draft_probs(logits, info, False)  # the binding draft_forward calls
    return probs, eagle_worker_v2.fast_topk(probs, k, dim=-1)


def test_children_are_the_gumbel_top_k_of_q_on_target_at_the_drafted_position(loaded, bag):
    bag(TREE_BAG)
    topk = 4
    logits, seeds, pos = tree_case(topk=topk)
    temps = [1.0, 0.7, 1.3]
    info = sampling_info([400] * 3, temps, seeds, vocab=400)
    drafted = positions.draft_forward_positions(pos)
    probs, (topk_p, topk_index) = run_renorm(logits, info, drafted, topk)
    rows_t = torch.tensor(temps).repeat_interleave(topk).view(-1, 1)
    w = target_weights(logits, rows_t)
    want = exponential_race(w, seeds.repeat_interleave(topk), pos + 2, stream=Stream.TARGET, num_samples=topk)
    assert torch.equal(torch.sort(topk_index, dim=1).values, torch.sort(want, dim=1).values)
    # Path scores: each child's race key over the winner's; the winner (the coupled chain's draft) scores 1.
    keys = race_keys(w.gather(1, want), seeds.repeat_interleave(topk), pos + 2, want, Stream.TARGET)
    assert bool((keys[:, :1] >= keys).all())  # exponential_race returns its winners in key order
    assert torch.allclose(topk_p.double(), torch.sort(keys / keys[:, :1], dim=1, descending=True).values)
    assert bool((topk_p[:, 0] == 1.0).all()) and bool((topk_p <= 1.0).all())
    # The first child by race order is the coupled chain's draft: race(q, TARGET, t).
    first = exponential_race(w, seeds.repeat_interleave(topk), pos + 2, stream=Stream.TARGET)
    assert bool((topk_index == first).any(dim=1).all())


def test_greedy_rows_keep_sglangs_top_k_and_cut_rows_race_the_cut(loaded, bag):
    from sglang.srt.speculative import spec_utils

    bag(TREE_BAG)
    topk = 2
    logits, seeds, pos = tree_case(b=3, topk=topk, v=300)
    info = sampling_info([1, 5, 300], [1.0, 1.0, 0.9], seeds, top_ps=[1.0, 1.0, 0.8], vocab=300)
    probs, (_, idx) = run_renorm(logits, info, pos + 2, topk)
    plain = spec_utils.renorm_draft_probs(logits, info, False)  # outside a site: SGLang's own
    assert torch.equal(probs[:topk], plain[:topk].float())  # greedy request: SGLang's top-k of q
    assert torch.equal(idx[:topk], spec_utils.fast_topk(plain[:topk], topk, dim=-1)[1])
    # top_k = 5 and top_p = 0.8 rows race the id-ordered cut, as the target does.
    from sglang_detspec.ops import id_ordered_filtered_probs

    rows = slice(topk, None)
    sm = torch.softmax(logits[rows] / torch.tensor([1.0, 1.0, 0.9, 0.9]).view(-1, 1), dim=-1)
    cut = id_ordered_filtered_probs(sm, torch.tensor([5, 5, 300, 300]), torch.tensor([1.0, 1.0, 0.8, 0.8]))
    want = exponential_race(cut, seeds[1:].repeat_interleave(topk), pos[rows] + 2, stream=Stream.TARGET,
                            num_samples=topk)
    assert torch.equal(torch.sort(idx[rows], 1).values, torch.sort(want, 1).values)
    assert bool((cut.gather(1, idx[rows]) > 0).all())


def test_outside_a_site_or_without_seeds_sglang_runs(loaded, bag):
    from sglang.srt.speculative import eagle_worker_v2

    bag(TREE_BAG)
    logits, seeds, pos = tree_case()
    plain = torch.softmax(logits, dim=-1)  # SGLang's renorm_draft_probs on CPU without the flag
    info = sampling_info([400] * 3, [1.0] * 3, seeds, vocab=400)
    assert torch.equal(eagle_worker_v2.renorm_draft_probs(logits, info, False), plain)
    unseeded = sampling_info([400] * 3, [1.0] * 3, None, vocab=400)
    with positions.draft_site(positions.DraftSite(4, lambda: pos)):
        assert torch.equal(eagle_worker_v2.renorm_draft_probs(logits, unseeded, False), plain)
        assert not torch.equal(eagle_worker_v2.renorm_draft_probs(logits, info, False), plain)


def test_fast_topk_in_a_site_returns_the_race_ranking_sglang_would_compute(loaded, bag, monkeypatch):
    """While a draft site runs, eagle_worker_v2's fast_topk of the children tensor returns, bit for bit, what
    SGLang's top-k of that tensor returns (greedy, cut and plain rows) without ranking it again; any other
    tensor, and every other module's fast_topk, stay SGLang's; the binding is restored after the site."""
    from sglang.srt.speculative import eagle_worker_v2
    from sglang.srt.utils import common

    bag(TREE_BAG)
    topk = 3
    logits, seeds, pos = tree_case(b=3, topk=topk, v=500)
    info = sampling_info([1, 8, 500], [1.0, 0.8, 1.2], seeds, top_ps=[1.0, 1.0, 0.9], vocab=500)
    sglangs = eagle_worker_v2.fast_topk
    ranked_calls = []
    real_topk = torch.topk

    def counted_topk(*args, **kwargs):
        ranked_calls.append(args[0].shape)
        return real_topk(*args, **kwargs)

    class Worker:  # the attributes the hooks read
        pass

    Worker.topk = topk
    seen = []

    def draft_forward(self, forward_batch):
        probs = eagle_worker_v2.renorm_draft_probs(logits, forward_batch.sampling_info, False)
        monkeypatch.setattr(torch, "topk", counted_topk)
        ranked = eagle_worker_v2.fast_topk(probs, topk, dim=-1)
        ranked_topk_calls = len(ranked_calls)
        again = eagle_worker_v2.fast_topk(probs.clone(), topk, dim=-1)  # another tensor: SGLang's
        monkeypatch.setattr(torch, "topk", real_topk)
        seen.append((ranked, ranked_topk_calls, again, common.fast_topk is sglangs, probs))

    fb = type("ForwardBatch", (), {"positions": pos, "sampling_info": info})()
    topk_draft_hook.draft_forward_site(draft_forward, Worker(), fb)
    (values, indices), ranked_topk_calls, (v_sglang, i_sglang), common_untouched, probs = seen[0]
    assert ranked_topk_calls == 0 and len(ranked_calls) == 1  # the ranking came from the race; the copy was ranked
    want = sglangs(probs, topk, dim=-1)
    assert torch.equal(values, want.values) and torch.equal(indices, want.indices)
    assert torch.equal(v_sglang, want.values) and torch.equal(i_sglang, want.indices)
    assert values.dtype == torch.float32 and indices.dtype == torch.int64
    assert torch.equal(values[:topk], torch.topk(probs[:topk], topk).values)  # the greedy request: q's top-k
    assert common_untouched and eagle_worker_v2.fast_topk is sglangs and positions.published_site() is None


def test_the_prefill_extend_site_ranks_too_and_every_other_call_falls_through(loaded, bag):
    """The draft extend after a prefill ranks its children the same way (a row cut below k keeps its positive
    children and SGLang's values); another k or dimension is SGLang's top-k; the binding is back after an error."""
    from sglang.srt.speculative import eagle_worker_v2

    bag(TREE_BAG)
    topk = 4
    logits, seeds, pos = tree_case(b=5, topk=1, v=300)  # one row per request after a prefill
    info = sampling_info([1, 2, 300, 300, 300], [1.0, 0.9, 1.1, 1.0, 0.8], seeds, vocab=300)  # request 1 keeps 2
    sglangs, got = eagle_worker_v2.fast_topk, []

    class Worker:
        pass

    Worker.topk = topk

    def extend(self, batch, *args):
        probs = eagle_worker_v2.renorm_draft_probs(logits, info, False)
        got.append((probs, eagle_worker_v2.fast_topk(probs, topk, dim=-1),
                     eagle_worker_v2.fast_topk(probs, topk - 1, dim=-1), eagle_worker_v2.fast_topk(probs, topk, dim=0)))
        raise RuntimeError("inside the site")

    batch = type("Batch", (), {"seq_lens": pos})()
    with pytest.raises(RuntimeError, match="inside the site"):
        topk_draft_hook.extend_prefill_site(extend, Worker(), batch, None, None)
    assert eagle_worker_v2.fast_topk is sglangs and positions.published_site() is None
    probs, (values, indices), narrower, across = got[0]
    want = sglangs(probs, topk, dim=-1)
    assert torch.equal(values, want.values)
    positive = values > 0
    assert torch.equal(indices[positive], want.indices[positive]) and int(positive[1].sum()) == 2
    assert len(set(indices[1].tolist())) == topk and int(indices.max()) < 300
    assert torch.equal(narrower.values, sglangs(probs, topk - 1, dim=-1).values)
    assert torch.equal(across.indices, sglangs(probs, topk, dim=0).indices)


def test_a_reduced_draft_vocabulary_keeps_sglangs_fast_topk(loaded, bag):
    """A site over a reduced draft vocabulary, or a chain's, keeps no children to rank: fast_topk stays SGLang's."""
    from sglang.srt.speculative import eagle_worker_v2

    bag(TREE_BAG)
    config = type("Config", (), {"vocab_size": 1000})()
    target = type("Target", (), {"model_runner": type("Runner", (), {"model_config": config})()})()
    worker = type("Worker", (), {"topk": 4, "hot_token_id": torch.arange(0, 1000, 2), "target_worker": target})()
    sglangs, inside = eagle_worker_v2.fast_topk, []
    fb = type("ForwardBatch", (), {"positions": torch.tensor([5, 5]), "sampling_info": None})()
    topk_draft_hook.draft_forward_site(lambda self, f: inside.append(eagle_worker_v2.fast_topk), worker, fb)
    assert inside == [sglangs] and positions.published_site() is None
    # A chain's site (one child per row) keeps SGLang's fast_topk too: a max is cheaper than the ranking.
    chain = type("Worker", (), {"topk": 1})()
    topk_draft_hook.draft_forward_site(lambda self, f: inside.append(eagle_worker_v2.fast_topk), chain, fb)
    assert inside == [sglangs, sglangs]


def test_sites_publish_the_drafted_positions(loaded, bag):
    """The three worker sites publish t: draft_forward positions + 2, extends seq_lens + 1 / new_seq_lens + 1."""
    bag(TREE_BAG)
    seen = []

    class Worker:  # only the attribute the hooks read
        topk = 4

    def original(self, *args, **kwargs):
        seen.append(positions.published_site().positions().clone())

    fb = type("ForwardBatch", (), {"positions": torch.tensor([5, 5, 5, 5]), "sampling_info": None})()
    topk_draft_hook.draft_forward_site(original, Worker(), fb)
    batch = type("Batch", (), {"seq_lens": torch.tensor([7])})()
    topk_draft_hook.extend_prefill_site(original, Worker(), batch, None, None)
    result = type("Result", (), {"new_seq_lens": torch.tensor([12])})()
    topk_draft_hook.extend_decode_site(original, Worker(), batch, result)
    assert [s.tolist() for s in seen] == [[7, 7, 7, 7], [8], [13]]
    assert positions.published_site() is None


def test_graph_refill_copies_seeds_temperatures_and_top_k(loaded, bag):
    from sglang.srt.speculative.eagle_draft_cuda_graph_runner import EAGLEDraftCudaGraphRunner

    bag(TREE_BAG)
    runner = object.__new__(EAGLEDraftCudaGraphRunner)
    runner.eagle_worker = type("Worker", (), {"topk": 4})()
    runner.buffers = type("Buffers", (), {"sampling_seed": None, "seq_lens": torch.zeros(8, dtype=torch.int64)})()
    runner.temperatures = torch.ones(8, 1)
    runner.top_ks = torch.full((8,), 1 << 30, dtype=torch.int32)
    topk_draft_hook.graph_seed_buffer(lambda self, *a: None, runner, 4, None)
    assert runner.buffers.sampling_seed.shape == (8,) and runner.buffers.sampling_seed.dtype == torch.int64
    info = sampling_info([1, 7, 400], [1.0, 0.5, 2.0], torch.tensor([3, -4, 5]), vocab=400)
    fb = type("ForwardBatch", (), {"sampling_info": info, "batch_size": 3})()
    calls = []
    topk_draft_hook.graph_refill(lambda self, f: calls.append(f), runner, fb)
    assert calls == [fb]
    assert runner.buffers.sampling_seed[:3].tolist() == [3, -4, 5]
    assert runner.temperatures[:3].view(-1).tolist() == [1.0, 0.5, 2.0]
    assert runner.top_ks[:3].tolist() == [1, 7, 400] and runner.top_ks[3] == 1 << 30


def test_sglangs_own_beam_search_and_pruning_keep_the_coupled_chain(loaded, bag):
    """children_tensor through SGLang's select_top_k_tokens and organize_draft_results (steps 3, topk 4, 8 tokens)."""
    from sglang.srt.speculative import eagle_utils, spec_utils

    bag(TREE_BAG)
    b, k, steps, n_tokens, v = 3, 4, 3, 8, 50
    gen = torch.Generator().manual_seed(7)
    bigram = torch.randn(v, v, generator=gen) * 2  # draft logits after each token
    seeds = torch.randint(0, 1 << 62, (b,), generator=gen)
    roots = torch.randint(0, v, (b,), generator=gen)
    t = torch.randint(0, 1 << 20, (b,), generator=gen)  # the first drafted token's position
    info = sampling_info([v] * b, [1.0] * b, seeds, vocab=v)
    later = spec_utils._select_top_k_tokens_later._torchdynamo_orig_callable  # SGLang's code, not compiled

    def choose(tokens, positions):
        probs = topk_draft_hook.children_tensor(bigram[tokens], info, positions, k, "torch")
        return spec_utils.fast_topk(probs, k, dim=-1)

    topk_p, topk_index = choose(roots, t)
    scores, score_list, token_list, parents_list = None, [], [], []
    for i in range(steps):
        if i == 0:
            input_ids, _, scores, tree_info = spec_utils.select_top_k_tokens(i, topk_p, topk_index, None, scores, k)
        else:
            input_ids, _, scores, tree_info = later(i, topk_p, topk_index, None, scores, k)
        score_list.append(tree_info[0]); token_list.append(tree_info[1]); parents_list.append(tree_info[2])
        if i < steps - 1:
            topk_p, topk_index = choose(input_ids, (t + 1 + i).repeat_interleave(k))
    _, kept, draft_tokens = eagle_utils.organize_draft_results(score_list, token_list, parents_list, n_tokens)
    flat_scores = torch.cat(score_list, dim=1).flatten(1)
    flat_tokens = torch.cat(token_list, dim=1)
    chain, prev = [], roots
    for d in range(steps):  # the coupled chain, drawn independently: race(q, TARGET, t + d)
        q = torch.softmax(bigram[prev], dim=-1)
        prev = exponential_race(q, seeds, t + d, stream=Stream.TARGET)[:, 0]
        chain.append(prev)
    chain = torch.stack(chain, 1)
    for row in range(b):
        ones = (flat_scores[row] == 1.0).nonzero().view(-1)
        assert ones.numel() == steps  # exactly the chain scores 1 at each depth
        assert torch.equal(flat_tokens[row, ones], chain[row])  # and it is the coupled chain
        assert set(ones.tolist()) <= set(kept[row].tolist())  # SGLang's pruning keeps it


# -- acceptance: trees never accept fewer than their chain; Monte Carlo agreement -----


def gumbel_tree(q_rows, seeds, t, k, depth):
    """Full k-ary tree of depth ``depth`` over position-indexed q rows: SGLang's layout (node 0 the root)."""
    b = seeds.shape[0]
    tokens, parent, level = [[0] for _ in range(b)], [[-1] for _ in range(b)], [[0] for _ in range(b)]
    for row in range(b):
        frontier = [0]
        for d in range(depth):
            nxt = []
            for node in frontier:
                kids = exponential_race(q_rows[row, d:d + 1], seeds[row:row + 1], t[row] + d, stream=Stream.TARGET,
                                        num_samples=k)[0].tolist()
                for tok in kids:
                    tokens[row].append(tok)
                    parent[row].append(node)
                    level[row].append(d + 1)
                    nxt.append(len(tokens[row]) - 1)
            frontier = nxt
    n = len(tokens[0])
    nxt_tok = torch.full((b, n), -1, dtype=torch.int64)
    sib = torch.full((b, n), -1, dtype=torch.int64)
    for row in range(b):
        last = {}
        for node in range(1, n):
            p = parent[row][node]
            if p in last:
                sib[row, last[p]] = node
            else:
                nxt_tok[row, p] = node
            last[p] = node
    lev = torch.tensor(level)
    return torch.tensor(tokens), nxt_tok, sib, lev


def test_a_tree_never_accepts_fewer_than_its_chain_of_first_children():
    gen = torch.Generator().manual_seed(3)
    b, v, depth, k = 64, 12, 3, 3
    # q depends only on the depth here, so every node at one depth has the same q and the same p.
    p_rows = torch.softmax(torch.randn(b, depth + 1, v, generator=gen), dim=-1)
    q_rows = torch.softmax(torch.log(p_rows[:, :depth]) + 0.8 * torch.randn(b, depth, v, generator=gen), dim=-1)
    seeds = torch.randint(0, 1 << 62, (b,), generator=gen)
    t = torch.randint(0, 1000, (b,), generator=gen)
    tokens, nxt, sib, lev = gumbel_tree(q_rows, seeds, t, k, depth)
    p_nodes = p_rows.gather(1, lev.unsqueeze(-1).expand(-1, -1, v).clamp(max=depth))
    _, tree_acc, _ = coupled_verify_tree(tokens, nxt, sib, p_nodes, seeds, t)
    chain = torch.cat([exponential_race(q_rows[:, d], seeds, t + d, stream=Stream.TARGET) for d in range(depth)], 1)
    _, chain_acc = coupled_verify_chain(chain, p_rows, seeds, t)
    assert bool((tree_acc >= chain_acc).all())
    assert tree_acc.float().mean() > chain_acc.float().mean()  # and strictly more on average


def test_per_position_match_agrees_with_an_independent_monte_carlo():
    """Pr[target race winner among q's Gumbel-top-k]: hash uniforms vs NumPy's RNG, same coupling."""
    v, n = 8, 4000
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(v))
    q = 0.6 * p + 0.4 * rng.dirichlet(np.ones(v))
    seeds = torch.arange(n, dtype=torch.int64) * 7919 + 13
    pt = torch.tensor(p, dtype=torch.float64).expand(n, v).contiguous()
    qt = torch.tensor(q, dtype=torch.float64).expand(n, v).contiguous()
    for k in (1, 2, 4):
        y = exponential_race(pt, seeds, 5, stream=Stream.TARGET)
        kids = exponential_race(qt, seeds, 5, stream=Stream.TARGET, num_samples=k)
        ours = float((kids == y).any(dim=1).double().mean())
        e = rng.exponential(size=(200_000, v))
        y_ref = np.argmax(p / e, axis=1)
        top = np.argsort(-(q / e), axis=1)[:, :k]
        ref = float((top == y_ref[:, None]).any(axis=1).mean())
        sd = np.sqrt(ref * (1 - ref) / n) + np.sqrt(ref * (1 - ref) / 200_000)
        assert abs(ours - ref) < 4.5 * sd + 1e-9, (k, ours, ref)
    tv = 0.5 * np.abs(p - q).sum()
    assert ref > 1 - tv  # k = 4 children beat a rejection-sampling chain's 1 - TV per position


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
