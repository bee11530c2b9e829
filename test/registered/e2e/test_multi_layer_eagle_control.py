"""Control for the multi-layer EAGLE suite: the same server without ``--enable-deterministic-inference``.

Without the flag SGLang ignores ``sampling_seed`` and the plugin stays
inactive, so the probe's output must change with the batch: more than 1
unique output over the same trials as ``test_multi_layer_eagle.py``.

Runs with ``--disable-cuda-graph``: the control only has to show that the
trials see batch dependence, which CUDA graphs neither create nor remove, and
skipping the capture shortens the start. About 3 minutes on an H200.
"""

import sys

import pytest

import _e2e
from _register import register_cuda_ci

register_cuda_ci(est_time=200, suite="detspec-e2e-cuda")

FAMILY = "multi_layer_eagle"


def test_control_without_deterministic_inference_varies(servers, models):
    config = _e2e.server_config(FAMILY, models, deterministic=False, cuda_graph=False)
    run = _e2e.run_audit(servers, config, _e2e.vocab_size(models.mtp))
    _e2e.check_control_audit(run, f"{FAMILY}_control_audit")


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
