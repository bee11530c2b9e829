"""Controls: each server family without ``--enable-deterministic-inference``.

Without the flag SGLang ignores ``sampling_seed`` and the plugin stays
inactive, so the probe's output must change with the batch: more than 1
unique output over the same trials as the deterministic suites. A control
that does not vary would mean the trials show no batch dependence, and the
deterministic results would prove nothing.

Runs with ``--disable-cuda-graph``: a control only has to show that the
trials see batch dependence, which CUDA graphs neither create nor remove, and
skipping the capture shortens the start. About 2 minutes per family on an
H200 (``-k chain_eagle`` or ``-k multi_layer_eagle`` runs one).
"""

import sys

import pytest

import _e2e
from _register import register_cuda_ci

register_cuda_ci(est_time=300, suite="detspec-e2e-cuda")

TEST_ORDER = ("test_control_without_deterministic_inference_varies",)


@pytest.mark.parametrize("family", ["chain_eagle", "multi_layer_eagle"])
def test_control_without_deterministic_inference_varies(servers, models, family):
    config = _e2e.server_config(family, models, deterministic=False, cuda_graph=False)
    run = _e2e.run_audit(servers, config, _e2e.vocab_size(_e2e.served_model(family, models)))
    _e2e.check_control_audit(run, f"{family}_control_audit")


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
