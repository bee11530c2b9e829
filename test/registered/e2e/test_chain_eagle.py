"""Chain EAGLE on a real SGLang server: changing-batch determinism, CUDA graphs on and off, robustness.

Server: ``--speculative-algorithm EAGLE --speculative-num-steps 3
--speculative-eagle-topk 1 --speculative-num-draft-tokens 4
--speculative-use-rejection-sampling --enable-deterministic-inference`` on the
tiny Llama target and its copying EAGLE draft (or ``DETSPEC_E2E_TARGET`` /
``DETSPEC_E2E_EAGLE``), first with CUDA graphs, then restarted without them.
The control server (no deterministic inference) is in ``test_controls.py``.

Checks (each writes ``<DETSPEC_E2E_OUT>/chain_eagle_*.json``):

1. CUDA graphs on: 1 unique probe output over >= 24 changing-batch trials,
   bitwise-equal probe logprobs, the plugin active.
2. Same server: 256 concurrent requests (seeded and unseeded, greedy and
   sampled, prompts and outputs of 4..512 tokens) while the probe runs: no
   error, the probe's tokens and logprobs unchanged; bad ``sampling_seed``
   values (negative, >= 2**64, not an integer) get a 4xx naming the field
   and the server keeps serving; seeds 0, 2**63 and
   2**64 - 1 are served and give the same tokens alone and in a batch.
3. Restarted without CUDA graphs: check 1 again, and the same probe tokens
   as with CUDA graphs (the second server is a fresh process: the restart).

About 4 minutes on an H200: two server starts of 70-90 s each, the rest is
traffic.
"""

import concurrent.futures
import json
import random
import sys
import time
import uuid

import pytest
import requests

import _e2e
from _family_checks import (  # noqa: F401  (collected here; TEST_ORDER below)
    test_deterministic_with_cuda_graphs,
    test_deterministic_without_cuda_graphs_after_restart,
    test_same_tokens_with_cuda_graphs_on_and_off,
)
from _register import register_cuda_ci

register_cuda_ci(est_time=300, suite="detspec-e2e-cuda")

FAMILY = "chain_eagle"
TEST_ORDER = (
    "test_deterministic_with_cuda_graphs",  # starts the CUDA-graph server
    "test_probe_identical_under_256_concurrent_requests",
    "test_bad_sampling_seed_gets_a_clear_4xx",
    "test_edge_seeds_are_served_and_batch_invariant",
    "test_server_keeps_serving_after_bad_seeds",
    "test_deterministic_without_cuda_graphs_after_restart",  # restarts without CUDA graphs
    "test_same_tokens_with_cuda_graphs_on_and_off",
)
LOAD_REQUESTS = 256
LOAD_SEED = 5
MIN_LEN, MAX_LEN = 4, 512
MAX_PROBES_UNDER_LOAD = 16
PROBE_INTERVAL_S = 0.25
HTTP_TIMEOUT_S = 300.0



# -- robustness (same server) ---------------------------------------------------------


def post_generate(url: str, body: dict) -> dict:
    """POST one /generate request; the outcome with its wall-clock span (never raises on HTTP errors)."""
    start = time.monotonic()
    try:
        response = requests.post(f"{url}/generate", json=body, timeout=HTTP_TIMEOUT_S)
        status, text = response.status_code, response.text
    except requests.RequestException as exc:
        status, text = None, f"{type(exc).__name__}: {exc}"
    end = time.monotonic()
    try:
        parsed = json.loads(text) if status is not None else None
    except ValueError:
        parsed = None
    return {"status": status, "body": parsed, "text": text[:500], "start": start, "end": end}


def load_bodies(vocab: int) -> list[dict]:
    """256 fixed-seed requests: seeded or not, greedy or sampled (plain, top-k, top-p), 4..512 tokens in and out."""
    rng = random.Random(LOAD_SEED)
    bodies = []
    for i in range(LOAD_REQUESTS):
        params = {
            "max_new_tokens": rng.randint(MIN_LEN, MAX_LEN),
            "temperature": 0.0 if i % 4 == 0 else rng.choice((0.7, 1.0, 1.3)),
            "ignore_eos": True,
        }
        # top-k / top-p rows send their batch down SGLang's other target-sampling path.
        if i % 8 == 1:
            params["top_k"] = 20
        elif i % 8 == 5:
            params["top_p"] = 0.9
        if i % 2 == 0:
            params["sampling_seed"] = rng.getrandbits(64)  # the whole uint64 range the plugin admits
        bodies.append({
            "input_ids": [rng.randrange(vocab) for _ in range(rng.randint(MIN_LEN, MAX_LEN))],
            "sampling_params": params,
            "rid": f"load-{i}-{uuid.uuid4().hex[:8]}",
        })
    return bodies


def reference_probe(servers, config, vocab):
    """The probe request of the audit plan and its output on ``config``'s server, alone."""
    from sglang_detspec.auditing.http_backend import HttpBackend

    def compute():
        plan = _e2e.audit_plan(vocab)
        with HttpBackend(servers.ensure(config).url) as backend:
            (result,) = backend.generate([plan.probe])
        return plan.probe, result

    return servers.remember(f"probe:{config.name}", compute)


def test_probe_identical_under_256_concurrent_requests(servers, det_cuda_graph, vocab):
    from sglang_detspec.auditing.http_backend import HttpBackend, HttpBackendError

    server = servers.ensure(det_cuda_graph)
    probe, reference = reference_probe(servers, det_cuda_graph, vocab)
    bodies = load_bodies(vocab)
    probes = []  # (start, end, result or error text)

    def one_probe():
        start = time.monotonic()
        try:
            with HttpBackend(server.url, timeout=HTTP_TIMEOUT_S) as backend:
                (result,) = backend.generate([probe])
            return start, time.monotonic(), result
        except HttpBackendError as exc:
            return start, time.monotonic(), f"{type(exc).__name__}: {exc}"

    with concurrent.futures.ThreadPoolExecutor(LOAD_REQUESTS) as load_pool, \
            concurrent.futures.ThreadPoolExecutor(MAX_PROBES_UNDER_LOAD) as probe_pool:
        started = time.monotonic()
        load = [load_pool.submit(post_generate, server.url, body) for body in bodies]
        probe_futures = []
        # Probes keep starting, staggered, for as long as the load runs.
        while len(probe_futures) < MAX_PROBES_UNDER_LOAD and not all(f.done() for f in load):
            probe_futures.append(probe_pool.submit(one_probe))
            time.sleep(PROBE_INTERVAL_S)
        outcomes = [f.result() for f in load]
        probes = [f.result() for f in probe_futures]

    errors = []
    for body, outcome in zip(bodies, outcomes):
        item = outcome["body"]
        want = body["sampling_params"]["max_new_tokens"]
        finish = item.get("meta_info", {}).get("finish_reason") if isinstance(item, dict) else None
        if outcome["status"] != 200 or not isinstance(item, dict):
            errors.append(f"{body['rid']}: HTTP {outcome['status']}: {outcome['text'][:200]}")
        elif isinstance(finish, dict) and finish.get("type") == "abort":
            errors.append(f"{body['rid']}: aborted: {finish.get('message')}")
        elif len(item.get("output_ids") or []) != want:
            errors.append(f"{body['rid']}: {len(item.get('output_ids') or [])} output tokens for max_new_tokens={want}")

    def in_flight(start, end):
        """Load requests that were running during the whole probe [start, end]."""
        return sum(o["start"] <= start and o["end"] >= end for o in outcomes)

    probe_rows = []
    for start, end, result in probes:
        row = {"start_s": round(start - started, 3), "end_s": round(end - started, 3),
               "load_in_flight_throughout": in_flight(start, end)}
        if isinstance(result, str):
            row["error"] = result
        else:
            row["same_tokens"] = result.output_ids == reference.output_ids
            row["same_logprobs_bitwise"] = [repr(x) for x in result.output_logprobs or ()] == [
                repr(x) for x in reference.output_logprobs or ()]
        probe_rows.append(row)
    overlapped = [r for r in probe_rows if r["load_in_flight_throughout"] > 0]
    measured = {
        "load_requests": len(bodies), "load_errors": len(errors), "load_error_examples": errors[:10],
        "load_wall_s": round(max(o["end"] for o in outcomes) - started, 2),
        "load_output_tokens": sum(b["sampling_params"]["max_new_tokens"] for b in bodies),
        "probes": len(probe_rows), "probes_overlapping_load": len(overlapped),
        "probes_with_other_tokens": sum(r.get("same_tokens") is False for r in probe_rows),
        "probes_with_other_logprobs": sum(r.get("same_logprobs_bitwise") is False for r in probe_rows),
        "probe_errors": sum("error" in r for r in probe_rows),
        "probe_rows": probe_rows, "reference_probe_output_ids": list(reference.output_ids),
    }
    problems = []
    if errors:
        problems.append(f"{len(errors)} of {len(bodies)} load requests failed, e.g. {errors[0]}")
    if measured["probe_errors"]:
        problems.append(f"{measured['probe_errors']} probe requests failed")
    if measured["probes_with_other_tokens"] or measured["probes_with_other_logprobs"]:
        problems.append(
            f"{measured['probes_with_other_tokens']} probes gave other tokens and "
            f"{measured['probes_with_other_logprobs']} other logprobs than the probe alone"
        )
    if not overlapped:
        problems.append("no probe ran entirely while load requests were in flight: the check did not happen")
    path = _e2e.write_result(f"{FAMILY}_robustness_load", {
        "passed": not problems, "problems": problems, "measured": measured, "server": server.facts()})
    assert not problems, "; ".join(problems) + f" ({path})"


# (label, value) of sampling_seed values that must be refused with a 4xx: outside [0, 2**64) or
# not an integer. SGLang's schema gate refuses what is not a JSON integer in the int64 range
# (2**64 arrives as a float: SGLang parses bodies with orjson), the plugin's seed check the
# negative integers; the plugin words both refusals (sglang_plugin/request_validation.py).
BAD_SEEDS = [
    ("negative", -1),
    ("int64_min", -(2**63)),
    ("2_pow_64", 2**64),
    ("float", 1.5),
    ("string", "7"),
    ("boolean", True),
]


@pytest.mark.parametrize("label, seed", BAD_SEEDS)
def test_bad_sampling_seed_gets_a_clear_4xx(servers, det_cuda_graph, vocab, label, seed):
    server = servers.ensure(det_cuda_graph)
    probe, _ = reference_probe(servers, det_cuda_graph, vocab)
    body = {"input_ids": list(probe.prompt_ids),
            "sampling_params": {"max_new_tokens": 4, "temperature": 1.0, "sampling_seed": seed}}
    outcome = post_generate(server.url, body)
    message = _error_message(outcome["body"]) or outcome["text"]
    status = outcome["status"]
    # Clear: a client error whose message names the field (SGLang's own schema-gate wording
    # quotes the value but not the field; the plugin puts the field's message in front).
    passed = status is not None and 400 <= status < 500 and "sampling_seed" in message
    path = _e2e.write_result(f"{FAMILY}_bad_seed_{label}", {
        "passed": passed, "measured": {"sampling_seed": repr(seed), "status": status, "message": message[:500],
                                       "message_names_field": "sampling_seed" in message}})
    assert passed, (
        f"sampling_seed={seed!r}: expected a 4xx whose message names sampling_seed, "
        f"got HTTP {status}: {message[:200]} ({path})"
    )


def _error_message(body) -> str:
    """SGLang's error text from the shapes its HTTP server uses (see http_backend.error_message)."""
    if not isinstance(body, dict):
        return ""
    error = body.get("error")
    if isinstance(error, dict):
        return str(error.get("message") or "")
    if isinstance(error, str):
        return error
    return str(body.get("message") or body.get("detail") or "")


@pytest.mark.parametrize("seed", [0, 2**63, 2**64 - 1])
def test_edge_seeds_are_served_and_batch_invariant(servers, det_cuda_graph, vocab, seed):
    """Seeds at the ends of [0, 2**64) are admitted and give the same tokens alone and in a batch."""
    server = servers.ensure(det_cuda_graph)
    probe, _ = reference_probe(servers, det_cuda_graph, vocab)
    params = {"max_new_tokens": 16, "temperature": 1.0, "ignore_eos": True, "sampling_seed": seed}
    alone = post_generate(server.url, {"input_ids": list(probe.prompt_ids), "sampling_params": params})
    rng = random.Random(seed % 997)
    others = [[rng.randrange(vocab) for _ in range(rng.randint(4, 64))] for _ in range(5)]
    batch = post_generate(server.url, {
        "input_ids": [*others[:2], list(probe.prompt_ids), *others[2:]],
        "sampling_params": [{"max_new_tokens": 24, "temperature": 0.8, "ignore_eos": True}] * 2 + [params]
        + [{"max_new_tokens": 8, "temperature": 0.0, "ignore_eos": True}] * 3,
    })

    def ids(outcome, row=None):
        body = outcome["body"]
        item = body[row] if row is not None and isinstance(body, list) else body
        return item.get("output_ids") if isinstance(item, dict) else None

    measured = {"sampling_seed": str(seed), "status_alone": alone["status"], "status_batch": batch["status"],
                "output_alone": ids(alone), "output_in_batch": ids(batch, 2),
                "error": None if alone["status"] == 200 else alone["text"][:300]}
    passed = (alone["status"] == 200 and batch["status"] == 200 and ids(alone) is not None
              and len(ids(alone)) == 16 and ids(alone) == ids(batch, 2))
    path = _e2e.write_result(f"{FAMILY}_edge_seed_{seed}", {"passed": passed, "measured": measured})
    assert passed, f"sampling_seed={seed}: {measured} ({path})"


def test_server_keeps_serving_after_bad_seeds(servers, det_cuda_graph, vocab):
    from sglang_detspec.auditing.http_backend import HttpBackend

    server = servers.ensure(det_cuda_graph)
    probe, reference = reference_probe(servers, det_cuda_graph, vocab)
    with HttpBackend(server.url) as backend:
        (again,) = backend.generate([probe])
    alive = server.process.poll() is None
    same = again.output_ids == reference.output_ids
    path = _e2e.write_result(f"{FAMILY}_serving_after_bad_seeds", {
        "passed": alive and same, "measured": {"server_alive": alive, "same_probe_tokens": same}})
    assert alive and same, f"after the bad-seed requests: server alive {alive}, same probe tokens {same} ({path})"


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
