"""End-to-end suites: real SGLang servers on a CUDA GPU (skipped elsewhere by ../conftest.py).

Fixtures: ``models`` (model paths, the tiny models written once per module
unless given by the environment; see ``_e2e.py``), ``servers`` (one server
at a time, stopped at the end of the module), and, for a module that sets
``FAMILY``, its deterministic server configs and vocabulary size.
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


@pytest.fixture(scope="module")
def det_cuda_graph(request, models):
    return _e2e.server_config(request.module.FAMILY, models, deterministic=True, cuda_graph=True)


@pytest.fixture(scope="module")
def det_no_cuda_graph(request, models):
    return _e2e.server_config(request.module.FAMILY, models, deterministic=True, cuda_graph=False)


@pytest.fixture(scope="module")
def vocab(request, models):
    return _e2e.vocab_size(_e2e.served_model(request.module.FAMILY, models))


def pytest_terminal_summary(terminalreporter):
    if _e2e.out_dir.cache_info().currsize:  # only when some test wrote results
        terminalreporter.write_line(f"detspec e2e results: {_e2e.out_dir()}")
