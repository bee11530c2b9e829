"""The E2E suites' server families (``test/registered/e2e/_e2e.FAMILIES``) resolve through SGLang's real ServerArgs.

Each family on the tiny Llama target (with the EAGLE drafts, which share its
config here) is parsed with ``ServerArgs.add_cli_args`` and resolved
(``resolve_once``) with the plugin loaded: its flags are ones SGLang 0.5.23
accepts, and the plugin's bag takes the verify mode the suite expects from
its start-up line. A flag that SGLang rejects or a verify mode that the
suite would read wrong fails here instead of on the H200.
"""

import argparse
import shlex
import sys

import pytest
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_detspec.config import reset_config
from sglang_detspec.sglang_plugin import resolve

register_cpu_ci(est_time=20, suite="detspec-unit-cpu")


@pytest.fixture(scope="module")
def e2e(e2e_import):
    return e2e_import("_e2e")


@pytest.fixture(scope="module")
def loaded():
    from sglang.srt.plugins import load_plugins

    load_plugins()
    yield
    reset_config()


def llama_families(e2e):
    return [name for name, fam in e2e.FAMILIES.items()
            if fam.model == "target" and fam.draft in (None, "eagle", "eagle_random")]


def test_the_llama_families_are_the_invariance_suites(e2e):
    names = llama_families(e2e)
    assert {"no_spec", "coupled_chain", "coupled_tree", "coupled_chain_adaptive", "chain_eagle"} <= set(names)


@pytest.mark.parametrize("name", ["no_spec", "chain_eagle", "coupled_chain", "coupled_tree", "coupled_tree_16",
                                  "coupled_chain_random_draft", "coupled_race_chain", "coupled_chain_adaptive",
                                  "coupled_tree_chain_switch", "coupled_tree_switch_nodes",
                                  "coupled_tree_token_switch"])
def test_family_resolves_with_the_verify_the_suite_expects(e2e, loaded, model_dir, monkeypatch, name):
    from sglang.srt.server_args import ServerArgs

    fam = e2e.FAMILIES[name]
    models = e2e.Models(*[model_dir] * 8, tiny_dir=None)
    config = e2e.server_config(name, models)
    for key, value in config.env:
        monkeypatch.setenv(key, value)
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    sa = ServerArgs.from_cli_args(parser.parse_args(["--model-path", config.model, *config.args]))
    sa.resolve_once()
    bag = resolve.config_from_server_args(sa)
    assert bag.active, bag.refusals()
    if fam.verify is None:
        assert bag.algorithm is None
    else:
        assert bag.verify == fam.verify
    if "--speculative-adaptive" in config.args:
        assert bag.adaptive_steps and bag.num_steps in bag.adaptive_steps
    env = dict(config.env)
    assert bag.chain_at_batch == int(env.get("SGLANG_DETSPEC_TREE_CHAIN_BATCH", 0))
    assert bag.chain_at_tokens == int(env.get("SGLANG_DETSPEC_TREE_CHAIN_TOKENS", 0))
    assert bag.tree_attention == env.get("SGLANG_DETSPEC_TREE_ATTENTION", "cascade")
    assert shlex.join(config.args)  # every argument is a plain string
    reset_config()


def test_a_model_set_of_its_own_is_written_once_and_reused(e2e, tmp_path):
    """``tiny_models_with_vocab`` names the set by vocabulary and attention scale and finds it complete later."""
    first = e2e.tiny_models_with_vocab(tmp_path, 64, attention_scale=8.0)
    assert first.tiny_dir == str(tmp_path / "vocab64-attention8")
    stamp = (tmp_path / "vocab64-attention8" / "target" / "model.safetensors").stat().st_mtime_ns
    again = e2e.tiny_models_with_vocab(tmp_path, 64, attention_scale=8.0)
    assert again == first
    assert (tmp_path / "vocab64-attention8" / "target" / "model.safetensors").stat().st_mtime_ns == stamp
    assert e2e.tiny_models_with_vocab(tmp_path, 64).tiny_dir == str(tmp_path / "vocab64")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["vocab64", "vocab64-attention8"]  # no staging left


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
