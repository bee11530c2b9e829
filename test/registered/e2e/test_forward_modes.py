"""Forward modes: the target's logprobs with speculative decoding on, after a retraction and after a cache hit.

Every token of coupled mode is the TARGET-stream race over p_t, so "spec on =
spec off" holds down to the logprob only where the target's verify (and
prefill, and re-prefill) forward gives the decode forward's logits bit for bit
(``docs/forward_modes.md``). This suite measures it per attention backend
(``triton``; ``fa3`` where sgl-kernel's FA3 library is installed), each server
against the server without speculative decoding on the same backend, 16 seeded
requests x 64 tokens (temperatures 0.8-1.2, two filtered rows), with
``return_logprob``:

* ``chain``: coupled chain EAGLE (3 steps);
* ``tree``: coupled tree EAGLE (3 steps, top-k 4, 8 tokens), SGLang's tree
  verify attention; on fa3 also with ``SGLANG_DETSPEC_TREE_ATTENTION=nodes``
  (one decode query per tree node; the row's ``tree_attention`` is ``nodes``,
  and the server must log that the node path serves its target);
* ``multi_layer``: multi-layer EAGLE on the MTP model, against that model's
  server without speculative decoding;
* ``retraction``: the coupled chain with SGLang's retraction test switch
  (``SGLANG_TEST_RETRACT=1``: every third decode step retracts a request,
  which is prefilled again later);
* ``cache_hit``: on the server without speculative decoding, the radix cache
  flushed and warmed with the prompts alone, then each request sent again
  with its first 32 output tokens appended to the prompt: those 32 tokens go
  through one extend over the cached prompt (their KV, and the next token's
  logits, from the extend kernel instead of 32 decode steps); compared with
  the first run's last 32 positions.

Per row (``forward_modes.json``, the layout of ``docs/e2e/README.md``): the
positions compared (up to and including the first differing token), how many
logprobs differ, the largest absolute difference, the token sequences that
differ, and the guarantee the plugin claims for the speculative server (its
start-up line, ``logits='bitwise'`` or ``'tokens'``; the rule is
``config.logits_guarantee``). Checks: the plugin logs the rule's claim; every
row has 0 differing token sequences (``docs/e2e/README.md``); a ``bitwise``
row also has 0 differing logprobs; the retraction row saw retractions; the
cache-hit row's second requests were served from the cache (``cached_tokens``
in ``meta_info`` covers the prompt), so a cache miss fails instead of passing
as a hit. A ``tokens`` row's differing logprobs are recorded, not asserted:
its promise is that logits differ by at most a rounding step, and a token
flips only on a near-tie inside that gap (rare: a flip fails the row, to be
read against the recorded logprobs).

About 5 minutes on an H200 per backend: 6 server starts in parallel, then
seconds of traffic.
"""

import concurrent.futures
import random
import re
import sys

import pytest

import _e2e
import _requests
from _register import register_cuda_ci

from sglang_detspec.config import logits_guarantee
from sglang_detspec.sglang_plugin.tree_attention_hook import NODE_PATH_OFF, NODE_PATH_ON

register_cuda_ci(est_time=600, suite="detspec-e2e-cuda")

NUM_REQUESTS, NEW_TOKENS, CACHED_TOKENS = 16, 64, 32
PROMPT_SEED = 4242
FORCE_RETRACT = (("SGLANG_TEST_RETRACT", "1"),)
TREE_NODES = (("SGLANG_DETSPEC_TREE_ATTENTION", "nodes"),)
BACKENDS = ("triton", "fa3") if _e2e.fa3_installed() else ("triton",)
# row -> (drafting, family, reference family, extra environment, eagle top-k for the claim)
ROWS = {
    "chain": ("chain", "coupled_chain", "no_spec", (), 1),
    "tree": ("tree", "coupled_tree", "no_spec", (), 4),
    "multi_layer": ("multi_layer", "mtp_coupled", "mtp_no_spec", (), 1),
    "retraction": ("retraction", "coupled_chain", "no_spec", FORCE_RETRACT, 1),
}
# The node path is FA3's (sglang_plugin/tree_attention_hook.py).
BACKEND_ROWS = {"fa3": {"tree_nodes": ("tree", "coupled_tree", "no_spec", TREE_NODES, 4)}}
ENV_TAGS = {FORCE_RETRACT: "_retract", TREE_NODES: "_nodes"}
LOGITS_FIELD = re.compile(r"logits='(\w+)'")
TEST_ORDER = ("test_forward_modes",)


def request_set(vocab: int) -> tuple[list[list[int]], list[dict]]:
    rng = random.Random(PROMPT_SEED)
    prompts = [[rng.randrange(vocab) for _ in range(rng.randint(4, 40))] for _ in range(NUM_REQUESTS)]
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


def claimed_by(server) -> list[str]:
    return sorted({m for line in server.log_lines(_e2e.PLUGIN_ACTIVE) for m in LOGITS_FIELD.findall(line)})


def measure(servers, models, backend: str) -> tuple[list[dict], list[str]]:
    backend_args = ("--attention-backend", backend)
    rows = {**ROWS, **BACKEND_ROWS.get(backend, {})}
    configs = {}
    for _, family, ref, env, _ in rows.values():
        for fam, extra in ((family, env), (ref, ())):
            tag = backend + ENV_TAGS.get(extra, "")
            configs[(fam, extra)] = _e2e.server_config(fam, models, extra_args=backend_args, tag=tag, extra_env=extra)
    started = servers.ensure_group(list(configs.values()))
    vocab = {"target": _e2e.vocab_size(models.target), "mtp": _e2e.vocab_size(models.mtp)}
    sets = {m: request_set(v) for m, v in vocab.items()}

    def answers(config):
        server = started[config.name]
        if isinstance(server, str):
            return [server] * NUM_REQUESTS
        prompts, params = sets["mtp" if config.model == models.mtp else "target"]
        return run(server, prompts, params, NEW_TOKENS)

    with concurrent.futures.ThreadPoolExecutor(len(configs)) as pool:
        results = dict(zip(configs, pool.map(answers, configs.values())))
    out, problems = [], []
    for row, (drafting, family, ref, env, topk) in rows.items():
        spec, base = configs[(family, env)], configs[(ref, ())]
        outcome = compare(results[(ref, ())], results[(family, env)])
        server = started[spec.name]
        claims = [] if isinstance(server, str) else claimed_by(server)
        tree_attention = "nodes" if env == TREE_NODES else "cascade"
        expected = logits_guarantee(backend, topk, tree_attention)
        if claims != [expected]:
            problems.append(f"{backend} {row}: the plugin logged logits={claims}, expected [{expected!r}]")
        if tree_attention == "nodes" and not isinstance(server, str) and (
                not server.log_lines(NODE_PATH_ON) or server.log_lines(NODE_PATH_OFF)):
            problems.append(f"{backend} {row}: the node path did not run (its start-up lines: "
                            f"{server.log_lines('FA3 tree verify')[:2]})")
        out.append({"backend": backend, "drafting": drafting, "tree_attention": tree_attention, "claimed": expected,
                    "server": spec.name, "reference": base.name, **outcome})
    retract_config = configs[("coupled_chain", FORCE_RETRACT)]
    retracted = sum(r.retractions or 0 for r in results[("coupled_chain", FORCE_RETRACT)] if not isinstance(r, str))
    if not retracted:
        problems.append(f"{backend} retraction: no request was retracted on {retract_config.name} (the row did not run)")
    # The cache hit: the reference server again, its cache holding each prompt alone, then each
    # prompt followed by its first CACHED_TOKENS outputs (one extend of those tokens over the prompt).
    ref_config = configs[("no_spec", ())]
    first = results[("no_spec", ())]
    server = started[ref_config.name]
    if isinstance(server, str) or any(isinstance(r, str) for r in first):
        again = [server if isinstance(server, str) else "the first run failed"] * NUM_REQUESTS
    else:
        prompts, params = sets["target"]
        flushed = _requests.post(server.url, "/flush_cache", {})
        warm = run(server, prompts, [{**q, "max_new_tokens": 1} for q in params], 1)
        again = run(server, [p + list(r.output_ids[:CACHED_TOKENS]) for p, r in zip(prompts, first)],
                    [{**q, "max_new_tokens": NEW_TOKENS - CACHED_TOKENS} for q in params], NEW_TOKENS - CACHED_TOKENS)
        if flushed["status"] != 200:
            problems.append(f"{backend} cache_hit: /flush_cache answered {flushed['status']}: {flushed['text']}")
        problems += [f"{backend} cache_hit warm-up: {w}" for w in warm if isinstance(w, str)][:2]
        # SGLang matches at most all but the last input token; the warmed prompt is all of it but that one.
        misses = [i for i, (p, r) in enumerate(zip(prompts, again))
                  if not isinstance(r, str) and (r.cached_tokens or 0) < len(p) - 1]
        if misses:
            problems.append(f"{backend} cache_hit: requests {misses[:5]} were not served from the radix cache "
                            f"(meta_info cached_tokens below the prompt length): the row measured no cache hit")
    out.append({"backend": backend, "drafting": "cache_hit", "tree_attention": "cascade",
                "claimed": logits_guarantee(backend, None),
                "server": ref_config.name, "reference": ref_config.name,
                **compare(first, again, offset=CACHED_TOKENS)})
    out[[r["drafting"] for r in out].index("retraction")]["retracted_requests"] = retracted
    for config in configs.values():
        if isinstance(started[config.name], str):
            problems.append(started[config.name])
        else:
            problems += _e2e.plugin_problems(started[config.name])
    for row in out:
        label = f"{backend} {row['drafting']}" + (" (nodes)" if row["tree_attention"] == "nodes" else "")
        problems += [f"{label}: {e}" for e in row["errors"][:3]]
        if row["claimed"] == "bitwise" and (row["differing_positions"] or row["token_sequences_differing"]):
            problems.append(f"{label}: {row['differing_positions']} of {row['positions']} "
                            f"logprobs differ (max {row['max_abs']:.3g}) and {row['token_sequences_differing']} "
                            f"of {NUM_REQUESTS} token sequences, claimed bitwise")
        elif row["token_sequences_differing"]:
            problems.append(f"{label}: {row['token_sequences_differing']} of {NUM_REQUESTS} token sequences differ "
                            f"(0 required on every row; {row['differing_positions']} of {row['positions']} "
                            f"logprobs differ, max {row['max_abs']:.3g})")
    return out, problems


@pytest.mark.parametrize("backend", BACKENDS)
def test_forward_modes(servers, models, backend):
    rows, problems = measure(servers, models, backend)
    path = _e2e.write_result(f"forward_modes_{backend}", {"passed": not problems, "problems": problems,
                                                          "rows": rows})
    assert not problems, "; ".join(problems[:6]) + f" ({path})"


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
