"""Two GPUs: ``--tp-size 2`` and ``--dp-size 2`` servers keep seeded outputs batch-invariant.

Servers (chain EAGLE on the tiny pair, ``--enable-deterministic-inference``):

- rejection mode (``--speculative-use-rejection-sampling``) with TP = 2, then DP = 2;
- coupled mode (no rejection flag: the plugin verifies coupled) with TP = 1,
  TP = 2 and DP = 2.

Checks (each writes ``<DETSPEC_E2E_OUT>/two_gpu_*.json``): per server 1 unique
probe output over >= 24 changing-batch trials, bitwise-equal probe logprobs and
0 varying requests (every filler request of the audit gives the same tokens in
every batch it ran in); in coupled mode the probe's tokens on TP = 2 and
DP = 2 equal the one-GPU server's. A rejection-mode TP = 2 server may give
other tokens than TP = 1 for some request: its all-reduce sums partial
products in another order, so the logits differ in the last bits and an
accept coin or a residual draw can land on the other side; that is recorded,
not failed. Coupled mode is compared, because its target draw depends on the
logits only through an argmax of keyed races and ties at that precision are rare
(a mismatch there is reported with the logprob difference).

Skipped with the reason when fewer than two GPUs are visible. The first test starts all
six servers side by side (tiny models: the TP = 2 and DP = 2 servers share both GPUs
with the one-GPU servers), then each check runs on its server; estimated 5-7 minutes in
all, not yet measured. A ``-k`` selection without ``test_servers_start`` starts each
server when a test first needs it, one at a time.
"""

import random
import sys

import pytest
import requests

import _e2e
from _register import register_cuda_ci

register_cuda_ci(est_time=720, suite="detspec-e2e-cuda")

FAMILY = "chain_eagle"  # the vocab fixture reads it
TEST_ORDER = (
    "test_servers_start",
    "test_two_gpu_server_is_batch_invariant",
    "test_coupled_two_gpu_tokens_equal_one_gpu",
    "test_rejection_tp2_vs_one_gpu_recorded",
    "test_same_tokens_on_either_replica_and_any_cache_state",
)


def _gpu_count() -> int:
    try:
        import torch

        return torch.cuda.device_count()
    except Exception:
        return 0


pytestmark = pytest.mark.skipif(_gpu_count() < 2, reason="needs two CUDA GPUs (TP = 2 and DP = 2 servers)")


def two_gpu_config(models, *, mode: str, tp: int = 1, dp: int = 1) -> _e2e.ServerConfig:
    """Chain EAGLE, deterministic, in ``mode`` ("rejection" or "coupled") on tp x dp GPUs.

    The flags of _e2e's ``chain_eagle`` (rejection) and ``coupled_chain`` families, with
    ``--tp-size`` / ``--dp-size`` appended; the plugin must log the mode as its verify mode.
    """
    families = {"rejection": "chain_eagle", "coupled": "coupled_chain"}
    if mode not in families:
        raise ValueError(f"mode must be 'rejection' or 'coupled', got {mode!r}")
    extra = (*(("--tp-size", str(tp)) if tp > 1 else ()), *(("--dp-size", str(dp)) if dp > 1 else ()))
    return _e2e.server_config(families[mode], models, extra_args=extra, tag=f"tp{tp}_dp{dp}")


MODES = ("rejection", "coupled")
LAYOUTS = ((1, 1), (2, 1), (1, 2))  # (tp, dp): the one-GPU reference, TP = 2, DP = 2


def test_servers_start(servers, models):
    """Every configuration of the module starts side by side (one server start's time, not six)."""
    configs = [two_gpu_config(models, mode=m, tp=t, dp=d) for m in MODES for t, d in LAYOUTS]
    started = servers.ensure_group(configs)
    failed = {name: outcome for name, outcome in started.items() if isinstance(outcome, str)}
    _e2e.write_result("two_gpu_servers_start", {
        "passed": not failed, "problems": list(failed.values()),
        "measured": {"launch_s": {n: o.launch_s for n, o in started.items() if not isinstance(o, str)}}})
    assert not failed, "; ".join(failed.values())


def varying_requests_check(run: _e2e.AuditRun, result_name: str) -> None:
    """1 unique probe output, bitwise logprobs (check_deterministic_audit) and 0 varying requests."""
    numbers = _e2e.audit_numbers(run)
    path = _e2e.write_result(result_name + "_varying", {"passed": numbers["varying_requests"] == 0,
                                                         "measured": numbers})
    _e2e.check_deterministic_audit(run, result_name)
    assert numbers["varying_requests"] == 0, (
        f"{run.config.name}: {numbers['varying_requests']} of {numbers['num_requests']} requests "
        f"changed output between batches ({path})")


CASES = [("rejection", 2, 1), ("rejection", 1, 2), ("coupled", 2, 1), ("coupled", 1, 2)]


@pytest.mark.parametrize("mode, tp, dp", CASES, ids=[f"{m}_tp{t}_dp{d}" for m, t, d in CASES])
def test_two_gpu_server_is_batch_invariant(servers, models, vocab, mode, tp, dp):
    config = two_gpu_config(models, mode=mode, tp=tp, dp=dp)
    run = _e2e.run_audit(servers, config, vocab)
    varying_requests_check(run, config.name)


@pytest.mark.parametrize("tp, dp", [(2, 1), (1, 2)], ids=["tp2", "dp2"])
def test_coupled_two_gpu_tokens_equal_one_gpu(servers, models, vocab, tp, dp):
    one = _e2e.run_audit(servers, two_gpu_config(models, mode="coupled"), vocab)
    two = _e2e.run_audit(servers, two_gpu_config(models, mode="coupled", tp=tp, dp=dp), vocab)
    _e2e.check_same_tokens([one, two], f"two_gpu_coupled_tp{tp}_dp{dp}_vs_one_gpu")


def test_rejection_tp2_vs_one_gpu_recorded(servers, models, vocab):
    """Recorded, not failed: whether TP = 2 changes the rejection-mode probe tokens (reduction order)."""
    one = _e2e.run_audit(servers, two_gpu_config(models, mode="rejection"), vocab)
    two = _e2e.run_audit(servers, two_gpu_config(models, mode="rejection", tp=2), vocab)
    outputs = {"tp1": one.probe_outputs(), "tp2": two.probe_outputs()}
    # Only the measurement can fail here: each server must have answered the probe.
    problems = [f"{name}: no probe output (the server failed or answered with errors)"
                for name, probes in outputs.items() if not probes]
    path = _e2e.write_result("two_gpu_rejection_tp2_vs_one_gpu", {
        "passed": not problems, "figure_only": True, "problems": problems,
        "measured": {"same_probe_tokens": outputs["tp1"] == outputs["tp2"],
                     **{name: [list(t) for t in probes] for name, probes in outputs.items()}}})
    assert not problems, "; ".join(problems) + f" ({path})"


# -- DP = 2: which replica and which radix-cache state a request meets must not matter ---------


def _generate(url: str, input_ids: list[int], params: dict, rank: int | None) -> dict:
    """One /generate, pinned to DP replica ``rank`` (SGLang's ``routed_dp_rank``) unless None: tokens, logprobs, rank, cache hit."""
    body = {"input_ids": input_ids, "sampling_params": params, "return_logprob": True}
    if rank is not None:
        body["routed_dp_rank"] = rank
    response = requests.post(f"{url}/generate", json=body, timeout=120)
    response.raise_for_status()
    item = response.json()
    meta = item.get("meta_info", {})
    logprobs = [row[0] for row in meta.get("output_token_logprobs") or []]
    return {"rank": meta.get("dp_rank"), "cached_tokens": meta.get("cached_tokens"),
            "output_ids": list(item.get("output_ids") or []), "logprobs": logprobs}


def _first_difference(runs: list[dict]) -> dict:
    """Where the runs' outputs first part, and the largest target-logprob gap on the common prefix.

    A lead, not a verdict: token 0 comes from the prefill's logits with no draft
    involved, so a difference there is on the target side; unequal logprobs
    before the first differing token also point at the target. Equal logprobs
    before it leave both sides open: the logits at the differing position itself
    are not compared (its tokens, and so their logprobs, differ).
    """
    ids = [r["output_ids"] for r in runs]
    n = min(map(len, ids))
    first = next((k for k in range(n) if len({t[k] for t in ids}) > 1), n)
    gap = 0.0
    for k in range(first):
        values = [r["logprobs"][k] for r in runs if k < len(r["logprobs"]) and r["logprobs"][k] is not None]
        if values:
            gap = max(gap, max(values) - min(values))
    lead = "target (prefill token)" if first == 0 else "target (logits differ before)" if gap > 0 else "open"
    return {"first_differing_token": first, "max_logprob_gap_before_it": gap, "lead": lead}


DP_CASES = 24


DP_LAYOUTS = [("rejection", 2), ("coupled", 2), ("rejection", 1)]


@pytest.mark.parametrize("mode, dp", DP_LAYOUTS, ids=[f"{m}_dp{d}" for m, d in DP_LAYOUTS])
def test_same_tokens_on_either_replica_and_any_cache_state(servers, models, vocab, mode, dp):
    """Each seeded request gives one output whether it runs on replica 0 or 1, cold or after a prefix of it was cached.

    The audit's DP = 2 run (rejection mode) had 1 of 61 requests change output between
    batches. Round-robin routing sends a request to either replica, and each replica has
    its own radix cache, so a request meets prefix-cache states (no hit, a hit of its whole
    prompt, a hit on a prefix that another request left there) in orders a one-GPU run
    never produces. This pins every request (``routed_dp_rank``) to each replica in each
    cache state: cold (after ``/flush_cache``), warm (its own prompt cached), and partial
    (a request whose prompt is a proper prefix of this one ran first on that replica).
    ``meta_info`` reports the replica and the cached tokens; the result file records, per
    request that varied, the first differing token and whether the target logprobs already
    differed before it (a lead, see ``_first_difference``). In coupled mode the drafts
    cannot change a token, so the two modes side by side tell the sides apart; the
    one-GPU rejection server (``dp = 1``) meets the same cache states without replicas.
    """
    config = two_gpu_config(models, mode=mode, dp=dp)
    server = servers.ensure(config)
    rng = random.Random(11)
    cases = []
    for i in range(DP_CASES):
        prompt = [rng.randrange(vocab) for _ in range(rng.randint(4, 40))]
        params = {"max_new_tokens": 32, "ignore_eos": True, "temperature": (0.7, 1.0, 1.3)[i % 3],
                  "sampling_seed": rng.getrandbits(63)}
        cases.append((prompt, params))
    rows = []
    for index, (prompt, params) in enumerate(cases):
        cut = max(1, len(prompt) // 2)
        outcomes = []
        for rank in ((0, 1) if dp == 2 else (None,)):
            requests.post(f"{server.url}/flush_cache", timeout=60)
            outcomes.append(("cold", _generate(server.url, prompt, params, rank)))
            outcomes.append(("warm", _generate(server.url, prompt, params, rank)))
            requests.post(f"{server.url}/flush_cache", timeout=60)
            _generate(server.url, prompt[:cut], {**params, "max_new_tokens": 4}, rank)  # leaves a partial prefix
            outcomes.append(("partial", _generate(server.url, prompt, params, rank)))
        runs = [o for _, o in outcomes]
        distinct = {tuple(o["output_ids"]) for o in runs}
        row = {"case": index, "prompt_len": len(prompt), "temperature": params["temperature"],
               "distinct_outputs": len(distinct), "runs": [{"state": state, **o} for state, o in outcomes]}
        if len(distinct) > 1:
            row.update(_first_difference(runs))
        rows.append(row)
    varying = [r for r in rows if r["distinct_outputs"] != 1]
    wrong_rank = [r["case"] for r in rows for run in r["runs"] if run["rank"] not in (None, 0, 1)]
    path = _e2e.write_result(f"two_gpu_dp{dp}_{mode}_replica_and_cache_state", {
        "passed": not varying and not wrong_rank,
        "measured": {"mode": mode, "dp": dp, "cases": len(rows), "varying_cases": len(varying),
                     "where": [{k: r[k] for k in ("case", "first_differing_token", "max_logprob_gap_before_it", "lead")}
                               for r in varying],
                     "rows": rows}})
    assert not wrong_rank, f"meta_info.dp_rank outside {{0, 1}} for cases {wrong_rank} ({path})"
    assert not varying, (
        f"{mode}, dp {dp}: {len(varying)} of {len(rows)} requests gave more than one output across replica x cache state; "
        f"first: case {varying[0]['case']} (first differing token {varying[0]['first_differing_token']}, "
        f"logprob gap before it {varying[0]['max_logprob_gap_before_it']:.3g}): "
        + "; ".join(f"{r['state']}@rank{r['rank']} cached={r['cached_tokens']} -> {r['output_ids'][:6]}"
                    for r in varying[0]["runs"]) + f" ({path})")


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
