"""The target probabilities SGLang's verify computes: skipped in coupled mode, reproducible in rejection mode.

SGLang's ``eagle_sample`` turns the target logits of every verify row into
``target_probs`` [B, N, V] before it calls its sampler: a softmax at the
request's temperature, then a top-k and a top-p renormalisation when a row of
the batch truncates (``sglang/srt/speculative/eagle_utils.py``,
``eagle_sample``), and, without the rejection flag, a zero ``draft_probs`` of
the same size. Coupled verify never reads them: it computes its weights from
the logits as the non-speculative sampler does (``verify_hook``). At 128
requests x 4 rows x a 128K vocabulary these are several passes over 256 MB
per verify step, so in a coupled verify they are not computed.

Hooked symbols (AROUND; SGLang's original runs outside a coupled verify):

- ``sglang.kernels.ops.sampling.softmax``: inside a coupled verify (the
  context ``verify_hook`` publishes during ``eagle_sample``) it returns a
  zero-strided stand-in of the shape SGLang's verify checks: ``[rows, V]``
  when SGLang hands the draft distributions to its sampler (the rejection
  flag: it checks that both have V columns), ``[rows, 1]`` otherwise (its
  zero ``draft_probs`` then costs nothing). Elsewhere (the target sampler,
  the draft proposals) the call goes through unchanged.
- ``sglang.srt.speculative.eagle_utils._verify_coins``: the uniforms of
  SGLang's rejection sampler (a hash per row and draft, several small
  kernels); inside a coupled verify, zero stand-ins of their shapes.
- ``sglang.kernels.ops.sampling.renorm.top_k_renorm_prob`` and
  ``top_p_renorm_prob``: inside a coupled verify they hand the stand-in back.
  Otherwise (rejection-mode verify, SGLang's sampler paths) rows with
  ``top_k >= V`` or ``top_p >= 1`` keep their probabilities bit for bit, and
  the others are renormalised by flashinfer in its deterministic mode: by
  default top-k sums a row split over thread blocks with float atomics in
  arrival order, and top-p places its cut from histograms built the same
  way, so a truncated row could change from run to run.
"""

from __future__ import annotations

import functools
import inspect

import torch

from ..config import current_config
from .channels import VERIFY

SOFTMAX = "sglang.kernels.ops.sampling.softmax"
COINS = "sglang.srt.speculative.eagle_utils._verify_coins"
TOP_K_RENORM = "sglang.kernels.ops.sampling.renorm.top_k_renorm_prob"
TOP_P_RENORM = "sglang.kernels.ops.sampling.renorm.top_p_renorm_prob"


def in_coupled_verify() -> bool:
    """A coupled verify is in progress in this thread: SGLang's target probabilities go unread."""
    return VERIFY.read() is not None and current_config().coupled


def unread_probs(logits: torch.Tensor, full_width: bool) -> torch.Tensor:
    """A stand-in for probabilities nobody reads: float32 zeros, ``[*logits.shape[:-1], V or 1]``, no memory per row.

    ``full_width``: V columns (SGLang compares them with the draft
    distributions' width); else one, so a ``zeros_like`` of it is small too.
    """
    width = logits.shape[-1] if full_width else 1
    return torch.zeros((), dtype=torch.float32, device=logits.device).expand(*logits.shape[:-1], width)


def skip_in_coupled_verify(original, logits, temperatures=None, *args, **kwargs):
    """AROUND hook for SGLang's sampling ``softmax(logits [R, V], temperatures [R, 1] | None)``.

    Returns:
        Inside a coupled verify, :func:`unread_probs` (V wide when the bag has
        SGLang's rejection flag); otherwise SGLang's float [R, V] softmax.
    """
    if in_coupled_verify():
        return unread_probs(logits, current_config().rejection_sampling)
    return original(logits, temperatures, *args, **kwargs)


def skip_coins_in_coupled_verify(original, *args, sampling_info, seq_lens, draft_token_num, candidates, device,
                                 **kwargs):
    """AROUND hook for SGLang's ``_verify_coins(*, sampling_info, seq_lens, draft_token_num, candidates, device)``.

    Returns:
        ``(coins float32 [B, N], final coins float32 [B])``: zero-strided zeros
        inside a coupled verify (unread), else SGLang's uniforms.
    """
    if in_coupled_verify():
        zero = torch.zeros((), dtype=torch.float32, device=device)
        return zero.expand(*candidates.shape), zero.expand(candidates.shape[0])
    return original(*args, sampling_info=sampling_info, seq_lens=seq_lens, draft_token_num=draft_token_num,
                    candidates=candidates, device=device, **kwargs)


def _keep_neutral_rows(probs, renormed, neutral):
    return torch.where(neutral.view(-1, 1), probs, renormed)


@functools.cache
def _takes_is_deterministic(kernel) -> bool:
    try:
        return "is_deterministic" in inspect.signature(kernel).parameters
    except (TypeError, ValueError):  # a builtin without a signature
        return False


def _reproducible(original, args: tuple, kwargs: dict) -> dict:
    """``kwargs`` plus ``is_deterministic=True`` where the renorm kernel takes it (flashinfer's on CUDA).

    SGLang binds the name to a lazy loader on CUDA (flashinfer's function
    behind it) and to kernels without the flag elsewhere; a flag already
    given positionally is left as it is, one given by keyword is set to True
    (SGLang 0.5.23's callers pass neither).
    """
    kernel = original._load() if hasattr(original, "_load") else original  # sglang.utils.LazyImport
    if args or not _takes_is_deterministic(kernel):
        return kwargs
    return {**kwargs, "is_deterministic": True}


def _renorm(original, probs, cut, neutral, args, kwargs):
    if not current_config().active:
        return original(probs, cut, *args, **kwargs)
    if in_coupled_verify():
        return probs
    out = original(probs, cut, *args, **_reproducible(original, args, kwargs))
    if not isinstance(cut, torch.Tensor):
        return out
    return _keep_neutral_rows(probs, out, neutral(cut))


def top_k_renorm_keep_neutral(original, probs, top_ks, *args, **kwargs):
    """AROUND hook for SGLang's ``top_k_renorm_prob(probs [B, V], top_ks [B])``: float [B, V].

    Rows with ``top_k >= V`` keep ``probs`` bit for bit; inside a coupled verify ``probs`` comes back unchanged.
    """
    return _renorm(original, probs, top_ks, lambda k: k >= probs.shape[-1], args, kwargs)


def top_p_renorm_keep_neutral(original, probs, top_ps, *args, **kwargs):
    """AROUND hook for SGLang's ``top_p_renorm_prob(probs [B, V], top_ps [B])``: float [B, V].

    Rows with ``top_p >= 1`` keep ``probs`` bit for bit; inside a coupled verify ``probs`` comes back unchanged.
    """
    return _renorm(original, probs, top_ps, lambda p: p >= 1.0, args, kwargs)
