"""RMSNorm with the residual add: one fused batch-invariant kernel instead of SGLang's ten.

Hooked symbol:

- ``sglang.srt.layers.layernorm.RMSNorm.forward_cuda`` (AROUND): the
  method SGLang's op dispatch binds on CUDA, where it picks its
  deterministic path. Under the plugin's runs the residual form
  ``norm(x, residual)`` returns :func:`ops.rmsnorm.fused_add_rms_norm`; the
  plain form ``norm(x)`` and everything else run SGLang's ``forward_cuda``.

Why, from SGLang 0.5.23's code (``srt/layers/layernorm.py``,
``srt/batch_invariant_ops/batch_invariant_ops.py``): under
``--enable-deterministic-inference`` both forms are already batch-invariant
and the same in every forward mode (prefill, decode, verify, CUDA graph or
eager), so the plugin needs no norm of its own for any bitwise promise
(``docs/forward_modes.md``). The reason to replace anything is speed:

- ``norm(x, residual)``, which every Llama and Qwen decoder layer and the
  EAGLE / EAGLE3 draft layers run twice per layer (``hidden, residual =
  norm(hidden, residual)``), goes to ``forward_native``: a float32 cast,
  add, cast back, ``pow``, the batch-invariant ``mean`` kernel, ``rsqrt``,
  two multiplies and a cast, about ten kernels per norm. The plugin's kernel
  does the add, the norm and both stores in one pass with the same semantics
  (the float32 sum is normalised and returned rounded to x's dtype as the
  new residual; nothing in place, as ``forward_native``), and row i's bits
  depend on row i only.
- ``norm(x)`` (the first layer's input norm, Qwen3's per-head q / k norms
  with M = tokens x heads, the draft models' plain norms) goes to
  ``rms_norm_batch_invariant``: one Triton program per row, a fixed
  1024-column loop set by the hidden size alone, so a row's bits never
  depend on M or on the other rows. It is one kernel already, and the
  plugin's plain kernel was measured slower than it at large M (results:
  ``docs/benchmarks/determinism_tax/2026-12-02-h200-plugin-gemm/rmsnorm.md``),
  so it is not replaced. A switch by M is ruled out: two kernels round
  differently, and a row's bits would then depend on the batch size.

The two forms never meet at one call site: whether a layer passes a
residual is fixed by its place in the model (the first layer's input norm
has none), not by the batch or the forward mode, so each norm call keeps one
kernel in every mode.

Kept on SGLang's path (its own batch-invariant code, unchanged): the plain
form; layers with ``var_hidden_size``, ``cast_x_before_out_mul``,
``override_orig_dtype`` or ``fp32_residual`` (the RL on-policy variants,
which the plugin refuses anyway), a ``post_residual_addition``, a subclass
with its own ``forward_native``, empty batches, and inputs whose dtype,
shape, device or weight the op does not take. ``GemmaRMSNorm`` (``1 +
weight``) is a different class and not hooked; no Llama, Qwen, EAGLE or
EAGLE3 model uses it. Under ``--enable-torch-compile`` SGLang swaps its
layers to ``forward_native`` for compilation, which this hook does not see.
"""

from __future__ import annotations

import functools

import torch

from ..config import current_config
from ..ops.rmsnorm import MAX_HIDDEN, NORM_DTYPES, fused_add_rms_norm

TARGET = "sglang.srt.layers.layernorm.RMSNorm.forward_cuda"


def batch_invariant_forward(original, layer, x, residual=None, post_residual_addition=None, quant_linear=None):
    """AROUND hook of ``RMSNorm.forward_cuda``: the fused add + norm kernel for ``norm(x, residual)`` in the plugin's runs.

    Only where the bag is active (deterministic inference on, plugin not
    disabled, nothing refused) and the call is the residual form of the
    plain layer (:func:`takes`); otherwise, the plain form ``norm(x)``
    included, SGLang's ``forward_cuda`` runs as called. ``quant_linear`` is
    ignored as SGLang's deterministic branch ignores it (the output stays in
    x's dtype).

    Returns:
        ``(out, residual_out)``: new tensors of x's shape and dtype (or
        whatever SGLang's ``forward_cuda`` returns where it runs).
    """
    bag = current_config()
    if not (bag.active and takes(layer, x, residual, post_residual_addition)):
        return original(layer, x, residual, post_residual_addition, quant_linear)
    return fused_add_rms_norm(x, residual, layer.weight.data, layer.variance_epsilon, kernel=bag.kernel)


def takes(layer, x, residual, post_residual_addition) -> bool:
    """The call is ``norm(x, residual)`` that the plugin's op computes with SGLang's semantics (module docstring)."""
    if residual is None:  # the plain form: SGLang's one-kernel batch-invariant norm (module docstring)
        return False
    if (layer.variance_size_override is not None or layer.cast_x_before_out_mul
            or layer.override_orig_dtype is not None or post_residual_addition is not None):
        return False
    if not isinstance(x, torch.Tensor) or x.dtype not in NORM_DTYPES or x.dim() == 0 or x.numel() == 0:
        return False
    h = x.shape[-1]
    w = layer.weight
    if not (h == layer.hidden_size <= MAX_HIDDEN and w.shape == (h,) and w.dtype in NORM_DTYPES
            and w.device == x.device):
        return False
    return (not layer.fp32_residual and type(layer).forward_native is _base_forward_native()
            and isinstance(residual, torch.Tensor) and residual.shape == x.shape and residual.dtype == x.dtype
            and residual.device == x.device)


@functools.cache
def _base_forward_native():
    """SGLang's ``RMSNorm.forward_native``, looked up once: :func:`takes` runs for every norm of every layer."""
    from sglang.srt.layers.layernorm import RMSNorm

    return RMSNorm.forward_native
