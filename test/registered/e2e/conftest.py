"""End-to-end suites: real SGLang servers on a CUDA GPU (skipped elsewhere by ../conftest.py).

Fixtures: ``models`` (model paths, the tiny models written once per module
unless given by the environment; see ``_e2e.py``) and ``servers`` (one server
at a time, stopped at the end of the module).
"""

import pytest

import _e2e


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
