"""``detspec audit`` in process: the changing-batch trials and the invariance section on the reference engine."""

from __future__ import annotations

import argparse
import os

from ._audit_report import finish, progress_runs
from ._audit_common import DEFAULT_NUM_DRAFT_TOKENS, STDOUT


def kernel_problem() -> str | None:
    """Why the ``SGLANG_DETSPEC_KERNEL`` setting cannot run the in-process audit, or None."""
    from ..config import KERNEL_ENV, env_settings

    if env_settings()["kernel"] != "triton":
        return None
    # The reference engine keeps its tensors on the CPU, and the Triton kernels take CUDA tensors only.
    return (
        f"{KERNEL_ENV}=triton cannot run the in-process audit: the reference engine decodes on the CPU and "
        f"the Triton kernels need CUDA tensors; unset it or set it to torch (the Triton kernels run inside an "
        f"SGLang server: audit one with --url)"
    )


def in_process_mode(args: argparse.Namespace) -> tuple[str, str]:
    """The in-process engine's verify mode and where it came from: --mode, else the environment.

    ``SGLANG_DETSPEC_VERIFY=auto`` (or unset) gives coupled: the in-process
    engine has no rejection-sampling flag for auto to follow.

    Raises:
        ValueError: ``SGLANG_DETSPEC_VERIFY`` not in auto|coupled|rejection.
    """
    from ..config import VERIFY_ENV, env_settings, resolve_verify

    if args.mode is not None:
        return args.mode, "--mode"
    setting = env_settings()["verify"]
    given = os.environ.get(VERIFY_ENV, "").strip() != ""
    return resolve_verify(setting, False), (f"{VERIFY_ENV}={setting}" if given else "default")


def run_in_process(args: argparse.Namespace) -> int:
    """The in-process audit for parsed ``args``: exit code 0 when every section passes, else 1."""
    from rich.console import Console

    from ..auditing.batch import build_plan
    from ..reference import ReferenceEngine, build_model_pair
    from ._audit_report import print_batch_section, print_invariance_section

    models = build_model_pair()
    k = DEFAULT_NUM_DRAFT_TOKENS if args.num_draft_tokens is None else args.num_draft_tokens
    mode, mode_source = in_process_mode(args)
    mode_label = mode if mode_source == "default" else f"{mode} ({mode_source})"
    control = True if args.control is None else args.control
    invariance = True if args.invariance is None else args.invariance
    plan = build_plan(
        args.trials, seed=args.seed, max_new_tokens=args.max_new_tokens,
        vocab_size=models.vocab_size, max_batch=args.max_batch_size,
    )
    engines = [ReferenceEngine(models, k, verify=mode)]
    if control:
        engines.append(ReferenceEngine.control(models, k, seed=args.seed, verify=mode))
    summaries = progress_runs(engines, plan)
    settings = {
        "mode": mode, "mode_source": mode_source, "trials": args.trials,
        "max_new_tokens": args.max_new_tokens, "num_draft_tokens": k,
        "max_batch_size": args.max_batch_size, "seed": args.seed, "control": control,
        "invariance": invariance, "vocab_size": models.vocab_size,
    }
    console = Console(stderr=args.json == STDOUT)
    verdict, report = print_batch_section(
        console, args, plan, summaries, settings, f"{mode_label} verify, K={k} draft tokens"
    )
    sections = {"changing_batch": verdict.passed}
    if control and args.require_control_variation:
        # A control that never varied showed no batch dependence for the seeded run to be immune to.
        sections["control_varied"] = summaries[1].unique_probe_outputs > 1
    if invariance:
        reports = _run_invariance(models, mode, args)
        sections["invariance"] = print_invariance_section(console, reports, mode)
        report["invariance"] = {m: r.to_json() for m, r in reports.items()}
    return finish(console, args, report, sections)


def _run_invariance(models, mode: str, args: argparse.Namespace) -> dict:
    """The invariance reports: ``mode`` first, then the other mode for comparison (behind a spinner on stderr)."""
    from rich.console import Console

    from ..auditing.invariance import run_invariance

    other = "rejection" if mode == "coupled" else "coupled"
    reports = {}
    with Console(stderr=True).status("invariance: decoding the probes with every drafter"):
        for m in (mode, other):
            reports[m] = run_invariance(models, mode=m, seed=args.seed, max_new_tokens=args.max_new_tokens)
    return reports
