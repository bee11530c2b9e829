"""The fused-MoE tile probe's plan, its invariance bookkeeping and its pick (benchmark/moe_tile_probe.py).

The MoE calls run on a CUDA GPU only; here SGLang's deterministic default is read through SGLang's own
``get_default_config``, and the dry run, the argument checks, the bit comparison and the choice of the
best config are checked on CPU.
"""

import json
import sys
from pathlib import Path

import pytest
import torch
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=20, suite="detspec-unit-cpu")

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmark"))
import moe_tile_probe as probe  # noqa: E402

SHAPE = (128, 2048, 768, 8)  # experts, hidden, intermediate, top-k: the Qwen3-30B-A3B-like layer


def sglang_default(deterministic: bool, m: int) -> dict:
    """SGLang's ``get_default_config`` for the bf16 layer at ``m`` tokens, published the way SGLang's tests publish."""
    from sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe_triton_config import get_default_config
    from sglang.srt.runtime_context import get_context

    experts, hidden, intermediate, topk = SHAPE
    with get_context().override_server_args(enable_deterministic_inference=deterministic):
        return get_default_config(m, experts, intermediate, hidden, topk, None, False)


def test_the_rows_start_with_sglangs_deterministic_default():
    det = sglang_default(True, 8)
    assert all(sglang_default(True, m) == det for m in (1, 512, 8192))  # one config at every M
    rows = probe.candidates(probe.deterministic_default(*SHAPE))
    assert rows[0] == {"config_label": "sglang_deterministic", "config": det, "kind": "default"}
    assert [(r["config_label"], r["config"]) for r in rows[1:3]] == [
        ("sglang_tuned", None), ("sglang_tuned_invariant_combine", None)]
    grid = rows[3:]
    # Every (BLOCK_SIZE_M, tile) pair but those the server setting refuses (shared memory): 256-wide K tiles
    # at 32 and 64 rows.
    assert {r["config_label"] for r in grid} == {f"m{bm}_n{bn}_k{bk}_w{w}_s{s}" for bm in probe.BLOCK_M
                                                 for bn, bk, w, s in probe.TILES} - {"m32_n128_k256_w8_s3",
                                                                                     "m64_n128_k256_w8_s3"}
    assert len({r["config_label"] for r in grid}) == len(grid)
    for r in grid:
        c = r["config"]
        assert r["kind"] == "fixed" and r["config_label"] == (
            f"m{c['BLOCK_SIZE_M']}_n{c['BLOCK_SIZE_N']}_k{c['BLOCK_SIZE_K']}_w{c['num_warps']}_s{c['num_stages']}")
    assert [r["config_label"] for r in probe.candidates(det, keep=["m16_n64_k128_w4_s3"])][3:] == ["m16_n64_k128_w4_s3"]


def test_the_probes_mode_switch_is_the_one_sglang_reads():
    from sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe_triton_config import get_default_config
    from sglang.srt.runtime_context import get_exec

    experts, hidden, intermediate, topk = SHAPE
    for deterministic in (True, False):
        with probe.sglang_mode(deterministic):
            assert get_exec().deterministic.enable_deterministic_inference is deterministic
            assert get_default_config(8, experts, intermediate, hidden, topk, None, False) == \
                sglang_default(deterministic, 8)
    assert sglang_default(False, 8) != sglang_default(True, 8)


def test_the_dry_run_prints_the_plan_without_a_gpu(capsys):
    assert probe.main(["--dry-run"]) == 0
    out = capsys.readouterr().out
    rows = 3 + len(probe.grid())
    assert f"{rows} rows x 11 sizes = {rows * 11} timed cells" in out
    assert "sglang_deterministic" in out and "sglang_tuned_invariant_combine" in out and "m16_n128_k256_w8_s3" in out
    assert "m64_n128_k256_w8_s3" not in out
    assert "tokens M: [4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 8192]" in out


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_without_a_gpu_the_probe_says_so(capsys):
    assert probe.main(["--tokens", "4", "--candidates", "m16_n64_k128_w4_s3"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


@pytest.mark.parametrize("argv, flag", [
    (["--tokens", "0"], "--tokens"), (["--tokens", "4,x"], "--tokens"), (["--tokens", ","], "--tokens"),
    (["--experts", "0"], "--experts"), (["--topk", "9", "--experts", "8"], "--topk"),
    (["--repeats", "0"], "--repeats"), (["--budget-s", "0"], "--budget-s"), (["--candidates", "m8_n1"], "--candidates"),
])
def test_bad_arguments_are_named(argv, flag, capsys):
    with pytest.raises(SystemExit) as exit_:
        probe.parse_args(argv)
    assert exit_.value.code == 2 and f"error: {flag}" in capsys.readouterr().err


def test_tokens_are_sorted_and_distinct():
    assert probe.parse_args(["--tokens", "64, 4,4,512"]).tokens == [4, 64, 512]


def test_the_invariance_batches_straddle_tiles_and_hide_the_reference_tokens():
    cases = probe.invariance_cases(512, 2048, seed=0)
    sizes = [len(idx) for _, idx in cases]
    assert sizes[:4] == [1, 1, 1, 1] and sizes[-2:] == [512, 2048]
    for tile in (16, 32, 64, 128, 256):
        assert {tile - 1, tile, tile + 1} <= set(sizes)
    for _, idx in cases:
        assert len(set(idx.tolist())) == len(idx) and int(idx.max()) < 2048
        assert int(idx.max()) < 512 or len(idx) == 2048
    assert sorted(cases[-2][1].tolist()) == list(range(512)) and cases[-2][1].tolist() != list(range(512))
    scattered = cases[-1][1].tolist()
    assert sorted(scattered) == list(range(2048)) and scattered[:512] != list(range(512))
    assert [i.tolist() for _, i in probe.invariance_cases(512, 2048, seed=0)] == [i.tolist() for _, i in cases]


def test_rows_are_compared_by_their_bits():
    ref = torch.randn(8, 16).to(torch.bfloat16)
    idx = torch.tensor([5, 9, 2])  # token 9 is not in the reference batch: not compared
    out = torch.stack([ref[5], torch.full((16,), 7.0, dtype=torch.bfloat16), ref[2]])
    assert probe.first_difference(out, ref, idx) is None
    out.view(torch.int16)[2, 3] ^= 1  # the lowest bit of one value
    assert probe.first_difference(out, ref, idx).startswith("1 of 2 rows differ, first token 2")
    zeros = torch.zeros(1, 4, dtype=torch.bfloat16)
    assert probe.first_difference(-zeros, zeros, torch.tensor([0])) is not None  # equal values, other bits


def row(label, ms, invariant=True, fixed=True, **extra):
    return {"config_label": label, "fixed": fixed, "invariant": invariant, "ms": ms, **extra}


def test_the_pick_is_the_fastest_invariant_fixed_config_at_decode_sizes():
    ms = lambda *v: dict(zip(("4", "64", "512", "8192"), v))  # noqa: E731
    rows = [row("sglang_deterministic", ms(1.0, 2.0, 4.0, 40.0)),
            row("sglang_tuned", ms(0.2, 0.4, 1.0, 10.0), invariant=False, fixed=False),
            row("sglang_tuned_invariant_combine", ms(0.1, 0.1, 0.1, 1.0), fixed=False),
            row("fast_but_mixing", ms(0.1, 0.2, 0.5, 5.0), invariant=False),
            row("broken", ms(0.1, 0.1, 0.1, 1.0), error="OutOfResources"),
            row("untimed_at_64", {"4": 0.1, "512": 0.1, "8192": 1.0}),
            row("good", ms(0.5, 0.8, 2.0, 60.0)),
            row("good_at_prefill", ms(0.5, 1.0, 2.0, 20.0))]
    best = probe.pick_best(rows)
    assert best["decode_weighted"] == "good" and best["decode_sizes"] == [4, 64, 512]
    assert best["decode_sum_ms"] == pytest.approx(3.3) and best["prefill_ms"] == {"8192": 60.0}
    assert best["decode_ratio_to_sglang_deterministic"] == pytest.approx(3.3 / 7.0, abs=1e-4)
    assert best["decode_ratio_to_sglang_tuned"] == pytest.approx(3.3 / 1.6, abs=1e-4)
    assert best["prefill_ratio_to_sglang_deterministic"] == {"8192": 1.5}
    assert probe.pick_best([r for r in rows if not r["invariant"]]) is None
    assert probe.pick_best([row("prefill_only", {"8192": 1.0})]) is None
    # A pick with its config names the server setting that runs it, which the plugin's own parser reads back.
    from sglang_detspec.config import env_settings

    tile = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1, "num_warps": 4,
            "num_stages": 2}
    named = probe.pick_best([row("m16_n128_k128_w4_s2", ms(0.5, 0.8, 2.0, 60.0), config=tile)])
    name, value = named["setting"].split("=")
    assert env_settings({name: value})["moe_tile"] == (16, 128, 128, 1, 4, 2)
    # SGLang's own row as built by the probe (a four-key config) wins: its setting is SGLang's default.
    own = dict(probe.candidates(probe.deterministic_default(*SHAPE))[0], fixed=True, invariant=True,
               ms=ms(0.1, 0.1, 0.1, 1.0))
    assert probe.pick_best([own, row("m16_n128_k128_w4_s2", ms(0.5, 0.8, 2.0, 60.0), config=tile)])["setting"] == \
        "SGLANG_DETSPEC_MOE_TILE=sglang"
    assert env_settings({"SGLANG_DETSPEC_MOE_TILE": "sglang"})["moe_tile"] is None


def test_ratios_and_same_bits_are_filled_in(tmp_path):
    rows = [row("sglang_deterministic", {"4": 2.0}), row("sglang_tuned", {"4": 1.0}, fixed=False),
            row("m16_n64_k128_w4_s3", {"4": 0.5})]
    one, zero = torch.ones(2, 2, dtype=torch.bfloat16), torch.zeros(2, 2, dtype=torch.bfloat16)
    refs = {"sglang_deterministic": one, "sglang_tuned": zero, "m16_n64_k128_w4_s3": one.clone()}
    probe.add_ratios(rows, refs)
    assert rows[2]["ratio_to_deterministic"] == {"4": 0.25} and rows[2]["ratio_to_tuned"] == {"4": 0.5}
    assert rows[0]["same_bits_as"] == ["m16_n64_k128_w4_s3"] and rows[1]["same_bits_as"] == []
    doc = {"date_utc": "2026-12-07T00:00:00+00:00", "machine": {"gpu": "H100"}, "sglang_version": "0.5.23",
           "torch_version": "t", "triton_version": "3.8.0", "shape": {}, "tokens": [4], "rows": rows,
           "best": probe.pick_best(rows), "timing": "CUDA graph"}
    probe.write(doc, tmp_path / "run")
    written = json.loads((tmp_path / "run" / "moe_tile.json").read_text())
    assert written["best"]["decode_weighted"] == "m16_n64_k128_w4_s3"
    assert "| m16_n64_k128_w4_s3 | True | 0.5000 | 0.250 |" in (tmp_path / "run" / "moe_tile.md").read_text()


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
