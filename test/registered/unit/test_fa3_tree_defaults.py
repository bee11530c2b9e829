"""The FA3 tree default (config.FA3_TREE_DEFAULTS): which servers take it, for which settings, and what they log.

The defaults are resolved from the same fields every server's bag carries
(``with_server_defaults``); the last tests resolve real SGLang ``ServerArgs``
through the plugin, as a server's launcher does.
"""

import dataclasses
import json

import pytest
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_detspec.config import (FA3_TREE_DEFAULTS, PLAIN_TREE_DEFAULTS, TREE_SETTING_ENVS, DetSpecConfig,
                                   env_settings, resolve_verify, with_server_defaults)
from sglang_detspec.sglang_plugin import startup_notes

register_cpu_ci(est_time=15, suite="detspec-unit-cpu")

# An EAGLE tree on FA3 at the 8B shape's head size: the server the defaults were measured on.
FA3_TREE = dict(deterministic=True, algorithm="EAGLE", num_steps=3, eagle_topk=4, num_draft_tokens=8,
                attention_backend="fa3", head_dim=128, page_size=1, model_family="dense", kv_cache_dtype="auto")
FIELDS = tuple(FA3_TREE_DEFAULTS)


def resolved(env=None, **change) -> DetSpecConfig:
    fields = {**env_settings(env or {}), **FA3_TREE, **change}
    fields["verify"] = resolve_verify(fields["verify"], fields.get("rejection_sampling", False))
    return with_server_defaults(DetSpecConfig(**fields))


def tree_settings(bag) -> dict:
    return {field: getattr(bag, field) for field in FIELDS}


def test_the_defaults_are_four_settings_with_the_plain_ones_beside_them():
    assert set(FA3_TREE_DEFAULTS) == set(PLAIN_TREE_DEFAULTS) == set(TREE_SETTING_ENVS)
    assert FA3_TREE_DEFAULTS == {"tree_attention": "nodes", "decode_attention": "sglang",
                                 "tree_chain_batch": 16, "tree_chain_tokens": 12288}
    assert tree_settings(DetSpecConfig()) == PLAIN_TREE_DEFAULTS  # the bag before any resolution


def test_env_settings_record_which_tree_settings_are_set():
    assert env_settings({})["set_tree_settings"] == ()
    # An empty value is unset (as SGLANG_DETSPEC_TREE_CHAIN_BATCH= reads 0 and every word its default).
    assert env_settings({"SGLANG_DETSPEC_TREE_CHAIN_BATCH": " "})["set_tree_settings"] == ()
    every = {name: value for name, value in zip(TREE_SETTING_ENVS.values(), ("cascade", "split", "0", "0"))}
    assert env_settings(every)["set_tree_settings"] == FIELDS
    assert env_settings({"SGLANG_DETSPEC_TREE_CHAIN_TOKENS": "0"})["set_tree_settings"] == ("tree_chain_tokens",)


def test_an_fa3_tree_at_head_size_128_takes_all_four():
    bag = resolved({"SGLANG_DETSPEC_VERIFY": "coupled"})
    assert bag.takes_fa3_tree_defaults and tree_settings(bag) == FA3_TREE_DEFAULTS
    assert bag.logits == "bitwise" and bag.node_path_verifies
    assert (bag.chain_at_batch, bag.chain_at_tokens) == (16, 12288)
    assert all(bag.setting_origin(f) == "the FA3 tree default" for f in FIELDS)
    assert resolved(algorithm="EAGLE3").takes_fa3_tree_defaults
    assert resolved(page_size=None).takes_fa3_tree_defaults  # not resolved yet: SGLang's default is 1


@pytest.mark.parametrize("change, why", [
    (dict(head_dim=64), "FA3's decode call parts from its prefill at head size 64: the node path would be tokens"),
    (dict(head_dim=256), "not measured above 128"),
    (dict(head_dim=None), "an unread config.json"),
    (dict(attention_backend="triton"), "the node path is FA3's"),
    (dict(attention_backend=None), "no backend known yet"),
    (dict(eagle_topk=1, num_draft_tokens=4), "a chain"),
    (dict(multi_layer_eagle=True), "multi-layer EAGLE does not switch shape"),
    (dict(algorithm="NGRAM"), "NGRAM does not switch shape"),
    (dict(page_size=16), "pages of more than one token"),
    (dict(kv_cache_dtype="fp8_e4m3"), "a quantized KV cache"),
    (dict(model_family="moe+fp8"), "a family the claim does not speak for"),
    (dict(deterministic=False), "SGLang's own code runs"),
    (dict(disabled=True), "SGLang's own code runs"),
    (dict(verify="rejection", rejection_sampling=True), "rejection mode (refused for trees)"),
    (dict(parallel_reason="pipeline parallelism (only the last stage drafts)"), "no bound could act"),
])
def test_every_other_server_keeps_the_plain_defaults(change, why):
    bag = resolved(**change)
    assert not bag.takes_fa3_tree_defaults, why
    assert tree_settings(bag) == PLAIN_TREE_DEFAULTS, why
    note = startup_notes.fa3_tree_defaults_note(bag)
    if bag.active and bag.attention_backend == "fa3" and bag.can_switch_shape:
        # An FA3 tree that could have taken them says why it did not.
        assert note.startswith("FA3 tree defaults not taken (") and note.endswith("keep their plain defaults"), why
    else:
        assert note is None, why


@pytest.mark.parametrize("env, want", [
    ({"SGLANG_DETSPEC_TREE_CHAIN_BATCH": "32"}, {**FA3_TREE_DEFAULTS, "tree_chain_batch": 32}),
    ({"SGLANG_DETSPEC_TREE_CHAIN_TOKENS": "0"}, {**FA3_TREE_DEFAULTS, "tree_chain_tokens": 0}),
    ({"SGLANG_DETSPEC_DECODE_ATTENTION": "one_pass"}, {**FA3_TREE_DEFAULTS, "decode_attention": "one_pass"}),
    # The split set: it verifies the trees, so the plain tree (no node path, no bounds).
    ({"SGLANG_DETSPEC_DECODE_ATTENTION": "split"}, PLAIN_TREE_DEFAULTS),
    ({"SGLANG_DETSPEC_DECODE_ATTENTION": "split", "SGLANG_DETSPEC_TREE_ATTENTION": "nodes"},
     {**PLAIN_TREE_DEFAULTS, "tree_attention": "nodes"}),
    # SGLang's cascade set: the plain tree (the split verifies it bitwise), no bounds.
    ({"SGLANG_DETSPEC_TREE_ATTENTION": "cascade"}, PLAIN_TREE_DEFAULTS),
    ({"SGLANG_DETSPEC_TREE_ATTENTION": "cascade", "SGLANG_DETSPEC_DECODE_ATTENTION": "sglang"},
     {**PLAIN_TREE_DEFAULTS, "decode_attention": "sglang"}),
    # A bound set beside the cascade keeps its value; the other bound stays off.
    ({"SGLANG_DETSPEC_TREE_ATTENTION": "cascade", "SGLANG_DETSPEC_TREE_CHAIN_BATCH": "16"},
     {**PLAIN_TREE_DEFAULTS, "tree_chain_batch": 16}),
    ({name: value for name, value in zip(TREE_SETTING_ENVS.values(), ("cascade", "split", "0", "0"))},
     PLAIN_TREE_DEFAULTS),
])
def test_a_setting_given_keeps_its_value_and_the_others_take_the_default(env, want):
    bag = resolved(env)
    assert tree_settings(bag) == want
    for field in FIELDS:
        origin = bag.setting_origin(field)
        assert origin == ("set" if TREE_SETTING_ENVS[field] in env else
                          "the FA3 tree default" if want[field] == FA3_TREE_DEFAULTS[field] else "the default"), field
    note = startup_notes.fa3_tree_defaults_note(bag)
    taken = [f for f in FIELDS if bag.setting_origin(f) == "the FA3 tree default"]
    if not taken:
        assert note is None
        return
    named = note.split(": ", 1)[1].split("; ", 1)[0]  # the settings this server took, before the evidence
    assert named == " ".join(f"{TREE_SETTING_ENVS[f]}={FA3_TREE_DEFAULTS[f]}" for f in taken)


def test_nextn_as_typed_takes_them_as_the_eagle_it_resolves_to():
    # A dry run reads the flags as typed (NEXTN); the server reads SGLang's resolved EAGLE: both take the defaults.
    assert tree_settings(resolved(algorithm="NEXTN")) == tree_settings(resolved(algorithm="EAGLE")) == FA3_TREE_DEFAULTS


def test_the_cascade_set_with_the_split_kept_stays_bitwise_and_with_sglang_not():
    assert resolved({"SGLANG_DETSPEC_TREE_ATTENTION": "cascade"}).logits == "bitwise"
    both = resolved({"SGLANG_DETSPEC_TREE_ATTENTION": "cascade", "SGLANG_DETSPEC_DECODE_ATTENTION": "sglang"})
    assert both.logits == "tokens"  # what the user asked for, and the start-up line says why


def test_resolution_is_idempotent_and_follows_the_backend_when_it_is_filled_in_later():
    bag = resolved()
    assert with_server_defaults(bag) is bag
    # The runtime context's spec namespace has no attention fields: a bag first resolved without the backend,
    # then given it, takes the defaults; a bag given another backend gives them back.
    early = resolved(attention_backend=None)
    assert tree_settings(early) == PLAIN_TREE_DEFAULTS
    assert tree_settings(with_server_defaults(dataclasses.replace(early, attention_backend="fa3"))) == FA3_TREE_DEFAULTS
    assert tree_settings(with_server_defaults(dataclasses.replace(bag, attention_backend="triton"))) == \
        PLAIN_TREE_DEFAULTS


def test_the_start_up_note_names_what_was_taken_and_how_to_get_the_plain_tree():
    note = startup_notes.fa3_tree_defaults_note(resolved())
    assert note.startswith("FA3 tree defaults (head size 128, in 65-128) taken for the tree settings not set in the "
                           "environment: SGLANG_DETSPEC_TREE_ATTENTION=nodes SGLANG_DETSPEC_DECODE_ATTENTION=sglang "
                           "SGLANG_DETSPEC_TREE_CHAIN_BATCH=16 SGLANG_DETSPEC_TREE_CHAIN_TOKENS=12288; with all four "
                           "this is the tree verified per node on SGLang's FA3 calls, drafting a chain above 16 "
                           "requests or 12,288 summed tokens; ")
    assert "SGLang's harness passed on a server taking them unnamed" in note
    assert note.count("SGLANG_DETSPEC_TREE_ATTENTION=nodes") == 1
    assert note.endswith("SGLANG_DETSPEC_TREE_ATTENTION=cascade SGLANG_DETSPEC_DECODE_ATTENTION=split "
                         "SGLANG_DETSPEC_TREE_CHAIN_BATCH=0 SGLANG_DETSPEC_TREE_CHAIN_TOKENS=0 gives the plain tree")
    assert note in startup_notes.setting_notes(resolved())
    # The bag's own line does not list which settings were set: the note says it.
    assert "set_tree_settings" not in resolved().describe()


@pytest.fixture()
def model_dirs(tmp_path):
    """Two tiny Llama configs, head size 128 and 64 (hidden 512 over 4 and 8 heads)."""
    dirs = {}
    for heads in (4, 8):
        d = tmp_path / f"heads{heads}"
        d.mkdir()
        (d / "config.json").write_text(json.dumps({
            "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 512,
            "intermediate_size": 128, "num_attention_heads": heads, "num_key_value_heads": heads,
            "num_hidden_layers": 2, "vocab_size": 1000, "max_position_embeddings": 2048,
            "rms_norm_eps": 1e-5, "torch_dtype": "float16"}))
        dirs[512 // heads] = str(d)
    return dirs


def real_bag(model_dir, backend, topk, monkeypatch, env=None):
    import argparse

    from sglang.srt.server_args import ServerArgs

    from sglang_detspec.sglang_plugin import resolve

    for name in TREE_SETTING_ENVS.values():
        monkeypatch.delenv(name, raising=False)
    for name, value in (env or {}).items():
        monkeypatch.setenv(name, value)
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    tokens = 8 if topk > 1 else 4
    argv = ["--model-path", model_dir, "--device", "cuda", "--attention-backend", backend,
            "--speculative-draft-model-path", model_dir, "--enable-deterministic-inference",
            "--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3", "--speculative-eagle-topk", str(topk),
            "--speculative-num-draft-tokens", str(tokens)]
    sa = ServerArgs.from_cli_args(parser.parse_args(argv))
    sa.resolve_once()
    return resolve.config_from_server_args(sa)


def test_real_server_args_resolve_the_defaults_from_the_models_head_size(model_dirs, monkeypatch):
    from sglang_detspec.config import reset_config

    try:
        assert tree_settings(real_bag(model_dirs[128], "fa3", 4, monkeypatch)) == FA3_TREE_DEFAULTS
        assert tree_settings(real_bag(model_dirs[64], "fa3", 4, monkeypatch)) == PLAIN_TREE_DEFAULTS
        assert tree_settings(real_bag(model_dirs[128], "triton", 4, monkeypatch)) == PLAIN_TREE_DEFAULTS
        assert tree_settings(real_bag(model_dirs[128], "fa3", 1, monkeypatch)) == PLAIN_TREE_DEFAULTS
        kept = real_bag(model_dirs[128], "fa3", 4, monkeypatch, {"SGLANG_DETSPEC_TREE_CHAIN_BATCH": "0"})
        assert tree_settings(kept) == {**FA3_TREE_DEFAULTS, "tree_chain_batch": 0}
        assert kept.set_tree_settings == ("tree_chain_batch",)
    finally:
        reset_config()


def test_a_dry_run_without_a_backend_says_fa3_would_take_the_defaults():
    from sglang_detspec.cli.dry_run import fa3_head_size_notes

    unnamed = resolved(attention_backend=None)
    assert tree_settings(unnamed) == PLAIN_TREE_DEFAULTS  # nothing known yet about the backend
    (note,) = fa3_head_size_notes(unnamed)
    assert note.startswith("on Hopper SGLang picks fa3 here, and at this target's head size (128) an FA3 server "
                           "claims 'bitwise', with the FA3 tree defaults for its tree settings not set "
                           "(SGLANG_DETSPEC_TREE_ATTENTION=nodes SGLANG_DETSPEC_DECODE_ATTENTION=sglang "
                           "SGLANG_DETSPEC_TREE_CHAIN_BATCH=16 SGLANG_DETSPEC_TREE_CHAIN_TOKENS=12288)")
    (small,) = fa3_head_size_notes(resolved(attention_backend=None, head_dim=64))
    assert "FA3 tree defaults" not in small
    plain = {name: value for name, value in zip(TREE_SETTING_ENVS.values(), ("cascade", "split", "0", "0"))}
    assert "FA3 tree defaults" not in fa3_head_size_notes(resolved(plain, attention_backend=None))[0]


def test_an_fa3_tree_whose_head_size_is_unknown_says_a_server_that_reads_one_may_take_them():
    note = startup_notes.fa3_tree_defaults_note(resolved(head_dim=None))
    assert note == ("FA3 tree defaults not taken (the target's head size was not read from its config.json here; a "
                    "server that reads a head size of 65-128 takes them): the tree settings not set in the environment "
                    "keep their plain defaults")
    every = {name: value for name, value in zip(TREE_SETTING_ENVS.values(), ("cascade", "split", "0", "0"))}
    assert startup_notes.fa3_tree_defaults_note(resolved(every, head_dim=None)) is None  # all four set: no default
    assert startup_notes.fa3_tree_defaults_note(resolved(every)) is None


def test_the_parallel_layout_shows_only_where_a_draft_shape_could_switch():
    blocked = resolved(parallel_reason="pipeline parallelism (only the last stage drafts)")
    assert "parallel_reason='pipeline parallelism" in blocked.describe()
    chain = resolved(eagle_topk=1, num_draft_tokens=4, parallel_reason="pipeline parallelism (only the last stage "
                                                                        "drafts)")
    assert "parallel_reason" not in chain.describe() and "parallel_reason" not in resolved().describe()
    note = startup_notes.fa3_tree_defaults_note(blocked)
    assert note.startswith("FA3 tree defaults not taken (pipeline parallelism (only the last stage drafts): its "
                           "bounds could not act, leaving the node path at every batch size)")


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__, "-v"]))
