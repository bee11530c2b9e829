"""CPU-side logic of the end-to-end serving benchmark (benchmark/serving): arguments, commands, models, reports."""

import argparse
import gzip
import json
import sys
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


# -- configurations and command lines -------------------------------------------------


def _flag(argv, name):
    return argv[argv.index(name) + 1]


def test_ten_configurations_have_the_issue_flags():
    assert "".join(sorted(cfg.CONFIGS)) == "abcdefghij"
    s = cfg.ServerSettings(target="/m/target", draft="/m/eagle")
    cmds = {k: cfg.server_command(c, s, port=31000) for k, c in cfg.CONFIGS.items()}
    det = {k for k, c in cmds.items() if "--enable-deterministic-inference" in c}
    rej = {k for k, c in cmds.items() if "--speculative-use-rejection-sampling" in c}
    spec = {k for k, c in cmds.items() if "--speculative-algorithm" in c}
    assert det == set("bcdefhij") and rej == set("abch") and spec == set("abcdehij")
    assert cmds["j"] == cmds["e"] and dict(cfg.CONFIGS["j"].env)["SGLANG_DETSPEC_TREE_ATTENTION"] == "nodes"
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
    assert run.main(["--out", "/tmp/x", "--models", "/tmp/m", "--dry-run", "--gpus", "1", "--configs", "bd",
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
    return run.build_parser().parse_args(["--out", "/tmp/x", "--models", "/tmp/m", *extra])


def test_plan_places_servers_round_robin_with_distinct_ports():
    plan = run.validate(_args())
    servers = run.plan_servers(plan["keys"], 2, plan["settings"], port_base=31000, out="/tmp/x",
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


def test_dry_run_prints_every_server_of_the_default_order(capsys):
    assert run.main(["--out", "/tmp/x", "--models", "/tmp/m", "--dry-run", "--gpus", "2"]) == 0
    text = capsys.readouterr().out
    assert text.count("sglang.launch_server") == len(cfg.DEFAULT_ORDER) == len(cfg.CONFIGS) - 1 == 9
    assert "(j)" not in text  # the node path's cost: asked for by --configs


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


def test_orchestrator_measures_ready_servers_one_at_a_time_and_reports(tmp_path, monkeypatch):
    """serving_run's schedule end to end with stand-in servers: one healthy, one that dies at start."""
    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN_SCRIPT)
    model_dir = tmp_path / "models"
    (model_dir / "target").mkdir(parents=True)
    models.write_tokenizer(str(model_dir / "target"), 1000)
    (model_dir / "target" / "config.json").write_text(json.dumps(models.llama_config(SMALL, "LlamaForCausalLM", 1)))
    (model_dir / "models.json").write_text(json.dumps({"stand_in": True}))

    def stand_in_command(config, settings, *, port, **kwargs):
        return [sys.executable, str(script), str(port), "fail" if config.key == "g" else "ok"]

    monkeypatch.setattr(run, "server_command", stand_in_command)
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


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
