"""Deterministic inference's matmuls run the plugin's batch-invariant GEMM.

Hooked symbol:

- ``sglang.srt.batch_invariant_ops.batch_invariant_ops.matmul_persistent``
  (AROUND): the one function SGLang 0.5.23's batch-invariant ``aten::mm``,
  ``aten::mm.out``, ``aten::addmm`` and ``aten::mm.dtype`` overrides call
  (``mm_batch_invariant`` and its siblings look it up by module global at
  each call, so wrapping it covers every CUDA ``mm`` / ``addmm``, hence every
  unquantised ``F.linear`` and the lm_head's ``torch.matmul``, whenever
  ``enable_batch_invariant_mode`` was or will be called). It chooses between
  DeepGEMM's bf16 GEMM and SGLang's persistent Triton kernel; both routes
  are behind it.

Why it is opt-in: both of SGLang's routes are batch-invariant by running one
tile schedule with no split along K. The plugin's GEMM (``ops/gemm.py``)
fixes the reduction order from N, K and the dtype only and splits K for
small M, so the same contract (row i's bits do not depend on the other rows
or on M) holds with more programs in flight. Measured on the H200
(``docs/determinism_tax.md``), SGLang's DeepGEMM route runs within
0.87-1.13x of cuBLAS at every measured shape and M while this GEMM reaches
0.3-1.0x, so SGLang's stays the default and this one is kept to compare.

When: the plugin's runs (:attr:`DetSpecConfig.active`: deterministic inference
on, ``SGLANG_DETSPEC_DISABLE`` unset) with ``SGLANG_DETSPEC_GEMM=plugin``
(the default is ``sglang``). Arguments the plugin's GEMM does not cover (fp32, an
``out_dtype`` other than the inputs', a bias other than 1-D [N], mixed
dtypes) go to SGLang's own function, so every call stays batch-invariant.
``bmm`` is not hooked (SGLang's ``bmm_batch_invariant``; the dense models
served here do not call it). ``SGLANG_DETSPEC_KERNEL`` does not apply: the
GEMM's torch path rounds like the kernel only in value, not in bits, and its
matmuls would come back through this hook, so CUDA always runs the Triton
kernel (the torch path serves CPU tensors, as in the unit tests).
"""

from __future__ import annotations

from ..config import current_config
from ..ops.gemm import linear, unsupported

TARGET = "sglang.srt.batch_invariant_ops.batch_invariant_ops.matmul_persistent"


def plugin_matmul(original, a, b, bias=None, out_dtype=None):
    """AROUND hook of SGLang's ``matmul_persistent(a, b, bias=None, out_dtype=None)``: a [M, K] @ b [K, N] (+ bias).

    Returns the plugin's :func:`~sglang_detspec.ops.gemm.linear` of ``(a, b.t())`` ([M, N] of a's
    dtype) in the plugin's runs with ``SGLANG_DETSPEC_GEMM=plugin`` for the
    arguments it covers; SGLang's own result otherwise. Raises what the
    chosen implementation raises.
    """
    bag = current_config()
    if (not (bag.active and bag.gemm == "plugin") or out_dtype not in (None, a.dtype)
            or getattr(a, "ndim", 0) != 2 or getattr(b, "ndim", 0) != 2):
        return original(a, b, bias=bias, out_dtype=out_dtype)
    weight = b.t()  # F.linear's [N, K] layout, a view
    if unsupported(a, weight, bias) is not None:
        return original(a, b, bias=bias, out_dtype=out_dtype)
    # Never the torch path on CUDA: its matmuls are aten::mm, which lands back here under deterministic mode.
    return linear(a, weight, bias, kernel="triton" if a.is_cuda else "torch")
