"""Tree verify as decode queries: each tree node's key list, as one row of a decode page table.

The FA3 node path (``sglang_plugin/tree_attention_hook.py``) runs a tree
verify as ``bs * n`` one-token decode queries, node ``i`` of request ``b``
reading ``prefix(b) ++ ancestors(i)``. This op builds those rows from the two
tables SGLang's cascade metadata already holds; :func:`ancestor_layout`
builds the cascade's ancestor ("expand") layout where SGLang's backend cannot
run (tests, the benchmark). The Triton path is ``node_rows_triton``.
"""

from __future__ import annotations

import torch

from .kernel_choice import use_triton


def node_key_lists(
    prefix_table: torch.Tensor,  # [bs, W] int32: request b's cache slots, the first prefix_lens[b] valid
    prefix_lens: torch.Tensor,  # [bs] int: keys before the tree (the root's position)
    ancestor_table: torch.Tensor,  # [bs * n, n] int32: node r's ancestors' slots, root to node, first anc_lens[r] valid
    ancestor_lens: torch.Tensor,  # [bs * n] int: ancestors of node r, itself included
    n: int,
    out_table: torch.Tensor | None = None,  # [>= bs * n, >= W + n] int32, written in place
    out_lens: torch.Tensor | None = None,  # [>= bs * n] int32, written in place
    kernel: str = "auto",
):
    """Each tree node's key list, as one decode query's page-table row: ``(table, lens)``.

    Row ``r = b * n + i`` of ``table`` [bs * n, W + n] starts with
    ``prefix_table[b, :prefix_lens[b]]`` followed by
    ``ancestor_table[r, :ancestor_lens[r]]``; ``lens[r] = prefix_lens[b] +
    ancestor_lens[r]`` (int32). Entries past ``lens[r]`` are never read (FA3
    reads a row up to its length) and hold whatever they held. Static shapes,
    no host sync: runs as it is before a CUDA-graph replay. With ``out_*``
    the result is written into their leading ``[bs * n, W + n]`` / ``[bs * n]``
    part and views of it are returned.

    ``kernel``: ``torch`` copies whole rows (``bs * n * W`` entries: under
    CUDA graphs, where ``W`` is the context length, hundreds of MB per verify
    step at high concurrency); ``triton`` (``auto`` on CUDA) copies each row
    up to its length only, so its cost follows the prefixes. Both write the
    same entries up to ``lens[r]``; the GPU suite pins them. All tables are
    row-major with unit column stride.

    Requires ``prefix_lens[b] <= W`` (the prefix table covers the prefix).
    SGLang's cascade metadata has this layout: its prefix page table and its
    "expand" table, whose rows list a node's ancestors sorted by node index
    (a parent precedes its children in SGLang's tree order).

    Raises:
        ValueError: (Triton path) a table without unit column stride; an unknown ``kernel``.
    """
    bs, width = prefix_table.shape
    rows = bs * n
    if out_table is None:
        # Zeros, not empty: an entry past a row's length, should a kernel fetch one for a masked key, is a
        # valid slot id, as in SGLang's own tables.
        out_table = torch.zeros(rows, width + n, dtype=torch.int32, device=prefix_table.device)
    if out_lens is None:
        out_lens = torch.empty(rows, dtype=torch.int32, device=prefix_table.device)
    table, lens = out_table[:rows, : width + n], out_lens[:rows]
    if rows == 0:
        return table, lens
    if use_triton(kernel, prefix_table.device):
        from .node_rows_triton import node_rows_triton

        node_rows_triton(prefix_table, prefix_lens, ancestor_table, ancestor_lens, n, table, lens)
        return table, lens
    table.view(bs, n, -1)[:, :, :width].copy_(prefix_table.unsqueeze(1).expand(bs, n, width))
    starts = prefix_lens.to(torch.int64).repeat_interleave(n)  # [rows]
    cols = starts.unsqueeze(1) + torch.arange(n, device=table.device)  # < width + n
    table.scatter_(1, cols, ancestor_table.to(torch.int32))
    lens.copy_(starts + ancestor_lens.to(torch.int64))
    return table, lens


def ancestor_layout(parents: list[int]) -> tuple[list[list[int]], list[int]]:
    """SGLang's cascade "expand" rows for one tree: ``(rows, lens)``, node indices.

    ``parents[i]``: node i's parent (-1 for the root, node 0; a parent before
    its children, SGLang's tree order). Row i lists node i's ancestors from
    the root to itself (``lens[i]`` of them), then the other nodes in index
    order: what SGLang's sort of the tree mask's columns gives. Used to build
    that layout where SGLang's backend cannot run (tests, the benchmark).
    """
    rows, lens = [], []
    for i in range(len(parents)):
        on, j = [], i
        while j >= 0:
            on.append(j)
            j = parents[j]
        on.reverse()
        rows.append(on + [j for j in range(len(parents)) if j not in on])
        lens.append(len(on))
    return rows, lens
