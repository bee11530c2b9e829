"""GPU kernel suite: skipped with a stated reason where CUDA or Triton is missing."""

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    reason = None
    if not torch.cuda.is_available():
        reason = "needs a CUDA GPU: the Triton kernels run only on CUDA"
    else:
        try:
            import triton  # noqa: F401
        except ImportError:
            reason = "needs Triton"
    if reason:
        for item in items:
            item.add_marker(pytest.mark.skip(reason=reason))
