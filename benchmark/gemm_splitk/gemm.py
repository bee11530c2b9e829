"""Batch-invariant GEMM: ``linear(a, weight, bias)`` and ``mm(a, b)``.

Contract (bits): on one CUDA device, row i of the result is the same bits
whatever the other rows of ``a`` are and whatever M is. The reduction order
along K comes from (N, K, dtype) only (:mod:`.gemm_config`); the Triton
kernels (:mod:`.gemm_triton`) change only which program does the work as M
grows. The method is split-K with a fixed chunking and a fixed combine
order, as in the batch-invariance write-ups of Thinking Machines
("Defeating Nondeterminism in LLM Inference", 2025) and vLLM's batch-invariant
kernels, with the split count taken away from M.

Covered: fp16 / bf16 ``a`` [..., K] and ``weight`` [N, K] of the same dtype,
any strides, an optional bias [N] of that dtype or fp32, K >= 1, N >= 1, on
CUDA. :func:`unsupported` names what is outside that (fp32, 2-D biases, mixed
dtypes), so a caller with another GEMM (SGLang's, in :mod:`.matmul_hook`) can
fall back to it; :func:`linear` raises ``ValueError`` for it.

The torch path (``kernel="torch"``, the only one on CPU) computes the same
chunks in fp32 with ``torch.matmul`` and the same combine and rounding: the
reference for values; bits are promised only kernel against itself (on CUDA
the torch path is not batch-invariant: cuBLAS picks its algorithm by shape).
"""

from __future__ import annotations

import torch

from gemm_splitk.gemm_config import DEFAULT_TABLE, GemmTable
from sglang_detspec.ops.kernel_choice import use_triton

GEMM_DTYPES = (torch.float16, torch.bfloat16)


def unsupported(a: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> str | None:
    """Why :func:`linear` cannot run these arguments (None: it can).

    Checks metadata only (no device read), so it is cheap enough to call per
    GEMM and is safe inside CUDA-graph capture. Shapes: a [..., K], weight
    [N, K], bias [N] or None.
    """
    if not isinstance(a, torch.Tensor) or not isinstance(weight, torch.Tensor):
        return f"a and weight must be tensors, got {type(a).__name__} and {type(weight).__name__}"
    if a.dtype not in GEMM_DTYPES:
        return f"a must be float16 or bfloat16, got dtype {a.dtype}"
    if weight.dtype != a.dtype:
        return f"weight must have a's dtype {a.dtype}, got {weight.dtype}"
    if a.dim() < 1:
        return "a must have at least 1 dimension ([..., K]), got a 0-d tensor"
    if weight.dim() != 2:
        return f"weight must be 2-D [N, K], got shape {tuple(weight.shape)}"
    n, k = weight.shape
    if a.shape[-1] != k:
        return f"a.shape[-1] must equal weight.shape[1] (K = {k}), got a of shape {tuple(a.shape)}"
    if k < 1 or n < 1:
        return f"weight must have N >= 1 and K >= 1, got shape {tuple(weight.shape)}"
    if weight.device != a.device:
        return f"weight must be on a's device {a.device}, got {weight.device}"
    if bias is not None:
        if not isinstance(bias, torch.Tensor):
            return f"bias must be a tensor or None, got {type(bias).__name__}"
        if bias.dim() != 1 or bias.shape[0] != n:
            return f"bias must be 1-D [N] with N = {n}, got shape {tuple(bias.shape)}"
        if bias.dtype not in (a.dtype, torch.float32):
            return f"bias must have a's dtype {a.dtype} or float32, got {bias.dtype}"
        if bias.device != a.device:
            return f"bias must be on a's device {a.device}, got {bias.device}"
    return None


def linear(a: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *, kernel: str = "auto",
           table: GemmTable = DEFAULT_TABLE) -> torch.Tensor:
    """``a @ weight.T + bias`` (``torch.nn.functional.linear``), batch-invariant.

    Args:
        a: [..., K] float16 / bfloat16 activations, any strides.
        weight: [N, K] of a's dtype, any strides (F.linear's layout).
        bias: [N] of a's dtype or float32, or None; added in fp32 before the one rounding.
        kernel: ``auto`` (Triton on CUDA, torch elsewhere), ``torch`` or ``triton``.
        table: the tilings and K orders (:data:`.gemm_config.DEFAULT_TABLE`).

    Returns:
        [..., N] of a's dtype, contiguous: fp32 accumulation, one rounding.

    Raises:
        ValueError: any case :func:`unsupported` names, a bad ``kernel``, or
            ``triton`` forced off CUDA.
    """
    reason = unsupported(a, weight, bias)
    if reason is not None:
        raise ValueError(reason)
    lead = a.shape[:-1]
    a2 = a.reshape(-1, a.shape[-1])  # a view whenever the leading dims allow one
    if use_triton(kernel, a.device):
        from gemm_splitk.gemm_triton import gemm_triton

        out = gemm_triton(a2, weight, bias, table)
    else:
        out = linear_reference(a2, weight, bias, table)
    return out.reshape(*lead, weight.shape[0])


def mm(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None, *, kernel: str = "auto",
       table: GemmTable = DEFAULT_TABLE) -> torch.Tensor:
    """``a @ b (+ bias)`` with aten ``mm`` / ``addmm``'s layout: a [M, K], b [K, N], bias [N] or None.

    ``b`` is usually ``weight.t()`` (F.linear lowers to ``mm(a, weight.t())``),
    read through its strides without a copy. Same dtypes, result and errors
    as :func:`linear`; also ``ValueError`` unless a and b are 2-D.
    """
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor) or t.dim() != 2:
            raise ValueError(f"{name} must be a 2-D tensor, got {getattr(t, 'shape', type(t).__name__)}")
    return linear(a, b.t(), bias, kernel=kernel, table=table)


def linear_reference(a: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                     table: GemmTable = DEFAULT_TABLE) -> torch.Tensor:
    """The kernels' order written with torch: fp32 chunk sums, added in chunk order, + bias, one rounding.

    a [M, K], weight [N, K], checked by the caller. Within a chunk the sum
    order is ``torch.matmul``'s, so this matches the kernels in value, not in bits.
    """
    n, k = weight.shape
    chunk = table.k_order(n, k).chunk_len(k)
    a32, w32 = a.float(), weight.float()
    total = a32[:, :chunk] @ w32[:, :chunk].T
    for lo in range(chunk, k, chunk):
        total = total + a32[:, lo:lo + chunk] @ w32[:, lo:lo + chunk].T
    if bias is not None:
        total = total + bias.float()
    return total.to(a.dtype)
