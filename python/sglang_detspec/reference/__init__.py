"""In-process reference engine: the executable specification and test oracle.

A small CPU speculative decoding engine (chain drafting, seeded verification)
over tiny deterministic Llama models. :class:`ReferenceEngine` with the
default :class:`KeyedSampler` gives every request the same tokens in any
batch; :meth:`ReferenceEngine.control` draws from torch's global RNG instead
and does not.
"""

from .engine import ReferenceEngine
from .models import ModelPair, TinyLlamaSpec, build_model_pair, next_token_probs
from .request import Request, RequestResult
from .samplers import GlobalRngSampler, KeyedSampler, RoundSampler

__all__ = [
    "ReferenceEngine",
    "Request",
    "RequestResult",
    "ModelPair",
    "TinyLlamaSpec",
    "build_model_pair",
    "next_token_probs",
    "RoundSampler",
    "KeyedSampler",
    "GlobalRngSampler",
]
