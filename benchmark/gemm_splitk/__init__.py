"""Experiment: a split-K batch-invariant GEMM for SGLang's deterministic inference (not part of the package).

A Triton GEMM whose reduction order along K comes from (N, K, dtype) only,
split over K for small M so that more programs run at once, and combined in
a fixed order (:mod:`.gemm_config`, :mod:`.gemm_triton`, :mod:`.gemm`), and
a hook that routes SGLang 0.5.23's batch-invariant ``matmul_persistent``
through it in one process (:mod:`.matmul_hook`).

Why it is an experiment and not shipped: on the H200 it was measured slower
than SGLang's own deterministic GEMM (DeepGEMM on Hopper) at every M that
matters for decoding; the figures are in
``docs/benchmarks/determinism_tax/2026-12-02-h200-plugin-gemm/gemm.md``
(``docs/determinism_tax.md`` summarises them). It is kept runnable so the
comparison can be repeated on other GPUs or Triton versions; README.md in
this folder has the commands.

Import it with ``benchmark/`` on ``sys.path`` (the benchmark and the tests
put it there); it imports ``sglang_detspec`` for the kernel choice only.
"""
