"""RMSNorm: one fused batch-invariant kernel per norm, plain and with the residual add.

Hooked symbol:

- ``sglang.srt.layers.layernorm.RMSNorm.forward_cuda`` (AROUND): the
  method SGLang's op dispatch binds on CUDA, where it picks its
  deterministic path. Under the plugin's runs the plain form
  ``norm(x)`` returns :func:`ops.rmsnorm.rms_norm` and the residual form
  ``norm(x, residual)`` returns :func:`ops.rmsnorm.fused_add_rms_norm`.

Why: with ``--enable-deterministic-inference`` SGLang 0.5.23's
``forward_cuda`` sends the plain form to ``rms_norm_batch_invariant`` (one
Triton kernel, one program per row) but the residual form, which every Llama
and Qwen decoder layer and the EAGLE / EAGLE3 draft layers run twice per
layer (``hidden, residual = norm(hidden, residual)``), to ``forward_native``:
a float32 cast, add, cast back, ``pow``, the batch-invariant ``mean`` kernel,
``rsqrt``, two multiplies and a cast, about ten kernels per norm. The
plugin's kernel does the add, the norm and both stores in one pass with the
same semantics (the float32 sum is normalised and returned rounded to x's
dtype as the new residual; nothing in place, as ``forward_native``), and row
i's bits depend on row i only.

Kept on SGLang's path (its own batch-invariant code, unchanged): layers with
``var_hidden_size``, ``cast_x_before_out_mul``, ``override_orig_dtype`` or
``fp32_residual`` (the RL on-policy variants, which the plugin refuses
anyway), a ``post_residual_addition``, a subclass with its own
``forward_native``, empty batches, and inputs whose dtype, shape, device or
weight the op does not take. ``GemmaRMSNorm`` (``1 + weight``) is a
different class and not hooked; no Llama, Qwen, EAGLE or EAGLE3 model uses
it. Under ``--enable-torch-compile`` SGLang swaps its layers to
``forward_native`` for compilation, which this hook does not see.
"""

from __future__ import annotations

import functools

import torch

from ..config import current_config
from ..ops.rmsnorm import MAX_HIDDEN, NORM_DTYPES, fused_add_rms_norm, rms_norm

TARGET = "sglang.srt.layers.layernorm.RMSNorm.forward_cuda"


def batch_invariant_forward(original, layer, x, residual=None, post_residual_addition=None, quant_linear=None):
    """AROUND hook of ``RMSNorm.forward_cuda``: the plugin's fused kernel where the run is the plugin's.

    Only where the bag is active (deterministic inference on, plugin not
    disabled, nothing refused) and the layer and inputs are the plain
    variant (:func:`takes`); otherwise SGLang's ``forward_cuda`` runs as
    called. ``quant_linear`` is ignored as SGLang's deterministic branch
    ignores it (the output stays in x's dtype).

    Returns:
        ``out`` for ``norm(x)``, ``(out, residual_out)`` for ``norm(x, residual)``:
        new tensors of x's shape and dtype.
    """
    bag = current_config()
    if not (bag.active and takes(layer, x, residual, post_residual_addition)):
        return original(layer, x, residual, post_residual_addition, quant_linear)
    eps = layer.variance_epsilon
    if residual is None:
        return rms_norm(x, layer.weight.data, eps, kernel=bag.kernel)
    return fused_add_rms_norm(x, residual, layer.weight.data, eps, kernel=bag.kernel)


def takes(layer, x, residual, post_residual_addition) -> bool:
    """The call is one the plugin's op computes with SGLang's semantics (the module docstring lists the rest)."""
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
    if residual is None:
        return True
    return (not layer.fp32_residual and type(layer).forward_native is _base_forward_native()
            and isinstance(residual, torch.Tensor) and residual.shape == x.shape and residual.dtype == x.dtype
            and residual.device == x.device)


@functools.cache
def _base_forward_native():
    """SGLang's ``RMSNorm.forward_native``, looked up once: :func:`takes` runs for every norm of every layer."""
    from sglang.srt.layers.layernorm import RMSNorm

    return RMSNorm.forward_native
