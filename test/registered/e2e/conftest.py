"""End-to-end suites: real SGLang servers on a CUDA GPU (skipped elsewhere by ../conftest.py).

Fixtures: ``models`` (model paths, the tiny models written once per module
unless given by the environment; see ``_e2e.py``), ``servers`` (the module's
servers, stopped at the end of the module), and, for a module that sets
``FAMILY``, its deterministic server configs and vocabulary size.

Order: every test module here declares ``TEST_ORDER``, the names of its test
functions in the order they run (a module's servers start in that order, and
later checks reuse what earlier ones measured). Collection fails for a test
missing from it or a name in it that is not a test, so the order never
depends on where a test was defined or imported.
"""

import pytest

import _e2e

HERE = _e2e.Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> _e2e.Models:
    return _e2e.resolve_models(lambda: tmp_path_factory.mktemp("tiny_models"))


@pytest.fixture(scope="module")
def servers(request):
    pool = _e2e.Servers(label=request.module.__name__)
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


def _ordered(module, run: list) -> list:
    """``run`` (one module's items, collection order) sorted by the module's ``TEST_ORDER``."""
    order = getattr(module, "TEST_ORDER", None)
    if order is None:
        raise pytest.UsageError(f"{module.__name__}: an end-to-end module must declare TEST_ORDER")
    names = [getattr(item, "originalname", None) or item.name for item in run]
    unknown = sorted(set(names) - set(order))
    if unknown:
        raise pytest.UsageError(f"{module.__name__}: tests missing from TEST_ORDER: {', '.join(unknown)}")
    # Checked on the module, not on the items, which a -k selection may have thinned out.
    stale = [name for name in order if not (name.startswith("test") and callable(getattr(module, name, None)))]
    if stale:
        raise pytest.UsageError(f"{module.__name__}: TEST_ORDER names no test function {', '.join(stale)}")
    rank = {name: i for i, name in enumerate(order)}
    # Stable: the parametrized cases of one test keep their order.
    return [item for _, item in sorted(enumerate(run), key=lambda p: (rank[names[p[0]]], p[0]))]


def pytest_collection_modifyitems(config, items):
    # The hook sees every item of the session: reorder only this folder's modules, each
    # within its own contiguous run of items.
    out, i = [], 0
    while i < len(items):
        module = getattr(items[i], "module", None)
        j = i
        while j < len(items) and getattr(items[j], "module", None) is module:
            j += 1
        here = module is not None and _e2e.Path(getattr(module, "__file__", "") or "").resolve().parent == HERE
        out.extend(_ordered(module, items[i:j]) if here else items[i:j])
        i = j
    items[:] = out


def pytest_terminal_summary(terminalreporter):
    if _e2e.out_dir.cache_info().currsize:  # only when some test wrote results
        terminalreporter.write_line(f"detspec e2e results: {_e2e.out_dir()}")
