"""Hash-keyed randomness and seeded samplers (no SGLang import).

- :class:`Stream`: the keyed streams (DRAFT, ACCEPT, RESAMPLE, BONUS, TARGET, SAMPLE).
- :func:`keyed_hash`, :func:`hash_uniform`: the MurmurHash3 stream and its
  midpoint uniforms.
- :func:`exponential_race`: seeded categorical draw (Gumbel-max), top-k too.
- :func:`verify_chain`: seeded chain verification with rejection sampling.
- :func:`coupled_verify_chain`, :func:`coupled_verify_tree`: drafter-invariant
  verification (the committed tokens are the TARGET-stream races).

Every op takes ``kernel="auto" | "torch" | "triton"`` and reads no plugin state.
"""

from .coupled import coupled_verify_chain, coupled_verify_tree
from .hashing import hash_uniform, keyed_hash
from .kernel_choice import KERNELS
from .sampling import exponential_race, verify_chain
from .streams import Stream

__all__ = [
    "KERNELS",
    "Stream",
    "keyed_hash",
    "hash_uniform",
    "exponential_race",
    "verify_chain",
    "coupled_verify_chain",
    "coupled_verify_tree",
]
