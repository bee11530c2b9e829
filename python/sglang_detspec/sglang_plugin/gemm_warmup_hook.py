"""Start-up: DeepGEMM's kernels for SGLang's batch-invariant matmul compiled before the server takes requests.

Under ``--enable-deterministic-inference`` SGLang replaces ``aten::mm`` and
``aten::addmm`` with its batch-invariant matmul
(``batch_invariant_ops.matmul_persistent``), which on Hopper runs DeepGEMM's
``bf16_gemm_nn`` in its deterministic mode. DeepGEMM compiles one kernel per
configuration its heuristic picks from (M, N, K) at the first call that
needs it. CUDA-graph capture meets the row counts of the captured decode and
verify batches; a prefill's row count (anything up to the chunk) meets new
configurations inside requests, each compile a stall of its batch (the
measured run: ``docs/benchmarks/determinism_tax/2026-12-04-h200-jit-probe/``).

Which row counts: DeepGEMM's SM90 heuristic reads M only through the block
counts ceil(M / b) of its block-M candidates (16 and 32 while M <= 16 / 32,
then 64, 128 and 256); the release SGLang 0.5.23 installs weighs those counts
in a cost model, earlier releases also broke ties at M = b and turned
multicast on from M >= 512. Either way nothing changes inside an interval
(64(j - 1), 64 j] but at its right end, so every M up to 64 and both ends of
each such interval reach every configuration (:func:`warm_rows`), about
2 * max_rows / 64 launches per weight shape, one shape per distinct (N, K),
not per layer. On other architectures (SM100's swap-AB candidates step by
16 rows) the hook does not warm: it logs why.

The warm-up runs for at most ``SGLANG_DETSPEC_GEMM_WARMUP_S`` seconds (the
bag's ``gemm_warmup_s``; 0 turns it off): each new configuration is a JIT
compile, and DeepGEMM keeps what it compiled on disk, so a later start on
the same machine loads those and goes further. Order (:func:`warm_order`):
every row count of a decode or verify batch first, ascending (every step
meets them), then the prefill sizes above them coarse to fine, the largest
first: a budget that runs out leaves gaps spread over the prefill range,
not its whole top (on the H200 the ascending order reached 769 of 8,192
rows in 60 s, and the first wave of 128 prompts still compiled:
``docs/benchmarks/determinism_tax/2026-12-04-h200-switch-tree/``). Where
decode CUDA graphs are captured the prefill range comes first and the
decode rows last: the capture compiles the captured batch sizes' rows
anyway, and only eager calls (a prefill of at most that many tokens, an LM
head over a prefill batch's requests) meet the others (on an H100 the
decode-first order reached 69 of 318 row counts in 60 s, 25 kernels were on
disk before serving, as many as the capture alone had compiled on an H200,
and 11 compiled while serving:
``docs/benchmarks/determinism_tax/2026-12-05-h100-chain-own-calls/``; with
the prefill range first, the 60 s budget (69 s as logged) reached 269 of 318 and every kernel serving
met, c = 1 to 128: ``docs/benchmarks/determinism_tax/2026-12-05-h100-ade/``).
Not warmed (they compile at first use, as
without the plugin): row counts past the budget or above :func:`forward_sizes.max_rows_for` (with
chunked prefill off, a first request longer than ``max_prefill_tokens``),
launches whose tensors would pass :data:`MAX_TENSOR_BYTES`, and the
float32-output LM head of ``--enable-fp32-lm-head`` (``aten::mm.dtype``).

Registered BEFORE ``Scheduler.init_all_cuda_graphs`` (``warmup_hook.TARGET``),
so the capture that follows finds its kernels compiled too.
"""

from __future__ import annotations

import logging
import time

import torch

from ..config import GEMM_WARMUP_ENV, current_config
from .forward_sizes import models_of, scheduler_max_rows

# The start-up lines (the E2E suites require one of the first two on every deterministic server, never the third).
WARMED_LOG = "sglang-detspec: DeepGEMM matmul warmed before serving"
SKIPPED_LOG = "sglang-detspec: no DeepGEMM warm-up"
FAILED_LOG = "sglang-detspec: DeepGEMM warm-up failed"
# DeepGEMM's M granularity that matters (see the module docstring); every M up to it is warmed one by one.
ROW_CLASS = 64
# Largest transient input or output one warm-up launch may allocate (an LM head at many rows is the large one).
MAX_TENSOR_BYTES = 1 << 30
# The architecture whose DeepGEMM heuristic warm_rows covers (compute capability major).
WARMED_ARCH = 9
# SGLang's conditions for its DeepGEMM branch (batch_invariant_ops.matmul_persistent): N >= 16, 16-byte rows.
MIN_N = 16
ALIGN_BYTES = 16


def warm_rows(max_rows: int) -> list[int]:
    """Row counts M whose launches compile every DeepGEMM configuration for M in [1, ``max_rows``].

    Every M up to :data:`ROW_CLASS`, then both ends of each interval
    (64(j - 1), 64 j] that reaches ``max_rows``, and ``max_rows`` itself.
    Sorted, distinct.

    Raises:
        ValueError: ``max_rows`` < 1.
    """
    if max_rows < 1:
        raise ValueError(f"max_rows must be >= 1, got {max_rows}")
    rows = set(range(1, min(max_rows, ROW_CLASS) + 1))
    for end in range(2 * ROW_CLASS, max_rows + ROW_CLASS, ROW_CLASS):
        rows.update((end - ROW_CLASS + 1, end))
    rows.add(max_rows)
    return sorted(r for r in rows if r <= max_rows)


def warm_order(rows: list[int], first_up_to: int, captured: bool = False) -> list[int]:
    """``rows`` in warm-up order: those <= ``first_up_to`` ascending and the rest coarse to fine.

    The rest, ascending as r_1 .. r_n, go largest first, then by the
    binary ruler of their index j (every 2^k-th before the 2^(k-1)-th ones
    between them: j = n, then the highest power-of-two multiples, ...), so
    any prefix of the order samples the list of prefill row counts evenly
    by position (of each 64-row interval's two ends, the upper ones come
    before the lower ones).

    Args:
        rows: distinct row counts (:func:`warm_rows`), any order.
        first_up_to: the largest decode or verify batch's rows (0: none).
        captured: the decode and verify batches run under CUDA graphs. Their capture, after the
            warm-up, compiles the captured batch sizes' row counts anyway, and only eager calls meet the
            other row counts up to ``first_up_to`` (on an H200 without the warm-up all 25 kernels
            of the chain's start-up compiled in its verify capture; on an H100 with a 60 s warm-up
            that took the decode rows first, 25 were on disk before serving as well, and 11 still
            compiled while serving), so the rows up to ``first_up_to`` go last, after the prefill
            range. Without graphs they go first (every eager step meets them).
    """
    ordered = sorted(rows)
    head = [r for r in ordered if r <= first_up_to]
    rest = [r for r in ordered if r > first_up_to]
    n = len(rest)

    def ruler(j: int) -> tuple[int, int]:  # j is 1-based; the largest (j = n) sorts before every level
        return (-(n.bit_length() + 1), 0) if j == n else (-((j & -j).bit_length()), j)
    coarse = [rest[j - 1] for j in sorted(range(1, n + 1), key=ruler)]
    return coarse + head if captured else head + coarse


def first_rows(running: int | None, graph_max_bs: int | None, tokens_per_request: int) -> int:
    """Rows of the largest decode or verify batch :func:`warm_order` takes first (0: none known).

    The batch bound is the largest CUDA-graph decode batch where SGLang
    captures any (larger batches run eagerly and are rare), else the running
    bound; SGLang's default running bound (thousands) would otherwise cover
    every prefill size and leave nothing coarse to fine.
    """
    bounds = [b for b in (running, graph_max_bs) if b and b > 0]
    return min(bounds) * max(tokens_per_request, 1) if bounds else 0


def _captured_decode_bs() -> list[int]:
    """The decode batch sizes SGLang captures CUDA graphs for (``cuda_graph_config.decode``); empty where its
    backend is disabled or no config is published (every decode step eager)."""
    try:
        from sglang.srt.runtime_context import get_exec

        decode = get_exec().graph.cuda_graph_config.decode
        disabled = str(getattr(decode.backend, "value", decode.backend)) == "disabled"
        return [] if disabled else list(decode.bs or [])
    except Exception:  # no graph config published: the running bound alone, no capture to rely on
        return []


def covered_up_to(rows: list[int], done) -> int:
    """The largest row count R of ``rows`` such that every row count <= R in ``rows`` is in ``done`` (0: none)."""
    reached = 0
    for r in sorted(rows):
        if r not in done:
            break
        reached = r
    return reached


def gemm_weights(models) -> dict[tuple[int, int], torch.Tensor]:
    """One weight per distinct (N, K) the models multiply by through ``aten::mm`` / ``aten::addmm``, by (N, K).

    ``models``: ``torch.nn.Module`` s (the target, the draft). A weight
    counts when it is the 2-D bfloat16 ``weight``, [N, K], of a linear layer
    (SGLang's ``LinearBase``, or ``torch.nn.Linear``: EAGLE's ``fc``, NEXTN's
    ``eh_proj``), of an LM head (``ParallelLMHead``), or of the module a
    model names ``lm_head`` (a tied head is the embedding table, multiplied
    as one matmul there), and meets SGLang's DeepGEMM conditions (N >= 16,
    rows of a multiple of 16 bytes). Other embedding tables are looked up,
    not multiplied.
    """
    from sglang.srt.layers.linear import LinearBase
    from sglang.srt.layers.vocab_parallel_embedding import ParallelLMHead

    weights = {}

    def add(module) -> None:
        weight = getattr(module, "weight", None)
        if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or weight.dtype != torch.bfloat16:
            return
        n, k = (int(d) for d in weight.shape)
        if n >= MIN_N and (n * 2) % ALIGN_BYTES == 0 and (k * 2) % ALIGN_BYTES == 0:
            weights.setdefault((n, k), weight)

    for model in models:
        for module in model.modules():
            if isinstance(module, (LinearBase, ParallelLMHead, torch.nn.Linear)):
                add(module)
        head = getattr(model, "lm_head", None)
        if isinstance(head, torch.nn.Module):
            add(head)
    return dict(sorted(weights.items()))


def deepgemm_matmul_applies() -> str | None:
    """Why this process's matmul needs no warm-up here (not DeepGEMM's SM90 kernels); None when it does."""
    from sglang.srt.batch_invariant_ops import batch_invariant_ops as bio

    major = torch.cuda.get_device_capability()[0]
    if major != WARMED_ARCH:
        return (f"compute capability {major}.x: the row counts warmed follow DeepGEMM's SM90 heuristic, not this "
                "architecture's; its kernels compile at first use")
    if not bio.is_batch_invariant_mode_enabled():
        return "SGLang's batch-invariant mode is off"
    if not (bio._ENABLE_MM_DEEPGEMM and bio.ENABLE_JIT_DEEPGEMM):
        return "SGLang's batch-invariant matmul does not use DeepGEMM here"
    return None


def warm_gemms(weights: dict[tuple[int, int], torch.Tensor], rows: list[int],
               max_tensor_bytes: int = MAX_TENSOR_BYTES, deadline: float | None = None) -> tuple[int, int, list[str]]:
    """One ``torch.mm`` per (row count, weight): SGLang's batch-invariant matmul compiles what it needs.

    Row counts in the order given (:func:`warm_order`), every weight at
    each. Each weight
    [N, K] (bfloat16, on the device) is multiplied transposed, as SGLang's
    linear layers call it, by zero rows [M, K] (contiguous), without
    autograd. A (row count, weight) whose [M, K] input or [M, N] output
    (bfloat16) would pass ``max_tensor_bytes`` is left to its first use.
    Launching stops once ``time.monotonic()`` passes ``deadline`` (None: no
    limit); each new configuration is a JIT compile, the rest of each launch
    is queued on the GPU.

    Returns:
        (launches, the last row count the loop reached in ``rows``' order
        (where every weight that fits was launched; 0: none), notes on what
        was left to first use).
    """
    def fits(m: int, n: int, k: int) -> bool:
        return m * max(n, k) * 2 <= max_tensor_bytes

    launched, reached, done, notes = 0, 0, 0, []
    inputs = {}  # one zero input per K and device, as many rows as any weight of that K takes
    try:
        with torch.no_grad():
            for (n, k), weight in weights.items():
                most = max((m for m in rows if fits(m, n, k)), default=0)
                key = (k, weight.device)
                if most and most > (inputs[key].shape[0] if key in inputs else 0):
                    inputs[key] = torch.zeros(most, k, dtype=weight.dtype, device=weight.device)
                if most < max(rows):
                    notes.append(f"N={n} K={k}: rows above {most} compile at first use")
            for m in rows:
                if deadline is not None and time.monotonic() > deadline:
                    notes.append(f"the time budget ran out after {done} of {len(rows)} row counts: the other "
                                 "row counts compile at first use")
                    break
                for (n, k), weight in weights.items():
                    if fits(m, n, k):
                        torch.mm(inputs[(k, weight.device)][:m], weight.t())
                        launched += 1
                reached, done = m, done + 1
    finally:  # the graph capture that follows gets the memory back, also after a failed launch
        inputs.clear()
        if any(w.is_cuda for w in weights.values()):
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
    return launched, reached, notes


def compile_gemms(scheduler, *args, **kwargs) -> None:
    """BEFORE hook for ``Scheduler.init_all_cuda_graphs(self)``: :func:`warm_gemms` of the target's and draft's shapes.

    Only in runs whose seeded streams are active, on CUDA, with
    deterministic inference, where SGLang's matmul runs DeepGEMM
    (:func:`deepgemm_matmul_applies`); elsewhere on CUDA it logs why not
    (:data:`SKIPPED_LOG`). Rows up to :func:`forward_sizes.max_rows_for` the
    scheduler's limits. Speed only: a failure is logged and the kernels
    compile at first use, as they would without the plugin.
    """
    bag = current_config()
    if not (bag.active and torch.cuda.is_available()):
        return None
    log = logging.getLogger("sglang_detspec")
    started = time.monotonic()
    try:
        if not bag.deterministic:
            reason = "deterministic inference is off"
        elif not bag.gemm_warmup_s:
            reason = f"{GEMM_WARMUP_ENV}=0"
        else:
            reason = deepgemm_matmul_applies()
        if reason:
            log.info("%s: %s", SKIPPED_LOG, reason)
            return None
        most, running = scheduler_max_rows(scheduler, bag.num_draft_tokens or 1)
        rows = warm_rows(most)
        graph_bs = _captured_decode_bs()
        first = first_rows(running, max(graph_bs, default=None), bag.num_draft_tokens or 1)
        captured = bool(graph_bs)
        order = warm_order(rows, first, captured)
        head = sum(r <= first for r in rows)
        # Weights kept on the host (--cpu-offload-gb) are multiplied elsewhere: only device weights reach DeepGEMM.
        weights = {shape: w for shape, w in gemm_weights(models_of(scheduler)).items() if w.is_cuda}
        if not weights:
            log.info("%s: no bfloat16 weight on the device reaches SGLang's matmul (quantized or offloaded)",
                     SKIPPED_LOG)
            return None
        launched, reached, notes = warm_gemms(weights, order, deadline=started + bag.gemm_warmup_s)
        done = set(order[:order.index(reached) + 1]) if reached else set()
    except Exception:  # speed only: what is not warmed here compiles at its first request instead
        log.warning("%s; its kernels compile at first use", FAILED_LOG, exc_info=True)
        return None
    decode_part = f"the {head} up to {first} decode and verify rows"
    prefill_part = f"{len(rows) - head} larger ones coarse to fine"
    sequence = (f"{prefill_part} first, then {decode_part}, which the CUDA-graph capture meets too" if captured
                else f"{decode_part} first, then {prefill_part}")
    log.info("%s: %d launches over %d weight shapes %s, %d of %d row counts up to %d (every one up to %d; %s), in "
             "%.1f s (budget %g s, %s)%s", WARMED_LOG, launched, len(weights), list(weights), len(done), len(rows),
             rows[-1], covered_up_to(rows, done), sequence, time.monotonic() - started, bag.gemm_warmup_s,
             GEMM_WARMUP_ENV, f"; {'; '.join(notes)}" if notes else "")
    return None
