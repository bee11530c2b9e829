"""Draft proposals: SGLang's seeded ``fast_sample`` through the fused exponential race.

Hooked symbols (AROUND):

- ``sglang.srt.speculative.spec_utils.fast_sample``: every seeded draft
  proposal of 0.5.23 (the registry rewrites each ``from spec_utils import
  fast_sample`` binding and ``sample_draft_proposal`` calls it), eager and
  inside draft CUDA graphs.
- ``MultiLayerEagleDraftWorker._draft_extend_for_prefill`` /
  ``_draft_extend_for_decode`` and
  ``MultiLayerEagleDraftExtendCudaGraphRunner._sample_draft_proposal``: they
  only tell the ``fast_sample`` hook where the token they draft sits, since
  multi-layer EAGLE keys its proposals differently from EAGLE v2.

Rejection mode: the DRAFT stream at SGLang's own key position and
``draft_step`` (DESIGN section 2): the same tokens as SGLang's definition,
drawn in one fused pass with no [B, V] hash or float64 matrix.

Coupled chain drafts (coupled mode; start-up turns SGLang's sampled-draft
path on for chains): the TARGET stream at the absolute position ``t`` of the
drafted token, column = token id (docs/design.md, coupled drafts), so a
draft token uses the same uniforms as the target token of its position. How
``t`` follows from SGLang's key position and ``draft_step`` at each call
site is written in :mod:`.positions`; the multi-layer hooks below publish
their site's rule there.
"""

from __future__ import annotations

from ..config import current_config
from ..ops.race import exponential_race
from ..ops.streams import Stream
from .positions import (
    coupled_draft_position, draft_positions, multi_layer_decode_rule, multi_layer_graph_rule, multi_layer_prefill_rule,
)

TARGET = "sglang.srt.speculative.spec_utils.fast_sample"
_ML_WORKER = "sglang.srt.speculative.multi_layer_eagle_worker_v2.MultiLayerEagleDraftWorker"
ML_PREFILL = f"{_ML_WORKER}._draft_extend_for_prefill"
ML_DECODE = f"{_ML_WORKER}._draft_extend_for_decode"
ML_GRAPH_SAMPLE = (
    "sglang.srt.speculative.multi_layer_eagle_draft_extend_cuda_graph_runner."
    "MultiLayerEagleDraftExtendCudaGraphRunner._sample_draft_proposal"
)

def seeded_fast_sample(
    original, probs, num_samples: int = 1, *, sampling_seed=None, positions=None, draft_step: int = 0
):
    """AROUND hook for ``spec_utils.fast_sample``: same signature and return value.

    Args:
        original: SGLang's ``fast_sample``, run when the bag is inactive or the
            batch carries no seeds (deterministic inference off).
        probs: float [B, V] draft distribution q.
        num_samples: draws without replacement per row.
        sampling_seed: int64 [B] request seeds (uint64 bits) or None.
        positions: int32/int64 [B] SGLang's key positions.
        draft_step: draft step / MTP layer.

    Returns:
        ``(sample_p [B, num_samples] in probs' dtype, sample_index int64 [B, num_samples])``.

    Raises:
        ValueError: no positions for a seeded call, or mismatched shapes,
            dtypes or devices. Values are not checked (this runs inside
            CUDA-graph capture).
    """
    bag = current_config()
    if sampling_seed is None or not bag.active:
        return original(probs, num_samples, sampling_seed=sampling_seed, positions=positions, draft_step=draft_step)
    if positions is None:
        raise ValueError("positions are required for a seeded draft proposal")
    if bag.coupled:
        index = exponential_race(
            probs, sampling_seed, coupled_draft_position(positions, draft_step), stream=Stream.TARGET,
            num_samples=num_samples, check=False, kernel=bag.kernel,
        )
    else:
        index = exponential_race(
            probs, sampling_seed, positions, stream=Stream.DRAFT, draft_step=draft_step,
            num_samples=num_samples, check=False, kernel=bag.kernel,
        )
    return probs.gather(1, index), index


def ml_prefill_positions(original, *args, **kwargs):
    """AROUND hook for multi-layer ``_draft_extend_for_prefill``: MTP layer s drafts ``key + 1 + s``."""
    if not current_config().coupled_drafts:
        return original(*args, **kwargs)
    with draft_positions(multi_layer_prefill_rule):
        return original(*args, **kwargs)


def ml_decode_positions(original, self, batch, batch_result, *args, **kwargs):
    """AROUND hook for multi-layer ``_draft_extend_for_decode(batch, batch_result, ...)``.

    ``batch.seq_lens`` [B] (pre-verify) and ``batch_result.accept_lens`` [B]
    give the drafted positions (:func:`.positions.multi_layer_decode_rule`).
    """
    if not current_config().coupled_drafts:
        return original(self, batch, batch_result, *args, **kwargs)
    with draft_positions(multi_layer_decode_rule(batch.seq_lens, batch_result.accept_lens)):
        return original(self, batch, batch_result, *args, **kwargs)


def ml_graph_sample_positions(original, self, ret, bs: int):
    """AROUND hook for the single-CUDA-graph runner's ``_sample_draft_proposal(ret, bs)``.

    The drafted positions follow from the graph's input buffers
    (:func:`.positions.multi_layer_graph_rule`), refilled before every replay.
    """
    if not current_config().coupled_drafts:
        return original(self, ret, bs)
    rule = multi_layer_graph_rule(self.speculative_num_draft_tokens, self.buffers.num_accept_tokens[:bs])
    with draft_positions(rule):
        return original(self, ret, bs)
