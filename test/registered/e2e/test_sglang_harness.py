"""SGLang's own determinism harness (``sglang.test.test_deterministic``) against the plugin's servers.

The harness is what a user of SGLang runs to check deterministic inference;
this suite runs it, unchanged, on the servers the plugin ships:

* ``no_spec``: no speculative decoding;
* ``coupled_chain``: coupled chain EAGLE (3 steps);
* ``coupled_tree``: the default coupled tree (3 steps, top-k 4, 8 tokens,
  SGLang's tree verify attention);
* ``eagle3_tree``: the same tree with the EAGLE3 draft over a reduced
  vocabulary;

each on every backend of ``DETSPEC_E2E_BACKENDS`` (``triton``, ``fa3``,
comma-separated; unset: both, fa3 where sgl-kernel's FA3 library loads), and
on fa3 ``no_spec``, ``coupled_chain`` and ``coupled_tree`` again with the
target read as 2 heads of size 128 (``..._head128``: the same weights; there
the servers that verify no trees keep SGLang's own FA3 calls, the tree runs
the split, and each must log which), with ``coupled_tree_switch_nodes``
beside them there (the tree drafting a chain above 3 requests, on SGLang's
FA3 calls with its trees verified one decode query per node: the serving
benchmark's (o), which must log the node path), all servers at once, with
a tokenizer (the harness sends text) and SGLang's own prefill CUDA-graph
choice (also where ``DETSPEC_E2E_SERVER_ARGS`` turns them off for the other
suites). The tiny models are written at a 128,256-token vocabulary
(``_harness_plan.VOCAB``: ``radix_cache`` sends ids up to 50,000) with the
target's attention output at about the residual's size
(``make_tiny_models.ATTENTION_VISIBLE_SCALE``: at the default scale one bit of
an attention output seldom reaches a logit, and ``p_vs_d`` is about the
attention path), in ``<DETSPEC_E2E_MODELS>/vocab128256-attention8``.

Per server the modes ``single`` (8 trials), ``prefix`` (8 trials, with
logprobs), ``radix_cache`` and ``p_vs_d`` (4 trials: 10 sequences, 3 of
them long prompts) run in that order through the harness's own
``test_deterministic``, in a spawned process per server
(``_harness_run.py``: the harness uses the global ``random`` and prints).

``sglang_harness.json`` in the result folder: ``{"date_utc", "machine",
"rows": [{"backend", "server", "mode", "results", "passed", "claimed",
"asserted", "trials", "expected_results", "logprobs_identical", "error",
"log"}], "passed", "problems", "servers"}``, ``results`` the harness's own
return value, ``passed`` from it (``_harness_plan.mode_passed``), the
harness's printout in ``harness_<server>.log``. Every row is recorded; the
test fails on the rows it asserts (``_harness_plan.asserted``: ``single``
and ``prefix`` everywhere, ``radix_cache`` and ``p_vs_d`` where the server
claims ``bitwise``), on a server that does not start, and where the plugin's
start-up claim is not its settings bag's (``_harness_plan.server_bag``: the
family's flags and environment, ``config.logits_guarantee``), and on a
node-path server that does not log the node path.
"""

import dataclasses
import json
import multiprocessing
import os
import shutil
import sys
import time
from pathlib import Path

import pytest

import _e2e
import _forward_plan
import _harness_plan as plan
import _harness_run
from _register import register_cuda_ci

from sglang_detspec.model_family import head_dim_of
from sglang_detspec.sglang_plugin.startup_notes import DEFAULTS_TAKEN_LOG

register_cuda_ci(est_time=480, suite="detspec-e2e-cuda")

BACKENDS = plan.selected_backends()
# The traffic of all servers at once (measured servers take well under a minute each).
TRAFFIC_TIMEOUT_S = 300
TEST_ORDER = ("test_sglang_harness",)


@pytest.fixture(scope="module")
def harness_models(tmp_path_factory) -> _e2e.Models:
    base = os.environ.get("DETSPEC_E2E_MODELS")
    return _e2e.tiny_models_with_vocab(Path(base) if base else tmp_path_factory.mktemp("tiny_models"), plan.VOCAB,
                                       attention_scale=_e2e.tiny_models_script().ATTENTION_VISIBLE_SCALE)


def wide_head_target(models: _e2e.Models) -> str:
    """The harness target read as ``plan.WIDE_HEADS`` heads of ``plan.WIDE_HEAD_DIM`` (same weights), beside it.

    Its folder links the target's files and writes its own ``config.json``
    (``plan.wide_head_config``), once.
    """
    source = Path(models.target)
    folder = source.parent / f"{source.name}{plan.WIDE_SUFFIX}"
    if not (folder / "config.json").is_file():
        staging = source.parent / f".{folder.name}.{os.getpid()}"
        staging.mkdir(parents=True, exist_ok=True)
        for item in source.iterdir():
            if item.name != "config.json":
                (staging / item.name).symlink_to(item.resolve())
        config = json.loads((source / "config.json").read_text())
        (staging / "config.json").write_text(json.dumps(plan.wide_head_config(config), indent=1))
        try:
            os.rename(staging, folder)
        except OSError:  # another process wrote it first
            shutil.rmtree(staging, ignore_errors=True)
    return str(folder)


def server_configs(models: _e2e.Models, backends) -> dict:
    """(backend, server label) -> the :class:`_e2e.ServerConfig` of every server the suite starts.

    On ``plan.WIDE_HEAD_BACKEND`` the servers of ``plan.WIDE_HEAD_SERVERS`` also
    serve the wide-head target (labels ending in ``plan.WIDE_SUFFIX``).
    """
    plans = [(backend, label, models, "") for backend in backends for label in plan.SERVERS]
    if plan.WIDE_HEAD_BACKEND in backends:
        wide = dataclasses.replace(models, target=wide_head_target(models))
        plans += [(plan.WIDE_HEAD_BACKEND, label, wide, plan.WIDE_SUFFIX) for label in plan.WIDE_HEAD_SERVERS]
    configs = {}
    for backend, label, served, suffix in plans:
        config = _e2e.server_config(label, served, extra_args=("--attention-backend", backend),
                                    tag=f"harness_{backend}{suffix}", tokenizer=True)
        configs[(backend, label + suffix)] = dataclasses.replace(
            config, args=plan.without_flag(config.args, plan.PREFILL_GRAPH_FLAG))
    return configs


def claim_problems(backend: str, label: str, server) -> tuple[str | None, list[str]]:
    """The server's logged claim and what is wrong with its start-up lines (the FA3 path it logs included)."""
    claims = _e2e.claimed_logits(server)
    head_dim = head_dim_of(server.config.model)
    bag = plan.server_bag(backend, label, {**os.environ, **dict(server.config.env)}, head_dim)
    problems = _e2e.plugin_problems(server)
    if claims != [bag.logits]:
        problems.append(f"{backend} {label}: the plugin logged logits={claims}, expected [{bag.logits!r}]")
    if backend == "fa3":
        problem = _e2e.fa3_path_problem(server, bag.decode_attention, head_dim, bag.verifies_trees)
        problems += [problem] if problem else []
    if bag.node_path_verifies:
        problem = _e2e.node_path_problem(server)
        problems += [f"{backend} {label}: {problem}"] if problem else []
    if bag.fa3_defaults_taken and not server.log_lines(DEFAULTS_TAKEN_LOG):
        problems.append(f"{backend} {label}: no start-up note {DEFAULTS_TAKEN_LOG!r} for the FA3 tree defaults it "
                        f"takes ({', '.join(bag.fa3_defaults_taken)})")
    return (claims[0] if len(claims) == 1 else None), problems


def measure(servers, models, backends) -> tuple[list[dict], list[str], dict]:
    configs = server_configs(models, backends)
    started = servers.ensure_group(list(configs.values()))
    problems, pending = [], {}
    # Spawned, not forked: this process runs the servers' log reader threads.
    # One task per worker, so no worker takes a second server after its first.
    with multiprocessing.get_context("spawn").Pool(len(configs), maxtasksperchild=1) as pool:
        for key, config in configs.items():
            server = started[config.name]
            if isinstance(server, str):
                problems.append(server)
                continue
            log = _e2e.out_dir() / f"harness_{config.name}.log"
            pending[key] = (log.name, pool.apply_async(_harness_run.run_modes, (server.url, plan.MODES, str(log))))
        deadline = time.monotonic() + TRAFFIC_TIMEOUT_S
        outcomes = {}
        for key, (log, job) in pending.items():
            try:
                outcomes[key] = (log, job.get(timeout=max(1.0, deadline - time.monotonic())))
            except multiprocessing.TimeoutError:
                outcomes[key] = (log, [plan.ModeOutcome(m, (), f"no answer within {TRAFFIC_TIMEOUT_S} s")
                                       for m in plan.MODES])
            except Exception as exc:  # the worker itself failed (e.g. an import): every mode of that server
                outcomes[key] = (log, [plan.ModeOutcome(m, (), f"worker: {type(exc).__name__}: {exc}"[:500])
                                       for m in plan.MODES])
        # Leaving the block terminates the pool: a worker still waiting on a hung server stops too.
    rows = []
    for (backend, label), config in configs.items():
        server = started[config.name]
        claim = None
        if not isinstance(server, str):
            claim, found = claim_problems(backend, label, server)
            problems += found
        log, modes = outcomes.get((backend, label), (None, [plan.ModeOutcome(m, (), f"{config.name} did not start")
                                                           for m in plan.MODES]))
        rows += [plan.row(backend, label, outcome, claim, log) for outcome in modes]
    facts = {name: {"error": server} if isinstance(server, str) else server.facts() for name, server in started.items()}
    return rows, problems + plan.failures(rows), facts


def test_sglang_harness(servers, harness_models):
    if "fa3" in BACKENDS and not _e2e.fa3_installed():
        pytest.fail(f"{_forward_plan.BACKENDS_ENV} names fa3, but sgl-kernel's FA3 library is not installed "
                    "(or does not load)")
    rows, problems, facts = measure(servers, harness_models, BACKENDS)
    machine = _e2e.machine_facts()
    doc = plan.document(rows, machine["date_utc"], machine.get("gpu") or "unknown GPU", passed=not problems,
                        problems=problems, servers=facts, facts=machine,
                        # The suite's; a family env overrides it, and so does the FA3 tree default (each server's
                        # start-up line, in its log, says what it ran).
                        decode_attention=_forward_plan.decode_attention(),
                        models={"vocab": plan.VOCAB, "target": harness_models.target,
                                "attention_scale": _e2e.tiny_models_script().ATTENTION_VISIBLE_SCALE})
    path = _e2e.out_dir() / f"{plan.RESULT_FILE}.json"
    path.write_text(json.dumps(doc, indent=1))
    assert not problems, "; ".join(problems[:6]) + f" ({path})"


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
