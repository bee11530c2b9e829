"""GPU folders where their hardware is missing, and runs in which no test ran.

``cuda/`` holds the Triton kernel suite, ``e2e/`` launches real SGLang
servers; ``unit/`` runs everywhere. Where a GPU folder's needs are missing,
its files are left out of collection (their imports may need torch or
Triton), or, when named one by one, their tests are skipped; either way with
the stated reason.

A run in which no test ran (all left out or skipped) ends with a line
saying nothing ran and exit status 5, pytest's own "no tests ran"
status, instead of 0: a GPU suite that checked nothing must not pass as a
run. ``make test-gpu`` and ``make test-e2e`` on a machine without a GPU end
that way.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
NOTHING_RAN = pytest.ExitCode.NO_TESTS_COLLECTED


def _cuda_reason(what: str) -> str | None:
    try:
        import torch
    except ImportError:
        return f"needs torch and a CUDA GPU: {what}"
    if not torch.cuda.is_available():
        return f"needs a CUDA GPU: {what}"
    return None


def _kernel_reason() -> str | None:
    reason = _cuda_reason("the Triton kernels run only on CUDA")
    if reason is None:
        try:
            import triton  # noqa: F401
        except ImportError:
            reason = "needs Triton"
    return reason


def _server_reason() -> str | None:
    return _cuda_reason(
        "these tests launch real SGLang servers (CUDA graphs, Triton and FA3 attention, "
        "SGLang's deterministic speculative decoding runs only on CUDA)"
    )


GPU_FOLDERS = {"cuda": _kernel_reason, "e2e": _server_reason}


@functools.cache
def _missing(folder: str) -> str | None:
    """Why ``folder``'s tests cannot run here, or None (also None for a folder that needs no GPU)."""
    return GPU_FOLDERS[folder]() if folder in GPU_FOLDERS else None


def _folder(path) -> str | None:
    """The first folder under this one that ``path`` lies in, or None."""
    path = Path(str(path)).resolve()
    if not path.is_relative_to(HERE) or path == HERE:
        return None
    parts = path.relative_to(HERE).parts
    return parts[0] if len(parts) > 1 or path.is_dir() else None


_left_out: dict[str, str] = {}  # folder -> why its tests did not run
_ran = 0


def _asked_for(path, config) -> bool:
    """True when ``path`` lies in, or holds, a path named on the command line (pytest also visits others)."""
    path = Path(str(path)).resolve()
    for arg in config.args:
        named = Path(config.invocation_params.dir, arg.split("::", 1)[0]).resolve()
        if path.is_relative_to(named) or named.is_relative_to(path):
            return True
    return False


def pytest_ignore_collect(collection_path, config):
    folder = _folder(collection_path)
    reason = _missing(folder) if folder else None
    if reason is None:
        return None
    if _asked_for(collection_path, config):
        _left_out[folder] = reason
    return True


def pytest_collection_modifyitems(config, items):
    # Files named on the command line are collected regardless of pytest_ignore_collect.
    for item in items:
        folder = _folder(item.path)
        reason = _missing(folder) if folder else None
        if reason:
            _left_out[folder] = reason
            item.add_marker(pytest.mark.skip(reason=reason))


def pytest_runtest_logreport(report):
    global _ran
    # A test body that ran: passed, failed, or an expected failure (reported as skipped).
    if report.when == "call" and (not report.skipped or hasattr(report, "wasxfail")):
        _ran += 1


_said_nothing_ran = False


def pytest_sessionfinish(session, exitstatus):
    global _said_nothing_ran
    # Failures, errors and interruptions keep their own status; --collect-only runs nothing by design.
    if _ran == 0 and exitstatus in (pytest.ExitCode.OK, NOTHING_RAN) and not session.config.option.collectonly:
        session.exitstatus = NOTHING_RAN
        _said_nothing_ran = True


def pytest_terminal_summary(terminalreporter):
    # Runs after pytest_sessionfinish above (inside the terminal reporter's own sessionfinish).
    for folder, reason in sorted(_left_out.items()):
        terminalreporter.write_line(f"detspec: {folder}/ tests not run: {reason}")
    if _said_nothing_ran:
        terminalreporter.write_line(f"detspec: nothing ran; exit status {int(NOTHING_RAN)}", bold=True)
