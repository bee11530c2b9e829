"""The keyed random streams and how a request seed becomes a hash key.

Domain separation: each use of randomness (draft proposal, accept coin,
residual resample, bonus token, target token, parallel-sample seeds) hashes
under its own 64-bit salt, so no two uses ever read the same uniform for a
request.

The salts and the word bounds and masks are written only here. Pure Python,
no torch: the request-seed derivation (``seeds.py``) and the config's
torch-free paths read them too.
"""

from __future__ import annotations

import enum
from .choices import one_of

U32 = 1 << 32  # hash words (position, column, the hash itself) are uint32
U64 = 1 << 64  # seeds, salts and keys are uint64
MASK32 = U32 - 1


class Stream(enum.Enum):
    """A keyed random stream: ``value`` is its 64-bit salt.

    The hash key of a request in a stream is ``(sampling_seed + salt) mod 2**64``.

    - ``DRAFT``: draft proposal at draft step / MTP layer ``draft_step``;
      column ``draft_step * V + token_id``. Same salt and layout as SGLang
      0.5.23's seeded sampler, so our draft proposals equal SGLang's.
    - ``ACCEPT``: accept coin of the draft token at a position; column 0.
    - ``RESAMPLE``: draw from the residual distribution after a rejection;
      column ``token_id``.
    - ``BONUS``: bonus token after every draft token was accepted; column
      ``token_id``.
    - ``TARGET``: the target token at an absolute position: prefill's first
      token, plain decode and all of coupled verification (and coupled draft
      proposals, which race q on the same uniforms); column ``token_id``.
    - ``SAMPLE``: deriving the seeds of parallel samples (``n > 1``); columns
      0 and 1 give the low and high words of the derived seed.
    """

    DRAFT = 0x44524146545F0000
    ACCEPT = 0x4143434550540000
    RESAMPLE = 0x524553414D500000
    BONUS = 0x424F4E5553000000
    TARGET = 0x5441524745540000
    SAMPLE = 0x53414D504C450000

    @property
    def salt(self) -> int:
        """The stream's 64-bit salt."""
        return self.value

    @classmethod
    def parse(cls, stream: "Stream | str") -> "Stream":
        """Accept a ``Stream`` or its name (case-insensitive).

        Raises:
            ValueError: ``stream`` names no stream.
        """
        if isinstance(stream, cls):
            return stream
        if isinstance(stream, str) and stream.upper() in cls.__members__:
            return cls[stream.upper()]
        raise ValueError(
            f"stream must be one of {one_of(s.name for s in cls)}, got {stream!r}"
        )


def salt_value(salt: int | Stream) -> int:
    """The 64-bit salt of ``salt``: a :class:`Stream`'s, or ``salt`` itself.

    Raises:
        ValueError: ``salt`` is neither a :class:`Stream` nor an int in [0, 2**64).
    """
    if isinstance(salt, Stream):
        return salt.salt
    if isinstance(salt, bool) or not isinstance(salt, int) or not 0 <= salt < U64:
        raise ValueError(f"salt must be a Stream or an int in [0, 2**64), got {salt!r}")
    return salt


def salt_words(salt: int) -> tuple[int, int]:
    """``(lo32, hi32)`` of a 64-bit salt, the form the Triton kernels take it in."""
    return salt & MASK32, salt >> 32
