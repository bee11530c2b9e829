"""The families people speculate with: a DeepSeek-V3-style target (MLA, MoE, NEXTN), its FP8 copy, Qwen3-MoE with EAGLE3.

Per attention backend (``auto``: SGLang's own choice, no ``--attention-backend``;
then ``triton``, ``fa3``, ``flashinfer``) and per family of
``_families_plan.FAMILIES`` (the tiny models of ``scripts/tiny_families.py``),
four deterministic servers with CUDA graphs on: the target without
speculative decoding, a coupled chain (3 steps), a coupled tree (3 steps,
top-k 4, 8 tokens) and the coupled chain under SGLang's retraction test
switch (``SGLANG_TEST_RETRACT=1``). A server SGLang refuses (its real
argument resolution says so before anything loads: e.g. DeepSeek-family
models accept only the radix-cache backends under deterministic inference)
starts nothing and its row records SGLang's reason. Checks, one row each in
``model_families.json``:

* ``changing_batches``: the changing-batch audit (``_e2e.run_audit``, at
  least 24 trials, 25 by default) on the chain and the tree: 1 unique probe
  output, bitwise-equal probe logprobs, no request varying between batches;
* ``equal_to_no_spec``: the 8 seeded requests of ``_invariance`` (64 tokens,
  temperatures 0.7-1.3, top-k / top-p rows) on the chain and the tree give
  the reference's tokens, request by request;
* ``logprobs``: the plugin's start-up claim (``logits='...'``) is the rule's
  (``config.DetSpecConfig.logits``: ``tokens`` for a family here unless
  ``model_family.MEASURED_BITWISE`` records it on the backend), and a
  ``bitwise`` claim has 0 requests with other logprobs (a ``tokens``
  claim's are recorded); an MLA target's tree server must be the chain
  server of its depth (``config.DetSpecConfig.mla_tree_as_chain``: its
  start-up line, SGLang's resolved shape, no draft-shape switch);
* ``retraction``: the retracting chain gives the reference's tokens for the
  same 8 requests, and the scheduler did retract (``num_retractions``);
* ``radix_cache``: on the reference, the chain and the tree, the cache
  flushed and then holding each prompt alone, each request again with its
  prompt followed by its first 32 outputs (one extend over a cached prefix
  where the first run decoded): the same last 32 tokens, and logprobs under
  a ``bitwise`` claim; every request must be served from the cache. Where
  the server runs without a radix cache (SGLang's deterministic mode keeps
  it only on some backends) the row says so and is not a check.

``DETSPEC_E2E_FAMILY_BACKENDS`` picks backends (comma-separated, from
``auto,triton,fa3,flashinfer``) and ``DETSPEC_E2E_FAMILIES`` families (from
``deepseek_v3,deepseek_v3_fp8,qwen3_moe``); each backend starts up to 4
servers per family at once.
``model_families.json`` is rewritten after each backend with every row so far.
"""

import concurrent.futures
import os
import re
import sys
from pathlib import Path

import pytest

import _e2e
import _families_plan as plan
import _forward_plan as forward_plan
import _invariance
import _requests
from _register import register_cuda_ci

from sglang_detspec.config import logits_guarantee
from sglang_detspec.model_family import family_claim, head_dim_of, label_traits, model_family
from sglang_detspec.sglang_plugin.shape_hook import SWITCH_LOG
from sglang_detspec.sglang_plugin.startup_notes import MLA_CHAIN_LOG

register_cuda_ci(est_time=600, suite="detspec-e2e-cuda")

BACKENDS = plan.selected_backends()
FAMILIES = plan.selected_families()
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


def mla_tree_problems(server) -> list[str]:
    """An MLA target's tree server is the chain server (``DetSpecConfig.mla_tree_as_chain``): the start-up line
    saying so, SGLang's resolved chain of the tree's depth (``/server_info``), no draft-shape switch."""
    problems = []
    name = server.config.name
    lines = server.log_lines(MLA_CHAIN_LOG)
    if len(lines) != 1:
        problems.append(f"{name}: its log has {len(lines)} lines '{MLA_CHAIN_LOG}', not 1")
    info = _requests.get(server.url, "/server_info")
    body = info["body"] if info["status"] == 200 and isinstance(info["body"], dict) else {}
    shape = tuple(body.get(k) for k in ("speculative_eagle_topk", "speculative_num_steps",
                                        "speculative_num_draft_tokens"))
    steps = int(_e2e.TREE_SHAPE[_e2e.TREE_SHAPE.index("--speculative-num-steps") + 1])
    if shape != (1, steps, steps + 1):
        problems.append(f"{name}: SGLang resolved (top-k, steps, draft tokens) {shape}, not the chain "
                        f"(1, {steps}, {steps + 1})")
    if server.log_lines(SWITCH_LOG):
        problems.append(f"{name}: its draft shape switched")
    return problems


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
    for name, fam in FAMILIES.items():
        model = os.path.join(models_dir, fam.folder)
        for shape in plan.SERVER_SHAPES:
            flags = plan.server_flags(fam, shape, backend, models_dir)
            reason = plan.sglang_refusal(model, flags)
            if reason is not None:
                refused[(name, shape)] = reason
                continue
            configs[(name, shape)] = _e2e.ServerConfig(f"{name}_{shape}_{backend}_det_cuda_graph", model, flags,
                                                       True, True, env=plan.server_env(shape) + plan.family_env(fam),
                                                       verify=None if shape == "none" else "coupled")
    rows, problems = [], []
    for (name, shape), reason in refused.items():
        rows.append(row(name, shape, backend, "start", refused=reason, passed=True))
    if not configs:
        return rows, problems
    vocab = _e2e.vocab_size(next(iter(configs.values())).model)
    group = _invariance.run_group(servers, list(configs.values()), vocab, f"model_families_{backend}_requests")
    spec = [key for key in configs if key[1] in plan.SHAPES]

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
            why = servers.failed.get(configs[key].name, "it started, then was stopped before its checks")
            problems.append(f"{configs[key].name}: not running ({why})")
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
        if shape == "tree" and server is not None and "mla" in label_traits(model_family(config.model)):
            problems += mla_tree_problems(server)
        if not claim_ok:
            problems.append(f"{config.name}: the plugin logged logits={claims}, the rule says [{expected!r}]")
        elif not logprobs_ok:
            problems.append(f"{config.name}: {other_logprobs} of {compared} requests have other logprobs, "
                            f"claimed {claimed}")
    for name in FAMILIES:
        key = (name, plan.RETRACTION)
        if key in configs and (name, "none") in configs:
            retraction_row, found = retraction(servers, group, configs[(name, "none")], configs[key], name, backend)
            rows.append(retraction_row)
            problems += found
        for shape in ("none", *plan.SHAPES):
            server = servers.running.get(configs[(name, shape)].name) if (name, shape) in configs else None
            if server is not None:
                cache_row, found = radix_cache(server, configs[(name, shape)], group, vocab, name, shape, backend)
                rows.append(cache_row)
                problems += found
    return rows, problems


def retraction(servers, group: dict, ref, config, name: str, backend: str) -> tuple[dict, list[str]]:
    """The ``retraction`` row of family ``name``: the retracting chain's tokens against the reference's, and that
    it retracted."""
    outcome = _invariance.compare(group, ref.name, config.name)
    server = servers.running.get(config.name)
    claims = claimed_by(server) if server else []
    claimed = claims[0] if len(claims) == 1 else None
    retracted = sum(r.retractions or 0 for r in group[config.name]["results"] if not isinstance(r, str))
    compared, other_tokens = outcome["requests_compared"], outcome["requests_with_other_tokens"]
    problems = list(outcome["problems"])
    if server is not None and not retracted:
        problems.append(f"{config.name}: no request was retracted (SGLANG_TEST_RETRACT): the row measured nothing")
    if claimed == "bitwise" and outcome["requests_with_other_logprobs"]:
        problems.append(f"{config.name}: {outcome['requests_with_other_logprobs']} of {compared} requests have "
                        f"other logprobs after retraction, claimed bitwise")
    parted = [{"request": r["request"], "first_different_token": r["first_different_token"]}
              for r in outcome["rows"] if not r["same_tokens"]]
    return row(name, plan.RETRACTION, backend, "retraction", trials=compared, unique=1 + (other_tokens > 0),
               differing_sequences=other_tokens, claimed=claimed, retractions=retracted, parted=parted,
               passed=not problems and compared == _invariance.NUM_REQUESTS), problems


def radix_cache(server, config, group: dict, vocab: int, name: str, shape: str,
                backend: str) -> tuple[dict, list[str]]:
    """The ``radix_cache`` row of family ``name``'s ``shape`` server: its own requests (those of ``run_group`` at
    ``vocab``) again over a cached prompt (module docstring)."""
    claims = claimed_by(server)
    claimed = claims[0] if len(claims) == 1 else None
    info = _requests.get(server.url, "/server_info")
    if info["status"] != 200 or not isinstance(info["body"], dict):
        problem = f"{config.name} radix cache: /server_info answered {info['status']}"
        return row(name, shape, backend, "radix_cache", claimed=claimed, error=problem), [problem]
    resolved, keeps = info["body"].get("attention_backend"), forward_plan.radix_cache_backends()
    if isinstance(resolved, str) and bool(info["body"].get("disable_radix_cache")) != (resolved not in keeps):
        problem = (f"{config.name} radix cache: disable_radix_cache is {info['body'].get('disable_radix_cache')!r} on "
                   f"{resolved}, but SGLang's list of backends that keep it in deterministic mode ({', '.join(keeps)}) "
                   f"says {resolved not in keeps}")
        return row(name, shape, backend, "radix_cache", claimed=claimed, error=problem), [problem]
    if info["body"].get("disable_radix_cache"):
        reason = (f"the server runs without a radix cache on {resolved} (SGLang's deterministic mode keeps it only "
                  f"on {', '.join(keeps)})")
        return row(name, shape, backend, "radix_cache", claimed=claimed, not_applicable=reason, passed=True), []
    first = group[config.name]["results"]
    if len(first) != _invariance.NUM_REQUESTS or any(isinstance(r, str) for r in first):
        problem = f"{config.name} radix cache: the first run failed"
        return row(name, shape, backend, "radix_cache", claimed=claimed, error=problem), [problem]
    cached, rest = plan.CACHED_TOKENS, _invariance.NEW_TOKENS - plan.CACHED_TOKENS
    prompts, params = _invariance.request_set(vocab)
    again, found = _requests.resend_over_cache(server, _invariance.send, prompts, params, first, cached, rest,
                                               _e2e.served_page_size())
    problems = [f"{config.name} radix cache: {p}" for p in found]
    problems += [f"{config.name} radix cache: request {i}: {r}" for i, r in enumerate(again) if isinstance(r, str)][:2]
    done = [(i, f, a) for i, (f, a) in enumerate(zip(first, again)) if not isinstance(a, str)]
    # Where a request parts from its first run, and the logprob gap there: a near-tie or not.
    parted = [{"request": i, "first_different_token": j,
               "logprobs_there": [f.logprobs[cached + j] if f.logprobs else None, a.logprobs[j] if a.logprobs else None]}
              for i, f, a in done
              for j in [_requests.first_difference(f.output_ids[cached:], a.output_ids)] if j is not None]
    other_tokens = len(parted)
    other_logprobs = sum(a.logprobs is None or f.logprobs is None or a.logprobs != f.logprobs[cached:]
                         for _, f, a in done)
    if other_tokens:
        problems.append(f"{config.name} radix cache: {other_tokens} of {len(done)} requests gave other tokens "
                        f"after a cache hit")
    if claimed == "bitwise" and other_logprobs:
        problems.append(f"{config.name} radix cache: {other_logprobs} of {len(done)} requests have other logprobs "
                        f"after a cache hit, claimed bitwise")
    return row(name, shape, backend, "radix_cache", trials=len(done), unique=1 + (other_tokens > 0),
               differing_sequences=other_tokens, claimed=claimed, other_logprobs=other_logprobs, parted=parted,
               passed=not problems and len(done) == _invariance.NUM_REQUESTS), problems



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
