"""The check of SGLang's own FA3 calls (sglang_plugin/fa3_own_calls.py) and the split standing down on CPU.

FA3 cannot run here, so the check runs on the torch statement of one
attention call's contract (``ops.prefix_split.part_call_reference``: each
row computed alone), which must pass, and on calls that round one mode
apart (a decode, a chain verify, a chunk, a batched call), each of which it
must catch. The rule of when the split stands down is
``config.fa3_own_calls_exact``; the hook's decision (``fa3_split_hook.own_calls_serve``)
is checked with the check's answer given. FA3's bits are the GPU suite's
(``test/registered/cuda/test_fa3_own_calls_cuda.py``).
"""

import dataclasses
import logging
import sys

import pytest
import torch
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_detspec.config import (
    FA3_CAUSAL_KEPT_MAX_HEAD_DIM,
    FA3_UNMASKED_DECODE_MAX_HEAD_DIM,
    DetSpecConfig,
    current_config,
    fa3_own_calls_exact,
)
from sglang_detspec.ops import prefix_split as ps
from sglang_detspec.sglang_plugin import fa3_own_calls as own
from sglang_detspec.sglang_plugin import fa3_split_hook as fsh

register_cpu_ci(est_time=10, suite="detspec-unit-cpu")

ARGS = (2, 1, 16, torch.float32, torch.device("cpu"))
LENGTHS = (5, 130, 205)  # below one chunk, across it, a chunk past the verify's reach
CHAIN = DetSpecConfig(deterministic=True, algorithm="EAGLE", num_steps=3, eagle_topk=1, num_draft_tokens=4,
                      attention_backend="fa3", decode_attention="split", source="server_args", kernel="torch")
TREE = dataclasses.replace(CHAIN, eagle_topk=4, num_draft_tokens=8)


def contract(q, k, v, call, scale):
    return ps.part_call_reference(q, k, v, call, scale)


def apart_when(condition):
    """A call that rounds its output one float32 step apart when ``condition(call)`` holds."""
    def call(q, k, v, part, scale):
        o, lse = contract(q, k, v, part, scale)
        if condition(part):
            o = torch.nextafter(o, torch.full_like(o, float("inf")))
        return o, lse
    return call


def test_the_contract_passes():
    assert own.sglang_calls_agree(*ARGS, lengths=LENGTHS, call=contract)


@pytest.mark.parametrize("mode, condition", [
    ("decode (one-row calls)", lambda p: p.max_rows == 1),
    ("chain verify", lambda p: p.max_rows == own.CHECK_VERIFY_ROWS),
    ("a chunk", lambda p: p.max_rows == own.CHECK_CHUNK),
    ("a call of several requests", lambda p: p.seqlens.numel() > 1 and p.max_rows > 1),
])
def test_a_mode_rounded_apart_is_caught(mode, condition):
    assert not own.sglang_calls_agree(*ARGS, lengths=LENGTHS, call=apart_when(condition)), mode


def test_a_log_sum_exp_apart_is_caught():
    def call(q, k, v, part, scale):
        o, lse = contract(q, k, v, part, scale)
        return o, (lse + 2 ** -20 if part.max_rows == 1 else lse)

    assert not own.sglang_calls_agree(*ARGS, lengths=LENGTHS, call=call)


@pytest.mark.parametrize("head_dim, trees, want", [
    (FA3_UNMASKED_DECODE_MAX_HEAD_DIM, False, False),
    (FA3_UNMASKED_DECODE_MAX_HEAD_DIM + 1, False, True),
    (128, False, True),
    (FA3_CAUSAL_KEPT_MAX_HEAD_DIM, True, False),
    (FA3_CAUSAL_KEPT_MAX_HEAD_DIM + 1, False, False),
    (None, False, False),
])
def test_the_rule_takes_chains_at_head_sizes_65_to_128(head_dim, trees, want):
    assert fa3_own_calls_exact(head_dim, trees) is want


@pytest.mark.parametrize("config, trees", [
    (CHAIN, False),
    (TREE, True),
    (dataclasses.replace(CHAIN, algorithm=None, eagle_topk=None, num_steps=None, num_draft_tokens=None), False),
    (dataclasses.replace(CHAIN, algorithm="NGRAM"), True),
])
def test_which_servers_verify_trees(config, trees):
    assert config.verifies_trees is trees


def backend(**overrides):
    fields = dict(fa_impl_ver=3, use_mla=False, page_size=1, has_swa=False, local_attn_builder=None,
                  kv_cache_dtype_str="auto", kv_cache_dtype=torch.bfloat16, attn_cp_size=1, fa_skip_kv_cache=False,
                  is_draft_runner=False, topk=1, speculative_num_steps=3, speculative_num_draft_tokens=4,
                  head_dim=128, num_attention_heads=32, num_kv_heads=8, device="cuda:0")
    fields.update(overrides)
    import types
    return types.SimpleNamespace(**fields)


@pytest.fixture
def checks(monkeypatch):
    """Both start-up checks answered here (FA3 needs a GPU); returns the calls each got."""
    asked = {"own": [], "split": []}
    answers = {"own": True, "split": True}
    monkeypatch.setattr(fsh, "_OWN_CHECKED", {})
    monkeypatch.setattr(fsh, "_CHECKED", {})
    monkeypatch.setattr(fsh.torch.version, "hip", None)

    def own_check(*a):
        asked["own"].append(a)
        if isinstance(answers["own"], Exception):
            raise answers["own"]
        return answers["own"]

    monkeypatch.setattr(fsh, "sglang_calls_agree", own_check)
    monkeypatch.setattr(fsh, "split_modes_agree", lambda *a: asked["split"].append(a) or answers["split"])
    return asked, answers


def test_a_chain_at_head_size_128_keeps_sglangs_calls(bag, caplog, checks):
    asked, _ = checks
    bag(CHAIN)
    with caplog.at_level(logging.INFO, logger="sglang_detspec"):
        for _ in range(2):  # two target backends of one server: one check
            b = backend()
            fsh.check_backend(None, b)
            assert not fsh._serves(b)
    assert len(asked["own"]) == 1 and not asked["split"]
    assert asked["own"][0][:4] == (32, 8, 128, torch.bfloat16)
    lines = [r.getMessage() for r in caplog.records]
    assert sum(fsh.STANDS_DOWN in line for line in lines) == 2 and not any(fsh.SPLIT_OFF in line for line in lines)
    assert current_config() == CHAIN and CHAIN.logits == "bitwise"  # the claim does not move


@pytest.mark.parametrize("config, overrides", [
    (TREE, {"topk": 4, "speculative_num_draft_tokens": 8}),  # a tree: SGLang's cascade rounds apart
    (TREE, {}),  # a switching tree's chain state (a top-k 1 backend): the server's rule, so the split too
    (CHAIN, {"head_dim": 64}),  # FA3's unmasked one-row kernel
    (CHAIN, {"head_dim": 256}),
])
def test_trees_and_other_head_sizes_keep_the_split(bag, checks, config, overrides):
    asked, _ = checks
    bag(config)
    b = backend(**overrides)
    fsh.check_backend(None, b)
    assert fsh._serves(b) and not asked["own"] and len(asked["split"]) == 1


@pytest.mark.parametrize("answer", [False, RuntimeError("no FA3 build")])
def test_where_sglangs_calls_are_found_apart_the_split_serves(bag, caplog, checks, answer):
    asked, answers = checks
    answers["own"] = answer
    bag(CHAIN)
    with caplog.at_level(logging.INFO, logger="sglang_detspec"):
        b = backend()
        fsh.check_backend(None, b)
    assert fsh._serves(b) and len(asked["own"]) == 1 and len(asked["split"]) == 1
    lines = [r.getMessage() for r in caplog.records]
    assert not any(fsh.STANDS_DOWN in line for line in lines) and any(fsh.SPLIT_ON in line for line in lines)
    assert any("check of SGLang's FA3 calls failed" in line for line in lines) is isinstance(answer, Exception)
    assert any(fsh.OWN_CALLS_APART in line for line in lines) is (answer is False)


def layer(**overrides):
    import types

    fields = dict(sliding_window_size=-1, is_cross_attention=False, head_dim=128, v_head_dim=128, logit_cap=0.0)
    fields.update(overrides)
    return types.SimpleNamespace(**fields)


@pytest.mark.parametrize("overrides, kwargs, warned", [
    ({}, {}, False),
    ({"logit_cap": 30.0}, {}, True),  # another FA3 variant than the start-up check ran
    ({"sliding_window_size": 128}, {}, True),
    ({"v_head_dim": 64}, {}, True),
    ({}, {"sinks": object()}, True),
])
def test_with_the_split_stood_down_a_layer_the_check_did_not_cover_lowers_the_claim(bag, caplog, checks,
                                                                                    overrides, kwargs, warned):
    bag(CHAIN)
    b = backend()
    fsh.check_backend(None, b)
    calls = []

    def original(backend_, q, k, v, layer_, forward_batch, save_kv_cache, *args, **kw):
        calls.append(layer_)
        return "sglang's"

    with caplog.at_level(logging.WARNING, logger="sglang_detspec"):
        for _ in range(2):
            out = fsh.split_extend_around(original, b, None, None, None, layer(**overrides), None, True, **kwargs)
            assert out == "sglang's"  # SGLang's call either way
    warnings = [r.getMessage() for r in caplog.records if "did not cover" in r.getMessage()]
    assert len(calls) == 2 and len(warnings) == (1 if warned else 0)
    assert not warned or "'tokens', not 'bitwise'" in warnings[0]


def test_a_backend_the_split_could_not_serve_is_not_checked(bag, checks):
    asked, _ = checks
    bag(CHAIN)
    b = backend(page_size=16)
    fsh.check_backend(None, b)
    assert not fsh._serves(b) and not asked["own"]
    assert current_config().decode_attention == "one_pass"  # the existing path: SGLang's calls, claim restated


@pytest.mark.parametrize("config, says", [
    (dataclasses.replace(CHAIN, head_dim=128), "stands down for this server"),
    (dataclasses.replace(TREE, head_dim=128), "this server verifies draft trees, so its target runs the split"),
    (dataclasses.replace(CHAIN, algorithm="NGRAM", head_dim=128), "verifies draft trees"),
    (dataclasses.replace(CHAIN, head_dim=64), "at target head size 64 SGLang's own FA3 calls run a decode step"),
    (dataclasses.replace(CHAIN, head_dim=256), "at target head size 256"),
    (CHAIN, "keeps SGLang's own FA3 calls (a start-up check decides)"),  # head size not read
])
def test_the_dry_run_says_which_fa3_path_the_server_takes(config, says):
    from sglang_detspec.sglang_plugin.startup_notes import unmeasured_notes

    notes = [n for n in unmeasured_notes(config) if n.startswith("SGLANG_DETSPEC_DECODE_ATTENTION=split on fa3")]
    assert len(notes) == 1 and says in notes[0], notes


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
