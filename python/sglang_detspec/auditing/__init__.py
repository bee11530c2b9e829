"""Audits of a decoding backend: does a seeded request give the same tokens everywhere?

- :mod:`.batch`: the changing-batch audit (one probe request in batches of
  changing size, order and split; count its unique outputs). Works with any
  backend speaking :class:`~sglang_detspec.request.Request` /
  :class:`~sglang_detspec.request.RequestResult`.
- :mod:`.http_backend`: a running SGLang server's ``/generate`` as such a
  backend.
- :mod:`.server_seeds`: the request-seed checks of a running server
  (unseeded requests, parallel samples, reported seeds replayed).
- :mod:`.invariance`: drafter invariance on the reference engine (the same
  seeded requests with speculative decoding off, other chains, a tree, other
  draft models). It runs the engine, so it imports torch and transformers;
  this package does not import it.

Nothing else here imports torch or transformers: auditing a server needs neither.
"""

from .batch import AuditPlan, RunSummary, Verdict, build_plan, build_report, judge, run_plan

# Seconds to wait for one HTTP exchange with a server (a /generate call answers
# only when its whole batch is done).
DEFAULT_TIMEOUT_S = 300.0

__all__ = [
    "AuditPlan", "RunSummary", "Verdict", "build_plan", "build_report", "judge", "run_plan", "DEFAULT_TIMEOUT_S",
]
