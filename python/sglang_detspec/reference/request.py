"""The request types the reference engine speaks, defined torch-free in :mod:`sglang_detspec.request`."""

from ..request import Request, RequestResult

__all__ = ["Request", "RequestResult"]
