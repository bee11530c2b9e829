"""Verify results in SGLang's sampler layout: the scatter every verify sampler ends with.

SGLang's verify samplers write ``predicts`` (one token per tree node's flat
slot), ``accept_index`` (the accepted nodes' slots) and ``accept_token_num``
in place; the plugin's coupled and rejection verifies produce per-path
results, which :func:`write_verify_outputs` scatters into those buffers
without a host sync. The coupled verify kernels write the same buffers from
inside their walk when handed a :class:`VerifyOutputs` (no scatter launched
after them); this scatter is their torch reference and the rejection path's
writer.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .choices import one_of

# The index dtypes SGLang's verify buffers come in.
OUT_DTYPES = (torch.int32, torch.int64)


class VerifyOutputs(NamedTuple):
    """SGLang's verify-sampler buffers, written in place (the layout of ``write_verify_outputs``).

    Attributes:
        retrive_index: int [B, N]: flat slot of each tree node (chain: each
            candidate), distinct.
        predicts: int32 [B*N]: one token per flat slot.
        accept_index: int32 [B, D]: accepted nodes' slots, -1 padded; D may
            be smaller than N (SGLang sizes it to the deepest path).
        accept_token_num: int32 [B]: accepted draft nodes.
    """

    retrive_index: torch.Tensor
    predicts: torch.Tensor
    accept_index: torch.Tensor
    accept_token_num: torch.Tensor


def check_verify_outputs(out: VerifyOutputs, b: int, n: int, device: torch.device) -> None:
    """Shape, dtype and device checks of ``out`` for a batch of ``b`` trees of ``n`` nodes (no host sync).

    Raises:
        ValueError: ``out`` is not a :class:`VerifyOutputs`; a buffer is not an
            integer tensor on ``device``; ``retrive_index`` is not [b, n],
            ``predicts`` has fewer than b * n entries or is not 1-D,
            ``accept_index`` is not 2-D [b, D >= 1], ``accept_token_num`` is not [b];
            ``predicts``, ``accept_index`` or ``accept_token_num`` without a
            unit stride in its last dimension (the kernel writes them so; SGLang
            allocates them contiguous).
    """
    if not isinstance(out, VerifyOutputs):
        raise ValueError(f"out must be a VerifyOutputs, got {type(out).__name__}")
    for name, t in out._asdict().items():
        if not isinstance(t, torch.Tensor) or t.dtype not in OUT_DTYPES:
            got = t.dtype if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"out.{name} must be an {one_of(OUT_DTYPES)} tensor, got {got}")
        if t.device != device:
            raise ValueError(f"out.{name} is on {t.device} but the verify inputs are on {device}")
    if tuple(out.retrive_index.shape) != (b, n):
        raise ValueError(f"out.retrive_index must be [B, N] = {(b, n)}, got {tuple(out.retrive_index.shape)}")
    if out.predicts.dim() != 1 or out.predicts.shape[0] < b * n:
        raise ValueError(f"out.predicts must be 1-D with at least B*N = {b * n} entries, "
                         f"got {tuple(out.predicts.shape)}")
    if out.accept_index.dim() != 2 or out.accept_index.shape[0] != b or out.accept_index.shape[1] < 1:
        raise ValueError(f"out.accept_index must be [B, D] with B = {b} and D >= 1, got {tuple(out.accept_index.shape)}")
    if tuple(out.accept_token_num.shape) != (b,):
        raise ValueError(f"out.accept_token_num must be [B] = {(b,)}, got {tuple(out.accept_token_num.shape)}")
    for name in ("predicts", "accept_index", "accept_token_num"):
        t = getattr(out, name)
        if t.shape[-1] > 1 and t.stride(-1) != 1:
            raise ValueError(f"out.{name} must have unit stride in its last dimension, got stride {t.stride(-1)}")


def write_verify_outputs(
    tokens: torch.Tensor,  # [B, W] int64: token committed after path[b, j], -1 padded
    accepted: torch.Tensor,  # [B] int64: accepted draft nodes n
    path: torch.Tensor,  # [B, W] int64: accepted nodes, path[b, 0] = 0 (root), -1 padded
    retrive_index: torch.Tensor,  # [B, N] int: flat slot of each node, distinct
    predicts: torch.Tensor,  # [B*N] int32 out, indexed by flat slot
    accept_index: torch.Tensor,  # [B, D] int32 out, -1 padded
    accept_token_num: torch.Tensor,  # [B] int32 out
) -> None:
    """Write verify results in SGLang's sampler layout, without a host sync.

    For ``j <= accepted[b]``: ``predicts[retrive_index[b, path[b, j]]] =
    tokens[b, j]`` and ``accept_index[b, j] = retrive_index[b, path[b, j]]``
    (columns beyond ``D`` are not written: SGLang sizes ``D`` to the deepest
    path); ``accept_token_num[b] = accepted[b]``. Other entries keep their values.
    """
    b, w = tokens.shape
    n_nodes = retrive_index.shape[1]
    keep = torch.arange(w, device=tokens.device).unsqueeze(0) <= accepted.unsqueeze(1)  # [B, W]
    node = path.clamp(min=0).to(torch.int64)
    # Per node: the token committed after it, if it is on the path. Padded path
    # entries go to a spare column so no two writes hit the same kept node.
    per_node = torch.zeros(b, n_nodes + 1, dtype=torch.int64, device=tokens.device)
    on_path = torch.zeros(b, n_nodes + 1, dtype=torch.bool, device=tokens.device)
    target_col = torch.where(keep, node, torch.full_like(node, n_nodes))
    per_node.scatter_(1, target_col, tokens.to(torch.int64))
    on_path.scatter_(1, target_col, keep)
    flat = retrive_index.reshape(-1).to(torch.int64)
    current = predicts.gather(0, flat).view(b, n_nodes)
    new = torch.where(on_path[:, :n_nodes], per_node[:, :n_nodes].to(predicts.dtype), current)
    predicts.scatter_(0, flat, new.reshape(-1))
    cols = min(w, accept_index.shape[1])
    slots = retrive_index.to(torch.int64).gather(1, node[:, :cols])
    accept_index[:, :cols] = torch.where(keep[:, :cols], slots.to(accept_index.dtype), accept_index[:, :cols])
    accept_token_num.copy_(accepted.to(accept_token_num.dtype))
