"""Request validation: the rules of ``request_rules`` at SGLang's own check points, before the scheduler.

Hooked symbols (all in the HTTP server's process; SGLang turns their
``ValueError`` into an HTTP 400, ``Engine`` raises it in the caller's process):

- ``sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request``
  (AROUND): SGLang 0.5.23 calls it for every request it tokenizes or takes as
  ids (``/generate`` single and batched, ``/v1/completions``,
  ``/v1/chat/completions``, ``Engine.generate``; a batch per element), with
  the prompt's ids at hand: every per-request rule of the table runs here
  (``sampling_seed`` among them), then SGLang's own checks;
- ``sglang.srt.managers.io_struct.GenerateReqInput._handle_parallel_sampling``
  (BEFORE): where SGLang first reads ``n``, while normalising a request (a
  float ``n`` fails there with a ``TypeError`` otherwise), after it has
  counted a batch's prompts: the rules on the request as sent (``n``, the
  lengths of a batch's per-request lists, ``rid``);
- ``sglang.srt.sampling.sampling_params.SamplingParams.verify`` (AROUND):
  SGLang calls it once per request in the tokenizer manager, after the two
  above; the seed rule again (for any path that skipped them), and a seed in
  [2**63, 2**64) is stored as the int64 with the same 64 bits, which is how
  SGLang's seed tensor carries it to the samplers (they read the bits as
  unsigned). SGLang itself admits [-2**63, 2**63), so on its own a negative
  seed is silently read as the uint64 with the same bits and seeds in
  [2**63, 2**64) cannot be sent at all;
- ``sglang.srt.entrypoints.api_contract.generate_contract_error`` (AROUND):
  the JSON schema gate of ``/generate`` (HTTP 400). It checks the type only:
  it refuses a seed that is not an integer (a float, a string, a bool) before
  any of the above runs, in words that name neither the field nor, for
  integers beyond 64 bits, the value sent (SGLang parses bodies with orjson,
  which turns those into floats: 2**64 is reported as "floating point
  `1.8446744073709552e+19`, expected i64"); the hook puts the seed rule's
  message in front.

Why: fields such as ``input_ids``, ``top_logprobs_num``, ``top_k``,
``min_new_tokens`` and ``stop_token_ids`` become tensor indices or sizes in
the scheduler, where a bad value aborts the scheduler process and loses every
request in flight; a batch list shorter than the batch is an ``IndexError``
(HTTP 500) in ``GenerateReqInput.__getitem__``; every detspec stream is keyed
by a seed in [0, 2**64) (docs/request_fields.md lists them all).

Scope: requests that reach these symbols through the tokenizer manager of the
HTTP server's main process. Tokenizer worker processes
(``--tokenizer-worker-num > 1``) load no plugins: the bag refuses that flag
at start-up (``config.py``). SGLang's Rust HTTP server bypasses this code:
there SGLang's own checks apply. The OpenAI endpoints' pydantic models turn
``"7"``, ``true`` and ``5.0`` into integers before these checks see them.

Every hook acts only while the bag is active
(:attr:`~sglang_detspec.config.DetSpecConfig.active`, the test every hook
makes); otherwise SGLang's validation runs untouched, crashes included. The checks are passes over fields already in
host memory.
"""

from __future__ import annotations

from ..config import current_config
from .request_rules import RequestRuleError, check_request, check_sampling_seed, check_whole, limits_of

TARGET = "sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request"
WHOLE_TARGET = "sglang.srt.managers.io_struct.GenerateReqInput._handle_parallel_sampling"
VERIFY_TARGET = "sglang.srt.sampling.sampling_params.SamplingParams.verify"
CONTRACT_TARGET = "sglang.srt.entrypoints.api_contract.generate_contract_error"


def validate_request(original, self, obj, input_ids, *args, **kwargs):
    """AROUND hook for ``_validate_one_request(obj, input_ids)``: the table's per-request rules, then SGLang's checks.

    Raises:
        RequestRuleError: a field breaks its rule (bag active; ``request_rules``).
    """
    if current_config().active:
        check_request(obj, input_ids, limits_of(self))
    return original(self, obj, input_ids, *args, **kwargs)


def validate_whole_request(self, *args, **kwargs) -> None:
    """BEFORE hook for ``GenerateReqInput._handle_parallel_sampling()``: ``n``, batch lists, ``rid``, before SGLang.

    Raises:
        RequestRuleError: a rule broken (bag active; ``request_rules``).
    """
    if current_config().active:
        check_whole(self)


def verify_unsigned_seed(original, self, *args, **kwargs):
    """AROUND hook for ``SamplingParams.verify(self, vocab_size)``: same signature and return value.

    Args:
        original: SGLang's ``SamplingParams.verify``.
        self: the request's ``SamplingParams``; with the bag active its
            ``sampling_seed`` is checked and, for seeds >= 2**63, rewritten to
            the int64 with the same bits.
        *args, **kwargs: passed on to ``original`` (``vocab_size``).

    Raises:
        ValueError: as :func:`check_sampling_seed` (bag active), then
            whatever SGLang's own ``verify`` raises.
    """
    # The seed is rewritten in place: SamplingParams is a msgspec Struct with
    # fixed fields (no room for a "checked" mark), and this is what travels to
    # the scheduler. SGLang verifies each request once; a second verify of a
    # rewritten seed >= 2**63 would refuse it (loudly, never silently).
    seed = self.sampling_seed
    if seed is not None and current_config().active:
        self.sampling_seed = check_sampling_seed(seed)
    return original(self, *args, **kwargs)


def _seed_params(body: object) -> list[tuple[int | None, dict]]:
    """``(batch index or None, sampling_params object)`` for each object that carries a seed."""
    if not isinstance(body, dict):
        return []
    params = body.get("sampling_params")
    batch = isinstance(params, list)
    return [(i if batch else None, one) for i, one in enumerate(params if batch else [params])
            if isinstance(one, dict) and one.get("sampling_seed") is not None]


def bad_seed_problem(body: object) -> RequestRuleError | None:
    """The ``sampling_seed`` problem of a ``/generate`` JSON body, or None.

    Args:
        body: the parsed body (anything JSON decodes to); ``sampling_params``
            is one object or, for a batch, a list of objects. Other shapes
            have no seed problem here (the schema gate words those).

    Returns:
        :func:`check_sampling_seed`'s error for the first bad seed (its
        ``field`` prefixed with the request index in a batch); None when
        every seed is absent or in [0, 2**64).
    """
    for index, one in _seed_params(body):
        try:
            check_sampling_seed(one["sampling_seed"])
        except RequestRuleError as exc:
            if index is not None:
                exc.field = f"sampling_params[{index}]"
            return exc
    return None


def _without_bad_seeds(body: dict) -> dict:
    """A copy of ``body`` whose bad ``sampling_seed`` fields are dropped (nothing else changed)."""
    def fixed(one: dict) -> dict:
        try:
            check_sampling_seed(one["sampling_seed"])
            return one
        except ValueError:
            return {k: v for k, v in one.items() if k != "sampling_seed"}

    params = body["sampling_params"]
    if isinstance(params, list):
        params = [fixed(p) if isinstance(p, dict) and p.get("sampling_seed") is not None else p for p in params]
    else:
        params = fixed(params)
    return {**body, "sampling_params": params}


def name_bad_seed(original, body: object, *args, **kwargs) -> str | None:
    """AROUND hook for ``api_contract.generate_contract_error(body)``: same signature and return value.

    Args:
        original: SGLang's ``generate_contract_error``.
        body: the parsed ``/generate`` JSON body.
        *args, **kwargs: passed on to ``original``.

    Returns:
        SGLang's verdict (None: admitted). When SGLang refuses the body, the
        bag is active and the bad ``sampling_seed`` values are the whole
        reason (the body without them passes the gate), the refusal starts
        with the seed's message and keeps SGLang's text after it; a refusal
        for anything else is SGLang's as is. Never admits a body SGLang
        refuses, never refuses one it admits.
    """
    error = original(body, *args, **kwargs)
    if error is None or not current_config().active:
        return error
    problem = bad_seed_problem(body)
    if problem is None or original(_without_bad_seeds(body), *args, **kwargs) is not None:
        return error
    # The seed's words first, SGLang's after them, the stable code last (as in every request rule).
    suffix = f" (error code: {problem.code})"
    words = str(problem).removesuffix(suffix)
    where = f"{problem.field}: " if problem.field != "sampling_seed" else ""
    return f"{where}{words} (schema check: {error}){suffix}"
