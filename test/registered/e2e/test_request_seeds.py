"""Request seeds on a real SGLang server: unseeded requests, parallel samples, the OpenAI ``seed``.

DESIGN.md section 6: a sampled request without ``sampling_seed`` gets a fresh
64-bit seed at admission and the response reports it (native
``meta_info["sampling_seed"]``; each OpenAI choice's ``"sampling_seed"``);
sample j >= 1 of a request with ``n > 1`` and seed s uses
``derive_sample_seed(s, j)``; greedy requests get none (reported as null).

Server: the coupled chain EAGLE server (``_e2e.FAMILIES["coupled_chain"]``,
deterministic, CUDA graphs), or the family named by
``DETSPEC_E2E_SEEDS_FAMILY`` (e.g. ``no_spec``), started **without**
``--skip-tokenizer-init``: SGLang's ``/v1/completions`` builds each choice's
``text`` with the tokenizer and fails without one, so the tiny target carries
a word-level tokenizer (``scripts/make_tiny_models.py``). Prompts are token
ids on both endpoints; OpenAI choices return their ids with
``return_token_ids``.

Checks (each writes ``<DETSPEC_E2E_OUT>/seeds_*.json``):

1. 4 unseeded sampled requests of one prompt, one after another, and 4 in one
   batch: 8 distinct outputs, 8 distinct reported seeds, each seed replayed
   gives its output bit for bit (tokens; logprobs recorded).
2. ``n = 4`` with ``sampling_seed`` 42: 4 distinct samples, the same 4 on
   replay, sample 0 equal to the ``n = 1`` output of seed 42, sample 1 not
   equal to the output of seed 43, sample j reporting
   ``derive_sample_seed(42, j)``, and each reported seed replaying its sample.
3. ``/v1/completions`` with ``seed`` 7 and ``n`` 4: the same properties per
   choice, choice 0 equal to ``/generate`` with seed 7, and two unseeded
   completions that differ and replay from their reported seeds.
4. A greedy request reports no seed (null) on both endpoints.

The derived seeds are checked against an independent computation with the
``mmh3`` package where it is installed (else the project's own
``sglang_detspec.seeds.derive_sample_seed``, which the CPU suite checks
against ``mmh3``); the result names the oracle used.

About 3 minutes on an H200: one server start (70-150 s), then about 60 short requests.
"""

import os
import random
import struct
import sys

import pytest

import _e2e
import _requests
from _register import register_cuda_ci

register_cuda_ci(est_time=180, suite="detspec-e2e-cuda")

TEST_ORDER = (
    "test_unseeded_requests_get_distinct_seeds_that_replay",
    "test_parallel_samples_with_a_seed",
    "test_openai_completions_seed_and_n",
    "test_greedy_requests_report_no_seed",
)
NEW_TOKENS = 32
PROMPT_LEN = 8
SAMPLE_SALT = 0x53414D504C450000  # DESIGN.md section 2: the SAMPLE stream
U64 = 2**64
N = 4


def derive_sample_seed(seed: int, index: int) -> tuple[int, str]:
    """(seed of parallel sample ``index``, the oracle used): DESIGN.md section 6."""
    if index == 0:
        return seed, "identity"
    try:
        import mmh3
    except ImportError:
        from sglang_detspec.seeds import derive_sample_seed as project

        return project(seed, index), "sglang_detspec.seeds"
    key = (seed + SAMPLE_SALT) % U64
    h = [mmh3.hash(struct.pack("<4I", key & 0xFFFFFFFF, key >> 32, index, c), 0, signed=False) for c in (0, 1)]
    return (h[1] << 32) | h[0], "mmh3"


@pytest.fixture(scope="module")
def server(servers, models):
    family = os.environ.get("DETSPEC_E2E_SEEDS_FAMILY") or "coupled_chain"
    config = _e2e.server_config(family, models, tokenizer=True, tag="tokenizer")
    try:
        return servers.ensure(config)
    except RuntimeError as exc:  # every test of the file errors with it; the result says why
        _e2e.write_result("seeds_server_start", {"passed": False, "problems": [str(exc)], "config": config.to_json()})
        raise


@pytest.fixture(scope="module")
def prompt(models):
    rng = random.Random(31)
    return [rng.randrange(_e2e.vocab_size(models.target)) for _ in range(PROMPT_LEN)]


def sampled(**extra) -> dict:
    return {"max_new_tokens": NEW_TOKENS, "temperature": 1.0, "ignore_eos": True, **extra}


def one(url: str, prompt, params: dict, *, logprobs: bool = False):
    """One ``/generate`` request (n = 1): its :class:`_requests.Generated` or the error text."""
    got = _requests.generate(url, prompt, params, return_logprob=logprobs, want_tokens=params.get("max_new_tokens"))
    return got[0] if len(got) == 1 else f"{len(got)} results for one request"


def row(result) -> dict | str:
    return result if isinstance(result, str) else result.to_json()


def finish(name: str, problems: list[str], measured: dict, server) -> None:
    path = _e2e.write_result(name, {"passed": not problems, "problems": problems, "measured": measured,
                                    "server": server.facts(), "plugin_problems": _e2e.plugin_problems(server)})
    assert not problems, "; ".join(problems[:6]) + f" ({path})"


def test_unseeded_requests_get_distinct_seeds_that_replay(server, prompt):
    problems = list(_e2e.plugin_problems(server))
    in_a_row = [one(server.url, prompt, sampled(), logprobs=True) for _ in range(N)]
    batch = _requests.generate(server.url, [prompt] * N, [sampled()] * N, return_logprob=True, want_tokens=NEW_TOKENS)
    results = in_a_row + batch
    problems += [f"request {i}: {r}" for i, r in enumerate(results) if isinstance(r, str)]
    done = [r for r in results if not isinstance(r, str)]
    bad_seeds = [str(r.sampling_seed) for r in done if not _requests.is_seed(r.sampling_seed)]
    if bad_seeds:
        problems.append(f"{len(bad_seeds)} results report no uint64 sampling_seed (got {bad_seeds[:3]})")
    replays = []
    for r in done:
        if _requests.is_seed(r.sampling_seed):
            again = one(server.url, prompt, sampled(sampling_seed=r.sampling_seed), logprobs=True)
            replays.append({"sampling_seed": str(r.sampling_seed), "replay": row(again),
                            "same_tokens": not isinstance(again, str) and again.output_ids == r.output_ids,
                            "same_logprobs_bitwise": not isinstance(again, str) and again.logprobs == r.logprobs})
    measured = {
        "distinct_outputs_in_a_row": len({r.output_ids for r in in_a_row if not isinstance(r, str)}),
        "distinct_outputs_in_one_batch": len({r.output_ids for r in batch if not isinstance(r, str)}),
        "distinct_outputs_all": len({r.output_ids for r in done}),
        "distinct_reported_seeds": len({r.sampling_seed for r in done}),
        "replays_with_other_tokens": sum(not p["same_tokens"] for p in replays),
        "replays_with_other_logprobs": sum(not p["same_logprobs_bitwise"] for p in replays),
        "results": [row(r) for r in results], "replays": replays,
    }
    if measured["distinct_outputs_all"] != 2 * N:
        problems.append(f"{measured['distinct_outputs_all']} distinct outputs of {2 * N} unseeded requests "
                        f"({measured['distinct_outputs_in_a_row']} in a row, {measured['distinct_outputs_in_one_batch']} "
                        f"in one batch; {2 * N} required)")
    if measured["distinct_reported_seeds"] != 2 * N:
        problems.append(f"{measured['distinct_reported_seeds']} distinct reported seeds for {2 * N} requests")
    if measured["replays_with_other_tokens"] or len(replays) != len(done):
        problems.append(f"{measured['replays_with_other_tokens']} of {len(replays)} replays of a reported seed "
                        f"gave other tokens ({len(done) - len(replays)} results had no seed to replay)")
    finish("seeds_unseeded_requests", problems, measured, server)


def test_parallel_samples_with_a_seed(server, prompt):
    problems = list(_e2e.plugin_problems(server))
    seed = 42
    first = _requests.generate(server.url, prompt, sampled(sampling_seed=seed, n=N), want_tokens=NEW_TOKENS)
    again = _requests.generate(server.url, prompt, sampled(sampling_seed=seed, n=N), want_tokens=NEW_TOKENS)
    single = one(server.url, prompt, sampled(sampling_seed=seed))
    next_seed = one(server.url, prompt, sampled(sampling_seed=seed + 1))
    expected = [derive_sample_seed(seed, j) for j in range(N)]
    problems += [f"{what}: {e}" for what, got in (("n=4", first), ("n=4 replay", again), ("n=1", [single]),
                                                  ("seed+1", [next_seed])) for e in _requests.errors(got)]
    ok = not problems and len(first) == N and len(again) == N
    if not problems and not ok:
        problems.append(f"n={N} returned {len(first)} and {len(again)} results")
    measured = {"sampling_seed": seed, "oracle": sorted({o for _, o in expected} - {"identity"}),
                "samples": [row(r) for r in first], "replay": [row(r) for r in again],
                "n1_seed": row(single), "n1_seed_plus_1": row(next_seed),
                "expected_sample_seeds": [str(s) for s, _ in expected]}
    if ok:
        replays = [one(server.url, prompt, sampled(sampling_seed=r.sampling_seed))
                   if _requests.is_seed(r.sampling_seed) else "no seed reported" for r in first]
        measured.update({
            "distinct_samples": len({r.output_ids for r in first}),
            "same_samples_on_replay": [a.output_ids == b.output_ids for a, b in zip(first, again)],
            "sample0_equals_n1": first[0].output_ids == single.output_ids,
            "sample1_equals_seed_plus_1": first[1].output_ids == next_seed.output_ids,
            "reported_seeds": [str(r.sampling_seed) for r in first],
            "reported_seeds_as_derived": [r.sampling_seed == s for r, (s, _) in zip(first, expected)],
            "replays_of_reported_seeds_equal": [not isinstance(p, str) and p.output_ids == r.output_ids
                                                for p, r in zip(replays, first)],
            "replays": [row(p) for p in replays],
        })
        if measured["distinct_samples"] != N:
            problems.append(f"{measured['distinct_samples']} distinct samples of n={N} ({N} required)")
        if not all(measured["same_samples_on_replay"]):
            problems.append(f"replaying the n={N} request changed samples {measured['same_samples_on_replay']}")
        if not measured["sample0_equals_n1"]:
            problems.append("sample 0 differs from the n=1 output of the same seed")
        if measured["sample1_equals_seed_plus_1"]:
            problems.append("sample 1 equals the output of seed + 1 (the samples' seeds collide with nearby seeds)")
        if not all(measured["reported_seeds_as_derived"]):
            problems.append(f"reported sample seeds {measured['reported_seeds']} are not derive_sample_seed(42, j) "
                            f"{measured['expected_sample_seeds']}")
        if not all(measured["replays_of_reported_seeds_equal"]):
            problems.append(f"replaying each sample's reported seed: {measured['replays_of_reported_seeds_equal']}")
    finish("seeds_parallel_samples", problems, measured, server)


def completion(url: str, prompt, **fields) -> dict:
    """POST ``/v1/completions`` with a token-id prompt; ``{"status", "choices" or None, "text"}``."""
    body = {"prompt": prompt, "max_tokens": NEW_TOKENS, "temperature": 1.0, "ignore_eos": True,
            "return_token_ids": True, **fields}
    outcome = _requests.post(url, "/v1/completions", body)
    choices = (outcome["body"] or {}).get("choices") if isinstance(outcome["body"], dict) else None
    return {"status": outcome["status"], "choices": choices, "text": outcome["text"]}


def choice_facts(response: dict) -> list[dict]:
    """Per choice: token ids and reported seed (sorted by ``index``)."""
    choices = sorted(response["choices"] or [], key=lambda c: c.get("index", 0))
    return [{"index": c.get("index"), "token_ids": c.get("token_ids"), "sampling_seed": c.get("sampling_seed"),
             "finish_reason": c.get("finish_reason")} for c in choices]


def test_openai_completions_seed_and_n(server, prompt):
    problems = list(_e2e.plugin_problems(server))
    seed = 7
    first, again = (completion(server.url, prompt, seed=seed, n=N) for _ in range(2))
    native = one(server.url, prompt, sampled(sampling_seed=seed))
    unseeded = [completion(server.url, prompt) for _ in range(2)]
    responses = {"n4": first, "n4_replay": again, **{f"unseeded_{i}": u for i, u in enumerate(unseeded)}}
    for name, r in responses.items():
        if r["status"] != 200 or not r["choices"]:
            problems.append(f"/v1/completions {name}: HTTP {r['status']}: {r['text'][:300]}")
    if isinstance(native, str):
        problems.append(f"/generate seed {seed}: {native}")
    expected = [derive_sample_seed(seed, j) for j in range(N)]
    measured = {"seed": seed, "responses": {k: {"status": v["status"], "choices": choice_facts(v) if v["choices"] else None,
                                                "text": None if v["choices"] else v["text"]}
                                            for k, v in responses.items()},
                "generate_seed_7": row(native), "expected_choice_seeds": [str(s) for s, _ in expected],
                "oracle": sorted({o for _, o in expected} - {"identity"})}
    if not problems:
        a, b = choice_facts(first), choice_facts(again)
        u = [choice_facts(x)[0] for x in unseeded]
        missing = [c for c in a + b + u if not isinstance(c["token_ids"], list) or len(c["token_ids"]) != NEW_TOKENS]
        if len(a) != N or len(b) != N or missing:
            problems.append(f"expected {N} choices with {NEW_TOKENS} token_ids each, got {len(a)} and {len(b)}; "
                            f"{len(missing)} choices without their token ids")
        else:
            replays = [completion(server.url, prompt, seed=c["sampling_seed"])
                       if _requests.is_seed(c["sampling_seed"]) else None for c in a + u]
            replayed = [None if r is None or r["status"] != 200 or not r["choices"] else choice_facts(r)[0]["token_ids"]
                        for r in replays]
            measured.update({
                "distinct_choices": len({tuple(c["token_ids"]) for c in a}),
                "same_choices_on_replay": [x["token_ids"] == y["token_ids"] for x, y in zip(a, b)],
                "choice0_equals_generate": a[0]["token_ids"] == list(native.output_ids),
                "choice_seeds_as_derived": [c["sampling_seed"] == s for c, (s, _) in zip(a, expected)],
                "unseeded_distinct": u[0]["token_ids"] != u[1]["token_ids"],
                "unseeded_seeds_reported": [_requests.is_seed(c["sampling_seed"]) for c in u],
                "replays_of_reported_seeds_equal": [r == c["token_ids"] for r, c in zip(replayed, a + u)],
            })
            if measured["distinct_choices"] != N:
                problems.append(f"{measured['distinct_choices']} distinct choices of n={N}")
            if not all(measured["same_choices_on_replay"]):
                problems.append(f"replaying seed {seed}, n={N} changed choices {measured['same_choices_on_replay']}")
            if not measured["choice0_equals_generate"]:
                problems.append(f"choice 0 differs from /generate with sampling_seed {seed}")
            if not all(measured["choice_seeds_as_derived"]):
                problems.append(f"choice seeds {[str(c['sampling_seed']) for c in a]} are not derive_sample_seed({seed}, j)")
            if not measured["unseeded_distinct"] or not all(measured["unseeded_seeds_reported"]):
                problems.append(f"unseeded completions: distinct {measured['unseeded_distinct']}, "
                                f"seeds reported {measured['unseeded_seeds_reported']}")
            if not all(measured["replays_of_reported_seeds_equal"]):
                problems.append(f"replaying each choice's reported seed: {measured['replays_of_reported_seeds_equal']}")
    finish("seeds_openai_completions", problems, measured, server)


def test_greedy_requests_report_no_seed(server, prompt):
    problems = list(_e2e.plugin_problems(server))
    native = one(server.url, prompt, {"max_new_tokens": 8, "temperature": 0.0, "ignore_eos": True})
    openai = completion(server.url, prompt, temperature=0.0, max_tokens=8)
    measured = {"generate": row(native), "completions": {"status": openai["status"], "text": openai["text"][:300]}}
    if isinstance(native, str):
        problems.append(f"/generate: {native}")
    elif not native.reports_seed:
        # Absent is not null: a server without the plugin reports nothing, and must not pass here.
        problems.append("/generate's meta_info has no sampling_seed (null expected for a greedy request)")
    elif native.sampling_seed is not None:
        problems.append(f"/generate reported sampling_seed {native.sampling_seed!r} for a greedy request (null expected)")
    if openai["status"] != 200 or not openai["choices"]:
        problems.append(f"/v1/completions: HTTP {openai['status']}: {openai['text'][:300]}")
    else:
        seeds = [c["sampling_seed"] for c in choice_facts(openai)]
        measured["completions"]["sampling_seeds"] = seeds
        if not all("sampling_seed" in c for c in openai["choices"]):
            problems.append("/v1/completions choices have no sampling_seed field (null expected for a greedy request)")
        elif any(s is not None for s in seeds):
            problems.append(f"/v1/completions reported sampling_seed {seeds} for a greedy request (null expected)")
    finish("seeds_greedy", problems, measured, server)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
