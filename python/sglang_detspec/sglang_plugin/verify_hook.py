"""Target verify: coupled verify (chain and tree) or seeded rejection sampling (chain).

Hooked symbols (AROUND):

- ``sglang.srt.speculative.eagle_utils.eagle_sample``: shared by EAGLE v2,
  multi-layer EAGLE, STANDALONE and NGRAM verify. Publishes the batch's
  request seeds, the absolute position of the token after each request's
  tree root (``batch.seq_lens + 1``), the target logits and the sampling
  settings for the sampler it calls, for the duration of one call.
  Everything else it does (penalties, grammar mask, the all-greedy argmax
  path, TP broadcast) stays SGLang's.
- ``sglang.kernels.ops.speculative.verify_sampling.tree_speculative_sampling_target_only``
  (eagle_sample's sampler without the rejection flag, chains and trees): runs
  coupled verify.
- ``sglang.kernels.ops.speculative.verify_sampling.chain_speculative_sampling_triton``
  (eagle_sample's sampler with the rejection flag): coupled chain verify in
  coupled mode, :func:`verify_chain` in rejection mode.

Why: SGLang's verify draws from the unsalted key space of its target sampler
and by inverse-CDF scans, so its tokens depend on the draft and on float32
prefix-sum order; coupled verify emits the TARGET-stream token of every
position (the non-speculative sampler's token), rejection mode uses separate
streams at absolute positions (DESIGN section 4). Both write SGLang's outputs
(``predicts``, ``accept_index``, ``accept_token_num``) without a host sync;
on the Triton path coupled verify writes them from inside its kernel's walk
(the torch path scatters them after it).

Coupled verify (docs/design.md, "Coupled verification"): at each accepted node the target token of
the next position is ``y = race(w, TARGET, t)``; a child whose token equals
``y`` is accepted, else ``y`` is emitted and the walk stops. The weights ``w``
are computed from the target logits exactly as the non-speculative sampler
computes them (``ops.target_weights``), not taken from SGLang's verify softmax
and renormalisation, so every emitted token is bitwise the token a server
without speculative decoding samples. Positions: the tree root (the last
committed token) sits at ``seq_lens`` and node ``i`` at ``seq_lens +
depth(i)``; ``ops.coupled_verify_tree`` takes ``positions = seq_lens + 1``
and adds the depth (:mod:`.positions`).
"""

from __future__ import annotations

import torch

from typing import NamedTuple

from ..config import current_config
from ..ops.coupled import coupled_verify_chain, coupled_verify_tree
from ..ops.verify import verify_chain
from ..ops.verify_outputs import VerifyOutputs, write_verify_outputs
from ..ops.weights import target_weights
from .channels import VERIFY
from .positions import after_root, cuts, sampling_rows

EAGLE_SAMPLE = "sglang.srt.speculative.eagle_utils.eagle_sample"
CHAIN_SAMPLER = "sglang.kernels.ops.speculative.verify_sampling.chain_speculative_sampling_triton"
TREE_SAMPLER = "sglang.kernels.ops.speculative.verify_sampling.tree_speculative_sampling_target_only"


class VerifyContext(NamedTuple):
    """What one ``eagle_sample`` call publishes for the sampler it calls.

    Attributes:
        seeds: int64 [B] request seeds (uint64 bits).
        positions: int [B] absolute position of the token after the root (``seq_lens + 1``).
        logits_output: SGLang's ``LogitsProcessorOutput``; its ``next_token_logits``
            [B*N, V] carry the penalties, logit bias and grammar mask eagle_sample
            applied in place before it calls the sampler.
        sampling_info: SGLang's ``SamplingBatchInfo`` (temperatures [B, 1], top_ks,
            top_ps, min_ps [B], the ``need_*`` flags).
    """

    seeds: torch.Tensor
    positions: torch.Tensor
    logits_output: object
    sampling_info: object


def verify_weights(ctx: VerifyContext, width: int) -> torch.Tensor:
    """Target weights of every verify row: float [B, width, V].

    Row ``(b, i)`` is the distribution of the token after node ``i`` of request
    ``b``: the request's temperature and top-k / top-p / min-p, repeated over
    its ``width`` nodes, applied as the non-speculative sampler applies them.
    """
    logits = ctx.logits_output.next_token_logits  # [B*width, V]
    b = logits.shape[0] // width
    info = ctx.sampling_info
    if not cuts(info):
        # Each request's temperature broadcast over its nodes: the division and the row softmax
        # are the repeated rows' own, bit for bit, without materialising the repeats.
        return target_weights(logits.view(b, width, -1), info.temperatures.view(b, 1, 1))
    rows = sampling_rows(info, width)
    return target_weights(logits, rows.temperatures, *rows.cut_args()).view(b, width, -1)


def coupled_tree_outputs(
    ctx: VerifyContext,
    candidates: torch.Tensor,  # [B, N] int: node tokens, node 0 = root
    retrive_next_token: torch.Tensor,  # [B, N] int: first child or -1
    retrive_next_sibling: torch.Tensor,  # [B, N] int: next sibling or -1
    kernel: str,
    out: VerifyOutputs | None = None,
):
    """Coupled tree verify of one batch: ``(tokens int64 [B, N], accepted int64 [B], path int64 [B, N])``.

    See ``ops.coupled_verify_tree`` for the outputs and ``out`` (SGLang's
    buffers, written by the verify kernel itself); a chain is the tree whose
    ``next_token[i] = i + 1``.
    """
    weights = verify_weights(ctx, candidates.shape[1])
    return coupled_verify_tree(
        candidates, retrive_next_token, retrive_next_sibling, weights, ctx.seeds, ctx.positions,
        check=False, kernel=kernel, out=out,
    )


def coupled_chain_outputs(ctx: VerifyContext, candidates: torch.Tensor, kernel: str,
                          out: VerifyOutputs | None = None):
    """Coupled chain verify: ``(tokens int64 [B, W], accepted int64 [B])``.

    ``candidates`` [B, W]: the root then ``W - 1`` draft tokens; ``out``:
    SGLang's buffers over the W nodes, written by the verify kernel itself
    (``ops.coupled_verify_chain``).
    """
    weights = verify_weights(ctx, candidates.shape[1])
    return coupled_verify_chain(
        candidates[:, 1:], weights, ctx.seeds, ctx.positions, check=False, kernel=kernel, out=out,
    )


def verify_context(ctx: VerifyContext):
    """Publish ``ctx`` for the verify sampler while the block runs."""
    return VERIFY.publish(ctx)


def published() -> VerifyContext | None:
    """The context of the ``eagle_sample`` call in progress, or None."""
    return VERIFY.read()


def seeded_eagle_sample(original, *args, **kwargs):
    """AROUND hook for ``eagle_utils.eagle_sample(verify_input, batch, logits_output, ...)``.

    Args:
        original: SGLang's ``eagle_sample``; always runs, with the context
            published when the bag is active and the batch carries seeds.
        args, kwargs: eagle_sample's arguments; ``batch`` (second) supplies
            ``sampling_info`` and ``seq_lens`` [B], ``logits_output`` (third)
            the target logits [B*N, V].

    Returns:
        Whatever SGLang's ``eagle_sample`` returns: ``(predict, accept_lens, accept_index)``.
    """
    if not current_config().active:
        return original(*args, **kwargs)
    batch = kwargs["batch"] if "batch" in kwargs else args[1]
    logits_output = kwargs["logits_output"] if "logits_output" in kwargs else args[2]
    info = batch.sampling_info
    watermark = kwargs.get("watermark_state")
    if info.sampling_seed is None or (watermark is not None and info.has_watermark_candidates):
        # Watermarking rewrites a copy of the logits that the sampler never sees here.
        return original(*args, **kwargs)
    ctx = VerifyContext(info.sampling_seed, after_root(batch.seq_lens), logits_output, info)
    with verify_context(ctx):
        return original(*args, **kwargs)


def coupled_tree_sampling(
    original,
    predicts,  # [B*N] int32 out, indexed by retrive_index
    accept_index,  # [B, D] int32 out, -1 padded
    accept_token_num,  # [B] int32 out: accepted draft tokens
    candidates,  # [B, N] node tokens, node 0 = root
    retrive_index,  # [B, N] flat slot of each node
    retrive_next_token,  # [B, N] first child or -1
    retrive_next_sibling,  # [B, N] next sibling or -1
    uniform_samples,
    uniform_samples_for_final_sampling,
    target_probs,  # [B, N, V] SGLang's renormalised target (unused: weights come from the logits)
    draft_probs,
    threshold_single=1.0,
    threshold_acc=1.0,
    deterministic=True,
):
    """AROUND hook for SGLang's target-only tree sampler; same signature and outputs.

    Without a published context (a verify outside :func:`seeded_eagle_sample`),
    SGLang's kernel runs. Accept thresholds do not apply: coupled verify is exact.
    """
    ctx = published()
    if ctx is None:
        return original(
            predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
            retrive_next_sibling, uniform_samples, uniform_samples_for_final_sampling, target_probs,
            draft_probs, threshold_single, threshold_acc, deterministic,
        )
    # On the Triton path the verify kernel's walk writes SGLang's buffers itself: no scatter after it.
    coupled_tree_outputs(ctx, candidates, retrive_next_token, retrive_next_sibling, current_config().kernel,
                         VerifyOutputs(retrive_index, predicts, accept_index, accept_token_num))


def seeded_chain_sampling(
    original,
    predicts,  # [B*W] int32 out, indexed by retrive_index
    accept_index,  # [B, >= W] int32 out, -1 padded
    accept_token_num,  # [B] int32 out: accepted draft tokens
    candidates,  # [B, W] root then K = W-1 draft tokens
    retrive_index,  # [B, W] flat slot of each candidate
    retrive_next_token,
    retrive_next_sibling,
    uniform_samples,
    uniform_samples_for_final_sampling,
    target_probs,  # [B, W, V] p for slots 1..W (row K: bonus)
    draft_probs,  # [B, K, V] q of each draft token
    threshold_single,
    threshold_acc,
    deterministic,
    *,
    block_verification: bool = False,
):
    """AROUND hook for SGLang's chain rejection sampler; same signature and outputs.

    Coupled mode: coupled chain verify over weights from the target logits
    (``draft_probs`` unused). Rejection mode: :func:`verify_chain` over
    SGLang's ``target_probs`` and ``draft_probs``. Without a published
    context, or with block verification, SGLang's kernel runs.
    """
    ctx = published()
    if ctx is None or block_verification:
        return original(
            predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
            retrive_next_sibling, uniform_samples, uniform_samples_for_final_sampling, target_probs,
            draft_probs, threshold_single, threshold_acc, deterministic, block_verification=block_verification,
        )
    bag = current_config()
    if bag.coupled:
        coupled_chain_outputs(ctx, candidates, bag.kernel,
                              VerifyOutputs(retrive_index, predicts, accept_index, accept_token_num))
        return
    tokens, accepted = verify_chain(
        candidates[:, 1:], draft_probs, target_probs, ctx.seeds, ctx.positions, check=False, kernel=bag.kernel,
    )
    path = torch.arange(tokens.shape[1], device=tokens.device).expand_as(tokens)
    write_verify_outputs(tokens, accepted, path, retrive_index, predicts, accept_index, accept_token_num)
