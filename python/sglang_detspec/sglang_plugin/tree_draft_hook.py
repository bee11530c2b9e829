"""Coupled tree drafts: the children of every expanded node are q's Gumbel-top-k on the TARGET stream.

With ``--speculative-eagle-topk k > 1`` SGLang's EAGLE v2 draft worker picks
each node's k children as ``fast_topk(renorm_draft_probs(logits), k)``: the k
most likely tokens of q, the same for every seed. In coupled mode a child
helps only if it equals the target's race winner ``y_t = race(p_t, TARGET,
t)``, so the children here are the k largest race keys ``q_i / E_i`` on the
TARGET uniforms of the child's position (Gumbel-top-k: k draws without
replacement from q, coupled to the target's race; docs/design.md, coupled
drafts). The first child is the coupled chain's draft, so the tree contains
the coupled chain.

Hooked symbols (AROUND):

- ``EagleDraftWorker.draft_forward``, ``_draft_extend_for_prefill``,
  ``_draft_extend_for_decode``: publish where the tokens they draft sit
  (:mod:`.positions`) while they run.
- ``sglang.srt.speculative.spec_utils.renorm_draft_probs`` (bound in
  ``eagle_worker_v2``): inside a published site, returns a [R, V] tensor that
  is zero except at each sampled row's k race winners, so SGLang's own
  ``fast_topk`` that follows picks exactly those children. Their values, which
  SGLang multiplies along a path to choose the nodes it keeps, are each
  child's race key relative to the winner's: the coupled chain scores 1 at
  every depth and is always kept (so a tree never accepts fewer tokens than
  the coupled chain of its depth), and the other children rank by how close
  they came to winning. (q's path probability, SGLang's own score, kept
  shallow bushy trees: measured in docs/e2e/2026-12-01-h200-coupled-drafts.)
  Greedy rows (``top_k <= 1``) keep SGLang's probabilities: top-k of q.
- ``EAGLEDraftCudaGraphRunner.capture_one_shape`` and ``execute``: without
  ``--speculative-use-rejection-sampling`` SGLang's draft CUDA graphs carry no
  seed buffer and do not refill temperatures and top-k; the first gives the
  graphs a seed buffer before capture, the second refills all three before
  every replay.

A draft over a reduced vocabulary (EAGLE3 hot tokens, ``--speculative-token-map``)
keeps SGLang's top-k of q: its columns are draft indices, not the target
token ids the TARGET stream is keyed by.

Chains (``topk == 1``) do not come here: in coupled mode they draft through
SGLang's sampled-draft path (``draft_hook``; start-up turns it on).
"""

from __future__ import annotations

import torch

from ..config import current_config
from ..ops import coupled_children, id_ordered_filtered_probs
from .positions import DraftSite, after_root, draft_forward_positions, draft_site, published_site

_WORKER = "sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker"
DRAFT_FORWARD = f"{_WORKER}.draft_forward"
EXTEND_PREFILL = f"{_WORKER}._draft_extend_for_prefill"
EXTEND_DECODE = f"{_WORKER}._draft_extend_for_decode"
RENORM = "sglang.srt.speculative.spec_utils.renorm_draft_probs"
_RUNNER = "sglang.srt.speculative.eagle_draft_cuda_graph_runner.EAGLEDraftCudaGraphRunner"
GRAPH_CAPTURE = f"{_RUNNER}.capture_one_shape"
GRAPH_EXECUTE = f"{_RUNNER}.execute"


def _tree_drafts(worker) -> bool:
    # A reduced draft vocabulary (EAGLE3 hot tokens, --speculative-token-map) keeps SGLang's top-k of
    # q: its logits columns are draft indices, and the TARGET stream's columns are target token ids.
    return (current_config().tree_drafts and getattr(worker, "topk", 1) > 1
            and getattr(worker, "hot_token_id", None) is None)


def draft_forward_site(original, self, forward_batch, *args, **kwargs):
    """AROUND hook for ``draft_forward(forward_batch)``: step i drafts at ``forward_batch.positions + 2``.

    SGLang advances ``forward_batch.positions`` by one after each step's
    choice; the site reads it when the choice is made.
    """
    if not _tree_drafts(self):
        return original(self, forward_batch, *args, **kwargs)
    with draft_site(DraftSite(self.topk, lambda: draft_forward_positions(forward_batch.positions))):
        return original(self, forward_batch, *args, **kwargs)


def extend_prefill_site(original, self, batch, *args, **kwargs):
    """AROUND hook for ``_draft_extend_for_prefill(batch, ...)``: the first draft sits at ``seq_lens + 1``."""
    if not _tree_drafts(self):
        return original(self, batch, *args, **kwargs)
    with draft_site(DraftSite(self.topk, lambda: after_root(batch.seq_lens))):
        return original(self, batch, *args, **kwargs)


def extend_decode_site(original, self, batch, batch_result, *args, **kwargs):
    """AROUND hook for ``_draft_extend_for_decode(batch, batch_result, ...)``: drafts at ``new_seq_lens + 1``."""
    if not _tree_drafts(self):
        return original(self, batch, batch_result, *args, **kwargs)
    with draft_site(DraftSite(self.topk, lambda: after_root(batch_result.new_seq_lens))):
        return original(self, batch, batch_result, *args, **kwargs)


def children_tensor(
    logits: torch.Tensor,  # [R, V] float: draft logits, R = B * rows_per_request
    sampling_info,  # SGLang SamplingBatchInfo of the B requests
    positions: torch.Tensor,  # [R] int: absolute position of the token each row drafts
    k: int,
    kernel: str,
) -> torch.Tensor:
    """The tensor whose top-k are each sampled row's coupled children: float32 [R, V].

    Row r of request b = r // (R / B): ``q = softmax(logits[r] / T_b)``, ``w``
    = q cut by the request's top-k / top-p / min-p in token-id order where the
    batch asks for a cut (:func:`~sglang_detspec.ops.id_ordered_filtered_probs`,
    the target's rule), children = ``coupled_children(w, seed_b, positions[r],
    k)`` (q's Gumbel-top-k on the TARGET stream), each at its score (the race
    winner at 1), zero elsewhere. Greedy rows (``top_k <= 1``) return q
    itself, so SGLang's top-k of q drafts them (at T = 1, which SGLang gives
    temperature-0 requests, that is SGLang's own q). No host sync: safe
    inside CUDA-graph capture.
    """
    rows, v = logits.shape
    seeds = sampling_info.sampling_seed
    per = rows // max(seeds.numel(), 1)

    def per_row(values):
        return torch.repeat_interleave(values, per, dim=0) if per > 1 else values

    top_ks = per_row(sampling_info.top_ks)
    q = torch.softmax(logits.float() / per_row(sampling_info.temperatures), dim=-1)
    weights = q
    if sampling_info.need_top_k_sampling or sampling_info.need_top_p_sampling or sampling_info.need_min_p_sampling:
        min_ps = per_row(sampling_info.min_ps) if sampling_info.need_min_p_sampling else None
        weights = id_ordered_filtered_probs(q, top_ks, per_row(sampling_info.top_ps), min_ps)
    children, score = coupled_children(weights, per_row(seeds), positions, min(k, v), kernel=kernel)
    sparse = torch.zeros(rows, v, dtype=torch.float32, device=logits.device)
    sparse.scatter_(1, children, score.float())
    return torch.where((top_ks <= 1).view(-1, 1), q, sparse)


def coupled_renorm_draft_probs(original, next_token_logits, sampling_info, use_rejection_sampling, *args, **kwargs):
    """AROUND hook for ``renorm_draft_probs(next_token_logits [R, V], sampling_info, use_rejection_sampling)``.

    Outside a published tree-draft site, or for a batch without seeds, SGLang's
    own probabilities; inside one, :func:`children_tensor` (which computes q
    itself, so SGLang's softmax is not run there).
    """
    site = published_site()
    if (site is None or sampling_info is None or sampling_info.sampling_seed is None
            or not next_token_logits.numel()):
        return original(next_token_logits, sampling_info, use_rejection_sampling, *args, **kwargs)
    return children_tensor(
        next_token_logits, sampling_info, site.positions().view(-1), site.k, current_config().kernel,
    )


def graph_seed_buffer(original, self, *args, **kwargs):
    """AROUND hook for the EAGLE draft graph runner's ``capture_one_shape``: a seed buffer before capture.

    The captured ``SamplingBatchInfo`` reads ``buffers.sampling_seed[:bs]``;
    SGLang allocates it only with the rejection-sampling flag.
    """
    buffers = self.buffers
    if _tree_drafts(self.eagle_worker) and buffers.sampling_seed is None:
        buffers.sampling_seed = torch.zeros(buffers.seq_lens.shape[0], dtype=torch.int64,
                                            device=buffers.seq_lens.device)
    return original(self, *args, **kwargs)


def graph_refill(original, self, forward_batch, *args, **kwargs):
    """AROUND hook for the EAGLE draft graph runner's ``execute(forward_batch)``.

    Copies the batch's seeds, temperatures and top-k into the graph's input
    buffers before SGLang replays (padded rows keep earlier, valid values;
    their drafts are discarded).
    """
    info = forward_batch.sampling_info
    seed_buffer = self.buffers.sampling_seed
    if (_tree_drafts(self.eagle_worker) and seed_buffer is not None and info is not None
            and info.sampling_seed is not None):
        n = forward_batch.batch_size
        seed_buffer[:n].copy_(info.sampling_seed[:n])
        self.temperatures[:n].copy_(info.temperatures[:n])
        self.top_ks[:n].copy_(info.top_ks[:n])
    return original(self, forward_batch, *args, **kwargs)


HOOKS = (
    (DRAFT_FORWARD, draft_forward_site, "AROUND"),
    (EXTEND_PREFILL, extend_prefill_site, "AROUND"),
    (EXTEND_DECODE, extend_decode_site, "AROUND"),
    (RENORM, coupled_renorm_draft_probs, "AROUND"),
    (GRAPH_CAPTURE, graph_seed_buffer, "AROUND"),
    (GRAPH_EXECUTE, graph_refill, "AROUND"),
)
