"""``detspec audit --url``: the changing-batch trials and the request-seed checks against a running server.

This path imports neither torch nor transformers.
"""

from __future__ import annotations

import argparse
import sys

from ..auditing import DEFAULT_TIMEOUT_S
from ._audit_report import finish, progress_runs
from ._audit_common import DEFAULT_CONCURRENCY, STDOUT, fail
from .messages import PREFIX
from .serve import DETERMINISTIC


# Resolved server arguments worth keeping with a server audit (top-level keys of /server_info).
_SERVER_FACTS = (
    "version", "model_path", "speculative_algorithm", "speculative_num_steps",
    "speculative_num_draft_tokens", "enable_deterministic_inference", "skip_tokenizer_init",
)


NOT_DETERMINISTIC = (f"the server runs without {DETERMINISTIC} (its /server_info says so; the JSON report's "
                     "settings.server too): SGLang's deterministic inference and sglang-detspec are off there, so its "
                     "outputs may change with the batch; start it with detspec serve, which adds the flag")


def run_server(args: argparse.Namespace) -> int:
    """The server audit for parsed ``args``: 0 when every section passes, 1 when one fails, 2 on a server error."""
    # Only what talking to a server needs: no torch, no transformers on this path.
    import dataclasses

    from ..auditing.http_backend import HttpBackend, HttpBackendError, avg_spec_accept_length

    timeout = DEFAULT_TIMEOUT_S if args.timeout is None else args.timeout
    concurrency = DEFAULT_CONCURRENCY if args.concurrency is None else args.concurrency
    encoding = args.seed_encoding or "uint64"
    seed_checks = True if args.seed_checks is None else args.seed_checks
    with HttpBackend(args.url, timeout=timeout, concurrency=concurrency, seed_encoding=encoding) as backend:
        try:
            # Asked first so an unreachable server, or something that is not SGLang, fails at once.
            info = backend.server_info()
        except HttpBackendError as exc:
            return fail(str(exc), code="server", json_out=args.json == STDOUT)
        if info.get("enable_deterministic_inference") is False:
            # Not a failure by itself (auditing stock SGLang is a use), but the first thing to know when it fails.
            print(f"{PREFIX} warning: {NOT_DETERMINISTIC}", file=sys.stderr)
        from rich.console import Console

        from ..auditing.batch import build_plan
        from ..auditing.server_seeds import run_seed_checks
        from ._audit_report import print_batch_section, print_seed_section

        plan = build_plan(
            args.trials, seed=args.seed, max_new_tokens=args.max_new_tokens,
            vocab_size=args.vocab_size, max_batch=args.max_batch_size,
        )
        try:
            (summary,) = progress_runs([backend], plan)
        except HttpBackendError as exc:
            return fail(str(exc), code="server", json_out=args.json == STDOUT)
        try:
            # Asked after the trials (so the server's counters include them) and before the seed checks.
            server_accept = avg_spec_accept_length(backend.server_info())
        except HttpBackendError as exc:
            # The trials are done; report them without the server's figure.
            print(f"{PREFIX} warning: no average accept length from the server: {exc}", file=sys.stderr)
            server_accept = None
        seeds = None
        if seed_checks:
            try:
                seeds = run_seed_checks(
                    backend, plan.probe.prompt_ids, seed=args.seed, max_new_tokens=args.max_new_tokens
                )
            except HttpBackendError as exc:
                return fail(f"request-seed checks: {exc}", code="server", json_out=args.json == STDOUT)
    facts = {key: info.get(key) for key in _SERVER_FACTS}
    summary = dataclasses.replace(summary, server_avg_accept_length=server_accept)
    settings = {
        "url": args.url, "trials": args.trials, "max_new_tokens": args.max_new_tokens,
        "max_batch_size": args.max_batch_size, "seed": args.seed, "control": False,
        "vocab_size": args.vocab_size, "concurrency": concurrency, "timeout_s": timeout,
        "seed_encoding": encoding, "seed_checks": seed_checks, "server": facts,
    }
    draft = facts.get("speculative_num_draft_tokens")
    spec = f"{facts.get('speculative_algorithm') or 'no speculative decoding'}" + (
        f" (speculative_num_draft_tokens={draft})" if draft is not None else ""
    )
    console = Console(stderr=args.json == STDOUT)
    verdict, report = print_batch_section(console, args, plan, [summary], settings, f"server {args.url}, {spec}")
    sections = {"changing_batch": verdict.passed}
    if seeds is not None:
        sections["request_seeds"] = print_seed_section(console, seeds)
        report["request_seeds"] = seeds.to_json()
    return finish(console, args, report, sections)
