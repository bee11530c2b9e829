"""A coupled tree that drafts as a chain at large or long batches gives the tokens of no speculative decoding.

Servers, side by side, on the tiny Llama target with ``--enable-deterministic-inference``
and CUDA graphs:

* ``no_spec``: no speculative decoding (the reference);
* ``coupled_tree``: tree EAGLE (steps 3, top-k 4, 8 draft tokens), coupled verify;
* ``coupled_tree_chain_switch``: the same tree with ``SGLANG_DETSPEC_TREE_CHAIN_BATCH=3``
  (``sglang_plugin/shape_hook.py``): decode batches of more than 3 requests draft a chain
  of 3 steps (top-k 1, 4 draft tokens), smaller ones the tree;
* ``coupled_tree_token_switch``: the same tree with ``SGLANG_DETSPEC_TREE_CHAIN_TOKENS=100``:
  decode batches whose summed sequence length passes 100 tokens draft the chain, whatever
  their size (a single request crosses the bound as it grows), so the chain also runs
  batches of one request, under CUDA graphs captured at every size.

Requests: 12 seeded sampled requests (prompts of 4..40 random ids, temperature 1,
``ignore_eos``; a top-k, a top-p, a min-p, a top-k and top-p, and a
temperature-0.7 row) with ``max_new_tokens`` 8, 16, ..., 96, in three rounds:

1. as one ``/generate`` batch with logprobs: the decode batch shrinks from 12 to 1 as they
   finish, so the switching server drafts chains, then trees, switching with
   requests in flight (their draft inputs made in the other shape);
2. as 12 concurrent single requests (batches as the scheduler forms them);
3. the longest one alone (the tree throughout).

Checks (``<DETSPEC_E2E_OUT>/draft_shape_*.json``):

1. Every request of every round: the switching server's tokens equal
   ``no_spec``'s, and so do ``coupled_tree``'s (the control that the
   reference holds for the fixed tree); the same for the token-bound server.
2. Each switching server built its chain state and switched both ways
   (its log's ``draft shape switched to chain`` and ``... to tree`` lines),
   built the chain's target-verify CUDA graphs (the plugin's start-up line
   names their batch sizes: SGLang logs no capture line for a graph runner
   built outside its model runner's set-up) and replayed one at the first
   chain step (``verify CUDA graph: True`` on the switch line, SGLang's own
   flag from that step's result): the positive controls that check 1
   compared tokens drafted in both shapes, verified as a server runs them.
3. Accept lengths of both speculative servers per round (a figure).

About 3 minutes on an H200: four server starts side by side, then seconds of traffic.
"""

import concurrent.futures
import random
import sys

import pytest

import _e2e
import _requests
from _register import register_cuda_ci
from _invariance import accept_length
from sglang_detspec.sglang_plugin.shape_hook import SWITCH_LOG, VERIFY_GRAPH_LOG

register_cuda_ci(est_time=200, suite="detspec-e2e-cuda")

REFERENCE = "no_spec"
TREE = "coupled_tree"
SWITCHES = ("coupled_tree_chain_switch", "coupled_tree_token_switch")
GROUP = (REFERENCE, TREE, *SWITCHES)
NUM_REQUESTS = 12
# Rows with the sampling settings a verify handles apart (penalties are a documented limit: SGLang applies
# them once per verify round, so they differ between speculative decoding on and off).
FILTERS = {3: {"top_k": 20}, 5: {"top_p": 0.9}, 7: {"min_p": 0.05}, 9: {"top_k": 5, "top_p": 0.8},
           11: {"temperature": 0.7}}
PROMPT_SEED = 20261204
TIMEOUT_S = 180.0
# The plugin's start-up line for the chain state names its target-verify graph sizes (shape_hook.graph_sizes_note).
CHAIN_GRAPHS = "its target verify CUDA graphs at batch sizes"
TEST_ORDER = (
    "test_switching_tree_gives_the_tokens_of_no_speculative_decoding",
    "test_switching_tree_switched_both_ways",
)


def requests_of(vocab: int) -> tuple[list[list[int]], list[dict]]:
    """The 12 prompts and sampling params (seeded; ``max_new_tokens`` 8 * (i + 1))."""
    rng = random.Random(PROMPT_SEED)
    prompts = [[rng.randrange(3, vocab) for _ in range(rng.randint(4, 40))] for _ in range(NUM_REQUESTS)]
    params = [{"max_new_tokens": 8 * (i + 1), "temperature": 1.0, "ignore_eos": True,
               "sampling_seed": rng.randrange(2**63), **FILTERS.get(i, {})} for i in range(NUM_REQUESTS)]
    return prompts, params


def rounds(url: str, vocab: int) -> dict[str, list]:
    """The three rounds on one server: round name -> one result per request (Generated or an error string)."""
    prompts, params = requests_of(vocab)
    batch = _requests.generate(url, prompts, params, return_logprob=True, timeout=TIMEOUT_S)
    if len(batch) != NUM_REQUESTS:
        batch = [batch[0] if _requests.errors(batch) else f"{len(batch)} results"] * NUM_REQUESTS
    with concurrent.futures.ThreadPoolExecutor(NUM_REQUESTS) as pool:
        single = list(pool.map(lambda i: _requests.generate(url, prompts[i], params[i], timeout=TIMEOUT_S)[0],
                               range(NUM_REQUESTS)))
    alone = _requests.generate(url, prompts[-1], params[-1], timeout=TIMEOUT_S)[:1]
    return {"batch": batch, "concurrent": single, "alone": alone}


@pytest.fixture(scope="module")
def group(servers, models):
    vocab = _e2e.vocab_size(models.target)
    configs = [_e2e.server_config(name, models) for name in GROUP]

    def run():
        started = servers.ensure_group(configs)
        out = {}
        for family in GROUP:
            server = started[f"{family}_det_cuda_graph"]
            if isinstance(server, str):
                out[family] = {"error": server}
                continue
            out[family] = {"error": None, "rounds": rounds(server.url, vocab),
                           "plugin_problems": _e2e.plugin_problems(server),
                           "switch_lines": server.log_lines(SWITCH_LOG),
                           "chain_graphs": server.log_lines(CHAIN_GRAPHS), "server": server.facts()}
        return out

    return servers.remember("draft_shape", run)


def differences(group: dict, family: str) -> tuple[list[dict], list[str]]:
    """Per request and round, ``family`` against the reference; and the problems (errors, other tokens)."""
    ref, got = group[REFERENCE], group[family]
    problems = [f"{name}: {g['error']}" for name, g in ((REFERENCE, ref), (family, got)) if g["error"]]
    if problems:
        return [], problems
    problems += got["plugin_problems"]
    rows = []
    for name, results in got["rounds"].items():
        for i, (a, b) in enumerate(zip(ref["rounds"][name], results)):
            if isinstance(a, str) or isinstance(b, str):
                problems.append(f"{family} round {name} request {i}: {b if isinstance(b, str) else a}")
                continue
            same = a.output_ids == b.output_ids
            rows.append({"round": name, "request": i, "same_tokens": same, "tokens": len(b.output_ids),
                         "first_different_token": _requests.first_difference(a.output_ids, b.output_ids)})
            if not same:
                problems.append(f"{family} round {name} request {i}: other tokens from position "
                                f"{rows[-1]['first_different_token']}")
    return rows, problems


def test_switching_tree_gives_the_tokens_of_no_speculative_decoding(group):
    result, problems = {}, []
    for family in (TREE, *SWITCHES):
        rows, found = differences(group, family)
        entry = group[family]
        lengths = ({name: accept_length(results) for name, results in entry["rounds"].items()}
                   if not entry["error"] else {})
        result[family] = {"rows": rows, "problems": found, "accept_lengths": lengths}
        problems += found
    path = _e2e.write_result("draft_shape_tokens", {"passed": not problems, "problems": problems,
                                                    "requests": NUM_REQUESTS, **result})
    assert not problems, "; ".join(problems[:6]) + f" ({path})"


def test_switching_tree_switched_both_ways(group):
    """The positive controls of the token check: both shapes drafted, the chain's verify under a CUDA graph."""
    problems, record = [], {}
    for switch in SWITCHES:
        entry = group[switch]
        lines, graphs = entry.get("switch_lines", []), entry.get("chain_graphs", [])
        record[switch] = {"switch_lines": lines, "chain_graphs": graphs}
        if entry["error"]:
            problems.append(f"{switch}: {entry['error']}")
            continue
        for shape in ("chain", "tree"):
            if not any(f"{SWITCH_LOG} {shape}" in line for line in lines):
                problems.append(f"{switch}: no '{SWITCH_LOG} {shape}' line in its log: its tokens were not drafted "
                                "in both shapes")
        if not graphs:
            problems.append(f"{switch}: no '{CHAIN_GRAPHS}' start-up line: the chain state has no target-verify "
                            "CUDA graphs")
        if not any(f"{SWITCH_LOG} chain" in line and f"{VERIFY_GRAPH_LOG} True" in line for line in lines):
            problems.append(f"{switch}: the first chain step did not replay a target-verify CUDA graph (no "
                            f"'{VERIFY_GRAPH_LOG} True' on its switch line)")
    path = _e2e.write_result("draft_shape_switches", {"passed": not problems, "problems": problems, **record})
    assert not problems, "; ".join(problems) + f" ({path})"


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
