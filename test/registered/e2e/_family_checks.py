"""Checks every deterministic server family runs, shared by the family test files.

A family's test file sets ``FAMILY`` (a key of ``_e2e.FAMILIES``), imports
these by name and lists them in its ``TEST_ORDER``: the CUDA-graph audit
first (it starts the server, which the file's own tests may reuse), then the
audit of a restarted server without CUDA graphs, then the comparison of the
two (which reuses both memoised audits).
"""

import _e2e


def test_deterministic_with_cuda_graphs(request, servers, det_cuda_graph, vocab):
    run = _e2e.run_audit(servers, det_cuda_graph, vocab)
    _e2e.check_deterministic_audit(run, f"{request.module.FAMILY}_det_cuda_graph_audit")


def test_deterministic_without_cuda_graphs_after_restart(request, servers, det_no_cuda_graph, vocab):
    run = _e2e.run_audit(servers, det_no_cuda_graph, vocab)
    _e2e.check_deterministic_audit(run, f"{request.module.FAMILY}_det_no_cuda_graph_audit")


def test_same_tokens_with_cuda_graphs_on_and_off(request, servers, det_cuda_graph, det_no_cuda_graph, vocab):
    # Memoised audits: no server starts here unless a test above was deselected.
    runs = [_e2e.run_audit(servers, config, vocab) for config in (det_cuda_graph, det_no_cuda_graph)]
    _e2e.check_same_tokens(runs, f"{request.module.FAMILY}_same_tokens_cuda_graph_on_off_restart")


FAMILY_CHECKS = (
    "test_deterministic_with_cuda_graphs",
    "test_deterministic_without_cuda_graphs_after_restart",
    "test_same_tokens_with_cuda_graphs_on_and_off",
)
