"""No request field can take the server down: a seeded request fuzzer against coupled chain and tree servers.

Servers, started side by side: the coupled chain (``coupled_chain``) and the
coupled tree (``coupled_tree``) on the tiny Llama pair, both with the target's
word-level tokenizer and SGLang's built-in ``chatml`` chat template (the
OpenAI endpoints build text with them), and the server without speculative
decoding (``no_spec``) as the reference of the good requests.

Per speculative server, :func:`sglang_detspec.auditing.request_fuzz.fuzz_cases`
gives ``DETSPEC_FUZZ_CASES`` cases (default 1100; seed ``DETSPEC_FUZZ_SEED``
plus the server's index): the inputs that killed servers before the plugin's
request rules first, then every per-request list of a ``/generate`` batch one
entry short and one long, then valid requests of ``/generate``,
``/v1/completions`` and ``/v1/chat/completions`` with one mutation each
(types, ranges, sizes, nesting, unknown and missing fields, huge values,
empty lists, malformed bodies, batches mixing one bad request with good
ones; grammars the test vocabulary satisfies, and valid ones it cannot
start). They go out ``FUZZ_WORKERS`` at a time; after every ``HEALTH_EVERY``
cases ``/health`` must answer 200. Beside them a steady stream of good seeded
requests runs, each compared with ``no_spec``'s tokens for it.

Checks (:func:`request_fuzz.failed` per case): 0 server deaths, 0 health
failures, no 5xx and no unanswered request except on the documented limits
(docs/request_fields.md, "Known limits"; :func:`request_fuzz.limit_answer`:
a chat body SGLang's request model cannot read; a grammar no token of the
vocabulary can start, answered with SGLang's grammar abort), counted apart
per limit as ``known_limit_5xx``; every case with a status to get answered
with it (known crash inputs 400, or 200 where the rule clamps; batch lists of
the wrong length 400; satisfiable grammars 200); 0 good outputs changed; at
least 2,000 cases over at least 25 fields and the three endpoints. Result:
``<DETSPEC_E2E_OUT>/request_fuzz.json`` (the issue's schema plus the
per-server numbers, the 5xx per documented limit, known-input answers and
the failing cases). Sending stops at ``DETSPEC_FUZZ_SECONDS`` (default 150) and
the cases not sent fail the run. About 7.5 minutes on one H200: the H200 run
of 2026-12-02 took 440 s, about 260 s of it starting the three servers (side
by side, CUDA graphs captured) and at most the 150 s budget sending.
"""

import collections
import concurrent.futures
import json
import random
import sys
import threading
import time
from pathlib import Path

import pytest
import requests

import _e2e
import _requests
from _register import register_cuda_ci
from sglang_detspec.auditing import request_fuzz

register_cuda_ci(est_time=450, suite="detspec-e2e-cuda")

TEST_ORDER = ("test_no_request_takes_a_server_down",)
MODES = ("coupled_chain", "coupled_tree")
REFERENCE = "no_spec"
FUZZ_WORKERS = 8
HEALTH_EVERY = 10
FUZZ_TIMEOUT_S = 60.0
GOOD_COUNT = 16
GOOD_WORKERS = 2
GOOD_NEW_TOKENS = 16
MIN_CASES, MIN_FIELDS = 2000, 25


def fuzz_config(mode, models):
    return _e2e.server_config(mode, models, tokenizer=True, tag="fuzz", extra_args=("--chat-template", "chatml"))


@pytest.fixture(scope="module")
def group(servers, models):
    configs = [_e2e.server_config(REFERENCE, models), *(fuzz_config(m, models) for m in MODES)]
    started = servers.ensure_group(configs)
    failed = [s for s in started.values() if isinstance(s, str)]
    if failed:
        _e2e.write_result("request_fuzz", {"passed": False, "problems": failed})
        pytest.fail("; ".join(failed))
    return {name: started[c.name] for name, c in zip((REFERENCE, *MODES), configs)}


def good_requests(vocab: int) -> list[tuple[list[int], dict]]:
    """Seeded sampled requests (plain, top-k, top-p, min-p) and a greedy one in six, ``ignore_eos``."""
    rng = random.Random(11)
    out = []
    for i in range(GOOD_COUNT):
        params = {"max_new_tokens": GOOD_NEW_TOKENS, "ignore_eos": True}
        if i % 6 == 0:
            params["temperature"] = 0.0
        else:
            params.update(temperature=rng.choice((0.7, 1.0)), sampling_seed=rng.randrange(2**64))
            params.update(({}, {"top_k": 20}, {"top_p": 0.9}, {"min_p": 0.05}, {"top_k": 50, "top_p": 0.8})[i % 6 - 1])
        out.append(([rng.randrange(3, vocab) for _ in range(rng.randint(3, 24))], params))
    return out


def tokens_of(url: str, req) -> tuple | str:
    got = _requests.generate(url, req[0], req[1], want_tokens=GOOD_NEW_TOKENS, timeout=FUZZ_TIMEOUT_S)
    if len(got) != 1:
        return f"{len(got)} results"
    return got[0] if isinstance(got[0], str) else tuple(got[0].output_ids)


def send(url: str, case: request_fuzz.Case) -> dict:
    started = time.monotonic()
    try:
        r = requests.post(f"{url}{case.endpoint}", data=case.payload().encode("utf-8", "surrogatepass"),
                          headers={"Content-Type": "application/json"}, timeout=FUZZ_TIMEOUT_S)
        status, text = r.status_code, r.text[:300]
    except requests.RequestException as exc:
        status, text = None, f"{type(exc).__name__}: {exc}"[:300]
    return {"status": status, "text": text, "seconds": round(time.monotonic() - started, 3)}


def healthy(url: str) -> bool:
    try:
        return requests.get(f"{url}/health", timeout=30).status_code == 200
    except requests.RequestException:
        return False


def alive(server) -> bool:
    """The server process runs and answers ``/health`` (three tries over about 10 s)."""
    for _ in range(3):
        if server.process.poll() is not None:
            return False
        if healthy(server.url):
            return True
        time.sleep(3)
    return False


class GoodStream:
    """Good seeded requests to one server, ``GOOD_WORKERS`` at a time, until stopped; each compared with the reference."""

    def __init__(self, url: str, reqs, want) -> None:
        self.url, self.reqs, self.want = url, reqs, want
        self.sent = 0
        self.changed: list[dict] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, args=(k,), daemon=True) for k in range(GOOD_WORKERS)]
        for thread in self._threads:
            thread.start()

    def _run(self, offset: int) -> None:
        i = offset
        while not self._stop.is_set():
            j = i % len(self.reqs)
            got = tokens_of(self.url, self.reqs[j])
            with self._lock:
                self.sent += 1
                if got != self.want[j]:
                    self.changed.append({"request": j, "got": got if isinstance(got, str) else list(got)})
            i += GOOD_WORKERS

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(FUZZ_TIMEOUT_S + 5)


def fuzz_one(server, cases, reqs, want, deadline: float) -> dict:
    """Send ``cases`` to ``server`` beside a good stream; the counts and the failing cases."""
    counts = collections.Counter()
    limits = collections.Counter()
    failures = 0
    health_failures = 0
    died = False
    bad: list[dict] = []
    known: dict[str, dict] = {}
    sent = 0
    slowest = []
    stream = GoodStream(server.url, reqs, want)
    with concurrent.futures.ThreadPoolExecutor(FUZZ_WORKERS) as pool:
        for start in range(0, len(cases), HEALTH_EVERY):
            if time.monotonic() > deadline:
                break
            chunk = cases[start:start + HEALTH_EVERY]
            for case, answer in zip(chunk, pool.map(lambda c: send(server.url, c), chunk)):
                sent += 1
                status = answer["status"]
                counts["transport_error" if status is None else str(status)] += 1
                slowest.append((answer["seconds"], case.index))
                if case.known is not None:
                    known[case.known] = {"status": status, "expect": case.expect, "text": answer["text"]}
                limit = request_fuzz.limit_answer(case, status, answer["text"])
                if limit is not None:
                    limits[limit] += 1  # SGLang's own 5xx, documented; the server stays up
                elif request_fuzz.failed(case, status, answer["text"]):
                    failures += 1
                    bad.append({**case.summary(), **answer, "body": case.payload()[:1000]})
            if not healthy(server.url):
                health_failures += 1
                if not alive(server):
                    died = True
                    break
    stream.stop()
    died = died or not alive(server)
    slowest.sort(reverse=True)
    return {"server": server.config.name, "cases_planned": len(cases), "cases": sent, "status_counts": dict(counts),
            "health_failures": health_failures, "died": died, "good_requests": stream.sent,
            "good_outputs_changed": len(stream.changed), "changed_examples": stream.changed[:8],
            "known_limit_5xx": dict(limits), "limit_cases": dict(collections.Counter(
                request_fuzz.known_limit(c) for c in cases[:sent] if request_fuzz.known_limit(c))),
            "failing": failures, "failing_cases": bad[:40], "known": known,
            "slowest_cases": [{"seconds": s, "index": i} for s, i in slowest[:10]]}


def test_no_request_takes_a_server_down(group, models):
    vocab = _e2e.vocab_size(models.target)
    context = int(json.loads((Path(models.target) / "config.json").read_text())["max_position_embeddings"])
    model = request_fuzz.Model(vocab, context, "default")
    count = _e2e.env_int("DETSPEC_FUZZ_CASES", 1100)
    seed = _e2e.env_int("DETSPEC_FUZZ_SEED", 2026, minimum=0)
    budget = _e2e.env_int("DETSPEC_FUZZ_SECONDS", 150)
    reqs = good_requests(vocab)
    want = [tokens_of(group[REFERENCE].url, r) for r in reqs]
    problems = [f"reference request {i}: {w}" for i, w in enumerate(want) if isinstance(w, str)]
    case_lists = {mode: request_fuzz.fuzz_cases(seed + k, count, model) for k, mode in enumerate(MODES)}
    deadline = time.monotonic() + budget
    with concurrent.futures.ThreadPoolExecutor(len(MODES)) as pool:
        runs = list(pool.map(lambda m: fuzz_one(group[m], case_lists[m], reqs, want, deadline), MODES))

    every = [c for mode in MODES for c in case_lists[mode]]
    covered = request_fuzz.coverage(every)
    statuses, limits = collections.Counter(), collections.Counter()
    for run in runs:
        statuses.update(run["status_counts"])
        limits.update(run["known_limit_5xx"])
        name = run["server"]
        if run["died"]:
            problems.append(f"{name} died")
        if run["health_failures"]:
            problems.append(f"{name}: /health failed {run['health_failures']} times")
        if run["cases"] < run["cases_planned"]:
            problems.append(f"{name}: {run['cases']} of {run['cases_planned']} cases sent within {budget} s")
        if run["good_outputs_changed"]:
            problems.append(f"{name}: {run['good_outputs_changed']} of {run['good_requests']} good outputs changed")
        if run["failing"]:
            problems.append(f"{name}: {run['failing']} cases failed (the first {len(run['failing_cases'])} in runs)")
        for case in run["failing_cases"][:5]:
            problems.append(f"{name}: case {case['index']} ({case['endpoint']} {case['field']} {case['mutation']}): "
                            f"HTTP {case['status']}: {case['text'][:120]}")
    cases = sum(run["cases"] for run in runs)
    if cases < MIN_CASES or len(covered["fields"]) < MIN_FIELDS or len(covered["endpoints"]) < 3:
        problems.append(f"{cases} cases over {len(covered['fields'])} fields and {len(covered['endpoints'])} "
                        f"endpoints (goal: {MIN_CASES}, {MIN_FIELDS}, 3)")
    facts = _e2e.machine_facts()
    path = _e2e.write_result("request_fuzz", {
        "date_utc": facts["date_utc"], "machine": facts.get("gpu") or "unknown",
        "servers": [run["server"] for run in runs], "cases": cases, "endpoints": covered["endpoints"],
        "fields": covered["fields"], "status_counts": dict(sorted(statuses.items())),
        "server_deaths": sum(run["died"] for run in runs),
        "health_failures": sum(run["health_failures"] for run in runs),
        "good_requests": sum(run["good_requests"] for run in runs),
        "good_outputs_changed": sum(run["good_outputs_changed"] for run in runs),
        "known_limit_5xx": dict(sorted(limits.items())), "known_limits": request_fuzz.LIMITS,
        "failing": sum(run["failing"] for run in runs),
        "passed": not problems, "problems": problems, "seed": seed, "cases_per_server": count,
        "known_crash_inputs": list(request_fuzz.KNOWN_CRASHES), "runs": runs,
        "reference": group[REFERENCE].facts(), "server_facts": [group[m].facts() for m in MODES]})
    assert not problems, "; ".join(problems[:8]) + f" ({path})"


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
