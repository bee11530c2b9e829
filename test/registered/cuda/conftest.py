"""GPU kernel suite: skipped with a stated reason where CUDA or Triton is missing."""

from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent


def _skip_reason() -> str | None:
    if not torch.cuda.is_available():
        return "needs a CUDA GPU: the Triton kernels run only on CUDA"
    try:
        import triton  # noqa: F401
    except ImportError:
        return "needs Triton"
    return None


def pytest_collection_modifyitems(config, items):
    # This hook sees every item of the session, not only this folder's: mark ours only.
    reason = _skip_reason()
    if reason is None:
        return
    for item in items:
        if HERE in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.skip(reason=reason))
