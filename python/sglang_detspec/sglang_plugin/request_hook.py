"""Request validation: ``sampling_seed`` is an unsigned 64-bit integer.

Hooked symbols (both AROUND, both in the HTTP server's process):

- ``sglang.srt.sampling.sampling_params.SamplingParams.verify``: SGLang
  0.5.23 calls it once per request in the tokenizer manager and turns its
  ``ValueError`` into an HTTP 400 whose message is the error text.
- ``sglang.srt.entrypoints.api_contract.generate_contract_error``: the JSON
  schema gate of ``/generate`` (HTTP 400). It
  checks the type only: it refuses a seed that is not an integer (a float, a
  string, a bool) before ``verify`` runs, in words that name neither the
  field nor, for integers beyond 64 bits, the value sent (SGLang parses
  bodies with orjson, which turns those into floats: 2**64 is reported as
  "floating point `1.8446744073709552e+19`, expected i64"); the hook puts the
  ``sampling_seed`` message in front.

Scope: requests that reach ``verify`` through the tokenizer manager of the
HTTP server's main process: native ``/generate`` (single, batched, ``n > 1``),
the OpenAI-compatible endpoints (whose pydantic models turn ``"7"``, ``true``
and ``5.0`` into integers before this check sees them) and the offline
``Engine``. Tokenizer worker processes (``--tokenizer-worker-num > 1``) load
no plugins, so ``seed_hook`` refuses that flag at start-up while the bag is
active. SGLang's Rust HTTP server bypasses this code: there SGLang's own
check applies.

Why: every detspec stream is keyed by a seed in [0, 2**64) (docs/design.md
§1). SGLang itself admits ``sampling_seed`` in [-2**63, 2**63) and keeps it
in an int64 tensor, so on its own a negative seed is silently read as the
uint64 with the same bits and seeds in [2**63, 2**64) cannot be sent at all.
While the bag is active this hook:

- refuses a seed that is a bool, not an int, negative, or >= 2**64, with a
  message naming ``sampling_seed`` and the bound;
- stores a seed in [2**63, 2**64) as the int64 with the same 64 bits, which
  is how SGLang's seed tensor carries it to the samplers (they read the bits
  as unsigned), then lets SGLang's own checks run.

With the bag inactive SGLang's validation runs untouched.
"""

from __future__ import annotations

from ..config import current_config
from ..ops.seed_encoding import HTTP_SEED_RANGE, to_int64
from .request_rules import RequestRuleError

TARGET = "sglang.srt.sampling.sampling_params.SamplingParams.verify"
# Stable codes of the seed refusals (the message ends with "(error code: ...)", as every request rule's).
SEED_RANGE_CODE = "sampling_seed_out_of_range"
SEED_TYPE_CODE = "sampling_seed_not_integer"
CONTRACT_TARGET = "sglang.srt.entrypoints.api_contract.generate_contract_error"



def check_sampling_seed(seed: object) -> int:
    """The int64 that carries request seed ``seed`` through SGLang.

    Args:
        seed: the request's ``sampling_seed`` as parsed from JSON.

    Returns:
        ``seed`` for seeds in [0, 2**63); ``seed - 2**64`` (same 64 bits,
        two's complement) for seeds in [2**63, 2**64).

    Raises:
        ValueError: ``seed`` is a bool or not an int, or lies outside
            [0, 2**64 - 1]; the message names ``sampling_seed`` and the bound.
    """
    if isinstance(seed, float) and (seed >= 2.0**64 or seed <= -(2.0**63)):
        # SGLang parses request bodies with orjson, which turns JSON integers outside
        # [-2**63, 2**64) into floats: this was most likely an integer out of range.
        raise RequestRuleError(
            SEED_RANGE_CODE, "sampling_seed",
            f"sampling_seed must be in {HTTP_SEED_RANGE} (sglang-detspec keys its random streams by an "
            f"unsigned 64-bit seed), got {seed!r} (beyond 64-bit integers: SGLang's JSON parser reads "
            "such integers as floats)"
        )
    try:
        return to_int64(seed, "sampling_seed")  # the int64 with the same 64 bits
    except ValueError:
        # The rule is check_seed's; an HTTP client gets it worded for the request field.
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise RequestRuleError(
                SEED_TYPE_CODE, "sampling_seed",
                f"sampling_seed must be an integer in {HTTP_SEED_RANGE}, got {type(seed).__name__} {seed!r}"
            ) from None
        raise RequestRuleError(
            SEED_RANGE_CODE, "sampling_seed",
            f"sampling_seed must be in {HTTP_SEED_RANGE} (sglang-detspec keys its random streams by an "
            f"unsigned 64-bit seed), got {seed}"
        ) from None


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
