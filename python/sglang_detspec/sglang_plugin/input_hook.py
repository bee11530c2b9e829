"""Request validation before the scheduler: the rules of ``request_rules``, at SGLang's own check points.

Hooked symbols:

- ``sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request``
  (AROUND): SGLang 0.5.23 calls it for every request it tokenizes or takes as
  ids (``/generate`` single and batched, ``/v1/completions``,
  ``/v1/chat/completions``, ``Engine.generate``; a batch per element), with
  the prompt's ids at hand: every per-request rule runs here, then SGLang's
  own checks;
- ``sglang.srt.managers.io_struct.GenerateReqInput._handle_parallel_sampling``
  (BEFORE): where SGLang first reads ``n``, while normalising a request (a
  float ``n`` fails there with a ``TypeError`` otherwise), after it has
  counted a batch's prompts: the rules on the request as sent (``n``, the
  lengths of a batch's per-request lists, ``rid``).

SGLang turns their ``ValueError`` into an HTTP 400 (``Engine`` raises it in
the caller's process).

Why: fields such as ``input_ids``, ``top_logprobs_num``, ``top_k``,
``min_new_tokens`` and ``stop_token_ids`` become tensor indices or sizes in
the scheduler, where a bad value aborts the scheduler process and loses every
request in flight (docs/request_fields.md lists them).

Active for the runs that are the plugin's (``--enable-deterministic-inference``
on, ``SGLANG_DETSPEC_DISABLE`` unset), like every other hook: an environment
with the plugin installed runs SGLang untouched otherwise, and the crashes
are SGLang's own there. The checks are passes over fields already in host
memory.
"""

from __future__ import annotations

from ..config import current_config
from .request_rules import check_request, check_whole, limits_of

TARGET = "sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request"
N_TARGET = "sglang.srt.managers.io_struct.GenerateReqInput._handle_parallel_sampling"


def validate_request(original, self, obj, input_ids, *args, **kwargs):
    """AROUND hook for ``_validate_one_request(obj, input_ids)``: the table's per-request rules, then SGLang's checks.

    Raises:
        RequestRuleError: a field breaks its rule (bag active; ``request_rules``).
    """
    if current_config().ours:
        check_request(obj, input_ids, limits_of(self))
    return original(self, obj, input_ids, *args, **kwargs)


def validate_n(self, *args, **kwargs) -> None:
    """BEFORE hook for ``GenerateReqInput._handle_parallel_sampling()``: ``n``, batch lists, ``rid``, before SGLang.

    Raises:
        RequestRuleError: a rule broken (bag active; ``request_rules``).
    """
    if current_config().ours:
        check_whole(self)
