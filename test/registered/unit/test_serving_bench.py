"""CPU-side logic of the end-to-end serving benchmark (benchmark/serving): arguments, commands, models, reports."""

import argparse
import collections
import gzip
import json
import os
import sys
import time
from pathlib import Path

import pytest
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=420, suite="detspec-unit-cpu")

BENCH = Path(__file__).resolve().parents[3] / "benchmark" / "serving"
sys.path.insert(0, str(BENCH))

import serving_configs as cfg  # noqa: E402
import serving_models as models  # noqa: E402
import serving_report as report  # noqa: E402
import serving_run as run  # noqa: E402
import serving_trace as trace  # noqa: E402
import serving_breakdown as bd  # noqa: E402
import serving_interleave as inter  # noqa: E402
import serving_kernels as sk  # noqa: E402


@pytest.fixture(autouse=True)
def _no_gpu_memory(monkeypatch):
    """Validates as on a machine whose GPU memory is unknown (test_gpu_fit.py fits servers to given cards)."""
    monkeypatch.setattr(run, "gpu_memory_gib", lambda: None)


# -- configurations and command lines -------------------------------------------------


def _flag(argv, name):
    return argv[argv.index(name) + 1]


def test_nineteen_configurations_have_the_issue_flags():
    assert "".join(sorted(cfg.CONFIGS)) == "abcdefghijklmnopqrs"
    s = cfg.ServerSettings(target="/m/target", draft="/m/eagle")
    cmds = {k: cfg.server_command(c, s, port=31000) for k, c in cfg.CONFIGS.items()}
    det = {k for k, c in cmds.items() if "--enable-deterministic-inference" in c}
    rej = {k for k, c in cmds.items() if "--speculative-use-rejection-sampling" in c}
    spec = {k for k, c in cmds.items() if "--speculative-algorithm" in c}
    assert det == set("bcdefhijlmnopqs") and rej == set("abchr") and spec == set("abcdehijklmnopqrs")
    # The deep pair: the chains of (d) and (a) at 5 steps and 6 draft tokens, everything else theirs.
    for key, base in (("q", "d"), ("r", "a")):
        expected = list(cmds[base])
        expected[expected.index("--speculative-num-steps") + 1] = "5"
        expected[expected.index("--speculative-num-draft-tokens") + 1] = "6"
        assert cmds[key] == expected and cfg.CONFIGS[key].env == cfg.CONFIGS[base].env, key
    assert sorted(cmds["l"]) == sorted([*cmds["d"], "--speculative-adaptive"])
    assert cmds["k"] == [a for a in cmds["e"] if a != "--enable-deterministic-inference"] and not cfg.CONFIGS["k"].env
    assert dict(cfg.CONFIGS["n"].env) == {"SGLANG_DETSPEC_VERIFY": "coupled", "SGLANG_DETSPEC_DECODE_ATTENTION": "sglang"}
    assert cmds["n"] == cmds["d"]
    # Every tree configuration names all four tree settings, so an FA3 tree default never changes what it runs.
    from sglang_detspec.config import (TREE_SETTING_ENVS, DetSpecConfig, env_settings, logits_guarantee,
                                       with_server_defaults)

    stated = {"e": ("cascade", "split", 0, 0), "i": ("cascade", "split", 0, 0), "j": ("nodes", "sglang", 0, 0),
              "m": ("cascade", "split", 16, 0), "o": ("nodes", "sglang", 16, 0), "p": ("nodes", "sglang", 16, 12288),
              "s": ("nodes", "sglang", 48, 12288)}

    def served(env, tree=cfg.TREE):  # the bag an 8B-shape FA3 server (head size 128) resolves with this env
        args = dict(zip(tree[::2], tree[1::2]))
        bag = DetSpecConfig(**env_settings(env), deterministic=True, algorithm="EAGLE",
                            num_steps=int(args["--speculative-num-steps"]), eagle_topk=int(args["--speculative-eagle-topk"]),
                            num_draft_tokens=int(args["--speculative-num-draft-tokens"]), attention_backend="fa3",
                            head_dim=128, page_size=1, model_family="dense")
        bag = with_server_defaults(bag)
        return bag.tree_attention, bag.decode_attention, bag.tree_chain_batch, bag.tree_chain_tokens

    for key, values in stated.items():
        env = dict(cfg.CONFIGS[key].env)
        assert set(TREE_SETTING_ENVS.values()) <= set(env) and env["SGLANG_DETSPEC_VERIFY"] == "coupled", key
        assert served(env, {"i": cfg.WIDE_TREE, "s": cfg.NARROW_TREE}.get(key, cfg.TREE)) == values, key
        if key not in "eis":  # the tree variants differ from (e) in their environment only
            assert cmds[key] == cmds["e"], key
    # (s) is (p)'s server with a narrower tree and a higher batch bound.
    narrow = list(cmds["e"])
    narrow[narrow.index("--speculative-eagle-topk") + 1] = "2"
    narrow[narrow.index("--speculative-num-draft-tokens") + 1] = "6"
    assert cmds["s"] == narrow
    # (p) is what such a server runs with no tree setting named: the FA3 tree default.
    assert served({"SGLANG_DETSPEC_VERIFY": "coupled"}) == stated["p"]
    o_env = dict(cfg.CONFIGS["o"].env)
    assert logits_guarantee("fa3", 4, o_env["SGLANG_DETSPEC_TREE_ATTENTION"], o_env["SGLANG_DETSPEC_DECODE_ATTENTION"],
                            head_dim=128) == "bitwise"
    assert _flag(cmds["e"], "--speculative-eagle-topk") == "4" and _flag(cmds["e"], "--speculative-num-draft-tokens") == "8"
    assert _flag(cmds["i"], "--speculative-num-steps") == "5" and _flag(cmds["i"], "--speculative-num-draft-tokens") == "16"
    for k in "abcdh":
        assert _flag(cmds[k], "--speculative-num-steps") == "3" and _flag(cmds[k], "--speculative-eagle-topk") == "1"
        assert _flag(cmds[k], "--speculative-draft-model-path") == "/m/eagle"
    assert dict(cfg.CONFIGS["b"].env) == {"SGLANG_DETSPEC_DISABLE": "1"}
    assert dict(cfg.CONFIGS["d"].env)["SGLANG_DETSPEC_VERIFY"] == "coupled"
    assert dict(cfg.CONFIGS["h"].env)["SGLANG_DETSPEC_VERIFY"] == "coupled"
    for c in cmds.values():
        # fa3 by default (was triton before the GPU kit carried SGLang's FA3): what deterministic mode picks on Hopper.
        assert c[1:3] == ["-m", "sglang.launch_server"] and _flag(c, "--attention-backend") == "fa3"
        assert _flag(c, "--max-total-tokens") == "65536" and "--skip-tokenizer-init" not in c


def test_server_command_parses_with_sglang_own_parser():
    """The flags exist in SGLang 0.5.23's server argument parser (the real one)."""
    from sglang.srt.server_args import ServerArgs

    s = cfg.ServerSettings(target="/m/target", draft="/m/eagle")
    for key in ("a", "e", "f"):
        argv = cfg.server_command(cfg.CONFIGS[key], s, port=31000, tp_size=2)[3:] + ["--nccl-port", "31100"]
        parser = argparse.ArgumentParser()
        ServerArgs.add_cli_args(parser)
        ns = parser.parse_args(argv)
        assert ns.max_total_tokens == 65536 and ns.nccl_port == 31100 and ns.tp_size == 2
        assert ns.cuda_graph_max_bs_decode == 128 and ns.max_running_requests == 128


def test_server_command_rejects_bad_arguments():
    s = cfg.ServerSettings(target="t", draft="d")
    with pytest.raises(ValueError, match="port"):
        cfg.server_command(cfg.CONFIGS["a"], s, port=80)
    with pytest.raises(ValueError, match="tp_size"):
        cfg.server_command(cfg.CONFIGS["a"], s, port=31000, tp_size=0)
    with pytest.raises(ValueError, match="mem_fraction_static"):
        cfg.ServerSettings(target="t", draft="d", mem_fraction_static=1.5)
    with pytest.raises(ValueError, match="max_total_tokens"):
        cfg.ServerSettings(target="t", draft="d", max_total_tokens=10)


def test_bench_args_parse_with_bench_serving_own_parser(tmp_path):
    """The bench_serving arguments are accepted by sglang.bench_serving's real CLI parser."""
    import sglang.benchmark.serving as serving

    load = cfg.LoadSettings()
    argv = cfg.bench_args("http://127.0.0.1:31000", "/m/target", 32, load, output_file=str(tmp_path / "o.jsonl"),
                          tag="x", profile_dir=str(tmp_path), profile_steps=6)
    captured = {}

    def fake_run(ns):
        captured["ns"] = ns

    saved = sys.argv, serving.run_benchmark
    sys.argv, serving.run_benchmark = ["bench_serving", *argv], fake_run
    try:
        serving.cli_main()
    finally:
        sys.argv, serving.run_benchmark = saved
    ns = captured["ns"]
    assert ns.model == ns.tokenizer == "/m/target"
    assert ns.dataset_name == "random-ids" and ns.tokenize_prompt and ns.backend == "sglang"
    assert ns.max_concurrency == 32 and ns.num_prompts == 64 and ns.random_range_ratio == 1.0
    assert ns.random_input_len == 128 and ns.random_output_len == 128 and ns.temperature == 1.0
    assert ns.profile and ns.profile_by_stage and ns.profile_num_steps == 6
    assert not ns.disable_ignore_eos  # fixed output length


def test_load_settings_and_prompt_counts():
    load = cfg.LoadSettings(rounds=2, min_prompts=4)
    assert [load.prompts_for(c) for c in (1, 8, 32, 128)] == [4, 16, 64, 256]
    with pytest.raises(ValueError, match="input_len"):
        cfg.LoadSettings(input_len=0)
    with pytest.raises(ValueError, match="temperature"):
        cfg.LoadSettings(temperature=float("nan"))
    with pytest.raises(ValueError, match="concurrency"):
        load.prompts_for(0)


def test_parse_keys_and_int_lists():
    assert cfg.parse_keys("b,d,c") == ["b", "d", "c"]
    with pytest.raises(ValueError, match="unknown"):
        cfg.parse_keys("bz")
    with pytest.raises(ValueError, match="repeated"):
        cfg.parse_keys("bb")
    assert cfg.parse_int_list("1,8,32,128", "concurrency") == [1, 8, 32, 128]
    with pytest.raises(ValueError, match=r"concurrency values must lie in \[1, 4096\]"):
        cfg.parse_int_list("0,8", "concurrency")
    with pytest.raises(ValueError, match="integers"):
        cfg.parse_int_list("1,x", "concurrency")


def test_attention_backend_flag_defaults_to_fa3_and_takes_triton(capsys):
    s = cfg.ServerSettings(target="/m/target", draft="/m/eagle")
    assert _flag(cfg.server_command(cfg.CONFIGS["d"], s, port=31000), "--attention-backend") == "fa3"
    triton = cfg.ServerSettings(target="/m/target", draft="/m/eagle", attention_backend="triton")
    argv = cfg.server_command(cfg.CONFIGS["g"], triton, port=31000)
    assert _flag(argv, "--attention-backend") == "triton" and argv.count("--attention-backend") == 1
    with pytest.raises(ValueError, match="attention_backend"):
        cfg.ServerSettings(target="t", draft="d", attention_backend="flashinfer")
    plan = run.validate(_args("--attention-backend", "triton"))
    assert plan["settings"].attention_backend == "triton"
    with pytest.raises(SystemExit):
        run.build_parser().parse_args(["--out", "x", "--models", "m", "--attention-backend", "fa4"])
    assert run.main(["--out", "x", "--models", "m", "--dry-run", "--gpus", "1", "--configs", "bd",
                     "--profile", "", "--attention-backend", "triton"]) == 0
    assert capsys.readouterr().out.count("--attention-backend triton") == 2


def test_both_attention_backends_parse_with_sglang_own_parser():
    from sglang.srt.server_args import ServerArgs

    for backend in cfg.ATTENTION_BACKENDS:
        s = cfg.ServerSettings(target="/m/target", draft="/m/eagle", attention_backend=backend)
        parser = argparse.ArgumentParser()
        ServerArgs.add_cli_args(parser)
        assert parser.parse_args(cfg.server_command(cfg.CONFIGS["e"], s, port=31000)[3:]).attention_backend == backend


# -- repetitions: prompt counts, valid runs, warm-ups ------------------------------------


def test_first_run_prompt_counts_follow_the_rule():
    """max(rounds x c, min_prompts, 64 from c = 8 up), in full waves of c."""
    rep, load = cfg.RepeatSettings(), cfg.LoadSettings()
    assert [rep.start_prompts(load, c) for c in (1, 8, 32, 128)] == [4, 64, 64, 256]
    assert rep.start_prompts(load, 12) == 72  # 64 raised to full waves of 12
    assert rep.start_prompts(cfg.LoadSettings(min_prompts=20), 1) == 20
    assert rep.start_prompts(cfg.LoadSettings(rounds=3), 32) == 96
    assert cfg.RepeatSettings.single().start_prompts(load, 8) == load.prompts_for(8) == 16


def test_short_run_scales_the_prompt_count_to_full_waves():
    rep = cfg.RepeatSettings()  # min_seconds 8, margin 1.25: aim at 10 s
    assert rep.next_prompts(4, 1.8, 1) == 23  # 4 x 10 / 1.8 = 22.2 -> 23
    assert rep.next_prompts(64, 7.35, 8) == 88  # 87.1 -> 11 waves of 8
    assert rep.next_prompts(256, 7.9, 128) == 384  # 324 -> 3 waves of 128
    assert rep.next_prompts(64, 9.9, 32) == 96  # at least one more wave
    assert rep.next_prompts(72, 1e-6, 24) == 19992  # max_prompts 20000, in full waves of 24
    for bad in (0.0, -1.0, float("nan"), None, True):
        with pytest.raises(ValueError, match="duration_s"):
            rep.next_prompts(64, bad, 32)
    with pytest.raises(ValueError, match="concurrency"):
        rep.next_prompts(64, 2.0, 0)
    assert rep.is_valid(8.0) and not rep.is_valid(7.99) and not rep.is_valid(None) and not rep.is_valid(float("inf"))
    assert cfg.RepeatSettings(min_seconds=0).is_valid(0.01)
    for kwargs, name in (({"repeats": 0}, "repeats"), ({"min_seconds": -1}, "min_seconds"),
                         ({"repeats": 3, "max_attempts": 2}, "max_attempts"), ({"max_cell_s": 0}, "max_cell_s"),
                         ({"margin": 0.5}, "margin")):
        with pytest.raises(ValueError, match=name):
            cfg.RepeatSettings(**kwargs)


def _run(prompts, duration, wall, valid):
    return {"num_prompts": prompts, "duration_s": duration, "wall_s": wall, "valid": valid}


def test_next_attempt_repeats_scales_and_stops():
    rep = cfg.RepeatSettings()  # 2 valid, 4 attempts, 60 s per cell
    nxt = lambda runs, elapsed=0.0, left=500.0: rep.next_attempt(runs, 4, 1, cell_elapsed_s=elapsed, time_left_s=left)
    assert nxt([]) == (4, "")
    short = _run(4, 1.8, 5.3, False)
    assert nxt([short]) == (23, "")  # scaled after a warm-up
    ok = _run(23, 10.3, 12.8, True)
    assert nxt([short, ok]) == (23, "")  # the same count after a valid run
    assert nxt([short, ok, ok]) == (None, "done")
    prompts, why = nxt([short, _run(23, 7.0, 9.0, False), _run(23, 7.5, 9.5, False), ok])
    assert prompts is None and "max_attempts" in why
    # 23 prompts at 0.45 s each plus 3.5 s of overhead: about 14 s, past 60 s after 50 s in the cell.
    prompts, why = nxt([short], elapsed=50.0)
    assert prompts is None and "max_cell_s" in why
    prompts, why = nxt([short], left=10.0)
    assert prompts is None and "left to this server" in why
    assert nxt([], left=3.0)[0] is None


def test_driver_cell_keeps_short_runs_as_warmups_and_counts_valid_ones(tmp_path):
    """measure_cell with a stand-in bench_serving whose duration is 0.45 s per prompt at c = 1."""
    import serving_driver as driver

    clock = {"t": 0.0}
    seen = []

    def fake_run(argv, raw_file):
        n = int(_flag(argv, "--num-prompts"))
        seen.append((n, _flag(argv, "--warmup-requests")))
        clock["t"] += 0.45 * n + 3.0  # duration plus bench_serving's own overhead
        return {"duration": 0.45 * n, "completed": n, "output_throughput": 128 * n / (0.45 * n),
                "concurrency": 0.99, "max_concurrency": 1}

    spec = {"out": str(tmp_path), "key": "b", "name": "spec_sglang_det", "title": "(b) t", "url": "http://x",
            "tokenizer": "/m/target"}
    valid, failed = driver.measure_cell(spec, 1, cfg.LoadSettings(), cfg.RepeatSettings(), deadline=1e9,
                                        run=fake_run, clock=lambda: clock["t"])
    assert (valid, failed) == (2, 0)
    assert seen == [(4, "1"), (23, "0"), (23, "0")]  # bench_serving's warm-up requests on the first run only
    rows = report.load_rows(str(tmp_path / "results.jsonl"))
    assert [(r["rep"], r["num_prompts"], r["valid"], r["warmup"]) for r in rows] == [
        (1, 4, False, True), (2, 23, True, False), (3, 23, True, False)]
    assert rows[0]["duration_s"] == 1.8 and rows[1]["duration_s"] == pytest.approx(10.35)
    assert rows[1]["wall_s"] == pytest.approx(13.35) and rows[1]["measured_concurrency"] == 0.99
    assert report.aggregate(rows)["n"] == 2 and report.aggregate(rows)["warmups"] == 1

    def failing(argv, raw_file):
        raise RuntimeError("connection refused")

    out2 = tmp_path / "failing"
    assert driver.measure_cell({**spec, "out": str(out2)}, 8, cfg.LoadSettings(), cfg.RepeatSettings(),
                               deadline=1e9, run=failing, clock=lambda: 0.0) == (0, 1)
    rows = report.load_rows(str(out2 / "results.jsonl"))
    assert rows[0]["error"] == "RuntimeError: connection refused" and rows[0]["valid"] is False
    assert rows[0]["num_prompts"] == 64 and "run 1 failed" in rows[1]["note"] and rows[1]["valid"] is False


def test_driver_cell_stops_at_the_cell_time_cap(tmp_path):
    import serving_driver as driver

    clock = {"t": 0.0}

    def slow_first(argv, raw_file):  # 64 prompts in 7 s: short, and the scaled run would not fit 20 s
        n = int(_flag(argv, "--num-prompts"))
        clock["t"] += 7.0 * n / 64 + 3.0
        return {"duration": 7.0 * n / 64, "output_throughput": 1000.0}

    spec = {"out": str(tmp_path), "key": "e", "name": "plugin_tree", "title": "(e) t", "url": "http://x",
            "tokenizer": "/m/target"}
    repeat = cfg.RepeatSettings(max_cell_s=20.0)
    assert driver.measure_cell(spec, 8, cfg.LoadSettings(), repeat, deadline=1e9, run=slow_first,
                               clock=lambda: clock["t"]) == (0, 0)
    rows = report.load_rows(str(tmp_path / "results.jsonl"))
    assert len(rows) == 2 and rows[0]["warmup"] and "max_cell_s" in rows[1]["note"]


# -- the orchestrator's plan --------------------------------------------------------------


def _args(*extra):
    return run.build_parser().parse_args(["--out", "x", "--models", "m", *extra])


def test_plan_places_servers_round_robin_with_distinct_ports():
    plan = run.validate(_args())
    servers = run.plan_servers(plan["keys"], 2, plan["settings"], port_base=31000, out="x",
                               profile=plan["profile"], max_conc=128)
    assert [s.key for s in servers] == list("bdeicagfh")
    assert [s.gpu for s in servers] == [0, 1, 0, 1, 0, 1, 0, 1, 0]
    ports = [s.port for s in servers] + [int(_flag(s.argv, "--nccl-port")) for s in servers]
    assert len(set(ports)) == len(ports)
    assert {s.env["CUDA_VISIBLE_DEVICES"] for s in servers} == {"0", "1"}
    profiled = {s.key for s in servers if "SGLANG_PROFILE_BY_STAGE_DECODE_MIN_BS" in s.env}
    assert profiled == {"d", "c"}
    assert dict(servers[0].env)["SGLANG_DETSPEC_DISABLE"] == "1"


def test_validate_rejects_bad_run_arguments():
    with pytest.raises(ValueError, match="profile"):
        run.validate(_args("--configs", "bd", "--profile", "e"))
    with pytest.raises(ValueError, match="max_total_tokens"):
        run.validate(_args("--max-total-tokens", "2048"))
    with pytest.raises(ValueError, match="budget_s"):
        run.validate(_args("--budget-s", "5"))
    with pytest.raises(ValueError, match="max_servers_per_gpu"):
        run.validate(_args("--max-servers-per-gpu", "0"))


def test_repetition_and_profile_options_reach_the_plan():
    plan = run.validate(_args("--repeats", "3", "--min-seconds", "9.5", "--max-attempts", "5",
                              "--cell-timeout-s", "90", "--min-prompts", "20"))
    assert plan["repeat"] == cfg.RepeatSettings(repeats=3, min_seconds=9.5, max_attempts=5, max_cell_s=90.0)
    assert plan["load"].min_prompts == 20 and plan["label"] == "x"
    assert run.validate(_args())["repeat"] == cfg.RepeatSettings()  # 2 runs of >= 8 s by default
    assert run.validate(_args("--configs", "bd"))["profile"] == ["d"]  # the default profile, where configured
    assert run.validate(_args("--configs", "be"))["profile"] == []
    assert run.validate(_args("--configs", "bd", "--profile", ""))["profile"] == []
    with pytest.raises(ValueError, match="max_attempts"):
        run.validate(_args("--repeats", "3", "--max-attempts", "2"))
    with pytest.raises(ValueError, match="cell_timeout_s"):
        run.validate(_args("--cell-timeout-s", "0"))


def test_sleep_on_idle_reaches_every_server_and_sglang_parses_it(capsys):
    """--sleep-on-idle goes to (a) as well as the plugin's servers, as SGLang's own flag, and nowhere by default."""
    from sglang.srt.server_args import ServerArgs

    assert run.main(["--out", "x", "--models", "m", "--dry-run", "--gpus", "1", "--configs", "ad", "--profile", "",
                     "--interleave", "--sleep-on-idle"]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "sglang.launch_server" in ln]
    assert len(lines) == 2 and all(ln.endswith("--sleep-on-idle") or " --sleep-on-idle " in ln for ln in lines)
    plan = run.validate(_args("--sleep-on-idle"))
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    argv = cfg.server_command(cfg.CONFIGS["a"], plan["settings"], port=31000)
    assert parser.parse_args(argv[3:]).sleep_on_idle is True
    assert "--sleep-on-idle" not in cfg.server_command(cfg.CONFIGS["a"], run.validate(_args())["settings"], port=31000)


def test_prefill_graphs_keep_sglangs_default_on_every_server():
    """By default SGLang's prefill graphs stand on every server; --no-prefill-graphs turns them off on all, (a) too."""
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    # Unset on the command line: SGLang resolves its own default (breakable prefill graphs on CUDA).
    assert parser.parse_args(["--model-path", "m"]).cuda_graph_backend_prefill is None
    for key in "ad":
        off = cfg.server_command(cfg.CONFIGS[key], run.validate(_args("--no-prefill-graphs"))["settings"], port=31000)
        on = cfg.server_command(cfg.CONFIGS[key], run.validate(_args())["settings"], port=31000)
        assert cfg.server_command(cfg.CONFIGS[key], run.validate(_args("--prefill-graphs"))["settings"],
                                  port=31000) == on
        assert parser.parse_args(off[3:]).cuda_graph_backend_prefill == "disabled"
        assert parser.parse_args(on[3:]).cuda_graph_backend_prefill is None
        assert [a for a in off if a not in cfg.PREFILL_GRAPHS_OFF] == on


def test_dry_run_prints_every_server_of_the_default_order(capsys):
    assert run.main(["--out", "x", "--models", "m", "--dry-run", "--gpus", "2"]) == 0
    text = capsys.readouterr().out
    assert text.count("sglang.launch_server") == len(cfg.DEFAULT_ORDER) == len(cfg.CONFIGS) - 10 == 9
    # The node path's cost, SGLang's own tree, the adaptive chain and the switching tree: asked for by --configs.
    assert "(j)" not in text and "(k)" not in text and "(l)" not in text and "(m)" not in text and "(s)" not in text


def test_memory_estimate_fits_three_servers_per_h200():
    """Weights plus the fixed KV pool of three servers stay well under one H200's 141 GB."""
    shape = models.EIGHT_B
    weights_gb = 2 * shape.target_params() / 1e9
    assert 15.5 < weights_gb < 16.5  # the common 8B shape
    kv_gb = 65536 * (shape.kv_bytes_per_token() + shape.kv_bytes_per_token(layers=1)) / 1e9
    assert run.build_parser().parse_args(["--out", "x", "--models", "m"]).max_servers_per_gpu == 3
    assert 3 * (weights_gb + 0.5 + kv_gb) < 0.6 * 141


# -- models -------------------------------------------------------------------------------


SMALL = models.ModelShape(hidden=64, layers=3, heads=4, kv_heads=2, intermediate=128, vocab=512)


def test_written_models_have_the_layouts_sglang_loads(tmp_path):
    """Names and shapes match the tiny pair that served on the H200 (scripts/make_tiny_models.py)."""
    import importlib.util

    from safetensors import safe_open

    facts = models.write_models(str(tmp_path), shape=SMALL, accept=0.8, device="cpu", layers_per_shard=2,
                                calibration_tokens=64)
    target = json.load(open(tmp_path / "target" / "config.json"))
    assert target["architectures"] == ["LlamaForCausalLM"] and target["num_key_value_heads"] == 2
    index = json.load(open(tmp_path / "target" / "model.safetensors.index.json"))["weight_map"]
    names = {}
    for shard in set(index.values()):
        with safe_open(str(tmp_path / "target" / shard), "pt") as f:
            for k in f.keys():
                names[k] = tuple(f.get_slice(k).get_shape())
                assert index[k] == shard
    assert names["model.layers.2.self_attn.k_proj.weight"] == (2 * 16, 64)
    assert names["lm_head.weight"] == (512, 64)
    with safe_open(str(tmp_path / "eagle" / "model.safetensors"), "pt") as f:
        eagle = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    assert eagle["fc.weight"] == (64, 128)

    spec = importlib.util.spec_from_file_location("tiny", BENCH.parents[1] / "scripts" / "make_tiny_models.py")
    tiny = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tiny)
    tiny.main(str(tmp_path / "tiny"))
    with safe_open(str(tmp_path / "tiny" / "eagle" / "model.safetensors"), "pt") as f:
        assert set(f.keys()) == set(eagle)
    with safe_open(str(tmp_path / "tiny" / "target" / "model.safetensors"), "pt") as f:
        tiny_names = {k.replace("layers.1.", "layers.X.").replace("layers.0.", "layers.X.") for k in f.keys()}
    ours = {k.replace("layers.2.", "layers.X.").replace("layers.1.", "layers.X.").replace("layers.0.", "layers.X.")
            for k in names}
    assert ours == tiny_names
    assert abs(facts["bigram_accept"] - 0.8) < 0.01


SMALL_MOE = models.ModelShape(hidden=64, layers=2, heads=4, kv_heads=2, intermediate=96, vocab=512, head_size=32,
                              experts=4, experts_per_token=2, moe_intermediate=48)


def test_moe_target_loads_in_transformers_and_sglang_and_stays_near_its_bigram(tmp_path):
    """The Qwen3-MoE writer: Hugging Face's Qwen3-MoE loads every tensor (no missing, unexpected or mismatched
    key), its next-token distribution is the bigram the draft is calibrated on (TV < 0.01), SGLang's
    ModelConfig reads the config, and the EAGLE draft's attention has the target's head size."""
    import torch
    from safetensors import safe_open
    from sglang.srt.configs.model_config import ModelConfig
    from transformers import AutoModelForCausalLM

    facts = models.write_models(str(tmp_path), shape=SMALL_MOE, accept=0.8, device="cpu", layers_per_shard=1,
                                calibration_tokens=64)
    assert facts["architecture"] == "Qwen3MoeForCausalLM" and facts["shape_name"] is None
    model, info = AutoModelForCausalLM.from_pretrained(str(tmp_path / "target"), output_loading_info=True,
                                                       dtype=torch.float32)
    assert type(model).__name__ == "Qwen3MoeForCausalLM"
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    ids = torch.tensor([[5, 17, 300, 42, 511]])
    with torch.no_grad():
        p = torch.softmax(model(ids).logits[0], -1)
        embed, lm_head = model.get_input_embeddings().weight, model.lm_head.weight
        bigram = torch.softmax(embed[ids[0]] @ lm_head.T, -1)
    assert float((p - bigram).abs().sum(-1).max()) / 2 < 0.01
    config = ModelConfig(str(tmp_path / "target"))
    assert config.hf_config.num_experts == 4 and config.head_dim == 32
    with safe_open(str(tmp_path / "eagle" / "model.safetensors"), "pt") as f:
        assert tuple(f.get_slice("layers.0.self_attn.q_proj.weight").get_shape()) == (4 * 32, 64)
    assert abs(facts["bigram_accept"] - 0.8) < 0.01


def test_named_shapes_and_their_bounds():
    assert models.SHAPES["llama-8b"] == models.EIGHT_B and models.shape_name(models.EIGHT_B) == "llama-8b"
    moe = models.SHAPES["qwen3-moe-a3b-24l"]
    assert moe.moe and moe.head_dim == 128 and 30e9 < 2 * moe.target_params() < 32e9  # bf16 bytes: fits 64 GiB
    with pytest.raises(ValueError, match=r"experts_per_token must lie in \[1, 4\]"):
        models.ModelShape(experts=4, experts_per_token=5, moe_intermediate=8)
    with pytest.raises(ValueError, match="head_size must be a non-negative integer, got -1"):
        models.ModelShape(head_size=-1)


def test_a_models_folder_of_another_shape_is_refused(tmp_path):
    (tmp_path / "models.json").write_text(json.dumps({"shape_name": "qwen3-moe-a3b-24l"}))
    args = run.build_parser().parse_args(["--out", str(tmp_path / "o"), "--models", str(tmp_path)])
    with pytest.raises(ValueError, match=r"--models .* holds the qwen3-moe-a3b-24l shape but --shape is llama-8b"):
        run.validate(args)
    args = run.build_parser().parse_args(["--out", str(tmp_path / "o"), "--models", str(tmp_path),
                                          "--shape", "qwen3-moe-a3b-24l"])
    assert run.validate(args)


def test_acceptance_knob_is_calibrated_and_monotone():
    """1 - TV from an independent exact computation (float64 numpy) equals the calibrated acceptance."""
    import numpy as np
    import torch

    gen = torch.Generator().manual_seed(3)
    v, h = 300, 32
    embed = torch.randn(v, h, generator=gen)
    embed /= embed.pow(2).mean(1, keepdim=True).sqrt()
    lm_head = torch.randn(v, h, generator=gen) * (3.0 / h ** 0.5)
    noise = torch.randn(h, h, generator=gen) / h ** 0.5
    tokens = torch.arange(v)
    values = [models.bigram_acceptance(embed, lm_head, noise, e, tokens) for e in (0.0, 0.1, 0.3, 1.0)]
    assert values[0] == pytest.approx(1.0, abs=1e-6) and values == sorted(values, reverse=True)
    eps, achieved = models.calibrate_noise(embed, lm_head, noise, 0.7, tokens)
    assert achieved == pytest.approx(0.7, abs=2e-3)
    e, l, n = (t.double().numpy() for t in (embed, lm_head, noise))
    def softmax(x):
        x = x - x.max(1, keepdims=True)
        return np.exp(x) / np.exp(x).sum(1, keepdims=True)
    p, q = softmax(e @ l.T), softmax((e + eps * e @ n.T) @ l.T)
    assert 1 - 0.5 * np.abs(p - q).sum(1).mean() == pytest.approx(achieved, abs=1e-4)
    with pytest.raises(ValueError, match="accept"):
        models.calibrate_noise(embed, lm_head, noise, 0.01, tokens)
    assert models.chain_accept_length(0.5, 3) == pytest.approx(1.875)
    with pytest.raises(ValueError, match="alpha"):
        models.chain_accept_length(1.5, 3)


def test_tokenizer_loads_with_transformers_and_round_trips(tmp_path):
    from transformers import AutoTokenizer

    models.write_tokenizer(str(tmp_path), 1000)
    (tmp_path / "config.json").write_text(json.dumps(models.llama_config(SMALL, "LlamaForCausalLM", 1)))
    tok = AutoTokenizer.from_pretrained(str(tmp_path))
    assert tok.vocab_size == 1000 and tok.num_special_tokens_to_add() == 0
    ids = [5, 999, 0, 42]
    text = tok.decode(ids)
    assert tok.encode(text, add_special_tokens=False) == ids
    assert all(tok.decode([i]) for i in range(0, 1000, 37))  # every id decodes to non-empty text


def test_model_shape_rejects_bad_dimensions():
    with pytest.raises(ValueError, match="kv_heads"):
        models.ModelShape(heads=32, kv_heads=5)
    with pytest.raises(ValueError, match="hidden"):
        models.ModelShape(hidden=-1)


# -- report and trace summary -------------------------------------------------------------


def _rows():
    rows = []
    for key, tput in (("b", 100.0), ("c", 120.0), ("d", 150.0), ("g", 90.0)):
        for conc in (1, 8):
            rows.append({"key": key, "name": cfg.CONFIGS[key].name, "title": cfg.CONFIGS[key].title,
                         "concurrency": conc, "output_throughput": tput * conc, "mean_itl_ms": 10.0 / tput,
                         "p99_itl_ms": 20.0 / tput, "accept_length": None if key == "g" else 3.2})
    return rows


def test_report_tables_ratios_and_plots(tmp_path):
    rows = _rows()
    meta = {"date_utc": "2026-12-01T00:00:00+00:00", "gpu": "NVIDIA H200", "torch_version": "2.14.1",
            "triton_version": "3.8.0", "sglang_version": "0.5.23"}
    written = report.write_report(rows, meta, str(tmp_path))
    md = Path(written["markdown"]).read_text()
    assert "NVIDIA H200" in md and "2.14.1" in md and "0.5.23" in md
    assert "| (d) EAGLE chain, plugin coupled | 1.500 | 1.500 |" in md  # 150/100 at both concurrencies
    assert "| (c) EAGLE chain, plugin rejection mode | 1.200 | 1.200 |" in md
    assert "(e) c=1" not in md and "Missing measurements" not in md  # (e) absent: no row, not a missing cell
    payload = json.loads(Path(written["json"]).read_text())
    assert payload["ratios_to_b"]["output_throughput"]["d"]["8"] == pytest.approx(1.5)
    assert payload["ratios_to_b"]["output_throughput"]["e"]["1"] is None
    assert len(written["plots"]) == 4
    for p in written["plots"]:
        assert Path(p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_marks_missing_cells_and_skips_truncated_lines(tmp_path):
    rows = _rows()[:-1]  # (g) at c=8 missing
    path = tmp_path / "results.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + '\n{"key": "g", "concurr')
    loaded = report.load_rows(str(path))
    assert len(loaded) == len(rows)
    md = report.markdown(report.index_rows(loaded), {})
    assert "Missing measurements: (g) c=8" in md
    with pytest.raises(ValueError, match="concurrency"):
        report.index_rows([{"key": "b", "concurrency": "8"}])


def _rep_rows(key, conc, values, *, warmup=None, itl=None):
    """Hand-made rows of one cell: a valid run per value of output_throughput, an optional short warm-up first."""
    rows = []
    if warmup is not None:
        rows.append({"key": key, "title": cfg.CONFIGS[key].title, "concurrency": conc, "rep": 1, "valid": False,
                     "warmup": True, "duration_s": 3.0, "output_throughput": warmup})
    for i, v in enumerate(values):
        rows.append({"key": key, "title": cfg.CONFIGS[key].title, "concurrency": conc, "rep": len(rows) + 1,
                     "valid": True, "warmup": False, "duration_s": 9.0 + i, "num_prompts": 64,
                     "output_throughput": v, "mean_itl_ms": (itl or {}).get(i, 1000.0 / v), "max_concurrency": conc})
    return rows


def test_aggregation_takes_median_spread_and_count_of_valid_runs_only():
    rows = _rep_rows("d", 8, [100.0, 130.0, 120.0], warmup=5.0)
    rows.append({"key": "d", "concurrency": 8, "rep": 5, "valid": False, "warmup": False, "error": "boom"})
    cell = report.aggregate(rows)
    assert cell["n"] == 3 and cell["warmups"] == 1 and cell["errors"] == ["boom"]
    assert cell["median"]["output_throughput"] == 120.0  # the warm-up's 5.0 is not counted
    assert (cell["min"]["output_throughput"], cell["max"]["output_throughput"]) == (100.0, 130.0)
    assert cell["median"]["duration_s"] == 10.0 and cell["median"]["num_prompts"] == 64
    assert "max_concurrency" not in cell["median"] and "rep" not in cell["median"]  # settings, not metrics
    two = report.aggregate(_rep_rows("d", 8, [100.0, 130.0]))
    assert two["median"]["output_throughput"] == 115.0  # the mean of the two middle values
    legacy = report.aggregate([{"key": "b", "concurrency": 1, "output_throughput": 7.0}])
    assert legacy["n"] == 1 and legacy["median"]["output_throughput"] == 7.0  # rows from before repetitions


def _two_commands(tmp_path):
    """Folders of two commands: (b) in each, (d) only in the first, (e) and (c) only in the second."""
    first = {"label": "cmd1", "configs": {"b": {}, "d": {}}, "concurrencies": [1, 8], "repeats": 2,
             "min_seconds": 8.0, "attention_backend": "fa3", "gpu": "NVIDIA H200"}
    second = {"label": "cmd2", "configs": {"b": {}, "e": {}, "c": {}, "g": {}}, "concurrencies": [1, 8],
              "repeats": 2, "min_seconds": 8.0, "attention_backend": "fa3", "gpu": "NVIDIA H200",
              "failures": {"g": {"why": "not healthy within 330 s"}}}
    rows1 = (_rep_rows("b", 1, [100.0, 110.0]) + _rep_rows("b", 8, [400.0, 440.0])
             + _rep_rows("d", 1, [150.0, 160.0], warmup=9.0) + _rep_rows("d", 8, [600.0, 660.0]))
    rows2 = (_rep_rows("b", 1, [200.0, 220.0]) + _rep_rows("e", 1, [300.0, 330.0]) + _rep_rows("e", 8, [900.0])
             + [{"key": "e", "concurrency": 8, "valid": False, "note": "1 valid run(s) of 2: max_cell_s"}]
             + _rep_rows("c", 1, [210.0, 231.0]) + _rep_rows("c", 8, [500.0, 520.0])
             + _rep_rows("b", 8, [], warmup=50.0)
             + [{"key": "b", "concurrency": 8, "valid": False, "note": "0 valid run(s) of 2: 3 s left"}])
    dirs = []
    for name, meta, rows in (("one", first, rows1), ("two", second, rows2)):
        d = tmp_path / name
        d.mkdir()
        (d / "meta.json").write_text(json.dumps(meta))
        (d / "results.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
        dirs.append(d)
    return dirs


def test_ratios_are_taken_within_the_command_that_measured_both(tmp_path):
    one, two = _two_commands(tmp_path)
    summary = report.summarize([report.load_command(str(one)), report.load_command(str(two))])
    assert summary["labels"] == ["cmd1", "cmd2"]
    d1 = summary["ratios"]["cmd1"]["output_throughput"]["d"][1]
    assert d1["ratio"] == pytest.approx(155.0 / 105.0)  # against cmd1's (b), never cmd2's
    assert (d1["min"], d1["max"]) == (pytest.approx(150.0 / 110.0), pytest.approx(160.0 / 100.0))
    assert (d1["n"], d1["n_b"]) == (2, 2)
    e1 = summary["ratios"]["cmd2"]["output_throughput"]["e"][1]
    assert e1["ratio"] == pytest.approx(1.5) and e1["min"] == pytest.approx(300.0 / 220.0)
    assert summary["ratios"]["cmd2"]["output_throughput"]["e"][8] is None  # cmd2's (b) at c=8: warm-up only
    assert summary["ratios"]["cmd2"]["output_throughput"]["d"][1] is None  # (d) not in cmd2
    itl = summary["ratios"]["cmd1"]["mean_itl_ms"]["d"][8]
    assert itl["ratio"] == pytest.approx((1000 / 600 + 1000 / 660) / (1000 / 400 + 1000 / 440))
    assert ("cmd2", "e", 8) in summary["no_reference"] and ("cmd2", "c", 8) in summary["no_reference"]
    md = report.render_markdown(summary)
    assert "| (d) EAGLE chain, plugin coupled [cmd1] | 1.476 | 1.500 |" in md
    assert "| (e) EAGLE tree topk 4 / 8 tokens, plugin coupled [cmd2] | 1.500 | - |" in md
    assert "1.364–1.600 (n=2/2)" in md  # the range of (d)'s ratio at c=1
    assert "(d) EAGLE chain, plugin coupled [cmd2]" not in md


def test_fewer_repetitions_and_missing_cells_are_listed_with_reasons(tmp_path):
    one, two = _two_commands(tmp_path)
    summary = report.summarize([report.load_command(str(one)), report.load_command(str(two))])
    fewer = [(lab, k, c, n) for lab, k, c, n, _, _ in summary["fewer"]]
    assert fewer == [("cmd2", "e", 8, 1)]
    missing = {(lab, k, c): why for lab, k, c, why in summary["missing"]}
    assert set(missing) == {("cmd2", "b", 8), ("cmd2", "g", 1), ("cmd2", "g", 8)}
    assert "0 valid run(s) of 2: 3 s left" in missing[("cmd2", "b", 8)]
    assert any("warm-up" in why for why in missing[("cmd2", "b", 8)])
    assert missing[("cmd2", "g", 1)] == ["server failed: not healthy within 330 s"]
    md = report.render_markdown(summary)
    assert "Cells with fewer than 2 valid repetitions: (e) c=8 [cmd2] (n=1 of 2; 1 valid run(s) of 2: max_cell_s)" in md
    assert "Missing measurements: (b) c=8 [cmd2] (0 valid run(s) of 2: 3 s left;" in md
    assert "(g) c=1 [cmd2] (server failed: not healthy within 330 s)" in md
    assert "(d) c=1 [cmd1]" not in md.split("Cells with fewer")[1]  # a warm-up and two valid runs: complete


def test_report_merges_two_result_folders(tmp_path, capsys):
    one, two = _two_commands(tmp_path)
    merged = tmp_path / "merged"
    assert report.main([str(one), str(two), "--out", str(merged), "--no-plots"]) == 0
    md = (merged / "serving.md").read_text()
    assert "Merged from 2 commands" in md and "command `cmd1` (configurations measured: bd)" in md
    assert "command `cmd2` (configurations measured: bce)" in md and md.count("attention backend: fa3") == 2
    assert "| (b) EAGLE chain, rejection, SGLang deterministic (plugin off) [cmd1] | 105.0 (100.0–110.0, n=2) |" in md
    assert "| (b) EAGLE chain, rejection, SGLang deterministic (plugin off) [cmd2] | 210.0 (200.0–220.0, n=2) |" in md
    payload = json.loads((merged / "serving.json").read_text())
    assert set(payload["commands"]) == {"cmd1", "cmd2"}
    assert {r["measured_by"] for r in payload["rows"]} == {"cmd1", "cmd2"}
    assert payload["ratios_to_b"]["output_throughput"]["d"]["1"] == pytest.approx(155.0 / 105.0)
    assert payload["ratio_ranges_to_b"]["cmd2"]["output_throughput"]["e"]["1"]["ratio"] == pytest.approx(1.5)
    cell = next(c for c in payload["cells"] if (c["measured_by"], c["key"], c["concurrency"]) == ("cmd1", "d", 1))
    assert cell["n"] == 2 and cell["warmups"] == 1 and cell["median"]["output_throughput"] == 155.0
    assert {(m["measured_by"], m["key"], m["concurrency"]) for m in payload["missing"]} == {
        ("cmd2", "b", 8), ("cmd2", "g", 1), ("cmd2", "g", 8)}
    with pytest.raises(SystemExit):
        report.main([str(one), str(two)])  # merging needs --out: no command's own report is overwritten
    assert "out: required" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        report.main([str(tmp_path / "nothing-here")])


def _trace(tmp_path):
    """A Chrome trace shaped like torch.profiler's: kernels, their launches, Python frames."""
    ev = []
    def kernel(name, ts, dur, corr):
        ev.append({"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": 7,
                   "args": {"correlation": corr}})
    def launch(ts, corr):
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": ts, "dur": 2, "pid": 1,
                   "tid": 1, "args": {"correlation": corr}})
    def frame(name, ts, dur):
        ev.append({"ph": "X", "cat": "python_function", "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": 1})
    frame("sglang/srt/speculative/eagle_utils.py(521): eagle_sample", 100, 100)
    frame("torch/nn/modules/module.py(1): _call_impl", 110, 20)
    launch(120, 1)   # inside the sampling frame (nested)
    launch(150, 2)   # inside the sampling frame
    launch(300, 3)   # outside: graph replay
    # SGLang's verify wraps the target forward: the model frame inside it decides.
    frame("sglang/srt/speculative/eagle_worker_v2.py(1979): verify", 400, 100)
    frame("sglang_detspec/sglang_plugin/verify_hook.py(122): seeded_chain_sampling", 405, 90)
    frame("sglang/srt/model_executor/model_runner.py(1813): forward", 410, 30)
    launch(420, 4)   # model forward inside a sampler frame: model work
    launch(460, 5)   # the plugin's frame, no model frame inside: sampler work
    # A sampler frame inside a model frame (a sampler called from the forward): sampler work.
    frame("sglang/srt/model_executor/model_runner.py(1813): forward", 600, 100)
    frame("sglang/srt/layers/sampler.py(90): forward", 610, 50)
    launch(620, 6)
    kernel("elementwise_kernel", 1000, 30.0, 1)
    kernel("_race_argmax_kernel", 1040, 10.0, 2)
    kernel("fused_moe_or_gemm", 1060, 900.0, 3)
    kernel("attention_kernel", 1960, 40.0, 4)
    kernel("index_kernel", 2000, 10.0, 5)
    kernel("sort_kernel", 2010, 10.0, 6)
    path = tmp_path / "t.trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": ev}, f)
    return str(path)


def test_trace_summary_attributes_by_stack_and_name(tmp_path):
    s = trace.summarize(trace.load_events(_trace(tmp_path)), steps=2)
    assert s["kernel_us"] == 1000.0
    assert s["by_stack_us"] == 60.0 and s["by_name_us"] == 10.0 and s["union_us"] == 60.0
    assert s["share_union"] == pytest.approx(0.06)
    assert s["span_us"] == 1020.0 and s["step_us"] == 510.0
    text = trace.render(s, "title")
    assert "6.00%" in text and "_race_argmax_kernel" in text
    with pytest.raises(ValueError, match="steps"):
        trace.summarize([], steps=0)
    with pytest.raises(ValueError, match="no GPU kernel"):
        trace.summarize([{"ph": "X", "cat": "cpu_op", "ts": 0, "dur": 1}])


# -- the driver against a stand-in server ---------------------------------------------------


def _stand_in_server():
    """A local HTTP server speaking the part of SGLang's protocol bench_serving uses.

    Not SGLang (which needs a GPU): it streams ``/generate`` the way SGLang's HTTP server
    does (``data: {json}`` lines with the cumulative ``text`` and ``meta_info``, then
    ``data: [DONE]``) and answers ``/server_info``, so the driver and the real
    ``sglang.bench_serving`` client code run end to end.
    """
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _json(self, payload):
            body = json.dumps(payload).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            if self.path.startswith("/server_info"):
                self._json({"internal_states": [{"avg_spec_accept_length": 3.25}]})
            else:
                self._json({"model_path": "stand-in"})

        def do_POST(self):
            request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            n = request["sampling_params"]["max_new_tokens"]
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for k in range(1, n + 1):
                chunk = {"text": " ".join(f"w{i}" for i in range(k)), "output_ids": list(range(k)),
                         "meta_info": {"completion_tokens": k, "prompt_tokens": len(request["input_ids"])}}
                self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                self.wfile.flush()
            self.wfile.write(b"data: [DONE]\n\n")

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_driver_runs_bench_serving_per_level_and_appends_rows(tmp_path):
    import subprocess

    tok = tmp_path / "tok"
    tok.mkdir()
    models.write_tokenizer(str(tok), 1000)
    (tok / "config.json").write_text(json.dumps(models.llama_config(SMALL, "LlamaForCausalLM", 1)))
    server = _stand_in_server()
    try:
        spec = {"url": f"http://127.0.0.1:{server.server_address[1]}", "tokenizer": str(tok), "out": str(tmp_path),
                "key": "d", "name": "plugin_coupled", "title": "(d) test", "concurrencies": [1, 4],
                "load": {"input_len": 8, "output_len": 6, "rounds": 1, "min_prompts": 2}}
        done = subprocess.run([sys.executable, str(BENCH / "serving_driver.py"), "--spec", json.dumps(spec)],
                              capture_output=True, text=True, timeout=300)
    finally:
        server.shutdown()
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    rows = report.load_rows(str(tmp_path / "results.jsonl"))
    assert [r["concurrency"] for r in rows] == [1, 4]
    for r, prompts in zip(rows, (2, 4)):
        assert r["key"] == "d" and r["completed"] == prompts == r["num_prompts"]
        assert r["total_output_tokens"] == 6 * prompts and r["output_throughput"] > 0
        assert r["accept_length"] == 3.25 and r["mean_itl_ms"] > 0 and r["max_concurrency"] == r["concurrency"]
        assert 0 < r["measured_concurrency"] <= r["concurrency"]
        assert "-m sglang.bench_serving" in r["command"] and "--max-concurrency" in r["command"]
        assert r["rep"] == 1 and r["valid"] is True and r["warmup"] is False and r["duration_s"] > 0
    written = report.write_report(rows, {}, str(tmp_path / "report"), with_plots=False)
    assert "(d) test" in Path(written["markdown"]).read_text()


STAND_IN_SCRIPT = '''
import http.server, json, sys
class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def _json(self, p):
        b = json.dumps(p).encode(); self.send_response(200); self.send_header("Content-Length", str(len(b)))
        self.end_headers(); self.wfile.write(b)
    def do_GET(self):
        self._json({"internal_states": [{"avg_spec_accept_length": 2.5}]} if self.path.startswith("/server_info") else {})
    def do_POST(self):
        r = json.loads(self.rfile.read(int(self.headers["Content-Length"]))); n = r["sampling_params"]["max_new_tokens"]
        self.send_response(200); self.end_headers()
        for k in range(1, n + 1):
            c = {"text": " ".join("w1" for _ in range(k)), "meta_info": {"completion_tokens": k}}
            self.wfile.write(b"data: " + json.dumps(c).encode() + b"\\n\\n"); self.wfile.flush()
        self.wfile.write(b"data: [DONE]\\n\\n")
if sys.argv[2] == "fail":
    sys.exit("stand-in: failing on purpose")
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
'''


def _stand_in_servers(tmp_path, monkeypatch, script_text, *, failing="", extra_argv=()):
    """A models folder (the target's tokenizer and config) and serving_run's server command replaced by
    ``script_text`` run as a server: argv port, "fail" for the config keys in ``failing`` else "ok", then
    ``extra_argv``. Returns the models folder and the config keys launched, in order."""
    script = tmp_path / "stand_in.py"
    script.write_text(script_text)
    model_dir = tmp_path / "models"
    (model_dir / "target").mkdir(parents=True)
    models.write_tokenizer(str(model_dir / "target"), 1000)
    (model_dir / "target" / "config.json").write_text(json.dumps(models.llama_config(SMALL, "LlamaForCausalLM", 1)))
    (model_dir / "models.json").write_text(json.dumps({"stand_in": True}))
    launched = []

    def stand_in_command(config, settings, *, port, **kwargs):
        launched.append(config.key)
        return [sys.executable, str(script), str(port), "fail" if config.key in failing else "ok", *extra_argv]

    monkeypatch.setattr(run, "server_command", stand_in_command)
    return model_dir, launched


def test_orchestrator_measures_ready_servers_one_at_a_time_and_reports(tmp_path, monkeypatch):
    """serving_run's schedule end to end with stand-in servers: one healthy, one that dies at start."""
    model_dir, _ = _stand_in_servers(tmp_path, monkeypatch, STAND_IN_SCRIPT, failing="g")
    out = tmp_path / "out"
    # One run per cell, every run valid: the stand-in answers in milliseconds, so a minimum duration would
    # only make the runs long (repetitions are tested with a fake bench_serving below).
    rc = run.main(["--out", str(out), "--models", str(model_dir), "--configs", "dg", "--profile", "",
                   "--concurrency", "1,2", "--input-len", "8", "--output-len", "4", "--rounds", "1",
                   "--max-total-tokens", "1024", "--gpus", "2", "--budget-s", "400", "--port-base", "34000",
                   "--repeats", "1", "--min-seconds", "0"])
    assert rc == 1  # (g) failed
    meta = json.loads((out / "meta.json").read_text())
    assert meta["server_states"] == {"d": "done", "g": "failed"}
    assert "failing on purpose" in meta["failures"]["g"]["log_tail"]
    rows = report.load_rows(str(out / "results.jsonl"))
    assert [(r["key"], r["concurrency"]) for r in rows] == [("d", 1), ("d", 2)]
    assert all(r["rep"] == 1 and r["valid"] is True and r["duration_s"] > 0 for r in rows)
    assert meta["attention_backend"] == "fa3" and meta["repeat"]["repeats"] == 1 and meta["label"] == "out"
    md = (out / "serving.md").read_text()
    assert "(d) EAGLE chain, plugin coupled" in md and "2.50" in md
    assert "(g) c=1 (server failed: exited" in md  # the missing cells say why


# -- kernel classes of decode / verify steps (serving_kernels.py) ------------------------------

# Kernel names as the profiler records them (CUDA-graph replays: no frames, only these names).
DEEP_GEMM = ("void deep_gemm::sm90_bf16_gemm_impl<(cute::UMMA::Major)0, (cute::UMMA::Major)0, 0u, 0u, 0u, 1u, 128u, "
             "128u, 64u, 128u, 128u, 128u, 6u, 128u, 256u, 1u, false, 132u, (deep_gemm::GemmType)0, false, "
             "cutlass::bfloat16_t>(int*, unsigned int, unsigned int, unsigned int, CUtensorMap_st, CUtensorMap_st)")
TRITON_MM = "matmul_kernel_persistent"
NVJET = "nvjet_tst_64x8_64x16_4x1_v_bz_splitK_TNT"
SPLITK = ("void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16, float, __nv_bfloat16, true, false, "
          "false>(cublasLt::cublasSplitKParams<float>, float const*, __nv_bfloat16 const*, __nv_bfloat16*)")
XMMA = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel"
FA3 = ("void cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<"
       "flash::CollectiveMainloopFwdSm90<2, cute::tuple<cute::C<1>, cute::C<1>, cute::C<1> >, "
       "cute::tuple<cute::C<128>, cute::C<176>, cute::C<128> >, "
       "128, cutlass::bfloat16_t, float, cutlass::arch::Sm90, false, false, false, true, true, true>>>>(Params)")
FA3_COMBINE = ("void cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdCombine<"
               "cute::tuple<cute::C<8>, cute::C<128> >, 7, 256, 1, false, true, cutlass::bfloat16_t, float, "
               "cutlass::arch::Sm90> > >(Params)")
FA3_PREPARE = "void flash::prepare_varlen_num_blocks_kernel<1, false, true>(int, int, int, int const*, int*)"
MERGE = "void merge_state_kernel<__nv_bfloat16, 8u, 128u>(__nv_bfloat16 const*, float const*, __nv_bfloat16*)"
ROPE = ("void sglang::fused_rope_kernel<true, 128l, true, __nv_bfloat16, __nv_bfloat16, long, 16u>"
        "(sglang::FusedRopeParams)")
ACT = "void sglang::act_and_mul_kernel<__nv_bfloat16, (sglang::ActivationKind)0, true>(sglang::ActivationParams)"
COPY_F32 = ("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)"
            "::{lambda()#3}::operator()() const::{lambda(float)#1}, std::array<char*, 2ul>, 4>(int)")
ADD = ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
       "std::array<char*, 3ul>, false>")
POW = ("void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)::"
       "pow_tensor_scalar_kernel_impl<float, float>(at::TensorIteratorBase&, float)::{lambda(float)#1}, "
       "std::array<char*, 2ul>, false>")
MEAN = "mean_kernel"
MUL = ("void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl<at::native::BinaryFunctor<"
       "float, float, float, at::native::binary_internal::MulFunctor<float> > >(at::TensorIteratorBase&)::"
       "{lambda(int)#1}>(int)")
FUSED_NORM = "void flashinfer::norm::FusedAddRMSNormKernel<8u, __nv_bfloat16>(__nv_bfloat16*, __nv_bfloat16*)"
SOFTMAX = ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, "
           "at::native::(anonymous namespace)::SoftMaxForwardEpilogue>(float*, float const*, int)")
SCAN = "void at_cuda_detail::cub::detail::scan::DeviceScanKernel<long const*, long*>(long const*, long*)"
MEMCPY = "Memcpy DtoD (Device -> Device)"
DET_NORM = [COPY_F32, ADD, POW, MEAN, ADD, MUL, MUL, COPY_F32]  # SGLang's batch-invariant add + RMSNorm
FAST_NORM = [FUSED_NORM]


def _layer(gemm, attn, norm, *, first=False, split_k=False):
    g = [gemm, SPLITK] if split_k else [gemm]
    pre = [] if first else norm  # the previous layer's down -> this layer's qkv: its input norm
    return pre + g + [ROPE] + attn + g + norm + g + [ACT] + g


def _forward(layers, gemm, attn, norm, *, draft=False, after=(), split_k=False):
    seq = [gemm] if draft else [MEMCPY, "void at::native::(anonymous namespace)::indexSelectSmallIndex<c10::BFloat16>"]
    for i in range(layers):
        seq += _layer(gemm, attn, norm, first=(i == 0), split_k=split_k)
    return seq + norm + ([gemm, SPLITK] if split_k else [gemm]) + list(after)


def _kernels(names, dur=2.0, gap=1.0, step_gap=0.0, step_starts=()):
    out, t = [], 0.0
    starts = set(step_starts)
    for i, n in enumerate(names):
        if i in starts:
            t += step_gap
        out.append(sk.Kernel(n, t, dur))
        t += dur + gap
    return out


def test_kernel_kinds_by_name():
    kinds = {n: sk.kernel_kind(n) for n in (DEEP_GEMM, TRITON_MM, NVJET, XMMA, "void gemv2T_kernel_val<int>", SPLITK,
                                            FA3, FA3_COMBINE, FA3_PREPARE, MERGE, "_fwd_grouped_kernel_stage1",
                                            "_fwd_kernel_stage2", "_fwd_kernel_unified", POW, MEAN, FUSED_NORM,
                                            "_rms_norm_kernel", "_race_argmax_kernel", "_race_topk_kernel",
                                            "_verify_race_kernel", "_verify_emit_kernel", "_coupled_walk_kernel",
                                            "node_rows", SOFTMAX, ROPE, ACT, COPY_F32, MEMCPY, SCAN)}
    assert [n for n, k in kinds.items() if k == "gemm"] == [DEEP_GEMM, TRITON_MM, NVJET, XMMA,
                                                            "void gemv2T_kernel_val<int>"]
    assert kinds[SPLITK] == "gemm_aux"
    assert {kinds[n] for n in (FA3, "_fwd_grouped_kernel_stage1", "_fwd_kernel_stage2",
                               "_fwd_kernel_unified")} == {"attention"}
    # Attention's helpers: class attention, but never a site of their own.
    assert {kinds[n] for n in (FA3_COMBINE, FA3_PREPARE, MERGE)} == {"attention_aux"}
    assert {kinds[n] for n in (POW, MEAN, FUSED_NORM, "_rms_norm_kernel")} == {"norm"}
    assert kinds["_race_argmax_kernel"] == kinds["_race_topk_kernel"] == "plugin_race"
    assert kinds["_verify_emit_kernel"] == kinds["_coupled_walk_kernel"] == "plugin_verify"
    assert kinds["node_rows"] == "plugin_tree_rows" and kinds[SOFTMAX] == "sampling"
    assert {kinds[n] for n in (ROPE, ACT, COPY_F32, MEMCPY)} == {"elementwise"} and kinds[SCAN] == "other"


def _chain_step(gemm=DEEP_GEMM, attn=(FA3,), norm=DET_NORM, layers=4):
    """One coupled chain step: 2 draft decode forwards, the target verify, the draft extend."""
    draft = _forward(1, gemm, list(attn), norm, draft=True, after=["_race_argmax_kernel"])
    target = _forward(layers, gemm, list(attn), norm, after=["_verify_race_kernel", "_verify_emit_kernel"])
    return draft + draft + target + draft


def test_chain_verify_and_drafts_get_their_layer_kinds():
    step = _chain_step()
    got = sk.classify(_kernels(step * 3))
    assert [f.role for f in got.forwards] == ["draft", "draft", "target", "draft"] * 3
    assert [f.layers for f in got.forwards][:4] == [1, 1, 4, 1] and not got.anomalies
    per_step = {}
    for c in got.classes[:len(step)]:
        per_step[c] = per_step.get(c, 0) + 1
    assert {k: per_step[k] for k in ("gemm_qkv", "gemm_o", "gemm_gate_up", "gemm_down", "gemm_lm_head")} == {
        "gemm_qkv": 4, "gemm_o": 4, "gemm_gate_up": 4, "gemm_down": 4, "gemm_lm_head": 1}
    assert per_step["gemm_draft_fc"] == 3 and per_step["gemm_draft_layer"] == 12 and per_step["gemm_draft_lm_head"] == 3
    assert per_step["plugin_draft"] == 3 and per_step["plugin_verify"] == 2 and per_step["attention"] == 7
    # Every norm: o -> gate_up and down -> qkv / lm_head, the decomposed kernels included.
    norms_per_target = 2 * 4 + 1  # two per layer, but the first layer's input norm follows the embedding
    assert per_step["norm"] == len(DET_NORM) * (norms_per_target - 1 + 3 * 2)
    assert per_step["elementwise"] == 4 + 4 + 3 * 2 + 2  # rope and act per layer, the embedding's two kernels
    assert len(got.anchors) == 3 and got.classes[got.anchors[0]] == "gemm_qkv"


def test_split_attention_and_split_k_gemms_count_once():
    """Triton split-KV (stage 1 / stage 2), FA3 with its combine, cascade with merge, cuBLAS split-K."""
    for attn in (["_fwd_grouped_kernel_stage1", "_fwd_kernel_stage2"], [FA3_PREPARE, FA3, FA3_COMBINE],
                 [FA3, MEMCPY, FA3, MERGE]):
        step = _forward(3, NVJET, attn, FAST_NORM, after=[SOFTMAX, "void flashinfer::sampling::SamplingFromProbKernel"],
                        split_k=True)
        got = sk.classify(_kernels(step * 3))
        assert [f.layers for f in got.forwards] == [3, 3, 3] and not got.anomalies
        assert got.classes[:len(step)].count("gemm_down") == 2 * 3  # the GEMM and its split-K reduction
        assert got.classes[:len(step)].count("gemm_lm_head") == 2
        assert got.classes[:len(step)].count("sampling") == 2


def test_tree_with_plugin_rows_and_fast_path_draft_sampling():
    tree_target = _forward(3, TRITON_MM, ["node_rows", FA3, FA3_COMBINE], DET_NORM,
                           after=["_tree_positions_kernel", "_coupled_walk_kernel"])
    draft = _forward(1, TRITON_MM, [FA3], DET_NORM, draft=True, after=["_race_topk_kernel", "_race_reduce_kernel"])
    step = draft + draft + tree_target + draft
    got = sk.classify(_kernels(step * 3))
    assert not got.anomalies and [f.role for f in got.forwards][:4] == ["draft", "draft", "target", "draft"]
    cls = got.classes[:len(step)]
    # node_rows runs before the attention kernels it feeds: part of the same site, its own class.
    assert cls.count("plugin_tree_rows") == 3 and cls.count("plugin_verify") == 2 and cls.count("plugin_draft") == 6
    # The no-speculation fast path: race kernels after a target lm_head are sampling.
    plain = _forward(2, XMMA, [FA3], FAST_NORM, after=["_race_argmax_kernel"])
    got = sk.classify(_kernels(plain * 3))
    assert got.classes.count("plugin_sampling") == 3 and got.classes.count("plugin_draft") == 0
    # Fused norms: o -> gate_up twice, down -> qkv once, down -> lm_head once, per forward.
    assert got.classes.count("norm") == 3 * 4


def test_a_layer_out_of_pattern_is_reported_not_guessed():
    fwd = _forward(3, DEEP_GEMM, [FA3], FAST_NORM, after=[SOFTMAX])
    odd = list(fwd)
    odd.insert(odd.index(ACT), DEEP_GEMM)  # a fifth GEMM in layer 0
    got = sk.classify(_kernels(fwd + fwd + odd + fwd))
    # Five GEMMs after a site read as a forward's end: layer 0 becomes a lone "draft", and the rest
    # of that forward a target of 2 layers where the others have 3, which is reported.
    assert [f.layers for f in got.forwards] == [3, 3, 1, 2, 3]
    assert len(got.anomalies) == 1 and "2 layers where most have 3" in got.anomalies[0][1]
    short = list(fwd)
    del short[short.index(ACT) + 1]  # layer 0 without its down GEMM: three GEMMs between two sites
    got = sk.classify(_kernels(fwd + short + fwd))
    assert any("fewer than o, gate_up, down, lm_head" in t for _, t in got.anomalies)


def test_breakdown_divides_by_steps_between_target_forwards():
    step = _chain_step()
    n = len(step)
    kernels = _kernels(step * 4, dur=2.0, gap=1.0, step_gap=100.0, step_starts=[n, 2 * n, 3 * n])
    r = sk.breakdown(kernels, skip_steps=1)
    assert r["steps"] == 2 and r["forwards_per_step"] == {"target": 1.0, "draft": 3.0}
    # A step: n kernels of 2 us, n gaps of 1 us and the 100 us scheduling gap.
    assert r["step_ms"] == pytest.approx((3 * n + 100) / 1e3)
    assert r["gpu_ms_per_step"]["idle"] == pytest.approx((n + 100) / 1e3)
    assert sum(v for c, v in r["gpu_ms_per_step"].items() if c != "idle") == pytest.approx(2 * n / 1e3)
    assert r["busy_ms"] == pytest.approx(2 * n / 1e3) and set(r["gpu_ms_per_step"]) == set(sk.CLASSES)
    assert r["top"][0]["class"] in ("norm", "gemm_qkv", "elementwise", "gemm_draft_layer")
    first = r["first_step"]
    # From the target's qkv to the next step's embedding kernels, after the last draft's race.
    assert len(first) == n and first[0][1] == "gemm_qkv" and [c for _, c, _ in first[-3:]] == [
        "plugin_draft", "elementwise", "elementwise"]
    assert all(len(name) <= sk.NAME_CHARS for name, _, _ in first)
    # Overlapping kernels (two streams): idle is the window minus their union, not minus their sum.
    beside_rope = sk.Kernel(SCAN, kernels[2 * n + 2].ts, 2.0)
    over = [sk.Kernel(k.name, k.ts, k.dur) for k in kernels] + [beside_rope]
    over.sort(key=lambda k: k.ts)
    r2 = sk.breakdown(over, skip_steps=1)
    assert r2["gpu_ms_per_step"]["idle"] == pytest.approx(r["gpu_ms_per_step"]["idle"])
    assert r2["gpu_ms_per_step"]["other"] == pytest.approx(2.0 / 2 / 1e3)
    with pytest.raises(ValueError, match="at least 2 target forwards"):
        sk.breakdown(_kernels(step * 2), skip_steps=1)
    with pytest.raises(ValueError, match="sorted"):
        sk.classify(list(reversed(kernels)))
    with pytest.raises(ValueError, match="skip_steps"):
        sk.breakdown(kernels, skip_steps=-1)


def test_trace_events_become_one_device_stream(tmp_path):
    ev = [{"ph": "X", "cat": "kernel", "name": FA3, "ts": 20.0, "dur": 5.0, "pid": 0},
          {"ph": "X", "cat": "gpu_memcpy", "name": MEMCPY, "ts": 10.0, "dur": 1.0, "pid": 0},
          {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": 1.0, "dur": 3.0, "pid": 9},
          {"ph": "X", "cat": "kernel", "name": NVJET, "ts": 5.0, "dur": 1.0, "pid": 1}]
    ks = sk.kernels_from_events(ev)
    assert [k.name for k in ks] == [MEMCPY, FA3] and ks[1].end == 25.0


# -- kernel sequences of the first H200 breakdown (8B Llama target, EAGLE draft, FA3, CUDA graphs) ----
# Names as that profile recorded them (first listings and largest kernels of its cells), in their order.

H_FA3 = ("void cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<flash::CollectiveMainloop"
         "FwdSm90<2, cute::tuple<cute::C<1>, cute::C<1>, cute::C<1> >, cute::tuple<cute::C<64>, cute::C<128>, "
         "cute::C<128> >, 128, cutlass::bfloat16_t, float, cutlass::arch::Sm90, true, false, false, true, true, false, "
         "false, false, true, true, true, false, false, cutlass::bfloat16_t, false, 1>, flash::C")
H_PREPARE = ("void flash::prepare_varlen_num_blocks_kernel<8, true>(int, int, int, int const*, int const*, int const*, "
             "int const*, int const*, int const*, int, int, int, int, int, cutlass::FastDivmod, cutlass::FastDivmod, "
             "int*, int*, int*, int*, int*, bool, bool, bool, int)")
H_COMBINE = ("void cutlass::device_kernel<flash::FlashAttnFwdCombine<cute::tuple<cute::C<8>, cute::C<128> >, 5, 256, "
             "1, false, true, cutlass::bfloat16_t, float, cutlass::arch::Sm90> "
             ">(flash::FlashAttnFwdCombine<cute::tuple<cute::C<8>, cute::C<128> >, 5, 256, 1, false, true, "
             "cutlass::bfloat16_t, float, cutlass::arch::Sm90>::Params)")
H_MERGE = ("void merge_attn_states_kernel<__nv_bfloat16, 128u>(__nv_bfloat16*, float*, __nv_bfloat16 const*, "
           "float const*, __nv_bfloat16 const*, float const*, unsigned int, unsigned int, unsigned int)")
H_ROPE = ("void sglang::fused_rope_kernel<true, 128l, true, __nv_bfloat16, __nv_bfloat16, long, 16u>"
          "(sglang::FusedRopeParams)")
H_STORE = "void sglang::store_kvcache_kernel<2048l, 2048l, 128u, true, long>(sglang::StoreKVCacheParams)"
H_COPY = ("void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::native::direct_copy_"
          "kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#12}::operator()() const::"
          "{lambda(c10::BFloat16)#1}>(at::TensorIteratorBase&, at::native::direct_copy_kernel_cuda(at::TensorIterator")
H_ACT = ("void sglang::act_and_mul_kernel<__nv_bfloat16, (sglang::ActivationKind)0, true, false, false, false, false, "
         "false>(sglang::ActivationParams)")
H_FUSED_NORM = ("kernel_cutlass_kernel_flashinfernormkernelsfused_add_rmsnormFusedAddRMSNormKernel_object_at__tensorptr"
                "bf16gmemalign128oi64409640961_tensorptrbf16gmemalign128oi64409640961_tensorptrbf16gme_0")
H_NORM = "kernel_cutlass_kernel_flashinfernormkernelsrmsnormRMSNormKernel_object_at__tenso"
H_ADD = ("void at::native::vectorized_elementwise_kernel<8, at::native::CUDAFunctor_add<c10::BFloat16>, "
         "std::array<char*, 3ul>, false>(int, at::native::CUDAFunctor_add<c10::BFloat16>, std::array<char*, 3ul>)")
H_GATHER = "void at::native::vectorized_gather_kernel<16, long>(char*, char*, long*, int, long, long, long, long, bool)"
H_CAT = ("void at::native::(anonymous namespace)::CatArrayBatchedCopy_vectorized<at::native::(anonymous namespace)::"
         "OpaqueType<2u>, unsigned int, 2, 128, 1, 16, 8>(char*, at::native::(anonymous namespace)::CatArrInputTensor"
         "Metadata<at::native::(anonymous namespace)::OpaqueType<2u>, unsigned int, 128, 1>, at::native::(anonymous "
         "namespace)::TensorSizeStride<unsigned int, 4u>, int, unsigned int)")
H_EMBED = ("void at::native::(anonymous namespace)::indexSelectSmallIndex<c10::BFloat16, long, unsigned int, 2, 2, -2>"
           "(at::cuda::detail::TensorInfo<c10::BFloat16, unsigned int>, at::cuda::detail::TensorInfo<c10::BFloat16 "
           "const, unsigned int>, at::cuda::detail::TensorInfo<long const, unsigned int>, int, int, unsigned int, "
           "long)")
H_SOFTMAX = ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, at::native::"
             "(anonymous namespace)::SoftMaxForwardEpilogue>(float*, float const*, int)")
H_EXPONENTIAL = ("void at::native::(anonymous namespace)::distribution_elementwise_grid_stride_kernel<float, 4, "
                 "at::native::templates::cuda::uniform_and_transform<float, float, at::CUDAGeneratorImpl*, at::native::"
                 "templates::cuda::exponential_kernel<at::CUDAGeneratorImpl*>(at::TensorIteratorBase&, double, "
                 "at::CUDAGeneratorImpl*)::{lambda()#1}::operator()() const::{lambda()#2}::operator()() const::"
                 "{lambda(float)#1}>(")
H_ARGMAX = ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::ArgMaxOps<float>, "
            "unsigned int, long, 4, 4> >(at::native::ReduceOp<float, at::native::ArgMaxOps<float>, unsigned int, long, "
            "4, 4>)")
H_DIV = ("void at::native::vectorized_elementwise_kernel<4, at::native::BinaryFunctor<float, float, float, at::native::"
         "binary_internal::DivFunctor<float> >, std::array<char*, 3ul>, false>(int, at::native::BinaryFunctor<float, "
         "float, float, at::native::binary_internal::DivFunctor<float> >, std::array<char*, 3ul>)")
H_SPLITK = ("void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16, float, __nv_bfloat16, false, "
            "float, __nv_bfloat16, __nv_bfloat16, true, false, false, false>(cublasLt::cublasSplitKParams<float>, "
            "float const*, __nv_bfloat16 const*, float*, __nv_bfloat16*, float const*, float const*, __nv_bfloat16 "
            "const*, float const*, __nv_bfloat16*, void*, long, float*, int*, float*, float*, float const*, flo")
# cuBLAS at one token per request: o and down split over K, with cuBLASLt's reduction after them.
CUBLAS_C1 = {"qkv": ["nvjet_sm90_tst_64x8_64x16_4x1_v_bz_TNT"],
             "o": ["nvjet_sm90_tst_64x8_64x16_2x1_v_bz_splitK_TNT", H_SPLITK],
             "gate_up": ["nvjet_sm90_tst_128x8_64x12_2x1_v_bz_TNT"],
             "down": ["nvjet_sm90_tst_128x8_64x12_2x1_v_bz_splitK_TNT", H_SPLITK],
             "lm_head": ["nvjet_sm90_tst_256x8_64x6_2x1_v_bz_TNT"]}
# The split-K GEMM experiment (benchmark/gemm_splitk/gemm_triton.py): one fused kernel, or split over K then combined. Which one
# a GEMM takes depends on its shape (the draft decode at c = 128 splits fc, qkv, o, down; the verify fuses all).
PLUGIN_FUSED = {s: ["_gemm_fused_kernel"] for s in ("fc", "qkv", "o", "gate_up", "down", "lm_head")}
PLUGIN_SPLIT = {**PLUGIN_FUSED,
                **{s: ["_gemm_split_kernel", "_gemm_combine_kernel"] for s in ("fc", "qkv", "o", "down")}}
PLUGIN_DRAFT_TAIL = ["softcap_inplace_logits_kernel", MEMCPY, H_SOFTMAX, "_race_argmax_kernel", "_race_reduce_kernel",
                     H_ARGMAX, H_CAT, "Memcpy DtoH (Device -> Pinned)"]


def _h200_forward(layers, gemms, attn, norm, *, head=(), fc=False, final=None, tail=()):
    """One forward as the H200 profile lists it: ``head``, [fc], per layer qkv, rope, KV store, copy,
    attention, o, norm, gate_up, act, down and the next norm (``final`` after the last down), lm_head, ``tail``."""
    seq = list(head) + (list(gemms["fc"]) if fc else [])
    for i in range(layers):
        after_down = final if i == layers - 1 and final is not None else norm
        seq += [*gemms["qkv"], H_ROPE, H_STORE, H_COPY, *attn, *gemms["o"], *norm, *gemms["gate_up"], H_ACT,
                *gemms["down"], *after_down]
    return seq + list(gemms["lm_head"]) + list(tail)


def _plugin_coupled_step(target_gemms, layers=32):
    """(d) at c = 128: the target verify, the draft extend (fused GEMMs), two draft decodes (split GEMMs)."""
    attn = [H_PREPARE, H_FA3]
    target = _h200_forward(layers, target_gemms, attn, ["_rms_norm_kernel"], head=[H_GATHER, "_rms_norm_kernel"],
                           tail=["softcap_inplace_logits_kernel", H_SOFTMAX, "_race_argmax_kernel",
                                 "_coupled_walk_kernel", "_verify_commit_outputs_kernel", H_CAT])
    extend = _h200_forward(1, PLUGIN_FUSED, attn, ["_rms_norm_kernel"], head=[H_CAT], fc=True,
                           final=[H_ADD, H_GATHER], tail=PLUGIN_DRAFT_TAIL)
    decode = _h200_forward(1, PLUGIN_SPLIT, attn, ["_rms_norm_kernel"], head=["_fused_decode_metadata_kernel", H_CAT],
                           fc=True, final=[H_ADD], tail=PLUGIN_DRAFT_TAIL)
    return target + extend + decode + decode + ["_build_chain_tree_kernel", MEMCPY]


def test_h200_kernel_names_by_kind():
    kind = sk.kernel_kind
    assert {kind(n) for n in ("_gemm_fused_kernel", "_gemm_split_kernel", *CUBLAS_C1["o"][:1])} == {"gemm"}
    assert kind("_gemm_combine_kernel") == kind(H_SPLITK) == "gemm_aux"  # a split GEMM's second kernel
    assert {kind(n) for n in (H_PREPARE, H_COMBINE, H_MERGE)} == {"attention_aux"} and kind(H_FA3) == "attention"
    assert {kind(n) for n in ("_rms_norm_kernel", H_FUSED_NORM, H_NORM)} == {"norm"}
    # Sampling between forwards is neither attention nor GEMM.
    assert {kind(n) for n in (H_SOFTMAX, H_EXPONENTIAL, H_ARGMAX, "_argmax_partial_kernel",
                              "_medium_argmax_final_kernel")} == {"sampling"}
    assert kind("_node_rows_kernel") == "plugin_tree_rows" and kind("softcap_inplace_logits_kernel") == "elementwise"


@pytest.mark.parametrize("target_gemms", [PLUGIN_FUSED, PLUGIN_SPLIT], ids=["verify_fused", "verify_split"])
def test_plugin_split_gemm_counts_once_with_its_combine(target_gemms):
    """(d) with this package's GEMM: split + combine is one GEMM site, the combine's time its GEMM's class.

    Counting the combine as a GEMM put 6 GEMMs after a draft's attention site and 4 before it (d, c = 128:
    "2/4/2 GEMM(s) between forwards"), and 7 between two target sites where the target splits too
    (c <= 32: every layer a forward of its own, no step found)."""
    step = _plugin_coupled_step(target_gemms)
    got = sk.classify(_kernels(step * 3))
    assert not got.anomalies
    assert [(f.role, f.layers) for f in got.forwards] == [("target", 32), ("draft", 1), ("draft", 1), ("draft", 1)] * 3
    cls = got.classes[:len(step)]
    for i, name in enumerate(step):  # every combine kernel in its split kernel's class
        if name == "_gemm_combine_kernel":
            assert step[i - 1] == "_gemm_split_kernel" and cls[i] == cls[i - 1] != "gemm_other"
    per = collections.Counter(cls)
    assert "gemm_other" not in per and per["gemm_lm_head"] == 1 and per["gemm_draft_lm_head"] == 3
    k = len(target_gemms["qkv"])  # kernels per split GEMM of the target
    assert per["gemm_qkv"] == per["gemm_o"] == per["gemm_down"] == 32 * k and per["gemm_gate_up"] == 32
    assert per["gemm_draft_fc"] == 1 + 2 * 2 and per["gemm_draft_layer"] == 4 + 2 * (3 * 2 + 1)
    assert per["plugin_draft"] == 3 * 2 and per["plugin_sampling"] == 1 and per["plugin_verify"] == 1
    # Norms: the plugin's RMSNorm twice per target layer and its input norm, once per draft layer; the draft's
    # residual add before its lm_head; the last-token gather there stays elementwise.
    assert per["norm"] == 2 * 32 + 1 + 3 * (1 + 1)
    r = sk.breakdown(_kernels(step * 3), skip_steps=1)
    assert r["classified_by"] == "layer_pattern" and r["steps"] == 1 and not r["anomalies"]
    assert r["forwards_per_step"] == {"target": 1.0, "draft": 3.0} and r["gpu_ms_per_step"]["gemm_other"] == 0


def _plain_decode_step(gemms, norm, first_norm, tail, layers=32):
    """One decode step without speculation: FA3's scheduler metadata computed once before the graph replay
    (SGLang's flashattention backend, plain decode), then the 32-layer forward with split-KV attention."""
    return [H_PREPARE, MEMCPY] + _h200_forward(layers, gemms, [H_FA3, H_COMBINE], norm,
                                               head=[MEMCPY, H_EMBED, first_norm], tail=tail)


@pytest.mark.parametrize("config", ["g_baseline", "f_plugin_no_spec"])
def test_plain_decode_steps_are_one_32_layer_forward_each(config):
    """(g) cuBLAS, FlashInfer norms, torch sampling; (f) this package's GEMM, RMSNorm and sampling race.

    The scheduler-metadata kernel before each replay had been an attention site of its own: forwards of
    33 sites, the first of them a lone "draft" followed by 1 GEMM (g) or 2 (f, the split qkv)."""
    if config == "g_baseline":
        step = _plain_decode_step(CUBLAS_C1, [H_FUSED_NORM], H_NORM, [H_SOFTMAX, H_EXPONENTIAL, H_DIV, H_ARGMAX])
    else:
        step = _plain_decode_step(PLUGIN_SPLIT, ["_rms_norm_kernel"], "_rms_norm_kernel",
                                  ["softcap_inplace_logits_kernel", H_SOFTMAX, "_race_argmax_kernel"])
    kernels = _kernels(step * 4)
    got = sk.classify(kernels)
    assert not got.anomalies and [(f.role, f.layers) for f in got.forwards] == [("target", 32)] * 4
    cls = got.classes[:len(step)]
    assert cls[0] == "attention" and cls.count("attention") == 1 + 2 * 32  # the metadata kernel is attention's
    per = collections.Counter(cls)
    assert "gemm_other" not in per and per["gemm_lm_head"] == 1 and per["gemm_gate_up"] == 32
    assert per["gemm_o"] == per["gemm_down"] == 2 * 32  # the split GEMM and its reduction / combine
    assert per["norm"] == 2 * 32 + 1  # the last down -> lm_head norm included
    if config == "g_baseline":
        assert per["sampling"] == 3 and per["gemm_qkv"] == 32
    else:
        assert per["plugin_sampling"] == 1 and per["gemm_qkv"] == 2 * 32
    r = sk.breakdown(kernels, skip_steps=1)
    assert r["steps"] == 2 and r["forwards_per_step"] == {"target": 1.0, "draft": 0.0}


def test_tree_verify_merge_is_part_of_its_attention_site():
    """(e) tree verify: prefix and tree attention with their metadata kernels, merged; one site per layer."""
    attn = [H_PREPARE, H_FA3, H_COPY, H_PREPARE.replace("<8,", "<32,"), H_FA3, H_DIV, H_MERGE]
    target = _h200_forward(4, PLUGIN_FUSED, attn, ["_rms_norm_kernel"], head=[H_GATHER, "_rms_norm_kernel"],
                           tail=[H_SOFTMAX, "_race_argmax_kernel", "_tree_positions_kernel", "_coupled_walk_kernel"])
    draft = _h200_forward(1, PLUGIN_FUSED, attn, ["_rms_norm_kernel"], head=[H_CAT], fc=True, final=[H_ADD],
                          tail=["_race_topk_kernel", "_race_reduce_kernel"])
    step = target + draft + draft
    got = sk.classify(_kernels(step * 3))
    assert not got.anomalies and [f.layers for f in got.forwards][:3] == [4, 1, 1]
    cls = got.classes[:len(step)]
    assert cls.count("attention") == 4 * 5 + 2 * 5 and "other" not in cls


def test_a_cell_without_its_layer_pattern_is_classed_by_kernel_name():
    """One sequence the pattern does not fit keeps the cell: class totals by name, GEMMs as gemm_other."""
    step = _plain_decode_step(PLUGIN_SPLIT, ["_rms_norm_kernel"], "_rms_norm_kernel",
                              [H_SOFTMAX, "_race_argmax_kernel"])
    no_attention = [n for n in step if sk.kernel_kind(n) not in ("attention", "attention_aux")]
    kernels = _kernels(no_attention * 3, dur=2.0, gap=1.0)
    with pytest.raises(ValueError, match="at least 2 target forwards.*no attention kernel"):
        sk.breakdown(kernels, skip_steps=1)
    r = sk.breakdown(kernels, skip_steps=1, steps_in_trace=3)
    assert r["classified_by"] == "kernel_name" and r["steps"] == 3
    n = len(no_attention)
    assert r["step_ms"] == pytest.approx((3 * n * 3.0 - 1.0) / 3 / 1e3)
    gemm_kernels = sum(1 for x in no_attention if sk.kernel_kind(x) in ("gemm", "gemm_aux"))
    ms = r["gpu_ms_per_step"]
    assert ms["gemm_other"] == pytest.approx(gemm_kernels * 2.0 / 1e3)
    assert all(ms[c] == 0 for c in sk.CLASSES if c.startswith("gemm_") and c != "gemm_other")
    assert ms["norm"] == pytest.approx(no_attention.count("_rms_norm_kernel") * 2.0 / 1e3)
    assert ms["plugin_sampling"] == pytest.approx(2.0 / 1e3) and ms["sampling"] == pytest.approx(2.0 / 1e3)
    assert "layer pattern not found" in r["anomalies"][0] and len(r["first_step"]) == n
    assert r["forwards_per_step"] == {"target": 0.0, "draft": 0.0}
    assert sk.classes_by_name([sk.Kernel(H_PREPARE, 0, 1), sk.Kernel("_gemm_combine_kernel", 1, 1)]) == [
        "attention", "gemm_other"]
    with pytest.raises(ValueError, match="steps_in_trace"):
        sk.breakdown(kernels, steps_in_trace=0)
    with pytest.raises(ValueError, match="empty"):
        sk.breakdown([], steps_in_trace=3)


# -- breakdown cells (serving_breakdown.py) -----------------------------------------------------


def test_capture_settings_bounds_and_kv_tokens():
    s = bd.CaptureSettings()
    assert s.kv_tokens(128) == 128 * (128 + 192 + 16) <= 45056
    with pytest.raises(ValueError, match="profile_steps must lie"):
        bd.CaptureSettings(profile_steps=2)
    with pytest.raises(ValueError, match=r"start_tokens must be >= 4 x \(profile_steps \+ 2\) = 40 tokens, got 96 - 6"):
        bd.CaptureSettings(output_len=96, start_tokens=64)
    with pytest.raises(ValueError, match="skip_steps"):
        bd.CaptureSettings(profile_steps=4, skip_steps=3)
    with pytest.raises(ValueError, match="wave_timeout_s"):
        bd.CaptureSettings(wave_timeout_s=0.0)


def test_profile_request_is_sglang_profile_req_and_stream_lines_parse():
    """The /start_profile body builds SGLang's own ProfileReq as its HTTP route does (pydantic)."""
    import pydantic
    from sglang.srt.managers.io_struct import ProfileReq

    body = bd.profile_request("traces", "plugin_coupled_c8_1", 8)
    assert set(body) <= set(ProfileReq.__struct_fields__)  # the route ignores unknown keys: no typo passes
    req = pydantic.TypeAdapter(ProfileReq).validate_python(body)
    assert req.num_steps == 8 and req.activities == ["GPU"] and req.with_stack is False
    assert req.profile_by_stage is False and req.profile_id == "plugin_coupled_c8_1" and req.output_dir == "traces"
    assert bd.parse_stream_line(b'data: {"meta_info": {"completion_tokens": 3}}\n') == {
        "meta_info": {"completion_tokens": 3}}
    assert bd.parse_stream_line("data: [DONE]") is None and bd.parse_stream_line(b"\n") is None
    assert bd.parse_stream_line("data: {broken") is None and bd.parse_stream_line("event: x") is None


def _trace_file(path, steps=5):
    step = _chain_step(layers=3)
    ks = _kernels(step * steps, step_gap=50.0, step_starts=[len(step) * i for i in range(1, steps)])
    ev = [{"ph": "X", "cat": "kernel", "name": k.name, "ts": k.ts, "dur": k.dur, "pid": 0, "tid": 7} for k in ks]
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": ev}, f)


BREAKDOWN_STAND_IN = """
import gzip, http.server, importlib, json, os, sys, time
sys.path.insert(0, sys.argv[3])
# An argument "trace-writer=module:function" picks what writes the trace (path, num_steps); default _trace_file.
_writer = next((a.split("=", 1)[1] for a in sys.argv[4:] if a.startswith("trace-writer=")),
               "test_serving_bench:_trace_file")
write_trace = getattr(importlib.import_module(_writer.split(":")[0]), _writer.split(":")[1])
class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def do_GET(self):
        b = b"{}"; self.send_response(200); self.send_header("Content-Length", str(len(b))); self.end_headers()
        self.wfile.write(b)
    def do_POST(self):
        r = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/start_profile":
            os.makedirs(r["output_dir"], exist_ok=True)
            write_trace(os.path.join(r["output_dir"], r["profile_id"] + "-TP-0.trace.json.gz"), r["num_steps"])
            self.send_response(200); self.send_header("Content-Length", "0"); self.end_headers(); return
        n = r["sampling_params"]["max_new_tokens"]
        self.send_response(200); self.end_headers()
        for k in range(1, n + 1):
            time.sleep(0.002)
            c = {"text": "w", "meta_info": {"completion_tokens": k}}
            self.wfile.write(b"data: " + json.dumps(c).encode() + b"\\n\\n"); self.wfile.flush()
        self.wfile.write(b"data: [DONE]\\n\\n")
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def stand_in_servers(tmp_path, monkeypatch, source: str, *extra_args: str):
    """Every server of ``serving_run`` becomes ``source`` run as a script (port, "ok", this folder, extra_args);
    returns a model folder the run accepts as written. Traces go under ``tmp_path``."""
    script = tmp_path / "stand_in.py"
    script.write_text(source)
    model_dir = tmp_path / "models"
    model_dir.mkdir()
    (model_dir / "models.json").write_text(json.dumps({"stand_in": True}))

    def stand_in_command(config, settings, *, port, **kwargs):
        return [sys.executable, str(script), str(port), "ok", str(Path(__file__).parent), *extra_args]

    monkeypatch.setattr(run, "server_command", stand_in_command)
    monkeypatch.setattr(run, "BREAKDOWN_TRACES", str(tmp_path / "traces"))
    return model_dir


def test_breakdown_mode_end_to_end_with_stand_in_servers(tmp_path, monkeypatch):
    """serving_run --breakdown: waves, /start_profile, the written trace classified, breakdown.json / .md.

    The stand-in (not SGLang, which needs a GPU) streams /generate as SGLang does and, on
    /start_profile, writes a synthetic chain-step trace where SGLang would.
    """
    model_dir = stand_in_servers(tmp_path, monkeypatch, BREAKDOWN_STAND_IN)
    out = tmp_path / "out"
    rc = run.main(["--out", str(out), "--models", str(model_dir), "--breakdown", "--configs", "ad",
                   "--concurrency", "1,3", "--input-len", "8", "--max-total-tokens", "2048", "--gpus", "1",
                   "--max-servers-per-gpu", "5", "--budget-s", "200", "--port-base", "34100",
                   "--server-env", "SGLANG_DETSPEC_X=1"])
    assert rc == 0
    doc = json.loads((out / "breakdown.json").read_text())
    assert set(doc) >= {"date_utc", "machine", "rows"} and not doc["missing"]
    cells = {(r["config"], r["concurrency"]) for r in doc["rows"]}
    assert cells == {("a", 1), ("a", 3), ("d", 1), ("d", 3)}
    one = {r["class"]: r for r in doc["rows"] if r["config"] == "d" and r["concurrency"] == 3}
    assert set(one) == set(sk.CLASSES) and one["idle"]["gpu_ms_per_step"] > 0
    assert one["gemm_qkv"]["steps"] == 8 - 1 - 1 and one["gemm_draft_fc"]["gpu_ms_per_step"] > 0
    md = (out / "breakdown.md").read_text()
    assert "| d | 3 |" in md and "gemm_qkv" in md
    meta = json.loads((out / "meta.json").read_text())
    assert meta["server_commands"]["d"]["env"]["SGLANG_DETSPEC_X"] == "1"
    assert "SGLANG_DETSPEC_X" not in meta["server_commands"]["a"]["env"]
    assert (out / "breakdown" / "d_plugin_coupled_c3.json").exists()


def test_breakdown_report_rejects_bad_rows_and_lists_missing(tmp_path):
    rows = bd.cell_rows("d", 8, {"gpu_ms_per_step": {"gemm_qkv": 1.0, "idle": 0.5, "other": 0.25},
                                 "step_ms": 2.0, "steps": 5})
    # A cell whose layer pattern was not found: classed by kernel name, marked in the table.
    rows += bd.cell_rows("f", 8, {"gpu_ms_per_step": {"gemm_other": 1.5, "idle": 0.5}, "step_ms": 2.0, "steps": 8,
                                  "classified_by": "kernel_name"})
    assert {r["classified_by"] for r in rows} == {"layer_pattern", "kernel_name"}
    doc = {"date_utc": "2026-12-02T00:00:00+00:00", "machine": "H200", "rows": rows,
           "missing": [{"config": "g", "concurrency": 128, "why": "120 s left"}]}
    paths = bd.write_breakdown(str(tmp_path), doc, with_plot=True)
    assert Path(paths[2]).name == "breakdown.png" and Path(paths[2]).stat().st_size > 1000
    md = Path(paths[1]).read_text()
    assert "| d | 8 | 2.000 | 1.000 |" in md and "- g c=128: 120 s left" in md and md.rstrip().endswith("120 s left")
    assert "0.250 |" in md  # "other" summed into the rest column
    assert "| f* | 8 | 2.000 | 0.000 |" in md and "`*`: the layer pattern was not found" in md
    assert "| 1.500 |" in md  # gemm_other has its own column
    with pytest.raises(ValueError, match=r"rows\[0\]"):
        bd.write_breakdown(str(tmp_path), {**doc, "rows": [{"config": "d", "concurrency": "8", "class": "x",
                                                            "gpu_ms_per_step": 1.0}]})
    # The command line draws the tables and the plot again from the JSON alone.
    again = tmp_path / "again"
    assert bd.main([paths[0], "--out", str(again)]) == 0
    assert (again / "breakdown.png").exists() and (again / "breakdown.md").read_text() == md


# -- the interleaved protocol (serving_interleave.py, serving_driver.run_interleaved) ------------


def test_interleaved_schedule_alternates_the_order_from_round_to_round():
    # Two arms: ABBA, the reference first in round 0 (calibration) and round 1.
    plan = inter.schedule(["d", "a"], [1, 8], 3)
    assert plan == [(r, c, k) for r, order in enumerate(["ad", "ad", "da", "ad"]) for c in (1, 8) for k in order]
    # Three arms: over three rounds each one runs first, second and last once.
    orders = ["".join(inter.round_order(list("dea"), r)) for r in range(1, 4)]
    assert orders == ["ade", "dea", "ead"]
    assert all(sorted(o[i] for o in orders) == list("ade") for i in range(3))
    # (f) is measured against (g), its reference first.
    assert [k for _, _, k in inter.schedule(["f", "g"], [1], 3)] == list("gf" "gf" "fg" "gf")
    with pytest.raises(ValueError, match="rounds must lie"):
        inter.schedule(["a", "d"], [1], 0)
    with pytest.raises(ValueError, match="at least one level"):
        inter.schedule(["a", "d"], [], 3)


@pytest.mark.parametrize("n", [2, 3, 4, 5, 6])
def test_williams_rows_balance_positions_and_neighbours(n):
    rows = inter.williams_rows(n)
    assert len(rows) == (n if n % 2 == 0 else 2 * n) and all(sorted(r) == list(range(n)) for r in rows)
    per_position = collections.Counter((pos, t) for r in rows for pos, t in enumerate(r))
    assert set(per_position.values()) == {len(rows) // n}  # each treatment in each position equally often
    neighbours = collections.Counter((r[i], r[i + 1]) for r in rows for i in range(n - 1))
    assert len(neighbours) == n * (n - 1) and len(set(neighbours.values())) == 1  # each ordered pair equally often


def test_interleaved_keys_need_their_reference_and_at_most_three_servers():
    for ok in ("ad", "abd", "ade", "fg", "gf"):
        inter.check_keys(list(ok))
    for bad, match in (("bd", r"must hold \(a\), the reference of \(b\)"),
                       ("af", r"must hold \(g\), the reference of \(f\)"),
                       ("afg", r"\(a\) is the reference of no other key"),
                       ("ag", r"\(a\) is the reference of no other key"),
                       ("a", "at least one more key"), ("aa", "at most once"),
                       ("adef", r"at most 3 servers per interleaved command .*got 4")):
        with pytest.raises(ValueError, match=match):
            inter.check_keys(list(bad))
    assert inter.pairable(list("adf")) == ["a", "d"] and inter.pairable(list("gfa")) == ["g", "f"]
    assert inter.pairable(["a"]) == [] and inter.reference_of("f") == "g" and inter.reference_of("e") == "a"


def test_common_prompt_count_follows_the_fastest_arm():
    repeat = cfg.RepeatSettings(min_seconds=4.0, margin=1.25)
    # The fastest lasted 2 s of the 5 wanted: 16 x 5 / 2 = 40 prompts, up to full waves of 8.
    assert inter.common_prompts(repeat, 16, [2.0, 3.5, 0.0], 8) == 40
    assert inter.common_prompts(repeat, 16, [5.0, 9.0], 8) == 16  # long enough already: kept
    with pytest.raises(ValueError, match="durations"):
        inter.common_prompts(repeat, 16, [0.0], 8)


def _irow(key, conc, rnd, tput, valid=True, **extra):
    return {"key": key, "concurrency": conc, "round": rnd, "valid": valid, "interleaved": True,
            "output_throughput": tput, **extra}


def test_paired_ratios_stay_within_a_round():
    rows = [_irow("a", 8, 0, 50.0, valid=False), _irow("b", 8, 0, 10.0, valid=False),
            _irow("a", 8, 1, 100.0), _irow("b", 8, 1, 70.0), _irow("d", 8, 1, 80.0),
            _irow("a", 8, 2, 200.0), _irow("b", 8, 2, 150.0), _irow("d", 8, 2, 100.0),
            _irow("a", 8, 3, 100.0), _irow("d", 8, 3, 90.0, valid=False)]
    pairs = inter.paired_ratios(rows, "a")
    assert pairs == {"b": {8: [0.7, 0.75]}, "d": {8: [0.8, 0.5]}}
    assert inter.paired_ratios(rows, "b") == {"d": {8: [80 / 70, 100 / 150]}}
    tables = inter.ratio_tables([rows, [_irow("a", 8, 1, 10.0), _irow("d", 8, 1, 9.0)]])
    assert tables["interleaved"] is True and "ratio_to_g" not in tables
    assert tables["ratio_to_a"]["d"]["8"] == pytest.approx(0.8)  # pooled over both commands: 0.5, 0.8, 0.9
    assert tables["ratio_to_a_spread"]["d"]["8"] == {"min": 0.5, "max": 0.9, "n": 3}
    # Rounds measured: valid runs of rounds >= 1, summed over the commands (d's round 3 was short).
    assert tables["rounds"] == {"a": {"8": 4}, "b": {"8": 2}, "d": {"8": 3}}
    lines = "\n".join(inter.render_markdown(tables, [1, 8]))
    assert "| (d) | - | 0.800 (0.500–0.900, n=3) |" in lines and "| (d) | 0 | 3 |" in lines
    # (f) against (g) without (a): ratio_to_g, and an empty ratio_to_a (the layout stays the same).
    fg = inter.ratio_tables([[_irow("g", 1, 1, 100.0), _irow("f", 1, 1, 97.0),
                              _irow("f", 1, 2, 90.0), _irow("g", 1, 2, 100.0)]])
    assert fg["ratio_to_a"] == {} and fg["ratio_to_g"]["f"]["1"] == pytest.approx(0.935)
    assert fg["rounds"] == {"f": {"1": 2}, "g": {"1": 2}} and "ratio_to_a_spread" not in fg
    assert inter.ratio_tables([[{"key": "a", "concurrency": 1, "output_throughput": 1.0}]]) == {"interleaved": False}


def _fake_bench(clock, speed, seen, errors=()):
    """bench_serving as the driver calls it: ``speed[port]()`` seconds per prompt, 2 s of overhead per call;
    raises for the (port, call number) in ``errors``."""
    def fake_run(argv, raw_file):
        port = _flag(argv, "--base-url").rsplit(":", 1)[1]
        n = int(_flag(argv, "--num-prompts"))
        seen.append((port, n, _flag(argv, "--warmup-requests")))
        if (port, sum(1 for p, _, _ in seen if p == port)) in errors:
            raise RuntimeError("server answered 500")
        per_prompt = speed[port]()
        clock["t"] += per_prompt * n + 2.0
        return {"duration": per_prompt * n, "completed": n, "output_throughput": 128 / per_prompt,
                "concurrency": 1.0}
    return fake_run


def _servers(keys):
    port = {"a": "31000", "d": "31010", "e": "31020", "f": "31030", "g": "31040"}
    return {k: {"url": f"http://127.0.0.1:{port[k]}", "name": cfg.CONFIGS[k].name, "title": f"({k}) t"}
            for k in keys}


def _ispec(tmp_path, keys, rounds, time_left_s):
    return {"mode": "interleave", "servers": _servers(keys), "tokenizer": "/m/target", "out": str(tmp_path),
            "concurrencies": [1], "load": {"input_len": 8, "output_len": 4},
            "repeat": {"repeats": 1, "min_seconds": 5.0, "max_attempts": 1, "margin": 1.2}, "rounds": rounds,
            "time_left_s": time_left_s}


def test_driver_interleaves_with_equal_counts_and_stops_at_the_budget(tmp_path):
    import serving_driver as driver

    clock, seen = {"t": 0.0}, []
    speed = {"31000": lambda: 0.5, "31010": lambda: 0.8}  # seconds per prompt at c = 1: (a) faster than (d)
    spec = _ispec(tmp_path, "ad", 3, 60.0)
    assert driver.run_interleaved(spec, run=_fake_bench(clock, speed, seen), clock=lambda: clock["t"]) == 0
    # Calibration with 4 prompts each (warm-up requests on); the fastest, (a), sets every arm's count to about
    # 1.2 x 5 s: 4 x 6 / 2.0 = 12. Round 1 a, d; round 2 d, a (4 + 2 + 6.4 + 2 s, then 2 x 19.6 s);
    # round 3 is predicted to take 19.6 s with 11.6 left.
    assert seen == [("31000", 4, "1"), ("31010", 4, "1"), ("31000", 12, "0"), ("31010", 12, "0"),
                    ("31010", 12, "0"), ("31000", 12, "0")]
    rows = report.load_rows(str(tmp_path / "results.jsonl"))
    runs = [r for r in rows if "note" not in r]
    assert [(r["round"], r["key"]) for r in runs] == [(0, "a"), (0, "d"), (1, "a"), (1, "d"), (2, "d"), (2, "a")]
    assert all(r["valid"] is (r["round"] > 0) and r["interleaved"] for r in runs)
    notes = [r["note"] for r in rows if "note" in r]
    assert len(notes) == 2 and all("2 valid round(s) of 3" in n and "predicted" in n for n in notes)
    written = report.write_report(rows, {"concurrencies": [1], "repeats": 3}, str(tmp_path / "rep"), with_plots=False)
    js = json.loads(Path(written["json"]).read_text())
    assert js["interleaved"] is True and js["ratio_to_a"]["d"]["1"] == pytest.approx(0.5 / 0.8)
    assert js["ratio_to_a_spread"]["d"]["1"]["n"] == 2 and "ratio_to_b" not in js
    assert js["rounds"] == {"a": {"1": 2}, "d": {"1": 2}}
    assert [f["n"] for f in js["fewer_repetitions"]] == [2, 2]  # fewer than the 3 rounds wanted: listed
    assert "interleaved: output tokens/s relative to (a)" in Path(written["markdown"]).read_text()


def test_driver_raises_every_count_when_the_fastest_run_falls_short(tmp_path):
    """(a) gets faster after round 1: its round-2 run lasts 3.6 s of the 5 s wanted, so round 3 runs 20
    prompts on both servers; the short run is not counted and its round has no pair."""
    import serving_driver as driver

    clock, seen = {"t": 0.0}, []
    a_speed = iter([0.5, 0.5, 0.3, 0.3])
    speed = {"31000": lambda: next(a_speed), "31010": lambda: 0.8}
    spec = _ispec(tmp_path, "ad", 3, 1000.0)
    assert driver.run_interleaved(spec, run=_fake_bench(clock, speed, seen), clock=lambda: clock["t"]) == 0
    assert [n for _, n, _ in seen] == [4, 4, 12, 12, 12, 12, 20, 20]
    rows = report.load_rows(str(tmp_path / "results.jsonl"))
    short = [r for r in rows if r.get("round") == 2 and r["key"] == "a"]
    assert len(short) == 1 and short[0]["valid"] is False and short[0]["duration_s"] == pytest.approx(3.6)
    tables = inter.ratio_tables([rows])
    assert tables["rounds"] == {"a": {"1": 2}, "d": {"1": 3}} and tables["ratio_to_a_spread"]["d"]["1"]["n"] == 2
    assert [r["note"] for r in rows if "note" in r] == [
        "2 valid round(s) of 3: round 2 lasted 3.6 s, less than min_seconds (5 s)"]


def test_driver_pairs_f_with_g_and_drops_a_failed_server(tmp_path):
    """(f) against (g) without (a); then three arms where (d) fails in round 2: (a) and (e) go on in the
    balanced order, (d)'s cell says why."""
    import serving_driver as driver

    clock, seen = {"t": 0.0}, []
    speed = {p: (lambda v=v: v) for p, v in (("31000", 0.5), ("31010", 0.6), ("31020", 0.55),
                                              ("31030", 0.52), ("31040", 0.5))}
    assert driver.run_interleaved(_ispec(tmp_path / "fg", "fg", 3, 1000.0), run=_fake_bench(clock, speed, seen),
                                  clock=lambda: clock["t"]) == 0
    assert [p[-2] for p, _, _ in seen] == list("4343" "34" "43")  # g, f; g, f; f, g; g, f
    assert len({n for _, n, _ in seen[2:]}) == 1
    fg = inter.ratio_tables([report.load_rows(str(tmp_path / "fg" / "results.jsonl"))])
    assert fg["ratio_to_g"]["f"]["1"] == pytest.approx(0.5 / 0.52) and fg["ratio_to_a"] == {}

    seen.clear()
    rc = driver.run_interleaved(_ispec(tmp_path / "ade", "dae", 3, 1000.0),
                                run=_fake_bench(clock, speed, seen, errors={("31010", 3)}), clock=lambda: clock["t"])
    assert rc == 1
    # Round 0 and 1: a, d, e; round 2: d (fails), e, a; round 3 without (d): the order of a, e in row 3: e, a.
    assert [p[-2] for p, _, _ in seen] == list("012" "012" "120" "20")
    rows = report.load_rows(str(tmp_path / "ade" / "results.jsonl"))
    assert "server answered 500" in next(r["error"] for r in rows if "error" in r)
    assert [r["note"] for r in rows if "note" in r] == [
        "1 valid round(s) of 3: round 2 c=1 failed (RuntimeError: server answered 500)"]


def test_report_merges_interleaved_commands_into_the_determinism_tax_layout(tmp_path, capsys):
    """Two commands' folders, (a) (d) (e) and (f) (g): one serving.json with ratio_to_a, ratio_to_g and
    rounds per configuration and concurrency, the layout the results folder is checked for."""
    commands = {"il-1": [_irow(k, c, r, v) for r in (1, 2, 3) for c in (1, 8)
                         for k, v in (("a", 100.0 + r), ("d", 90.0), ("e", 80.0 + r))],
                "il-2": [_irow(k, 1, r, v) for r in (1, 2, 3) for k, v in (("g", 50.0), ("f", 49.0 - r))]}
    for name, rows in commands.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "docs" / "benchmarks" / "determinism_tax" / "2026-12-05-h200"
    assert report.main([str(tmp_path / "il-1"), str(tmp_path / "il-2"), "--out", str(out), "--no-plots"]) == 0
    js = json.loads((out / "serving.json").read_text())
    assert js["interleaved"] is True
    assert js["rounds"] == {"a": {"1": 3, "8": 3}, "d": {"1": 3, "8": 3}, "e": {"1": 3, "8": 3}, "f": {"1": 3},
                            "g": {"1": 3}}
    assert js["ratio_to_a"]["d"]["8"] == pytest.approx(90.0 / 102.0)
    assert js["ratio_to_a_spread"]["e"]["1"] == {"min": pytest.approx(81 / 101), "max": pytest.approx(83 / 103),
                                                 "n": 3}
    assert js["ratio_to_g"] == {"f": {"1": pytest.approx(47 / 50)}} and set(js["ratio_to_a"]) == {"d", "e"}
    md = (out / "serving.md").read_text()
    assert "relative to (g)" in md and "| (f) | 3 | 0 |" in md and "did not measure (b)" not in md


def test_orchestrator_interleaves_every_ready_server(tmp_path, monkeypatch):
    """serving_run --interleave end to end: stand-in servers, the real bench_serving client, the report."""
    model_dir, _ = _stand_in_servers(tmp_path, monkeypatch, STAND_IN_SCRIPT)
    out = tmp_path / "out"
    rc = run.main(["--out", str(out), "--models", str(model_dir), "--interleave", "--configs", "da",
                   "--concurrency", "2", "--input-len", "8", "--output-len", "4", "--rounds", "1",
                   "--max-total-tokens", "1024", "--gpus", "1", "--budget-s", "300", "--port-base", "34200",
                   "--min-seconds", "0", "--alternations", "2"])
    assert rc == 0
    rows = report.load_rows(str(out / "results.jsonl"))
    assert [(r["round"], r["key"]) for r in rows] == [(0, "a"), (0, "d"), (1, "a"), (1, "d"), (2, "d"), (2, "a")]
    assert len({r["num_prompts"] for r in rows}) == 1  # --min-seconds 0: the calibration's count throughout
    js = json.loads((out / "serving.json").read_text())
    assert js["interleaved"] is True and js["ratio_to_a_spread"]["d"]["2"]["n"] == 2
    assert js["rounds"] == {"a": {"2": 2}, "d": {"2": 2}}
    assert js["meta"]["mode"] == "interleave" and js["meta"]["repeats"] == 2
    assert "- interleaved rounds per cell: 2 after one uncounted calibration round" in (out / "serving.md").read_text()


# -- plugin settings for the deterministic configurations ---------------------------------------


def test_server_env_and_args_reach_only_plugin_configurations():
    assert cfg.parse_env_pairs(["A=1", "B_2=x=y"]) == {"A": "1", "B_2": "x=y"}
    for bad, match in ((["A"], "KEY=VALUE"), (["1A=2"], "KEY=VALUE"), (["A=1", "A=2"], "given twice")):
        with pytest.raises(ValueError, match=match):
            cfg.parse_env_pairs(bad)
    s = cfg.ServerSettings(target="/m/target", draft="/m/eagle")
    servers = run.plan_servers(list("abdefg"), 1, s, port_base=31000, out="/o", profile=[], max_conc=128,
                               server_env={"SGLANG_DETSPEC_TREE_ATTENTION": "nodes"}, server_args=["--foo", "1"])
    got = {sv.key: (sv.env.get("SGLANG_DETSPEC_TREE_ATTENTION"), sv.argv[-2:] == ["--foo", "1"]) for sv in servers}
    assert got == {"a": (None, False), "b": (None, False), "d": ("nodes", True), "e": ("nodes", True),
                   "f": ("nodes", True), "g": (None, False)}


def test_modes_validate_their_arguments():
    def plan(*extra):
        return run.validate(run.build_parser().parse_args(["--out", "x", "--models", "m", *extra]))

    assert plan("--breakdown")["keys"] == list("adefg") and plan("--interleave")["keys"] == list("abd")
    assert plan()["mode"] == "cells" and plan("--breakdown")["capture"].output_len == 192
    p = plan("--interleave", "--configs", "fg", "--max-servers-per-gpu", "2", "--server-args", "--x 1 --y")
    assert p["server_args"] == ["--x", "1", "--y"] and p["mode"] == "interleave" and p["keys"] == ["f", "g"]
    assert run.build_parser().parse_args(["--out", "x", "--models", "m"]).alternations == 3
    for extra, match in ((["--breakdown", "--profile", "d"], "profile: not used"),
                         (["--interleave", "--configs", "bd"], r"must hold \(a\), the reference of \(b\)"),
                         (["--interleave", "--configs", "afg"], r"\(a\) is the reference of no other key"),
                         (["--interleave", "--configs", "abdefg"],
                          "configs: --interleave starts at most 3 servers per command, got 6"),
                         (["--interleave", "--max-servers-per-gpu", "2"], "max_servers_per_gpu x gpus >= 3"),
                         (["--breakdown", "--max-total-tokens", "40000"],
                          r"max_total_tokens must be >= 43008 .*output: --breakdown-output-len\)"),
                         (["--breakdown", "--host-profile", "32", "--concurrency", "32", "--max-total-tokens", "9216"],
                          r"max_total_tokens must be >= 135680 .*output: --host-output-len\)"),
                         (["--breakdown", "--breakdown-start-tokens", "180"], "output_len - start_tokens"),
                         (["--server-env", "X"], "server_env entries"),
                         (["--server-args", "'unclosed"], "server_args")):
        with pytest.raises(ValueError, match=match):
            plan(*extra)
    both = plan("--breakdown", "--interleave", "--interleave-configs", "da", "--interleave-concurrency", "8,1",
                "--max-servers-per-gpu", "5")
    assert both["mode"] == "combined" and both["keys"] == list("ade") and both["capture"] is not None
    assert both["il_keys"] == ["a", "d"] and both["il_concs"] == [8, 1]
    assert plan("--breakdown", "--interleave", "--gpus", "2")["il_keys"] == list("ade")
    both_on_two_gpus = ["--breakdown", "--interleave", "--gpus", "2"]
    for extra, match in ((["--interleave", "--interleave-configs", "ab"], "interleave_configs: only with"),
                         (["--breakdown", "--interleave-concurrency", "8"], "interleave_concurrency: only with"),
                         ([*both_on_two_gpus, "--interleave-configs", "ab"], r"keys \['b'\] are not in"),
                         ([*both_on_two_gpus, "--interleave-configs", "dx"], "interleave_configs: configs: unknown"),
                         ([*both_on_two_gpus, "--interleave-configs", "de"], r"must hold \(a\)"),
                         ([*both_on_two_gpus, "--interleave-concurrency", "2"], r"\[2\] not in"),
                         (["--breakdown", "--interleave", "--max-servers-per-gpu", "2"], "max_servers_per_gpu x"),
                         (["--breakdown", "--interleave", "--configs", "adefg"], "at most 3 servers per command"),
                         ([*both_on_two_gpus, "--profile", "d"], "not used with --breakdown --interleave")):
        with pytest.raises(ValueError, match=match):
            plan(*extra)


# -- --breakdown --interleave: both parts on the same servers ----------------------------------


def _combined_setup(tmp_path, monkeypatch):
    """Stand-in servers that stream /generate, answer /server_info and write a trace on /start_profile."""
    model_dir, launched = _stand_in_servers(tmp_path, monkeypatch, BREAKDOWN_STAND_IN,
                                            extra_argv=[str(Path(__file__).parent)])
    monkeypatch.setattr(run, "BREAKDOWN_TRACES", str(tmp_path / "traces"))
    return model_dir, launched


def test_combined_mode_runs_the_breakdown_then_interleaves_on_the_same_servers(tmp_path, monkeypatch):
    """--breakdown --interleave: each server started once, every breakdown cell, then the interleaved rounds
    over --interleave-configs at --interleave-concurrency; both reports in one folder."""
    model_dir, launched = _combined_setup(tmp_path, monkeypatch)
    out = tmp_path / "out"
    rc = run.main(["--out", str(out), "--models", str(model_dir), "--breakdown", "--interleave",
                   "--configs", "ade", "--interleave-configs", "da", "--concurrency", "1,3",
                   "--interleave-concurrency", "3", "--input-len", "8", "--output-len", "4", "--rounds", "1",
                   "--max-total-tokens", "2048", "--gpus", "1", "--max-servers-per-gpu", "3", "--budget-s", "300",
                   "--port-base", "34300", "--min-seconds", "0", "--alternations", "2"])
    assert rc == 0
    assert sorted(launched) == ["a", "d", "e"]  # one start per configuration for both parts
    doc = json.loads((out / "breakdown.json").read_text())
    assert not doc["missing"]
    assert {(r["config"], r["concurrency"]) for r in doc["rows"]} == {(k, c) for k in "ade" for c in (1, 3)}
    rows = report.load_rows(str(out / "results.jsonl"))
    assert [(r["round"], r["key"], r["concurrency"]) for r in rows] == [
        (0, "a", 3), (0, "d", 3), (1, "a", 3), (1, "d", 3), (2, "d", 3), (2, "a", 3)]
    js = json.loads((out / "serving.json").read_text())
    assert js["interleaved"] is True and js["ratio_to_a_spread"]["d"]["3"]["n"] == 2 and not js["missing"]
    assert js["meta"]["mode"] == "combined" and js["meta"]["breakdown_configs"] == "ade"
    assert set(js["meta"]["configs"]) == {"a", "d"} and js["meta"]["concurrencies"] == [3]
    assert (out / "breakdown.md").exists() and "relative to (a)" in (out / "serving.md").read_text()
    log = (out / "events.log").read_text()
    assert log.index("(e) breakdown c=3") < log.index("interleaving ad")


def test_combined_mode_lists_interleaved_cells_that_did_not_fit(tmp_path, monkeypatch):
    """A breakdown that ends with the budget spent: serving.json lists every interleaved cell as missing,
    with the reason, and breakdown.json keeps its cells."""
    model_dir, _ = _combined_setup(tmp_path, monkeypatch)
    measured = run.Run.breakdown

    def breakdown_then_budget_spent(self, s):
        measured(self, s)
        if s.key == "d":  # the last server: leave 1 s beyond the report's reserve
            self.t0 = time.monotonic() - (self.args.budget_s - run.REPORT_RESERVE_S - 1)

    monkeypatch.setattr(run.Run, "breakdown", breakdown_then_budget_spent)
    out = tmp_path / "out"
    rc = run.main(["--out", str(out), "--models", str(model_dir), "--breakdown", "--interleave",
                   "--configs", "ad", "--concurrency", "1,2", "--input-len", "8", "--output-len", "4",
                   "--max-total-tokens", "2048", "--gpus", "1", "--budget-s", "300", "--port-base", "34400",
                   "--min-seconds", "0", "--alternations", "2"])
    assert rc == 0
    doc = json.loads((out / "breakdown.json").read_text())
    assert len({(r["config"], r["concurrency"]) for r in doc["rows"]}) == 4 and not doc["missing"]
    js = json.loads((out / "serving.json").read_text())
    missing = {(m["key"], m["concurrency"]): m["why"] for m in js["missing"]}
    assert set(missing) == {(k, c) for k in "ad" for c in (1, 2)}
    assert all("no time left to interleave" in " ".join(w) for w in missing.values())
    assert js["interleaved"] is True and js["ratio_to_a"] == {} and js["rounds"] == {}  # the layout, empty



def test_deepgemm_kernels_counts_the_jit_cache_folders(tmp_path, monkeypatch):
    """One folder per compiled kernel under <cache>/cache; None before DeepGEMM compiled anything."""
    monkeypatch.setenv("SGLANG_DG_CACHE_DIR", str(tmp_path))
    assert run.deepgemm_kernels() is None
    for name in ("sm90_bf16_gemm.aa", "sm90_bf16_gemm.bb"):
        (tmp_path / "cache" / name).mkdir(parents=True)
    assert run.deepgemm_kernels() == 2
    monkeypatch.delenv("SGLANG_DG_CACHE_DIR")
    monkeypatch.setenv("SGLANG_CACHE_DIR", str(tmp_path / "elsewhere"))
    (tmp_path / "elsewhere" / "deep_gemm" / "cache" / "k").mkdir(parents=True)
    assert run.deepgemm_kernels() == 1  # SGLang's default: <SGLANG_CACHE_DIR>/deep_gemm


def test_a_command_without_b_has_no_ratio_to_b_tables():
    """The H200 run of (a) (d) (m) measured no (b): its report has the same-round ratios to (a), no table of dashes."""
    folder = os.path.join(os.path.dirname(__file__), "..", "..", "..", "docs", "benchmarks", "determinism_tax",
                          "2026-12-04-h200-switch-tree")
    md = report.render_markdown(report.summarize([report.load_command(folder)]))
    assert "ratio to (b)" not in md
    assert "| (m) | 1.015 (0.883–1.113, n=3) |" in md  # the interleaved table stays


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))

