"""Per-round samplers of the reference engine: seeded (keyed) and control.

A round of chain speculative decoding needs two batched random operations:
drawing the j-th draft token of every row, and verifying every row's chain
(speculative sampling: Leviathan, Kalman and Matias, ICML 2023; Chen et al.
2023). :class:`KeyedSampler` does both with the hash-keyed ops, so each row's
draws depend only on its own seed and positions. :class:`GlobalRngSampler`
does the same maths with draws from torch's global RNG, consumed row after row
over the batch, so a row's draws depend on which rows come before it and how
many there are: the batch-dependent behaviour the audit contrasts against.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Protocol

import torch

from ..ops import Stream, exponential_race, verify_chain


class RoundSampler(Protocol):
    """The random part of one decoding round, over the whole batch at once."""

    name: str

    def session(self) -> contextlib.AbstractContextManager:
        """Context held for one ``generate`` call (the control seeds its RNG here)."""
        ...

    def draft(self, probs: torch.Tensor, seeds: Sequence[int], positions: torch.Tensor, draft_step: int) -> torch.Tensor:
        """Draw one draft token per row: probs float32 [B, V] -> int64 [B]."""
        ...

    def verify(
        self,
        draft_tokens: torch.Tensor,
        draft_probs: torch.Tensor,
        target_probs: torch.Tensor,
        seeds: Sequence[int],
        positions: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Chain-verify every row: the ``verify_chain`` contract (tokens [B, K+1], accepted drafts [B])."""
        ...


class KeyedSampler:
    """Seeded sampler: ``exponential_race`` on the DRAFT stream and ``verify_chain``.

    Args:
        kernel: passed to the ops (``"auto"``, ``"torch"``, ``"triton"``);
            None reads the config bag.
    """

    name = "seeded"

    def __init__(self, kernel: str | None = None) -> None:
        self.kernel = kernel

    def session(self) -> contextlib.AbstractContextManager:
        # Keyed draws carry no state between calls.
        return contextlib.nullcontext()

    def draft(self, probs: torch.Tensor, seeds: Sequence[int], positions: torch.Tensor, draft_step: int) -> torch.Tensor:
        """``exponential_race(probs, seeds, positions, stream=DRAFT, draft_step=draft_step)``: int64 [B].

        ``positions`` [B] int64 is the absolute position of the token being drawn.
        """
        tokens = exponential_race(
            probs, list(seeds), positions, stream=Stream.DRAFT, draft_step=draft_step, kernel=self.kernel
        )
        return tokens[:, 0]

    def verify(self, draft_tokens, draft_probs, target_probs, seeds, positions):
        """``verify_chain`` on the batch; ``positions`` [B] is the position of the first draft token."""
        return verify_chain(draft_tokens, draft_probs, target_probs, list(seeds), positions, kernel=self.kernel)


class GlobalRngSampler:
    """Control sampler: the same speculative sampling, drawn from torch's global RNG.

    Draft proposals are ``torch.multinomial`` over the batch, accept coins one
    ``torch.rand`` [B, K] float64 tensor, residual and bonus tokens one more
    ``torch.multinomial``. The global RNG is seeded with ``seed`` at the start
    of every ``generate`` call (so a batch rerun exactly repeats), and the
    caller's RNG state is restored afterwards. The seeds and positions of the
    rows are ignored, which is the point: which uniforms a row receives
    depends on its row index and on the batch size.

    Args:
        seed: global RNG seed for each ``generate`` call.
    """

    name = "control"

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed

    @contextlib.contextmanager
    def session(self) -> Iterator[None]:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            yield

    def draft(self, probs, seeds, positions, draft_step):
        """``torch.multinomial(probs, 1)``: int64 [B]."""
        return torch.multinomial(probs, 1)[:, 0]

    def verify(self, draft_tokens, draft_probs, target_probs, seeds, positions):
        """Chain verify with global-RNG coins and draws: tokens int64 [B, K+1] (-1 padded), accepted int64 [B]."""
        b, k = draft_tokens.shape
        rows = torch.arange(b)
        coins = torch.rand(b, k, dtype=torch.float64)
        qx = draft_probs.gather(2, draft_tokens.unsqueeze(2)).squeeze(2).to(torch.float64)
        px = target_probs[:, :k].gather(2, draft_tokens.unsqueeze(2)).squeeze(2).to(torch.float64)
        accepted = (coins * qx < px).to(torch.int64).cumprod(dim=1).sum(dim=1)
        rejected = accepted < k
        p_next = target_probs[rows, accepted]
        q_next = draft_probs[rows, accepted.clamp(max=k - 1)]
        residual = torch.clamp_min(p_next - q_next, 0)
        use_residual = rejected & (residual.amax(dim=1) > 0)
        final = torch.multinomial(torch.where(use_residual.unsqueeze(1), residual, p_next), 1)[:, 0]
        tokens = torch.full((b, k + 1), -1, dtype=torch.int64)
        keep = torch.arange(k).unsqueeze(0) < accepted.unsqueeze(1)
        tokens[:, :k] = torch.where(keep, draft_tokens, -1)
        tokens[rows, accepted] = final
        return tokens, accepted
