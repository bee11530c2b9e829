"""Coupled verify on SGLang's verify layout, and the writer of SGLang's verify outputs.

Coupled verification (DESIGN section 5): at each accepted node the target
token of the next position is ``y = race(w, TARGET, t)``; a child whose token
equals ``y`` is accepted, else ``y`` is emitted and the walk stops. The
weights ``w`` are computed here from the target logits exactly as the
non-speculative sampler computes them (:func:`target_weights`), not taken
from SGLang's verify softmax and renormalisation, so every emitted token is
bitwise the token a server without speculative decoding samples.

Positions: SGLang's verify batch keeps ``seq_lens`` at the committed KV
prefix; the tree root (the last committed token) sits at ``seq_lens`` and
node ``i`` at ``seq_lens + depth(i)``, so the token after node ``i`` is at
``seq_lens + 1 + depth(i)``; ``coupled_verify_tree`` takes
``positions = seq_lens + 1`` and adds the depth.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..ops import coupled_verify_chain, coupled_verify_tree, target_weights


class VerifyContext(NamedTuple):
    """What one ``eagle_sample`` call publishes for the sampler it calls.

    Attributes:
        seeds: int64 [B] request seeds (uint64 bits).
        positions: int [B] absolute position of the token after the root (``seq_lens + 1``).
        logits_output: SGLang's ``LogitsProcessorOutput``; its ``next_token_logits``
            [B*N, V] carry the penalties, logit bias and grammar mask eagle_sample
            applied in place before it calls the sampler.
        sampling_info: SGLang's ``SamplingBatchInfo`` (temperatures [B, 1], top_ks,
            top_ps, min_ps [B], the ``need_*`` flags).
    """

    seeds: torch.Tensor
    positions: torch.Tensor
    logits_output: object
    sampling_info: object


def verify_weights(ctx: VerifyContext, width: int) -> torch.Tensor:
    """Target weights of every verify row: float [B, width, V].

    Row ``(b, i)`` is the distribution of the token after node ``i`` of request
    ``b``: the request's temperature and top-k / top-p / min-p, repeated over
    its ``width`` nodes, applied as the non-speculative sampler applies them.
    """
    info = ctx.sampling_info
    logits = ctx.logits_output.next_token_logits  # [B*width, V]
    rows = logits.shape[0]

    def per_row(values):  # [B] or [B, 1] -> [B*width] / [B*width, 1]
        return torch.repeat_interleave(values, width, dim=0)

    cut = info.need_top_k_sampling or info.need_top_p_sampling or info.need_min_p_sampling
    weights = target_weights(
        logits,
        per_row(info.temperatures),
        per_row(info.top_ks) if cut else None,
        per_row(info.top_ps) if cut else None,
        per_row(info.min_ps) if cut and info.need_min_p_sampling else None,
    )
    return weights.view(rows // width, width, -1)


def coupled_tree_outputs(
    ctx: VerifyContext,
    candidates: torch.Tensor,  # [B, N] int: node tokens, node 0 = root
    retrive_next_token: torch.Tensor,  # [B, N] int: first child or -1
    retrive_next_sibling: torch.Tensor,  # [B, N] int: next sibling or -1
    kernel: str,
):
    """Coupled tree verify of one batch: ``(tokens int64 [B, N], accepted int64 [B], path int64 [B, N])``.

    See ``ops.coupled_verify_tree`` for the outputs; a chain is the tree whose
    ``next_token[i] = i + 1``.
    """
    weights = verify_weights(ctx, candidates.shape[1])
    return coupled_verify_tree(
        candidates, retrive_next_token, retrive_next_sibling, weights, ctx.seeds, ctx.positions,
        check=False, kernel=kernel,
    )


def coupled_chain_outputs(ctx: VerifyContext, candidates: torch.Tensor, kernel: str):
    """Coupled chain verify: ``(tokens int64 [B, W], accepted int64 [B], path int64 [B, W])``.

    ``candidates`` [B, W]: the root then ``W - 1`` draft tokens; ``path`` is ``arange(W)``.
    """
    b, w = candidates.shape
    weights = verify_weights(ctx, w)
    tokens, accepted = coupled_verify_chain(
        candidates[:, 1:], weights, ctx.seeds, ctx.positions, check=False, kernel=kernel,
    )
    path = torch.arange(w, device=candidates.device).expand(b, w)
    return tokens, accepted, path


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
