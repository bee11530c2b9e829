"""The same seeded requests on several servers at once: outputs, comparisons, accept lengths.

Coupled verification (DESIGN.md section 5) promises that a seeded request's
tokens are a function of (seed, prompt, target numerics) alone: the same with
speculative decoding off, with any draft model, chain or tree. The suites
start a group of servers side by side (``Servers.ensure_group``), send each
the same :data:`NUM_REQUESTS` requests and compare every server's tokens with
those of the reference server (no speculative decoding), request by request.
"""

from __future__ import annotations

import concurrent.futures
import random

import _e2e
import _requests

# A batch of 8 x 64 tokens takes well under a second on the tiny models (a few seconds with a
# first Triton compilation): a request still open after this long hangs, and the server's stacks are written before the test goes on.
QUERY_TIMEOUT_S = 120.0
NEW_TOKENS = 64  # long enough for a few dozen verify rounds per request: the accept lengths
# Seeds across the uint64 range; temperatures around 1; the last two rows go through
# SGLang's top-k / top-p target-sampling path (sent as their own batch: one such row sends
# its whole batch down that path).
SEEDS = (0, 1, 2, 3, 12345, 2**63, 2**64 - 1, 987654321)
TEMPERATURES = (1.0, 1.0, 0.7, 1.3, 1.0, 1.0, 1.0, 1.0)
FILTERS = ({}, {}, {}, {}, {}, {}, {"top_k": 20}, {"top_p": 0.9})
PLAIN_ROWS = 6
NUM_REQUESTS = len(SEEDS)
PROMPT_SEED = 909


def request_set(vocab: int, temperature: float | None = None) -> tuple[list[list[int]], list[dict]]:
    """The prompts (4..40 random token ids, fixed seed) and sampling params of the 8 requests.

    ``temperature``: every request at this temperature instead of :data:`TEMPERATURES`.
    """
    rng = random.Random(PROMPT_SEED)
    prompts = [[rng.randrange(vocab) for _ in range(rng.randint(4, 40))] for _ in range(NUM_REQUESTS)]
    temps = TEMPERATURES if temperature is None else [temperature] * NUM_REQUESTS
    params = [{"max_new_tokens": NEW_TOKENS, "temperature": t, "ignore_eos": True, "sampling_seed": s, **f}
              for s, t, f in zip(SEEDS, temps, FILTERS)]
    return prompts, params


def query(server: _e2e.RunningServer, vocab: int, temperature: float | None = None) -> list:
    """The 8 requests on ``server``: the plain rows as one batch, then the filtered rows; 8 results in order."""
    return send(server, *request_set(vocab, temperature), NEW_TOKENS)


def send(server: _e2e.RunningServer, prompts: list, params: list, want_tokens: int) -> list:
    """``prompts`` (8, in :func:`request_set`'s row order) with ``params``: the plain rows as one batch, then the
    filtered rows, as :func:`query` sends them; 8 results in order, an error string in place of each one that failed."""
    results = []
    for lo, hi in ((0, PLAIN_ROWS), (PLAIN_ROWS, NUM_REQUESTS)):
        if results and any(isinstance(r, str) and "stacks:" in r for r in results):
            results += [results[-1]] * (hi - lo)  # the server hung: no second wait
            continue
        got = _requests.generate(server.url, prompts[lo:hi], params[lo:hi], return_logprob=True,
                                 want_tokens=want_tokens, timeout=QUERY_TIMEOUT_S)
        if isinstance(got, list) and any(isinstance(g, str) and "Timeout" in g for g in got):
            got = [f"{g} (stacks: {server.dump_stacks('query_timeout').name})" if isinstance(g, str) else g
                   for g in got]
        if len(got) != hi - lo:  # an HTTP error: one message for the whole batch
            got = [got[0] if _requests.errors(got) else f"{len(got)} results for {hi - lo} requests"] * (hi - lo)
        results += got
    return results


def accept_length(results: list) -> float | None:
    """Committed tokens per verify round over all results (SGLang's ``spec_accept_length``); None without rounds."""
    done = [r for r in results if not isinstance(r, str)]
    if not done or len(done) != len(results) or any(r.verify_ct is None for r in done):
        return None
    rounds = sum(r.verify_ct for r in done)
    return sum(len(r.output_ids) for r in done) / rounds if rounds else None


# SGLang's log line when adaptive speculation swaps its draft-step state (eagle_worker_v2.apply_runtime_state).
ADAPTIVE_SWITCH = "Switch adaptive runtime state"


def run_group(servers: _e2e.Servers, configs, vocab: int, result_name: str,
              temperature: float | None = None) -> dict:
    """Start ``configs`` side by side, query each, write ``<result_name>.json`` with every output.

    Returns name -> ``{"config", "error" (str or None), "results", "plugin_problems",
    "accept_length", "adaptive_switches", "server"}``; ``adaptive_switches``: how many
    times the server's log says SGLang's adaptive speculation switched its draft steps.
    """
    started = servers.ensure_group(configs)
    live = {name: s for name, s in started.items() if not isinstance(s, str)}
    with concurrent.futures.ThreadPoolExecutor(max(1, len(live))) as pool:
        answers = dict(zip(live, pool.map(lambda s: query(s, vocab, temperature), live.values())))
    group = {}
    for config in configs:
        server = started[config.name]
        if isinstance(server, str):
            group[config.name] = {"config": config, "error": server, "results": [], "plugin_problems": [],
                                  "accept_length": None, "adaptive_switches": None, "server": config.to_json()}
            continue
        results = answers[config.name]
        group[config.name] = {
            "config": config, "error": None, "results": results,
            "plugin_problems": _e2e.plugin_problems(server),
            "accept_length": accept_length(results),
            "adaptive_switches": len(server.log_lines(ADAPTIVE_SWITCH)), "server": server.facts(),
        }
    prompts, params = request_set(vocab, temperature)
    _e2e.write_result(result_name, {
        "requests": [{"input_ids": p, "sampling_params": {**q, "sampling_seed": str(q["sampling_seed"])}}
                     for p, q in zip(prompts, params)],
        "servers": {name: {"error": g["error"], "plugin_problems": g["plugin_problems"],
                           "accept_length": g["accept_length"], "adaptive_switches": g["adaptive_switches"],
                           "server": g["server"],
                           "results": [r if isinstance(r, str) else r.to_json() for r in g["results"]]}
                    for name, g in group.items()},
    })
    return group


def compare(group: dict, reference: str, other: str) -> dict:
    """``other``'s results against ``reference``'s, request by request, and what keeps the check from passing.

    Returns ``{"rows", "requests_with_other_tokens", "requests_with_other_logprobs",
    "problems", ...}``; ``problems`` covers servers that did not start, errors,
    the plugin's start-up state and differing tokens. Logprob equality is
    recorded, not required.
    """
    ref, got = group[reference], group[other]
    problems = []
    for name, g in ((reference, ref), (other, got)):
        if g["error"]:
            problems.append(f"{name}: {g['error']}")
        problems += g["plugin_problems"]
        problems += [f"{name}: request {i}: {r}" for i, r in enumerate(g["results"]) if isinstance(r, str)]
    rows = []
    for i, (a, b) in enumerate(zip(ref["results"], got["results"])):
        if isinstance(a, str) or isinstance(b, str):
            continue
        rows.append({
            "request": i, "sampling_seed": str(SEEDS[i]),
            "same_tokens": a.output_ids == b.output_ids,
            "first_different_token": _requests.first_difference(a.output_ids, b.output_ids),
            "same_logprobs_bitwise": a.logprobs == b.logprobs,
            "reference_output_ids": list(a.output_ids), "output_ids": list(b.output_ids),
            "verify_rounds": b.verify_ct,
        })
    other_tokens = sum(not r["same_tokens"] for r in rows)
    if other_tokens:
        problems.append(f"{other}: {other_tokens} of {len(rows)} requests gave other tokens than {reference}")
    if not problems and len(rows) != NUM_REQUESTS:
        problems.append(f"only {len(rows)} of {NUM_REQUESTS} requests compared")
    return {
        "reference": reference, "server": other, "requests_compared": len(rows),
        "requests_with_other_tokens": other_tokens,
        "requests_with_other_logprobs": sum(not r["same_logprobs_bitwise"] for r in rows),
        "accept_length": got["accept_length"], "reference_accept_length": ref["accept_length"],
        "problems": problems, "rows": rows,
        "servers": {reference: ref["server"], other: got["server"]},
    }


def accept_rows(group: dict, rows: dict, reference_of) -> tuple[list[dict], list[str]]:
    """One row per configuration of ``rows`` (name -> (verify, draft, steps, topk, draft tokens, rejection flag)).

    ``reference_of(name)`` names the server without speculative decoding of
    that configuration's model (the group's names end in ``_det_cuda_graph``).
    A row: ``{"config", "verify", "draft", "steps", "topk", "draft_tokens",
    "rejection_flag", "accept_length", "equal_to_no_spec"}`` (the layout of
    ``docs/e2e/README.md``). Problems: every server problem, and differing
    tokens for coupled configurations only (rejection mode promises the
    target's distribution, not the reference's tokens), and a missing accept
    length.
    """
    out, problems = [], []
    for name, (verify, draft, steps, topk, tokens, flag) in rows.items():
        outcome = compare(group, f"{reference_of(name)}_det_cuda_graph", f"{name}_det_cuda_graph")
        problems += [p for p in outcome["problems"] if verify == "coupled" or "gave other tokens" not in p]
        out.append({"config": name, "verify": verify, "draft": draft, "steps": steps, "topk": topk,
                    "draft_tokens": tokens, "rejection_flag": flag, "accept_length": outcome["accept_length"],
                    "equal_to_no_spec": outcome["requests_compared"] - outcome["requests_with_other_tokens"]})
    problems += [f"{r['config']}: no accept length" for r in out if r["accept_length"] is None]
    return out, problems


def check_same_tokens(group: dict, reference: str, other: str, result_name: str) -> None:
    """Write and assert: ``other`` gave the reference's tokens for every request."""
    outcome = compare(group, reference, other)
    path = _e2e.write_result(result_name, {"passed": not outcome["problems"], **outcome})
    assert not outcome["problems"], "; ".join(outcome["problems"][:6]) + f" ({path})"
