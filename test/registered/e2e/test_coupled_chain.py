"""Coupled chain EAGLE on a real SGLang server: changing-batch determinism, CUDA graphs on and off.

Server: ``--speculative-algorithm EAGLE --speculative-num-steps 3
--speculative-eagle-topk 1 --speculative-num-draft-tokens 4
--enable-deterministic-inference`` (no rejection flag: the plugin runs
coupled verification, DESIGN.md section 5) on the tiny Llama target and its
copying EAGLE draft, first with CUDA graphs, then restarted without them.

Checks (each writes ``<DETSPEC_E2E_OUT>/coupled_chain_*.json``):

1. CUDA graphs on: 1 unique probe output over >= 24 changing-batch trials
   (batch sizes 1..32, the probe at changing rows, permuted and split),
   bitwise-equal probe logprobs, the plugin active with ``verify='coupled'``.
   The result holds the mean accept length (of 4).
2. Restarted without CUDA graphs: check 1 again.
3. The same probe tokens on both servers.

About 4-5 minutes on an H200 while the other suite files start their servers: two server
starts of 70-150 s, 25 trials each.
"""

import sys

import pytest

from _family_checks import (  # noqa: F401  (collected here; TEST_ORDER below)
    FAMILY_CHECKS,
    test_deterministic_with_cuda_graphs,
    test_deterministic_without_cuda_graphs_after_restart,
    test_same_tokens_with_cuda_graphs_on_and_off,
)
from _register import register_cuda_ci

register_cuda_ci(est_time=270, suite="detspec-e2e-cuda")

FAMILY = "coupled_chain"
TEST_ORDER = FAMILY_CHECKS

if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
