"""How a request's drafts fared in verification: acceptance counts and the exact coupled match probability.

Collected by the reference engine per request (``ReferenceEngine.generate(...,
stats=[])``) and read by the audit's invariance report
(``auditing/invariance.py``). Kept apart from the engine so the engine holds
decoding only.
"""

from __future__ import annotations

import dataclasses

import torch


@dataclasses.dataclass
class DraftStats:
    """How one request's drafts fared in verification, summed over its rounds.

    A draft position is *tested* when verification reached it: in a chain,
    draft x_j is tested when x_0..x_{j-1} were accepted; in a tree, the
    children of each accepted node (the root included) are tested once,
    as one position. ``accepted / tested`` is the per-token acceptance rate.
    For each tested position the engine also sums, from the exact target
    distribution p and draft distribution q there, ``1 - TV(p, q)`` (the
    acceptance probability of rejection sampling) and
    ``(1 - TV) / (1 + TV)`` (the lower bound of the coupled race: Daliri,
    Musco and Suresh 2024), where ``TV = sum|p - q| / 2`` in float64.
    It sums :func:`coupled_match_probability` too, the exact probability
    that the coupled race of q equals that of p. Rounds of plain decoding
    test nothing.

    Attributes:
        rounds: verify rounds.
        tested: tested draft positions.
        accepted: accepted draft tokens.
        overlap_sum: sum of 1 - TV over the tested positions.
        coupled_bound_sum: sum of (1 - TV) / (1 + TV) over them.
        coupled_match_sum: sum of :func:`coupled_match_probability` over them.
        coupled_match_var_sum: sum of P (1 - P) for those probabilities P
            (the variance of the accepted count of coupled chain drafts).
    """

    rounds: int = 0
    tested: int = 0
    accepted: int = 0
    overlap_sum: float = 0.0
    coupled_bound_sum: float = 0.0
    coupled_match_sum: float = 0.0
    coupled_match_var_sum: float = 0.0

    def add_tested(self, p: torch.Tensor, q: torch.Tensor) -> None:
        """Count one tested position with target p and draft q (float [V] each)."""
        tv = 0.5 * float((p.to(torch.float64) - q.to(torch.float64)).abs().sum())
        match = coupled_match_probability(p, q)
        self.tested += 1
        self.overlap_sum += 1.0 - tv
        self.coupled_bound_sum += (1.0 - tv) / (1.0 + tv)
        self.coupled_match_sum += match
        self.coupled_match_var_sum += match * (1.0 - match)


def coupled_match_probability(p: torch.Tensor, q: torch.Tensor) -> float:
    """Exact ``Pr[race(q) == race(p)]`` when both races read the same uniforms.

    With E_j i.i.d. Exp(1), token i wins both races iff
    ``E_j > E_i * max(p_j / p_i, q_j / q_i)`` for every j; given E_i = e that
    has probability ``exp(-e * (S_i - 1))`` with
    ``S_i = sum_j max(p_j / p_i, q_j / q_i)``, and integrating over e ~ Exp(1)
    gives ``Pr[both pick i] = 1 / S_i``. So the answer is ``sum_i 1 / S_i``
    over the tokens with p_i > 0 and q_i > 0 (1 for p = q, 0 for disjoint
    supports; at least (1 - TV) / (1 + TV): Daliri, Musco and Suresh 2024).
    Float64, O(V**2) memory.

    Args:
        p, q: float [V] each, non-negative, summing to 1.

    Returns:
        The probability, a float in [0, 1].
    """
    p64, q64 = p.to(torch.float64), q.to(torch.float64)
    both = (p64 > 0) & (q64 > 0)
    pi, qi = p64[both].unsqueeze(1), q64[both].unsqueeze(1)  # [n, 1]
    s = torch.maximum(p64.unsqueeze(0) / pi, q64.unsqueeze(0) / qi).sum(dim=1)  # [n]
    return float((1.0 / s).sum())
