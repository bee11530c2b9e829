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
- :func:`rms_norm`, :func:`fused_add_rms_norm`: batch-invariant RMSNorm and
  add + RMSNorm, one fused kernel each, pinned bit for bit to a torch reference.
- :func:`split_extend`, :func:`split_decode`, :func:`split_tree_verify`:
  positional-split attention, a row's keys cut at the same key positions in
  prefill, verify and decode, so each row gets the same bits in every mode.

Every op takes ``kernel="auto" | "torch" | "triton"`` and reads no plugin state.

Why the torch ops are imported on first use rather than at the top: Python
runs this file before any submodule, and torch-free code imports submodules
of this package: the config and the CLI (``kernel_choice``), the request
seeds (``murmur``, ``streams``) and the seed encoding (``streams``). A torch
import here would load torch on every one of those paths, and the ``detspec
audit --url`` client, its argument errors and the seed modules are kept
torch-free (their tests check it). So the torch-free names are plain imports,
and each torch op is a plain ``from .x import y`` line too, in
:func:`_import_torch_ops`, which the first access to any of them runs. This
face is for users; the package's own modules import each op from the module
that defines it (``from ..ops.race import exponential_race``), so every
hook -> op edge is written out for readers and import-graph tools.
"""

from .kernel_choice import KERNELS
from .streams import Stream

__all__ = [
    "KERNELS",
    "Stream",
    "keyed_hash",
    "hash_uniform",
    "exponential_race",
    "race_keys",
    "coupled_children",
    "verify_chain",
    "coupled_verify_chain",
    "coupled_verify_tree",
    "id_ordered_filtered_probs",
    "target_weights",
    "rms_norm",
    "fused_add_rms_norm",
    "split_extend",
    "split_decode",
    "split_tree_verify",
]


def _import_torch_ops() -> None:
    """Bind every torch op of :data:`__all__` in this namespace (imports torch)."""
    # Declared global so the imports below bind module names, as top-level imports would.
    global coupled_verify_chain, coupled_verify_tree, hash_uniform, keyed_hash, race_keys, exponential_race
    global coupled_children, verify_chain, id_ordered_filtered_probs, target_weights
    global rms_norm, fused_add_rms_norm, split_extend, split_decode, split_tree_verify
    from .coupled import coupled_verify_chain, coupled_verify_tree
    from .hashing import hash_uniform, keyed_hash
    from .keys import race_keys
    from .race import exponential_race
    from .rmsnorm import fused_add_rms_norm, rms_norm
    from .split_attention import split_decode, split_extend, split_tree_verify
    from .tree_children import coupled_children
    from .verify import verify_chain
    from .weights import id_ordered_filtered_probs, target_weights


def __getattr__(name: str):
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    _import_torch_ops()
    return globals()[name]


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
