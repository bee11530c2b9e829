"""``detspec audit``: does a seeded request give the same tokens in every batch?

Runs the probe request of :func:`sglang_detspec.audit.build_plan` in batches of
changing size, order and split on the in-process reference engine, once with
the keyed sampler and (unless ``--no-control``) once with the global-RNG
control, and reports the number of unique probe outputs and the mean accept
length of each.

With ``--url`` the same trials run on a running SGLang server through its
``/generate`` endpoint (:class:`~sglang_detspec.http_backend.HttpBackend`),
and the report also says whether the probe's output logprobs were bitwise
equal across trials and gives the server's own average accept length. There
is no in-process control then: a server's control is a second server launched
without ``--enable-deterministic-inference``, audited with its own ``--url``.

Exit code 0 when the audited run gives exactly one unique probe output, 1
otherwise, 2 for bad arguments, an unreachable server or a server error.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from pathlib import Path
from urllib.parse import urlsplit

from ..audit import DEFAULT_MAX_BATCH, DEFAULT_MAX_NEW_TOKENS, DEFAULT_TRIALS, MAX_PROMPT_LEN, MIN_TRIALS_TO_JUDGE
from ..seed_encoding import SEED_ENCODINGS

DEFAULT_NUM_DRAFT_TOKENS = 3
# Bounds the cost of a run: the schedule decodes about trials * max_batch / 2 requests.
MAX_BATCH = 1024
DEFAULT_CONCURRENCY = 1
DEFAULT_TIMEOUT_S = 300.0
# Flags only a server run uses. They (and --num-draft-tokens, --control)
# default to None, meaning "not given", so run() can reject the ones that do
# not fit the mode instead of silently ignoring them.
_SERVER_ONLY = {
    "vocab_size": "--vocab-size", "concurrency": "--concurrency", "timeout": "--timeout",
    "seed_encoding": "--seed-encoding",
}


def _int_in(low: int, high: int | None = None, *, bound: str | None = None, why: str = ""):
    """An argparse type for ints in [low, high] (no upper bound when high is None).

    ``bound`` replaces the range in the error message; ``why`` is appended to it.
    """

    def parse(text: str) -> int:
        # Plain ASCII decimal only: int() would also take '1_000', ' 5' and non-ASCII digits.
        try:
            if not re.fullmatch(r"-?[0-9]+", text):
                raise ValueError(text)
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low or (high is not None and value > high):
            words = bound or (f">= {low}" if high is None else f"in [{low}, {high}]")
            raise argparse.ArgumentTypeError(f"must be {words}, got {value}" + (f": {why}" if why else ""))
        return value

    return parse


def _seed(text: str) -> int:
    # Imported on use: the ops package imports torch, which `detspec --help` must not wait for.
    from ..ops.streams import U64

    return _int_in(0, U64 - 1, bound="in [0, 2**64)")(text)


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value


def _url(text: str) -> str:
    try:
        parts = urlsplit(text)
        port = parts.port  # raises for a port that is not a number in [0, 65535]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected an http:// or https:// URL of the server, got {text!r}: {exc}") from None
    if port == 0:
        raise argparse.ArgumentTypeError(f"expected a port in [1, 65535], got {text!r}")
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise argparse.ArgumentTypeError(f"expected an http:// or https:// URL of the server, got {text!r}")
    if parts.query or parts.fragment:
        raise argparse.ArgumentTypeError(f"expected the server's base URL without a query or fragment, got {text!r}")
    return text.rstrip("/")


def _json_path(text: str) -> Path:
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a file path, got an empty string")
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a directory; give a file path")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise argparse.ArgumentTypeError(f"directory {str(parent)!r} does not exist")
    if not os.access(parent, os.W_OK):
        raise argparse.ArgumentTypeError(f"directory {str(parent)!r} is not writable")
    return path


def register(subparsers) -> argparse.ArgumentParser:
    """Add the ``audit`` subcommand to ``subparsers``."""
    parser = subparsers.add_parser(
        "audit",
        help="check that a seeded request gives the same tokens in every batch",
        description=(
            "Decode one probe request in batches of changing size, order and split with the "
            "in-process reference speculative decoding engine, and count its unique outputs: "
            "1 for the seeded sampler, many for the global-RNG control. With --url, run the same "
            "trials on a running SGLang server through its /generate endpoint instead."
        ),
    )
    parser.add_argument(
        "--trials", default=DEFAULT_TRIALS, metavar="N",
        type=_int_in(MIN_TRIALS_TO_JUDGE, why="one trial cannot show that the output does not depend on the batch"),
        help=f"number of trials, at least {MIN_TRIALS_TO_JUDGE} (default {DEFAULT_TRIALS})",
    )
    parser.add_argument(
        "--max-new-tokens", type=_int_in(1), default=DEFAULT_MAX_NEW_TOKENS, metavar="N",
        help=f"tokens generated for the probe request (default {DEFAULT_MAX_NEW_TOKENS}); in-process, "
        f"N + K + {MAX_PROMPT_LEN} (the longest prompt) must fit the reference models' positions",
    )
    parser.add_argument(
        "--num-draft-tokens", "-k", type=_int_in(1), default=None, metavar="K",
        help=f"draft tokens per speculative round of the in-process engine (default {DEFAULT_NUM_DRAFT_TOKENS})",
    )
    parser.add_argument(
        "--max-batch-size", type=_int_in(2, MAX_BATCH), default=DEFAULT_MAX_BATCH, metavar="B",
        help=f"largest batch in the schedule, 2 to {MAX_BATCH} (default {DEFAULT_MAX_BATCH})",
    )
    parser.add_argument(
        "--seed", type=_seed, default=0,
        help="probe sampling_seed, schedule seed and control RNG seed, in [0, 2**64) (default 0)",
    )
    parser.add_argument("--json", type=_json_path, metavar="PATH", help="write the full result as JSON to PATH")
    parser.add_argument(
        "--control", action=argparse.BooleanOptionalAction, default=None,
        help="also run the global-RNG control engine (default: on; in-process only)",
    )
    server = parser.add_argument_group("auditing a running SGLang server")
    server.add_argument(
        "--url", type=_url, metavar="URL",
        help="base URL of an SGLang server (e.g. http://127.0.0.1:30000) to audit instead of the in-process engine",
    )
    server.add_argument(
        "--vocab-size", type=_int_in(1), default=None, metavar="V",
        help="the served model's vocabulary size; prompt token ids are drawn from [0, V). "
        "Required with --url: SGLang's /server_info and /model_info do not report it",
    )
    server.add_argument(
        "--concurrency", type=_int_in(1), default=None, metavar="N",
        help=f"send each sub-batch as N concurrent /generate POSTs instead of one (default {DEFAULT_CONCURRENCY})",
    )
    server.add_argument(
        "--seed-encoding", choices=SEED_ENCODINGS, default=None,
        help="how sampling_seed values >= 2**63 are sent: uint64 as is (default; a server with "
        "sglang-detspec active admits [0, 2**64)) or int64 with the same bits (stock SGLang admits "
        "only [-2**63, 2**63))",
    )
    server.add_argument(
        "--timeout", type=_positive_seconds, default=None, metavar="S",
        help=f"seconds to wait for each HTTP request (default {DEFAULT_TIMEOUT_S:g})",
    )
    parser.set_defaults(handler=run)
    return parser


def _usage_error(args: argparse.Namespace) -> str | None:
    """Why this combination of flags cannot run, or None."""
    if args.url is None:
        given = [flag for name, flag in _SERVER_ONLY.items() if getattr(args, name) is not None]
        if given:
            return f"{', '.join(given)} can only be used with --url"
        return None
    if args.control:
        return (
            "--control is not available with --url: a server's control run is a second server launched "
            "without --enable-deterministic-inference; audit it with its own --url"
        )
    if args.num_draft_tokens is not None:
        return (
            "--num-draft-tokens sets the in-process engine; "
            "with --url the server's --speculative-num-draft-tokens applies"
        )
    if args.vocab_size is None:
        return (
            "--url needs --vocab-size: SGLang's /server_info and /model_info do not report the model's "
            "vocabulary size, and prompt token ids must lie in it (use vocab_size from the model's config.json)"
        )
    return None


def _fail(message: str) -> int:
    # Plain print, not rich: server messages may hold [brackets] rich would eat.
    print(f"detspec audit: error: {message}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    """Run the audit for parsed ``args``; returns the exit code (0 pass, 1 fail, 2 error)."""
    problem = _usage_error(args)
    if problem is not None:
        return _fail(problem)
    if args.url is not None:
        return _run_server(args)
    return _run_in_process(args)


def _progress_runs(backends, plan) -> list:
    """Run ``plan`` on each backend behind a progress bar on stderr (stdout carries only the result)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from ..audit import run_plan

    summaries = []
    columns = (TextColumn("{task.description:>8}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True)) as progress:
        for backend in backends:
            task = progress.add_task(backend.name, total=len(plan.trials))
            summaries.append(run_plan(backend, plan, on_trial=lambda _outcome, t=task: progress.advance(t)))
    return summaries


def _run_in_process(args: argparse.Namespace) -> int:
    from ..audit import build_plan
    from ..reference import ReferenceEngine, build_model_pair

    models = build_model_pair()
    k = DEFAULT_NUM_DRAFT_TOKENS if args.num_draft_tokens is None else args.num_draft_tokens
    room = models.max_positions - MAX_PROMPT_LEN
    if args.max_new_tokens + k > room:
        return _fail(
            f"--max-new-tokens + --num-draft-tokens must be at most {room} with the in-process engine "
            f"(with the longest prompt, {MAX_PROMPT_LEN} tokens, they must fit the reference models' "
            f"{models.max_positions} positions), got {args.max_new_tokens} + {k}"
        )
    control = True if args.control is None else args.control
    plan = build_plan(
        args.trials, seed=args.seed, max_new_tokens=args.max_new_tokens,
        vocab_size=models.vocab_size, max_batch=args.max_batch_size,
    )
    engines = [ReferenceEngine(models, k)]
    if control:
        engines.append(ReferenceEngine.control(models, k, seed=args.seed))
    summaries = _progress_runs(engines, plan)
    settings = {
        "trials": args.trials, "max_new_tokens": args.max_new_tokens, "num_draft_tokens": k,
        "max_batch_size": args.max_batch_size, "seed": args.seed, "control": control,
        "vocab_size": models.vocab_size,
    }
    return _report(args, plan, summaries, settings, f"K={k} draft tokens")


# Resolved server arguments worth keeping with a server audit (top-level keys of /server_info).
_SERVER_FACTS = (
    "version", "model_path", "speculative_algorithm", "speculative_num_steps",
    "speculative_num_draft_tokens", "enable_deterministic_inference", "skip_tokenizer_init",
)


def _run_server(args: argparse.Namespace) -> int:
    import dataclasses

    from ..audit import build_plan
    from ..http_backend import HttpBackend, HttpBackendError, avg_spec_accept_length

    timeout = DEFAULT_TIMEOUT_S if args.timeout is None else args.timeout
    concurrency = DEFAULT_CONCURRENCY if args.concurrency is None else args.concurrency
    plan = build_plan(
        args.trials, seed=args.seed, max_new_tokens=args.max_new_tokens,
        vocab_size=args.vocab_size, max_batch=args.max_batch_size,
    )
    encoding = args.seed_encoding or "uint64"
    with HttpBackend(args.url, timeout=timeout, concurrency=concurrency, seed_encoding=encoding) as backend:
        try:
            # Asked first so an unreachable server fails before any trial.
            info = backend.server_info()
            (summary,) = _progress_runs([backend], plan)
        except HttpBackendError as exc:
            return _fail(str(exc))
        try:
            # Asked after the trials so the server's counters include them.
            server_accept = avg_spec_accept_length(backend.server_info())
        except HttpBackendError as exc:
            # The trials are done; report them without the server's figure.
            print(f"detspec audit: warning: no average accept length from the server: {exc}", file=sys.stderr)
            server_accept = None
    facts = {key: info.get(key) for key in _SERVER_FACTS}
    summary = dataclasses.replace(summary, server_avg_accept_length=server_accept)
    settings = {
        "url": args.url, "trials": args.trials, "max_new_tokens": args.max_new_tokens,
        "max_batch_size": args.max_batch_size, "seed": args.seed, "control": False,
        "vocab_size": args.vocab_size, "concurrency": concurrency, "timeout_s": timeout,
        "seed_encoding": encoding, "server": facts,
    }
    draft = facts.get("speculative_num_draft_tokens")
    spec = f"{facts.get('speculative_algorithm') or 'no speculative decoding'}" + (
        f" (speculative_num_draft_tokens={draft})" if draft is not None else ""
    )
    return _report(args, plan, [summary], settings, f"server {args.url}, {spec}")


def _report(args: argparse.Namespace, plan, summaries, settings: dict, setup: str) -> int:
    """Print the table, notes and verdict, write ``--json``; returns the exit code."""
    from rich.console import Console
    from rich.table import Table

    from ..audit import build_report, judge

    console = Console()
    sizes = [t.num_requests for t in plan.trials]
    kinds = list(dict.fromkeys(t.kind for t in plan.trials))
    table = Table(
        title=f"{len(plan.trials)} trials, batch sizes {min(sizes)}-{max(sizes)} ({', '.join(kinds)})\n"
        f"{setup}, {args.max_new_tokens} new tokens, seed {args.seed}"
    )
    with_logprobs = any(s.unique_probe_logprobs is not None for s in summaries)
    headers = ["run", "unique probe outputs", "mean accept len", "varying requests", "time"]
    if with_logprobs:
        headers.insert(2, "probe logprobs")
    for header in headers:
        table.add_column(header, justify="left" if header == "run" else "right")
    for s in summaries:
        row = [
            s.backend, str(s.unique_probe_outputs),
            "n/a" if s.mean_accept_length is None else f"{s.mean_accept_length:.2f}",
            f"{s.varying_requests}/{s.num_requests}", f"{s.wall_time_s:.1f} s",
        ]
        if with_logprobs:
            row.insert(2, _logprob_cell(s))
        table.add_row(*row)
    console.print(table)
    for s in summaries:
        if s.server_avg_accept_length is not None:
            console.print(
                f"{s.backend}: the server's own average accept length is {s.server_avg_accept_length:.2f} "
                "(/server_info; all its traffic since start or the last cache flush)",
                markup=False, highlight=False,
            )

    verdict = judge(summaries[0], summaries[1] if len(summaries) > 1 else None)
    if args.json is not None:
        report = build_report(plan, summaries, verdict, settings)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        console.print(f"wrote {args.json}", markup=False, highlight=False)
    for note in verdict.notes:
        console.print(f"[yellow]note:[/] {note}")
    colour = "green" if verdict.passed else "red"
    status, _, rest = verdict.message.partition(":")
    console.print(f"[bold {colour}]{status}[/]:{rest}")
    return 0 if verdict.passed else 1


def _logprob_cell(summary) -> str:
    if summary.unique_probe_logprobs is None:
        return "n/a"
    if summary.probe_logprobs_identical:
        return "bitwise equal"
    return f"{summary.unique_probe_logprobs} distinct"
