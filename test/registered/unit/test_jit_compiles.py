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


def test_compiles_split_at_the_ready_line_with_the_last_time_seen():
    got = jit_compiles.compiles(LOG.splitlines())
    assert got == {"ready_at": "2026-12-04 16:07:06", "at_start_up": 2, "while_serving": 3,
                   "serving_times": {"2026-12-04 16:07:18": 2, "2026-12-04 16:08:33": 1}}


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
