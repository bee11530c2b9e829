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

Active whenever the plugin is loaded and ``SGLANG_DETSPEC_DISABLE`` is not
set, with or without ``--enable-deterministic-inference``: the crash is
SGLang's, any server can be emptied by it, and the check is one pass over
the ids already in host memory.
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
    """``n`` (samples per prompt) of each parameter set, when given, an integer >= 1.

    Args:
        sampling_params: a request's sampling parameters: a dict, a list of
            dicts (a batch), or None.

    Raises:
        ValueError: naming ``n``, the value and the bound.
    """
    sets = sampling_params if isinstance(sampling_params, list) else [sampling_params]
    for params in sets:
        n = params.get("n", 1) if isinstance(params, dict) else 1
        if n is not None and (not _is_int(n) or n < 1):
            raise ValueError(f"n must be an integer >= 1 (samples per prompt), got {n!r}")


def validate_request(original, self, obj, input_ids, *args, **kwargs):
    """AROUND hook for ``_validate_one_request(obj, input_ids)``: the ids, then SGLang's checks."""
    if input_ids is not None and not current_config().disabled:
        check_input_ids(input_ids, self.model_config.vocab_size)
    return original(self, obj, input_ids, *args, **kwargs)


def validate_n(self, *args, **kwargs) -> None:
    """BEFORE hook for ``GenerateReqInput._handle_parallel_sampling()``: ``n >= 1`` before SGLang reads it."""
    if not current_config().disabled:
        check_n(self.sampling_params)
