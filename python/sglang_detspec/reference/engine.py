"""The reference speculative decoding engine: the executable specification.

Per round, for a batch of requests, the engine drafts (a chain of K tokens, a
tree, or nothing), runs the target model, and verifies. For a request whose
sequence (prompt + output so far) has length t at the start of a round:

- plain decoding (no draft): the round commits ``y_t = race(p_t, TARGET, t)``;
- chain, draft step j (0 <= j < K): the draft model runs on the sequence plus
  drafts x_0..x_{j-1} and x_j is drawn from its distribution q_j at position
  t + j: on the DRAFT stream (``draft_step = j``) in rejection mode, as the
  coupled race ``race(q_j, TARGET, t + j)`` in coupled mode;
- tree (coupled mode only): top-k expansion to a fixed depth; a node at depth
  d (the root, depth 0, is the last committed token) gets as children the
  Gumbel-top-k of the draft distribution after it on the TARGET stream at
  position t + d, so its first child is the coupled race winner and the
  tree's first-child chain is the coupled chain;
- the target distributions p of every drafted position, then one verify call:
  ``verify_chain`` (rejection: Leviathan, Kalman and Matias, ICML 2023; Chen
  et al. 2023) or ``coupled_verify_chain`` / ``coupled_verify_tree`` (Daliri,
  Musco and Suresh 2024), which commit the accepted drafts plus one token.

In coupled mode every committed token at position t is the target's race
winner y_t, so the output equals plain decoding's whatever the draft model,
K or tree: docs/design.md, "Coupled verification". That needs bitwise-equal p_t, so the
distribution of a position is always one forward over exactly its prefix
(:class:`~sglang_detspec.reference.models.ProbsMemo`), never a row of a
longer forward.

Model forwards run per request, so a request's distributions never depend on
its batch. Every random operation runs on the whole batch at once through a
:class:`~sglang_detspec.reference.samplers.RoundSampler`: one call per draft
step (per tree level and child count), one verify call per round. With the
keyed sampler a request's output is a function of its prompt, temperature and
``sampling_seed`` alone.

Greedy rows (temperature 0) use one-hot distributions at the argmax: the race
then returns the argmax, and both verifiers accept a draft exactly when it is
the target's argmax and otherwise emit the target's argmax, which is
SGLang's greedy rule, through the same batched calls as sampled rows. A
greedy row's tree node has one child (the draft's argmax).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Sequence

import torch

from ..config import VERIFY_MODES, DetSpecConfig
from .models import ModelPair, ProbsMemo, build_model_pair, reduced_draft_probs
from ..request import Request, RequestResult
from .samplers import GlobalRngSampler, KeyedSampler, RoundSampler
from .stats import DraftStats
from ..ops.choices import one_of

# A full tree of depth D and branching b has b + b**2 + ... + b**D draft nodes,
# each a draft and a target forward per round: bound the cost of one round.
MAX_TREE_NODES = 1024
DRAFT_KINDS = ("none", "chain", "tree")
# The engine verifies as a server does by default: the runtime config bag's default
# verify mode (config.DetSpecConfig.verify), written there once.
DEFAULT_VERIFY = DetSpecConfig.verify


@dataclasses.dataclass(frozen=True)
class DraftShape:
    """What the drafter proposes each round.

    Build with :meth:`none`, :meth:`chain` or :meth:`tree`.

    Attributes:
        kind: ``"none"`` (plain decoding), ``"chain"`` or ``"tree"``.
        depth: draft tokens along one path: 0 for none, K for a chain, the
            tree's depth.
        branching: children per tree node (greedy rows: 1); 1 for chain and none.

    Raises:
        ValueError: an unknown kind; depth < 1 for a chain or tree (or not 0
            for none); branching < 1, or not 1 for a chain or none; a tree of
            more than ``MAX_TREE_NODES`` (1024) draft nodes.
    """

    kind: str
    depth: int = 0
    branching: int = 1

    def __post_init__(self) -> None:
        if self.kind not in DRAFT_KINDS:
            raise ValueError(f"kind must be one of {one_of(DRAFT_KINDS)}, got {self.kind!r}")
        for field in ("depth", "branching"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{field} must be an int, got {value!r}")
        if self.kind == "none":
            if self.depth != 0 or self.branching != 1:
                raise ValueError(f"no draft has depth 0 and branching 1, got {self.depth} and {self.branching}")
            return
        if self.depth < 1:
            raise ValueError(f"depth must be >= 1 for a {self.kind}, got {self.depth}")
        if self.branching < 1:
            raise ValueError(f"branching must be >= 1, got {self.branching}")
        if self.kind == "chain" and self.branching != 1:
            raise ValueError(f"a chain has branching 1, got {self.branching}: use DraftShape.tree")
        if self.num_nodes > MAX_TREE_NODES:
            raise ValueError(
                f"a tree of depth {self.depth} and branching {self.branching} has {self.num_nodes} draft nodes, "
                f"more than {MAX_TREE_NODES}"
            )

    @classmethod
    def none(cls) -> "DraftShape":
        """No draft: plain autoregressive decoding, one target token per round."""
        return cls("none")

    @classmethod
    def chain(cls, num_tokens: int) -> "DraftShape":
        """A chain of ``num_tokens`` (K >= 1) draft tokens."""
        return cls("chain", num_tokens)

    @classmethod
    def tree(cls, depth: int, branching: int) -> "DraftShape":
        """A full top-k expansion tree: ``branching`` children per node, ``depth`` levels."""
        return cls("tree", depth, branching)

    @property
    def num_nodes(self) -> int:
        """Draft nodes of a sampled row per round (the root not counted): K for a chain."""
        return sum(self.branching**level for level in range(1, self.depth + 1))

    @property
    def label(self) -> str:
        """Short name for reports: ``off``, ``chain K=3``, ``tree 3x2`` (depth x branching)."""
        if self.kind == "none":
            return "off"
        if self.kind == "chain":
            return f"chain K={self.depth}"
        return f"tree {self.depth}x{self.branching}"


@contextlib.contextmanager
def _one_intra_op_thread() -> Iterator[None]:
    # At this model size a forward is a few microseconds of arithmetic; fanning
    # it out over threads costs more than it saves (and far more on a busy host).
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@dataclasses.dataclass
class _Row:
    request: Request
    output: list[int] = dataclasses.field(default_factory=list)
    accept_lengths: list[int] = dataclasses.field(default_factory=list)
    stats: DraftStats = dataclasses.field(default_factory=DraftStats)

    @property
    def sequence(self) -> list[int]:
        return list(self.request.prompt_ids) + self.output

    @property
    def remaining(self) -> int:
        return self.request.max_new_tokens - len(self.output)

    def commit(self, tokens: list[int]) -> None:
        committed = tokens[: self.remaining]
        self.output.extend(committed)
        self.accept_lengths.append(len(committed))
        self.stats.rounds += 1


@dataclasses.dataclass
class _Tree:
    """One row's draft tree, nodes in breadth-first order (node 0 the root)."""

    prefixes: list[list[int]]  # the sequence up to and including each node
    tokens: list[int]
    depth: list[int]
    children: list[list[int]]
    draft_probs: dict[int, torch.Tensor]  # q after each expanded node, float32 [V]

    @classmethod
    def root(cls, sequence: list[int]) -> "_Tree":
        return cls([sequence], [sequence[-1]], [0], [[]], {})

    def add_child(self, parent: int, token: int) -> None:
        self.children[parent].append(len(self.tokens))
        self.prefixes.append(self.prefixes[parent] + [token])
        self.tokens.append(token)
        self.depth.append(self.depth[parent] + 1)
        self.children.append([])


class ReferenceEngine:
    """In-process CPU speculative decoding engine over a tiny target/draft pair.

    Args:
        models: the target and draft models; None builds the default
            :func:`~sglang_detspec.reference.models.build_model_pair`.
        draft: a :class:`DraftShape`, or an int K >= 1 for a chain of K.
        sampler: the per-round random operations; None means
            ``KeyedSampler("auto")``. Use :meth:`control` for the global-RNG one.
        verify: ``"coupled"`` (TARGET-stream drafts and coupled
            verification; chains and trees) or ``"rejection"`` (DRAFT-stream
            drafts and ``verify_chain``; chains only). Plain decoding is the
            same in both. The default, :data:`DEFAULT_VERIFY`, is the runtime
            config bag's (:class:`~sglang_detspec.config.DetSpecConfig`):
            coupled.
        memo: the distributions cache; engines given the same one share
            forwards. None gives the engine its own.

    Raises:
        ValueError: a bad ``draft``, an unknown ``verify``, a tree with
            ``verify="rejection"``, or a ``memo`` that is not a ProbsMemo.
    """

    def __init__(
        self,
        models: ModelPair | None = None,
        draft: DraftShape | int = 3,
        sampler: RoundSampler | None = None,
        *,
        verify: str = DEFAULT_VERIFY,
        memo: ProbsMemo | None = None,
    ) -> None:
        if isinstance(draft, int) and not isinstance(draft, bool):
            if draft < 1:
                raise ValueError(f"draft must be a DraftShape or an int K >= 1 (a chain of K), got {draft}")
            draft = DraftShape.chain(draft)
        if not isinstance(draft, DraftShape):
            raise ValueError(f"draft must be a DraftShape or an int K >= 1, got {draft!r}")
        if verify not in VERIFY_MODES:
            raise ValueError(f"verify must be one of {one_of(VERIFY_MODES)}, got {verify!r}")
        if draft.kind == "tree" and verify != "coupled":
            raise ValueError(
                f"draft {draft.label} needs verify='coupled': rejection verification (verify_chain) covers chains only"
            )
        if memo is not None and not isinstance(memo, ProbsMemo):
            raise ValueError(f"memo must be a ProbsMemo or None, got {type(memo).__name__}")
        self.models = build_model_pair() if models is None else models
        self.draft_shape = draft
        self.verify = verify
        self.sampler = KeyedSampler() if sampler is None else sampler
        self.memo = ProbsMemo() if memo is None else memo

    @classmethod
    def control(
        cls,
        models: ModelPair | None = None,
        draft: DraftShape | int = 3,
        seed: int = 0,
        *,
        verify: str = DEFAULT_VERIFY,
    ) -> "ReferenceEngine":
        """The same engine with :class:`GlobalRngSampler`: outputs depend on the batch."""
        return cls(models, draft, GlobalRngSampler(seed), verify=verify)

    @property
    def name(self) -> str:
        """``seeded`` or ``control`` (the sampler's name)."""
        return self.sampler.name

    @property
    def num_draft_tokens(self) -> int:
        """The most draft tokens one round can accept: K, the tree's depth, 0 without a draft."""
        return self.draft_shape.depth

    def generate(self, requests: Sequence[Request], *, stats: list | None = None) -> list[RequestResult]:
        """Decode a batch of requests together until each has ``max_new_tokens`` tokens.

        Rows leave the batch as they finish, so later rounds run on fewer rows.
        The last round of a request is cut at ``max_new_tokens``. torch runs
        with one intra-op thread during the call (restored afterwards), and
        the caller's global RNG state is left as it was.

        Args:
            requests: the batch, in row order; may be empty.
            stats: if a list, one :class:`DraftStats` per request is appended
                to it, in request order.

        Returns:
            One :class:`RequestResult` per request, in the same order.

        Raises:
            ValueError: a request that is not a :class:`Request`, a prompt
                token id outside [0, V), or a request whose prompt length +
                ``max_new_tokens`` + draft depth exceeds ``models.max_positions``.
        """
        vocab = self.models.vocab_size
        limit = self.models.max_positions
        depth = self.num_draft_tokens
        for i, req in enumerate(requests):
            if not isinstance(req, Request):
                raise ValueError(f"requests[{i}] must be a Request, got {type(req).__name__}")
            bad = [t for t in req.prompt_ids if t >= vocab]
            if bad:
                raise ValueError(f"requests[{i}] has prompt token id {bad[0]} outside the vocabulary [0, {vocab})")
            # The last round's target forward sees prompt + output + the drafts, and
            # transformers runs past max_position_embeddings without a word.
            need = len(req.prompt_ids) + req.max_new_tokens + depth
            if need > limit:
                raise ValueError(
                    f"requests[{i}]: prompt ({len(req.prompt_ids)}) + max_new_tokens ({req.max_new_tokens}) "
                    f"+ draft depth ({depth}) = {need} exceeds the models' {limit} positions"
                )
        rows = [_Row(req) for req in requests]
        step = {
            "none": self._plain_round,
            "chain": self._coupled_chain_round if self.verify == "coupled" else self._rejection_chain_round,
            "tree": self._tree_round,
        }[self.draft_shape.kind]
        with torch.inference_mode(), _one_intra_op_thread(), self.sampler.session():
            while True:
                active = [row for row in rows if row.remaining > 0]
                if not active:
                    break
                step(active)
        if stats is not None:
            stats.extend(row.stats for row in rows)
        return [RequestResult(tuple(row.output), tuple(row.accept_lengths)) for row in rows]

    def _probs(self, model, sequence: list[int], temperature: float) -> torch.Tensor:
        return self.memo(model, sequence, temperature)

    def _draft_probs(self, sequence: list[int], temperature: float) -> torch.Tensor:
        """q over target ids (zero off a reduced draft vocabulary): float32 [V]."""
        if self.models.hot_token_ids is None:
            return self._probs(self.models.draft, sequence, temperature)
        return reduced_draft_probs(self.models, self._probs(self.models.draft, sequence, 1.0).log(), temperature)

    def _target_rows(self, rows: list[_Row], seqs, drafts) -> torch.Tensor:
        """p at positions t..t+K of each row: float32 [B, K+1, V], one forward per prefix."""
        target = self.models.target
        return torch.stack(
            [
                torch.stack([self._probs(target, s + d[:j], row.request.temperature) for j in range(len(d) + 1)])
                for row, s, d in zip(rows, seqs, drafts)
            ]
        )

    def _draft_chain(self, rows: list[_Row], seqs, starts, coupled: bool):
        """Draft K tokens per row: (drafts list [B][K], q float32 [B, K, V])."""
        seeds = [row.request.sampling_seed for row in rows]
        drafts: list[list[int]] = [[] for _ in rows]
        draft_probs = []
        for j in range(self.num_draft_tokens):
            q = torch.stack(
                [
                    self._draft_probs(s + d, row.request.temperature)
                    for row, s, d in zip(rows, seqs, drafts)
                ]
            )
            if coupled:
                x = self.sampler.propose(q, seeds, starts + j, 1)[:, 0]
            else:
                x = self.sampler.draft(q, seeds, starts + j, j)
            for d, tok in zip(drafts, x.tolist()):
                d.append(tok)
            draft_probs.append(q)
        return drafts, torch.stack(draft_probs, dim=1)

    def _plain_round(self, rows: list[_Row]) -> None:
        seqs = [row.sequence for row in rows]
        # Keys use absolute positions in prompt + output (docs/design.md §1), never row indices,
        # so a row draws the same uniforms wherever it sits in the batch.
        starts = torch.tensor([len(s) for s in seqs], dtype=torch.int64)
        p = torch.stack([self._probs(self.models.target, s, row.request.temperature) for row, s in zip(rows, seqs)])
        y = self.sampler.sample(p, [row.request.sampling_seed for row in rows], starts)
        for row, tok in zip(rows, y.tolist()):
            row.commit([tok])

    def _chain_round(self, rows: list[_Row], coupled: bool) -> None:
        k = self.num_draft_tokens
        seqs = [row.sequence for row in rows]
        seeds = [row.request.sampling_seed for row in rows]
        starts = torch.tensor([len(s) for s in seqs], dtype=torch.int64)
        drafts, q = self._draft_chain(rows, seqs, starts, coupled)
        p = self._target_rows(rows, seqs, drafts)
        draft_tokens = torch.tensor(drafts, dtype=torch.int64)
        if coupled:
            tokens, accepted = self.sampler.coupled_verify(draft_tokens, p, seeds, starts)
        else:
            tokens, accepted = self.sampler.verify(draft_tokens, q, p, seeds, starts)
        for b, (row, toks, acc) in enumerate(zip(rows, tokens.tolist(), accepted.tolist())):
            # Draft j was tested when drafts 0..j-1 were accepted; q_j and p_j share that prefix.
            for j in range(min(acc + 1, k)):
                row.stats.add_tested(p[b, j], q[b, j])
            row.stats.accepted += acc
            row.commit(toks[: acc + 1])

    def _rejection_chain_round(self, rows: list[_Row]) -> None:
        self._chain_round(rows, coupled=False)

    def _coupled_chain_round(self, rows: list[_Row]) -> None:
        self._chain_round(rows, coupled=True)

    def _expand(self, rows: list[_Row], trees: list[_Tree], starts: list[int], level: int) -> None:
        """Give every node at depth ``level`` its children: q's Gumbel-top-k on the TARGET stream."""
        frontier = [(b, n) for b, tree in enumerate(trees) for n in range(len(tree.tokens)) if tree.depth[n] == level]
        for b, n in frontier:
            trees[b].draft_probs[n] = self._draft_probs(trees[b].prefixes[n], rows[b].request.temperature)
        # Top-k draws without replacement need k positive weights: a greedy row's
        # one-hot q has one, so rows are grouped by how many children they can have.
        groups: dict[int, list[tuple[int, int]]] = {}
        for b, n in frontier:
            positive = int((trees[b].draft_probs[n] > 0).sum())
            groups.setdefault(min(self.draft_shape.branching, positive), []).append((b, n))
        children = {}
        for count, members in sorted(groups.items()):
            q = torch.stack([trees[b].draft_probs[n] for b, n in members])
            seeds = [rows[b].request.sampling_seed for b, _ in members]
            # The children of a node at depth d are candidates for absolute position t + d.
            positions = torch.tensor([starts[b] + level for b, _ in members], dtype=torch.int64)
            for member, toks in zip(members, self.sampler.propose(q, seeds, positions, count).tolist()):
                children[member] = toks
        # Appending in frontier order keeps the nodes breadth-first: children after parents.
        for b, n in frontier:
            for tok in children[(b, n)]:
                trees[b].add_child(n, tok)

    def _tree_round(self, rows: list[_Row]) -> None:
        seqs = [row.sequence for row in rows]
        starts = [len(s) for s in seqs]
        trees = [_Tree.root(s) for s in seqs]
        for level in range(self.draft_shape.depth):
            self._expand(rows, trees, starts, level)
        n = max(len(tree.tokens) for tree in trees)
        b = len(rows)
        candidates = torch.zeros(b, n, dtype=torch.int64)
        next_token = torch.full((b, n), -1, dtype=torch.int64)
        next_sibling = torch.full((b, n), -1, dtype=torch.int64)
        target_rows = []
        for i, (row, tree) in enumerate(zip(rows, trees)):
            size = len(tree.tokens)
            candidates[i, :size] = torch.tensor(tree.tokens)
            for node, kids in enumerate(tree.children):
                if kids:
                    next_token[i, node] = kids[0]
                for left, right in zip(kids, kids[1:]):
                    next_sibling[i, left] = right
            probs = [self._probs(self.models.target, prefix, row.request.temperature) for prefix in tree.prefixes]
            # Rows of smaller trees (greedy ones) are padded with unlinked nodes, never visited.
            probs += [probs[0]] * (n - size)
            target_rows.append(torch.stack(probs))
        p = torch.stack(target_rows)  # [B, N, V]
        seeds = [row.request.sampling_seed for row in rows]
        positions = torch.tensor(starts, dtype=torch.int64)
        tokens, accepted, path = self.sampler.coupled_verify_tree(
            candidates, next_token, next_sibling, p, seeds, positions
        )
        for i, (row, tree, toks, acc, walk) in enumerate(
            zip(rows, trees, tokens.tolist(), accepted.tolist(), path.tolist())
        ):
            # The children of every accepted node that has any were tested, as one position.
            for node in walk[: acc + 1]:
                if tree.children[node]:
                    row.stats.add_tested(p[i, node], tree.draft_probs[node])
            row.stats.accepted += acc
            row.commit(toks[: acc + 1])
