"""Start-up: the plugin's Triton kernels compiled before the server takes requests.

Hooked symbol (BEFORE): ``sglang.srt.managers.scheduler.Scheduler.init_all_cuda_graphs``,
which every scheduler process calls once, after the models, the KV pool and
the attention backends are set up and before CUDA-graph capture. The
plugin's verify, draft-extend children and prefill samples run outside CUDA
graphs; without this their first launches compile inside the first requests
(measured as Triton compilation in a serving profile,
docs/benchmarks/determinism_tax/). A server that verifies trees also gets
SGLang's KV move of accepted paths compiled for every batch size
(``kv_move_warmup``).
"""

from __future__ import annotations

import dataclasses
import logging
import time

import torch

from ..config import current_config
from ..ops.warmup import WarmupPlan, warm_up
from .kv_move_warmup import moves_accepted_kv, warm_kv_move
from .shape_rules import not_applied_reason

TARGET = "sglang.srt.managers.scheduler.Scheduler.init_all_cuda_graphs"


def plan_for(bag, target_vocab: int, draft_vocab: int | None = None) -> WarmupPlan:
    """The eager launches of a server with bag ``bag``: its vocabularies and its draft shape.

    A chain's verify may come through SGLang's chain sampler or its tree
    sampler (without the rejection flag), so chains warm both.
    """
    vocabs = (target_vocab,) if draft_vocab in (None, target_vocab) else (target_vocab, draft_vocab)
    if bag.algorithm is None or not bag.num_draft_tokens:
        return WarmupPlan(vocabs)
    topk = bag.eagle_topk or 1
    n = bag.num_draft_tokens
    # SGLang sizes accept_index to the verify input's max_tree_depth: NGRAM trees have no depth cap.
    width = n if bag.algorithm == "NGRAM" else (bag.num_steps + 1 if bag.num_steps else 0)
    return WarmupPlan(vocabs, draft_tokens=n - 1 if topk == 1 else 0, tree_nodes=n, topk=topk,
                      rejection=not bag.coupled and topk == 1, accept_width=width)


def plans_for(bag, target_vocab: int, draft_vocab: int | None = None) -> list[WarmupPlan]:
    """:func:`plan_for`, then one chain plan per other draft step count ``--speculative-adaptive`` may switch to.

    A tree server with :attr:`DetSpecConfig.switches_shape` also gets the
    chain plan of its own step count (``shape_hook``'s chain state).

    Each step count s > 0 verifies s drafts with an ``accept_index`` of
    s + 1 columns, a shape of its own for the verify kernel; s = 0 still
    verifies one token per request (SGLang's trivial verify input), every
    size 1, which the first plan warms too (``one_token_verify``).
    """
    base = plan_for(bag, target_vocab, draft_vocab)
    if 0 in bag.adaptive_steps:
        base = dataclasses.replace(base, one_token_verify=True)
    others = [s for s in bag.adaptive_steps if s > 0 and s != bag.num_steps]
    if bag.switches_shape:  # its chain state verifies steps + 1 nodes per request, a shape of its own
        others.append(bag.num_steps)
    return [base, *(dataclasses.replace(base, draft_tokens=s, tree_nodes=s + 1, topk=1, accept_width=s + 1,
                                        one_token_verify=False) for s in others)]


def renorms_in_verify(bag) -> bool:
    """Whether this server's verify calls SGLang's renorms: a rejection verify (a coupled one never does: probs_hook)."""
    return bag.algorithm is not None and not bag.coupled


def warm_sglang_renorm(device: torch.device) -> int:
    """SGLang's verify renorms (``top_k_renorm_prob``, ``top_p_renorm_prob``) called once; returns the call count.

    On CUDA they are flashinfer's, which builds its sampling module with nvcc
    at the first call: a rejection verify's first top-k or top-p request
    waited for that build inside a request (over 120 s on a host building
    for ten servers at once, 2026-12-04). The calls go through SGLang's
    module bindings, so the plugin's renorm hook and its deterministic flag
    are what gets built. Inputs: one row of 8 uniform probabilities, float32;
    k int32, p float32, SGLang's dtypes for them.
    """
    from sglang.kernels.ops.sampling import renorm

    if renorm.top_k_renorm_prob is None or renorm.top_p_renorm_prob is None:
        return 0
    probs = torch.full((1, 8), 1.0 / 8, dtype=torch.float32, device=device)
    renorm.top_k_renorm_prob(probs, torch.tensor([2], dtype=torch.int32, device=device))
    renorm.top_p_renorm_prob(probs, torch.tensor([0.5], dtype=torch.float32, device=device))
    return 2


def tree_verify_batches(bag, server_args, max_running_requests: int) -> int:
    """The largest batch a server verifies as a tree: a switching tree's batch bound where it switches, else the
    scheduler's.

    (``shape_hook`` builds the chain state where :attr:`DetSpecConfig.switches_shape`
    and :func:`~.shape_rules.not_applied_reason` finds nothing; a token bound
    alone leaves the tree batches of every size.)
    """
    threshold = bag.chain_at_batch
    # Where the switch is not applied (not_applied_reason), or the batch bound is at or above
    # max_running_requests beside a token bound, the tree verifies up to the scheduler's bound.
    if threshold and not_applied_reason(server_args, max_running_requests, threshold, bag.chain_at_tokens) is None:
        return min(threshold, max_running_requests)
    return max_running_requests


def warm_sglang_kv_move(scheduler, bag, accept_width: int, device: torch.device) -> str:
    """SGLang's KV move of accepted paths compiled for the batches ``scheduler`` verifies as trees; the start-up line.

    ``accept_width``: the plan's ``accept_index`` columns (0: not known, nothing
    warmed). The batches: :func:`tree_verify_batches` of the model runner's
    ``max_running_requests``. A pool without a tiled copy of its own
    (:func:`~.kv_move_warmup.warm_kv_move` makes no move) is named in the line instead.

    Raises:
        whatever :func:`~.kv_move_warmup.warm_kv_move` raises.
    """
    runner = scheduler.tp_worker.model_runner
    kvcache = runner.token_to_kv_pool_allocator.get_kvcache()
    if not accept_width:
        return "SGLang's KV move of accepted paths not warmed: the verify's accept width is not known"
    started = time.monotonic()
    batches = tree_verify_batches(bag, scheduler.server_args, int(runner.max_running_requests))
    moves = warm_kv_move(kvcache, accept_width, batches, device)
    if not moves:
        return (f"SGLang's KV move of accepted paths not warmed: the KV pool ({type(kvcache).__name__}) has no "
                "tiled copy of its own; it compiles at first use")
    return (f"SGLang's KV move of accepted paths compiled for verify batches up to {batches} ({accept_width} slots "
            f"per request) in {moves} launches, {time.monotonic() - started:.1f} s")


def compile_kernels(scheduler, *args, **kwargs) -> None:
    """BEFORE hook for ``Scheduler.init_all_cuda_graphs(self)``: :func:`ops.warmup.warm_up` of each of :func:`plans_for`.

    A rejection verify also gets SGLang's renorms built (:func:`warm_sglang_renorm`);
    a server for which :func:`~.kv_move_warmup.moves_accepted_kv` holds, SGLang's KV move
    (:func:`~.kv_move_warmup.warm_kv_move`, batches up to :func:`tree_verify_batches`).

    Only in runs whose seeded streams are active, and only on CUDA. The
    target's vocabulary comes from its model runner; a reduced draft
    vocabulary (EAGLE3 ``d2t``, a token map) from the draft worker's
    ``hot_token_id``. Each part that fails is logged and skipped (speed
    only: what it would have compiled compiles at first use instead).
    """
    bag = current_config()
    if not bag.active or not torch.cuda.is_available():
        return None
    log = logging.getLogger("sglang_detspec")
    started = time.monotonic()
    plans = None
    try:
        runner = scheduler.tp_worker.model_runner
        device = torch.device("cuda", torch.cuda.current_device())
        draft = getattr(getattr(scheduler, "draft_worker", None), "draft_worker", None)
        hot = getattr(draft, "hot_token_id", None)
        plans = plans_for(bag, runner.model_config.vocab_size, None if hot is None else int(hot.numel()))
        launched = sum(warm_up(plan, device, kernel=bag.kernel) for plan in plans)
        if renorms_in_verify(bag):
            launched += warm_sglang_renorm(device)
    except Exception:  # speed only: what cannot be warmed here compiles at its first request instead
        log.warning("sglang-detspec: start-up kernel warm-up failed (%s); kernels compile at first use",
                    plans, exc_info=True)
        return None
    log.info("sglang-detspec: %d kernel launches compiled before serving in %.1f s (%s)", launched,
             time.monotonic() - started, plans)
    if moves_accepted_kv(bag):
        try:
            line = warm_sglang_kv_move(scheduler, bag, plans[0].accept_width, device)
        except Exception:  # speed only, as above
            log.warning("sglang-detspec: start-up warm-up of SGLang's KV move failed; it compiles at first use",
                        exc_info=True)
            return None
        log.info("sglang-detspec: %s", line)
    return None
