"""`detspec audit --url`: the /generate payload against SGLang 0.5.23's own
request parser, responses built by SGLang's own meta_info code, and the HTTP
client end to end against a local stand-in server.
"""

import argparse
import json
import math
import socket
import struct
import subprocess
import sys
import threading
import time
import warnings
from array import array
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from _sglang_outputs import NO_PER_TOKEN_EXTRAS
from fastapi.exceptions import FastAPIDeprecationWarning
from pydantic import TypeAdapter
from sglang.srt.entrypoints.api_contract import generate_contract_error
from sglang.srt.entrypoints.http_server import _create_error_response
from sglang.srt.entrypoints.openai.protocol import ErrorResponse
from sglang.srt.managers.io_struct import BatchTokenIDOutput, GenerateReqInput
from sglang.srt.managers.schedule_batch import FINISH_ABORT, FINISH_LENGTH
from sglang.srt.managers.tokenizer_manager import TokenizerManager
from sglang.srt.sampling.sampling_params import TOP_K_ALL, SamplingParams
from sglang.srt.utils.json_response import dumps_json
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_detspec.auditing.batch import build_plan, judge, run_plan
from sglang_detspec.auditing.http_backend import (
    HttpBackend,
    NotSGLangError,
    ServerHttpError,
    ServerResponseError,
    ServerResult,
    ServerUnreachableError,
    _chunks,
    avg_spec_accept_length,
    build_payload,
    parse_response,
)
from sglang_detspec.auditing.server_seeds import run_seed_checks
from sglang_detspec.cli.main import main
from sglang_detspec.reference import ReferenceEngine, build_model_pair
from sglang_detspec.request import Request
from sglang_detspec.ops.seed_encoding import U64, sglang_seed
from sglang_detspec.seeds import derive_sample_seed, fresh_seed
from sglang_detspec.sglang_plugin.request_rules import check_sampling_seed

register_cpu_ci(est_time=30, suite="detspec-unit-cpu")


@pytest.fixture(autouse=True)
def stock_sglang():
    """These tests speak of stock SGLang: an inactive bag, even after another module in this
    process applied the plugin's hooks and published an active runtime context."""
    from sglang_detspec.config import DetSpecConfig, install_config, reset_config

    install_config(DetSpecConfig(source="server_args"))
    yield
    reset_config()

K = 3  # reference draft tokens per round = SGLang --speculative-num-draft-tokens K + 1
VOCAB = 384
# What FastAPI does with the body of `generate_request(obj: GenerateReqInput, ...)`
# (sglang/srt/entrypoints/http_server.py).
GENERATE_REQ = TypeAdapter(GenerateReqInput)


def bits(values):
    return [None if v is None else struct.pack("<d", v) for v in values]


@pytest.fixture(scope="module")
def models():
    return build_model_pair()


@pytest.fixture(scope="module")
def spec_server_context(tmp_path_factory):
    """SGLang's process config as an EAGLE server (K + 1 draft tokens) publishes it.

    ``TokenizerManager._calculate_spec_decoding_metrics`` reads the draft
    token count from it. Restored afterwards so other tests see what they saw.
    """
    from sglang.srt.runtime_context import publish, restore_context, snapshot_context
    from sglang.srt.server_args import ServerArgs

    from sglang_detspec.config import reset_config

    d = tmp_path_factory.mktemp("tiny_llama")
    (d / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
        "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 4,
        "num_hidden_layers": 2, "vocab_size": VOCAB, "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5, "torch_dtype": "float16",
    }))
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    # --device cuda resolves without touching a GPU.
    argv = ["--model-path", str(d), "--device", "cuda", "--attention-backend", "triton", "--skip-tokenizer-init",
            "--speculative-draft-model-path", str(d), "--speculative-algorithm", "EAGLE",
            "--speculative-num-steps", str(K), "--speculative-eagle-topk", "1",
            "--speculative-num-draft-tokens", str(K + 1)]
    sa = ServerArgs.from_cli_args(parser.parse_args(argv))
    sa.resolve_once()
    saved = snapshot_context()
    publish(sa, role="test")
    yield
    restore_context(saved)
    reset_config()


def token_id_output(rid, output_ids, prompt_len, verify_ct, correct_drafts):
    """A real ``BatchTokenIDOutput`` for one finished request, fields unrelated to its meta_info left empty."""
    n = len(output_ids)
    return BatchTokenIDOutput(
        rids=[rid], finished_reasons=[FINISH_LENGTH(n).to_json()], decoded_texts=[""],
        decode_ids=[array("q", output_ids)], read_offsets=[0], output_ids=[array("q", output_ids)],
        skip_special_tokens=[True], spaces_between_special_tokens=[True], no_stop_trim=[False],
        prompt_tokens=[prompt_len], reasoning_tokens=[0], completion_tokens=[n], cached_tokens=[0],
        **NO_PER_TOKEN_EXTRAS,
        retraction_counts=[0], spec_verify_ct=[verify_ct], spec_num_correct_drafts=[correct_drafts],
        spec_correct_drafts_histogram=[[]],
    )


def sglang_item(rid, output_ids, prompt_len, *, verify_ct=None, correct_drafts=0, logprobs=None, finish=None):
    """One element of SGLang's /generate batch answer for a finished, non-streaming request.

    Mirrors ``sglang/srt/managers/tokenizer_manager.py`` line by line, calling
    SGLang's own code where it is a function of its inputs alone.
    """
    n = len(output_ids)
    recv = token_id_output(rid, list(output_ids), prompt_len, verify_ct or 0, correct_drafts)
    # tokenizer_manager.py
    meta = {
        "id": rid,
        "finish_reason": finish if finish is not None else recv.finished_reasons[0],
        "prompt_tokens": prompt_len,
        "weight_version": "default",
        "num_retractions": 0,
    }
    if logprobs is not None:
        # tokenizer_manager.py; entries from SGLang's detokenize_logprob_tokens
        # (tokenizer_manager.py) with return_text_in_logprobs off.
        meta["input_token_logprobs"] = []
        entries = TokenizerManager.detokenize_logprob_tokens(None, logprobs, list(output_ids), False)
        meta["output_token_logprobs"] = entries
        meta["output_token_logprobs_length"] = n
    # tokenizer_manager.py
    meta.update({"reasoning_tokens": 0, "completion_tokens": n, "cached_tokens": 0})
    meta["e2e_latency"] = 0.01
    if verify_ct is not None:
        # tokenizer_manager.py: SGLang's own spec metrics on the real output struct.
        TokenizerManager._calculate_spec_decoding_metrics(None, meta, recv, 0)
    # tokenizer_manager.py (--skip-tokenizer-init: no "text")
    return {"output_ids": list(output_ids), "meta_info": meta}


def sglang_error_response(exc: Exception) -> tuple[int, bytes]:
    """SGLang's HTTP answer to a ``ValueError`` in ``/generate`` (``http_server._create_error_response``).

    SGLang builds it as FastAPI's ``ORJSONResponse``, which FastAPI deprecates
    with a ``FastAPIDeprecationWarning`` on every construction: that is SGLang's
    to change, so the warning is silenced here, where it arises, and nowhere else.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FastAPIDeprecationWarning)
        response = _create_error_response(exc)
    return response.status_code, bytes(response.body)


def wire(items) -> object:
    """What the client reads: SGLang's serializer (``utils/json_response.py``), parsed by ``json``."""
    return json.loads(dumps_json(items))


# -- the request ----------------------------------------------------------------------------


def test_sglang_seed_keeps_the_64_bits():
    for seed in (0, 1, 2**63 - 1, 2**63, 2**64 - 1, 0xDEADBEEF_CAFEF00D):
        assert sglang_seed(seed) == seed  # sglang-detspec admits [0, 2**64) as is
        s = sglang_seed(seed, "int64")
        assert -(2**63) <= s < 2**63 and s % U64 == seed
    for bad in (-1, 2**64, True, 1.0):
        with pytest.raises(ValueError, match="seed must be an int"):
            sglang_seed(bad)
    with pytest.raises(ValueError, match="encoding must be one of"):
        sglang_seed(1, "uint32")


def test_payload_passes_sglangs_own_request_parsing():
    reqs = [
        Request((5, 9, 1), 4, 0.0, 0),
        Request((7,), 2, 1.3, 2**63),
        Request(tuple(range(24)), 16, 1.0, 2**64 - 1),
        Request((383, 0), 1, 0.7, 2**63 - 1),
    ]
    rids = [f"r{i}" for i in range(len(reqs))]
    # Stock SGLang's checks: seeds >= 2**63 go as their int64 bits.
    body = json.loads(json.dumps(build_payload(reqs, rids, "int64")))
    # The schema gate /generate applies first (http_server.py) ...
    assert generate_contract_error(body) is None
    # ... then FastAPI's parse into the dataclass and SGLang's normalisation.
    obj = GENERATE_REQ.validate_python(body)
    obj.normalize_batch_and_arguments()
    assert obj.is_single is False and obj.batch_size == len(reqs)
    for i, req in enumerate(reqs):
        sub = obj[i]
        assert sub.input_ids == list(req.prompt_ids) and sub.rid == rids[i]
        assert sub.return_logprob is True and sub.logprob_start_len == -1 and sub.stream is False
        # What the tokenizer manager does with them (tokenizer_manager.py).
        sp = SamplingParams(**sub.sampling_params)
        sp.normalize(None)
        sp.verify(VOCAB)
        assert sp.max_new_tokens == req.max_new_tokens and sp.ignore_eos and not sp.stop_token_ids
        assert sp.sampling_seed % U64 == req.sampling_seed
        assert sp.top_p == 1.0 and sp.min_p == 0.0
        if req.temperature == 0:
            assert sp.top_k == 1  # SGLang's greedy
        else:
            assert sp.temperature == req.temperature and sp.top_k == TOP_K_ALL


def test_stock_sglang_rejects_unsigned_seeds_so_int64_encoding_maps_them():
    with pytest.raises(ValueError, match=r"sampling_seed must be in \[-2\*\*63"):
        SamplingParams(sampling_seed=2**63).verify(VOCAB)
    body = build_payload([Request((1,), 1, 1.0, 2**63)], ["r"], "int64")
    SamplingParams(**body["sampling_params"][0]).verify(VOCAB)
    # The default sends 2**63 as is: the schema gate admits it (sglang-detspec's check then does).
    body = build_payload([Request((1,), 1, 1.0, 2**63)], ["r"])
    assert body["sampling_params"][0]["sampling_seed"] == 2**63
    assert generate_contract_error(json.loads(json.dumps(body))) is None


def test_payload_rejects_bad_batches():
    with pytest.raises(ValueError, match="at least one request"):
        build_payload([], [])
    with pytest.raises(ValueError, match="2 rids for 1 requests"):
        build_payload([Request((1,), 1, 1.0, 0)], ["a", "b"])


def test_chunks_cut_contiguous_near_equal_runs():
    assert _chunks(7, 3) == [(0, 3), (3, 5), (5, 7)]
    assert _chunks(2, 5) == [(0, 1), (1, 2)]
    assert _chunks(4, 1) == [(0, 4)]


# -- the response ---------------------------------------------------------------------------


def test_parse_reads_sglangs_counters_and_logprobs_bit_for_bit(spec_server_context):
    import numpy as np

    reqs = [Request((1, 2, 3), 5, 1.0, 11), Request((4,), 3, 0.0, 12)]
    # Logprobs that must survive orjson -> json exactly: a float32 value, a
    # subnormal, a non-terminating fraction, and a negative zero.
    lp0 = [float(np.float32(-0.1)), -5e-324, -1 / 3, -0.0, -17.25]
    lp1 = [-2.5e-8, -0.6931471805599453, 0.0]
    items = [
        sglang_item("a", [10, 11, 12, 13, 14], 3, verify_ct=2, correct_drafts=3, logprobs=lp0),
        sglang_item("b", [7, 7, 7], 1, verify_ct=3, correct_drafts=0, logprobs=lp1),
    ]
    # SGLang's own fields, as its code built them (tokenizer_manager.py).
    assert items[0]["meta_info"]["spec_verify_ct"] == 2 and items[0]["meta_info"]["spec_accept_length"] == 2.5
    results = parse_response(wire(items), reqs, ["a", "b"])
    a, b = results
    assert isinstance(a, ServerResult) and a.output_ids == (10, 11, 12, 13, 14) and a.accept_lengths == ()
    assert a.verify_rounds == 2 and b.verify_rounds == 3
    # completion tokens / verify rounds, which is SGLang's spec_accept_length.
    assert a.mean_accept_length == items[0]["meta_info"]["spec_accept_length"] == 2.5
    assert b.mean_accept_length == items[1]["meta_info"]["spec_accept_length"] == 1.0
    assert bits(a.output_logprobs) == bits(lp0) and bits(b.output_logprobs) == bits(lp1)
    assert bits([-0.0]) != bits([0.0])  # the comparison is bitwise, not by value


def test_parse_without_speculative_decoding_or_logprobs(spec_server_context):
    # A server without speculative decoding skips _calculate_spec_decoding_metrics
    # (tokenizer_manager.py), so there is no spec_verify_ct.
    item = sglang_item("a", [3, 4], 2)
    assert "spec_verify_ct" not in item["meta_info"] and "output_token_logprobs" not in item["meta_info"]
    (res,) = parse_response(wire([item]), [Request((1, 2), 2, 1.0, 0)], ["a"])
    assert res.verify_rounds is None and res.mean_accept_length is None and res.output_logprobs is None


def _break_order(items):
    return items[::-1]


def _abort(items):
    items[0]["meta_info"]["finish_reason"] = FINISH_ABORT("out of memory", None).to_json()
    return items


def _short(items):
    items[1]["output_ids"].pop()
    return items


def _logprob_token(items):
    items[0]["meta_info"]["output_token_logprobs"][1] = [-1.0, 999, None]
    return items


def _few_logprobs(items):
    items[0]["meta_info"]["output_token_logprobs"].pop()
    return items


def _zero_rounds(items):
    items[0]["meta_info"]["spec_verify_ct"] = 0
    return items


def _negative_seed(items):
    # A seed reported as its int64 bits, not as the uint64 the contract promises.
    items[0]["meta_info"]["sampling_seed"] = -5
    return items


def _completion_mismatch(items):
    items[1]["meta_info"]["completion_tokens"] = 2
    return items


@pytest.mark.parametrize(
    "mutate, match",
    [
        (_break_order, "expected the result of request a, got meta_info.id 'b'"),
        (_abort, "request a was aborted by the server: out of memory"),
        (_short, "request b: 2 output tokens for max_new_tokens=3"),
        (_logprob_token, r"output_token_logprobs\[1\] = \[-1.0, 999, None\] does not match output token 11"),
        (_few_logprobs, "expected 3 output_token_logprobs entries"),
        (_zero_rounds, "spec_verify_ct must be an int >= 1, got 0"),
        (_completion_mismatch, "completion_tokens 2 but 3 output_ids"),
        (_negative_seed, r"request a: meta_info.sampling_seed must be an int in \[0, 2\*\*64\), got -5"),
        (lambda items: items[:1], "expected a list of 2 results from /generate, got a list of 1"),
        (lambda items: {"error": "x"}, "expected a list of 2 results from /generate, got dict"),
    ],
)
def test_parse_rejects_answers_that_do_not_fit(spec_server_context, mutate, match):
    reqs = [Request((1,), 3, 1.0, 1), Request((2,), 3, 1.0, 2)]
    items = [
        sglang_item("a", [10, 11, 12], 1, verify_ct=1, correct_drafts=2, logprobs=[-0.5, -0.25, -0.125]),
        sglang_item("b", [20, 21, 22], 1, verify_ct=2, correct_drafts=1, logprobs=[-1.5, -1.25, -1.125]),
    ]
    parse_response(wire(items), reqs, ["a", "b"])  # as built, it parses
    with pytest.raises(ServerResponseError, match=match):
        parse_response(wire(mutate(items)), reqs, ["a", "b"])


def test_server_info_accept_length():
    # /server_info: internal_states, one per DP rank (http_server.py), with
    # avg_spec_accept_length when speculative (internal_state.py).
    assert avg_spec_accept_length({"internal_states": [{"avg_spec_accept_length": 2.75}]}) == 2.75
    two_ranks = {"internal_states": [{"avg_spec_accept_length": 2.0}, {"avg_spec_accept_length": 3.0}]}
    assert avg_spec_accept_length(two_ranks) == 2.5
    assert avg_spec_accept_length({"internal_states": [{"last_gen_throughput": 1.0}]}) is None
    assert avg_spec_accept_length({}) is None


# -- run_plan / judge with server results ---------------------------------------------------


class _ListBackend:
    """Replays fixed results: for the audit's summary arithmetic, no HTTP."""

    name = "server"

    def __init__(self, make):
        self.make = make
        self.calls = 0

    def generate(self, requests_):
        self.calls += 1
        return [self.make(self.calls, r) for r in requests_]


def test_summary_counts_rounds_and_compares_logprobs_bitwise():
    plan = build_plan(4, seed=1, max_new_tokens=4, vocab_size=50, max_batch=3)
    same = run_plan(_ListBackend(lambda c, r: ServerResult(
        (1,) * r.max_new_tokens, (), verify_rounds=2, output_logprobs=(-0.5,) * r.max_new_tokens)), plan)
    assert same.probe_logprobs_identical is True and same.unique_probe_logprobs == 1
    tokens = sum(r.max_new_tokens for t in plan.trials for b in t.batches for r in b)
    rounds = 2 * sum(t.num_requests for t in plan.trials)
    assert same.mean_accept_length == tokens / rounds
    assert judge(same).notes == ()

    # Tokens equal, logprobs differing only in the sign of zero: not bitwise equal.
    moved = run_plan(_ListBackend(lambda c, r: ServerResult(
        (1,) * r.max_new_tokens, (), verify_rounds=1, output_logprobs=((-1) ** c * 0.0,) * r.max_new_tokens)), plan)
    assert moved.unique_probe_outputs == 1 and moved.probe_logprobs_identical is False
    assert moved.unique_probe_logprobs == 2
    verdict = judge(moved)
    assert verdict.passed and any("not bitwise equal across trials (2 distinct" in n for n in verdict.notes)
    # Asked for (a server claiming logits='bitwise'), moving logprobs fail, as do none at all.
    strict = judge(moved, bitwise_logprobs=True)
    assert not strict.passed and strict.notes == () and strict.message == (
        "FAIL: the seeded probe gave 1 unique output across 4 trials, but the seeded probe's output logprobs were "
        "not bitwise equal across trials (2 distinct sequences); bitwise logprobs were asked for (--bitwise-logprobs)")
    assert judge(same, bitwise_logprobs=True).passed
    trial = moved.to_json()["trials"][0]
    assert trial["probe_verify_rounds"] == 1 and len(trial["probe_output_logprobs"]) == 4

    unknown = run_plan(_ListBackend(lambda c, r: ServerResult((1,) * r.max_new_tokens, ())), plan)
    assert unknown.mean_accept_length is None and unknown.probe_logprobs_identical is None
    assert "the backend returned no output logprobs to compare" in judge(unknown, bitwise_logprobs=True).message
    assert unknown.to_json()["mean_accept_length"] is None


def test_a_seeded_filler_that_varies_fails_the_audit():
    """Every request of the plan carries its seed: a filler whose tokens move between batches is batch dependence
    even where the probe's do not."""
    plan = build_plan(4, seed=1, max_new_tokens=4, vocab_size=50, max_batch=3)
    probe_seed = plan.probe.sampling_seed

    def result(call, request):
        token = 1 if request.sampling_seed == probe_seed else call  # every filler's tokens follow the call
        return ServerResult((token,) * request.max_new_tokens, (), output_logprobs=(-0.5,) * request.max_new_tokens)

    moved = run_plan(_ListBackend(result), plan)
    assert moved.unique_probe_outputs == 1 and moved.varying_requests > 0
    verdict = judge(moved)
    assert not verdict.passed and verdict.message.startswith(
        f"FAIL: {moved.varying_requests} of {moved.num_requests} seeded requests changed output between batches")


# -- end to end over HTTP -------------------------------------------------------------------


def stand_in_logprobs(prompt, output, jitter=0.0):
    """Deterministic made-up logprobs (the reference engine has none); ``jitter`` shifts them."""
    seq, out = list(prompt), []
    for t in output:
        h = (sum(seq) * 1000003 + t * 7919 + len(seq)) % 100003
        out.append(-h / 30011.0 - jitter)
        seq.append(t)
    return out


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        # A client that gave up (the timeout test) is expected, not an error.
        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            super().handle_error(request, client_address)


class _LocalServer:
    """Serve ``handler`` on a free loopback port in a thread while the ``with`` block runs."""

    def _listen(self, handler) -> None:
        self.httpd = _QuietServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join()


class StandInServer(_LocalServer):
    """A local HTTP server that answers SGLang's /generate and /server_info with the reference engine.

    It exercises our HTTP client plumbing, not SGLang: requests go through
    SGLang's own parsing (schema gate, dataclass, normalisation, sampling
    params), are decoded by the in-process reference engine, and come back in
    SGLang's response shape (see :func:`sglang_item`), errors included.

    Args:
        engine: the reference engine to decode with.
        jitter_logprobs: add a batch-size-dependent offset to the logprobs.
        delay_s: wait this long before answering /generate.
        detspec_seed_check: check ``sampling_seed`` as a server with
            sglang-detspec active does (its request hook's check, then
            SGLang's); False checks as stock SGLang does.
        deterministic: what ``/server_info`` says of ``enable_deterministic_inference``.
    """

    def __init__(self, engine, *, jitter_logprobs=False, delay_s=0.0, detspec_seed_check=True, deterministic=True):
        self.engine = engine
        self.deterministic = deterministic
        self.detspec_seed_check = detspec_seed_check
        self.jitter_logprobs = jitter_logprobs
        self.delay_s = delay_s
        self.forced = None  # (status, content type, body bytes) to answer /generate with
        self.batch_sizes = []
        self.tokens = self.rounds = 0
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                if self.path != "/server_info":
                    return self._send(404, "application/json", b'{"detail":"Not Found"}')
                with outer.lock:
                    state = {"last_gen_throughput": 0.0}
                    if outer.rounds:
                        state["avg_spec_accept_length"] = outer.tokens / outer.rounds
                info = {"version": "stand-in", "model_path": "reference", "speculative_algorithm": "EAGLE",
                        "speculative_num_draft_tokens": K + 1,
                        "enable_deterministic_inference": outer.deterministic,
                        "skip_tokenizer_init": True, "internal_states": [state]}
                self._send(200, "application/json", dumps_json(info))

            def do_POST(self):
                if self.path != "/generate":
                    return self._send(404, "application/json", b'{"detail":"Not Found"}')
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                time.sleep(outer.delay_s)
                if outer.forced is not None:
                    return self._send(*outer.forced)
                status, payload = outer.generate(body)
                self._send(status, "application/json", payload)

            def _send(self, status, content_type, payload):
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self._listen(Handler)

    def _request_seeds(self, obj, subs):
        """Each expanded request's seed, as a server with (or without) sglang-detspec assigns it.

        With the plugin (docs/design.md section 6): a sampled request without
        ``sampling_seed`` gets a fresh 64-bit seed, sample j of ``n`` gets
        ``derive_sample_seed(seed, j)``, and the seed is reported. Without it,
        as stock SGLang under deterministic inference: unseeded requests all get
        42, the samples of ``n`` share their request's seed, nothing is reported.
        """
        batch = obj.batch_size
        seeds = []
        for index, sub in enumerate(subs):
            seed = sub.sampling_params.get("sampling_seed")
            if self.detspec_seed_check:
                j, first = divmod(index, batch)
                if seed is None:
                    if j == 0:
                        seed = fresh_seed()
                    else:
                        seed = derive_sample_seed(seeds[first][0], j)  # sample 0 holds the fresh seed
                else:
                    seed = derive_sample_seed(seed % U64, j)
                seeds.append((seed, True))
            else:
                seeds.append((42 if seed is None else seed % U64, False))
        return seeds

    def generate(self, body):
        contract_error = generate_contract_error(body)
        if contract_error is not None:
            return 400, dumps_json({"error": contract_error})  # http_server.py
        try:
            obj = GENERATE_REQ.validate_python(body)
            obj.normalize_batch_and_arguments()
            # A single request (is_single) is its own only sub-request.
            subs = [obj] if obj.is_single else [obj[i] for i in range(obj.batch_size * obj.parallel_sample_num)]
            seeds = self._request_seeds(obj, subs)
            reqs, rids, reported = [], [], []
            for i, sub in enumerate(subs):
                sp = SamplingParams(**sub.sampling_params)
                sp.normalize(None)
                if self.detspec_seed_check and sp.sampling_seed is not None:
                    sp.sampling_seed = check_sampling_seed(sp.sampling_seed)
                sp.verify(self.engine.models.vocab_size)
                greedy = sp.top_k == 1
                seed, report = seeds[i]
                reqs.append(Request(tuple(sub.input_ids), sp.max_new_tokens, 0.0 if greedy else sp.temperature, seed))
                rids.append(sub.rid)
                reported.append(seed if report and not greedy else None)
            with self.lock:
                self.batch_sizes.append(len(reqs))
                results = self.engine.generate(reqs)
        except ValueError as exc:
            return sglang_error_response(exc)
        jitter = len(reqs) * 2.0**-30 if self.jitter_logprobs else 0.0
        items = []
        for rid, req, res, seed in zip(rids, reqs, results, reported):
            with self.lock:
                self.tokens += len(res.output_ids)
                self.rounds += len(res.accept_lengths)
            item = sglang_item(
                rid, list(res.output_ids), len(req.prompt_ids), verify_ct=len(res.accept_lengths),
                correct_drafts=sum(a - 1 for a in res.accept_lengths),
                logprobs=stand_in_logprobs(req.prompt_ids, res.output_ids, jitter),
            )
            if seed is not None:
                item["meta_info"]["sampling_seed"] = seed
            items.append(item)
        # SGLang answers a single request (no list in the body, n = 1) with one object.
        return 200, dumps_json(items[0] if obj.is_single else self._sample_major_to_request_major(items, obj))

    @staticmethod
    def _sample_major_to_request_major(items, obj):
        # SGLang expands n samples as [all requests' sample 0, all requests' sample 1, ...]
        # but answers request by request, its samples in order.
        batch, n = obj.batch_size, obj.parallel_sample_num
        return [items[j * batch + i] for i in range(batch) for j in range(n)]


AUDIT = ["audit", "--trials", "7", "--max-new-tokens", "6", "--max-batch-size", "6", "--vocab-size", str(VOCAB)]
SEED = 2**64 - 5  # above 2**63: SGLang's int64 seed tensor carries it as a negative value


def test_cli_audits_a_server_end_to_end(spec_server_context, models, tmp_path, capsys):
    out = tmp_path / "server.json"
    with StandInServer(ReferenceEngine(models, K)) as server:
        code = main([*AUDIT, "--url", server.url + "/", "--seed", str(SEED), "--json", str(out)])
    stdout = capsys.readouterr().out
    assert code == 0, stdout
    assert "PASS" in stdout and "bitwise equal" in stdout and "server's own average accept length" in stdout
    assert "all 6 request-seed checks held" in stdout and "audit passed: changing batch, request seeds" in stdout
    report = json.loads(out.read_text())
    assert report["passed"] is True and list(report["runs"]) == ["server"]
    seeds = report["request_seeds"]
    assert seeds["passed"] is True and seeds["seed"] == SEED and seeds["derived_seeds_match"] is True
    assert [c["name"] for c in seeds["checks"]] == [
        "unseeded", "n_distinct", "n_replay", "sample0_is_seed", "sample1_not_seed_plus_1", "reported_seeds_replay"]
    assert seeds["reported_seeds"][4:] == [derive_sample_seed(SEED, j) for j in range(4)]
    settings = report["settings"]
    assert settings["url"] == server.url and settings["control"] is False and settings["concurrency"] == 1
    assert settings["vocab_size"] == VOCAB and settings["server"]["speculative_num_draft_tokens"] == K + 1
    run = report["runs"]["server"]
    assert run["unique_probe_outputs"] == 1 and run["varying_requests"] == 0
    assert run["probe_logprobs_identical"] is True and run["unique_probe_logprobs"] == 1

    # The server decoded exactly what the in-process engine decodes for this plan:
    # same tokens (so the seed arrived intact) and the same rounds.
    plan = build_plan(7, seed=SEED, max_new_tokens=6, vocab_size=VOCAB, max_batch=6)
    local = run_plan(ReferenceEngine(models, K), plan)
    assert [t["probe_output_ids"] for t in run["trials"]] == [list(o.probe.output_ids) for o in local.outcomes]
    assert [t["probe_verify_rounds"] for t in run["trials"]] == [len(o.probe.accept_lengths) for o in local.outcomes]
    assert run["mean_accept_length"] == local.mean_accept_length > 1
    assert run["server_avg_accept_length"] == pytest.approx(local.mean_accept_length)
    # One POST per sub-batch, in schedule order (the request-seed checks follow).
    trial_posts = [len(b) for t in plan.trials for b in t.batches]
    assert server.batch_sizes[:len(trial_posts)] == trial_posts
    for trial in run["trials"]:
        assert trial["probe_output_logprobs"] == run["trials"][0]["probe_output_logprobs"]


def test_a_server_without_deterministic_inference_is_named(spec_server_context, models, capsys):
    with StandInServer(ReferenceEngine(models, K), deterministic=False) as server:
        main([*AUDIT, "--url", server.url, "--no-seed-checks"])
    assert "warning: the server runs without --enable-deterministic-inference" in capsys.readouterr().err
    with StandInServer(ReferenceEngine(models, K)) as server:
        main([*AUDIT, "--url", server.url, "--no-seed-checks"])
    assert "--enable-deterministic-inference" not in capsys.readouterr().err


def test_stock_sglang_server_needs_int64_seed_encoding(spec_server_context, models, tmp_path, capsys):
    # A server without sglang-detspec's request check refuses seeds >= 2**63 sent as is,
    # and the CLI says which flag fixes it; with that flag the same audit passes.
    with StandInServer(ReferenceEngine(models, K), detspec_seed_check=False) as server:
        assert main([*AUDIT, "--url", server.url, "--seed", str(SEED)]) == 2
        err = capsys.readouterr().err
        assert "sampling_seed must be in [-2**63, 2**63 - 1]" in err and "--seed-encoding int64" in err
        out = tmp_path / "int64.json"
        code = main([*AUDIT, "--url", server.url, "--seed", str(SEED), "--seed-encoding", "int64", "--no-seed-checks",
                     "--json", str(out)])
    assert code == 0, capsys.readouterr().out
    report = json.loads(out.read_text())
    assert report["passed"] and report["settings"]["seed_encoding"] == "int64" and "request_seeds" not in report
    # The other way round: int64 bits sent to a server with sglang-detspec's check.
    with StandInServer(ReferenceEngine(models, K)) as server:
        assert main([*AUDIT, "--url", server.url, "--seed", str(SEED), "--seed-encoding", "int64"]) == 2
    err = capsys.readouterr().err
    assert "sampling_seed must be in [0, 2**64 - 1]" in err and "drop --seed-encoding int64" in err
    plan = build_plan(7, seed=SEED, max_new_tokens=6, vocab_size=VOCAB, max_batch=6)
    local = run_plan(ReferenceEngine(models, K), plan)
    assert report["runs"]["server"]["trials"][0]["probe_output_ids"] == list(local.outcomes[0].probe.output_ids)


def test_concurrent_senders_split_each_sub_batch(spec_server_context, models):
    plan = build_plan(7, seed=3, max_new_tokens=5, vocab_size=VOCAB, max_batch=6)
    with StandInServer(ReferenceEngine(models, K)) as server:
        with HttpBackend(server.url, timeout=60, concurrency=3) as backend:
            summary = run_plan(backend, plan)
    expected = [b - a for t in plan.trials for batch in t.batches for a, b in _chunks(len(batch), 3)]
    assert sorted(server.batch_sizes) == sorted(expected) and len(expected) > len(plan.trials)
    # Results map back to their requests: the seeded engine's outputs do not
    # depend on the batch, so they match an in-process run row for row.
    local = run_plan(ReferenceEngine(models, K), plan)
    assert [o.probe.output_ids for o in summary.outcomes] == [o.probe.output_ids for o in local.outcomes]
    assert summary.unique_probe_outputs == 1 and summary.varying_requests == 0
    assert summary.mean_accept_length == local.mean_accept_length


def test_a_batch_dependent_server_fails(spec_server_context, models, capsys):
    with StandInServer(ReferenceEngine.control(models, K, seed=0)) as server:
        assert main([*AUDIT, "--url", server.url, "--seed", "1"]) == 1
    assert "FAIL" in capsys.readouterr().out


def test_logprobs_that_move_are_reported(spec_server_context, models, tmp_path, capsys):
    out = tmp_path / "jitter.json"
    with StandInServer(ReferenceEngine(models, K), jitter_logprobs=True) as server:
        assert main([*AUDIT, "--url", server.url, "--json", str(out)]) == 0
    stdout = capsys.readouterr().out
    assert "distinct" in stdout and "not bitwise equal" in stdout
    run = json.loads(out.read_text())["runs"]["server"]
    assert run["unique_probe_outputs"] == 1 and run["probe_logprobs_identical"] is False
    assert run["unique_probe_logprobs"] > 1
    # Asked for bitwise logprobs, the same server fails the audit.
    with StandInServer(ReferenceEngine(models, K), jitter_logprobs=True) as server:
        assert main([*AUDIT, "--url", server.url, "--bitwise-logprobs", "--json", str(out)]) == 1
    assert "bitwise logprobs were asked for (--bitwise-logprobs)" in capsys.readouterr().out
    report = json.loads(out.read_text())
    assert report["passed"] is False and report["message"].startswith("FAIL: the seeded probe gave 1 unique output")
    assert report["verdict"] == "audit failed: changing batch"


def _closed_port_url():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.mark.parametrize("extra", [[], ["--no-invariance", "--no-control"]], ids=["plain", "in-process-sections-off"])
def test_unreachable_server_exits_2(capsys, extra):
    # Turning off what only the in-process engine runs is harmless with --url: the audit gets as far as the server.
    url = _closed_port_url()
    assert main([*AUDIT, "--url", url, *extra]) == 2
    err = capsys.readouterr().err
    assert err.endswith(f"detspec: error: no SGLang server answers at {url} (start one with `detspec serve ...`)\n")
    notes = [line for line in err.splitlines()[:-1]]
    assert all(line.startswith("detspec: note: ") and "changes nothing with --url" in line for line in notes)
    assert len(notes) == len(extra)


def test_in_process_position_bound_does_not_apply_to_a_server(capsys):
    # The served model's context length is the server's to enforce: the audit
    # gets as far as asking it.
    url = _closed_port_url()
    assert main([*AUDIT, "--url", url, "--max-new-tokens", "5000"]) == 2
    err = capsys.readouterr().err
    assert "no SGLang server answers" in err and "must be at most" not in err


def test_server_refusal_prints_sglangs_message(spec_server_context, models, capsys):
    # Prompt ids drawn from a vocabulary larger than the model's: the stand-in
    # refuses as SGLang's /generate does for a ValueError.
    with StandInServer(ReferenceEngine(models, K)) as server:
        assert main([*AUDIT[:-1], "100000", "--url", server.url]) == 2
    err = capsys.readouterr().err
    assert "POST /generate returned HTTP 400:" in err and "outside the vocabulary [0, 384)" in err


@pytest.mark.parametrize(
    "status, content_type, body, message",
    [
        # The schema gate (http_server.py).
        (400, "application/json", dumps_json({"error": generate_contract_error({"input_ids": "x"})}),
         generate_contract_error({"input_ids": "x"})),
        # A ValueError in generate (http_server.py).
        (400, "application/json", sglang_error_response(ValueError("bad [thing]"))[1], "bad [thing]"),
        # Request validation / HTTPException (http_server.py).
        (503, "application/json", dumps_json(ErrorResponse(message="overloaded", type="503", code=503).model_dump()),
         "overloaded"),
        (502, "text/html", b"<html>Bad Gateway</html>", "<html>Bad Gateway</html>"),
    ],
)
def test_http_errors_carry_the_servers_message(models, status, content_type, body, message):
    with StandInServer(ReferenceEngine(models, K)) as server:
        server.forced = (status, content_type, body)
        with HttpBackend(server.url, timeout=30) as backend:
            with pytest.raises(ServerHttpError) as exc:
                backend.generate([Request((1,), 1, 1.0, 0)])
    assert exc.value.status == status and exc.value.server_message == message
    assert f"returned HTTP {status}: {message}" in str(exc.value)


def test_non_list_answer_and_timeout(models):
    with StandInServer(ReferenceEngine(models, K)) as server:
        server.forced = (200, "application/json", b'{"text": "hi"}')
        with HttpBackend(server.url, timeout=30) as backend:
            with pytest.raises(ServerResponseError, match="expected a list of 1 results from /generate, got dict"):
                backend.generate([Request((1,), 1, 1.0, 0)])
            assert backend.generate([]) == []
        server.delay_s = 1.0
        with HttpBackend(server.url, timeout=0.2) as backend:
            with pytest.raises(ServerUnreachableError, match=r"no answer from .*/generate within 0.2 s"):
                backend.generate([Request((1,), 1, 1.0, 0)])


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(url="127.0.0.1:30000"), "url must start with http"),
        (dict(url="http://h", timeout=0), "timeout must be"),
        (dict(url="http://h", timeout=math.inf), "timeout must be"),
        (dict(url="http://h", concurrency=0), "concurrency must be"),
        (dict(url="http://h", seed_encoding="u64"), "seed_encoding must be one of"),
    ],
)
def test_backend_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        HttpBackend(**kwargs)


# -- request-seed checks --------------------------------------------------------------------


def test_seed_checks_pass_when_every_request_gets_its_own_seed(spec_server_context, models):
    with StandInServer(ReferenceEngine(models, K)) as server:
        with HttpBackend(server.url, timeout=60) as backend:
            report = run_seed_checks(backend, (5, 6, 7), seed=123, max_new_tokens=8)
    assert report.passed and all(c.passed for c in report.checks)
    details = {c.name: c.detail for c in report.checks}
    assert details["unseeded"] == "4 unseeded requests of one prompt gave 4 distinct output(s)"
    assert details["n_distinct"] == "n = 4 with sampling_seed 123 gave 4 distinct completion(s)"
    assert details["reported_seeds_replay"].startswith("8 of 8 reported seeds replayed their output")
    # Four fresh seeds, then the request seed and its derived sample seeds.
    assert len(set(report.reported_seeds[:4])) == 4
    assert report.reported_seeds[4:] == tuple(derive_sample_seed(123, j) for j in range(4))
    assert report.derived_seeds_match is True
    # 4 unseeded + n = 4 twice + seed + seed + 1 + 8 replays, one POST each.
    assert server.batch_sizes == [1] * 4 + [4, 4] + [1] * 10


def test_seed_checks_fail_on_stock_seeding(spec_server_context, models, tmp_path, capsys):
    # Stock SGLang under deterministic inference: every unseeded request gets seed 42,
    # the n samples share their request's seed, and no seed is reported.
    out = tmp_path / "stock.json"
    with StandInServer(ReferenceEngine(models, K), detspec_seed_check=False) as server:
        code = main([*AUDIT, "--url", server.url, "--seed", "7", "--seed-encoding", "int64", "--json", str(out)])
    stdout = capsys.readouterr().out
    assert code == 1, stdout
    assert "FAIL: 3 of 6 request-seed checks failed (unseeded, n_distinct, reported_seeds_replay)" in stdout
    report = json.loads(out.read_text())
    assert report["passed"] is False and report["runs"]["server"]["unique_probe_outputs"] == 1
    assert report["sections"] == {"changing_batch": True, "request_seeds": False}
    checks = {c["name"]: c for c in report["request_seeds"]["checks"]}
    assert checks["unseeded"]["detail"] == "4 unseeded requests of one prompt gave 1 distinct output(s)"
    assert checks["n_distinct"]["detail"] == "n = 4 with sampling_seed 7 gave 1 distinct completion(s)"
    assert checks["n_replay"]["passed"] and checks["sample0_is_seed"]["passed"]
    assert checks["sample1_not_seed_plus_1"]["passed"]
    assert checks["reported_seeds_replay"]["detail"].endswith("8 response(s) reported no meta_info.sampling_seed")
    assert report["request_seeds"]["reported_seeds"] == [None] * 8


def test_seed_checks_catch_consecutive_sample_seeds(spec_server_context, models):
    # A server that seeds sample j with seed + j: distinct and replayable, yet
    # sample 1 is exactly what seed + 1 gives.
    class Consecutive(StandInServer):
        def _request_seeds(self, obj, subs):
            base = [sub.sampling_params.get("sampling_seed") for sub in subs]
            return [(fresh_seed() if b is None else (b + i) % U64, True) for i, b in enumerate(base)]

    with Consecutive(ReferenceEngine(models, K)) as server:
        with HttpBackend(server.url, timeout=60) as backend:
            report = run_seed_checks(backend, (1, 2), seed=9, max_new_tokens=6, num_unseeded=2, n=2)
    failed = [c.name for c in report.checks if not c.passed]
    assert "sample1_not_seed_plus_1" in failed and "n_distinct" not in failed
    assert report.derived_seeds_match is False


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(seed=-1), "seed must be an int in"),
        (dict(seed=U64), "seed must be an int in"),
        (dict(max_new_tokens=0), "max_new_tokens must be an int >= 1"),
        (dict(num_unseeded=1), "num_unseeded must be an int >= 2"),
        (dict(n=1), "n must be an int >= 2"),
        (dict(prompt=()), "prompt must hold at least one token id"),
    ],
)
def test_seed_checks_reject_bad_arguments(kwargs, match):
    args = {"prompt": (1,), "seed": 0, "max_new_tokens": 4, **kwargs}
    with HttpBackend("http://127.0.0.1:1") as backend:
        with pytest.raises(ValueError, match=match):
            run_seed_checks(backend, args.pop("prompt"), **args)


# -- what answers at the URL ----------------------------------------------------------------


class _NotFoundServer(_LocalServer):
    """A local HTTP server that answers 404 to everything: some other web service."""

    def __init__(self):
        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                body = b"<html>nothing here</html>"
                self.send_response(404)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_POST = do_GET

        self._listen(Handler)


def test_something_else_at_the_url_is_not_an_sglang_server(capsys):
    with _NotFoundServer() as other:
        with HttpBackend(other.url) as backend:
            with pytest.raises(NotSGLangError, match="answers HTTP 404 to /server_info and /get_server_info"):
                backend.server_info()
        assert main([*AUDIT, "--url", other.url]) == 2
    err = capsys.readouterr().err
    assert f"detspec: error: {other.url} is not an SGLang server" in err


def test_server_path_imports_neither_torch_nor_transformers():
    code = (
        "import sys\n"
        "from sglang_detspec.cli.main import main\n"
        f"code = main({[*AUDIT, '--url', _closed_port_url()]!r})\n"
        "print('exit', code, 'heavy:', sorted(m for m in ('torch', 'transformers', 'sglang') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.splitlines()[-1] == "exit 2 heavy: []"
    assert "no SGLang server answers at" in done.stderr


# -- CLI argument errors --------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, message",
    [
        (["--url", "http://127.0.0.1:1"], "--url needs --vocab-size: SGLang's /server_info and /model_info"),
        (["--url", "http://127.0.0.1:1", "--vocab-size", "10", "--control"], "--control is not available with --url"),
        (["--url", "http://127.0.0.1:1", "--vocab-size", "10", "-k", "2"], "--num-draft-tokens sets the in-process"),
        (["--concurrency", "2"], "--concurrency can only be used with --url"),
        (["--vocab-size", "10", "--timeout", "5"], "--vocab-size, --timeout can only be used with --url"),
        (["--no-seed-checks"], "--seed-checks can only be used with --url"),
        (["--bitwise-logprobs"], "--bitwise-logprobs can only be used with --url"),
        (["--url", "http://127.0.0.1:1", "--vocab-size", "10", "--mode", "coupled"], "--mode sets the in-process"),
        (["--url", "http://127.0.0.1:1", "--vocab-size", "10", "--invariance"], "--invariance is not available with"),
    ],
)
def test_cli_rejects_flag_combinations(args, message, capsys):
    assert main(["audit", *args]) == 2
    assert f"detspec: error: {message}" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args, message",
    [
        (["--url", "ftp://host"], "argument --url: expected an http:// or https:// URL"),
        (["--url", "localhost:30000"], "argument --url: expected an http:// or https:// URL"),
        (["--url", "http://h/?x=1"], "argument --url: expected the server's base URL without a query"),
        (["--concurrency", "0"], "argument --concurrency: must be >= 1, got 0"),
        (["--timeout", "0"], "argument --timeout: must be a finite number > 0, got 0"),
        (["--timeout", "soon"], "argument --timeout: expected a number of seconds, got 'soon'"),
        (["--vocab-size", "0"], "argument --vocab-size: must be >= 1, got 0"),
        (["--url", "http://[::1"], "argument --url: expected an http:// or https:// URL of the server, got 'http://[::1'"),
        (["--url", "http://h:99999"], "argument --url: expected an http:// or https:// URL of the server, got 'http://h:99999'"),
        (["--url", "http://h:abc"], "argument --url: expected an http:// or https:// URL"),
        (["--url", "http://h:0"], "argument --url: expected a port in [1, 65535]"),
        (["--seed", "1_000"], "argument --seed: expected an integer, got '1_000'"),
        (["--seed", "\u0661\u0662"], "argument --seed: expected an integer"),
        (["--json", ""], "argument --json: expected a file path, got an empty string"),
    ],
)
def test_cli_rejects_bad_server_arguments(args, message, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["audit", *args])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))


def _response(status: int, body) -> "requests.Response":
    import requests as _requests

    r = _requests.Response()
    r.status_code = status
    r._content = json.dumps(body).encode() if not isinstance(body, bytes) else body
    return r


@pytest.mark.parametrize("body, code", [
    ({"error": {"message": "m", "code": "sampling_seed_out_of_range"}}, "sampling_seed_out_of_range"),
    ({"message": "m", "code": "sampling_seed_out_of_range"}, "sampling_seed_out_of_range"),
    ({"object": "error", "message": "m", "type": "BadRequestError", "code": 400}, None),  # SGLang's numeric code
    ({"error": {"message": "m"}}, None),
    (b"not json", None),
])
def test_error_code_reads_a_code_field_and_tolerates_its_absence(body, code):
    from sglang_detspec.auditing.http_backend import error_code

    assert error_code(_response(400, body)) == code


def test_seed_encoding_hint_matches_the_code_not_the_wording():
    from sglang_detspec.auditing.http_backend import SEED_RANGE_CODE, ServerHttpError, _seed_encoding_hint

    coded = ServerHttpError("x", 400, "any wording at all", SEED_RANGE_CODE)
    assert "drop --seed-encoding int64" in _seed_encoding_hint("int64", coded)
    assert _seed_encoding_hint("uint64", coded) is None
    other = ServerHttpError("x", 400, "sampling_seed must be in [0, 2**64 - 1]", "some_other_code")
    assert _seed_encoding_hint("int64", other) is None  # a code is trusted over words


def test_error_code_reads_the_plugins_message_suffix():
    """The plugin's request errors end with "(error code: CODE)": the audit client matches that code, not wording."""
    import requests

    from sglang_detspec.auditing.http_backend import error_code

    def response(body: dict) -> requests.Response:
        r = requests.Response()
        r.status_code = 400
        r._content = json.dumps(body).encode()
        return r

    msg = "sampling_seed must be in [0, 2**64 - 1], got -1 (error code: sampling_seed_out_of_range)"
    assert error_code(response({"error": {"message": msg, "code": 400}})) == "sampling_seed_out_of_range"
    assert error_code(response({"error": {"message": "x", "code": "given_code"}})) == "given_code"
    assert error_code(response({"error": {"message": "stock SGLang wording", "code": 400}})) is None
