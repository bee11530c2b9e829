"""Hash-keyed randomness and seeded samplers (no SGLang import).

- :class:`Stream`: the four keyed streams (DRAFT, ACCEPT, RESAMPLE, BONUS).
- :func:`keyed_hash`, :func:`hash_uniform`: the MurmurHash3 stream and its
  midpoint uniforms.
- :func:`exponential_race`: seeded categorical draw (Gumbel-max), top-k too.
- :func:`verify_chain`: seeded chain verification with rejection sampling.
"""

from .hashing import hash_uniform, keyed_hash
from .sampling import exponential_race, verify_chain
from .streams import Stream

__all__ = ["Stream", "keyed_hash", "hash_uniform", "exponential_race", "verify_chain"]
