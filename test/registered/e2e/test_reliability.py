"""No request can take the server down or change another request's output.

For each of the coupled chain (``coupled_chain``) and the rejection chain
(``chain_eagle``), on the tiny Llama pair, with the server without
speculative decoding (``no_spec``) as the reference where outputs are
compared:

1. **Bad requests under load.** Good seeded requests run while bad ones
   arrive: ids outside the vocabulary or negative, float ids, ``n`` 0 / -1 /
   null, every bad sampling parameter SGLang refuses, malformed JSON, a body
   of 10 MB. Each bad one gets a 4xx whose text names the field (the
   malformed body: any 4xx), ``/health`` answers 200 after each, and the good
   requests give the tokens they give on an idle server (0 changed).
2. **512 concurrent mixed requests** (greedy, sampled, top-k / top-p / min-p,
   seeds across the whole uint64 range): 0 errors; the coupled server's
   outputs equal ``no_spec``'s for every request; the rejection server's
   outputs equal its own idle replay of a sample of them.
3. **Dropped streams and aborts.** Clients that read 3 chunks of a stream and
   hang up, and ``/abort_request`` on running requests, while other requests
   run: the others unchanged, a dropped request's chunks a prefix of its full
   replay.
4. **Restart.** Both speculative servers are stopped in the middle of a load and started
   again; the same requests give the same outputs.

Results: ``<DETSPEC_E2E_OUT>/reliability_*.json``. About 4.5 minutes on an
H200 (three servers at once, the two speculative ones restarted side by side).
"""

import concurrent.futures
import json
import random
import sys
import threading
import time

import pytest
import requests

import _e2e
import _requests
from _register import register_cuda_ci

register_cuda_ci(est_time=480, suite="detspec-e2e-cuda")

MODES = ("coupled_chain", "chain_eagle")
REFERENCE = "no_spec"
TEST_ORDER = (
    "test_bad_requests_are_refused_and_change_nothing",
    "test_512_concurrent_mixed_requests",
    "test_dropped_streams_and_aborts_change_nothing",
    "test_restart_mid_load_gives_the_same_outputs",
)
NEW_TOKENS = 24
LOAD_TOKENS = 256  # the restart test's load: long enough to be in flight when a server is killed
BIG_BODY_BYTES = 10 * 1024 * 1024


def config(name, models):
    return _e2e.server_config(name, models)


@pytest.fixture(scope="module")
def group(servers, models):
    configs = [config(n, models) for n in (REFERENCE, *MODES)]
    started = servers.ensure_group(configs)
    failed = {name: s for name, s in started.items() if isinstance(s, str)}
    if failed:
        pytest.fail("; ".join(failed.values()))
    return started


def good_requests(vocab: int, count: int, seed: int) -> list[tuple[list[int], dict]]:
    """Seeded sampled requests with top-k / top-p / min-p rows and greedy ones, seeds across uint64."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        prompt = [rng.randrange(vocab) for _ in range(rng.randint(3, 30))]
        kind = i % 6
        params = {"max_new_tokens": NEW_TOKENS, "ignore_eos": True}
        if kind == 0:
            params["temperature"] = 0.0
        else:
            params["temperature"] = rng.choice((0.7, 1.0, 1.3))
            params["sampling_seed"] = rng.choice((0, 2**63, 2**64 - 1, rng.randrange(2**64)))
            params.update(({}, {"top_k": 20}, {"top_p": 0.9}, {"min_p": 0.05}, {"top_k": 50, "top_p": 0.8})[kind - 1])
        out.append((prompt, params))
    return out


def run_all(url: str, reqs, workers: int = 32, want_tokens: int = NEW_TOKENS) -> list:
    """Each request alone (one POST each), ``workers`` at a time; results in order."""
    def one(req):
        got = _requests.generate(url, req[0], req[1], want_tokens=want_tokens)
        return got[0] if len(got) == 1 else f"{len(got)} results"

    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        return list(pool.map(one, reqs))


def tokens(results) -> list:
    return [r if isinstance(r, str) else list(r.output_ids) for r in results]


def bad_bodies(vocab: int, context_len: int) -> list[tuple[str, object, str]]:
    """``(name, body, field the answer must name)``; a str body is sent as raw text."""
    ok = {"max_new_tokens": 4, "temperature": 1.0, "sampling_seed": 1}
    cases = [
        ("id_at_vocab", {"input_ids": [vocab, 7], "sampling_params": ok}, "input_ids"),
        ("id_negative", {"input_ids": [-1, 7], "sampling_params": ok}, "input_ids"),
        ("id_float", {"input_ids": [1.5, 7], "sampling_params": ok}, "input_ids"),
        ("batch_id_out", {"input_ids": [[1, 2], [3, vocab + 5]], "sampling_params": ok}, "input_ids"),
        ("n_zero", {"input_ids": [1, 2], "sampling_params": {**ok, "n": 0}}, "n must be"),
        ("n_negative", {"input_ids": [1, 2], "sampling_params": {**ok, "n": -1}}, "n must be"),
        ("n_null", {"input_ids": [1, 2], "sampling_params": {**ok, "n": None}}, "n must be"),
        ("temperature", {"input_ids": [1, 2], "sampling_params": {**ok, "temperature": -1}}, "temperature"),
        ("top_p_zero", {"input_ids": [1, 2], "sampling_params": {**ok, "top_p": 0}}, "top_p"),
        ("top_p_big", {"input_ids": [1, 2], "sampling_params": {**ok, "top_p": 1.5}}, "top_p"),
        ("top_k_zero", {"input_ids": [1, 2], "sampling_params": {**ok, "top_k": 0}}, "top_k"),
        ("top_k_negative", {"input_ids": [1, 2], "sampling_params": {**ok, "top_k": -5}}, "top_k"),
        ("min_p", {"input_ids": [1, 2], "sampling_params": {**ok, "min_p": 2}}, "min_p"),
        ("max_new_tokens", {"input_ids": [1, 2], "sampling_params": {**ok, "max_new_tokens": -1}}, "max_new_tokens"),
        ("repetition_penalty", {"input_ids": [1, 2], "sampling_params": {**ok, "repetition_penalty": 0}},
         "repetition_penalty"),
        ("seed_too_big", {"input_ids": [1, 2], "sampling_params": {**ok, "sampling_seed": 2**64}}, "sampling_seed"),
        ("empty_ids", {"input_ids": [], "sampling_params": ok}, "input"),
        ("too_long", {"input_ids": [1] * (context_len + 1), "sampling_params": ok}, "token"),
        ("malformed_json", '{"input_ids": [1, 2], "sampling_params": {', ""),
        # About 10 MB of JSON: token ids far past the context length (SGLang ignores unknown keys,
        # so padding a good request would not make it a bad one).
        ("ten_megabytes", json.dumps({"input_ids": [1] * (BIG_BODY_BYTES // 3), "sampling_params": ok}), "token"),
    ]
    return cases


def context_length(model_path: str) -> int:
    """``max_position_embeddings`` of the served model's config.json."""
    from pathlib import Path

    return int(json.loads((Path(model_path) / "config.json").read_text())["max_position_embeddings"])


def send_bad(url: str, body) -> dict:
    try:
        if isinstance(body, str):
            r = requests.post(f"{url}/generate", data=body, headers={"Content-Type": "application/json"}, timeout=60)
        else:
            r = requests.post(f"{url}/generate", json=body, timeout=60)
        return {"status": r.status_code, "text": r.text[:400]}
    except requests.RequestException as exc:
        return {"status": None, "text": f"{type(exc).__name__}: {exc}"[:400]}


def healthy(url: str) -> bool:
    try:
        return requests.get(f"{url}/health", timeout=30).status_code == 200
    except requests.RequestException:
        return False


def on_idle_server(group, models, mode: str, count: int, seed: int):
    """``(server, vocab, requests, their tokens on the idle server)`` for one mode's server."""
    server = group[_e2e.server_config(mode, models).name]
    vocab = _e2e.vocab_size(models.target)
    reqs = good_requests(vocab, count, seed=seed)
    return server, vocab, reqs, tokens(run_all(server.url, reqs))


@pytest.mark.parametrize("mode", MODES)
def test_bad_requests_are_refused_and_change_nothing(group, models, mode):
    server, vocab, reqs, idle = on_idle_server(group, models, mode, 32, seed=1)
    problems = [f"idle run: request {i}: {t}" for i, t in enumerate(idle) if isinstance(t, str)]
    rows = []
    done = threading.Event()

    def load():  # the good requests again and again until every bad one was sent; every pass compared
        passes = []
        while not done.is_set() or not passes:
            passes.append(tokens(run_all(server.url, reqs, workers=8)))
        return passes

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        under_load = pool.submit(load)
        for name, body, field in bad_bodies(vocab, context_len=context_length(models.target)):
            answer = send_bad(server.url, body)
            alive = healthy(server.url)
            ok = answer["status"] is not None and 400 <= answer["status"] < 500 and field in answer["text"] and alive
            rows.append({"case": name, **answer, "field": field, "healthy_after": alive, "passed": ok})
            if not ok:
                problems.append(f"{name}: HTTP {answer['status']}, healthy after: {alive}: {answer['text'][:160]}")
        done.set()
        passes = under_load.result()
    changed = sorted({i for loaded in passes for i, (a, b) in enumerate(zip(idle, loaded)) if a != b})
    if changed:
        problems.append(f"{len(changed)} of {len(reqs)} good requests changed under the bad load: {changed[:8]}")
    path = _e2e.write_result(f"reliability_bad_requests_{mode}", {
        "passed": not problems, "problems": problems, "rows": rows, "good_requests": len(reqs),
        "load_passes": len(passes), "good_changed": len(changed), "server": server.facts()})
    assert not problems, "; ".join(problems[:6]) + f" ({path})"


@pytest.mark.parametrize("mode", MODES)
def test_512_concurrent_mixed_requests(group, models, mode):
    server, reference = (group[_e2e.server_config(n, models).name] for n in (mode, REFERENCE))
    vocab = _e2e.vocab_size(models.target)
    reqs = good_requests(vocab, 512, seed=2)
    got = tokens(run_all(server.url, reqs, workers=512))
    problems = [f"request {i}: {t}" for i, t in enumerate(got) if isinstance(t, str)][:10]
    figures = {}
    if mode == "coupled_chain":  # coupled: the tokens of plain sampling, so of the server without speculation
        want = tokens(run_all(reference.url, reqs, workers=64))
        differ = [i for i, (a, b) in enumerate(zip(got, want)) if a != b]
        figures["differ_from_no_spec"] = len(differ)
        if differ:
            problems.append(f"{len(differ)} of 512 differ from {REFERENCE}: {differ[:8]}")
            figures["differences"] = [explain(reqs[i], i, reference.url, server.url) for i in differ[:8]]
    else:  # rejection: batch-invariant, so equal to its own replay of a sample, sent one at a time
        sample = list(range(0, 512, 16))
        replay = tokens(run_all(server.url, [reqs[i] for i in sample], workers=1))
        differ = [i for i, r in zip(sample, replay) if r != got[i]]
        figures["differ_from_serial_replay"] = len(differ)
        if differ:
            problems.append(f"{len(differ)} of {len(sample)} differ from a serial replay: {differ[:8]}")
    path = _e2e.write_result(f"reliability_concurrent_{mode}", {
        "passed": not problems, "problems": problems, "requests": 512, **figures, "server": server.facts()})
    assert not problems, "; ".join(problems[:6]) + f" ({path})"


def explain(req, index: int, reference_url: str, url: str) -> dict:
    """A differing request sent again alone to both servers with logprobs: where the two part, and whether
    the target's logprobs already differed before that (a forward-mode difference of the target logits
    that flipped a near-tie, rather than a different draw from the same distribution)."""
    ref, got = (_requests.generate(u, req[0], req[1], return_logprob=True, want_tokens=NEW_TOKENS)[0]
                for u in (reference_url, url))
    if isinstance(ref, str) or isinstance(got, str):
        return {"request": index, "error": ref if isinstance(ref, str) else got}
    first = _requests.first_difference(ref.output_ids, got.output_ids)
    upto = len(ref.output_ids) if first is None else first
    before = [j for j in range(upto) if ref.logprobs[j] != got.logprobs[j]]
    return {"request": index, "sampling_params": req[1], "first_different_token": first,
            "logprob_positions_differing_before_it": before[:16], "reference_output_ids": list(ref.output_ids),
            "output_ids": list(got.output_ids), "reference_logprobs": list(ref.logprobs),
            "logprobs": list(got.logprobs)}


def stream_prefix(url: str, prompt, params, chunks: int) -> list[int]:
    """The output ids of the first ``chunks`` streamed chunks; then the connection is dropped."""
    body = {"input_ids": prompt, "sampling_params": params, "stream": True}
    ids: list[int] = []
    with requests.post(f"{url}/generate", json=body, stream=True, timeout=120) as r:
        seen = 0
        for line in r.iter_lines():
            if not line.startswith(b"data:") or line.strip() == b"data: [DONE]":
                continue
            item = json.loads(line[len(b"data:"):])
            ids = list(item.get("output_ids") or ids)
            seen += 1
            if seen >= chunks:
                break
    return ids


@pytest.mark.parametrize("mode", MODES)
def test_dropped_streams_and_aborts_change_nothing(group, models, mode):
    server, vocab, reqs, idle = on_idle_server(group, models, mode, 24, seed=3)
    dropped = good_requests(vocab, 8, seed=4)
    long_tokens = min(1500, context_length(models.target) - 64)  # long enough to be running when aborted
    aborted = [(p, {**q, "max_new_tokens": long_tokens}) for p, q in good_requests(vocab, 4, seed=5)]
    problems = []
    prefixes = []
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        others = pool.submit(lambda: tokens(run_all(server.url, reqs, workers=8)))
        drops = [pool.submit(stream_prefix, server.url, p, q, 3) for p, q in dropped]
        rids = [f"detspec-abort-{i}" for i in range(len(aborted))]
        long_runs = [pool.submit(_requests.post, server.url, "/generate",
                                 {"input_ids": p, "sampling_params": q, "rid": rid}) for (p, q), rid in
                     zip(aborted, rids)]
        time.sleep(0.3)
        for rid in rids:
            _requests.post(server.url, "/abort_request", {"rid": rid})
        prefixes = [d.result() for d in drops]
        finishes = [run.result() for run in long_runs]
        loaded = others.result()
    aborts = sum(1 for f in finishes
                 if isinstance(f["body"], dict)
                 and (f["body"].get("meta_info", {}).get("finish_reason") or {}).get("type") == "abort")
    if aborts == 0:
        problems.append("no request was aborted (each finished before its /abort_request)")
    changed = [i for i, (a, b) in enumerate(zip(idle, loaded)) if a != b]
    if changed:
        problems.append(f"{len(changed)} of {len(reqs)} requests changed beside dropped streams and aborts")
    full = tokens(run_all(server.url, dropped))
    # An empty stream is a prefix of anything: it would pass while checking nothing.
    empty = [i for i, pre in enumerate(prefixes) if not pre]
    if empty:
        problems.append(f"dropped streams {empty} delivered no tokens before the drop (nothing to compare)")
    not_prefix = [i for i, (pre, whole) in enumerate(zip(prefixes, full))
                  if pre and (isinstance(whole, str) or list(whole[:len(pre)]) != pre)]
    if not_prefix:
        problems.append(f"dropped streams {not_prefix} are not a prefix of their full replay")
    if not healthy(server.url):
        problems.append("server unhealthy after the drops and aborts")
    path = _e2e.write_result(f"reliability_drops_{mode}", {
        "passed": not problems, "problems": problems, "changed": len(changed), "aborted": aborts,
        "dropped_prefix_lengths": [len(p) for p in prefixes], "server": server.facts()})
    assert not problems, "; ".join(problems[:6]) + f" ({path})"


def test_restart_mid_load_gives_the_same_outputs(servers, group, models):
    """Both speculative servers die in the middle of a load and start again side by side (one start's wait)."""
    everyone = [config(n, models) for n in (REFERENCE, *MODES)]
    names = {mode: _e2e.server_config(mode, models).name for mode in MODES}
    started = servers.ensure_group(everyone)
    failed = [started[name] for name in names.values() if isinstance(started[name], str)]
    if failed:
        pytest.fail("; ".join(failed))
    vocab = _e2e.vocab_size(models.target)
    reqs = good_requests(vocab, 48, seed=6)
    before = {mode: tokens(run_all(started[name].url, reqs)) for mode, name in names.items()}
    # Long requests, so that a batch in flight spans the moment its server is killed.
    load_reqs = [(prompt, {**params, "max_new_tokens": LOAD_TOKENS}) for prompt, params in reqs[:8]]
    stop = threading.Event()
    cut_off = {mode: 0 for mode in names}  # requests sent before the kill, answered after it with an error
    early_errors = {mode: [] for mode in names}  # errors answered before the kill: the server was up, a fault
    # Each server's own kill time: the stops run one after another, and a batch sent to the
    # second server while the first one was being stopped is still cut off by its own stop.
    killed_at = {mode: float("inf") for mode in names}

    def load(mode, url):  # traffic that the stop cuts off; counted only to confirm it was in flight
        while not stop.is_set():
            sent = time.monotonic()
            if sent >= killed_at[mode]:
                return  # its server is stopped: nothing more to cut off
            failed = [a for a in tokens(run_all(url, load_reqs, workers=8, want_tokens=LOAD_TOKENS))
                      if isinstance(a, str)]
            if time.monotonic() < killed_at[mode]:
                early_errors[mode] += failed
            elif sent < killed_at[mode]:
                cut_off[mode] += len(failed)

    with concurrent.futures.ThreadPoolExecutor(len(MODES)) as pool:
        loads = [pool.submit(load, mode, started[name].url) for mode, name in names.items()]
        try:
            time.sleep(2.0)
            for mode, name in names.items():
                killed_at[mode] = time.monotonic()
                servers._stop(name)  # the servers die in the middle of the load
        finally:
            stop.set()
        for running in loads:
            running.result()  # an exception in a load thread is raised here, not read as "nothing in flight"
    restarted = servers.ensure_group(everyone)  # the stopped ones start again, in parallel; no_spec stays
    problems = []
    for mode, name in names.items():
        server = restarted[name]
        if isinstance(server, str):
            problems.append(server)
            continue
        after = tokens(run_all(server.url, reqs))
        changed = [i for i, (a, b) in enumerate(zip(before[mode], after)) if a != b]
        # The kill must have cut requests off, or the test restarted an idle server.
        mine = [] if cut_off[mode] else [f"{mode}: no request sent before its stop was cut off by it"]
        mine += [f"{mode}: load request failed before the stop: {e}" for e in early_errors[mode][:3]]
        if changed:
            mine.append(f"{mode}: {len(changed)} of {len(reqs)} outputs changed across the restart: {changed[:8]}")
        mine += [f"{mode}: request {i}: {t}" for i, t in enumerate(after) if isinstance(t, str)][:5]
        _e2e.write_result(f"reliability_restart_{mode}", {
            "passed": not mine, "problems": mine, "requests": len(reqs), "changed": len(changed),
            "requests_cut_off_by_the_stop": cut_off[mode], "load_errors_before_the_stop": len(early_errors[mode]),
            "server": server.facts()})
        problems += mine
    assert not problems, "; ".join(problems[:6])

if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
