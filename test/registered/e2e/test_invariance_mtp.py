"""Multi-layer EAGLE on vs off: the same seeded requests give the same tokens on the MTP model.

Two servers on the tiny Step3p5 model with 2 MTP layers, started side by
side, both with ``--enable-deterministic-inference``, CUDA graphs and the
multi-layer servers' flags (``DETSPEC_E2E_MTP_SERVER_ARGS``; FA3 where
installed, so both use the same attention kernels):

* ``mtp_no_spec``: no speculative decoding (the reference);
* ``mtp_coupled``: ``--enable-multi-layer-eagle --speculative-num-steps 2
  --speculative-eagle-topk 1 --speculative-num-draft-tokens 3``, coupled verify.

Check (``<DETSPEC_E2E_OUT>/invariance_mtp_*.json``): the 8 requests of
``_invariance.py`` give the same tokens on both, the plugin active (coupled
mode on the speculative server); logprob equality and the accept length
(of 3) are recorded.

About 3 minutes on an H200: two starts in parallel, then seconds of traffic.
"""

import sys

import pytest

import _e2e
import _invariance
from _register import register_cuda_ci

register_cuda_ci(est_time=180, suite="detspec-e2e-cuda")

REFERENCE = "mtp_no_spec"
SPECULATIVE = "mtp_coupled"
TEST_ORDER = ("test_same_tokens_with_multi_layer_eagle_on_and_off",)


def test_same_tokens_with_multi_layer_eagle_on_and_off(servers, models):
    vocab = _e2e.vocab_size(models.mtp)
    configs = [_e2e.server_config(name, models) for name in (REFERENCE, SPECULATIVE)]
    group = _invariance.run_group(servers, configs, vocab, "invariance_mtp_outputs")
    _invariance.check_same_tokens(group, configs[0].name, configs[1].name, f"invariance_mtp_{SPECULATIVE}_vs_{REFERENCE}")


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
