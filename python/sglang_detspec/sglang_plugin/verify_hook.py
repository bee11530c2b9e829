"""Target verify: accept coins, residual draw and bonus token through ``verify_chain``.

Hooked symbols:

- ``sglang.srt.speculative.eagle_utils.eagle_sample`` (AROUND): shared by
  EAGLE v2 and multi-layer EAGLE verify. It publishes the batch's request
  seeds and the absolute position of each request's first draft token
  (``batch.seq_lens + 1``: the root token sits at ``seq_lens``) for the chain
  sampler below, for the duration of one call. Everything else eagle_sample
  does (penalties, grammar masks, temperature, top-k/top-p renormalisation of
  the target, the all-greedy argmax path, TP broadcast) stays SGLang's.
- ``sglang.kernels.ops.speculative.verify_sampling.chain_speculative_sampling_triton``
  (AROUND; the registry also rewrites eagle_utils' binding): when keys are
  published, the chain verify runs as :func:`verify_chain` and writes SGLang's
  outputs (``predicts``, ``accept_index``, ``accept_token_num``).

Why: SGLang's seeded verify draws its coins from the unsalted key space of
its target sampler, reuses one final coin for residual and bonus, and draws
the residual by an inverse-CDF scan whose float32 prefix sums depend on the
tile order; here the coins, the residual race and the bonus race come from
separate streams at absolute positions (docs/design.md §4), so a request's committed
tokens depend on its seed and its own sequence only. Greedy rows keep
SGLang's argmax rule: SGLang renormalises their target to one-hot before the
sampler, under which the chain verify commits the target argmax.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import NamedTuple

import torch

from ..ops import verify_chain
from .resolve import active_config

EAGLE_SAMPLE = "sglang.srt.speculative.eagle_utils.eagle_sample"
CHAIN_SAMPLER = "sglang.kernels.ops.speculative.verify_sampling.chain_speculative_sampling_triton"


class VerifyKeys(NamedTuple):
    """Keys of one verify call: request seeds int64 [B] and first-draft positions [B]."""

    seeds: torch.Tensor
    positions: torch.Tensor


_KEYS: contextvars.ContextVar[VerifyKeys | None] = contextvars.ContextVar("detspec_verify_keys", default=None)


@contextlib.contextmanager
def verify_keys(seeds: torch.Tensor, positions: torch.Tensor):
    """Publish the keys the chain sampler uses while the block runs.

    Args:
        seeds: int64 [B] request seeds (uint64 bits).
        positions: integer [B] absolute position of each request's first draft token.
    """
    token = _KEYS.set(VerifyKeys(seeds, positions))
    try:
        yield
    finally:
        _KEYS.reset(token)


def seeded_eagle_sample(original, *args, **kwargs):
    """AROUND hook for ``eagle_utils.eagle_sample(verify_input, batch, logits_output, ...)``.

    Args:
        original: SGLang's ``eagle_sample``; always runs, with the keys
            published when the bag is active and the batch carries seeds.
        args, kwargs: eagle_sample's arguments; ``batch`` (second) supplies
            ``sampling_info.sampling_seed`` (int64 [B]) and ``seq_lens`` [B].

    Returns:
        Whatever SGLang's ``eagle_sample`` returns: ``(predict, accept_lens, accept_index)``.
    """
    if not active_config().active:
        return original(*args, **kwargs)
    batch = kwargs["batch"] if "batch" in kwargs else args[1]  # eagle_sample(verify_input, batch, ...)
    seeds = batch.sampling_info.sampling_seed
    if seeds is None:
        return original(*args, **kwargs)
    with verify_keys(seeds, batch.seq_lens + 1):
        return original(*args, **kwargs)


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

    Without published keys (a verify outside :func:`seeded_eagle_sample`) or
    with block verification, SGLang's kernel runs.
    """
    keys = _KEYS.get()
    if keys is None or block_verification:
        return original(
            predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
            retrive_next_sibling, uniform_samples, uniform_samples_for_final_sampling, target_probs,
            draft_probs, threshold_single, threshold_acc, deterministic, block_verification=block_verification,
        )
    tokens, accepted = verify_chain(
        candidates[:, 1:], draft_probs, target_probs, keys.seeds, keys.positions,
        check=False, kernel=active_config().kernel,
    )
    write_chain_outputs(tokens, accepted, retrive_index, predicts, accept_index, accept_token_num)


def write_chain_outputs(
    tokens: torch.Tensor,  # [B, W] int64, committed tokens padded with -1
    accepted: torch.Tensor,  # [B] int64 accepted draft tokens
    retrive_index: torch.Tensor,  # [B, W] flat slots
    predicts: torch.Tensor,  # [B*W] out
    accept_index: torch.Tensor,  # [B, >= W] out
    accept_token_num: torch.Tensor,  # [B] out
) -> None:
    """Write verify results in SGLang's chain-sampler layout, without a host sync.

    Slot j of row b (j <= accepted[b]) gets ``predicts[retrive_index[b, j]] =
    tokens[b, j]`` and ``accept_index[b, j] = retrive_index[b, j]``; other
    entries keep their values.
    """
    w = tokens.shape[1]
    keep = torch.arange(w, device=tokens.device).unsqueeze(0) <= accepted.unsqueeze(1)  # [B, W]
    flat = retrive_index.reshape(-1).to(torch.int64)
    current = predicts.gather(0, flat)
    predicts.scatter_(0, flat, torch.where(keep.reshape(-1), tokens.reshape(-1).to(predicts.dtype), current))
    cols = min(w, accept_index.shape[1])
    accept_index[:, :cols] = torch.where(
        keep[:, :cols], retrive_index[:, :cols].to(accept_index.dtype), accept_index[:, :cols]
    )
    accept_token_num.copy_(accepted.to(accept_token_num.dtype))
