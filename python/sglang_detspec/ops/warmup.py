"""Compile the sampling and verify kernels a server launches outside its CUDA graphs before its first request.

Triton compiles a kernel at its first launch with a new specialisation; on
the serving path the first verify, draft extend or prefill sample of a
server would pay that (hundreds of milliseconds per kernel) inside a
request. The split counts that change with the batch size are unspecialised
run-time arguments (``triton_config.split_lanes``), so one launch per
(op, vocabulary, draft shape) compiles them for every batch size that
follows. Not warmed: the RMSNorm kernel (compiled while SGLang captures
its CUDA graphs; an eager-only server compiles it at its first prefill)
and the FA3 node-rows kernel of ``SGLANG_DETSPEC_TREE_ATTENTION=nodes``.
"""

from __future__ import annotations

import dataclasses

import torch

from .coupled import coupled_verify_chain, coupled_verify_tree
from .draft_children import draft_children, draft_children_topk
from .kernel_choice import use_triton
from .race import exponential_race
from .streams import Stream
from .verify import verify_chain
from .verify_outputs import VerifyOutputs


@dataclasses.dataclass(frozen=True)
class WarmupPlan:
    """What one server launches eagerly.

    Attributes:
        vocabs: vocabulary sizes its races run over (the target's; a reduced
            draft vocabulary's too), each >= 1.
        draft_tokens: K of a coupled chain verify (``num_draft_tokens - 1``), or 0.
        tree_nodes: N of a coupled tree verify (``num_draft_tokens``), or 0.
        topk: children per tree node (``eagle_topk``), 1 for chains.
        rejection: the chain verifies by rejection sampling (``verify_chain``).
        accept_width: columns of SGLang's ``accept_index`` (the verify input's
            ``max_tree_depth``: ``num_steps + 1`` for EAGLE, the draft token
            count for NGRAM), which the coupled verifies write in place; 0:
            the verify's node count.
        one_token_verify: also the verify of a batch that drafted nothing
            (``--speculative-adaptive`` at 0 steps: one node, K = 0, an
            ``accept_index`` of one column), through both of SGLang's samplers.

    Raises:
        ValueError: a field out of range, naming it and the bound.
    """

    vocabs: tuple[int, ...]
    draft_tokens: int = 0
    tree_nodes: int = 0
    topk: int = 1
    rejection: bool = False
    accept_width: int = 0
    one_token_verify: bool = False

    def __post_init__(self):
        if not self.vocabs or any(not isinstance(v, int) or v < 1 for v in self.vocabs):
            raise ValueError(f"vocabs must be a non-empty tuple of ints >= 1, got {self.vocabs!r}")
        for name, lo in (("draft_tokens", 0), ("tree_nodes", 0), ("topk", 1), ("accept_width", 0)):
            value = getattr(self, name)
            if not isinstance(value, int) or not lo <= value <= 4096:
                raise ValueError(f"{name} must be an int in [{lo}, 4096], got {value!r}")


def warm_up(plan: WarmupPlan, device: torch.device, *, kernel: str = "auto") -> int:
    """Launch each op of ``plan`` once on ``device`` with one row; returns the number of launches.

    The samplers' races (TARGET and DRAFT streams, top-1 and top-k with
    scores, as the draft children take them), the draft children's dense
    tail (k = 1 and the plan's top-k, SGLang's int32 top-k) and, for trees,
    their ranking (the race's unit-row variant), the coupled chain and tree
    verifies (writing SGLang's verify buffers in place, int32 as SGLang
    allocates them, as the verify hook calls them) and the rejection verify,
    over float32 weights as the hooks pass them. Nothing is launched where ``kernel`` resolves to the torch
    reference (it compiles nothing). Synchronises once at the end.
    """
    if not use_triton(kernel, device):
        return 0
    seeds = torch.zeros(1, dtype=torch.int64, device=device)
    pos = torch.ones(1, dtype=torch.int64, device=device)
    launched = 0
    for v in plan.vocabs:
        w = torch.ones(1, v, dtype=torch.float32, device=device)
        for k in sorted({1, min(plan.topk, v)}):
            exponential_race(w, seeds, pos, stream=Stream.TARGET, num_samples=k, check=False, kernel=kernel)
            exponential_race(w, seeds, pos, stream=Stream.TARGET, num_samples=k, check=False, kernel=kernel,
                             return_scores=True)
            launched += 2
        exponential_race(w, seeds, pos, stream=Stream.DRAFT, check=False, kernel=kernel)
        launched += 1
        top_ks = torch.full((1,), 2, dtype=torch.int32, device=device)
        for k in sorted({1, min(plan.topk, v)}):
            draft_children(w, torch.ones(1, 1, device=device), top_ks, seeds, pos, k, kernel=kernel)
            launched += 1
        if plan.topk > 1:  # the tree sites' ranking: the race with its unit rows
            draft_children_topk(w, torch.ones(1, 1, device=device), top_ks, seeds, pos, min(plan.topk, v),
                                kernel=kernel)
            launched += 1
    v = plan.vocabs[0]
    if plan.draft_tokens:
        k = plan.draft_tokens
        drafts = torch.zeros(1, k, dtype=torch.int64, device=device)
        target = torch.ones(1, k + 1, v, dtype=torch.float32, device=device)
        coupled_verify_chain(drafts, target, seeds, pos, check=False, kernel=kernel,
                             out=_sglang_buffers(k + 1, plan.accept_width, device))
        launched += 1
        if plan.rejection:
            draft = torch.ones(1, k, v, dtype=torch.float32, device=device)
            verify_chain(drafts, draft, target, seeds, pos, check=False, kernel=kernel)
            launched += 1
    if plan.one_token_verify:  # every size is 1 here: a specialisation of its own
        target = torch.ones(1, 1, v, dtype=torch.float32, device=device)
        root = torch.zeros(1, 1, dtype=torch.int64, device=device)
        none = torch.full((1, 1), -1, dtype=torch.int64, device=device)
        coupled_verify_chain(root[:, :0], target, seeds, pos, check=False, kernel=kernel,
                             out=_sglang_buffers(1, 1, device))
        coupled_verify_tree(root, none, none, target, seeds, pos, check=False, kernel=kernel,
                            out=_sglang_buffers(1, 1, device))
        launched += 2
    if plan.tree_nodes:
        n = plan.tree_nodes
        cand = torch.zeros(1, n, dtype=torch.int64, device=device)
        first = torch.full((1, n), -1, dtype=torch.int64, device=device)
        first[0, : n - 1] = torch.arange(1, n, device=device)  # a chain is a tree
        sibling = torch.full((1, n), -1, dtype=torch.int64, device=device)
        target = torch.ones(1, n, v, dtype=torch.float32, device=device)
        coupled_verify_tree(cand, first, sibling, target, seeds, pos, check=False, kernel=kernel,
                            out=_sglang_buffers(n, plan.accept_width, device))
        launched += 1
    torch.cuda.synchronize(device)
    return launched


def _sglang_buffers(nodes: int, accept_width: int, device: torch.device) -> VerifyOutputs:
    """One request's verify buffers as SGLang's ``eagle_sample`` allocates them (int64 slots, int32 outputs)."""
    width = accept_width or nodes
    return VerifyOutputs(
        torch.arange(nodes, dtype=torch.int64, device=device).view(1, nodes),
        torch.zeros(nodes, dtype=torch.int32, device=device),
        torch.full((1, width), -1, dtype=torch.int32, device=device),
        torch.zeros(1, dtype=torch.int32, device=device),
    )
