"""SGLang's own FA3 calls at head sizes 65-128: decode = prefill = chunks = chain verify, so the split stands down.

``sglang_plugin/fa3_own_calls.sglang_calls_agree`` (the start-up check a
server that verifies no trees runs before it keeps SGLang's FA3 calls) on
the GPU: FA3 called as SGLang's backend calls it under deterministic
inference, decode of every position, one prefill, chunks of 100 rows, chain
verifies of 4 rows, each request alone and all in one call, outputs and
log-sum-exp compared bit for bit. At head sizes 96 and 128 (the 8B Llama's
32 / 8 heads) it must pass, at several lengths and seeds, in bf16 and fp16:
that is what ``config.fa3_own_calls_exact`` rests on. Positive control (the
check can fail): at head size 64 FA3 runs a one-row call on its unmasked
kernel, whose bits part from the prefill's past 128 keys.
"""

import sys

import pytest
import torch

from _fa3 import fa3_or_skip
from _register import register_cuda_ci

register_cuda_ci(est_time=20, suite="detspec-kernels-cuda")

fa3_or_skip()

from sglang_detspec.config import fa3_own_calls_exact  # noqa: E402
from sglang_detspec.sglang_plugin.fa3_own_calls import sglang_calls_agree  # noqa: E402

DEV = torch.device("cuda")
LONG = (5, 191, 193, 460, 1100)


@pytest.mark.parametrize("heads, kv_heads, dim", [(32, 8, 128), (8, 8, 128), (28, 4, 96)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("seed", [0, 1])
def test_sglangs_calls_agree_where_the_rule_keeps_them(heads, kv_heads, dim, dtype, seed):
    assert fa3_own_calls_exact(dim, verifies_trees=False)
    assert sglang_calls_agree(heads, kv_heads, dim, dtype, DEV, seed=seed, lengths=LONG)


def test_positive_control_head_size_64_decode_parts_from_prefill():
    assert not fa3_own_calls_exact(64, verifies_trees=False)
    assert not sglang_calls_agree(4, 4, 64, torch.bfloat16, DEV, lengths=LONG)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
