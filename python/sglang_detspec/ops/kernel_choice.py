"""Which implementation an op runs: the torch reference or the Triton kernel."""

from __future__ import annotations

import torch

from ..config import KERNELS


def triton_available() -> bool:
    """True when Triton imports and CUDA is present."""
    if not torch.cuda.is_available():
        return False
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def use_triton(kernel: str | None, device: torch.device) -> bool:
    """Resolve ``kernel`` (None: the config bag's choice) for tensors on ``device``.

    ``auto`` picks Triton for CUDA tensors when Triton imports, the torch
    reference elsewhere.

    Raises:
        ValueError: an unknown kernel name, or ``triton`` forced for tensors
            that are not on a CUDA device.
    """
    if kernel is None:
        from ..config import current_config

        kernel = current_config().kernel
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    if kernel == "torch":
        return False
    if kernel == "triton":
        if device.type != "cuda":
            raise ValueError(f"kernel='triton' needs CUDA tensors, got tensors on {device}")
        return True
    return device.type == "cuda" and triton_available()
