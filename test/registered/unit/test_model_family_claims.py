"""The logits claim follows the target's family: MoE, MLA and FP8 targets claim 'tokens', not measured.

The family is read from the model's ``config.json`` (``model_family``); the
bags are built from SGLang's real resolved server arguments on the tiny
family models of ``scripts/tiny_families.py``, and the dry run reads the
same flags. The end-to-end plan's refusals (``_families_plan``) come from
SGLang's own argument resolution too.
"""

import dataclasses
import importlib.util
import json
import logging
import os
import re
import sys
from pathlib import Path

import pytest
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_detspec.config import DetSpecConfig, current_config, logits_guarantee, reset_config
from sglang_detspec.model_family import (DENSE, MEASURED_APART, MEASURED_BITWISE, ModelTraits, attention_head_dim,
                                         family_claim, family_evidence_note, family_note, head_dim_of, model_family,
                                         spelled, traits_of)
from sglang_detspec.sglang_plugin import resolve, startup_notes

register_cpu_ci(est_time=90, suite="detspec-unit-cpu")

ROOT = Path(__file__).resolve().parents[3]
CHAIN = "--speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    spec = importlib.util.spec_from_file_location("tiny_families", ROOT / "scripts" / "tiny_families.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path_factory.mktemp("families")
    module.main(str(out))
    return out


@pytest.mark.parametrize("config, label", [
    ({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2}, DENSE),
    ({"n_routed_experts": 8, "first_k_dense_replace": 1, "num_hidden_layers": 2, "kv_lora_rank": 512}, "mla+moe"),
    ({"n_routed_experts": 8, "first_k_dense_replace": 4, "num_hidden_layers": 2, "kv_lora_rank": None}, DENSE),
    ({"num_experts": 8, "num_hidden_layers": 2, "mlp_only_layers": [0, 1]}, DENSE),
    ({"num_local_experts": 8, "num_hidden_layers": 2}, "moe"),
    ({"num_experts": 1, "num_hidden_layers": 2}, DENSE),
    # Step3p5 with its MoE layers named past its depth (the project's tiny MTP model) is dense.
    ({"moe_num_experts": 2, "moe_layers_enum": "999", "num_hidden_layers": 45, "num_nextn_predict_layers": 2}, DENSE),
    ({"moe_num_experts": 2, "moe_layers_enum": "3,4", "num_hidden_layers": 45}, "moe"),
    ({"num_hidden_layers": 2, "quantization_config": {"quant_method": "FP8"}}, "fp8"),
    ({"text_config": {"num_experts": 4, "num_hidden_layers": 2}, "quantization_config": {"quant_method": "fp8"}},
     "moe+fp8"),
])
def test_traits_from_config(config, label):
    assert traits_of(config).label == label


def test_quantized_layouts_sglang_reads_count_as_quantized(tmp_path):
    # SGLang's ModelConfig._parse_quant_hf_config: a quantization_config without quant_method (ModelOpt), a
    # compression_config (compressed-tensors), or an hf_quant_config.json beside config.json.
    moe = {"num_experts": 8, "num_hidden_layers": 2}
    assert traits_of({**moe, "quantization_config": {"quant_algo": "FP8", "producer": {"name": "modelopt"}}}).label \
        == "moe+fp8"
    assert traits_of({**moe, "quantization_config": {"producer": {"name": "modelopt"}}}).label == "moe+quantized"
    assert traits_of({**moe, "compression_config": {"format": "float-quantized"}}).label == "moe+compressed-tensors"
    folder = tmp_path / "modelopt"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(moe))
    assert model_family(str(folder)) == "moe"
    (folder / "hf_quant_config.json").write_text(json.dumps({"quantization": {"quant_algo": "NVFP4"}}))
    assert model_family(str(folder)) == "moe+nvfp4"
    (folder / "hf_quant_config.json").write_text("not json")
    assert model_family(str(folder)) == "moe+quantized"
    assert model_family(str(folder), "fp8") == "moe+fp8"  # the flag wins, as SGLang's --quantization does
    # None of them takes the fused-MoE tile.
    for label in ("moe+fp8", "moe+quantized", "moe+compressed-tensors", "moe+nvfp4"):
        assert not DetSpecConfig(deterministic=True, model_family=label).takes_moe_tile


def test_the_quantization_flag_counts_and_bad_configs_are_refused():
    assert traits_of({"num_hidden_layers": 2}, "fp8").label == "fp8"
    assert ModelTraits(moe=True, mla=True, quantization="fp8").label == "mla+moe+fp8"
    with pytest.raises(ValueError, match="config must be a mapping"):
        traits_of(["not", "a", "dict"])


# The tiny family whose label each measured entry names (scripts/tiny_families.py writes them).
LABEL_OF_FAMILY = {"deepseek_v3": "mla+moe", "deepseek_v3_fp8": "mla+moe+fp8", "qwen3_moe": "moe"}


def test_unmeasured_families_claim_tokens_and_say_so():
    for backend in ("triton", "fa3"):
        assert family_claim(DENSE, "bitwise", backend) == family_claim(None, "bitwise", backend) == "bitwise"
        assert family_claim("moe+fp8", "bitwise", backend) == "tokens"
        assert family_claim("moe", "tokens", backend) == family_claim("mla+moe", "tokens", backend) == "tokens"
        assert "not measured" in family_note("moe+fp8", backend)
        assert family_claim("moe", "bitwise", backend) == "bitwise" and family_note("moe", backend) is None
    assert "flashinfer" in family_note("moe", "flashinfer") and family_claim("moe", "bitwise", "flashinfer") == "tokens"
    assert "not measured" in family_note("moe", "fa4")
    # MLA: promoted on triton (the one-pass decode with the causal chain verify), measured apart on fa3.
    assert family_claim("mla+moe", "bitwise", "triton") == "bitwise" and family_note("mla+moe", "triton") is None
    assert family_claim("mla+moe", "bitwise", "fa3") == "tokens" and "its tree" in family_note("mla+moe", "fa3")
    # Its FP8 copy: promoted on triton (the same paths), measured apart on fa3 (MLA's prefill against decode unrun).
    assert family_claim("mla+moe+fp8", "bitwise", "triton") == "bitwise" and family_note("mla+moe+fp8", "triton") is None
    assert family_claim("mla+moe+fp8", "bitwise", "fa3") == "tokens" and "prefill against decode" in family_note(
        "mla+moe+fp8", "fa3")
    assert family_note(DENSE, "fa3") is None and family_note(None, "fa3") is None
    chain = dict(deterministic=True, algorithm="EAGLE", eagle_topk=1, attention_backend="fa3")
    assert DetSpecConfig(**chain).logits == DetSpecConfig(**chain, model_family=DENSE).logits == "bitwise"
    bag = DetSpecConfig(**chain, model_family="moe+fp8")
    assert bag.logits == "tokens" and "logits='tokens'" in bag.describe() and "model_family='moe+fp8'" in bag.describe()


@pytest.mark.parametrize("family, backend", sorted(MEASURED_BITWISE))
def test_a_promoted_family_at_pages_above_one_token_claims_tokens(family, backend):
    # Every family run used pages of one token: the attention rule's page limit holds for them too.
    chain = dict(deterministic=True, algorithm="EAGLE", eagle_topk=1, attention_backend=backend, model_family=family)
    assert DetSpecConfig(**chain, page_size=1).logits == "bitwise"
    paged = DetSpecConfig(**chain, page_size=16)
    assert paged.logits == "tokens" and "KV page size of 16" in paged.logits_reason


def test_family_notes_say_what_was_measured():
    # A promoted family's note names its run and what the run does not cover.
    for (family, backend), run in MEASURED_BITWISE.items():
        note = family_evidence_note(family, backend)
        assert run in note and "not at all" in note
    assert family_evidence_note("moe", "flashinfer") is None and family_evidence_note("mla+moe", "fa3") is None
    # A family measured apart says what was found; without a backend the note names where it was measured.
    assert "its tree verified as a tree did not" in family_note("mla+moe", "fa3")
    assert "not measured" not in family_note("mla+moe", "fa3")
    assert "until the backend is known (a run measured this family bitwise on fa3" in family_note("moe", None)
    assert "until the backend is known (a run measured this family bitwise on triton" in family_note("mla+moe+fp8",
                                                                                                     None)
    assert "until the backend is known (a run measured this family bitwise on triton" in family_note("mla+moe", None)
    assert "not measured" in family_note("moe+fp8", None) and "a run measured" not in family_note("moe+fp8", None)
    # The label is spelled out, trait by trait.
    assert spelled("mla+moe+fp8") == "multi-head latent attention, mixture-of-experts layers, fp8 weights"
    assert "the target is moe+fp8 (mixture-of-experts layers, fp8 weights):" in family_note("moe+fp8", "fa3")


@pytest.mark.parametrize("entry", sorted(MEASURED_BITWISE))
def test_a_measured_family_has_a_committed_run_with_no_logprob_apart(entry):
    """Each promotion names a committed run in which every row of that family passed, its logprob rows 0 apart,
    on servers whose plugin line names that backend."""
    label, backend = entry
    run = ROOT / MEASURED_BITWISE[entry] / "test_model_families"
    # A run on SGLang's own choice writes the _auto file, one with the backend named the backend's (the named one
    # is read where a run wrote both).
    found = next(f for f in (run / f"model_families_{backend}.json", run / "model_families_auto.json") if f.exists())
    case = found.stem.rsplit("_", 1)[-1]
    record = json.loads(found.read_text())
    rows = [r for r in record["rows"] if LABEL_OF_FAMILY[r["family"]] == label]
    checks = {(r["speculative"], r["check"]) for r in rows}
    assert {("chain", "logprobs"), ("tree", "logprobs"), ("tree", "radix_cache"), ("chain_retract", "retraction")} <= checks
    assert all(r["passed"] and r["differing_sequences"] == 0 and r.get("other_logprobs", 0) == 0 for r in rows)
    family = next(r["family"] for r in rows)
    server = re.compile(rf"server_test_model_families-{family}_(none|chain|tree|chain_retract)_{case}_.*\.log")
    logs = [log for log in run.iterdir() if server.fullmatch(log.name)]
    assert len(logs) == 4, logs
    assert all(f"attention_backend='{backend}'" in log.read_text() for log in logs)


def test_every_measured_entry_names_a_committed_run():
    for text in (*MEASURED_BITWISE.values(), *MEASURED_APART.values()):
        runs = re.findall(r"docs/e2e/[\w.-]+(?:/[\w.-]+)?", text)
        assert runs, text
        assert all((ROOT / run).is_dir() for run in runs), runs


def test_model_family_reads_the_folder_and_tolerates_what_it_cannot_read(tiny, tmp_path):
    assert model_family(str(tiny / "deepseek_v3")) == "mla+moe"
    assert model_family(str(tiny / "deepseek_v3_fp8")) == "mla+moe+fp8"
    assert model_family(str(tiny / "qwen3_moe")) == "moe"
    assert model_family(str(tiny / "qwen3_moe"), "fp8") == "moe+fp8"
    assert model_family(None) is None and model_family(str(tmp_path / "absent")) is None
    (tmp_path / "config.json").write_text("{not json")
    assert model_family(str(tmp_path)) is None


def test_the_head_size_follows_the_config_and_mla_has_none(tiny, tmp_path):
    assert attention_head_dim({"hidden_size": 256, "num_attention_heads": 4}) == 64
    assert attention_head_dim({"hidden_size": 256, "num_attention_heads": 4, "head_dim": 96}) == 96
    assert attention_head_dim({"text_config": {"hidden_size": 4096, "num_attention_heads": 32}}) == 128
    assert attention_head_dim({"hidden_size": 256}) is None
    assert head_dim_of(str(tiny / "deepseek_v3")) is None  # MLA: kv_lora_rank
    assert head_dim_of(str(tiny / "qwen3_moe")) == json.loads((tiny / "qwen3_moe" / "config.json").read_text())[
        "head_dim"]
    assert head_dim_of(None) is None and head_dim_of(str(tmp_path / "absent")) is None


def _server_args(model, flags):
    import argparse

    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    sa = ServerArgs.from_cli_args(parser.parse_args(["--model-path", str(model), "--device", "cuda",
                                                     "--enable-deterministic-inference", *flags.split()]))
    sa.resolve_once()
    return sa


@pytest.mark.parametrize("folder, draft, algorithm, family", [
    ("deepseek_v3", "deepseek_v3", "NEXTN", "mla+moe"),
    ("deepseek_v3_fp8", "deepseek_v3_fp8", "NEXTN", "mla+moe+fp8"),
    ("qwen3_moe", "qwen3_moe_eagle3", "EAGLE3", "moe"),
])
@pytest.mark.parametrize("backend", [None, "triton", "fa3"])
def test_start_up_claims_tokens_for_the_family_targets(tiny, folder, draft, algorithm, family, backend):
    reset_config()
    flags = f"--speculative-algorithm {algorithm} --speculative-draft-model-path {tiny / draft} {CHAIN}"
    bag = resolve.config_from_server_args(_server_args(tiny / folder, flags + (f" --attention-backend {backend}"
                                                                                if backend else "")))
    # The same flags on the dense Llama would claim bitwise on both backends (chain, pages of one token).
    assert bag.active and bag.model_family == family and bag.attention_backend in ("triton", "fa3")
    assert logits_guarantee(bag.attention_backend, 1) == "bitwise"
    if (family, bag.attention_backend) in MEASURED_BITWISE:  # a run recorded it: the family's claim is the attention's
        assert bag.logits == "bitwise" and not any("not measured" in n for n in startup_notes.setting_notes(bag))
        # An MLA target's attention note names the path that serves it; no dense split note speaks for it.
        notes = startup_notes.unmeasured_notes(bag)
        assert any("MLA attention" in n for n in notes) == ("mla" in family.split("+"))
        assert not ("mla" in family.split("+") and any("DECODE_ATTENTION=split (the default" in n for n in notes))
        reset_config()
        return
    assert bag.logits == "tokens"
    # The family note says what a run measured of it on this backend, or that none did.
    apart = MEASURED_APART.get((family, bag.attention_backend))
    assert any(("not measured" in note) if apart is None else (apart in note)
               for note in startup_notes.setting_notes(bag))
    # No note speaks of the split's claims ('bitwise', fallbacks) for a target whose claim is the family's.
    notes = startup_notes.unmeasured_notes(bag)
    assert not any("DECODE_ATTENTION=split" in n or "bitwise" in n for n in notes)
    attention = [n for n in notes if "this target's attention" in n or "MLA attention" in n]
    assert len(attention) == 1
    assert ("MLA attention" in attention[0]) == ("mla" in family.split("+"))
    reset_config()


@pytest.mark.parametrize("runner, claim", [(None, "bitwise"), ("triton", "bitwise"), ("flashinfer_cutlass", "tokens"),
                                           ("deep_gemm", "tokens")])
def test_a_moe_runner_no_run_used_makes_the_family_claim_tokens_through_sglangs_resolution(tiny, runner, claim):
    """SGLang's --moe-runner-backend as its resolved view gives it: the runs used its Triton runner (auto on the
    Hopper GPUs measured); another runner is another kernel, so the claim falls to 'tokens', the note says which
    runner, and neither the plugin's tile nor the tables' check serves it."""
    reset_config()
    flags = (f"--speculative-algorithm EAGLE3 --speculative-draft-model-path {tiny / 'qwen3_moe_eagle3'} {CHAIN} "
             "--attention-backend fa3" + (f" --moe-runner-backend {runner}" if runner else ""))
    bag = resolve.config_from_server_args(_server_args(tiny / "qwen3_moe", flags))
    assert bag.model_family == "moe" and bag.moe_runner == (runner or "auto") and bag.logits == claim
    notes = startup_notes.setting_notes(bag)
    said = [n for n in notes if "--moe-runner-backend" in n and "runs its expert layers" in n]
    assert bool(said) == (claim == "tokens")
    assert ("moe_runner=" in bag.describe()) == (claim == "tokens")
    assert bag.takes_moe_tile == (claim == "bitwise")
    evidence = [n for n in notes if n.startswith("the target is moe") and "measured on the tiny" in n]
    assert len(evidence) == (claim == "bitwise")
    if claim == "tokens":
        assert f"--moe-runner-backend {runner}" in said[0]
        # The attention path's note gives the runner as the reason, not an unmeasured family.
        attention = [n for n in startup_notes.unmeasured_notes(bag) if "this target's attention" in n]
        assert attention and all(f"stays 'tokens' while --moe-runner-backend {runner} serves its expert layers" in n
                                 for n in attention)
        tile = startup_notes.moe_tile_note(bag)
        assert f"run on --moe-runner-backend {runner}, whose kernels read no fused-MoE Triton tile" in tile
        checked = dataclasses.replace(bag, moe_tables="checked")
        assert f"--moe-runner-backend {runner} runs its expert layers" in startup_notes.moe_tables_note(checked)
    reset_config()


@pytest.mark.parametrize("a2a, claim", [(None, "bitwise"), ("none", "bitwise"), ("deepep", "tokens"),
                                        ("megamoe", "tokens")])
def test_an_all_to_all_backend_moves_the_experts_and_the_claim_falls_to_tokens(a2a, claim):
    # SGLang sends FP8 experts to DeepGEMM under an all-to-all backend (megamoe among them) with the runner
    # still auto: another path than the runs used.
    bag = DetSpecConfig(deterministic=True, algorithm="EAGLE", eagle_topk=1, num_steps=3, num_draft_tokens=4,
                        attention_backend="triton", model_family="mla+moe+fp8", moe_runner="auto", moe_a2a=a2a,
                        source="server_args")
    assert bag.logits == claim and ("moe_a2a=" in bag.describe()) == (claim == "tokens")
    if claim == "tokens":
        assert any(f"--moe-a2a-backend {a2a} runs its expert layers" in n for n in startup_notes.setting_notes(bag))
    dense = dataclasses.replace(bag, model_family=DENSE, attention_backend="fa3")
    assert "moe_a2a" not in dense.describe() and "moe_runner" not in dense.describe()


# An unmeasured family on every backend (moe alone is measured on fa3: MEASURED_BITWISE).
MOE_CHAIN = dict(deterministic=True, algorithm="EAGLE", eagle_topk=1, num_draft_tokens=4, model_family="moe+fp8")


@pytest.mark.parametrize("settings, path", [
    (dict(attention_backend="triton", head_dim=64), "positional-split Triton kernels"),
    (dict(attention_backend="fa3", head_dim=64), "FA3 prefix / tail split"),
    (dict(attention_backend="fa3", head_dim=128), "SGLang's own FA3 calls"),
    (dict(attention_backend="fa3", head_dim=128, eagle_topk=4, num_draft_tokens=8), "FA3 prefix / tail split"),
    (dict(attention_backend="flashinfer", head_dim=128), None),
    (dict(attention_backend="fa3", head_dim=64, decode_attention="sglang"), None),
    (dict(attention_backend="triton", head_dim=64, kv_cache_dtype="fp8_e4m3"), None),
    (dict(attention_backend="fa3", head_dim=64, page_size=16), None),
    (dict(attention_backend=None, head_dim=64), None),
    (dict(attention_backend="flashinfer", head_dim=None, model_family="mla+moe"), "MLA attention"),
])
def test_an_unmeasured_familys_attention_note_names_the_path_that_serves(settings, path):
    bag = DetSpecConfig(**{**MOE_CHAIN, **settings})
    notes = [n for n in startup_notes.unmeasured_notes(bag) if "this target's attention" in n or "MLA attention" in n]
    assert notes == [] if path is None else (len(notes) == 1 and path in notes[0]), notes
    assert not any("bitwise" in n for n in startup_notes.unmeasured_notes(bag))


@pytest.mark.parametrize("backend, decode, one_pass, own_calls", [
    ("triton", "split", True, False), ("triton", "one_pass", True, False), ("triton", "sglang", False, True),
    ("fa3", "split", False, True), ("flashinfer", "split", False, True), ("fa4", "split", False, True),
    (None, "split", True, True), (None, "sglang", False, True),
])
def test_the_mla_note_names_the_path_that_serves_its_attention(backend, decode, one_pass, own_calls):
    # attention_hook._mla_one_pass: on triton the decode joins SGLang's absorbed extend kernel unless turned off;
    # without a backend named the note gives both of SGLang's picks.
    bag = DetSpecConfig(**{**MOE_CHAIN, "attention_backend": backend, "head_dim": None, "model_family": "mla+moe",
                           "decode_attention": decode})
    (note,) = [n for n in startup_notes.unmeasured_notes(bag) if "MLA attention" in n]
    assert ("the single-pass kernel" in note) is one_pass
    # A speculative server's target never decodes: the decode kernel's cost is said only without a draft.
    assert "per layer call" not in note and ("verifies, never decodes" in note) is one_pass
    plain = dataclasses.replace(bag, algorithm=None, num_steps=None, eagle_topk=None, num_draft_tokens=None)
    (plain_note,) = [n for n in startup_notes.unmeasured_notes(plain) if "MLA attention" in n]
    assert ("the target's decode runs the single-pass kernel" in plain_note) is one_pass
    assert ("per layer call" in plain_note) is one_pass
    assert ("SGLang's own attention calls run" in note) is own_calls
    # SGLang's split-KV decode is named only where it is what serves (triton with the setting sglang).
    assert ("its split-KV decode kernel" in note) is (backend == "triton" and decode == "sglang")
    # The config line shows decode_attention='split' on triton and without a backend: the note says what it runs as.
    assert ("decode_attention='split' above runs as 'one_pass'" in note) is (one_pass and decode == "split")
    assert "bitwise" not in note


@pytest.mark.parametrize("settings, told", [(dict(attention_backend="triton", decode_attention="sglang"), True),
                                             (dict(attention_backend="fa3", page_size=16), False)])
def test_an_mla_target_is_told_an_attention_setting_lowers_its_claim_where_its_family_was_promoted(settings, told):
    # Unpromoted (fa3), the attention rule's reason blames a setting that does not act on MLA attention; promoted
    # (triton: SGLang's split-KV decode comes back with decode_attention='sglang') the reason is the true one.
    mla = DetSpecConfig(**{**MOE_CHAIN, "head_dim": None, "model_family": "mla+moe", **settings})
    assert mla.logits == "tokens" and mla.logits_reason
    assert any(n.startswith("logits='tokens' because of") for n in startup_notes.setting_notes(mla)) is told
    dense = dataclasses.replace(mla, model_family=None, head_dim=64)
    assert any(n.startswith("logits='tokens' because of") for n in startup_notes.setting_notes(dense))


def test_rejection_mode_says_its_tokens_follow_the_draft():
    # The logits claim would otherwise read as "the tokens of no speculative decoding", which rejection mode is not.
    rejection = DetSpecConfig(deterministic=True, algorithm="EAGLE", eagle_topk=1, num_steps=3, num_draft_tokens=4,
                              rejection_sampling=True, verify="rejection", attention_backend="fa3")
    assert rejection.active and rejection.verify == "rejection"
    assert startup_notes.REJECTION_MODE_NOTE in startup_notes.setting_notes(rejection)
    coupled = dataclasses.replace(rejection, verify="coupled")
    assert coupled.active and startup_notes.REJECTION_MODE_NOTE not in startup_notes.setting_notes(coupled)


def test_the_dense_target_keeps_its_measured_claim(tiny):
    target = tiny / "dense"
    target.mkdir()
    (target / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
        "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 2, "vocab_size": 1000,
        "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "torch_dtype": "float16"}))
    reset_config()
    bag = resolve.config_from_server_args(_server_args(
        target, f"--speculative-algorithm EAGLE --speculative-draft-model-path {target} {CHAIN} --attention-backend triton"))
    assert (bag.model_family, bag.logits) == (DENSE, "bitwise") and startup_notes.setting_notes(bag) == []
    reset_config()


TREE = "--speculative-num-steps 3 --speculative-eagle-topk 4 --speculative-num-draft-tokens 8"
MLA_CHAIN_LINE = startup_notes.MLA_CHAIN_LOG


def _resolved_fields(server_args) -> dict:
    from sglang.srt.arg_groups.arg_utils import field_names
    from sglang.srt.arg_groups.overrides import resolved_view

    view = resolved_view(server_args)
    return {name: getattr(view, name) for name in field_names(type(server_args))}


@pytest.mark.parametrize("backend, extra", [(None, ""), ("triton", ""), ("fa3", ""),
                                            ("fa3", "--speculative-adaptive"), ("triton", "--page-size 16"),
                                            ("fa3", "--speculative-algorithm STANDALONE")])
def test_start_up_serves_an_mla_targets_tree_as_the_chain_server(tiny, backend, extra, caplog):
    from sglang.srt.arg_groups.overrides import resolved_view
    from sglang.srt.plugins import load_plugins

    load_plugins()  # SGLang's own loader: the start-up hooks run inside its resolution below
    model = tiny / "deepseek_v3"
    flags = f"--random-seed 1 --speculative-algorithm NEXTN --speculative-draft-model-path {model} {extra}" + (
        f" --attention-backend {backend}" if backend else "")
    reset_config()
    with caplog.at_level(logging.INFO, logger="sglang_detspec"):
        tree_args = _server_args(model, f"{flags} {TREE}")
    served = current_config()
    view = resolved_view(tree_args)
    # SGLang resolved the chain of the tree's depth, so its workers size a chain's KV reserve and capture chain graphs.
    assert (view.speculative_eagle_topk, view.speculative_num_steps, view.speculative_num_draft_tokens) == (1, 3, 4)
    assert served.active and not served.verifies_trees and not served.switches_shape
    lines = [r.getMessage() for r in caplog.records if MLA_CHAIN_LINE in r.getMessage()]
    assert len(lines) == 1 and "(top-k 4, 8 draft tokens)" in lines[0]
    # ... the very server the chain's own flags start (a scheduler process resolves the same from this record).
    reset_config()
    assert resolve.config_from_server_args(tree_args) == served
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="sglang_detspec"):
        chain_args = _server_args(model, f"{flags} {CHAIN}")
    assert current_config() == served == resolve.config_from_server_args(chain_args)
    assert not any(MLA_CHAIN_LINE in r.getMessage() for r in caplog.records)
    # SGLang resolved every server argument as for the chain's own flags (adaptive steps, budgets, pages).
    tree_fields, chain_fields = _resolved_fields(tree_args), _resolved_fields(chain_args)
    assert {k: v for k, v in tree_fields.items() if chain_fields[k] != v} == {}
    reset_config()


def test_an_mla_tree_typed_without_its_steps_stops_with_the_plugins_message(tiny):
    from sglang.srt.plugins import load_plugins

    load_plugins()
    model = tiny / "deepseek_v3"
    with pytest.raises(ValueError, match=r"without --speculative-num-steps.*\[refusal: draft_shape\]"):
        _server_args(model, f"--speculative-algorithm NEXTN --speculative-draft-model-path {model} "
                            "--speculative-eagle-topk 4 --speculative-num-draft-tokens 8 --attention-backend fa3")
    reset_config()


def _sglang_outcome(model, flags, monkeypatch, plugin: bool) -> str:
    """What SGLang's real resolution of ``flags`` gives: ``ok topk,steps,tokens``, ``refused`` (the plugin's
    draft-shape refusal) or ``stopped`` (any other exception), with the plugin active or turned off."""
    from sglang.srt.arg_groups.overrides import resolved_view

    if plugin:
        monkeypatch.delenv("SGLANG_DETSPEC_DISABLE", raising=False)
    else:
        monkeypatch.setenv("SGLANG_DETSPEC_DISABLE", "1")
    reset_config()
    try:
        view = resolved_view(_server_args(model, flags))
    except ValueError as exc:
        return "refused" if "[refusal: draft_shape]" in str(exc) else "sglang refuses"
    except (AssertionError, TypeError):  # SGLang's bare assertion or TypeError
        return "stopped"
    finally:
        reset_config()
    return f"ok {view.speculative_eagle_topk},{view.speculative_num_steps},{view.speculative_num_draft_tokens}"


@pytest.mark.parametrize("folder, algorithm, draft", [("qwen3_moe", "EAGLE3", "qwen3_moe_eagle3"),
                                                      ("deepseek_v3", "NEXTN", "deepseek_v3")])
def test_the_draft_shape_refusal_is_exactly_what_sglang_cannot_serve(tiny, folder, algorithm, draft, monkeypatch):
    import itertools

    from sglang.srt.plugins import load_plugins

    load_plugins()
    monkeypatch.delenv("SGLANG_PLUGINS", raising=False)
    model = tiny / folder
    base = (f"--speculative-algorithm {algorithm} --speculative-draft-model-path {tiny / draft} "
            "--attention-backend triton")
    mla = folder == "deepseek_v3"
    for adaptive, steps, topk, tokens in itertools.product(("", " --speculative-adaptive"), (None, 3), (None, 1, 4),
                                                           (None, 4, 8)):
        flags = base + adaptive + "".join(f" --speculative-{name} {value}" for name, value in (
            ("num-steps", steps), ("eagle-topk", topk), ("num-draft-tokens", tokens)) if value is not None)
        alone, served = (_sglang_outcome(model, flags, monkeypatch, plugin) for plugin in (False, True))
        tree_without_count = alone == "ok 4,3,None"
        if alone == "stopped" or (tree_without_count and not mla):
            # SGLang alone stops without a message, or resolves a tree it cannot size: the plugin refuses first.
            assert served == "refused", (flags, alone, served)
        elif tree_without_count:
            assert served == "ok 1,3,4", (flags, alone, served)  # an MLA tree served as the chain of its depth
        elif alone.startswith("ok"):
            assert served.startswith("ok"), (flags, alone, served)
        else:  # SGLang's own refusal, with its message: the plugin adds none of its own
            assert served != "refused", (flags, alone, served)


@pytest.mark.parametrize("extra", ["--tp-size 2 --attn-dp-size 2 --speculative-num-steps 3",
                                   "--enable-two-batch-overlap --speculative-eagle-topk 1"])
def test_a_partial_shape_where_sglang_turns_adaptive_off_is_refused(tiny, extra, monkeypatch):
    from sglang.srt.plugins import load_plugins

    load_plugins()
    monkeypatch.delenv("SGLANG_PLUGINS", raising=False)
    flags = (f"--speculative-algorithm EAGLE3 --speculative-draft-model-path {tiny / 'qwen3_moe_eagle3'} "
             f"--attention-backend triton --speculative-adaptive {extra}")
    # SGLang turns adaptive off for these layouts and then stops without a message; the plugin refuses first.
    assert _sglang_outcome(tiny / "qwen3_moe", flags, monkeypatch, plugin=False) == "stopped"
    assert _sglang_outcome(tiny / "qwen3_moe", flags, monkeypatch, plugin=True) == "refused"


def _dry_run_nextn(model, shape: str, capsys, monkeypatch) -> tuple[str, str]:
    """``detspec serve --dry-run`` of a NEXTN server of ``model`` on fa3 drafting ``shape``: (its stderr, the
    "flags check passed" line)."""
    from sglang_detspec.cli.main import main

    for name in ("SGLANG_PLUGINS", "SGLANG_DETSPEC_DISABLE"):
        monkeypatch.delenv(name, raising=False)
    assert main(["serve", "--dry-run", "--verbose", "--", "--model-path", str(model), "--device", "cuda",
                 "--speculative-algorithm", "NEXTN", "--speculative-draft-model-path", str(model), *shape.split(),
                 "--attention-backend", "fa3"]) == 0
    err = capsys.readouterr().err
    (passed,) = [line for line in err.splitlines() if "flags check passed" in line]
    return err, passed


def test_the_dry_run_shows_an_mla_targets_tree_as_its_chain(tiny, capsys, monkeypatch):
    err, passed = _dry_run_nextn(tiny / "deepseek_v3", TREE, capsys, monkeypatch)
    (line,) = [line for line in err.splitlines() if MLA_CHAIN_LINE in line]
    assert "the command below keeps the flags as typed" in line
    assert "FP8 weights" not in err  # bf16 weights
    assert "eagle_topk=1" in passed and "num_draft_tokens=4" in passed and "model_family='mla+moe'" in passed
    # The same claim line as the chain's own flags.
    assert _dry_run_nextn(tiny / "deepseek_v3", CHAIN, capsys, monkeypatch)[1] == passed
    reset_config()


def test_the_dry_run_with_the_shape_unset_states_the_shape_sglang_picks(tiny, capsys, monkeypatch):
    # SGLang's own resolution picks the chain (3, 1, 4) for a DeepSeek-V3 target: the note states it and its claim.
    err, passed = _dry_run_nextn(tiny / "deepseek_v3", "", capsys, monkeypatch)
    assert "logits='tokens'" in passed and "the logits claim above assumes a chain" not in err
    (note,) = [line for line in err.splitlines() if "SGLang resolves these flags to" in line]
    assert "--speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4" in note
    # The line describes the chain SGLang resolved, its sampled drafts turned on as start-up does.
    assert "eagle_topk=1" in passed and "num_draft_tokens=4" in passed and "rejection_sampling=True" in passed
    reset_config()


def test_the_dry_run_states_sglangs_own_refusal_of_the_flags(tiny, capsys, monkeypatch, tmp_path):
    from sglang_detspec.cli.main import main
    from sglang_detspec.cli.serve import read_launch_args
    from sglang_detspec.sglang_plugin.resolve import sglang_resolution

    def sglang_resolution_refusal(launch):
        return sglang_resolution(read_launch_args(launch))[0]

    for name in ("SGLANG_PLUGINS", "SGLANG_DETSPEC_DISABLE"):
        monkeypatch.delenv(name, raising=False)
    model = str(tiny / "deepseek_v3")
    flags = ["--model-path", model, "--speculative-algorithm", "NEXTN", "--enable-deterministic-inference"]
    # SGLang's own rule for absorbed-MLA targets, which its backend list alone does not show.
    refusal = sglang_resolution_refusal([*flags, "--attention-backend", "flashinfer"])
    assert "absorbed-MLA" in refusal and "flashinfer" in refusal
    assert sglang_resolution_refusal([*flags, "--attention-backend", "fa3"]) is None
    with pytest.raises(LookupError, match="not a local folder"):
        sglang_resolution_refusal(["--model-path", "org/model", "--speculative-algorithm", "NEXTN"])
    with pytest.raises(LookupError, match="--speculative-draft-model-path org/draft is not a local folder"):
        sglang_resolution_refusal([*flags, "--speculative-draft-model-path", "org/draft"])
    # SGLang's resolution sets environment variables; the caller's environment comes back as it was.
    monkeypatch.delenv("SGLANG_ENABLE_DETERMINISTIC_INFERENCE", raising=False)
    before = dict(os.environ)
    assert sglang_resolution_refusal([*flags, "--attention-backend", "triton"]) is None
    assert dict(os.environ) == before
    # A --config file is merged in as SGLang's launch_server does.
    config = tmp_path / "server.yaml"
    config.write_text(f"model-path: {model}\nspeculative-algorithm: NEXTN\nattention-backend: flashinfer\n")
    reset_config()
    assert main(["serve", "--dry-run", "--verbose", "--", "--config", str(config)]) == 2
    assert "absorbed-MLA" in capsys.readouterr().err
    for backend, refused in (("flashinfer", True), ("triton", False)):
        reset_config()
        rc = main(["serve", "--dry-run", "--verbose", "--", "--model-path", model, "--speculative-algorithm", "NEXTN",
                   "--attention-backend", backend])
        err = capsys.readouterr().err
        assert rc == (2 if refused else 0)
        assert ("SGLang's own argument resolution, run here as on a CUDA device, refuses" in err) is refused
        assert ("absorbed-MLA" in err) is refused and ("flags check passed" in err) is not refused
        # FlashInfer's refusal reads no GPU: nothing on the server's GPU can lift it.
        assert "reads the GPU" not in err
    # fa4's refusal for an absorbed-MLA target reads the GPU (SM100 / SM110): the message says so, also with the
    # decode backend named apart.
    for extra in ([], ["--decode-attention-backend", "triton"]):
        reset_config()
        rc = main(["serve", "--dry-run", "--verbose", "--", "--model-path", model, "--speculative-algorithm", "NEXTN",
                   "--attention-backend", "fa4", *extra])
        err = capsys.readouterr().err
        assert rc == 2 and "only a rule that reads the GPU" in err, err[-400:]
    reset_config()


def test_the_dry_run_says_sglang_serves_nextn_as_eagle_where_it_fills_the_shape(tiny, capsys, monkeypatch):
    # The shape flags unset: the line describes the server SGLang's resolution gives, which names NEXTN EAGLE.
    err, passed = _dry_run_nextn(tiny / "deepseek_v3", "", capsys, monkeypatch)
    (note,) = [line for line in err.splitlines() if "the line below describes that server" in line]
    assert "SGLang serves --speculative-algorithm NEXTN as EAGLE" in note and "algorithm='EAGLE'" in passed
    reset_config()
    # The shape typed: the line keeps the flags, and the note says what the server's line will name.
    err, passed = _dry_run_nextn(tiny / "deepseek_v3", CHAIN, capsys, monkeypatch)
    (note,) = [line for line in err.splitlines() if "SGLang serves --speculative-algorithm NEXTN as EAGLE" in line]
    assert "the line below names the algorithm as typed" in note and "algorithm='NEXTN'" in passed
    reset_config()


def test_the_dry_run_claims_tokens_and_says_what_was_measured(tiny, capsys, monkeypatch):
    err, passed = _dry_run_nextn(tiny / "deepseek_v3_fp8", CHAIN, capsys, monkeypatch)
    assert "logits='tokens'" in passed and "model_family='mla+moe+fp8'" in passed
    assert MLA_CHAIN_LINE not in err
    assert "FP8 weights: block-quantized ones (DeepSeek-V3's format) go through DeepGEMM" in err
    assert " ".join(MEASURED_APART[("mla+moe+fp8", "fa3")].split()) in " ".join(err.split())
    reset_config()


def test_the_e2e_plan_records_what_sglang_refuses(tiny):
    sys.path.insert(0, str(ROOT / "test" / "registered" / "e2e"))
    try:
        import _families_plan as plan
    finally:
        sys.path.pop(0)
    deepseek = plan.FAMILIES["deepseek_v3"]
    refusals = {backend: plan.sglang_refusal(str(tiny / deepseek.folder),
                                             plan.server_flags(deepseek, "chain", backend, str(tiny)))
                for backend in plan.KNOWN_BACKENDS}
    # Deterministic inference on absorbed-MLA models: SGLang keeps only its radix-cache backends.
    assert "absorbed-MLA" in refusals["flashinfer"]
    assert [b for b, r in refusals.items() if r is None] == ["auto", "triton", "fa3"]
    qwen = plan.FAMILIES["qwen3_moe"]
    assert plan.sglang_refusal(str(tiny / qwen.folder), plan.server_flags(qwen, "tree", "flashinfer", str(tiny))) is None
    flags = plan.server_flags(qwen, "none", "auto", str(tiny))
    assert "--attention-backend" not in flags and "--speculative-algorithm" not in flags
    assert plan.selected_backends({}) == plan.KNOWN_BACKENDS
    assert plan.selected_backends({plan.BACKENDS_ENV: "fa3, auto"}) == ("fa3", "auto")
    for raw, match in (("fa2", "unknown backends"), ("fa3,fa3", "twice")):
        with pytest.raises(ValueError, match=match):
            plan.selected_backends({plan.BACKENDS_ENV: raw})
    assert plan.selected_families({}) == plan.FAMILIES
    assert list(plan.selected_families({plan.FAMILIES_ENV: "qwen3_moe, deepseek_v3"})) == ["qwen3_moe", "deepseek_v3"]
    for raw, match in (("llama", "unknown families"), ("qwen3_moe,qwen3_moe", "a family twice"), (",", "unknown")):
        with pytest.raises(ValueError, match=match):
            plan.selected_families({plan.FAMILIES_ENV: raw})
    with pytest.raises(ValueError, match="shape must be"):
        plan.spec_args(qwen, "wide", str(tiny))


def test_the_retraction_server_is_the_chain_with_sglangs_retraction_switch(tiny):
    sys.path.insert(0, str(ROOT / "test" / "registered" / "e2e"))
    try:
        import _families_plan as plan
        from _invariance import NEW_TOKENS
    finally:
        sys.path.pop(0)
    assert plan.SERVER_SHAPES == ("none", "chain", "tree", plan.RETRACTION)
    for fam in plan.FAMILIES.values():
        assert plan.spec_args(fam, plan.RETRACTION, str(tiny)) == plan.spec_args(fam, "chain", str(tiny))
    assert plan.server_env(plan.RETRACTION) == (("SGLANG_TEST_RETRACT", "1"),)
    assert all(plan.server_env(shape) == () for shape in ("none", "chain", "tree"))
    # SGLang's DeepGEMM start-up compile is off for the FP8 family only, under the name SGLang reads.
    from sglang.srt.environ import envs
    assert [plan.family_env(f) for f in plan.FAMILIES.values()] == [(), plan.FP8_ENV, ()]
    assert hasattr(envs, plan.FP8_ENV[0][0])
    # SGLang resolves the retracting chain as it resolves the chain: the same refusals per backend.
    deepseek = plan.FAMILIES["deepseek_v3"]
    for backend in plan.KNOWN_BACKENDS:
        chain, retract = (plan.sglang_refusal(str(tiny / deepseek.folder),
                                              plan.server_flags(deepseek, shape, backend, str(tiny)))
                          for shape in ("chain", plan.RETRACTION))
        assert chain == retract, backend
    # The radix-cache check resends each request with this many outputs: fewer than the request's tokens.
    assert 0 < plan.CACHED_TOKENS < NEW_TOKENS


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))


def test_the_fa3_head_size_note_names_the_family_as_the_reason():
    from sglang_detspec.cli.dry_run import fa3_head_size_notes

    bag = DetSpecConfig(deterministic=True, algorithm="EAGLE", eagle_topk=1, num_draft_tokens=4, head_dim=128,
                        model_family="moe+fp8")
    assert bag.attention_backend is None
    (note,) = fa3_head_size_notes(bag)
    assert "claims 'tokens' (a moe+fp8 target, not measured yet)" in note
    (dense,) = fa3_head_size_notes(dataclasses.replace(bag, model_family="dense"))
    assert "claims 'bitwise'" in dense and "not measured" not in dense
