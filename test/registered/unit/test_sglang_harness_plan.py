"""The plan of the SGLang-harness E2E suite (``test/registered/e2e/_harness_plan.py``), checked without a GPU.

The rules are read against SGLang 0.5.23's own harness module
(``sglang.test.test_deterministic``): its modes, its prompts, the ids it
sends and the verdict lines it prints; the tiny tokenizer is loaded with
transformers and encodes the harness's real prompts.
"""

import argparse
import hashlib
import importlib
import importlib.util
import inspect
import json
import random
import sys
from pathlib import Path

import pytest
import torch
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=30, suite="detspec-unit-cpu")

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def mods(e2e_import):
    """``_harness_plan``, ``_harness_run`` and the suite module, imported by bare name from their folder."""
    return argparse.Namespace(plan=e2e_import("_harness_plan"), run=e2e_import("_harness_run"),
                              e2e=e2e_import("_e2e"), suite=e2e_import("test_sglang_harness"))


@pytest.fixture(scope="module")
def harness():
    from sglang.test import test_deterministic

    return test_deterministic


@pytest.fixture(scope="module")
def tiny():
    spec = importlib.util.spec_from_file_location("make_tiny_models", ROOT / "scripts" / "make_tiny_models.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_modes_are_the_harness_modes(mods, harness):
    parser = argparse.ArgumentParser()
    harness.BenchArgs.add_cli_args(parser)
    choices = next(a.choices for a in parser._actions if a.dest == "test_mode")
    assert set(mods.plan.MODES) == set(choices)
    assert mods.plan.TRIALS["p_vs_d"] >= mods.plan.MIN_P_VS_D_TRIALS == 4


def test_the_constants_follow_the_harness_source(mods, harness):
    source = inspect.getsource(harness)
    plan = mods.plan
    assert f"random.randint(100, {plan.RADIX_MAX_TOKEN_ID})" in source
    assert "len_prefix = [1, 511, 2048, 4097]" in source and plan.PREFIX_PROMPTS == 4
    assert plan.LONGEST_PROMPT_CHARS == 4097 and "random.randrange(1, 4096)" in source
    assert harness.BenchArgs.max_new_tokens == plan.NEW_TOKENS
    assert plan.PREFIX_LOGPROBS_SAME in source and plan.PREFIX_LOGPROBS_APART in source
    assert plan.RADIX_MAX_TOKEN_ID < plan.VOCAB


@pytest.mark.parametrize("mode, trials, want", [("single", 8, 1), ("prefix", 8, 4), ("radix_cache", 1, 1),
                                                ("p_vs_d", 4, 10), ("p_vs_d", 5, 15)])
def test_expected_results(mods, mode, trials, want):
    assert mods.plan.expected_results(mode, trials) == want


def test_pass_rules(mods):
    passed = mods.plan.mode_passed
    assert passed("single", [1], 8) and not passed("single", [2], 8) and not passed("single", [], 8)
    assert passed("p_vs_d", [1] * 10, 4)
    assert not passed("p_vs_d", [1] * 9 + [0], 4)
    assert not passed("p_vs_d", [1] * 9, 4)  # a sequence went missing
    assert passed("radix_cache", [1], 1) and not passed("radix_cache", [0], 1)
    assert passed("prefix", [1, 1, 1, 1], 8, logprobs_identical=True)
    assert not passed("prefix", [1, 1, 1, 1], 8, logprobs_identical=False)
    assert not passed("prefix", [1, 1, 1, 1], 8, logprobs_identical=None)  # no verdict printed
    assert not passed("prefix", [1, 1, 0, 1], 8, logprobs_identical=True)  # a prefix never sampled


@pytest.mark.parametrize("bad", [("p_vs_d", 0), ("pvd", 4), ("single", 1.5)])
def test_bad_mode_or_trials_are_refused_by_name(mods, bad):
    with pytest.raises(ValueError, match="mode|trials"):
        mods.plan.expected_results(*bad)


def test_what_is_asserted_follows_the_claim(mods):
    asserted = mods.plan.asserted
    for claim in ("bitwise", "tokens", None):
        assert asserted("single", claim) and asserted("prefix", claim)
        assert asserted("p_vs_d", claim) == asserted("radix_cache", claim) == (claim == "bitwise")


def test_each_server_is_held_to_the_claim_of_its_own_settings(mods):
    """A server's own environment overrides the suite's: the node-path switching tree claims bitwise at head 128."""
    plan, e2e = mods.plan, mods.e2e
    wide = "coupled_tree_switch_nodes" + plan.WIDE_SUFFIX
    env = {"SGLANG_DETSPEC_DECODE_ATTENTION": "split", **dict(e2e.family("coupled_tree_switch_nodes").env)}
    bag = plan.server_bag("fa3", wide, env, 128)
    assert (bag.tree_attention, bag.decode_attention, bag.chain_at_batch) == ("nodes", "sglang", 3)
    assert (bag.num_steps, bag.eagle_topk, bag.num_draft_tokens) == (3, 4, 8)
    assert bag.logits == "bitwise" and bag.node_path_verifies
    # The positive control of the head-size rule: SGLang's calls part decode from prefill at 64.
    assert plan.server_bag("fa3", wide, env, 64).logits == "tokens"
    # A tree with no setting named: the plain tree (the split) at head size 64, the FA3 tree default (the node
    # path, both bounds) at 128, where the harness's coupled_tree_head128 then checks the default; bitwise at both.
    plain = plan.server_bag("fa3", "coupled_tree", {}, 64)
    assert (plain.decode_attention, plain.tree_attention, plain.chain_at_batch) == ("split", "cascade", 0)
    assert plain.logits == "bitwise" and not plain.node_path_verifies
    default = plan.server_bag("fa3", "coupled_tree" + plan.WIDE_SUFFIX, {}, 128)
    assert (default.tree_attention, default.decode_attention, default.chain_at_batch, default.chain_at_tokens) == (
        "nodes", "sglang", 16, 12288)
    assert default.logits == "bitwise" and default.node_path_verifies
    cascade = {"SGLANG_DETSPEC_TREE_ATTENTION": "cascade", "SGLANG_DETSPEC_DECODE_ATTENTION": "sglang"}
    assert plan.server_bag("fa3", "coupled_tree", cascade, 128).logits == "tokens"
    assert plan.server_bag("triton", "no_spec", {}, 64).logits == "bitwise"
    with pytest.raises(ValueError, match="SGLANG_DETSPEC_TREE_ATTENTION"):
        plan.server_bag("fa3", "coupled_tree", {"SGLANG_DETSPEC_TREE_ATTENTION": "leaves"}, 64)


def test_prefix_verdict(mods):
    plan = mods.plan
    assert plan.prefix_logprob_verdict(f"x\n✓✓✓ {plan.PREFIX_LOGPROBS_SAME}! ✓✓✓\n") is True
    assert plan.prefix_logprob_verdict(f"✗✗✗ {plan.PREFIX_LOGPROBS_APART}! ✗✗✗") is False
    assert plan.prefix_logprob_verdict("Prompt 0 with prefix length 1: total samples: 3") is None
    with pytest.raises(ValueError, match="both"):
        plan.prefix_logprob_verdict(plan.PREFIX_LOGPROBS_SAME + plan.PREFIX_LOGPROBS_APART)


def test_the_seeded_prefix_draws_reach_every_prefix(mods):
    """Prefix mode draws ``random.randint(0, 3)`` per sample, batch sizes 1 .. n_trials, after the seed."""
    plan = mods.plan
    random.seed(plan.PREFIX_SEED)
    drawn = {random.randint(0, plan.PREFIX_PROMPTS - 1) for b in range(1, plan.TRIALS["prefix"] + 1) for _ in range(b)}
    assert drawn == set(range(plan.PREFIX_PROMPTS))


def test_the_tiny_tokenizer_holds_the_harness_prompts(mods, harness, tiny, tmp_path):
    from transformers import AutoTokenizer

    plan = mods.plan
    tiny.write_tokenizer(str(tmp_path), plan.VOCAB)
    tokenizer = AutoTokenizer.from_pretrained(str(tmp_path))
    assert len(tokenizer) == plan.VOCAB
    longest = len(tokenizer(harness.LONG_PROMPT[:plan.LONGEST_PROMPT_CHARS])["input_ids"])
    context = tiny.llama_config("LlamaForCausalLM", 2, plan.VOCAB)["max_position_embeddings"]
    assert 400 < longest and longest + plan.NEW_TOKENS <= context
    assert tiny.llama_config("LlamaForCausalLM", 2, plan.VOCAB)["vocab_size"] == plan.VOCAB
    assert plan.RADIX_MAX_TOKEN_ID < tiny.eagle3_draft_vocab(plan.VOCAB) < plan.VOCAB


def test_without_flag(mods):
    strip = mods.plan.without_flag
    assert strip(("--a", "1", "--b", "2", "--a", "3"), "--a") == ("--b", "2")
    assert strip(("--b", "2"), "--a") == ("--b", "2")
    with pytest.raises(ValueError, match="--a"):
        strip(("--b", "2", "--a"), "--a")


def test_server_configs(mods, tiny, tmp_path):
    e2e, plan = mods.e2e, mods.plan
    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text(json.dumps(tiny.llama_config("LlamaForCausalLM", 2, plan.VOCAB)))
    (target / "model.safetensors").write_bytes(b"weights")
    models = e2e.Models(str(target), *(f"/models/{f}" for f in ("eagle", "eagle_random", "mtp", "mtp", "eagle3",
                                                                 "eagle3_full", "mimo")), None)
    configs = mods.suite.server_configs(models, plan.BACKENDS)
    wide = {(plan.WIDE_HEAD_BACKEND, s + plan.WIDE_SUFFIX) for s in plan.WIDE_HEAD_SERVERS}
    assert set(configs) == {(b, s) for b in plan.BACKENDS for s in plan.SERVERS} | wide
    assert len({c.name for c in configs.values()}) == len(configs)
    for (backend, label), config in configs.items():
        flags = list(config.args)
        family = e2e.family(plan.base_label(label))
        assert plan.PREFILL_GRAPH_FLAG not in flags and "--skip-tokenizer-init" not in flags, config.name
        assert flags[len(flags) - 1 - flags[::-1].index("--attention-backend") + 1] == backend
        assert "--enable-deterministic-inference" in flags
        assert family.spec_args == tuple(flags[:len(family.spec_args)])
        assert config.model == (models.target if (backend, label) not in wide else str(target) + plan.WIDE_SUFFIX)
    # The wide-head target: the same files, its config read as 2 heads of 128; a second call reuses it.
    folder = target.parent / f"target{plan.WIDE_SUFFIX}"
    assert (folder / "model.safetensors").read_bytes() == b"weights"
    from sglang_detspec.model_family import head_dim_of

    assert head_dim_of(str(folder)) == plan.WIDE_HEAD_DIM and head_dim_of(str(target)) == 64
    assert mods.suite.wide_head_target(models) == str(folder)
    with pytest.raises(ValueError, match="hidden_size 512"):
        plan.wide_head_config({"hidden_size": 512})
    assert plan.base_label("coupled_chain" + plan.WIDE_SUFFIX) == "coupled_chain" == plan.base_label("coupled_chain")


@pytest.mark.parametrize("raw, fa3, want", [(None, True, ("triton", "fa3")), (None, False, ("triton",)),
                                            ("fa3", False, ("fa3",))])
def test_backend_selection(mods, raw, fa3, want):
    environ = {} if raw is None else {"DETSPEC_E2E_BACKENDS": raw}
    assert mods.plan.selected_backends(environ, lambda: fa3) == want


def test_flashinfer_is_refused_naming_the_variable(mods):
    with pytest.raises(ValueError, match="DETSPEC_E2E_BACKENDS.*allowed: triton, fa3,"):
        mods.plan.selected_backends({"DETSPEC_E2E_BACKENDS": "flashinfer"}, lambda: True)


def test_rows_and_failures(mods):
    plan = mods.plan
    outcome = plan.ModeOutcome
    rows = [
        plan.row("fa3", "no_spec", outcome("p_vs_d", (1,) * 7 + (0,) * 3), "bitwise", "harness_a.log"),
        plan.row("fa3", "coupled_tree", outcome("p_vs_d", (0,) * 10), "tokens", "harness_b.log"),
        plan.row("fa3", "coupled_tree", outcome("single", (1,)), "tokens", None),
        plan.row("triton", "no_spec", outcome("radix_cache", (), "ConnectionError: refused"), "bitwise", None),
    ]
    assert [r["passed"] for r in rows] == [False, False, True, False]
    assert [r["asserted"] for r in rows] == [True, False, True, True]
    lines = plan.failures(rows)
    assert len(lines) == 2 and lines[0].startswith("fa3 no_spec p_vs_d") and "ConnectionError" in lines[1]
    doc = plan.document(rows, "2026-12-03T00:00:00+00:00", "NVIDIA H200", passed=False)
    # The layout the issue fixes for sglang_harness.json.
    assert {"date_utc", "machine", "rows"} <= set(doc)
    assert all({"backend", "server", "mode", "results", "passed"} <= set(r) for r in doc["rows"])
    assert all(isinstance(x, int) for r in doc["rows"] for x in r["results"])
    with pytest.raises(ValueError, match="lacks"):
        plan.document([{"backend": "fa3"}], "d", "m")


def test_the_worker_records_each_mode_when_no_server_answers(mods, tmp_path):
    """The real harness against a port nothing listens on: every mode ends in an error row, none raises."""
    e2e = mods.e2e
    log = tmp_path / "harness.log"
    outcomes = mods.run.run_modes(f"http://127.0.0.1:{e2e.free_port()}", mods.plan.MODES, str(log))
    assert [o.mode for o in outcomes] == list(mods.plan.MODES)
    assert all(o.error and "Connection" in o.error and o.results == () for o in outcomes)
    text = log.read_text()
    assert all(f"===== {m}" in text for m in mods.plan.MODES)
    with pytest.raises(ValueError, match="url"):
        mods.run.run_modes("http://127.0.0.1", ("single",), str(log))
    with pytest.raises(ValueError, match="mode"):
        mods.run.run_modes("http://127.0.0.1:1", ("p_vs_p",), str(log))


def test_the_attention_scale_changes_only_the_targets_attention_output(tiny, tmp_path):
    """``--attention-scale`` multiplies the target's ``o_proj`` and draws every weight as the default does."""
    from safetensors.torch import load_file

    tiny.main(str(tmp_path / "default"), 64)
    tiny.main(str(tmp_path / "visible"), 64, tiny.ATTENTION_VISIBLE_SCALE)
    base = load_file(str(tmp_path / "default" / "target" / "model.safetensors"))
    seen = load_file(str(tmp_path / "visible" / "target" / "model.safetensors"))
    ratio = tiny.ATTENTION_VISIBLE_SCALE / tiny.TARGET_ATTENTION_SCALE
    assert base.keys() == seen.keys()
    for name in base:
        if name.endswith("self_attn.o_proj.weight"):
            torch.testing.assert_close(seen[name].float(), base[name].float() * ratio, rtol=1e-2, atol=0)
            assert not torch.equal(seen[name], base[name])
        else:
            assert torch.equal(seen[name], base[name]), name
    # The default set's target is the one the suites served before the option existed (generated at
    # 3b38bb2, vocabulary 64): the option drew no weight in another order.
    digest = hashlib.sha256()
    for name in sorted(base):
        digest.update(name.encode())
        digest.update(base[name].contiguous().view(torch.uint8).numpy().tobytes())
    assert digest.hexdigest() == "b7343816b25735cb90ea737615059ea3ea67e486baa9ed79dbfe87cc7e9d1d03"
    for draft in ("eagle", "eagle3"):  # the drafts are the same files
        a = load_file(str(tmp_path / "default" / draft / "model.safetensors"))
        b = load_file(str(tmp_path / "visible" / draft / "model.safetensors"))
        assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("scale", [0, -1.0, float("inf"), float("nan"), "8", True])
def test_a_bad_attention_scale_is_named(tiny, tmp_path, scale):
    with pytest.raises(ValueError, match="attention_scale must be a finite number > 0"):
        tiny.main(str(tmp_path), 64, scale)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
