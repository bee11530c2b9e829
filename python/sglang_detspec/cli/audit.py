"""``detspec audit``: does a seeded request give the same tokens in every batch?

Runs the probe request of :func:`sglang_detspec.audit.build_plan` in batches of
changing size, order and split on the in-process reference engine, once with
the keyed sampler and (unless ``--no-control``) once with the global-RNG
control, and reports the number of unique probe outputs and the mean accept
length of each. Exit code 0 when the seeded run gives exactly one unique
probe output, 1 otherwise, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

U64 = 1 << 64
DEFAULT_TRIALS = 25  # the solo trial plus 8 complete (batch, permuted, split) groups
DEFAULT_MAX_NEW_TOKENS = 16
DEFAULT_NUM_DRAFT_TOKENS = 3
DEFAULT_MAX_BATCH = 32


def _int_in(low: int, high: int | None = None, high_text: str | None = None):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low or (high is not None and value >= high):
            bound = f">= {low}" if high is None else f"in [{low}, {high_text or high})"
            raise argparse.ArgumentTypeError(f"must be {bound}, got {value}")
        return value

    return parse


def _json_path(text: str) -> Path:
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
            "1 for the seeded sampler, many for the global-RNG control."
        ),
    )
    parser.add_argument(
        "--trials", type=_int_in(1), default=DEFAULT_TRIALS, metavar="N",
        help=f"number of trials (default {DEFAULT_TRIALS})",
    )
    parser.add_argument(
        "--max-new-tokens", type=_int_in(1), default=DEFAULT_MAX_NEW_TOKENS, metavar="N",
        help=f"tokens generated for the probe request (default {DEFAULT_MAX_NEW_TOKENS})",
    )
    parser.add_argument(
        "--num-draft-tokens", "-k", type=_int_in(1), default=DEFAULT_NUM_DRAFT_TOKENS, metavar="K",
        help=f"draft tokens per speculative round (default {DEFAULT_NUM_DRAFT_TOKENS})",
    )
    parser.add_argument(
        "--max-batch-size", type=_int_in(2), default=DEFAULT_MAX_BATCH, metavar="B",
        help=f"largest batch in the schedule (default {DEFAULT_MAX_BATCH})",
    )
    parser.add_argument(
        "--seed", type=_int_in(0, U64, "2**64"), default=0,
        help="probe sampling_seed, schedule seed and control RNG seed, in [0, 2**64) (default 0)",
    )
    parser.add_argument("--json", type=_json_path, metavar="PATH", help="write the full result as JSON to PATH")
    parser.add_argument(
        "--control", action=argparse.BooleanOptionalAction, default=True,
        help="also run the global-RNG control engine (default: on)",
    )
    parser.set_defaults(handler=run)
    return parser


def run(args: argparse.Namespace) -> int:
    """Run the audit for parsed ``args``; returns the exit code (0 pass, 1 fail)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from ..audit import build_plan, build_report, judge, run_plan
    from ..reference import ReferenceEngine, build_model_pair

    console = Console()
    models = build_model_pair()
    k = args.num_draft_tokens
    plan = build_plan(
        args.trials, seed=args.seed, max_new_tokens=args.max_new_tokens,
        vocab_size=models.vocab_size, max_batch=args.max_batch_size,
    )
    engines = [ReferenceEngine(models, k)]
    if args.control:
        engines.append(ReferenceEngine.control(models, k, seed=args.seed))

    summaries = []
    columns = (TextColumn("{task.description:>8}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    # The bar goes to stderr so stdout carries only the result.
    with Progress(*columns, console=Console(stderr=True)) as progress:
        for engine in engines:
            task = progress.add_task(engine.name, total=len(plan.trials))
            summaries.append(run_plan(engine, plan, on_trial=lambda _outcome, t=task: progress.advance(t)))

    sizes = [t.num_requests for t in plan.trials]
    kinds = list(dict.fromkeys(t.kind for t in plan.trials))
    table = Table(
        title=f"{len(plan.trials)} trials, batch sizes {min(sizes)}-{max(sizes)} ({', '.join(kinds)})\n"
        f"K={k} draft tokens, {args.max_new_tokens} new tokens, seed {args.seed}"
    )
    for header in ("run", "unique probe outputs", "mean accept len", "varying requests", "time"):
        table.add_column(header, justify="left" if header == "run" else "right")
    for s in summaries:
        table.add_row(
            s.backend, str(s.unique_probe_outputs), f"{s.mean_accept_length:.2f}",
            f"{s.varying_requests}/{s.num_requests}", f"{s.wall_time_s:.1f} s",
        )
    console.print(table)

    verdict = judge(summaries[0], summaries[1] if len(summaries) > 1 else None)
    if args.json is not None:
        settings = {
            "trials": args.trials, "max_new_tokens": args.max_new_tokens, "num_draft_tokens": k,
            "max_batch_size": args.max_batch_size, "seed": args.seed, "control": args.control,
            "vocab_size": models.vocab_size,
        }
        report = build_report(plan, summaries, verdict, settings)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        console.print(f"wrote {args.json}", markup=False, highlight=False)
    for note in verdict.notes:
        console.print(f"[yellow]note:[/] {note}")
    colour = "green" if verdict.passed else "red"
    status, _, rest = verdict.message.partition(":")
    console.print(f"[bold {colour}]{status}[/]:{rest}")
    return 0 if verdict.passed else 1
