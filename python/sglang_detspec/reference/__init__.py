"""In-process reference engine: the executable specification and test oracle.

A small CPU speculative decoding engine over tiny deterministic Llama models:
chain or tree drafts, or none (plain decoding), verified by coupled
(drafter-invariant) verification, the default (the runtime config bag's), or
by rejection sampling (``verify="rejection"``). :class:`ReferenceEngine` with
the default :class:`KeyedSampler` gives every request the same tokens in any
batch, and in coupled mode the same tokens with any draft;
:meth:`ReferenceEngine.control` draws from torch's global RNG instead and does
not.
"""

from .engine import DraftShape, ReferenceEngine
from .stats import DraftStats
from .models import (
    ModelPair, ProbsMemo, TinyLlamaSpec, build_model_pair, next_token_probs, reduced_draft_probs, with_random_draft,
    with_reduced_draft_vocab,
)
from ..request import Request, RequestResult
from .samplers import GlobalRngSampler, KeyedSampler, RoundSampler

__all__ = [
    "ReferenceEngine",
    "DraftShape",
    "DraftStats",
    "Request",
    "RequestResult",
    "ModelPair",
    "ProbsMemo",
    "TinyLlamaSpec",
    "build_model_pair",
    "with_random_draft",
    "with_reduced_draft_vocab",
    "reduced_draft_probs",
    "next_token_probs",
    "RoundSampler",
    "KeyedSampler",
    "GlobalRngSampler",
]
