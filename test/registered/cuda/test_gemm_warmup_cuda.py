"""The DeepGEMM warm-up reaches every configuration: after it, no row count compiles a kernel.

SGLang's batch-invariant matmul runs DeepGEMM's ``bf16_gemm_nn`` on Hopper,
which compiles one kernel per configuration at its first use and keeps it in
its JIT cache folder (``DG_JIT_CACHE_DIR``, one folder per kernel). In a
fresh process with an empty cache folder: ``gemm_warmup_hook.warm_gemms`` of
two weight shapes at :func:`warm_rows` up to ``MAX_ROWS``, then every row
count 1..``MAX_ROWS`` through ``torch.mm`` (SGLang's batch-invariant mode on):
the cache holds no kernel more than after the warm-up, and the warm-up
compiled more than one (the check can see a compile). ``MAX_ROWS`` reaches
past several waves of blocks on 132 SMs and past M = 512 (an earlier
release's multicast threshold).
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from _register import register_cuda_ci

register_cuda_ci(est_time=120, suite="detspec-kernels-cuda")

MAX_ROWS = 1100
SHAPES = [(4096, 4096), (6144, 4096)]

CHILD = textwrap.dedent("""
    import json, os, sys
    import torch
    from sglang.srt.batch_invariant_ops import enable_batch_invariant_mode
    from sglang_detspec.sglang_plugin import gemm_warmup_hook as g

    max_rows, shapes = int(sys.argv[1]), json.loads(sys.argv[2])
    cache = os.path.join(os.environ["DG_JIT_CACHE_DIR"], "cache")
    count = lambda: len(os.listdir(cache)) if os.path.isdir(cache) else 0
    enable_batch_invariant_mode()
    out = {"applies": g.deepgemm_matmul_applies()}
    if out["applies"] is None:
        weights = {tuple(s): torch.randn(*s, dtype=torch.bfloat16, device="cuda") for s in shapes}
        rows = g.warm_rows(max_rows)
        out["launched"], out["reached"], out["notes"] = g.warm_gemms(weights, rows)
        out["after_warmup"] = count()
        for weight in weights.values():
            x = torch.randn(max_rows, weight.shape[1], dtype=torch.bfloat16, device="cuda")
            for m in range(1, max_rows + 1):
                torch.mm(x[:m], weight.t())
        torch.cuda.synchronize()
        out["after_every_row"] = count()
        out["rows"] = len(rows)
    print("RESULT " + json.dumps(out))
""")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="DeepGEMM's JIT compiles CUDA kernels: needs a GPU")
@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability()[0] != 9,
                    reason="SGLang's batch-invariant matmul runs DeepGEMM's SM90 kernels on Hopper only")
def test_no_row_count_compiles_after_the_warm_up(tmp_path):
    env = dict(os.environ, DG_JIT_CACHE_DIR=str(tmp_path), SGLANG_DG_CACHE_DIR=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", CHILD, str(MAX_ROWS), json.dumps(SHAPES)], env=env,
                          capture_output=True, text=True, timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-4000:]
    out = json.loads(lines[-1][len("RESULT "):])
    assert out["applies"] is None, out["applies"]
    assert out["launched"] == len(SHAPES) * out["rows"] and out["reached"] == MAX_ROWS and not out["notes"], out
    assert out["after_warmup"] > 1, out  # the cache folder sees compiles (else the check below proves nothing)
    assert out["after_every_row"] == out["after_warmup"], (
        f"row counts the warm-up missed compiled {out['after_every_row'] - out['after_warmup']} kernels: {out}")


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
