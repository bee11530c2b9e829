"""SGLang's FA3 kernels for the GPU tests that call them, or a module-level skip saying why not."""

import pytest
import torch


def fa3_or_skip():
    """SGLang's ``flash_attention`` module (``flash_attn_with_kvcache``); skips the calling test module without a Hopper GPU or FA3."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (FA3 is a CUDA kernel)", allow_module_level=True)
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("needs a Hopper GPU (FA3 is built for sm90)", allow_module_level=True)
    return pytest.importorskip("sglang.kernels.ops.attention.flash_attention", reason="needs SGLang's FA3 kernels")
