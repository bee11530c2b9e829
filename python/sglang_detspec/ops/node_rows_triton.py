"""Triton path of :func:`~sglang_detspec.ops.node_rows.node_key_lists`: each node row copied up to its length.

One program per node row loops over its request's prefix only, so the cost
follows the prefixes, not the table width (the context length under CUDA
graphs). Equal to the torch path on every entry up to ``lens[r]`` (the unit
suite runs it under Triton's interpreter, the GPU suite on CUDA).
"""

from __future__ import annotations

import triton
import triton.language as tl

BLOCK = 1024  # prefix entries one loop iteration copies


@triton.jit
def _node_rows_kernel(prefix_ptr, prefix_stride, prefix_lens_ptr, anc_ptr, anc_stride, anc_lens_ptr, out_ptr,
                      out_stride, out_lens_ptr, width, N: tl.constexpr, N_POW2: tl.constexpr, BLOCK: tl.constexpr):
    r = tl.program_id(0)
    b = r // N
    # A prefix longer than the table (never from SGLang) is cut to it, so no write leaves the row.
    plen = tl.minimum(tl.load(prefix_lens_ptr + b).to(tl.int64), width)
    src = prefix_ptr + b.to(tl.int64) * prefix_stride
    dst = out_ptr + r.to(tl.int64) * out_stride
    for start in range(0, plen, BLOCK):  # one program per node row, looping over its prefix only
        offs = start + tl.arange(0, BLOCK)
        keep = offs < plen
        tl.store(dst + offs, tl.load(src + offs, mask=keep), mask=keep)
    cols = tl.arange(0, N_POW2)
    inside = cols < N
    anc = tl.load(anc_ptr + r.to(tl.int64) * anc_stride + cols, mask=inside)
    tl.store(dst + plen + cols, anc.to(tl.int32), mask=inside)
    tl.store(out_lens_ptr + r, (plen + tl.load(anc_lens_ptr + r).to(tl.int64)).to(tl.int32))


def node_rows_triton(prefix_table, prefix_lens, ancestor_table, ancestor_lens, n, table, lens) -> None:
    """Write ``table`` [bs * n, W + n] int32 and ``lens`` [bs * n] int32 in place (arguments as ``node_key_lists``).

    Raises:
        ValueError: a table without unit column stride, naming it and its strides.
    """
    for name, t in (("prefix_table", prefix_table), ("ancestor_table", ancestor_table), ("out_table", table)):
        if t.stride(1) != 1:
            raise ValueError(f"{name} must have unit column stride, got strides {t.stride()}")
    _node_rows_kernel[(table.shape[0],)](
        prefix_table, prefix_table.stride(0), prefix_lens, ancestor_table, ancestor_table.stride(0), ancestor_lens,
        table, table.stride(0), lens, prefix_table.shape[1], N=n, N_POW2=triton.next_power_of_2(n), BLOCK=BLOCK,
    )
