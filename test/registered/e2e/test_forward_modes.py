"""Forward modes: the target's logprobs with speculative decoding on, after retraction, cache hit, chunked prefill.

Every token of coupled mode is the TARGET-stream race over p_t, so "spec on =
spec off" holds down to the logprob only where the target's verify (and
prefill, and re-prefill) forward gives the decode forward's logits bit for bit
(``docs/forward_modes.md``). This suite measures it per attention backend
(``triton``, ``fa3`` where sgl-kernel's FA3 library is installed, and
``flashinfer``), each server against the server without speculative decoding
on the same model and backend, 16 seeded requests x 64 tokens (temperatures
0.8-1.2, two filtered rows), with ``return_logprob``. The rows
(``_forward_plan.py`` holds the table):

* ``chain``: coupled chain EAGLE (3 steps);
* ``tree``: coupled tree EAGLE (3 steps, top-k 4, 8 tokens), SGLang's tree
  verify attention (no plugin variable set);
* ``multi_layer``: multi-layer EAGLE on the MTP model, against that model's
  server without speculative decoding;
* ``retraction``: the coupled chain with SGLang's retraction test switch
  (``SGLANG_TEST_RETRACT=1``: every third decode step retracts a request,
  which is prefilled again later);
* ``eagle3_tree``: the same tree shape with the EAGLE3 draft over a reduced
  vocabulary (a draft of the target: the target's ``no_spec`` is the
  reference);
* ``nextn_tree``: the tree shape with NEXTN on the MiMo model (its own MTP
  layer drafts), against ``mimo_no_spec``;
* ``chunked``: the coupled tree with ``--chunked-prefill-size 256`` against
  the server without speculative decoding with the same flag, on prompts of
  600-1500 tokens (3 to 6 chunks each; the tiny models hold 4096
  positions); both servers must report that chunk size in ``/server_info``;
* ``chunked_chain``: the coupled chain on the same long prompts and flag: its
  verify against no speculative decoding's decode past 128 keys (at the tiny
  models' head size FA3 runs a one-row call on another kernel than a verify,
  so without the split those FA3 servers claim ``tokens``);
* on fa3 without the split (``SGLANG_DETSPEC_DECODE_ATTENTION`` set to
  ``sglang`` or ``one_pass`` in the suite's environment), every tree row again
  with ``SGLANG_DETSPEC_TREE_ATTENTION=nodes``
  (``tree_nodes``, ``eagle3_tree_nodes``, ``nextn_tree_nodes``,
  ``chunked_nodes``: one decode query per tree node; the row's
  ``tree_attention`` is ``nodes``, and the server must log that the node
  path serves its target);
* ``cache_hit``: on the server without speculative decoding, the radix cache
  flushed and warmed with the prompts alone, then each request sent again
  with its first 32 output tokens appended to the prompt: those 32 tokens go
  through one extend over the cached prompt (their KV, and the next token's
  logits, from the extend kernel instead of 32 decode steps); compared with
  the first run's last 32 positions. SGLang's deterministic mode keeps the
  radix cache only on the backends of its
  ``RADIX_SUPPORTED_DETERMINISTIC_ATTENTION_BACKEND`` (not flashinfer): there
  the row is written with ``applicable: false`` and the reason, and the
  server's resolved ``disable_radix_cache`` must agree with that list.

* ``prefill_<server>``: decode against prefill, one row per server started
  (``prefill_no_spec``, ``prefill_coupled_chain``, ...,
  ``prefill_coupled_tree_chunked_nodes``): the server's request set again at
  temperature 1 without truncation (same prompts and seeds), then one
  ``/generate`` of each prompt + output with ``return_logprob`` and
  ``logprob_start_len`` 0 (one whole prefill; the radix cache is not
  used from position 0): the logprobs the decode (or verify) returned
  against the prefill's input logprobs at the same positions. ``drafting``
  is ``decode_vs_prefill``; ``claimed`` the server's own guarantee, whose
  ``bitwise`` covers decode = prefill; ``token_sequences_differing`` counts
  sequences whose prefill entries name other token ids (0 unless the
  answer is out of line). Temperature 1 because SGLang returns decode
  logprobs as ``log_softmax(logits / T)`` and prefill logprobs as
  ``log_softmax(logits)``.

Servers are keyed by (family, extra environment, extra flags), so a reference
server serves every row with its flags: 12 servers on triton and on fa3 (16
on fa3 without the split, with the node rows), 9 on flashinfer (its chunked
row starts none), started in parallel.

Per row (``forward_modes_<backend>.json``, the layout of
``docs/e2e/README.md``): the row's name, the positions compared (up to and
including the first differing token), ``differing_positions`` (how many
logprobs differ), the largest absolute difference, the token sequences that
differ, and the guarantee the plugin claims for the speculative server (its
start-up line, ``logits='bitwise'`` or ``'tokens'``; the rule is
``config.logits_guarantee``: ``tokens`` on flashinfer and on FA3 at the
tiny models' head size), and ``asserted``, the claim the row is held to:
the server's, except on node-path rows, where both sides are decode calls
and the FA3 head-size rule does not concern the comparison (held to the
claim without it). The rule reads the flags every server runs with
(``--page-size`` and ``--kv-cache-dtype`` of ``DETSPEC_E2E_SERVER_ARGS``), so
a run at pages above one token (or another KV dtype) holds each row to that
claim, expects each server to log the split not used where it cannot serve
those flags (``_e2e.split_can_serve``), and counts a cache hit as every whole
page of the prompt served from the cache. Checks: the plugin logs the rule's claim on every
server; every row has 0 differing token sequences (``docs/e2e/README.md``);
a row held to ``bitwise`` also has 0 differing logprobs; the retraction row saw retractions; the cache-hit row's second
requests were served from the cache (``cached_tokens`` in ``meta_info``
covers the prompt), so a cache miss fails instead of passing as a hit. A
``tokens`` row's differing logprobs are recorded, not asserted: its promise
is that logits differ by at most a rounding step, and a token flips only on
a near-tie inside that gap (rare: a flip fails the row, to be read against
the recorded logprobs).

``DETSPEC_E2E_BACKENDS`` picks the backends, comma-separated, from
``triton``, ``fa3``, ``flashinfer`` (e.g. ``DETSPEC_E2E_BACKENDS=fa3`` or
``triton,flashinfer``); unset, all three run (fa3 where installed). Another
name, a repeated name or an empty list stops collection with an error that
names the variable and the allowed values; fa3 named where its library does
not load fails the test. One backend per command keeps a run inside a 600 s
limit: each backend starts its servers in parallel (several minutes on an
H200), then sends seconds of traffic. Every server inherits the suite's
``SGLANG_DETSPEC_DECODE_ATTENTION``: by default (``split``) the Triton rows
measure the positional-split kernels and the FA3 rows the prefix / tail split
(each server must log its split on its target; ``forward_modes_<backend>.json``);
with ``one_pass`` or ``sglang`` the paths without it
(``forward_modes_triton_one_pass.json``, ``forward_modes_<backend>_sglang.json``;
FA3's ``one_pass`` is SGLang's calls too). Files of runs before the split
became the default name the setting the other way round: there
``forward_modes_<backend>.json`` is without the split and ``_split`` with it.
"""

import concurrent.futures
import random
import sys

import pytest

import _e2e
import _forward_plan as plan
import _requests
from _register import register_cuda_ci

from sglang_detspec.config import logits_guarantee
from sglang_detspec.model_family import head_dim_of
from sglang_detspec.sglang_plugin.attention_hook import SPLIT_OFF, SPLIT_ON

register_cuda_ci(est_time=600, suite="detspec-e2e-cuda")

NUM_REQUESTS, CACHED_TOKENS = 16, 32
NEW_TOKENS = plan.NEW_TOKENS
PROMPT_SEED = 4242
BACKENDS = plan.selected_backends()
# The flags every server runs with that the claim rule reads (DETSPEC_E2E_SERVER_ARGS): each row is
# held to the claim of the server as started, pages above one token included.
SERVED = {"page_size": _e2e.served_page_size(), "kv_cache_dtype": _e2e.common_flag("--kv-cache-dtype")}
DECODE_ATTENTION = plan.decode_attention()
TEST_ORDER = ("test_forward_modes",)


def request_set(vocab: int, lengths: tuple[int, int]) -> tuple[list[list[int]], list[dict]]:
    """NUM_REQUESTS seeded prompts of ``lengths`` (inclusive, tokens) over ``vocab`` and their sampling parameters."""
    rng = random.Random(PROMPT_SEED)
    prompts = [[rng.randrange(vocab) for _ in range(rng.randint(*lengths))] for _ in range(NUM_REQUESTS)]
    filters = [{}] * (NUM_REQUESTS - 2) + [{"top_k": 20}, {"top_p": 0.9}]
    params = [{"max_new_tokens": NEW_TOKENS, "ignore_eos": True, "temperature": round(rng.uniform(0.8, 1.2), 3),
               "sampling_seed": rng.randrange(2**64), **f} for f in filters]
    return prompts, params


def run(server, prompts, params, want_tokens):
    got = _requests.generate(server.url, prompts, params, return_logprob=True, want_tokens=want_tokens,
                             timeout=300.0)
    return got if len(got) == len(prompts) else [got[0]] * len(prompts)


def compare(reference, other, offset=0) -> dict:
    """Logprobs of ``other`` against ``reference[offset:]``, request by request, up to the first other token."""
    positions = differing = sequences = 0
    max_abs, errors, rows = 0.0, [], []
    for i, (a, b) in enumerate(zip(reference, other)):
        if isinstance(a, str) or isinstance(b, str):
            errors.append(f"request {i}: {a if isinstance(a, str) else b}")
            continue
        ids_a, lp_a = a.output_ids[offset:], a.logprobs[offset:]
        first = _requests.first_difference(ids_a, b.output_ids)
        upto = len(b.output_ids) if first is None else first + 1
        diffs = [abs(float(x) - float(y)) for x, y in zip(lp_a[:upto], b.logprobs[:upto]) if x != y]
        positions += upto
        differing += len(diffs)
        sequences += first is not None
        max_abs = max([max_abs, *diffs])
        rows.append({"request": i, "first_different_token": first, "differing_logprobs": len(diffs),
                     "first_differing_logprob": next((j for j, (x, y) in enumerate(zip(lp_a, b.logprobs)) if x != y),
                                                     None)})
    return {"positions": positions, "differing_positions": differing, "max_abs": max_abs,
            "token_sequences_differing": sequences, "errors": errors, "requests": rows}


def decode_then_prefill(server, prompts, params) -> dict:
    """The decode-against-prefill numbers of one server (``_forward_plan.compare_with_prefill``).

    The request set again at temperature 1 without truncation (same prompts
    and seeds), then one ``/generate`` of every prompt + output with
    ``logprob_start_len`` 0: the logprob of every input token from one
    prefill. Asking from position 0 also keeps SGLang from serving the
    prompt from the radix cache (its prefix match stops at
    ``logprob_start_len``), so it is a whole prefill.
    """
    plain = [{"max_new_tokens": q["max_new_tokens"], "ignore_eos": True, "temperature": 1.0,
              "sampling_seed": q["sampling_seed"]} for q in params]
    decoded = run(server, prompts, plain, NEW_TOKENS)
    good = [i for i, d in enumerate(decoded) if not isinstance(d, str)]
    prefilled = ["the decode failed"] * len(prompts)
    if good:
        body = {"input_ids": [prompts[i] + list(decoded[i].output_ids) for i in good],
                "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
                "return_logprob": True, "logprob_start_len": 0}
        got = _requests.post(server.url, "/generate", body)
        items = got["body"] if got["status"] == 200 and isinstance(got["body"], list) else None
        for n, i in enumerate(good):
            if items is None or len(items) != len(good):
                prefilled[i] = f"prefill: HTTP {got['status']}: {got['text']}"
            else:
                meta = items[n].get("meta_info") if isinstance(items[n], dict) else None
                entries = meta.get("input_token_logprobs") if isinstance(meta, dict) else None
                prefilled[i] = (entries if isinstance(entries, list)
                                else f"prefill: no input_token_logprobs in {str(items[n])[:200]}")
    return plan.compare_with_prefill(decoded, prefilled, [len(p) for p in prompts])


def server_configs(models, backend: str) -> dict:
    """(family, env, args) key -> the :class:`_e2e.ServerConfig` of every server ``backend`` starts."""
    return {key: _e2e.server_config(key[0], models, extra_args=("--attention-backend", backend, *key[2]),
                                    tag=plan.server_tag(backend, key[1], key[2]), extra_env=plan.server_env(key[1]))
            for key in plan.server_keys(backend)}


def server_info(server) -> dict | str:
    """The server's ``/server_info`` (resolved arguments), or what went wrong (str)."""
    got = _requests.get(server.url, "/server_info")
    if got["status"] != 200 or not isinstance(got["body"], dict):
        return f"/server_info answered {got['status']}: {got['text']}"
    return got["body"]


def measure(servers, models, backend: str) -> tuple[list[dict], list[str]]:
    skipped = plan.skipped_rows(backend)
    rows = {name: row for name, row in plan.rows_for(backend).items() if name not in skipped}
    configs = server_configs(models, backend)
    started = servers.ensure_group(list(configs.values()))
    # Traffic: each server with the prompt lengths of the rows it serves (the cache-hit row
    # reuses the short run of its server).
    jobs = list(dict.fromkeys([(plan.CACHE_HIT_SERVER, plan.SHORT_PROMPTS)] + [
        (key, row.prompts) for row in rows.values() for key in (row.server, row.reference_server)]))
    sets = {(configs[key].model, lengths): request_set(_e2e.vocab_size(configs[key].model), lengths)
            for key, lengths in jobs}

    def answers(job):
        key, lengths = job
        server = started[configs[key].name]
        if isinstance(server, str):
            return [server] * NUM_REQUESTS
        return run(server, *sets[(configs[key].model, lengths)], NEW_TOKENS)

    with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
        results = dict(zip(jobs, pool.map(answers, jobs)))
    # Decode against prefill, after the rows' traffic so that traffic's batches stay as they were.
    prefill_keys = plan.prefill_rows(backend)

    def against_prefill(key):
        server = started[configs[key].name]
        if isinstance(server, str):
            return plan.compare_with_prefill([server] * NUM_REQUESTS, [server] * NUM_REQUESTS, [0] * NUM_REQUESTS)
        return decode_then_prefill(server, *sets[(configs[key].model, plan.prompt_lengths(key))])

    with concurrent.futures.ThreadPoolExecutor(len(prefill_keys)) as pool:
        prefill_results = dict(zip(prefill_keys, pool.map(against_prefill, prefill_keys.values())))
    out, problems = [], []
    for name, row in rows.items():
        spec, base = configs[row.server], configs[row.reference_server]
        outcome = compare(results[(row.reference_server, row.prompts)], results[(row.server, row.prompts)])
        server = started[spec.name]
        claims = [] if isinstance(server, str) else _e2e.claimed_logits(server)
        expected = logits_guarantee(backend, plan.eagle_topk(row.family), row.tree_attention, DECODE_ATTENTION,
                                    head_dim=head_dim_of(spec.model), **SERVED)
        if claims != [expected]:
            problems.append(f"{backend} {name}: the plugin logged logits={claims}, expected [{expected!r}]")
        node_problem = (_e2e.node_path_problem(server)
                        if row.tree_attention == "nodes" and not isinstance(server, str) else None)
        if node_problem:
            problems.append(f"{backend} {name}: {node_problem}")
        # A node-path row compares decode calls with decode calls (each node's verify is a decode query),
        # which the head-size rule does not concern: it is held to the claim without that rule.
        held = (logits_guarantee(backend, plan.eagle_topk(row.family), row.tree_attention, DECODE_ATTENTION, **SERVED)
                if row.tree_attention == "nodes" else expected)
        out.append({"backend": backend, "row": name, "drafting": row.drafting, "tree_attention": row.tree_attention,
                    "claimed": expected, "asserted": held, "server": spec.name, "reference": base.name,
                    "applicable": True, "not_applicable": None, **outcome})
    for name, reason in skipped.items():
        row = plan.rows_for(backend)[name]
        claim = logits_guarantee(backend, plan.eagle_topk(row.family), row.tree_attention, DECODE_ATTENTION,
                                 head_dim=head_dim_of(_e2e.served_model(row.family, models)), **SERVED)
        out.append({"backend": backend, "row": name, "drafting": row.drafting, "tree_attention": row.tree_attention,
                    "claimed": claim, "asserted": claim,
                    "server": None, "reference": None, "applicable": False, "not_applicable": reason,
                    "positions": 0, "differing_positions": None, "max_abs": None, "token_sequences_differing": None,
                    "errors": [], "requests": []})
    retract_key = plan.ROWS["retraction"].server
    retracted = sum(r.retractions or 0 for r in results[(retract_key, plan.SHORT_PROMPTS)] if not isinstance(r, str))
    if not retracted:
        problems.append(f"{backend} retraction: no request was retracted on {configs[retract_key].name} "
                        "(the row did not run)")
    out[[r["row"] for r in out].index("retraction")]["retracted_requests"] = retracted
    problems += chunking_problems(backend, configs, started)
    cache_row, cache_problems = cache_hit(backend, configs[plan.CACHE_HIT_SERVER], started,
                                          results[(plan.CACHE_HIT_SERVER, plan.SHORT_PROMPTS)], sets)
    out.append(cache_row)
    problems += cache_problems
    for name, key in prefill_keys.items():
        attention = plan.tree_attention(key[1])
        claim = logits_guarantee(backend, plan.eagle_topk(key[0]), attention, DECODE_ATTENTION,
                                 head_dim=head_dim_of(configs[key].model), **SERVED)
        out.append({"backend": backend, "row": name, "drafting": plan.DECODE_VS_PREFILL, "tree_attention": attention,
                    "claimed": claim, "asserted": claim,
                    "server": configs[key].name, "reference": configs[key].name, "applicable": True,
                    "not_applicable": None, **prefill_results[name]})
    for key, config in configs.items():
        server = started[config.name]
        if isinstance(server, str):
            problems.append(server)
            continue
        problems += _e2e.plugin_problems(server)
        split_serves = _e2e.split_can_serve(backend, **SERVED)
        if backend == "triton" and DECODE_ATTENTION == "split":
            want, not_want = (SPLIT_ON, SPLIT_OFF) if split_serves else (SPLIT_OFF, SPLIT_ON)
            if not server.log_lines(want) or server.log_lines(not_want):
                problems.append(f"{backend} {config.name}: expected the start-up line {want!r} at these flags "
                                f"({SERVED}; its lines: {server.log_lines('DECODE_ATTENTION=split')[:1]})")
        if backend == "fa3":
            problem = _e2e.fa3_path_problem(server, DECODE_ATTENTION, head_dim_of(config.model),
                                            plan.verifies_trees(key[0]), split_serves)
            problems += [f"{backend} {problem}"] if problem else []
        # A server without speculative decoding claims what its backend's decode promises.
        plain = logits_guarantee(backend, None, decode_attention=DECODE_ATTENTION, head_dim=head_dim_of(config.model),
                                 **SERVED)
        if _e2e.family(key[0]).draft is None and _e2e.claimed_logits(server) != [plain]:
            problems.append(f"{backend} {config.name}: the plugin logged logits={_e2e.claimed_logits(server)}, "
                            f"expected [{plain!r}]")
    for row in out:
        label = f"{backend} {row['row']}"
        problems += [f"{label}: {e}" for e in row["errors"][:3]]
        if row["asserted"] == "bitwise" and (row["differing_positions"] or row["token_sequences_differing"]):
            problems.append(f"{label}: {row['differing_positions']} of {row['positions']} "
                            f"logprobs differ (max {row['max_abs']:.3g}) and {row['token_sequences_differing']} "
                            f"of {NUM_REQUESTS} token sequences, held to bitwise (claimed {row['claimed']})")
        elif row["token_sequences_differing"]:
            problems.append(f"{label}: {row['token_sequences_differing']} of {NUM_REQUESTS} token sequences differ "
                            f"(0 required on every row; {row['differing_positions']} of {row['positions']} "
                            f"logprobs differ, max {row['max_abs']:.3g})")
    return out, problems


def chunking_problems(backend: str, configs: dict, started: dict) -> list[str]:
    """The chunked rows' servers must run with the chunk size asked for (every long prompt is then chunked)."""
    problems = []
    for key, config in configs.items():
        server = started[config.name]
        if key[2] != plan.CHUNKED_PREFILL or isinstance(server, str):
            continue
        info = server_info(server)
        size = info.get("chunked_prefill_size") if isinstance(info, dict) else info
        if size != plan.CHUNK_TOKENS:
            problems.append(f"{backend} {config.name}: chunked_prefill_size is {size!r}, not {plan.CHUNK_TOKENS}: "
                            f"the {plan.LONG_PROMPTS[0]}+ token prompts may not have been chunked")
    return problems


def cache_hit(backend: str, config, started: dict, first: list, sets: dict) -> tuple[dict, list[str]]:
    """The cache-hit row and its problems.

    The reference server again, its cache holding each prompt alone, then each
    prompt followed by its first CACHED_TOKENS outputs (one extend of those
    tokens over the prompt). Where SGLang turned the radix cache off (its
    deterministic mode on flashinfer) the row is recorded as not applicable,
    with the reason; the server's resolved ``disable_radix_cache`` decides,
    and it must agree with SGLang's list of backends that keep the cache.
    """
    problems = []
    server = started[config.name]
    claim = logits_guarantee(backend, None, decode_attention=DECODE_ATTENTION, head_dim=head_dim_of(config.model),
                             **SERVED)
    row = {"backend": backend, "row": plan.CACHE_HIT, "drafting": plan.CACHE_HIT, "tree_attention": "cascade",
           "claimed": claim, "asserted": claim, "server": config.name, "reference": config.name,
           "applicable": True, "not_applicable": None}
    skip = plan.cache_hit_skip_reason(backend)
    if not isinstance(server, str):
        info = server_info(server)
        if isinstance(info, str):
            problems.append(f"{backend} cache_hit: {info}")
        elif bool(info.get("disable_radix_cache")) != (skip is not None):
            problems.append(f"{backend} cache_hit: the server's disable_radix_cache is "
                            f"{info.get('disable_radix_cache')!r}, but SGLang's list of backends that keep the "
                            f"radix cache in deterministic mode ({', '.join(plan.radix_cache_backends())}) says "
                            f"{skip is not None}")
    if skip is not None:
        empty = compare([], [])
        return {**row, "applicable": False, "not_applicable": skip, **empty}, problems
    if isinstance(server, str) or any(isinstance(r, str) for r in first):
        again = [server if isinstance(server, str) else "the first run failed"] * NUM_REQUESTS
    else:
        prompts, params = sets[(config.model, plan.SHORT_PROMPTS)]
        again, found = _requests.resend_over_cache(server, run, prompts, params, first, CACHED_TOKENS,
                                                   NEW_TOKENS - CACHED_TOKENS, SERVED["page_size"])
        problems += [f"{backend} cache_hit: {p}" for p in found]
    return {**row, **compare(first, again, offset=CACHED_TOKENS)}, problems


@pytest.mark.parametrize("backend", BACKENDS)
def test_forward_modes(servers, models, backend):
    if backend == "fa3" and not _e2e.fa3_installed():
        pytest.fail(f"{plan.BACKENDS_ENV} names fa3, but sgl-kernel's FA3 library is not installed (or does not load)")
    rows, problems = measure(servers, models, backend)
    path = _e2e.write_result(plan.result_name(backend, DECODE_ATTENTION),
                             {"passed": not problems, "problems": problems, "decode_attention": DECODE_ATTENTION,
                              "rows": rows})
    assert not problems, "; ".join(problems[:6]) + f" ({path})"


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
