"""Draft proposals: SGLang's seeded ``fast_sample`` through the fused exponential race.

Hooked symbol: ``sglang.srt.speculative.spec_utils.fast_sample`` (AROUND).
SGLang's hook registry rewrites every ``from spec_utils import fast_sample``
binding too, so one hook reaches every draft call site of 0.5.23:

- EAGLE worker v2 ``draft_forward`` (eager and inside the draft CUDA graph,
  through ``spec_utils.sample_draft_proposal``), ``_draft_extend_for_decode``
  (same) and ``_draft_extend_for_prefill`` (its own ``fast_sample`` binding);
- multi-layer EAGLE worker v2 prefill and decode draft-extend (eager and
  per-step graph paths, through ``sample_draft_proposal``);
- the single-CUDA-graph multi-layer draft-extend runner's
  ``_sample_draft_proposal`` (its own ``fast_sample`` binding).

Why: SGLang's seeded branch materialises a [B, V] uint32 hash matrix and a
[B, V] float64 score matrix (400 MiB and 890 us at B = 128, V = 163,840 on
an H200); the fused kernel draws the same tokens in one pass with no [B, V]
intermediate. Draws are bit-identical to SGLang's definition for the same
seed, position and step (the DRAFT stream is that definition), so nothing
about SGLang's proposal semantics changes.

Positions: each call site passes SGLang's own absolute, per-request key
position, taken from the batch (eager) or from the captured graph input
buffers (``buffers.positions`` / ``buffers.seq_lens``), which replay refills:
EAGLE v2 keys draft token c with the position of the token before it; the
multi-layer paths key every step of an iteration with the sequence length
after the verify write and separate steps by ``draft_step``. Both depend only
on the request's own sequence, never on its batch row.
"""

from __future__ import annotations

from ..ops import Stream, exponential_race
from .resolve import active_config

TARGET = "sglang.srt.speculative.spec_utils.fast_sample"


def seeded_fast_sample(original, probs, num_samples: int = 1, *, sampling_seed=None, positions=None, draft_step: int = 0):
    """AROUND hook for ``spec_utils.fast_sample``: same signature and return value.

    Args:
        original: SGLang's ``fast_sample``, run when the bag is inactive or the
            batch carries no seeds (deterministic inference off).
        probs: float [B, V] draft distribution q.
        num_samples: draws without replacement per row.
        sampling_seed: int64 [B] request seeds (uint64 bits) or None.
        positions: int32/int64 [B] absolute key positions.
        draft_step: draft step / MTP layer, the column block of the DRAFT stream.

    Returns:
        ``(sample_p [B, num_samples] in probs' dtype, sample_index int64 [B, num_samples])``.

    Raises:
        ValueError: mismatched shapes, dtypes or devices. Values are not
            checked (this runs inside CUDA-graph capture): SGLang's softmax
            rows and absolute positions are valid by construction.
    """
    bag = active_config()
    if sampling_seed is None or not bag.active:
        return original(probs, num_samples, sampling_seed=sampling_seed, positions=positions, draft_step=draft_step)
    if positions is None:
        raise ValueError("positions are required for a seeded draft proposal")
    index = exponential_race(
        probs, sampling_seed, positions, stream=Stream.DRAFT, draft_step=draft_step,
        num_samples=num_samples, check=False, kernel=bag.kernel,
    )
    return probs.gather(1, index), index
