"""End-to-end suites: real SGLang servers on a CUDA GPU; skipped, with the reason, anywhere else.

Fixtures: ``models`` (model paths, the tiny models written once per module
unless given by the environment; see ``_e2e.py``) and ``servers`` (one server
at a time, stopped at the end of the module).
"""

from pathlib import Path

import pytest

import _e2e

HERE = Path(__file__).resolve().parent


def _skip_reason() -> str | None:
    try:
        import torch
    except ImportError:
        return "needs torch and a CUDA GPU: these tests launch real SGLang servers"
    if not torch.cuda.is_available():
        return (
            "needs a CUDA GPU: these tests launch real SGLang servers (CUDA graphs, Triton attention, "
            "deterministic rejection sampling run only on CUDA)"
        )
    return None


def pytest_collection_modifyitems(config, items):
    # This hook sees every item of the session, not only this folder's: mark ours only.
    reason = _skip_reason()
    if reason is None:
        return
    for item in items:
        if HERE in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> _e2e.Models:
    return _e2e.resolve_models(lambda: tmp_path_factory.mktemp("tiny_models"))


@pytest.fixture(scope="module")
def servers():
    pool = _e2e.Servers()
    yield pool
    pool.stop()


def pytest_terminal_summary(terminalreporter):
    if _e2e.out_dir.cache_info().currsize:  # only when some test wrote results
        terminalreporter.write_line(f"detspec e2e results: {_e2e.out_dir()}")
