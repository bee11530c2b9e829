"""Draft shape by batch: a coupled tree drafts as a chain when the running batch is large or long.

A tree verifies ``num_draft_tokens`` nodes per request, a chain of the same
depth ``steps + 1``: at large batches the target's verify is compute-bound
and the tree pays for every node (docs/determinism_tax.md has the figures:
the tree falls behind the chain from about 32 concurrent requests).
Coupled verification makes every emitted token the target's race winner,
whatever was drafted (drafter invariance), so a server may change its draft
shape from one step to the next without changing a token. With
``SGLANG_DETSPEC_TREE_CHAIN_BATCH=B`` (:attr:`DetSpecConfig.chain_at_batch`)
a tree server drafts a chain of its step count for decode batches of more
than B requests and its tree otherwise. With
``SGLANG_DETSPEC_TREE_CHAIN_TOKENS=T`` (:attr:`DetSpecConfig.chain_at_tokens`)
it also drafts the chain for decode batches whose summed sequence length is
above T tokens: on the node path (``SGLANG_DETSPEC_TREE_ATTENTION=nodes``)
every tree node reads its request's whole context, so the tree's verify
attention grows with the batch's KV length (the measured case is in
docs/determinism_tax.md). The length is read on the host without a device
synchronisation (:func:`batch_kv_tokens`): SGLang's host lengths where the
step has them, else the requests' committed KV lengths, which SGLang's own
decode allocation reads (under its overlap scheduler FA3 and Triton opt out
of the host lengths, and the committed lengths trail the device by one
verify's accepted tokens per request, at most steps + 1 each: the switch
comes at most one step late).

SGLang 0.5.23's adaptive speculation swaps one runtime state per draft step
count, keyed by steps and with top-k fixed at 1; this module keeps one state
per shape (top-k, steps, draft tokens) the same way: the draft worker's
attention backends and CUDA graphs, its draft-extend backend and graphs, the
target's verify attention backend and verify CUDA graphs. Switching is a
handful of attribute writes between two steps.

What stays the tree's in the chain state: the KV reserve per step (SGLang
sizes it from the published top-k, larger than a chain needs), the draft
extend's children (each request keeps the tree's top-k children, so the
next step can draft either shape; a chain drafts from the first, the race
winner), and prefill / extend batches, which run in the tree state the
server started with.

Not supported with it: SGLang's weight update with CUDA-graph recapture
(``recapture_decode_cuda_graph``), which rebuilds the graphs of the active
state only.

Hooked symbols:

- ``EAGLEWorkerV2.init_cuda_graphs`` (AFTER): builds the chain state beside
  the tree state SGLang built (its own draft, draft-extend and target verify
  CUDA graphs, at SGLang's capture batch sizes above B, or at every one of
  them with a token bound).
- ``EAGLEWorkerV2.forward_batch_generation`` (AROUND): activates the state of
  the batch before SGLang's step runs.
- ``EagleDraftWorker.draft`` (AROUND): in the chain state, the draft reads
  the first of the draft input's top-k children with the draft worker's
  top-k at 1 for the call.
"""

from __future__ import annotations

import dataclasses
import logging
import time

from ..config import current_config
from .channels import DRAFT_SHAPES, DRAFT_TOPK
from .shape_rules import idle_bound_note, not_applied_note, not_applied_reason

_V2 = "sglang.srt.speculative.eagle_worker_v2"
INIT_GRAPHS = f"{_V2}.EAGLEWorkerV2.init_cuda_graphs"
FORWARD = f"{_V2}.EAGLEWorkerV2.forward_batch_generation"
DRAFT = f"{_V2}.EagleDraftWorker.draft"
# Logged at the first switch to the chain and the first back to the tree (the suites' positive control).
SWITCH_LOG = "sglang-detspec: draft shape switched to"
# Every SUMMARY_S seconds of steps, how often the shape switched and how many steps ran in each: the first
# switch each way is logged, later ones only counted (batches cross the bound as requests come and go).
SUMMARY_LOG = "sglang-detspec: draft shapes in the last"
SUMMARY_S = 60.0
STEP_KINDS = ("chain decode", "tree decode", "prefill or extend")
# Beside each logged switch on a decode batch: SGLang's flag for its target verify under a CUDA graph (True / False).
VERIFY_GRAPH_LOG = "verify CUDA graph:"
_CAPTURE_SOURCE = "sglang_detspec.tree_chain_capture"
_RESTORE_SOURCE = "sglang_detspec.tree_chain_restore"


@dataclasses.dataclass(frozen=True)
class ShapeState:
    """One draft shape's runtime resources on an ``EAGLEWorkerV2`` (SGLang objects, held by reference).

    Attributes:
        topk, steps, draft_tokens: the shape (``speculative_eagle_topk``,
            ``speculative_num_steps``, ``speculative_num_draft_tokens``).
        draft_attn_backend, draft_graph: the draft worker's multi-step
            attention backend and draft CUDA-graph runner (None: eager).
        draft_extend_attn_backend, draft_extend_graph: the draft extend's.
        draft_runner_attn_backend: the draft model runner's ``attn_backend``
            (the draft extend's backend where SGLang made one).
        target_attn_backend, target_graph: the target model runner's
            attention backend and verify CUDA-graph runner.
        topk1_buffers: the chain draft's constant parent and score-index
            tensors (SGLang's ``_topk1_parents_prealloc`` int64
            [max_bs, steps - 1] and ``_topk1_score_indices_prealloc`` int64
            [max_bs, steps]), (None, None) for a tree.
    """

    topk: int
    steps: int
    draft_tokens: int
    draft_attn_backend: object
    draft_graph: object
    draft_extend_attn_backend: object
    draft_extend_graph: object
    draft_runner_attn_backend: object
    target_attn_backend: object
    target_graph: object
    topk1_buffers: tuple


@dataclasses.dataclass
class Shapes:
    """The two states of a switching worker, the bounds between them and the active one.

    ``threshold``: decode batches of more requests draft the chain (0: no
    batch bound); ``tokens``: decode batches whose summed sequence length
    is above it draft the chain (0: no token bound).
    """

    tree: ShapeState
    chain: ShapeState
    threshold: int
    active: ShapeState
    tokens: int = 0
    switches: int = 0
    # The current summary window (SUMMARY_S): its start (time.monotonic()), switches and steps by kind.
    window_start: float = dataclasses.field(default_factory=time.monotonic)
    window_switches: int = 0
    window_steps: dict = dataclasses.field(default_factory=lambda: dict.fromkeys(STEP_KINDS, 0))

    def for_batch(self, decode: bool, batch_size: int, kv_tokens: int | None = None) -> ShapeState:
        """The chain for decode batches of more than :attr:`threshold` requests or more than :attr:`tokens`
        summed sequence length (``kv_tokens``, None: not known, the batch size decides), else the tree."""
        if not decode:
            return self.tree
        many = bool(self.threshold) and batch_size > self.threshold
        long = bool(self.tokens) and kv_tokens is not None and kv_tokens > self.tokens
        return self.chain if many or long else self.tree

    def bounds(self) -> str:
        """The bounds in force, for the switch lines: ``bound 16`` (requests), ``bound 8192 tokens`` or both."""
        parts = [str(self.threshold)] if self.threshold else []
        parts += [f"{self.tokens} tokens"] if self.tokens else []
        return ("bounds " if len(parts) > 1 else "bound ") + " / ".join(parts)

    def summary(self, now: float) -> str | None:
        """The window's summary line once it is :data:`SUMMARY_S` old (then a new window starts), else None."""
        if now - self.window_start < SUMMARY_S:
            return None
        steps = ", ".join(f"{kind} {n}" for kind, n in self.window_steps.items())
        line = (f"{SUMMARY_LOG} {now - self.window_start:.0f} s: {self.window_switches} switches; steps: {steps}")
        self.window_start, self.window_switches = now, 0
        self.window_steps = dict.fromkeys(STEP_KINDS, 0)
        return line


def current_state(worker) -> ShapeState:
    """The state ``worker`` (an ``EAGLEWorkerV2``) runs in now."""
    dw = worker._draft_worker
    runner = worker._target_worker.model_runner
    return ShapeState(
        worker.topk, worker.speculative_num_steps, worker.speculative_num_draft_tokens,
        dw.draft_attn_backend, dw.cuda_graph_runner, dw.draft_extend_attn_backend,
        dw.cuda_graph_runner_for_draft_extend, dw.draft_runner.attn_backend,
        runner.attn_backend, runner.decode_cuda_graph_runner,
        (getattr(dw, "_topk1_parents_prealloc", None), getattr(dw, "_topk1_score_indices_prealloc", None)))


def apply_state(worker, state: ShapeState, tree_topk: int) -> None:
    """Point ``worker`` and its draft worker at ``state``'s resources (attribute writes only).

    The draft worker's own ``topk`` stays ``tree_topk``, so its draft extend
    keeps emitting the tree's children; :func:`draft_in_shape` narrows it
    to the state's top-k for the draft itself.

    Unlike SGLang's ``apply_runtime_state`` this publishes nothing: the KV
    reserve per step, which the scheduler sizes from the published top-k,
    steps and draft tokens, stays the tree's, larger than a chain needs, so a
    step that follows a switch either way finds its slots; each step's result
    carries its own draft-token count for the output processing. (SGLang's
    accept-rate metric keeps dividing by the tree's draft tokens.) The chain
    buffers SGLang rebuilds on a switch are kept per state instead.
    """
    dw = worker._draft_worker
    worker.topk = state.topk
    worker.speculative_num_steps = dw.speculative_num_steps = state.steps
    worker.speculative_num_draft_tokens = dw.speculative_num_draft_tokens = state.draft_tokens
    dw.topk = tree_topk
    DRAFT_TOPK.write(dw, state.topk)
    dw.draft_attn_backend = dw.draft_runner.draft_attn_backend = state.draft_attn_backend
    dw.cuda_graph_runner = state.draft_graph
    dw.draft_extend_attn_backend = state.draft_extend_attn_backend
    dw.draft_runner.attn_backend = state.draft_runner_attn_backend
    dw.cuda_graph_runner_for_draft_extend = state.draft_extend_graph
    dw._topk1_parents_prealloc, dw._topk1_score_indices_prealloc = state.topk1_buffers
    runner = worker._target_worker.model_runner
    runner.attn_backend = state.target_attn_backend
    runner.decode_cuda_graph_runner = state.target_graph


def published_shape() -> dict:
    """The published values :func:`capture_overrides` may change, by SGLang's leaf names (to restore them)."""
    from sglang.srt.runtime_context import get_exec, get_spec

    spec = get_spec()
    return {"speculative_eagle_topk": spec.speculative_eagle_topk,
            "speculative_num_draft_tokens": spec.speculative_num_draft_tokens,
            "cuda_graph_config": get_exec().graph.cuda_graph_config}


def capture_overrides(draft_tokens: int, threshold: int) -> dict:
    """The published values a chain state is built under.

    Top-k 1 and its draft tokens; and, with decode CUDA graphs on, their
    batch sizes cut to those above ``threshold`` (the chain runs no smaller
    batch), decode graphs off where none is left. The sizes live in the
    ``cuda_graph_config`` leaf (``decode.bs``), which SGLang's capture reads
    (``get_batch_sizes_to_capture``); it is replaced by a copy, as SGLang's
    own resolution does (``with_phase``), never edited in place.
    """
    from sglang.srt.model_executor.cuda_graph_config import Backend, Phase, with_phase
    from sglang.srt.runtime_context import get_exec

    overrides = {"speculative_eagle_topk": 1, "speculative_num_draft_tokens": draft_tokens}
    config = get_exec().graph.cuda_graph_config
    if config is not None and config.decode.backend != Backend.DISABLED and config.decode.bs:
        sizes = [b for b in config.decode.bs if b > threshold]
        overrides["cuda_graph_config"] = (with_phase(config, Phase.DECODE, bs=sizes) if sizes
                                          else with_phase(config, Phase.DECODE, backend=Backend.DISABLED))
    return overrides


def build_chain_state(worker, threshold: int) -> ShapeState:
    """Build the chain state of a tree ``worker``: top-k 1, its step count, ``steps + 1`` draft tokens.

    ``threshold``: the chain runs decode batches above it only, so its
    CUDA graphs are captured at the sizes above it (0: every size, for a
    token bound, which sends batches of any size to the chain).

    Mirrors SGLang's ``EAGLEWorkerV2.build_adaptive_runtime_state`` with the
    top-k published as 1 while the backends and graphs are made (SGLang's
    attention backends and graph runners read it from the runtime context
    when built). The worker is back in its tree state afterwards, with every
    published value restored, also when the build raises.

    Raises:
        whatever SGLang's backend or graph construction raises (a CUDA
        out-of-memory error: the chain's graphs come on top of the memory
        SGLang planned); start-up then stops with it.
    """
    from sglang.srt.layers.moe.utils import speculative_moe_a2a_backend_context, speculative_moe_backend_context
    from sglang.srt.model_executor.cuda_graph_config import Backend, Phase, check_cuda_graph_backend
    from sglang.srt.runtime_context import get_context
    from sglang.srt.speculative import eagle_worker_v2 as v2
    from sglang.srt.speculative.spec_utils import draft_tp_context

    tree = current_state(worker)
    dw = worker._draft_worker
    steps, tokens = tree.steps, tree.steps + 1
    saved = published_shape()
    context = get_context()
    try:
        context.override(_CAPTURE_SOURCE, **capture_overrides(tokens, threshold))
        graphs = not check_cuda_graph_backend(Phase.DECODE, Backend.DISABLED)
        worker.topk = dw.topk = 1
        worker.speculative_num_draft_tokens = dw.speculative_num_draft_tokens = tokens
        with (draft_tp_context(dw.parallel_layout), speculative_moe_backend_context(),
              speculative_moe_a2a_backend_context()):
            dw._rebuild_topk1_chain_buffers()
            dw.init_attention_backend()
            dw._capture_cuda_graphs()
            runner = worker._target_worker.model_runner
            kept = runner.init_new_workspace
            try:
                target_backend = runner._get_attention_backend(init_new_workspace=True)
            finally:
                runner.init_new_workspace = kept
            target_graph = None
            if graphs:
                runner_cls = v2._select_spec_graph_runner_cls(
                    builtin_runner_cls=lambda: v2.NPUGraphRunner if v2._is_npu else v2.DecodeCudaGraphRunner,
                    oot_runner_cls=v2.current_platform.get_graph_runner_cls)
                target_graph = runner_cls(runner, attn_backend=target_backend, speculative_num_steps=steps,
                                          speculative_num_draft_tokens=tokens)
            chain = dataclasses.replace(current_state(worker), target_attn_backend=target_backend,
                                        target_graph=target_graph)
    finally:
        context.override(_RESTORE_SOURCE, **saved)
        apply_state(worker, tree, tree.topk)
    return chain


def install_shapes(result, worker, *args, **kwargs):
    """AFTER hook for ``EAGLEWorkerV2.init_cuda_graphs(self)``: the chain state beside the tree's, where the bag asks.

    Only on a worker that hosts the draft and runs no adaptive speculation
    of SGLang's own (it refuses trees anyway), and where
    :func:`~.shape_rules.not_applied_reason` finds nothing (logged otherwise).
    """
    from sglang.srt.runtime_context import get_schedule

    bag = current_config()
    threshold, tokens = bag.chain_at_batch, bag.chain_at_tokens
    if (not (threshold or tokens) or getattr(worker, "_draft_worker", None) is None
            or getattr(worker, "adaptive_controller", None) is not None or worker.topk <= 1):
        return result
    log = logging.getLogger("sglang_detspec")
    runner = worker._target_worker.model_runner
    # The model runner's cap where its memory planning lowered the requested one.
    max_running = getattr(runner, "max_running_requests", None) or get_schedule().max_running_requests
    reason = not_applied_reason(worker.server_args, max_running, threshold, tokens)
    if reason:
        log.warning("sglang-detspec: %s", not_applied_note(threshold, reason, tokens))
        return result
    idle = idle_bound_note(threshold, tokens, max_running, getattr(runner, "max_total_num_tokens", None))
    if idle:
        log.warning("sglang-detspec: %s", idle)
    started, free_before = time.monotonic(), _free_device_memory()
    tree = current_state(worker)
    chain = build_chain_state(worker, 0 if tokens else threshold)
    shapes = Shapes(tree, chain, threshold, tree, tokens=tokens)
    DRAFT_SHAPES.write(worker, shapes)
    DRAFT_TOPK.write(worker._draft_worker, tree.topk)
    used = free_before - _free_device_memory()
    log.info("sglang-detspec: chain draft state (top-k 1, %d steps, %d draft tokens) built for decode batches "
             "above the %s in %.1f s, %.2f GB of device memory, %s; the tree (top-k %d, %d draft tokens) serves "
             "the rest", chain.steps, chain.draft_tokens, shapes.bounds(), time.monotonic() - started,
             used / 2**30, graph_sizes_note(chain.target_graph), tree.topk, tree.draft_tokens)
    return result


def batch_kv_tokens(batch) -> int | None:
    """The summed sequence length (tokens) of ``batch``, a ``ScheduleBatch``, read on the host; None: not known.

    In order: SGLang's ``seq_lens_sum``, the sum of its ``seq_lens_cpu``
    (int64 [B]), both filled before a step only where an attention backend
    asks for host lengths (``needs_cpu_seq_lens``; FA3 and Triton do not,
    under the overlap scheduler), else the requests' committed KV lengths
    (``req.kv.kv_committed_len``, host ints SGLang's decode allocation
    reads; under overlap they trail the device by at most one verify).
    """
    total = getattr(batch, "seq_lens_sum", None)
    if total is not None:
        return int(total)
    lens = getattr(batch, "seq_lens_cpu", None)
    if lens is not None:
        return int(lens.sum())
    reqs = getattr(batch, "reqs", None)
    if not reqs:
        return None
    return sum(req.kv.kv_committed_len for req in reqs)


def graph_sizes_note(target_graph) -> str:
    """What the start-up line says of a chain state's target verify: its CUDA-graph batch sizes, or eager.

    ``target_graph`` is SGLang's graph runner (its ``capture_bs``, the
    batch sizes captured) or None. SGLang logs no capture line for a graph
    runner built outside its model runner's set-up, so this is the record.
    """
    sizes = sorted(getattr(target_graph, "capture_bs", None) or ())
    if not sizes:
        return "its target verify eager (no decode CUDA graphs)"
    return f"its target verify CUDA graphs at batch sizes {sizes[0]}..{sizes[-1]} ({len(sizes)} sizes)"


def _free_device_memory() -> int:
    """Free bytes on the current CUDA device (0 without CUDA), for the start-up log."""
    import torch

    return torch.cuda.mem_get_info()[0] if torch.cuda.is_available() else 0


def run_in_shape(original, self, batch, *args, **kwargs):
    """AROUND hook for ``EAGLEWorkerV2.forward_batch_generation(batch, ...)``: the batch's state, then SGLang's step.

    Decode batches above a bound (requests, or summed sequence length)
    run the chain; prefill and extend batches (and idle ones) the tree.
    ``batch.seq_lens.shape`` and :func:`batch_kv_tokens` read host
    metadata: no device synchronisation.
    """
    shapes = DRAFT_SHAPES.read(self)  # None: not a switching tree, SGLang's step as is
    if shapes is None:
        return original(self, batch, *args, **kwargs)
    decode = not (batch.forward_mode.is_extend() or batch.is_extend_in_batch)
    size = batch.seq_lens.shape[0] if batch.seq_lens is not None else 0
    # The length only where it decides: a batch above the batch bound drafts the chain anyway.
    wanted = decode and shapes.tokens and not (shapes.threshold and size > shapes.threshold)
    kv_tokens = batch_kv_tokens(batch) if wanted else None
    state = shapes.for_batch(decode, size, kv_tokens)
    announce = False
    if state is not shapes.active:
        apply_state(self, state, shapes.tree.topk)
        shapes.active = state
        shapes.switches += 1
        shapes.window_switches += 1
        announce = shapes.switches <= 2  # the first switch each way; later ones are routine
    kind = STEP_KINDS[0 if state is shapes.chain else 1] if decode else STEP_KINDS[2]
    shapes.window_steps[kind] += 1
    result = original(self, batch, *args, **kwargs)
    line = shapes.summary(time.monotonic())
    if line:
        logging.getLogger("sglang_detspec").info("%s", line)
    if announce:
        # A decode step's result says whether its target verify replayed a CUDA graph (host flag, no sync).
        graph = f"; {VERIFY_GRAPH_LOG} {getattr(result, 'can_run_cuda_graph', None)}" if decode else ""
        length = f" and {kv_tokens} tokens" if kv_tokens is not None else ""
        logging.getLogger("sglang_detspec").info(
            "%s %s (%s batch of %d %s%s, %s%s)", SWITCH_LOG, "chain" if state is shapes.chain else "tree",
            "decode" if decode else "prefill or extend", size, "request" if size == 1 else "requests", length,
            shapes.bounds(), graph)
    return result


def draft_in_shape(original, self, batch, *args, **kwargs):
    """AROUND hook for ``EagleDraftWorker.draft(batch)``: a chain state drafts from each request's first child.

    The draft input (``batch.spec_info``) carries the tree's top-k children of
    every request, ``topk_p`` float32 [B, k] and ``topk_index`` int64 [B, k]
    (the draft extend keeps the tree's width); the chain takes the first
    column, the race winner (Gumbel-top-k's first draw), as contiguous [B, 1]
    copies set on the draft input, with the worker's ``topk`` at 1 while
    SGLang drafts. Outside a switching worker, SGLang's draft as is. (The
    draft input is the scheduler's own object for this step; without
    pipeline parallelism, which :func:`~.shape_rules.not_applied_reason` excludes, nothing
    reads its top-k columns after the draft.)
    """
    width = DRAFT_TOPK.read(self)
    if width is None or width == self.topk:
        return original(self, batch, *args, **kwargs)
    info = batch.spec_info
    if info is not None and info.topk_index is not None and info.topk_index.shape[-1] > width:
        # Contiguous: SGLang's chain kernels index the [B, 1] inputs by row.
        info.topk_p = info.topk_p[:, :width].contiguous()
        info.topk_index = info.topk_index[:, :width].contiguous()
    kept = self.topk
    self.topk = width
    try:
        return original(self, batch, *args, **kwargs)
    finally:
        self.topk = kept
