"""The families people speculate with: a DeepSeek-V3-style target (MLA, MoE, NEXTN), its FP8 copy, Qwen3-MoE with EAGLE3.

Per attention backend (``auto``: SGLang's own choice, no ``--attention-backend``;
then ``triton``, ``fa3``, ``flashinfer``) and per family of
``_families_plan.FAMILIES`` (the tiny models of ``scripts/tiny_families.py``),
three deterministic servers with CUDA graphs on: the target without
speculative decoding, a coupled chain (3 steps) and a coupled tree (3 steps,
top-k 4, 8 tokens). A server SGLang refuses (its real argument resolution
says so before anything loads: e.g. DeepSeek-family models accept only the
radix-cache backends under deterministic inference) starts nothing and its
row records SGLang's reason. Checks, one row each in ``model_families.json``:

* ``changing_batches``: the changing-batch audit (``_e2e.run_audit``, at
  least 24 trials, 25 by default) on the chain and the tree: 1 unique probe
  output, bitwise-equal probe logprobs, no request varying between batches;
* ``equal_to_no_spec``: the 8 seeded requests of ``_invariance`` (64 tokens,
  temperatures 0.7-1.3, top-k / top-p rows) on the chain and the tree give
  the reference's tokens, request by request;
* ``logprobs``: the plugin's start-up claim (``logits='...'``) is the rule's
  (``config.DetSpecConfig.logits``: ``tokens`` for every family here until
  ``model_family.MEASURED_BITWISE`` records one), and a ``bitwise`` claim has
  0 requests with other logprobs (a ``tokens`` claim's are recorded).

``DETSPEC_E2E_FAMILY_BACKENDS`` picks backends (comma-separated, from
``auto,triton,fa3,flashinfer``); each backend starts up to 9 servers at once.
``model_families.json`` is rewritten after each backend with every row so far.
Not covered here yet: retraction and radix-cache hits on these families.
"""

import concurrent.futures
import os
import re
import sys
from pathlib import Path

import pytest

import _e2e
import _families_plan as plan
import _invariance
import _requests
from _register import register_cuda_ci

from sglang_detspec.config import logits_guarantee
from sglang_detspec.model_family import family_claim, head_dim_of, model_family

register_cuda_ci(est_time=600, suite="detspec-e2e-cuda")

BACKENDS = plan.selected_backends()
LOGITS_FIELD = re.compile(r"logits='(\w+)'")
TEST_ORDER = ("test_model_families",)
ROWS: list[dict] = []  # every backend's rows so far: model_families.json holds them all


@pytest.fixture(scope="module")
def models_dir(models) -> str:
    """The tiny models' folder, written again if it is an older set (no family folders, or the insensitive ones)."""
    folder = models.tiny_dir or os.environ.get("DETSPEC_E2E_MODELS")
    if not folder:
        pytest.fail("the family models are tiny models: leave DETSPEC_E2E_TARGET & co. unset or set DETSPEC_E2E_MODELS")
    if not _e2e.tiny_models_complete(Path(folder)):
        _e2e.write_tiny_models(Path(folder))
    return folder


def row(family: str, shape: str, backend: str, check: str, **fields) -> dict:
    base = {"family": family, "quantization": plan.FAMILIES[family].quantization, "speculative": shape,
            "backend": backend, "check": check, "trials": 0, "unique": 0, "differing_sequences": 0,
            "claimed": None, "passed": False}
    return {**base, **fields}


def claimed_by(server) -> list[str]:
    return sorted({m for line in server.log_lines(_e2e.PLUGIN_ACTIVE) for m in LOGITS_FIELD.findall(line)})


def expected_claim(server, model_path: str, shape: str) -> str:
    """The claim the plugin's rule gives this server, from the backend SGLang resolved (``/server_info``)."""
    info = _requests.get(server.url, "/server_info")
    if info["status"] != 200 or not isinstance(info["body"], dict):
        return f"/server_info answered {info['status']}"
    backend = info["body"].get("attention_backend")
    topk = {"none": None, "chain": 1, "tree": 4}[shape]
    return family_claim(model_family(model_path), logits_guarantee(backend, topk, head_dim=head_dim_of(model_path)),
                        backend)


def measure(servers, models_dir: str, backend: str) -> tuple[list[dict], list[str]]:
    configs, refused = {}, {}
    for name, fam in plan.FAMILIES.items():
        model = os.path.join(models_dir, fam.folder)
        for shape in ("none", *plan.SHAPES):
            flags = plan.server_flags(fam, shape, backend, models_dir)
            reason = plan.sglang_refusal(model, flags)
            if reason is not None:
                refused[(name, shape)] = reason
                continue
            configs[(name, shape)] = _e2e.ServerConfig(f"{name}_{shape}_{backend}_det_cuda_graph", model, flags,
                                                       True, True, verify=None if shape == "none" else "coupled")
    rows, problems = [], []
    for (name, shape), reason in refused.items():
        rows.append(row(name, shape, backend, "start", refused=reason, passed=True))
    if not configs:
        return rows, problems
    group = _invariance.run_group(servers, list(configs.values()), _e2e.vocab_size(next(iter(configs.values())).model),
                                  f"model_families_{backend}_requests")
    spec = [key for key in configs if key[1] != "none"]

    def audit(key):
        config = configs[key]
        try:
            return _e2e.run_audit(servers, config, _e2e.vocab_size(config.model))
        except RuntimeError as exc:
            return str(exc)

    with concurrent.futures.ThreadPoolExecutor(len(spec)) as pool:
        audits = dict(zip(spec, pool.map(audit, spec)))
    for key in configs:
        started = servers.running.get(configs[key].name)
        if started is None:
            problems.append(f"{configs[key].name}: did not start ({servers.failed.get(configs[key].name)})")
        elif key[1] == "none" and claimed_by(started) != [expected_claim(started, configs[key].model, "none")]:
            problems.append(f"{configs[key].name}: claimed {claimed_by(started)}, the rule says "
                            f"{expected_claim(started, configs[key].model, 'none')!r}")
    for name, shape in spec:
        config, ref = configs[(name, shape)], configs.get((name, "none"))
        run = audits[(name, shape)]
        if isinstance(run, str):
            rows.append(row(name, shape, backend, "changing_batches", error=run))
            problems.append(run)
        else:
            numbers = _e2e.audit_numbers(run)
            ok = (not run.plugin_problems and numbers["trials"] >= _e2e.MIN_TRIALS
                  and numbers["unique_probe_outputs"] == 1 and numbers["probe_logprobs_identical"] is True
                  and not numbers["varying_requests"])
            rows.append(row(name, shape, backend, "changing_batches", trials=numbers["trials"],
                            unique=numbers["unique_probe_outputs"], differing_sequences=numbers["varying_requests"],
                            claimed=(claimed_by(servers.running[config.name]) or [None])[0], passed=ok))
            if not ok:
                problems.append(f"{config.name} changing batches: {numbers} {list(run.plugin_problems)}")
        if ref is None:
            rows.append(row(name, shape, backend, "equal_to_no_spec", error=f"no reference: {refused[(name, 'none')]}"))
            problems.append(f"{config.name}: its reference without speculative decoding was refused")
            continue
        outcome = _invariance.compare(group, ref.name, config.name)
        server = servers.running.get(config.name)
        claims = claimed_by(server) if server else []
        expected = expected_claim(server, config.model, shape) if server else "not started"
        claimed = claims[0] if len(claims) == 1 else None
        compared, other_tokens = outcome["requests_compared"], outcome["requests_with_other_tokens"]
        rows.append(row(name, shape, backend, "equal_to_no_spec", trials=compared, unique=1 + (other_tokens > 0),
                        differing_sequences=other_tokens, claimed=claimed,
                        passed=not outcome["problems"] and compared == _invariance.NUM_REQUESTS))
        problems += outcome["problems"]
        other_logprobs = outcome["requests_with_other_logprobs"]
        claim_ok = claims == [expected]
        logprobs_ok = claim_ok and (claimed != "bitwise" or other_logprobs == 0) and compared > 0
        rows.append(row(name, shape, backend, "logprobs", trials=compared, unique=1 + (other_logprobs > 0),
                        differing_sequences=other_logprobs, claimed=claimed, passed=logprobs_ok))
        if not claim_ok:
            problems.append(f"{config.name}: the plugin logged logits={claims}, the rule says [{expected!r}]")
        elif not logprobs_ok:
            problems.append(f"{config.name}: {other_logprobs} of {compared} requests have other logprobs, "
                            f"claimed {claimed}")
    return rows, problems


@pytest.mark.parametrize("backend", BACKENDS)
def test_model_families(servers, models_dir, backend):
    rows, problems = measure(servers, models_dir, backend)
    ROWS.extend(rows)
    facts = _e2e.machine_facts()
    _e2e.write_result(f"model_families_{backend}", {"passed": not problems, "problems": problems, "rows": rows})
    _e2e.write_result("model_families", {"machine": facts.get("gpu"), "rows": ROWS,
                                         "passed": all(r["passed"] for r in ROWS)})
    assert not problems, "; ".join(problems[:6]) + f" ({_e2e.out_dir() / f'model_families_{backend}.json'})"


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
