"""What a caller asks a decoding backend for and what it gets back (pure Python, no torch).

These two types are the whole interface between a decoding backend and its
users (the audits, the tests): the in-process reference engine takes
:class:`Request` and returns :class:`RequestResult`, and any other backend
that speaks the same two types (a running SGLang server through
:mod:`sglang_detspec.auditing.http_backend`) can be audited the same way.
"""

from __future__ import annotations

import dataclasses
import math

from .ops.seed_encoding import check_seed


@dataclasses.dataclass(frozen=True)
class Request:
    """One generation request.

    Attributes:
        prompt_ids: the prompt token ids, at least one.
        max_new_tokens: exactly this many tokens are generated (no stop
            tokens), >= 1.
        temperature: 0 for greedy (argmax), else > 0 and finite.
        sampling_seed: the request's seed in [0, 2**64); it keys every random
            draw of the request (docs/design.md §1), so it alone, with the prompt,
            fixes the output.

    Raises:
        ValueError: on construction, for any field outside the ranges above.
    """

    prompt_ids: tuple[int, ...]
    max_new_tokens: int
    temperature: float
    sampling_seed: int

    def __post_init__(self) -> None:
        ids = tuple(self.prompt_ids)
        if not ids:
            raise ValueError("prompt_ids must hold at least one token id")
        for i, t in enumerate(ids):
            if isinstance(t, bool) or not isinstance(t, int) or t < 0:
                raise ValueError(f"prompt_ids[{i}] must be a non-negative int, got {t!r}")
        object.__setattr__(self, "prompt_ids", ids)
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an int >= 1, got {self.max_new_tokens!r}")
        temp = self.temperature
        if isinstance(temp, bool) or not isinstance(temp, (int, float)) or not math.isfinite(temp) or temp < 0:
            raise ValueError(f"temperature must be a finite number >= 0, got {temp!r}")
        object.__setattr__(self, "temperature", float(temp))
        check_seed(self.sampling_seed, "sampling_seed")


@dataclasses.dataclass(frozen=True)
class RequestResult:
    """What one request produced.

    Attributes:
        output_ids: the generated token ids, ``max_new_tokens`` of them.
        accept_lengths: per verify round, how many tokens the round committed:
            the accepted draft tokens plus the target's own token (residual or
            bonus), cut at ``max_new_tokens`` in the last round. Each is in
            [1, K + 1] and they sum to ``len(output_ids)``; their mean is
            SGLang's ``spec_accept_length`` (completion tokens / verify rounds).
    """

    output_ids: tuple[int, ...]
    accept_lengths: tuple[int, ...]

    @property
    def mean_accept_length(self) -> float:
        """Committed tokens per verify round."""
        return len(self.output_ids) / len(self.accept_lengths)
