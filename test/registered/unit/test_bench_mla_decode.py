"""The MLA decode benchmark's arguments (benchmark/bench_mla_decode.py); its timing runs on a CUDA GPU only."""

import sys
from pathlib import Path

import pytest
import torch
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="detspec-unit-cpu")

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmark"))
import bench_mla_decode as bench  # noqa: E402


@pytest.mark.parametrize("args, words", [
    (["--heads", "0"], "--heads, --batches and --contexts must be >= 1 each"),
    (["--contexts", "128,-1"], "must be >= 1 each"),
    (["--heads", "16,x"], "--heads, --batches and --contexts take comma-separated integers"),
    (["--reps", "0"], "--reps must be >= 1"),
])
def test_bad_arguments_name_the_argument(capsys, args, words):
    with pytest.raises(SystemExit) as info:
        bench.main(args)
    assert info.value.code == 2 and words in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message a machine without a CUDA GPU gets")
def test_without_a_gpu_it_says_so(capsys):
    with pytest.raises(SystemExit):
        bench.main([])
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_the_table_reads_the_rows():
    t = {"median_us": 2.0, "min_us": 1.5, "max_us": 2.5}
    row = {"heads": 16, "batch": 8, "context": 2048, "sglang_split_kv": t, "plugin_one_pass": t, "ratio": 1.0}
    # A run before the packed column (2026-12-07's rows) reads as one without it.
    assert bench.table([row]).splitlines()[-1] == ("| 16 | 8 | 2048 | 2.0 (1.5..2.5) | 2.0 (1.5..2.5) | 1.00 | - | "
                                                   "- | - |")
    packed = {**row, "plugin_packed": {"median_us": 0.5, "min_us": 0.4, "max_us": 0.6}, "packed_ratio": 0.25,
              "packed_equal": True}
    assert bench.table([packed]).splitlines()[-1].endswith("| 0.5 (0.4..0.6) | 0.25 | True |")


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
