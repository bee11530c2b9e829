"""The attention-path cost benchmark's plan, its server pairs and its summary (benchmark/serving/attention_cost.py).

The servers themselves run on the GPU; here the plan, the command lines
(SGLang's real argument parser reads them) and the ratio arithmetic are
checked on CPU.
"""

import sys
from pathlib import Path

import pytest
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=20, suite="detspec-unit-cpu")

BENCH = Path(__file__).resolve().parents[3] / "benchmark" / "serving"
sys.path.insert(0, str(BENCH))

import attention_cost as ac  # noqa: E402
from serving_configs import ServerSettings  # noqa: E402


@pytest.fixture(autouse=True)
def _no_gpu_memory(monkeypatch):
    """Plans as on a machine whose GPU memory is unknown (test_gpu_fit.py plans for given cards)."""
    monkeypatch.setattr(ac, "gpu_memory_gib", lambda: None)


def test_pairs_are_parsed_and_bad_names_are_named():
    assert [p.name for p in ac.parse_pairs("triton_one_pass")] == ["triton_one_pass"]
    with pytest.raises(ValueError, match="unknown"):
        ac.parse_pairs("fa3_tree_nodes,flash")
    with pytest.raises(ValueError, match="repeated"):
        ac.parse_pairs("triton_one_pass,triton_one_pass")
    with pytest.raises(ValueError, match="at least one"):
        ac.parse_pairs(" , ")


def test_cells_whose_kv_does_not_fit_are_skipped_and_prompts_go_outermost():
    pairs = ac.parse_pairs("fa3_tree_nodes,triton_one_pass")
    cells, skipped = ac.plan_cells(pairs, [128, 8192], [1, 8, 32], 64, 100_000)
    assert [(p.name, n, c) for p, n, c in cells][:3] == [("fa3_tree_nodes", 128, 1), ("fa3_tree_nodes", 128, 8),
                                                          ("fa3_tree_nodes", 128, 32)]
    assert {(s["pair"], s["prompt_len"], s["concurrency"]) for s in skipped} == {
        ("fa3_tree_nodes", 8192, 32), ("triton_one_pass", 8192, 32)}
    assert all(c * (n + 64 + ac.SLACK_TOKENS) <= 100_000 for _, n, c in cells)
    assert "exceed the largest pool allowed, --max-total-tokens 100000" in skipped[0]["why"]


def test_requests_longer_than_the_context_are_skipped():
    pairs = ac.parse_pairs("fa3_tree_nodes")
    cells, skipped = ac.plan_cells(pairs, [128, 8192], [1], 64, 10**7, context_len=8192)
    assert [(n, c) for _, n, c in cells] == [(128, 1)]
    assert "exceed the model's context of 8192" in skipped[0]["why"]
    assert ac.plan_cells(pairs, [8192], [1], 64, 10**7)[0]  # the written models take 8K prompts


def test_a_model_folder_written_with_a_shorter_context_keeps_its_own(tmp_path):
    import json

    assert ac.model_context_len(str(tmp_path)) == ac.CONTEXT_LEN  # not written yet: what serving_models writes
    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "config.json").write_text(json.dumps({"max_position_embeddings": 8192}))
    assert ac.model_context_len(str(tmp_path)) == 8192
    plan = ac.validate(ac.build_parser().parse_args(["--out", "o", "--models", str(tmp_path), "--prompt-lens",
                                                     "128,8192", "--concurrency", "1"]))
    assert {n for _, n, _ in plan["cells"]} == {128}
    assert all("context of 8192" in s["why"] for s in plan["skipped"])


def test_prefill_graphs_follow_sglangs_default_unless_turned_off(tmp_path):
    def settings(*extra):
        args = ac.build_parser().parse_args(["--out", "o", "--models", str(tmp_path), *extra])
        return ac.validate(args)["settings"]

    assert settings().prefill_graphs is True and settings("--prefill-graphs").prefill_graphs is True
    off = settings("--no-prefill-graphs")
    assert off.prefill_graphs is False
    argv, _ = ac.server_argv(ac.PAIRS["triton_one_pass"], "path", off, 32000)
    assert argv[argv.index("--cuda-graph-backend-prefill") + 1] == "disabled"
    argv, _ = ac.server_argv(ac.PAIRS["triton_one_pass"], "path", settings(), 32000)
    assert "--cuda-graph-backend-prefill" not in argv


def test_rounds_alternate_which_arm_runs_first():
    assert ac.arm_order(1) == ("sglang", "path") and ac.arm_order(2) == ("path", "sglang")
    assert ac.arm_order(3) == ac.arm_order(1)


D = "SGLANG_DETSPEC_DECODE_ATTENTION"


@pytest.mark.parametrize("name, backend, env_path, env_sglang, shared, spec", [
    ("fa3_tree_nodes", "fa3", {"SGLANG_DETSPEC_TREE_ATTENTION": "nodes"}, {}, {D: "sglang"}, True),
    ("triton_one_pass", "triton", {D: "one_pass"}, {D: "sglang"}, {}, False),
    ("fa3_split_tree", "fa3", {D: "split"}, {D: "sglang"}, {}, True),
    ("fa3_split_chain", "fa3", {D: "split"}, {D: "sglang"}, {}, True),
    ("triton_split", "triton", {D: "split"}, {D: "sglang"}, {}, False),
])
def test_the_two_arms_differ_only_in_the_attention_setting(name, backend, env_path, env_sglang, shared, spec):
    import argparse

    from sglang.srt.server_args import ServerArgs

    pair = ac.PAIRS[name]
    settings = ServerSettings(target="m/target", draft="m/eagle")
    argv_p, env_p = ac.server_argv(pair, "path", settings, 32000)
    argv_s, env_s = ac.server_argv(pair, "sglang", settings, 32010)
    assert [a for a in argv_p if a not in ("32000", "32500")] == [a for a in argv_s if a not in ("32010", "32510")]
    for key, value in env_path.items():
        assert env_p[key] == value and env_s.get(key) != value
    for key, value in env_sglang.items():
        assert env_s[key] == value and env_p.get(key) != value
    for key, value in shared.items():
        assert env_s[key] == value == env_p[key]
    # Neither arm may fall back on the plugin's default decode setting: both name theirs.
    assert D in env_p and D in env_s
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    parsed = parser.parse_args(argv_p[argv_p.index("--model-path"):])
    assert parsed.attention_backend == backend and parsed.enable_deterministic_inference
    assert (parsed.speculative_algorithm == "EAGLE") is spec


def _run(pair, arm, rnd, itl, tput=100.0, prompt=128, conc=8):
    return {"pair": pair, "arm": arm, "round": rnd, "prompt_len": prompt, "concurrency": conc, "mean_itl_ms": itl,
            "output_throughput": tput}


def test_summary_pairs_runs_within_a_round_and_takes_medians():
    pair = ac.PAIRS["fa3_tree_nodes"]
    runs = [_run(pair.name, "sglang", 1, 10.0), _run(pair.name, "path", 1, 11.0),
            _run(pair.name, "sglang", 2, 20.0), _run(pair.name, "path", 2, 21.0),
            _run(pair.name, "path", 3, 99.0),  # a round without its reference does not count
            _run(pair.name, "sglang", 1, 5.0, conc=1)]
    row = ac.summarize(runs, pair, 128, 8)
    assert row["rounds"] == 2 and row["itl_ms"] == 16.0 and row["itl_ms_sglang"] == 15.0
    assert row["ratio_min"] == pytest.approx(1.05) and row["ratio_max"] == pytest.approx(1.1)
    assert row["ratio"] == pytest.approx(1.075)
    assert {"backend", "path", "concurrency", "prompt_len", "itl_ms", "itl_ms_sglang"} <= set(row)
    assert ac.summarize(runs, pair, 128, 1) is None
    # A run whose result has no mean_itl_ms (recorded as None) or that failed (no key) does not count.
    runs += [_run(pair.name, "sglang", 4, None), _run(pair.name, "path", 4, 9.0), _run(pair.name, "path", 2, None)]
    runs[-1].pop("mean_itl_ms")
    assert ac.summarize(runs, pair, 128, 8)["rounds"] == 2


def test_bad_arguments_are_named(capsys):
    for flag in ("--alternations", "--rounds"):  # the name serving_run.py uses, and the older one
        assert ac.main(["--out", "o", "--models", "m", flag, "0", "--dry-run"]) == 2
        assert "--alternations (--rounds) must lie in [1, 20]" in capsys.readouterr().err
    assert ac.main(["--out", "o", "--models", "m", "--prompt-lens", "0", "--dry-run"]) == 2
    assert "prompt_lens values must lie in" in capsys.readouterr().err


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
