"""Skip the GPU folders, each with its stated reason, where their hardware is missing.

``cuda/`` holds the Triton kernel suite, ``e2e/`` launches real SGLang
servers; ``unit/`` runs everywhere. The hook sees every item of the session,
so only items under a GPU folder are marked.
"""

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def _cuda_reason(what: str) -> str | None:
    try:
        import torch
    except ImportError:
        return f"needs torch and a CUDA GPU: {what}"
    if not torch.cuda.is_available():
        return f"needs a CUDA GPU: {what}"
    return None


def _kernel_reason() -> str | None:
    reason = _cuda_reason("the Triton kernels run only on CUDA")
    if reason is None:
        try:
            import triton  # noqa: F401
        except ImportError:
            reason = "needs Triton"
    return reason


def _server_reason() -> str | None:
    return _cuda_reason(
        "these tests launch real SGLang servers (CUDA graphs, Triton and FA3 attention, "
        "deterministic rejection sampling run only on CUDA)"
    )


GPU_FOLDERS = {"cuda": _kernel_reason, "e2e": _server_reason}


def pytest_collection_modifyitems(config, items):
    reasons: dict[str, str | None] = {}
    for item in items:
        parts = Path(str(item.path)).resolve().relative_to(HERE).parts
        folder = parts[0] if len(parts) > 1 else None
        if folder not in GPU_FOLDERS:
            continue
        if folder not in reasons:
            reasons[folder] = GPU_FOLDERS[folder]()
        if reasons[folder]:
            item.add_marker(pytest.mark.skip(reason=reasons[folder]))
