"""Verify results in SGLang's sampler layout: the scatter every verify sampler ends with.

SGLang's verify samplers write ``predicts`` (one token per tree node's flat
slot), ``accept_index`` (the accepted nodes' slots) and ``accept_token_num``
in place; the plugin's coupled and rejection verifies produce per-path
results, which this op scatters into those buffers without a host sync.
"""

from __future__ import annotations

import torch


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
