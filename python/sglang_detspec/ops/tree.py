"""Checks of SGLang's draft-tree layout (first-child / next-sibling links).

Node 0 is the root (the last committed token). ``next_token[i]`` is the first
child of node i or -1, ``next_sibling[i]`` the next node with the same parent
or -1. The checks read the links back to the host, so they run only with
``check=True``; the kernels never loop forever on bad links either way.
"""

from __future__ import annotations

import torch

from .checks import INT_DTYPES
from .choices import one_of

LINK_NAMES = ("retrieve_next_token", "retrieve_next_sibling")


def check_link_tensor(name: str, t, shape: tuple[int, int], device: torch.device) -> None:
    """Metadata of an index tensor: int64/int32, ``shape``, on ``device``."""
    if not isinstance(t, torch.Tensor) or t.dtype not in INT_DTYPES:
        got = t.dtype if isinstance(t, torch.Tensor) else type(t).__name__
        raise ValueError(f"{name} must be an {one_of(INT_DTYPES)} tensor [B, N], got {got}")
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} must be [B, N] = {shape}, got shape {tuple(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but target_probs is on {device}")


def tree_max_depth(next_token: torch.Tensor, next_sibling: torch.Tensor) -> int:
    """Check the links of every row; return the largest depth of a node below the root.

    Raises:
        ValueError: a link outside [-1, N); a first child whose index is not
            greater than its parent's; a next sibling whose index is not
            greater than the parent it shares; a sibling of the root; a node
            with two incoming links; a cycle. Each message names the tensor,
            the row and the node.
    """
    nt = next_token.tolist()
    ns = next_sibling.tolist()
    deepest = 0
    for b, (first, sib) in enumerate(zip(nt, ns)):
        n = len(first)
        for name, links in zip(LINK_NAMES, (first, sib)):
            for i, c in enumerate(links):
                if not -1 <= c < n:
                    raise ValueError(f"{name}[{b}, {i}] = {c} is outside [-1, N = {n})")
        if sib[0] != -1:
            raise ValueError(f"retrieve_next_sibling[{b}, 0] = {sib[0]}: the root (node 0) has no siblings, must be -1")
        incoming = [0] * n
        for links in (first, sib):
            for c in links:
                if c >= 0:
                    incoming[c] += 1
        for c in range(n):
            if incoming[c] > 1 or (c == 0 and incoming[c]):
                raise ValueError(
                    f"row {b}: node {c} has {incoming[c]} incoming links in retrieve_next_token / "
                    "retrieve_next_sibling; every node but the root must have exactly one (no cycles, one parent)"
                )
        depth = [-1] * n
        # (node, parent or -1): parentless heads are the root and any node no link reaches.
        stack = [(c, -1) for c in range(n) if incoming[c] == 0]
        visited = 0
        while stack:
            x, parent = stack.pop()
            visited += 1
            if parent >= 0 and x <= parent:
                via = "retrieve_next_token" if first[parent] == x else "retrieve_next_sibling"
                raise ValueError(
                    f"row {b}: node {x} (reached by {via}) is a child of node {parent}; "
                    "a child index must be greater than its parent's"
                )
            depth[x] = depth[parent] + 1 if parent >= 0 else 0
            if first[x] >= 0:
                stack.append((first[x], x))
            if sib[x] >= 0:
                stack.append((sib[x], parent))
        if visited < n:
            raise ValueError(
                f"row {b}: the links of retrieve_next_token / retrieve_next_sibling form a cycle "
                f"({n - visited} nodes never reached from a node without incoming links)"
            )
        reach = _reachable_from_root(first, sib)
        deepest = max([deepest] + [depth[c] for c in reach])
    return deepest


def _reachable_from_root(first: list[int], sib: list[int]) -> list[int]:
    out, stack = [], [0]
    while stack:
        x = stack.pop()
        out.append(x)
        c = first[x]
        while c >= 0:
            stack.append(c)
            c = sib[c]
    return out
