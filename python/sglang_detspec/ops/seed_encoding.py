"""The request seed: one range check and its two 64-bit encodings (pure Python, no torch).

A request seed is an unsigned 64-bit integer, [0, 2**64) (docs/design.md §1):
every keyed stream hashes it. SGLang carries ``sampling_seed`` in an int64
tensor and stock SGLang admits only [-2**63, 2**63), so a seed travels as
the int64 with the same 64 bits (two's complement) wherever an int64 holds
it. :func:`check_seed` is the one range check; :func:`to_int64` and
:func:`from_int64` are the one mapping between the two forms.
"""

from __future__ import annotations

from .streams import U64
from .choices import one_of

# The seed bound as every seed-range message writes it: this check's, the ops'
# and the CLI's in the half-open form; the HTTP request hook's in the closed
# form, which JSON clients read without knowing the interval notation, and
# which the audit client matches to recognise a detspec server's refusal.
SEED_RANGE = "[0, 2**64)"
HTTP_SEED_RANGE = "[0, 2**64 - 1]"

I64_MIN = -(1 << 63)
I64_MAX = (1 << 63) - 1

SEED_ENCODINGS = ("uint64", "int64")


def check_seed(value: object, name: str = "seed") -> int:
    """``value`` if it is a request seed: an int (not a bool) in [0, 2**64).

    Args:
        value: the candidate seed.
        name: the argument name the error message uses.

    Returns:
        ``value`` unchanged.

    Raises:
        ValueError: ``value`` is a bool, not an int, or outside [0, 2**64);
            the message names ``name`` and the bound.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an int in {SEED_RANGE}, got {type(value).__name__} {value!r}")
    if not 0 <= value < U64:
        raise ValueError(f"{name} must be an int in {SEED_RANGE}, got {value}")
    return value


def to_int64(seed: int, name: str = "seed") -> int:
    """The int64 with the same 64 bits as request seed ``seed`` (seeds >= 2**63 become negative).

    Raises:
        ValueError: as :func:`check_seed`.
    """
    check_seed(seed, name)
    return seed - U64 if seed > I64_MAX else seed


def from_int64(value: int, name: str = "seed") -> int:
    """The request seed whose 64 bits the int64 ``value`` holds: the inverse of :func:`to_int64`.

    Raises:
        ValueError: ``value`` is a bool, not an int, or outside [-2**63, 2**63).
    """
    if isinstance(value, bool) or not isinstance(value, int) or not I64_MIN <= value <= I64_MAX:
        raise ValueError(f"{name} must be an int in [-2**63, 2**63), got {value!r}")
    return value % U64


def sglang_seed(seed: int, encoding: str = "uint64") -> int:
    """The ``sampling_seed`` to send an SGLang server for request seed ``seed``.

    ``"uint64"`` sends the seed as is: a server with sglang-detspec active
    admits exactly [0, 2**64). ``"int64"`` sends :func:`to_int64` of it, the
    only form stock SGLang admits; its seeded samplers read the same bits.
    Both key the server's draws with exactly ``seed``.

    Raises:
        ValueError: ``seed`` outside [0, 2**64), or an ``encoding`` not in
            :data:`SEED_ENCODINGS`.
    """
    if encoding not in SEED_ENCODINGS:
        raise ValueError(f"encoding must be one of {one_of(SEED_ENCODINGS)}, got {encoding!r}")
    return to_int64(seed) if encoding == "int64" else check_seed(seed)
