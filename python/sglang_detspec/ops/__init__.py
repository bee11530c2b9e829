"""Hash-keyed randomness and seeded samplers (no SGLang import).

- :class:`Stream`: the keyed streams (DRAFT, ACCEPT, RESAMPLE, BONUS, TARGET, SAMPLE).
- :func:`keyed_hash`, :func:`hash_uniform`: the MurmurHash3 stream and its
  midpoint uniforms.
- :func:`exponential_race`: seeded categorical draw (Gumbel-max), top-k too;
  :func:`race_keys`: the scores it compares, for given tokens;
  :func:`coupled_children`: a coupled tree node's children and their scores.
- :func:`verify_chain`: seeded chain verification with rejection sampling.
- :func:`coupled_verify_chain`, :func:`coupled_verify_tree`: drafter-invariant
  verification (the committed tokens are the TARGET-stream races).
- :func:`target_weights`, :func:`id_ordered_filtered_probs`: the weights a
  TARGET race runs over (temperature, then top-k / top-p / min-p by token id).

Every op takes ``kernel="auto" | "torch" | "triton"`` and reads no plugin state.
"""

import importlib

# Name -> submodule, imported on first use: the config takes KERNELS from
# .kernel_choice on torch-free paths, and importing this package must not pull
# torch in for them.
_EXPORTS = {
    "KERNELS": ".kernel_choice",
    "Stream": ".streams",
    "keyed_hash": ".hashing",
    "hash_uniform": ".hashing",
    "exponential_race": ".sampling",
    "race_keys": ".keys",
    "coupled_children": ".tree_children",
    "verify_chain": ".sampling",
    "coupled_verify_chain": ".coupled",
    "coupled_verify_tree": ".coupled",
    "id_ordered_filtered_probs": ".weights",
    "target_weights": ".weights",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
