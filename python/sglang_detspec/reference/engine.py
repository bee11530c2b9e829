"""The reference speculative decoding engine: the executable specification.

Chain drafting of K tokens, then one verification, per round, for a batch of
requests (speculative sampling: Leviathan, Kalman and Matias, ICML 2023; Chen
et al. 2023). For a request whose sequence (prompt + output so far) has length
t at the start of a round:

- draft step j (0 <= j < K) runs the draft model on the sequence plus drafts
  x_0..x_{j-1} and draws x_j from its distribution q_j at position t + j;
- the target model runs once on the sequence plus all K drafts, giving
  p_0..p_K for positions t..t+K;
- verification accepts a prefix of the drafts and emits one more token.

Model forwards run per request, so a request's logits never depend on its
batch. Every random operation runs on the whole batch at once through a
:class:`~sglang_detspec.reference.samplers.RoundSampler`: one draft call per
draft step over all active rows, one verify call per round. With the keyed
sampler those are ``exponential_race`` (DRAFT stream, ``draft_step = j``) and
``verify_chain`` (positions = t), so a request's output is a function of its
prompt, temperature and ``sampling_seed`` alone.

Greedy rows (temperature 0) use one-hot distributions at the argmax: the race
then returns the argmax, and verification accepts a draft exactly when it is
the target's argmax and otherwise emits the target's argmax, which is
SGLang's greedy rule, through the same batched calls as sampled rows.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Sequence

import torch

from .models import ModelPair, build_model_pair, next_token_probs
from .request import Request, RequestResult
from .samplers import GlobalRngSampler, KeyedSampler, RoundSampler


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

    @property
    def sequence(self) -> list[int]:
        return list(self.request.prompt_ids) + self.output

    @property
    def remaining(self) -> int:
        return self.request.max_new_tokens - len(self.output)


class ReferenceEngine:
    """In-process CPU speculative decoding engine over a tiny target/draft pair.

    Args:
        models: the target and draft models; None builds the default
            :func:`~sglang_detspec.reference.models.build_model_pair`.
        num_draft_tokens: K >= 1, draft tokens per round.
        sampler: the per-round random operations; None means the seeded
            :class:`KeyedSampler`. Use :meth:`control` for the global-RNG one.

    Raises:
        ValueError: ``num_draft_tokens`` < 1.
    """

    def __init__(
        self,
        models: ModelPair | None = None,
        num_draft_tokens: int = 3,
        sampler: RoundSampler | None = None,
    ) -> None:
        if isinstance(num_draft_tokens, bool) or not isinstance(num_draft_tokens, int) or num_draft_tokens < 1:
            raise ValueError(f"num_draft_tokens must be an int >= 1, got {num_draft_tokens!r}")
        self.models = build_model_pair() if models is None else models
        self.num_draft_tokens = num_draft_tokens
        self.sampler = KeyedSampler() if sampler is None else sampler

    @classmethod
    def control(cls, models: ModelPair | None = None, num_draft_tokens: int = 3, seed: int = 0) -> "ReferenceEngine":
        """The same engine with :class:`GlobalRngSampler`: outputs depend on the batch."""
        return cls(models, num_draft_tokens, GlobalRngSampler(seed))

    @property
    def name(self) -> str:
        """``seeded`` or ``control`` (the sampler's name)."""
        return self.sampler.name

    def generate(self, requests: Sequence[Request]) -> list[RequestResult]:
        """Decode a batch of requests together until each has ``max_new_tokens`` tokens.

        Rows leave the batch as they finish, so later rounds run on fewer rows.
        The last round of a request is cut at ``max_new_tokens``. torch runs
        with one intra-op thread during the call (restored afterwards), and
        the caller's global RNG state is left as it was.

        Args:
            requests: the batch, in row order; may be empty.

        Returns:
            One :class:`RequestResult` per request, in the same order.

        Raises:
            ValueError: a request that is not a :class:`Request`, a prompt
                token id outside [0, V), or a request whose prompt length +
                ``max_new_tokens`` + K exceeds ``models.max_positions``.
        """
        vocab = self.models.vocab_size
        limit = self.models.max_positions
        k = self.num_draft_tokens
        for i, req in enumerate(requests):
            if not isinstance(req, Request):
                raise ValueError(f"requests[{i}] must be a Request, got {type(req).__name__}")
            bad = [t for t in req.prompt_ids if t >= vocab]
            if bad:
                raise ValueError(f"requests[{i}] has prompt token id {bad[0]} outside the vocabulary [0, {vocab})")
            # The last round's target forward sees prompt + output + K drafts, and
            # transformers runs past max_position_embeddings without a word.
            need = len(req.prompt_ids) + req.max_new_tokens + k
            if need > limit:
                raise ValueError(
                    f"requests[{i}]: prompt ({len(req.prompt_ids)}) + max_new_tokens ({req.max_new_tokens}) "
                    f"+ num_draft_tokens ({k}) = {need} exceeds the models' {limit} positions"
                )
        rows = [_Row(req) for req in requests]
        with torch.inference_mode(), _one_intra_op_thread(), self.sampler.session():
            while True:
                active = [row for row in rows if row.remaining > 0]
                if not active:
                    break
                self._round(active)
        return [RequestResult(tuple(row.output), tuple(row.accept_lengths)) for row in rows]

    def _round(self, rows: list[_Row]) -> None:
        k = self.num_draft_tokens
        seqs = [row.sequence for row in rows]
        temps = [row.request.temperature for row in rows]
        seeds = [row.request.sampling_seed for row in rows]
        # Keys use absolute positions in prompt + output (docs/design.md §1), never row indices,
        # so a row draws the same uniforms wherever it sits in the batch.
        starts = torch.tensor([len(s) for s in seqs], dtype=torch.int64)
        drafts: list[list[int]] = [[] for _ in rows]
        draft_probs = []
        for j in range(k):
            q = torch.stack(
                [next_token_probs(self.models.draft, s + d, temp)[0] for s, d, temp in zip(seqs, drafts, temps)]
            )
            x = self.sampler.draft(q, seeds, starts + j, j)
            for d, tok in zip(drafts, x.tolist()):
                d.append(tok)
            draft_probs.append(q)
        target_probs = torch.stack(
            [next_token_probs(self.models.target, s + d, temp, k + 1) for s, d, temp in zip(seqs, drafts, temps)]
        )
        tokens, accepted = self.sampler.verify(
            torch.tensor(drafts, dtype=torch.int64), torch.stack(draft_probs, dim=1), target_probs, seeds, starts
        )
        for row, toks, acc in zip(rows, tokens.tolist(), accepted.tolist()):
            committed = toks[: acc + 1][: row.remaining]
            row.output.extend(committed)
            row.accept_lengths.append(len(committed))
