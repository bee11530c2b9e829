"""SGLang's batch-invariant matmul through the split-K GEMM, in one process (experiment).

Target: ``sglang.srt.batch_invariant_ops.batch_invariant_ops.matmul_persistent``,
the one function SGLang 0.5.23's batch-invariant ``aten::mm``,
``aten::mm.out``, ``aten::addmm`` and ``aten::mm.dtype`` overrides call
(``mm_batch_invariant`` and its siblings look it up as a module global at
each call, so rebinding it covers every CUDA ``mm`` / ``addmm``, hence every
unquantised ``F.linear`` and the lm_head's ``torch.matmul``, while
``enable_batch_invariant_mode`` is on). Behind it SGLang chooses between
DeepGEMM's bf16 GEMM and its persistent Triton kernel; both run one tile
schedule with no split along K. The split-K GEMM (:mod:`.gemm`) keeps the
same contract (row i's bits depend neither on the other rows nor on M) with
more programs in flight at small M.

:func:`installed` rebinds the target for the current process only: a
benchmark or a test. A server's scheduler processes would need it applied
through an SGLang plugin entry point, which this experiment does not ship
(the package's plugin did, until the GEMM was measured slower than SGLang's:
see ``__init__.py``).
"""

from __future__ import annotations

import contextlib
import functools

from gemm_splitk.gemm import linear, unsupported

TARGET = "sglang.srt.batch_invariant_ops.batch_invariant_ops.matmul_persistent"


def plugin_matmul(original, a, b, bias=None, out_dtype=None):
    """AROUND hook of SGLang's ``matmul_persistent(a, b, bias=None, out_dtype=None)``: a [M, K] @ b [K, N] (+ bias).

    Returns the split-K :func:`~gemm_splitk.gemm.linear` of ``(a, b.t())``
    ([M, N] of a's dtype) for the arguments it covers, and ``original(a, b,
    bias=bias, out_dtype=out_dtype)`` for the rest (fp32, an ``out_dtype``
    other than a's, a bias other than 1-D [N], mixed dtypes, operands that
    are not 2-D), so every call stays batch-invariant. Raises what the chosen
    implementation raises.
    """
    if out_dtype not in (None, a.dtype) or getattr(a, "ndim", 0) != 2 or getattr(b, "ndim", 0) != 2:
        return original(a, b, bias=bias, out_dtype=out_dtype)
    weight = b.t()  # F.linear's [N, K] layout, a view
    if unsupported(a, weight, bias) is not None:
        return original(a, b, bias=bias, out_dtype=out_dtype)
    # Never the torch path on CUDA: its matmuls are aten::mm, which would come back here in batch-invariant mode.
    return linear(a, weight, bias, kernel="triton" if a.is_cuda else "torch")


@contextlib.contextmanager
def installed():
    """Within the block, SGLang's ``matmul_persistent`` (and the package's re-export) runs :func:`plugin_matmul`.

    Yields the wrapper; restores SGLang's function on exit, also on error.
    """
    from sglang.srt import batch_invariant_ops as package
    from sglang.srt.batch_invariant_ops import batch_invariant_ops as bio

    original = bio.matmul_persistent
    exported = getattr(package, "matmul_persistent", None)

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        return plugin_matmul(original, *args, **kwargs)

    bio.matmul_persistent = wrapper
    if exported is original:
        package.matmul_persistent = wrapper
    try:
        yield wrapper
    finally:
        bio.matmul_persistent = original
        if exported is original:
            package.matmul_persistent = original
