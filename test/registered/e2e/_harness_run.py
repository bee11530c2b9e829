"""SGLang's determinism harness driven in-process against one server: the worker ``test_sglang_harness.py`` starts.

The harness (``sglang.test.test_deterministic``) keeps its state in
process-wide places: it reseeds and draws from Python's global ``random``
and prints to ``sys.stdout``. Each server's modes therefore run in a process
of their own (spawned, one per server, all at once), which gives each its
own ``random`` and its own output file, and the servers are measured side by
side instead of one after another.
"""

from __future__ import annotations

import contextlib
import io
import random
import traceback
import urllib.parse

import _harness_plan as plan


def run_modes(url: str, modes: tuple[str, ...], log_path: str) -> list[plan.ModeOutcome]:
    """Run each of ``modes`` of SGLang's harness on the server at ``url``, in order.

    Each mode gets a fresh ``BenchArgs`` (the harness changes
    ``return_logprob`` on the one it is given) with ``n_trials`` from
    :data:`_harness_plan.TRIALS`; prefix mode asks for logprobs, so its
    verdict on them is read as well. Everything the harness prints goes to
    ``log_path``. An exception stops that mode only: its outcome carries the
    error and the next mode runs.

    Raises:
        ValueError: an unknown mode, or ``url`` without a host and port.
    """
    from sglang.test import test_deterministic as harness

    for mode in modes:
        plan.check_mode(mode)
    parts = urllib.parse.urlsplit(url)
    if not parts.hostname or not parts.port:
        raise ValueError(f"url must name a host and a port, got {url!r}")
    outcomes = []
    with open(log_path, "w") as log:
        for mode in modes:
            args = harness.BenchArgs(host=parts.hostname, port=parts.port, test_mode=mode,
                                     n_trials=plan.TRIALS[mode], return_logprob=mode == "prefix")
            random.seed(plan.PREFIX_SEED)
            printed = io.StringIO()
            try:
                with contextlib.redirect_stdout(printed):
                    results = harness.test_deterministic(args)
                verdict = plan.prefix_logprob_verdict(printed.getvalue()) if mode == "prefix" else None
                outcome = plan.ModeOutcome(mode, tuple(int(r) for r in results), None, verdict)
            except Exception as exc:  # recorded on the row; the other modes still run
                printed.write(traceback.format_exc())
                outcome = plan.ModeOutcome(mode, (), f"{type(exc).__name__}: {exc}"[:500])
            log.write(f"===== {mode} (n_trials {args.n_trials})\n{printed.getvalue()}\n")
            log.flush()
            outcomes.append(outcome)
    return outcomes
