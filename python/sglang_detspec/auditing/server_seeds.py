"""Request-seed checks of a running SGLang server (docs/design.md §6).

A server with sglang-detspec active gives every sampled request a seed of
its own and reports it; these checks ask the server and judge only what it
answers:

1. ``unseeded``: k requests of one prompt without ``sampling_seed`` give k
   distinct outputs (stock SGLang under deterministic inference seeds them
   all alike, so they coincide).
2. ``n_distinct``: one request with seed s and ``n`` parallel samples gives
   n distinct completions.
3. ``n_replay``: the same request again gives the same n completions
   (token ids), in order.
4. ``sample0_is_seed``: sample 0 equals the ``n = 1`` output of seed s.
5. ``sample1_not_seed_plus_1``: sample 1 differs from the ``n = 1`` output of
   seed s + 1 (sample seeds are derived, not consecutive).
6. ``reported_seeds_replay``: every seed reported in
   ``meta_info["sampling_seed"]`` (by checks 1 and 2), sent back as the
   ``sampling_seed`` of an ``n = 1`` request, reproduces its token ids.

The outputs compared are token ids; whether their logprobs were bitwise equal
too is said in each check's detail, not judged (they may move with the batch
composition, as the changing-batch audit's notes say). Whether the reported
sample seeds equal
:func:`sglang_detspec.seeds.derive_sample_seed` is reported, not judged.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Sequence

from ..ops.streams import U64
from ..ops.seed_encoding import check_seed, sglang_seed
from .http_backend import HttpBackend, ServerResponseError, ServerResult, parse_result

DEFAULT_UNSEEDED_REQUESTS = 4
DEFAULT_PARALLEL_SAMPLES = 4


@dataclasses.dataclass(frozen=True)
class SeedCheck:
    """One check: its name, whether it held, and what was seen (one line)."""

    name: str
    passed: bool
    detail: str


@dataclasses.dataclass(frozen=True)
class SeedReport:
    """The request-seed checks of one server.

    Attributes:
        checks: in the order of the module docstring.
        seed: the request seed s of the ``n > 1`` checks.
        reported_seeds: every seed the server reported, in request order
            (None where it reported none).
        derived_seeds_match: whether the ``n > 1`` samples reported
            ``derive_sample_seed(s, j)``; None when that function is not
            available or a sample reported no seed.
    """

    checks: tuple[SeedCheck, ...]
    seed: int
    reported_seeds: tuple[int | None, ...]
    derived_seeds_match: bool | None

    @property
    def passed(self) -> bool:
        """Every check held."""
        return all(c.passed for c in self.checks)

    def to_json(self) -> dict:
        """A JSON-ready dict of the report."""
        return {
            "passed": self.passed,
            "seed": self.seed,
            "checks": [dataclasses.asdict(c) for c in self.checks],
            "reported_seeds": list(self.reported_seeds),
            "derived_seeds_match": self.derived_seeds_match,
        }


def _params(max_new_tokens: int, seed: int | None, n: int, encoding: str) -> dict:
    # The same no-op filters and fixed length as the changing-batch audit, so
    # the output depends on the prompt and the seed alone.
    params = {
        "max_new_tokens": max_new_tokens, "temperature": 1.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0,
        "ignore_eos": True,
    }
    if seed is not None:
        params["sampling_seed"] = sglang_seed(seed, encoding)
    if n > 1:
        params["n"] = n
    return params


def _ask(backend: HttpBackend, prompt: Sequence[int], max_new_tokens: int, seed: int | None, n: int = 1
         ) -> list[ServerResult]:
    """One ``/generate`` request (``n`` parallel samples); its ``n`` results in sample order."""
    payload = {
        "input_ids": list(prompt),
        "sampling_params": _params(max_new_tokens, seed, n, backend.seed_encoding),
        "return_logprob": True,
    }
    body = backend.post_generate(payload)
    items = [body] if n == 1 and isinstance(body, dict) else body
    if not isinstance(items, list) or len(items) != n:
        got = f"a list of {len(items)}" if isinstance(items, list) else type(items).__name__
        raise ServerResponseError(f"expected {n} result(s) from /generate with n = {n}, got {got}")
    return [parse_result(item, max_new_tokens, None) for item in items]


def _logprob_bits(result: ServerResult) -> tuple | None:
    """The IEEE-754 bits of the output logprobs: equal exactly when bitwise equal."""
    lp = result.output_logprobs
    return None if lp is None else tuple(None if x is None else struct.pack("<d", x) for x in lp)


def _compare(pairs: Sequence[tuple[ServerResult, ServerResult]]) -> tuple[int, str]:
    """How many pairs have equal token ids, and a note on their logprobs."""
    same = [(a, b) for a, b in pairs if a.output_ids == b.output_ids]
    with_lp = [(a, b) for a, b in same if a.output_logprobs is not None and b.output_logprobs is not None]
    bitwise = sum(_logprob_bits(a) == _logprob_bits(b) for a, b in with_lp)
    note = f" (logprobs bitwise equal in {bitwise} of {len(with_lp)})" if with_lp else ""
    return len(same), note


def _derived_match(seed: int, samples: Sequence[ServerResult]) -> bool | None:
    try:
        from ..seeds import derive_sample_seed
    except ImportError:
        return None
    if any(s.sampling_seed is None for s in samples):
        return None
    return all(s.sampling_seed == derive_sample_seed(seed, j) for j, s in enumerate(samples))


def run_seed_checks(
    backend: HttpBackend,
    prompt: Sequence[int],
    *,
    seed: int,
    max_new_tokens: int,
    num_unseeded: int = DEFAULT_UNSEEDED_REQUESTS,
    n: int = DEFAULT_PARALLEL_SAMPLES,
) -> SeedReport:
    """Run the request-seed checks of the module docstring against ``backend``'s server.

    Every request samples at temperature 1 with no top-k/top-p/min-p cut and
    ``ignore_eos``, so it has exactly ``max_new_tokens`` tokens. Requests go
    one at a time.

    Args:
        backend: the server (its ``seed_encoding`` says how seeds are sent).
        prompt: token ids, at least one, in the model's vocabulary.
        seed: s, in [0, 2**64).
        max_new_tokens: >= 1 (a few dozen make chance collisions negligible).
        num_unseeded: k >= 2.
        n: parallel samples, >= 2.

    Returns:
        A :class:`SeedReport`.

    Raises:
        ValueError: an argument outside the ranges above.
        HttpBackendError: the server could not be asked, refused a request,
            or answered something that is not SGLang's ``/generate`` output.
    """
    check_seed(seed, "seed")
    if not prompt:
        raise ValueError("prompt must hold at least one token id")
    for name, value, low in (("max_new_tokens", max_new_tokens, 1), ("num_unseeded", num_unseeded, 2), ("n", n, 2)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an int >= {low}, got {value!r}")

    unseeded = [_ask(backend, prompt, max_new_tokens, None)[0] for _ in range(num_unseeded)]
    samples = _ask(backend, prompt, max_new_tokens, seed, n)
    again = _ask(backend, prompt, max_new_tokens, seed, n)
    (single,) = _ask(backend, prompt, max_new_tokens, seed)
    (next_seed,) = _ask(backend, prompt, max_new_tokens, (seed + 1) % U64)

    checks = []
    distinct = len({r.output_ids for r in unseeded})
    checks.append(SeedCheck(
        "unseeded", distinct == num_unseeded,
        f"{num_unseeded} unseeded requests of one prompt gave {distinct} distinct output(s)",
    ))
    distinct = len({r.output_ids for r in samples})
    checks.append(SeedCheck(
        "n_distinct", distinct == n, f"n = {n} with sampling_seed {seed} gave {distinct} distinct completion(s)",
    ))
    same, note = _compare(list(zip(samples, again)))
    checks.append(SeedCheck(
        "n_replay", same == n, f"the same request again: {same} of {n} completions equal, in order{note}",
    ))
    checks.append(SeedCheck(
        "sample0_is_seed", samples[0].output_ids == single.output_ids,
        f"sample 0 {'equals' if samples[0].output_ids == single.output_ids else 'differs from'} "
        f"the n = 1 output of sampling_seed {seed}",
    ))
    checks.append(SeedCheck(
        "sample1_not_seed_plus_1", samples[1].output_ids != next_seed.output_ids,
        f"sample 1 {'differs from' if samples[1].output_ids != next_seed.output_ids else 'equals'} "
        f"the n = 1 output of sampling_seed {(seed + 1) % U64}",
    ))

    reported = unseeded + samples
    missing = sum(r.sampling_seed is None for r in reported)
    pairs = [(r, _ask(backend, prompt, max_new_tokens, r.sampling_seed)[0])
             for r in reported if r.sampling_seed is not None]
    replayed, note = _compare(pairs)
    detail = f"{replayed} of {len(reported)} reported seeds replayed their output{note}"
    if missing:
        detail += f"; {missing} response(s) reported no meta_info.sampling_seed"
    checks.append(SeedCheck("reported_seeds_replay", replayed == len(reported), detail))
    return SeedReport(
        checks=tuple(checks), seed=seed, reported_seeds=tuple(r.sampling_seed for r in reported),
        derived_seeds_match=_derived_match(seed, samples),
    )
