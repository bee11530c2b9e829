"""Request validation: ``sampling_seed`` is an unsigned 64-bit integer.

Hooked symbol: ``sglang.srt.sampling.sampling_params.SamplingParams.verify``
(AROUND). SGLang 0.5.23 calls it once per request in the tokenizer manager
(``srt/managers/tokenizer_manager.py:1567``), in the HTTP server's process,
and turns its ``ValueError`` into an HTTP 400 whose message is the error text.

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

from ..ops.streams import U64
from .resolve import active_config

TARGET = "sglang.srt.sampling.sampling_params.SamplingParams.verify"

_I64_MAX = (1 << 63) - 1


def check_sampling_seed(seed) -> int:
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
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(
            f"sampling_seed must be an integer in [0, 2**64 - 1], got {type(seed).__name__} {seed!r}"
        )
    if not 0 <= seed < U64:
        raise ValueError(
            f"sampling_seed must be in [0, 2**64 - 1] (sglang-detspec keys its random streams by an "
            f"unsigned 64-bit seed), got {seed}"
        )
    return seed - U64 if seed > _I64_MAX else seed


def verify_unsigned_seed(original, self, *args, **kwargs):
    """AROUND hook for ``SamplingParams.verify(self, vocab_size)``: same signature and return value.

    Raises:
        ValueError: as :func:`check_sampling_seed` (bag active), then
            whatever SGLang's own ``verify`` raises.
    """
    # The seed is rewritten in place: SamplingParams is a msgspec Struct with
    # fixed fields (no room for a "checked" mark), and this is what travels to
    # the scheduler. SGLang verifies each request once; a second verify of a
    # rewritten seed >= 2**63 would refuse it (loudly, never silently).
    seed = self.sampling_seed
    if seed is not None and active_config().active:
        self.sampling_seed = check_sampling_seed(seed)
    return original(self, *args, **kwargs)
