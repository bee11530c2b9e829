"""Coupled tree drafts under SGLang's pruning: which node score keeps the better tree (CPU simulation).

SGLang's EAGLE draft builds a tree by beam search: level 1 is the root's k
children; each later level expands the k best-scoring nodes of the level
before (k children each, a path's score the product of its nodes' values);
then it keeps the ``num_draft_tokens - 1`` best-scoring nodes of all it
expanded (``select_top_k_tokens`` and ``organize_draft_results``, SGLang
0.5.23). Children here are always the coupled ones (``ops.coupled_children``:
q's Gumbel-top-k on the TARGET stream); what differs is the value a child
carries into the path scores:

- ``q``: its draft probability (SGLang's own score);
- ``race``: its race key over the winner's (``ops.coupled_children``'s score,
  what the plugin uses).

The drafter and the target are bigram models over a small vocabulary
(``p(.|a)`` and a perturbed ``q(.|a)``), every draw keyed as on a server
(seeds, absolute positions). For each setting the table gives the mean
committed tokens per verify round (accepted drafts + 1) of coupled tree
verify, next to the coupled chain (k = 1) and the rejection-sampling chain
(``ops.verify_chain``) of the same depth.

    python benchmark/tree_scoring.py [--rows 4000] [--out docs/benchmarks/tree_scoring.md]
"""

from __future__ import annotations

import argparse
import pathlib
import time

import torch

from sglang_detspec.ops import (
    Stream, coupled_children, coupled_verify_chain, coupled_verify_tree, exponential_race, verify_chain,
)

VOCAB = 64


def bigram_pair(sigma: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Target p and draft q, float64 [V, V] (row a: the next-token distribution after token a)."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(VOCAB, VOCAB, generator=gen, dtype=torch.float64) * 2.5
    p = torch.softmax(logits, dim=-1)
    q = torch.softmax(logits + sigma * torch.randn(VOCAB, VOCAB, generator=gen, dtype=torch.float64), dim=-1)
    return p, q


def build_tree(q, roots, seeds, t, steps, k, n_tokens, score):
    """SGLang's beam-search tree of coupled children: ``(candidates, next_token, next_sibling, depth)``, [B, N]."""
    b = roots.shape[0]
    tokens, scores, parents, depths = [], [], [], []  # per candidate, [B] each
    beam_tok, beam_score, beam_id = roots.view(b, 1), torch.ones(b, 1, dtype=torch.float64), torch.full((b, 1), -1)
    for level in range(1, steps + 1):
        nb = beam_tok.shape[1]
        kids, ratio = coupled_children(q[beam_tok.reshape(-1)], seeds.repeat_interleave(nb),
                                       (t + level).repeat_interleave(nb), k, kernel="torch")
        value = ratio if score == "race" else q[beam_tok.reshape(-1)].gather(1, kids)
        cand_tok = kids.view(b, nb * k)
        cand_score = (beam_score.unsqueeze(2) * value.view(b, nb, k)).view(b, nb * k)
        cand_parent = beam_id.repeat_interleave(k, dim=1)
        first = len(tokens)
        for j in range(nb * k):
            tokens.append(cand_tok[:, j]); scores.append(cand_score[:, j])
            parents.append(cand_parent[:, j]); depths.append(torch.full((b,), level))
        best = torch.topk(cand_score, min(k, nb * k), dim=1).indices
        beam_tok, beam_score = cand_tok.gather(1, best), cand_score.gather(1, best)
        beam_id = best + first
    all_scores = torch.stack(scores, 1)
    kept = torch.sort(torch.topk(all_scores, n_tokens - 1, dim=1).indices, dim=1).values  # [B, N-1]
    all_tok, all_par, all_dep = (torch.stack(x, 1) for x in (tokens, parents, depths))
    n = n_tokens
    cand = torch.zeros(b, n, dtype=torch.int64); cand[:, 0] = roots
    nxt = torch.full((b, n), -1, dtype=torch.int64); sib = torch.full((b, n), -1, dtype=torch.int64)
    depth = torch.zeros(b, n, dtype=torch.int64)
    for row in range(b):
        slot = {-1: 0}
        last_child = {}
        for j, c in enumerate(kept[row].tolist(), start=1):
            cand[row, j] = all_tok[row, c]; depth[row, j] = all_dep[row, c]
            parent = int(all_par[row, c])
            if parent not in slot:  # an orphan (its parent was pruned): unreachable, as in SGLang's mask
                continue
            slot[c] = j
            p_slot = slot[parent]
            if p_slot in last_child:
                sib[row, last_child[p_slot]] = j
            else:
                nxt[row, p_slot] = j
            last_child[p_slot] = j
    return cand, nxt, sib, depth


def tree_accept(p, q, rows, steps, k, n_tokens, score, seed):
    gen = torch.Generator().manual_seed(seed)
    seeds = torch.randint(0, 1 << 62, (rows,), generator=gen)
    t = torch.randint(0, 1 << 20, (rows,), generator=gen)
    roots = torch.randint(0, VOCAB, (rows,), generator=gen)
    cand, nxt, sib, _ = build_tree(q, roots, seeds, t, steps, k, n_tokens, score)
    _, accepted, _ = coupled_verify_tree(cand, nxt, sib, p[cand], seeds, t + 1, kernel="torch")
    return float(accepted.double().mean()) + 1


def chain_accept(p, q, rows, steps, seed, rejection: bool):
    """Coupled chain (drafts race q on TARGET) or rejection chain (drafts race q on DRAFT, ``verify_chain``)."""
    gen = torch.Generator().manual_seed(seed)
    seeds = torch.randint(0, 1 << 62, (rows,), generator=gen)
    t = torch.randint(0, 1 << 20, (rows,), generator=gen)
    root = torch.randint(0, VOCAB, (rows,), generator=gen)
    stream = Stream.DRAFT if rejection else Stream.TARGET
    ctx, q_rows = [root], []
    for j in range(steps):
        q_rows.append(q[ctx[-1]])
        ctx.append(exponential_race(q_rows[-1], seeds, t + 1 + j, stream=stream, kernel="torch")[:, 0])
    drafts, p_rows = torch.stack(ctx[1:], 1), p[torch.stack(ctx, 1)]  # p_rows[:, j]: the target after node j
    if rejection:
        _, accepted = verify_chain(drafts, torch.stack(q_rows, 1), p_rows, seeds, t + 1, kernel="torch")
    else:
        _, accepted = coupled_verify_chain(drafts, p_rows, seeds, t + 1, kernel="torch")
    return float(accepted.double().mean()) + 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=3000, help="verify rounds per cell (default 3000)")
    parser.add_argument("--out", default="docs/benchmarks/tree_scoring.md")
    args = parser.parse_args()
    shapes = [(3, 4, 8), (5, 4, 16)]  # (steps, topk, draft tokens): the E2E suite's trees
    lines = [
        "# Coupled tree drafts: node scores under SGLang's pruning (CPU simulation)",
        "",
        f"`python benchmark/tree_scoring.py --rows {args.rows}`, {time.strftime('%Y-%m-%d')}, torch "
        f"{torch.__version__}, CPU. Bigram target and draft over {VOCAB} tokens; sigma is the draft's "
        "logit noise, TV the mean total-variation distance of a draft row from its target row. Mean "
        "committed tokens per verify round (accepted drafts + 1).",
        "",
        "| sigma | TV | rejection chain (3 steps) | coupled chain (3) | coupled chain (5) | "
        "tree 3/4/8, q score | tree 3/4/8, race score | tree 5/4/16, q score | tree 5/4/16, race score |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for sigma in (0.3, 0.6, 1.2):
        p, q = bigram_pair(sigma, seed=int(sigma * 10))
        tv = float(0.5 * (p - q).abs().sum(-1).mean())
        cells = [chain_accept(p, q, args.rows, 3, 1, True), chain_accept(p, q, args.rows, 3, 1, False),
                 chain_accept(p, q, args.rows, 5, 1, False)]
        for steps, k, n in shapes:
            for score in ("q", "race"):
                cells.append(tree_accept(p, q, args.rows, steps, k, n, score, 2))
        lines.append(f"| {sigma} | {tv:.3f} | " + " | ".join(f"{c:.3f}" for c in cells) + " |")
        print(lines[-1], flush=True)
    path = pathlib.Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
