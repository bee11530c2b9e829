"""What ``detspec audit`` shows: the tables and verdict lines, the progress bar, the JSON and the last line.

Each ``print_*`` function prints its section with rich on ``console`` and
returns whether the section passed; ``detspec audit --help`` explains every
column. :func:`progress_runs` and :func:`finish` serve both runners
(:mod:`._audit_local`, :mod:`._audit_server`).
"""

from __future__ import annotations

import argparse
import json
import sys

from rich.console import Console
from rich.table import Table
from rich.text import Text

# audit.py imports this module and the runners only inside run(), so this import makes no cycle.
from ._audit_common import STDOUT


def _plain(console: Console, text: str) -> None:
    # Server and engine messages may hold [brackets] that rich markup would eat.
    console.print(text, markup=False, highlight=False)


def _verdict_line(console: Console, passed: bool, message: str) -> None:
    colour = "green" if passed else "red"
    status, _, rest = message.partition(":")
    # One line, never hard-wrapped: a verdict stays whole for grep and copy (a terminal wraps it).
    console.print(Text.assemble((f"{status}:", f"bold {colour}"), rest), highlight=False, soft_wrap=True)


def _logprob_cell(summary) -> str:
    if summary.unique_probe_logprobs is None:
        return "n/a"
    if summary.probe_logprobs_identical:
        return "bitwise equal"
    return f"{summary.unique_probe_logprobs} distinct"


def print_batch_section(console: Console, args: argparse.Namespace, plan, summaries, settings: dict, setup: str):
    """The changing-batch table, notes and verdict.

    Returns:
        ``(verdict, report)``: the :class:`~sglang_detspec.auditing.batch.Verdict`
        and the JSON-ready report of :func:`~sglang_detspec.auditing.batch.build_report`.
    """
    from ..auditing.batch import build_report, judge

    sizes = [t.num_requests for t in plan.trials]
    kinds = list(dict.fromkeys(t.kind for t in plan.trials))
    table = Table(
        title=f"changing batch: {len(plan.trials)} trials, batch sizes {min(sizes)}-{max(sizes)} "
        f"({', '.join(kinds)})\n{setup}, {args.max_new_tokens} new tokens, seed {args.seed}"
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
            _plain(
                console,
                f"{s.backend}: the server's own average accept length is {s.server_avg_accept_length:.2f} "
                "(/server_info; all its traffic since start or the last cache flush)",
            )
    verdict = judge(summaries[0], summaries[1] if len(summaries) > 1 else None,
                    bitwise_logprobs=bool(getattr(args, "bitwise_logprobs", None)))
    for note in verdict.notes:
        console.print("[yellow]note:[/] ", end="")
        _plain(console, note)
    _verdict_line(console, verdict.passed, verdict.message)
    return verdict, build_report(plan, summaries, verdict, settings)


def _figure(value, fmt: str = ".2f") -> str:
    return "n/a" if value is None else format(value, fmt)


def print_invariance_section(console: Console, reports: dict, mode: str) -> bool:
    """The invariance table of ``reports[mode]``, with the other mode's unique-output count beside it.

    Args:
        reports: verify mode -> :class:`~sglang_detspec.auditing.invariance.InvarianceReport`,
            ``mode`` included.
        mode: the audited mode.

    Returns:
        ``reports[mode].passed``.
    """
    report = reports[mode]
    others = {m: r for m, r in reports.items() if m != mode}
    table = Table(title=f"invariance: {mode} verify, the same seeded requests under every configuration",
                  pad_edge=False)
    # Short headers so the table fits 80 columns (piped output); `detspec audit --help` explains each.
    headers = ["config", "unique", "accept len", "accept", "bound", "1-TV", "tested"]
    for m in others:
        headers.append(f"{m} unique")
    for header in headers:
        if header == "config":
            table.add_column(header, min_width=10)  # long names wrap on their spaces: the figures must not
        else:
            # Headers fold, figures (at most 5 characters) never do.
            table.add_column(header, justify="right", overflow="fold", min_width=5)
    other_rows = {m: {row.name: row for row in r.rows} for m, r in others.items()}
    for row in report.rows:
        if row.available:
            cells = [
                row.name, str(row.unique_outputs), _figure(row.mean_accept_length),
                _figure(row.acceptance_rate, ".3f"), _figure(row.coupled_bound, ".3f"), _figure(row.one_minus_tv, ".3f"),
                str(row.tested_positions),
            ]
        else:
            cells = [row.name, "n/a", "n/a", "n/a", "n/a", "n/a", "n/a"]
        for m in others:
            match = other_rows[m].get(row.name)
            cells.append("n/a" if match is None or not match.available else str(match.unique_outputs))
        table.add_row(*cells)
    console.print(table)
    _plain(console, "accept is measured over the tested draft tokens; bound and 1-TV are the expected rates "
                    "over the same tokens, so a small sample can fall on either side of them")
    for row in report.rows:
        if not row.available and row.note:
            _plain(console, f"{row.name}: {row.note}")
    beside = "; ".join(f"{m} verify: {r.unique_outputs} across the same configurations" for m, r in others.items())
    message = (
        f"{'PASS' if report.passed else 'FAIL'}: {report.unique_outputs} unique output(s) across all "
        f"configurations with {mode} verify" + (f" ({beside})" if beside else "")
    )
    _verdict_line(console, report.passed, message)
    if mode == "rejection" and not report.passed:
        _plain(console, "expected: rejection sampling's tokens depend on the drafter; coupled verify "
                        "(--mode coupled, the default) is the drafter-invariant mode")
    return report.passed


def print_seed_section(console: Console, report) -> bool:
    """The request-seed checks of a server (:class:`~sglang_detspec.auditing.server_seeds.SeedReport`).

    Returns:
        ``report.passed``.
    """
    table = Table(title=f"request seeds (sampling_seed {report.seed})")
    for header in ("check", "result", "what the server did"):
        table.add_column(header, justify="left")
    for check in report.checks:
        table.add_row(check.name, "[green]pass[/]" if check.passed else "[red]FAIL[/]", check.detail)
    console.print(table)
    if report.derived_seeds_match is not None:
        _plain(
            console,
            "the samples' reported seeds "
            + ("equal" if report.derived_seeds_match else "differ from")
            + " derive_sample_seed(seed, j) (docs/design.md section 6)",
        )
    failed = [c.name for c in report.checks if not c.passed]
    message = (
        f"PASS: all {len(report.checks)} request-seed checks held" if not failed
        else f"FAIL: {len(failed)} of {len(report.checks)} request-seed checks failed ({', '.join(failed)})"
    )
    _verdict_line(console, report.passed, message)
    return report.passed


def progress_runs(backends, plan) -> list:
    """Run ``plan`` on each backend behind a progress bar on stderr (stdout carries only the result)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from ..auditing.batch import run_plan

    summaries = []
    columns = (TextColumn("{task.description:>8}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True)) as progress:
        for backend in backends:
            task = progress.add_task(backend.name, total=len(plan.trials))
            summaries.append(run_plan(backend, plan, on_trial=lambda _outcome, t=task: progress.advance(t)))
    return summaries


def finish(console, args: argparse.Namespace, report: dict, sections: dict) -> int:
    """Record each section's outcome, write ``--json``, print the overall line; returns the exit code.

    ``report["passed"]`` is the whole audit's outcome and ``report["verdict"]``
    its line as printed, ``report["sections"]`` each section's (``message`` and
    ``notes`` stay the changing-batch section's).
    """
    passed = all(sections.values())
    failed = ", ".join(name.replace("_", " ") for name, ok in sections.items() if not ok)
    verdict = (f"audit passed: {', '.join(sections).replace('_', ' ')}" if passed else f"audit failed: {failed}")
    report["passed"] = passed
    report["verdict"] = verdict
    report["sections"] = dict(sections)
    if args.json == STDOUT:
        sys.stdout.write(json.dumps(report, indent=2) + "\n")
        sys.stdout.flush()
    elif args.json is not None:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        console.print(f"wrote {args.json}", markup=False, highlight=False)
    head, rest = verdict.split(":", 1)
    console.print(f"[bold {'green' if passed else 'red'}]{head}[/]:{rest}")
    return 0 if passed else 1
