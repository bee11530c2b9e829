"""Request validation before the scheduler: token ids inside the vocabulary, ``n >= 1``.

Hooked symbols:

- ``sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request``
  (AROUND): SGLang 0.5.23 calls it for every request it tokenizes or takes as
  ids (``/generate`` single and batched, ``/v1/completions``,
  ``/v1/chat/completions``, ``Engine.generate``; a batch per element);
- ``sglang.srt.managers.io_struct.GenerateReqInput._handle_parallel_sampling``
  (BEFORE): where SGLang first reads ``n``, while normalising a request (a
  float ``n`` fails there with a ``TypeError`` otherwise).

SGLang turns their ``ValueError`` into an HTTP 400 (``Engine`` raises it).

Why: SGLang sends ``input_ids`` to the embedding lookup as they come, and an
id outside ``[0, vocab_size)`` (``input_ids: [5000, 7]`` on a 4096-token
model, or ``[-1, 7]``) trips a device-side assert that aborts the scheduler
and loses every request in flight. ``n: 0`` and ``n: -1`` are accepted and
answered with one completion, while the plugin derives one seed per sample.

Active for the runs that are the plugin's (``--enable-deterministic-inference``
on, ``SGLANG_DETSPEC_DISABLE`` unset), like every other hook: an environment
with the plugin installed runs SGLang untouched otherwise, and the crash is
SGLang's own there. The check is one pass over ids already in host memory.
Requests with multimodal data or input embeddings are left to SGLang (their
processors use placeholder ids beyond the text vocabulary).
"""

from __future__ import annotations

import numbers

from ..config import current_config

TARGET = "sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request"
N_TARGET = "sglang.srt.managers.io_struct.GenerateReqInput._handle_parallel_sampling"


def _is_int(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_input_ids(input_ids, vocab_size: int) -> None:
    """Every id an integer in ``[0, vocab_size)``.

    Args:
        input_ids: the request's token ids (list, tuple or 1-D tensor / array).
        vocab_size: the served model's vocabulary size.

    Raises:
        ValueError: naming ``input_ids``, the first offending index and value, and the bound.
    """
    if hasattr(input_ids, "tolist"):
        input_ids = input_ids.tolist()
    if not input_ids:
        return
    # The common case in C-level passes: plain ints, all in range. Otherwise find the first bad one.
    if all(type(t) is int for t in input_ids) and 0 <= min(input_ids) and max(input_ids) < vocab_size:
        return
    for index, token in enumerate(input_ids):
        if not _is_int(token):
            raise ValueError(
                f"input_ids[{index}] must be an integer token id in [0, {vocab_size}), got {token!r}"
            )
        if not 0 <= token < vocab_size:
            raise ValueError(
                f"input_ids[{index}] = {token} is outside the model's vocabulary: token ids must be in "
                f"[0, {vocab_size})"
            )


def check_n(sampling_params) -> None:
    """``n`` (samples per prompt) of each parameter set, when given, an integer >= 1 (``null`` is refused too).

    Args:
        sampling_params: a request's sampling parameters: a dict, a list of
            dicts (a batch), or None.

    Raises:
        ValueError: naming ``n``, the value and the bound.
    """
    sets = sampling_params if isinstance(sampling_params, list) else [sampling_params]
    for params in sets:
        n = params.get("n", 1) if isinstance(params, dict) else 1
        if not _is_int(n) or n < 1:
            raise ValueError(f"n must be an integer >= 1 (samples per prompt), got {n!r}")


_MULTIMODAL = ("image_data", "video_data", "audio_data", "input_embeds")


def embedding_rows(model_config) -> int:
    """The token ids a text prompt may hold: the larger of the model's and its text model's vocabulary.

    Some multimodal configurations report a vision vocabulary as
    ``vocab_size`` and embed text with the text model's larger one.
    """
    text = getattr(model_config, "hf_text_config", None)
    return max(int(model_config.vocab_size), int(getattr(text, "vocab_size", 0) or 0))


def validate_request(original, self, obj, input_ids, *args, **kwargs):
    """AROUND hook for ``_validate_one_request(obj, input_ids)``: the ids, then SGLang's checks.

    Requests with image, video or audio data or input embeddings are left to
    SGLang: their processors put placeholder ids beyond the text vocabulary.
    """
    multimodal = any(getattr(obj, field, None) is not None for field in _MULTIMODAL)
    if input_ids is not None and not multimodal and current_config().ours:
        check_input_ids(input_ids, embedding_rows(self.model_config))
    return original(self, obj, input_ids, *args, **kwargs)


def validate_n(self, *args, **kwargs) -> None:
    """BEFORE hook for ``GenerateReqInput._handle_parallel_sampling()``: ``n >= 1`` before SGLang reads it."""
    if current_config().ours:
        check_n(self.sampling_params)
