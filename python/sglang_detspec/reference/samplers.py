"""Per-round samplers of the reference engine: seeded (keyed) and control.

Every random operation of a decoding round goes through a sampler, batched
over the rows of the round:

- rejection mode (speculative sampling: Leviathan, Kalman and Matias, ICML
  2023; Chen et al. 2023): :meth:`~KeyedSampler.draft` draws the j-th draft
  token on the DRAFT stream and :meth:`~KeyedSampler.verify` runs
  ``verify_chain``;
- coupled mode (Daliri, Musco and Suresh 2024, "Coupling without
  Communication and Drafter-Invariant Speculative Decoding"):
  :meth:`~KeyedSampler.propose` races the draft distribution on the TARGET
  stream at the drafted token's position (the first of its Gumbel-top-k is
  the coupled draft token, the others a tree's further children), and
  :meth:`~KeyedSampler.coupled_verify` / :meth:`~KeyedSampler.coupled_verify_tree`
  accept exactly the drafts equal to the target's own race;
- plain decoding: :meth:`~KeyedSampler.sample` draws the target token on the
  TARGET stream.

:class:`KeyedSampler` keys all of these by each row's own seed, so each row's
draws depend only on its seed and positions. :class:`GlobalRngSampler` runs
the very same ops but keys them with seeds drawn from torch's global RNG,
consumed row after row over the batch, so a row's draws depend on which rows
come before it and how many there are: the batch-dependent behaviour the
audit contrasts against. The two differ in the source of randomness only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Protocol

import torch

from ..config import KERNELS
from ..ops.coupled import coupled_verify_chain, coupled_verify_tree
from ..ops.race import exponential_race
from ..ops.streams import Stream
from ..ops.verify import verify_chain
from ..ops.streams import U32
from ..ops.choices import one_of


class RoundSampler(Protocol):
    """The random part of one decoding round, over the whole batch at once."""

    name: str

    def session(self) -> contextlib.AbstractContextManager:
        """Context held for one ``generate`` call (the control seeds its RNG here)."""
        ...

    def draft(self, probs: torch.Tensor, seeds: Sequence[int], positions: torch.Tensor, draft_step: int) -> torch.Tensor:
        """Rejection-mode draft token per row: probs float32 [B, V] -> int64 [B]."""
        ...

    def verify(
        self,
        draft_tokens: torch.Tensor,
        draft_probs: torch.Tensor,
        target_probs: torch.Tensor,
        seeds: Sequence[int],
        positions: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rejection chain verify: the ``verify_chain`` contract (tokens [B, K+1], accepted drafts [B])."""
        ...

    def propose(
        self, probs: torch.Tensor, seeds: Sequence[int], positions: torch.Tensor, num_samples: int = 1
    ) -> torch.Tensor:
        """Coupled-mode draft tokens per row: probs float32 [B, V] -> int64 [B, num_samples]."""
        ...

    def sample(self, probs: torch.Tensor, seeds: Sequence[int], positions: torch.Tensor) -> torch.Tensor:
        """Plain decoding: the target token per row, probs float32 [B, V] -> int64 [B]."""
        ...

    def coupled_verify(
        self, draft_tokens: torch.Tensor, target_probs: torch.Tensor, seeds: Sequence[int], positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Coupled chain verify: the ``coupled_verify_chain`` contract."""
        ...

    def coupled_verify_tree(
        self,
        candidates: torch.Tensor,
        next_token: torch.Tensor,
        next_sibling: torch.Tensor,
        target_probs: torch.Tensor,
        seeds: Sequence[int],
        positions: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Coupled tree verify: the ``coupled_verify_tree`` contract (tokens, accept_lengths, path)."""
        ...


class KeyedSampler:
    """Seeded sampler: every draw keyed by the row's ``sampling_seed`` and absolute positions.

    Args:
        kernel: the ops' implementation, ``"auto"`` (Triton for CUDA tensors
            when it imports, else the torch reference), ``"torch"`` or
            ``"triton"``; passed to every op call.

    Raises:
        ValueError: ``kernel`` not one of those three.
    """

    name = "seeded"

    def __init__(self, kernel: str = "auto") -> None:
        if kernel not in KERNELS:
            raise ValueError(f"kernel must be one of {one_of(KERNELS)}, got {kernel!r}")
        self.kernel = kernel

    def session(self) -> contextlib.AbstractContextManager:
        # Keyed draws carry no state between calls.
        return contextlib.nullcontext()

    def draft(self, probs: torch.Tensor, seeds: Sequence[int], positions: torch.Tensor, draft_step: int) -> torch.Tensor:
        """``exponential_race(probs, seeds, positions, stream=DRAFT, draft_step=draft_step)``: int64 [B].

        ``probs`` float32 [B, V]; ``positions`` int64 [B], the absolute
        position of the token being drawn (docs/design.md §2, SGLang's draft layout).
        """
        tokens = exponential_race(
            probs, list(seeds), positions, stream=Stream.DRAFT, draft_step=draft_step, kernel=self.kernel
        )
        return tokens[:, 0]

    def verify(self, draft_tokens, draft_probs, target_probs, seeds, positions):
        """``verify_chain`` on the batch (docs/design.md §4).

        ``draft_tokens`` int64 [B, K], ``draft_probs`` float32 [B, K, V],
        ``target_probs`` float32 [B, K+1, V], ``positions`` int64 [B] the
        position of the first draft token. Returns tokens int64 [B, K+1]
        (-1 padded) and accepted drafts int64 [B].
        """
        return verify_chain(draft_tokens, draft_probs, target_probs, list(seeds), positions, kernel=self.kernel)

    def propose(self, probs, seeds, positions, num_samples=1):
        """Coupled draft tokens: ``exponential_race(q, seeds, positions, stream=TARGET, num_samples=n)``.

        ``probs`` float32 [B, V] is the draft distribution q of the token at
        absolute position ``positions`` (int64 [B]); the result int64
        [B, num_samples] is q's Gumbel-top-k on the target's own uniforms
        (docs/design.md, "Coupled verification"), so column 0 is the coupled draft token.
        """
        return exponential_race(
            probs, list(seeds), positions, stream=Stream.TARGET, num_samples=num_samples, kernel=self.kernel
        )

    def sample(self, probs, seeds, positions):
        """The target token ``y_t = exponential_race(p_t, seeds, t, stream=TARGET)``: int64 [B].

        ``probs`` float32 [B, V] is the target distribution p_t; ``positions``
        int64 [B] is t.
        """
        return exponential_race(probs, list(seeds), positions, stream=Stream.TARGET, kernel=self.kernel)[:, 0]

    def coupled_verify(self, draft_tokens, target_probs, seeds, positions):
        """``coupled_verify_chain`` on the batch (docs/design.md, "Coupled verification").

        ``draft_tokens`` int64 [B, K], ``target_probs`` float32 [B, K+1, V],
        ``positions`` int64 [B] the position of the first draft token.
        Returns tokens int64 [B, K+1] (-1 padded) and accepted drafts int64 [B].
        """
        return coupled_verify_chain(draft_tokens, target_probs, list(seeds), positions, kernel=self.kernel)

    def coupled_verify_tree(self, candidates, next_token, next_sibling, target_probs, seeds, positions):
        """``coupled_verify_tree`` on the batch (docs/design.md, "Coupled verification"), SGLang's tree layout.

        ``candidates``, ``next_token``, ``next_sibling`` int64 [B, N] (node 0
        the root), ``target_probs`` float32 [B, N, V], ``positions`` int64
        [B] the position of the token after the root. Returns tokens int64
        [B, N], accepted drafts int64 [B] and the accepted path int64 [B, N].
        """
        return coupled_verify_tree(
            candidates, next_token, next_sibling, target_probs, list(seeds), positions, kernel=self.kernel
        )


class GlobalRngSampler(KeyedSampler):
    """Control sampler: :class:`KeyedSampler` keyed by torch's global RNG instead of the rows' seeds.

    Every call ignores the rows' ``sampling_seed`` and keys row i with the
    i-th of B fresh 64-bit seeds drawn from torch's global (CPU) RNG, so
    which uniforms a row receives depends on its row index, on the batch
    size and on every earlier call. The global RNG is seeded with ``seed`` at
    the start of every ``generate`` call (so a batch rerun exactly repeats),
    and the caller's RNG state is restored afterwards. Positions, streams and
    the verification rules are the keyed sampler's, so the control differs
    from it in the source of randomness alone.

    Args:
        seed: global RNG seed for each ``generate`` call.
        kernel: passed to the ops, as for :class:`KeyedSampler`.

    Raises:
        ValueError: a bad ``kernel``.
    """

    name = "control"

    def __init__(self, seed: int = 0, kernel: str = "auto") -> None:
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
        halves = torch.randint(0, U32, (batch, 2), dtype=torch.int64).tolist()
        return [(hi << 32) | lo for lo, hi in halves]

    def draft(self, probs, seeds, positions, draft_step):
        """:meth:`KeyedSampler.draft` with :meth:`global_rng_seeds` in place of ``seeds``: int64 [B]."""
        return super().draft(probs, self.global_rng_seeds(len(seeds)), positions, draft_step)

    def verify(self, draft_tokens, draft_probs, target_probs, seeds, positions):
        """:meth:`KeyedSampler.verify` with :meth:`global_rng_seeds` in place of ``seeds``."""
        return super().verify(draft_tokens, draft_probs, target_probs, self.global_rng_seeds(len(seeds)), positions)

    def propose(self, probs, seeds, positions, num_samples=1):
        """:meth:`KeyedSampler.propose` with :meth:`global_rng_seeds` in place of ``seeds``."""
        return super().propose(probs, self.global_rng_seeds(len(seeds)), positions, num_samples)

    def sample(self, probs, seeds, positions):
        """:meth:`KeyedSampler.sample` with :meth:`global_rng_seeds` in place of ``seeds``."""
        return super().sample(probs, self.global_rng_seeds(len(seeds)), positions)

    def coupled_verify(self, draft_tokens, target_probs, seeds, positions):
        """:meth:`KeyedSampler.coupled_verify` with :meth:`global_rng_seeds` in place of ``seeds``."""
        return super().coupled_verify(draft_tokens, target_probs, self.global_rng_seeds(len(seeds)), positions)

    def coupled_verify_tree(self, candidates, next_token, next_sibling, target_probs, seeds, positions):
        """:meth:`KeyedSampler.coupled_verify_tree` with :meth:`global_rng_seeds` in place of ``seeds``."""
        keys = self.global_rng_seeds(len(seeds))
        return super().coupled_verify_tree(candidates, next_token, next_sibling, target_probs, keys, positions)
