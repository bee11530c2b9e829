"""The plan of the forward-modes E2E suite (``test/registered/e2e/_forward_plan.py``), checked without a GPU.

The suite itself launches SGLang servers on an H200; its row table, server
keys, backend selection and expected claims are plain data read here, and
the radix-cache rule it records for flashinfer is checked against SGLang's
real server-argument resolution.
"""

import importlib
import importlib.util
import sys
from pathlib import Path

import pytest
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_detspec.config import logits_guarantee

register_cpu_ci(est_time=10, suite="detspec-unit-cpu")

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def e2e(e2e_import):
    """``_e2e`` and ``_forward_plan`` as the suite imports them (by bare name from its folder)."""
    return e2e_import("_e2e"), e2e_import("_forward_plan")


@pytest.fixture
def plan(e2e):
    return e2e[1]


def test_every_row_names_known_families_with_a_reference_on_the_same_model(e2e):
    _e2e, plan = e2e
    for backend in plan.KNOWN_BACKENDS:
        for name, row in plan.rows_for(backend).items():
            spec, ref = _e2e.family(row.family), _e2e.family(row.reference)  # ValueError if unknown
            assert spec.draft is not None and ref.draft is None, name
            assert spec.model == ref.model, f"{name}: {row.family} serves {spec.model}, {row.reference} {ref.model}"


def test_the_matrix_the_issue_asks_for_is_on_every_backend(plan):
    wanted = {"chain", "tree", "multi_layer", "eagle3_tree", "nextn_tree", "retraction", "chunked"}
    for backend in plan.KNOWN_BACKENDS:
        rows = plan.rows_for(backend)
        assert wanted <= {r.drafting for r in rows.values() if r.tree_attention == "cascade"}, backend
    tree = plan.ROWS["tree"]
    assert plan.eagle_topk(tree.family) == 4 and not tree.env and not tree.args  # no plugin variable set
    assert plan.eagle_topk(plan.ROWS["chain"].family) == 1
    assert plan.verifies_trees(tree.family) and not plan.verifies_trees(plan.ROWS["chain"].family)
    assert plan.ROWS["eagle3_tree"].family == "eagle3_tree" and plan.ROWS["eagle3_tree"].reference == "no_spec"
    assert plan.ROWS["nextn_tree"].reference == "mimo_no_spec"


def test_every_tree_row_has_a_node_variant_on_fa3_only(plan):
    assert not any(n.endswith(plan.NODE_SUFFIX) for n in plan.rows_for("fa3", "split"))  # the node path stands down
    fa3 = plan.rows_for("fa3", "one_pass")
    trees = [name for name, row in plan.ROWS.items() if plan.is_tree(row)]
    assert set(trees) == {"tree", "eagle3_tree", "nextn_tree", "chunked"}
    for name in trees:
        nodes = fa3[name + plan.NODE_SUFFIX]
        assert nodes.env == plan.TREE_NODES and nodes.tree_attention == "nodes"
        assert (nodes.family, nodes.reference, nodes.args) == (plan.ROWS[name].family, plan.ROWS[name].reference,
                                                               plan.ROWS[name].args)
    for backend in ("triton", "flashinfer"):
        assert all(r.tree_attention == "cascade" for r in plan.rows_for(backend, "one_pass").values()), backend


@pytest.mark.parametrize("decode", ["split", "one_pass"])
@pytest.mark.parametrize("backend", ["triton", "fa3", "flashinfer"])
@pytest.mark.parametrize("head_dim", [None, 64, 128])
def test_the_claims_the_suite_expects(plan, backend, head_dim, decode):
    """Under the split (the default) every row of triton and fa3 is bitwise, the suite's head size 64 included;
    without it trees claim tokens (FA3's node rows apart) and FA3 at head size 64 claims tokens."""
    rows = plan.rows_for(backend, decode)
    claims = {name: logits_guarantee(backend, plan.eagle_topk(r.family), r.tree_attention, decode, head_dim=head_dim)
              for name, r in rows.items()}
    if backend == "flashinfer":
        assert set(claims.values()) == {"tokens"} and logits_guarantee(backend, None) == "tokens"
        return
    if decode == "split":
        assert set(claims.values()) == {"bitwise"}
        return
    small_fa3 = backend == "fa3" and head_dim == 64
    for name, row in rows.items():
        bitwise = (not plan.is_tree(row) or row.tree_attention == "nodes") and not small_fa3
        assert claims[name] == ("bitwise" if bitwise else "tokens"), name


def test_rows_share_servers(plan, monkeypatch):
    # Each server started once whichever rows use it: 8 rows, 12 servers; fa3's 4 node rows (without the
    # split only) add only their own.
    monkeypatch.delenv("SGLANG_DETSPEC_DECODE_ATTENTION", raising=False)
    assert len(plan.server_keys("triton")) == 12
    assert len(plan.server_keys("fa3")) == 12
    monkeypatch.setenv("SGLANG_DETSPEC_DECODE_ATTENTION", "sglang")
    assert len(plan.server_keys("fa3")) == 16
    monkeypatch.delenv("SGLANG_DETSPEC_DECODE_ATTENTION")
    # flashinfer: the chunked rows' three servers are not started (SGLang refuses them, test below).
    assert len(plan.server_keys("flashinfer")) == 9
    for backend in plan.KNOWN_BACKENDS:
        keys = plan.server_keys(backend)
        assert plan.CACHE_HIT_SERVER in keys
        assert len({plan.server_tag(backend, env, args) + family for family, env, args in keys}) == len(keys)


def test_sglang_refuses_small_chunks_on_deterministic_flashinfer_and_the_row_is_skipped(plan):
    """Chunks below flashinfer's prefill split tile (SGLang's own setting, read here) are refused at start-up
    (measured on the H200, 2026-12-02: "Chunked prefill is aligned to 4096 tokens"), so the row starts nothing."""
    from sglang.srt.environ import envs

    tile = envs.SGLANG_FLASHINFER_PREFILL_SPLIT_TILE_SIZE.get()
    assert plan.CHUNK_TOKENS < tile
    skipped = plan.skipped_rows("flashinfer")
    assert set(skipped) == {"chunked", "chunked_chain"}
    assert all(f"{tile}-token" in reason for reason in skipped.values())
    assert plan.skipped_rows("fa3") == plan.skipped_rows("triton") == {}
    started = {key for key in plan.server_keys("flashinfer")}
    assert plan.rows_for("flashinfer")["chunked"].server not in started


def test_a_smaller_flashinfer_tile_is_still_refused_without_claiming_the_prompts_stay_unchunked(plan, monkeypatch):
    monkeypatch.setenv("SGLANG_FLASHINFER_PREFILL_SPLIT_TILE_SIZE", "512")
    reason = plan.skipped_rows("flashinfer")["chunked"]
    assert "512-token" in reason and "unchunked" not in reason
    monkeypatch.setenv("SGLANG_FLASHINFER_PREFILL_SPLIT_TILE_SIZE", str(plan.CHUNK_TOKENS))
    assert plan.skipped_rows("flashinfer") == {}


def test_server_configs_carry_the_backend_and_the_chunk_size(e2e, e2e_import):
    _e2e, plan = e2e
    models = _e2e.Models(*(f"/models/{f}" for f in ("target", "eagle", "eagle_random", "mtp", "mtp", "eagle3",
                                                       "eagle3_full", "mimo")), None)
    suite = e2e_import("test_forward_modes")
    for backend in plan.KNOWN_BACKENDS:
        configs = suite.server_configs(models, backend)
        assert len({c.name for c in configs.values()}) == len(configs)
        for (family, env, args), config in configs.items():
            # The last --attention-backend wins in SGLang's argparse.
            flags = list(config.args)
            assert flags[len(flags) - 1 - flags[::-1].index("--attention-backend") + 1] == backend, config.name
            assert ("--chunked-prefill-size" in flags) == (args == plan.CHUNKED_PREFILL), config.name
            assert set(env) <= set(config.env)
            # Each server names its tree attention and a fixed draft shape: the FA3 tree default never picks them.
            named = dict(config.env)
            assert named["SGLANG_DETSPEC_TREE_ATTENTION"] == plan.tree_attention(env), config.name
            assert named["SGLANG_DETSPEC_TREE_CHAIN_BATCH"] == named["SGLANG_DETSPEC_TREE_CHAIN_TOKENS"] == "0"
            assert named["SGLANG_DETSPEC_DECODE_ATTENTION"] == plan.decode_attention(), config.name
        chunked = plan.ROWS["chunked"]
        if "chunked" in plan.skipped_rows(backend):
            assert chunked.server not in configs and chunked.reference_server not in configs
            continue
        assert configs[chunked.server].model == configs[chunked.reference_server].model == models.target


def test_the_long_prompts_are_chunked_and_fit_the_tiny_models(plan):
    spec = importlib.util.spec_from_file_location("make_tiny_models", ROOT / "scripts" / "make_tiny_models.py")
    tiny = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tiny)
    context = tiny.llama_config("LlamaForCausalLM", 2)["max_position_embeddings"]
    assert plan.LONG_PROMPTS[0] > 2 * plan.CHUNK_TOKENS
    assert plan.LONG_PROMPTS[1] + plan.NEW_TOKENS <= context == plan.TINY_CONTEXT
    assert plan.SHORT_PROMPTS[1] < plan.CHUNK_TOKENS
    assert plan.SHORT_PROMPTS[0] + plan.NEW_TOKENS > plan.FA3_FIRST_BLOCK_KEYS  # decode rows past the first block
    assert plan.ROWS["chunked"].prompts == plan.LONG_PROMPTS


@pytest.mark.parametrize("raw, fa3, want", [
    (None, True, ("triton", "fa3", "flashinfer")),
    (None, False, ("triton", "flashinfer")),
    ("  ", False, ("triton", "flashinfer")),
    ("fa3,flashinfer", False, ("fa3", "flashinfer")),
    (" flashinfer , triton", True, ("flashinfer", "triton")),
])
def test_backend_selection(plan, raw, fa3, want):
    environ = {} if raw is None else {plan.BACKENDS_ENV: raw}
    assert plan.selected_backends(environ, lambda: fa3) == want


@pytest.mark.parametrize("raw", ["fa4", "triton,FA3", "triton,triton", ",", "triton,"])
def test_a_bad_backend_selection_names_the_variable_and_the_choices(plan, raw):
    with pytest.raises(ValueError) as info:
        plan.selected_backends({plan.BACKENDS_ENV: raw}, lambda: True)
    assert plan.BACKENDS_ENV in str(info.value) and "triton, fa3, flashinfer" in str(info.value)


def test_the_decode_path_comes_from_the_plugins_own_setting_and_names_the_result(plan):
    assert plan.decode_attention({}) == "split"
    assert plan.decode_attention({"SGLANG_DETSPEC_DECODE_ATTENTION": "one_pass"}) == "one_pass"
    with pytest.raises(ValueError, match="SGLANG_DETSPEC_DECODE_ATTENTION must be one of"):
        plan.decode_attention({"SGLANG_DETSPEC_DECODE_ATTENTION": "fast"})
    assert plan.result_name("triton", "split") == "forward_modes_triton"  # the default
    assert plan.result_name("triton", "one_pass") == "forward_modes_triton_one_pass"
    assert plan.result_name("triton", "sglang") == "forward_modes_triton_sglang"
    assert plan.result_name("fa3", "split") == "forward_modes_fa3"
    assert plan.result_name("fa3", "sglang") == plan.result_name("fa3", "one_pass") == "forward_modes_fa3_sglang"
    assert plan.result_name("flashinfer", "one_pass") == "forward_modes_flashinfer"


def test_rows_for_refuses_an_unknown_backend(plan):
    with pytest.raises(ValueError, match="fa4"):
        plan.rows_for("fa4")


@pytest.mark.parametrize("backend, radix_off", [("triton", False), ("fa3", False), ("flashinfer", True)])
def test_the_cache_hit_row_applies_where_sglang_keeps_the_radix_cache(plan, model_dir, backend, radix_off):
    import argparse

    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    argv = ["--model-path", model_dir, "--device", "cuda", "--attention-backend", backend,
            "--enable-deterministic-inference"]
    args = ServerArgs.from_cli_args(parser.parse_args(argv))
    args.resolve_once()
    # What the server's /server_info reports (build_server_info: the resolved arguments).
    assert bool(args.resolved_dict()["disable_radix_cache"]) is radix_off
    reason = plan.cache_hit_skip_reason(backend)
    assert (reason is not None) is radix_off
    if radix_off:
        assert backend in reason and "radix cache" in reason


def test_every_server_gets_one_decode_against_prefill_row(plan, monkeypatch):
    monkeypatch.setenv("SGLANG_DETSPEC_DECODE_ATTENTION", "sglang")  # with the node rows
    for backend in plan.KNOWN_BACKENDS:
        rows = plan.prefill_rows(backend)
        assert sorted(rows.values()) == sorted(plan.server_keys(backend)), backend
        assert all(name.startswith(plan.PREFILL_ROW_PREFIX) for name in rows)
        assert not set(rows) & set(plan.rows_for(backend)) and plan.CACHE_HIT not in rows
    assert {"prefill_no_spec", "prefill_coupled_chain", "prefill_coupled_chain_retract",
            "prefill_coupled_tree_chunked", "prefill_no_spec_chunked"} <= set(plan.prefill_rows("triton"))
    assert "prefill_coupled_tree_chunked_nodes" in plan.prefill_rows("fa3")


def test_each_server_is_measured_on_the_prompts_its_rows_use(plan):
    for backend in plan.KNOWN_BACKENDS:
        for row in plan.rows_for(backend).values():
            assert plan.prompt_lengths(row.server) == plan.prompt_lengths(row.reference_server) == row.prompts


def _generated(ids, logprobs):
    import _requests

    entries = [[lp, t, f"t{t}"] for lp, t in zip(logprobs, ids)]
    return _requests.parse_generated({"output_ids": list(ids), "meta_info": {"output_token_logprobs": entries}})


@pytest.fixture
def requests_module(e2e, e2e_import):
    return e2e_import("_requests")


def test_decode_against_prefill_counts_positions_apart(plan, requests_module):
    prompt = [5, 6, 7]
    head = [[None, 5, "t5"], [-1.5, 6, "t6"], [-2.0, 7, "t7"]]
    same = _generated([8, 9], [-0.25, -0.5])
    apart = _generated([8, 9], [-0.25, -0.5000001])
    prefill = head + [[-0.25, 8, "t8"], [-0.5, 9, "t9"]]
    got = plan.compare_with_prefill([same, apart], [prefill, prefill], [len(prompt)] * 2)
    assert (got["positions"], got["differing_positions"], got["token_sequences_differing"]) == (4, 1, 0)
    assert got["max_abs"] == pytest.approx(1e-7) and got["errors"] == []
    assert [r["first_differing_logprob"] for r in got["requests"]] == [None, 1]
    # Entries naming other token ids than the output: out of line, counted as a differing sequence.
    shifted = head + [[-0.25, 9, "t9"], [-0.5, 9, "t9"]]
    assert plan.compare_with_prefill([same], [shifted], [3])["token_sequences_differing"] == 1


def test_decode_against_prefill_reports_what_went_wrong(plan, requests_module):
    same = _generated([8], [-0.25])
    got = plan.compare_with_prefill([same, "HTTP 500: boom", same], [[[None, 5, ""]], [], "prefill: HTTP 400"],
                                    [2, 1, 1])
    assert got["positions"] == 0 and len(got["errors"]) == 3
    assert "1 prefill logprob entries for 2 prompt and 1 output tokens" in got["errors"][0]
    assert "boom" in got["errors"][1] and "HTTP 400" in got["errors"][2]
    with pytest.raises(ValueError, match="one entry per request"):
        plan.compare_with_prefill([same], [], [1])


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
