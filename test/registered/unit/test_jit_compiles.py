"""DeepGEMM compile counting in server logs (benchmark/serving/jit_compiles.py)."""

import json
import sys
from pathlib import Path

import pytest
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="detspec-unit-cpu")

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmark" / "serving"))

import jit_compiles  # noqa: E402

# As an SGLang 0.5.23 server with DG_JIT_DEBUG=1 logs them (paths and kernel names shortened).
LOG = """\
[2026-12-04 16:03:32] Capture target verify CUDA graph begin. backend=full, num_tokens_per_req=4
ptxas info    : Compiling entry function '_ZN9deep_gemm19sm90_bf16_gemm_implILj128ELj192E' for 'sm_90a'
ptxas info    : Compiling entry function '_ZN9deep_gemm19sm90_bf16_gemm_implILj128ELj128E' for 'sm_90a'
[2026-12-04 16:07:06] The server is fired up and ready to roll!
[2026-12-04 16:07:18] Prefill batch, #new-seq: 7, #new-token: 896
ptxas info    : Compiling entry function '_ZN9deep_gemm19sm90_bf16_gemm_implILj256ELj128E' for 'sm_90a'
ptxas info    : Compile time = 318.741 ms
ptxas info    : Compiling entry function '_ZN9deep_gemm19sm90_bf16_gemm_implILj64ELj112E' for 'sm_90a'
[2026-12-04 16:08:33] Decode batch, #running-req: 128
ptxas info    : Compiling entry function '_ZN9deep_gemm19sm90_bf16_gemm_implILj128ELj224E' for 'sm_90a'
"""
# The same with DG_PRINT_CONFIGS=1: one line per new shape, as sgl_deep_gemm 0.2.3's get_best_config prints it
# (enums as integers; expected_m and the storage config's load_ / store_block_m are the traps for the regex).
DESC = ("GemmDesc(gemm_type=0, kernel_type=0, m={m}, n=4096, k=14336, num_groups=1, major_a=0, major_b=0, "
        "mma_kind=1, a_dtype=15, b_dtype=15, cd_dtype=15, with_accumulation=0, num_sms=132, tc_util=100, "
        "compiled_dims=nk, ensure_zero_padding=0, expected_m=1, expected_n=4096, expected_k=14336, "
        "expected_num_groups=1): GemmConfig(layout=Layout(swap_ab=0, block_m={bm}, block_n=128, block_k=64, "
        "cluster_m=1, cluster_n=1), storage_config=StorageConfig(load_block_m=7, load_block_n=128, "
        "store_block_m=9, store_block_n=128, swizzle_a_mode=128), pipeline_config=PipelineConfig(num_stages=5)), "
        "LayoutInfo()")
SHAPES_LOG = "\n".join([
    "[2026-12-04 16:03:32] Capture target verify CUDA graph begin.",
    DESC.format(m=4, bm=64),
    "[2026-12-04 16:07:06] The server is fired up and ready to roll!",
    "[2026-12-04 16:07:18] Prefill batch, #new-seq: 7, #new-token: 896",
    DESC.format(m=896, bm=128),
    "GemmDesc(gemm_type=0, kernel_type=0, m=37, n=128256, k=4096, num_groups=1, expected_m=64)",
    "GemmDesc(gemm_type=0, m = 5, n = 6, k = 7)",  # another spelling: counted as not read, never as a shape
])


def test_compiles_split_at_the_ready_line_with_the_last_time_seen():
    got = jit_compiles.compiles(LOG.splitlines())
    assert got == {"ready_at": "2026-12-04 16:07:06", "at_start_up": 2, "while_serving": 3,
                   "serving_times": {"2026-12-04 16:07:18": 2, "2026-12-04 16:08:33": 1},
                   "shapes_at_start_up": 0, "shapes_while_serving": [], "shapes_unread": 0}


def test_shapes_first_met_while_serving_name_their_row_counts(capsys, tmp_path):
    got = jit_compiles.compiles(SHAPES_LOG.splitlines())
    assert got["shapes_at_start_up"] == 1 and got["while_serving"] == 0 and got["shapes_unread"] == 1
    assert got["shapes_while_serving"] == [
        {"m": 896, "n": 4096, "k": 14336, "block_m": 128, "block_n": 128, "time": "2026-12-04 16:07:18"},
        {"m": 37, "n": 128256, "k": 4096, "block_m": None, "block_n": None, "time": "2026-12-04 16:07:18"}]
    log = tmp_path / "server_y.log"
    log.write_text(SHAPES_LOG)
    assert jit_compiles.main([str(log)]) == 0
    assert ("1 at start-up, 2 first met while serving, row counts [37, 896]; 1 GemmDesc lines not read"
            in capsys.readouterr().out)


def test_a_server_that_never_got_ready_counts_everything_as_start_up():
    got = jit_compiles.compiles(LOG.splitlines()[:3])
    assert got["ready_at"] is None and got["at_start_up"] == 2 and got["while_serving"] == 0


def test_the_command_line_writes_json(tmp_path, capsys):
    log = tmp_path / "server_x.log"
    log.write_text(LOG)
    out = tmp_path / "jit.json"
    assert jit_compiles.main([str(log), "--json", str(out)]) == 0
    assert "2 at start-up, 3 while serving" in capsys.readouterr().out
    assert json.loads(out.read_text())[str(log)]["while_serving"] == 3


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
