"""How many benchmark servers one GPU holds (benchmark/serving/gpu_fit.py) and the two benchmarks that plan with it.

The estimate's parts are checked against what SGLang itself logged on the
H200 for the same models (a committed server log: the draft's weights and
both KV pools to the logged 0.01 GiB; the target's logged load, 2.4 GiB above
its bf16 weights, within the fixed overhead), and the plans against the GPU
sizes the benchmarks meet: an H200's 140.4 GiB and an H100's 79.6 GiB.
"""

import sys
from pathlib import Path

import pytest
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=10, suite="detspec-unit-cpu")

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "benchmark" / "serving"))

import attention_cost as ac  # noqa: E402
import gpu_fit  # noqa: E402
import serving_run as run  # noqa: E402
from serving_models import EIGHT_B, QWEN3_MOE_A3B_24L  # noqa: E402

H200_GIB = 143771 / 1024  # nvidia-smi's memory.total of the H200s (MiB)
H100_GIB = 81559 / 1024
# SGLang's own log of an 8B-shape EAGLE server (its "GB" are GiB): the sizes the estimate must reproduce.
LOGGED = REPO / "docs/benchmarks/determinism_tax/2026-12-04-h200-jit-probe/logs/server_spec_fast.trimmed.log"


def test_the_estimate_reproduces_what_sglang_logged_for_the_same_models():
    import re

    text = LOGGED.read_text()
    assert gpu_fit.logged_pool_tokens(text) == 65536  # the target's pool comes first
    draft_load = float(re.search(r"type=LlamaForCausalLMEagle, .*?mem usage=([\d.]+) GB", text).group(1))
    assert 2 * EIGHT_B.draft_params() / gpu_fit.GIB == pytest.approx(draft_load, abs=0.01)
    target_load = float(re.search(r"type=LlamaForCausalLM, .*?mem usage=([\d.]+) GB", text).group(1))
    weights = 2 * EIGHT_B.target_params() / gpu_fit.GIB
    assert weights < target_load <= weights + gpu_fit.OVERHEAD_GIB
    sizes = [(int(t), float(k) + float(v)) for t, k, v in
             re.findall(r"#tokens: (\d+), K size: ([\d.]+) GB, V size: ([\d.]+) GB", text)]
    assert len(sizes) == 2  # target, then draft
    for (tokens, logged), layers in zip(sizes, (None, 1)):  # K and V each logged to 0.01 GiB
        assert tokens * EIGHT_B.kv_bytes_per_token(layers) / gpu_fit.GIB == pytest.approx(logged, abs=0.0101)


def test_the_committed_four_server_run_fits_the_estimate():
    # docs/benchmarks/attention_cost/2026-12-02-h200: (e) twice and (f) twice at 100,000 tokens, one H200.
    both = 2 * gpu_fit.server_gib(EIGHT_B, 100_000, True) + 2 * gpu_fit.server_gib(EIGHT_B, 100_000, False)
    assert both <= H200_GIB
    assert gpu_fit.server_gib(EIGHT_B, 100_000, True) > gpu_fit.server_gib(EIGHT_B, 100_000, False)


@pytest.mark.parametrize("shape", [EIGHT_B, QWEN3_MOE_A3B_24L])
@pytest.mark.parametrize("servers", [[True], [True, False], [True] * 3])
@pytest.mark.parametrize("total", [H100_GIB, H200_GIB])
def test_the_pool_that_fits_is_the_largest_multiple_of_1024_that_does(shape, servers, total):
    pool = gpu_fit.pool_that_fits(shape, servers, total)
    used = lambda tokens: sum(gpu_fit.server_gib(shape, tokens, spec) for spec in servers)  # noqa: E731
    if pool:
        assert pool % 1024 == 0 and used(pool) <= total
    else:
        assert used(1024) > total
    assert used(pool + 1024) > total


def test_no_server_or_no_room_gives_no_pool():
    assert gpu_fit.pool_that_fits(EIGHT_B, [], H200_GIB) == 0
    assert gpu_fit.pool_that_fits(EIGHT_B, [True] * 7, H200_GIB) == 0  # seven 8B weights alone exceed 140 GiB


def test_a_log_without_the_pool_line_gives_none():
    assert gpu_fit.logged_pool_tokens("Load weight end. mem usage=17.40 GB\n") is None


def test_without_nvidia_smi_the_memory_is_unknown(monkeypatch):
    monkeypatch.setenv("PATH", "")
    assert gpu_fit.gpu_memory_gib() is None


def test_the_free_memory_of_the_first_visible_gpu_is_read(tmp_path, monkeypatch):
    smi = tmp_path / "nvidia-smi"  # prints what nvidia-smi prints for that query on a two-GPU host
    smi.write_text("#!/bin/sh\necho '0, 81000'\necho '1, 40960'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert gpu_fit.gpu_memory_gib() == pytest.approx(81000 / 1024)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")
    assert gpu_fit.gpu_memory_gib() == 40.0
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    assert gpu_fit.gpu_memory_gib() is None  # no such GPU


def _cost_plan(*extra):
    return ac.validate(ac.build_parser().parse_args(["--out", "o", "--models", "m", *extra]))


def test_the_cost_pairs_share_an_h200_in_two_waves_and_take_turns_on_an_h100():
    h200 = _cost_plan("--gpu-gib", str(H200_GIB))
    assert [[p.name for p in w] for w in h200["waves"]] == [["fa3_split_chain", "fa3_split_tree"], ["triton_split"]]
    h100 = _cost_plan("--gpu-gib", str(H100_GIB))
    assert [[p.name for p in w] for w in h100["waves"]] == [["fa3_split_chain"], ["fa3_split_tree"], ["triton_split"]]
    for plan, total in ((h200, H200_GIB), (h100, H100_GIB)):
        # Every server's pool is the largest cell's need, and each wave's servers fit the card by the estimate.
        assert plan["settings"].max_total_tokens == plan["pool"] == min(ac.pool_for(plan["cells"], 64), 100_000)
        assert all(c * (n + 64 + ac.SLACK_TOKENS) <= plan["pool"] for _, n, c in plan["cells"])
        for wave in plan["waves"]:
            spec = [ac.CONFIGS[p.config].speculative for p in wave for _ in ac.ARMS]
            assert sum(gpu_fit.server_gib(ac.SHAPES["llama-8b"], plan["pool"], s) for s in spec) <= total
    # The same cells either way: only the grouping follows the card.
    assert [(p.name, n, c) for p, n, c in h200["cells"]] == [(p.name, n, c) for p, n, c in h100["cells"]]


def test_a_card_too_small_for_the_pool_lowers_it_and_says_why():
    plan = _cost_plan("--gpu-gib", "50")
    assert plan["pool"] < 68096 and any("pool at most" in n for n in plan["notes"])
    assert any("exceed the largest pool a pair's two servers fit in 50.0 GiB" in s["why"] for s in plan["skipped"]
               if s["prompt_len"] == 128)
    with pytest.raises(ValueError, match="no cell fits"):
        _cost_plan("--gpu-gib", "30")


def test_unknown_memory_keeps_every_pair_in_one_wave(monkeypatch):
    monkeypatch.setattr(ac, "gpu_memory_gib", lambda: None)
    plan = _cost_plan()
    assert len(plan["waves"]) == 1 and plan["gpu_gib"] is None and not plan["notes"]


def test_a_cell_larger_than_the_pool_a_server_logged_is_found(tmp_path):
    args = ac.build_parser().parse_args(["--out", str(tmp_path), "--models", "m"])
    (tmp_path / "logs").mkdir()
    line = "[2026-12-05] KV Cache is allocated. dtype: torch.bfloat16, #tokens: {}, K size: 1.00 GB, V size: 1.00 GB\n"
    (tmp_path / "logs" / "server_triton_split_path.log").write_text(line.format(40960) + line.format(512))
    (tmp_path / "logs" / "server_triton_split_sglang.log").write_text("still loading\n")
    pools = ac.logged_pools(args, [("triton_split", "path"), ("triton_split", "sglang"), ("fa3_split_tree", "path")])
    assert pools == {("triton_split", "path"): 40960}


class _Server:
    """A started server as ``attention_cost.run`` sees it: a process that has exited (``code``) or not (None)."""

    def __init__(self, code):
        self.code = code

    def poll(self):
        return self.code


def test_the_waves_run_in_turn_and_every_cell_is_measured_or_listed(tmp_path, monkeypatch):
    # An H100: three waves of one pair. The tree's split server never comes up; the chain's split server logs a
    # pool below what its largest cell needs. Every other cell is measured, one wave's servers at a time.
    import json

    import serving_driver

    models = tmp_path / "models"
    models.mkdir()
    (models / "models.json").write_text("{}")  # written: nothing to write
    args = ac.build_parser().parse_args(["--out", str(tmp_path / "out"), "--models", str(models), "--gpu-gib",
                                         str(H100_GIB), "--prompt-lens", "128,2048", "--concurrency", "1,32",
                                         "--budget-s", "3600"])
    plan = ac.validate(args)
    servers = {(p.name, arm): (32000 + 10 * i, [], {}) for i, (p, arm) in
               enumerate((p, arm) for p in plan["pairs"] for arm in ac.ARMS)}
    port_of = {port: key for key, (port, _, _) in servers.items()}
    dead, small = ("fa3_split_tree", "path"), ("fa3_split_chain", "path")
    events, up = [], set()
    pool_line = "KV Cache is allocated. dtype: torch.bfloat16, #tokens: {}, K size: 1.00 GB, V size: 1.00 GB\n"

    def start_servers(args_, keys, servers_):
        assert not up, "a wave started before the last one stopped"
        events.append(("start", tuple(keys)))
        for key in keys:
            tokens = 20000 if key == small else plan["pool"]
            open(ac.log_path(args_, key), "w").write(pool_line.format(tokens))
            if key != dead:
                up.add(key)
        return {key: _Server(1 if key == dead else None) for key in keys}

    def stop_servers(procs, grace_s=60.0):
        events.append(("stop", tuple(procs)))
        up.difference_update(procs)

    def run_bench(argv, raw):
        key = port_of[next(int(a.rsplit(":", 1)[1]) for a in argv if "127.0.0.1:" in a)]
        assert key in up
        return {"mean_itl_ms": 2.2 if key[1] == "path" else 2.0, "output_throughput": 100.0, "completed": 4}

    monkeypatch.setattr(ac, "start_servers", start_servers)
    monkeypatch.setattr(ac, "stop_servers", stop_servers)
    monkeypatch.setattr(ac, "healthy", lambda port: port_of[port] in up)
    monkeypatch.setattr(serving_driver, "run_bench", run_bench)
    assert ac.run(args, plan, servers) == 0

    assert [kind for kind, _ in events] == ["start", "stop"] * 3
    assert [keys[0][0] for kind, keys in events if kind == "start"] == [p.name for w in plan["waves"] for p in w]
    cost = json.loads((tmp_path / "out" / "cost.json").read_text())
    measured = {(r["pair"], r["prompt_len"], r["concurrency"]) for r in cost["rows"]}
    skipped = {(s["pair"], s["prompt_len"], s["concurrency"]): s["why"] for s in cost["skipped"]}
    assert measured == {("fa3_split_chain", 128, 1), ("fa3_split_chain", 128, 32), ("fa3_split_chain", 2048, 1),
                        ("triton_split", 128, 1), ("triton_split", 128, 32), ("triton_split", 2048, 1),
                        ("triton_split", 2048, 32)}
    assert all(r["ratio"] == pytest.approx(1.1) and r["rounds"] == 2 for r in cost["rows"])
    assert "a server logged" in skipped[("fa3_split_chain", 2048, 32)]
    assert all("did not become healthy" in skipped[("fa3_split_tree", n, c)] for n in (128, 2048) for c in (1, 32))
    # Every planned cell is measured or listed with its reason.
    assert {(p.name, n, c) for p, n, c in plan["cells"]} <= measured | set(skipped)
    assert any("not healthy" in note for note in cost["notes"])


def test_cells_left_when_the_budget_ends_are_listed(tmp_path, monkeypatch):
    import json

    models = tmp_path / "models"
    models.mkdir()
    (models / "models.json").write_text("{}")
    args = ac.build_parser().parse_args(["--out", str(tmp_path / "out"), "--models", str(models), "--gpu-gib",
                                         str(H100_GIB), "--budget-s", "100"])
    plan = ac.validate(args)
    monkeypatch.setattr(ac, "start_servers", lambda *a: pytest.fail("no wave fits 100 s"))
    assert ac.run(args, plan, {}) == 0
    cost = json.loads((tmp_path / "out" / "cost.json").read_text())
    assert not cost["rows"]
    not_started = {(s["pair"], s["prompt_len"], s["concurrency"]) for s in cost["skipped"] if "not started" in s["why"]}
    assert not_started == {(p.name, n, c) for p, n, c in plan["cells"]}


def _serving_plan(*extra):
    return run.validate(run.build_parser().parse_args(["--out", "x", "--models", "m", *extra]))


def test_interleaved_servers_that_do_not_fit_are_refused_before_any_start():
    with pytest.raises(ValueError, match=r"ade are held at once on GPU 0: about 9\d\.\d GiB.*name fewer configs"):
        _serving_plan("--interleave", "--configs", "ade", "--gpu-gib", str(H100_GIB))
    assert _serving_plan("--interleave", "--configs", "ade", "--gpu-gib", str(H200_GIB))["fit_note"] is None
    assert _serving_plan("--interleave", "--configs", "ad", "--gpu-gib", str(H100_GIB))["fit_note"] is None
    # Two GPUs hold (a) and (e) on one, (d) on the other.
    two_gpus = _serving_plan("--interleave", "--configs", "ade", "--gpus", "2", "--gpu-gib", str(H100_GIB))
    assert two_gpus["fit_note"] is None


def test_a_smaller_pool_is_suggested_where_it_would_fit():
    with pytest.raises(ValueError, match=r"--max-total-tokens 34816 \(the load's need\) fits"):
        _serving_plan("--interleave", "--configs", "ad", "--gpu-gib", "60")


def test_servers_that_come_and_go_are_capped_to_what_fits():
    plan = _serving_plan("--configs", "bde", "--max-servers-per-gpu", "3", "--gpu-gib", str(H100_GIB))
    assert plan["max_servers_per_gpu"] == 2 and "2 servers per GPU at once, not 3" in plan["fit_note"]
    plan = _serving_plan("--configs", "bde", "--max-servers-per-gpu", "3", "--gpu-gib", str(H200_GIB))
    assert plan["max_servers_per_gpu"] == 3 and plan["fit_note"] is None
    with pytest.raises(ValueError, match="one .* server needs about .* a GPU with more memory"):
        _serving_plan("--configs", "bde", "--gpu-gib", "20")


def test_the_moe_shape_pair_fits_an_h100():
    plan = _serving_plan("--interleave", "--configs", "ad", "--shape", "qwen3-moe-a3b-24l", "--max-servers-per-gpu",
                         "2", "--gpu-gib", str(H100_GIB))
    assert plan["fit_note"] is None


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
