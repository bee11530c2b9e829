"""Coupled drafts where SGLang's EAGLE v2 draft worker picks drafts by top-k: trees, and argmax chains.

With ``--speculative-eagle-topk k > 1`` SGLang's draft worker picks each
node's k children as ``fast_topk(renorm_draft_probs(logits), k)``: the k most
likely tokens of q, the same for every seed. A chain whose sampled-draft path
is off (SGLang refuses its rejection-sampling flag for a reduced draft
vocabulary, ``--speculative-token-map``, ...) drafts q's argmax
(``draft_topk1_postprocess`` in the draft steps, ``fast_topk(..., 1)`` in
draft extend). In coupled mode a draft helps only if it equals the target's
race winner ``y_t = race(p_t, TARGET, t)``, so here:

- a tree node's children are the k largest race keys ``q_i / E_i`` on the
  TARGET uniforms of the child's position (Gumbel-top-k: k draws without
  replacement from q, coupled to the target's race; docs/design.md, coupled
  drafts). The first child is the coupled chain's draft, so the tree contains
  the coupled chain;
- a chain's draft is that first child, the race winner.

Over a reduced draft vocabulary (EAGLE3 ``d2t``, ``--speculative-token-map``)
the draft's column j stands for target id ``hot_token_id[j]``: q is spread
onto those target ids before the race, so every draft races on the uniform
of the target id it proposes (ties and race order on target ids), and the
winners are mapped back to draft columns for SGLang, which maps them to
target ids again.

Hooked symbols (AROUND):

- ``EagleDraftWorker.draft_forward``, ``_draft_extend_for_prefill``,
  ``_draft_extend_for_decode``: publish where the tokens they draft sit and
  the worker's draft-to-target map (:mod:`.positions`) while they run.
- ``sglang.srt.speculative.spec_utils.renorm_draft_probs`` (bound in
  ``eagle_worker_v2``): inside a published site, returns a [R, V_draft]
  tensor that is zero except at each sampled row's k race winners, so
  the ``fast_topk`` that follows picks exactly those children (SGLang's,
  or within a site the race's ranking: PATCH below). Their
  values, which SGLang multiplies along a path to choose the nodes it keeps,
  are each child's race key relative to the winner's: the coupled chain
  scores 1 at every depth and is always kept (so a tree never accepts fewer
  tokens than the coupled chain of its depth), and the other children rank
  by how close they came to winning. (q's path probability, SGLang's own
  score, kept shallow bushy trees: measured in
  docs/e2e/2026-12-01-h200-coupled-drafts.) Greedy rows (``top_k <= 1``)
  keep SGLang's probabilities: top-k of q.
- ``sglang.kernels.ops.speculative.topk1.draft_topk1_postprocess`` (bound in
  ``eagle_worker_v2``): a chain's draft step; inside a published site the
  sampled rows get the race winner instead of the argmax (SGLang's kernel
  still runs for the greedy rows and advances the positions).
- ``EAGLEDraftCudaGraphRunner.capture_one_shape`` and ``execute``: without
  ``--speculative-use-rejection-sampling`` SGLang's draft CUDA graphs carry no
  seed buffer and do not refill temperatures and top-k; the first gives the
  graphs a seed buffer before capture, the second refills all three before
  every replay.

Patched for one call (PATCH): while a tree's site above runs over a full
draft vocabulary, ``eagle_worker_v2``'s own ``fast_topk`` binding (SGLang's
``sglang.srt.utils.common.fast_topk``, which MoE routing elsewhere also
calls, some of it under ``torch.compile``: so not hooked process-wide) is
:func:`ranked_topk`. Called on the tensor the renorm hook just returned, with
its k, it returns the ranking the race already found
(``ops.draft_children.DraftChildren``: a sampled row's children in race
order, a greedy row's largest q; the same values as SGLang's top-k of the
tensor, among equal values the smaller id), so SGLang's radix top-k over
``[R, V_draft]`` does not run (0.16-0.59 ms per step of the 8B-shape tree at
c = 1-32, ``docs/determinism_tax.md``). Any other call is SGLang's. Over a
reduced draft vocabulary SGLang's top-k still runs (a child off the draft
vocabulary has no column to return).

Chains with SGLang's sampled-draft path on (start-up turns it on wherever
SGLang admits it) do not come here: they draft through ``draft_hook``.
"""

from __future__ import annotations

import contextlib

import torch

from ..config import current_config
from ..ops.draft_children import draft_children, draft_children_topk
from .positions import DraftSite, after_root, draft_forward_positions, draft_site, published_site, sampling_rows

_WORKER = "sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker"
DRAFT_FORWARD = f"{_WORKER}.draft_forward"
EXTEND_PREFILL = f"{_WORKER}._draft_extend_for_prefill"
EXTEND_DECODE = f"{_WORKER}._draft_extend_for_decode"
RENORM = "sglang.srt.speculative.spec_utils.renorm_draft_probs"
# Patched for the duration of one site (:func:`_ranked_within`): the worker module's own binding only.
SITE_FAST_TOPK = "sglang.srt.speculative.eagle_worker_v2.fast_topk"
_RUNNER = "sglang.srt.speculative.eagle_draft_cuda_graph_runner.EAGLEDraftCudaGraphRunner"
GRAPH_CAPTURE = f"{_RUNNER}.capture_one_shape"
GRAPH_EXECUTE = f"{_RUNNER}.execute"
TOPK1 = "sglang.kernels.ops.speculative.topk1.draft_topk1_postprocess"
# Patched for one ``_draft_extend_for_decode`` call (:func:`_kept_draft_logits`), on this worker's own objects.
DRAFT_RUNNER_FORWARD = f"{_WORKER}.draft_runner.forward"
DRAFT_EXTEND_GRAPH_EXECUTE = f"{_WORKER}.cuda_graph_runner_for_draft_extend.execute"
# Set by :func:`graph_seed_buffer` where SGLang allocates none.
GRAPH_SEED_BUFFER = f"{_RUNNER}.buffers.sampling_seed"


def _hooked(worker) -> bool:
    return current_config().topk_drafts


def _site(worker, positions, sampling_info=None) -> DraftSite:
    """The site a worker publishes: its top-k, the positions, its draft-to-target map (None: same ids)."""
    hot = getattr(worker, "hot_token_id", None)
    target_vocab = worker.target_worker.model_runner.model_config.vocab_size if hot is not None else None
    topk = getattr(worker, "topk", 1)
    # One child per row: SGLang's fast_topk is a max, cheaper than the ranking's extra argmax for greedy rows.
    return DraftSite(topk, positions, hot, target_vocab, sampling_info, picked=[] if hot is None and topk > 1 else None)


def draft_forward_site(original, self, forward_batch, *args, **kwargs):
    """AROUND hook for ``draft_forward(forward_batch)``: step i drafts at ``forward_batch.positions + 2``.

    SGLang advances ``forward_batch.positions`` by one after each step's
    choice; the site reads it when the choice is made.
    """
    if not _hooked(self):
        return original(self, forward_batch, *args, **kwargs)
    site = _site(self, lambda: draft_forward_positions(forward_batch.positions), forward_batch.sampling_info)
    with draft_site(site), _ranked_within(site):
        return original(self, forward_batch, *args, **kwargs)


def extend_prefill_site(original, self, batch, *args, **kwargs):
    """AROUND hook for ``_draft_extend_for_prefill(batch, ...)``: the first draft sits at ``seq_lens + 1``."""
    if not _hooked(self):
        return original(self, batch, *args, **kwargs)
    site = _site(self, lambda: after_root(batch.seq_lens))
    with draft_site(site), _ranked_within(site):
        return original(self, batch, *args, **kwargs)


def extend_decode_site(original, self, batch, batch_result, *args, **kwargs):
    """AROUND hook for ``_draft_extend_for_decode(batch, batch_result, ...)``: drafts at ``new_seq_lens + 1``.

    A tree's first children come through ``renorm_draft_probs`` inside the
    published site. A chain's first draft SGLang takes with a plain
    ``torch.argmax`` of the draft logits (no symbol to hook), so for chains
    the draft forward's logits are kept while the original runs and the
    sampled rows' ``next_draft_input.topk_index`` is replaced by the race
    winner afterwards.
    """
    if not _hooked(self):
        return original(self, batch, batch_result, *args, **kwargs)
    drafted_at = lambda: after_root(batch_result.new_seq_lens)  # noqa: E731
    site = _site(self, drafted_at)
    with draft_site(site), _ranked_within(site):
        if self.topk > 1:
            return original(self, batch, batch_result, *args, **kwargs)
        with _kept_draft_logits(self) as kept:
            result = original(self, batch, batch_result, *args, **kwargs)
    info, draft = batch.sampling_info, batch_result.next_draft_input
    if kept and info is not None and info.sampling_seed is not None and draft.topk_index.numel():
        winners = children_tensor(kept[-1].next_token_logits, info, drafted_at().view(-1), 1,
                                  current_config().kernel, site.hot_token_id, site.target_vocab)
        sampled = (info.top_ks > 1).view(-1, 1)
        draft.topk_index = torch.where(sampled, winners.argmax(dim=-1, keepdim=True), draft.topk_index)
    return result


@contextlib.contextmanager
def _kept_draft_logits(worker):
    """Keep the ``LogitsProcessorOutput`` of the worker's draft-extend forward (eager or CUDA-graph replay).

    Patches the two bound methods on this worker's own objects for the
    duration of one call (SGLang's scheduler drives a worker from one
    thread). After the original returns, the kept output's
    ``next_token_logits`` holds the rows SGLang chose its drafts from
    (the eager path reassigns them to the selected rows in place).
    """
    kept = []
    patched = []

    def keep(obj, name, pick):
        if obj is None:
            return
        bound, own = getattr(obj, name), name in vars(obj)

        def wrapper(*args, **kwargs):
            out = bound(*args, **kwargs)
            kept.append(pick(out))
            return out

        setattr(obj, name, wrapper)
        patched.append((obj, name, bound if own else None))

    keep(worker.draft_runner, "forward", lambda out: out.logits_output)
    keep(getattr(worker, "cuda_graph_runner_for_draft_extend", None), "execute", lambda out: out)
    try:
        yield kept
    finally:
        for obj, name, own in patched:
            if own is None:
                delattr(obj, name)
            else:
                setattr(obj, name, own)


def children_tensor(
    logits: torch.Tensor,  # [R, V_draft] float: draft logits, R = B * rows_per_request
    sampling_info,  # SGLang SamplingBatchInfo of the B requests
    positions: torch.Tensor,  # [R] int: absolute position of the token each row drafts
    k: int,
    kernel: str,
    hot_token_id: torch.Tensor | None = None,  # [V_draft] int64: target id of each draft column
    target_vocab: int | None = None,  # the target's vocabulary size, with hot_token_id
) -> torch.Tensor:
    """``ops.draft_children.draft_children`` over SGLang's batch settings: float32 [R, V_draft].

    A request's ``R / B`` rows are consecutive and share its temperature,
    top-k / top-p / min-p and seed (:func:`.positions.sampling_rows`).
    """
    rows = logits.shape[0]
    batch = sampling_rows(sampling_info, rows // max(sampling_info.sampling_seed.numel(), 1))
    return draft_children(logits, batch.temperatures, batch.top_ks, batch.seeds, positions, k, cut=batch.cut_args(),
                          kernel=kernel, hot_token_id=hot_token_id, target_vocab=target_vocab)


def ranked_children(logits, sampling_info, positions, k: int, kernel: str):
    """:func:`children_tensor` over a full draft vocabulary with its top-k: ``ops.draft_children.DraftChildren``."""
    rows = logits.shape[0]
    batch = sampling_rows(sampling_info, rows // max(sampling_info.sampling_seed.numel(), 1))
    return draft_children_topk(logits, batch.temperatures, batch.top_ks, batch.seeds, positions, k,
                               cut=batch.cut_args(), kernel=kernel)


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
    drafted_at = site.positions().view(-1)
    if site.picked is None:
        return children_tensor(next_token_logits, sampling_info, drafted_at, site.k, current_config().kernel,
                               site.hot_token_id, site.target_vocab)
    parts = ranked_children(next_token_logits, sampling_info, drafted_at, site.k, current_config().kernel)
    site.picked[:] = [parts]
    return parts.dense


def ranked_topk(original, values, topk, dim=-1, *args, **kwargs):
    """``fast_topk(values [R, V], topk, dim)`` within a site: ``(float32 [R, topk], int64 [R, topk])``.

    ``original``: SGLang's ``fast_topk``. On the tensor
    :func:`coupled_renorm_draft_probs` just returned in the published site,
    with the site's k along the last dimension: the top-k its race found
    (``DraftChildren.values`` / ``.indices``): the values SGLang's top-k of
    that tensor gives, among equal values the smaller id. Any other call
    (another tensor, another k or dimension): SGLang's.
    """
    site = published_site()
    picked = site.picked if site is not None else None
    if (picked and values is picked[0].dense and topk == picked[0].indices.shape[-1] and not args and not kwargs
            and dim in (-1, values.dim() - 1)):
        return picked[0].values, picked[0].indices
    return original(values, topk, dim, *args, **kwargs)


@contextlib.contextmanager
def _ranked_within(site: DraftSite):
    """``eagle_worker_v2.fast_topk`` is :func:`ranked_topk` while the block runs, where the site keeps children.

    The scheduler drives a worker from one thread; the module attribute is
    restored after the block (also on error).
    """
    if site.picked is None:
        yield
        return
    from sglang.srt.speculative import eagle_worker_v2 as module

    original = module.fast_topk
    module.fast_topk = lambda values, topk, dim=-1, *a, **kw: ranked_topk(original, values, topk, dim, *a, **kw)
    try:
        yield
    finally:
        module.fast_topk = original


def coupled_chain_step(original, next_token_logits, positions, draft_tokens=None, draft_token_column=0,
                       *args, **kwargs):
    """AROUND hook for ``draft_topk1_postprocess(logits [R, V_draft], positions [R], draft_tokens, column)``.

    Outside a published site SGLang's argmax. Inside one (a coupled chain
    whose sampled-draft path is off), sampled rows draft the race winner of
    :func:`children_tensor` with k = 1 at the published positions, read
    before SGLang's kernel advances them; greedy rows keep the kernel's
    argmax. Returns SGLang's ``(topk_p float32 [R, 1] of ones, topk_index
    int64 [R, 1])`` and writes ``draft_tokens[:, column]`` when given, as the
    kernel does.
    """
    site = published_site()
    info = site.sampling_info if site is not None else None
    if site is None or info is None or info.sampling_seed is None or not next_token_logits.numel():
        return original(next_token_logits, positions, draft_tokens, draft_token_column, *args, **kwargs)
    drafted_at = site.positions().view(-1).clone()
    winners = children_tensor(next_token_logits, info, drafted_at, 1, current_config().kernel,
                              site.hot_token_id, site.target_vocab).argmax(dim=-1, keepdim=True)
    topk_p, topk_index = original(next_token_logits, positions, draft_tokens, draft_token_column, *args, **kwargs)
    sampled = (info.top_ks > 1).view(-1, 1)
    topk_index = torch.where(sampled, winners, topk_index)
    if draft_tokens is not None:
        draft_tokens[:, draft_token_column].copy_(topk_index.view(-1))
    return topk_p, topk_index


def graph_seed_buffer(original, self, *args, **kwargs):
    """AROUND hook for the EAGLE draft graph runner's ``capture_one_shape``: a seed buffer before capture.

    The captured ``SamplingBatchInfo`` reads ``buffers.sampling_seed[:bs]``;
    SGLang allocates it only with the rejection-sampling flag.
    """
    buffers = self.buffers
    if _hooked(self.eagle_worker) and buffers.sampling_seed is None:
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
    if (_hooked(self.eagle_worker) and seed_buffer is not None and info is not None
            and info.sampling_seed is not None):
        n = forward_batch.batch_size
        seed_buffer[:n].copy_(info.sampling_seed[:n])
        self.temperatures[:n].copy_(info.temperatures[:n])
        self.top_ks[:n].copy_(info.top_ks[:n])
    return original(self, forward_batch, *args, **kwargs)

