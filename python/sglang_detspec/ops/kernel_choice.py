"""Which implementation an op runs: the torch reference or the Triton kernel.

The choice is an argument of every op; nothing here reads plugin state, so a
caller that holds a configured choice passes it in. :data:`KERNELS` is the one
list of choices; the config bag validates ``SGLANG_DETSPEC_KERNEL`` against it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from .choices import one_of

if TYPE_CHECKING:
    import torch

# The config imports KERNELS on torch-free paths (the CLI's `audit --url`), so
# this module imports torch only when a choice is resolved.
KERNELS = ("auto", "torch", "triton")


def triton_available() -> bool:
    """True when Triton imports and CUDA is present."""
    import torch

    if not torch.cuda.is_available():
        return False
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def use_triton(kernel: str, device: torch.device) -> bool:
    """Resolve ``kernel`` for tensors on ``device``: True means run the Triton kernel.

    ``auto`` picks Triton for CUDA tensors when Triton imports, the torch
    reference elsewhere.

    Raises:
        ValueError: ``kernel`` is not one of ``auto``, ``torch``, ``triton``
            (None included), or ``triton`` is forced for tensors that are not
            on a CUDA device.
    """
    if not isinstance(kernel, str) or kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {one_of(KERNELS)}, got {kernel!r}")
    if kernel == "torch":
        return False
    if kernel == "triton":
        if device.type != "cuda":
            raise ValueError(f"kernel='triton' needs CUDA tensors, got tensors on {device}")
        return True
    return device.type == "cuda" and triton_available()
