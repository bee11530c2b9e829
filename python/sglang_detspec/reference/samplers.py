"""Per-round samplers of the reference engine: seeded (keyed) and control.

A round of chain speculative decoding needs two batched random operations:
drawing the j-th draft token of every row, and verifying every row's chain
(speculative sampling: Leviathan, Kalman and Matias, ICML 2023; Chen et al.
2023). :class:`KeyedSampler` does both with the hash-keyed ops, so each row's
draws depend only on its own seed and positions. :class:`GlobalRngSampler`
runs the very same ops but keys them with seeds drawn from torch's global RNG,
consumed row after row over the batch, so a row's draws depend on which rows
come before it and how many there are: the batch-dependent behaviour the
audit contrasts against. The two differ in the source of randomness only.
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


class GlobalRngSampler(KeyedSampler):
    """Control sampler: :class:`KeyedSampler` keyed by torch's global RNG instead of the rows' seeds.

    Every ``draft`` and ``verify`` call ignores the rows' ``sampling_seed``
    and keys row i with the i-th of B fresh 64-bit seeds drawn from torch's
    global (CPU) RNG, so which uniforms a row receives depends on its row
    index, on the batch size and on every earlier call. The global RNG is
    seeded with ``seed`` at the start of every ``generate`` call (so a batch
    rerun exactly repeats), and the caller's RNG state is restored afterwards.
    Positions, streams and the speculative sampling itself are the keyed
    sampler's, so the control differs from it in the source of randomness
    alone.

    Args:
        seed: global RNG seed for each ``generate`` call.
        kernel: passed to the ops, as for :class:`KeyedSampler`.
    """

    name = "control"

    def __init__(self, seed: int = 0, kernel: str | None = None) -> None:
        super().__init__(kernel)
        self.seed = seed

    @contextlib.contextmanager
    def session(self) -> Iterator[None]:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            yield

    @staticmethod
    def global_rng_seeds(batch: int) -> list[int]:
        """``batch`` seeds in [0, 2**64) from torch's global CPU RNG, row after row."""
        # Two 32-bit halves per row: torch.randint's exclusive int64 bound cannot cover all 2**64 values.
        halves = torch.randint(0, 1 << 32, (batch, 2), dtype=torch.int64).tolist()
        return [(hi << 32) | lo for lo, hi in halves]

    def draft(self, probs, seeds, positions, draft_step):
        """:meth:`KeyedSampler.draft` with :meth:`global_rng_seeds` in place of ``seeds``: int64 [B]."""
        return super().draft(probs, self.global_rng_seeds(len(seeds)), positions, draft_step)

    def verify(self, draft_tokens, draft_probs, target_probs, seeds, positions):
        """:meth:`KeyedSampler.verify` with :meth:`global_rng_seeds` in place of ``seeds``."""
        return super().verify(draft_tokens, draft_probs, target_probs, self.global_rng_seeds(len(seeds)), positions)
