"""The request fuzzer's cases (``sglang_detspec.auditing.request_fuzz``): seeded, covering, known crashes first.

The end-to-end suite ``test_request_fuzz.py`` sends these cases to real
servers; here the list itself is checked: the same seed gives the same cases
and another seed others, 1,100 cases (one server's share) touch at least 25
fields and the three endpoints, every known crash input leads the list with
the status it must get, then every per-request batch list of the plugin's
rule one entry short and one long, every body is what its case says (JSON
where not raw, at most a few MB), the grammars' classes are what SGLang's own
grammar backend makes of them over the test models' tokenizer, the checker
passes a 5xx only for a documented limit's own answer, the known inputs meet
the plugin's rules through SGLang's real request path (``served``: SGLang's
TokenizerManager), and 600 cases sent through SGLang's own FastAPI app get
answers below 500 except the documented known limits, and the status a case
must get (the scheduler is a stand-in here: what a case does to a real
scheduler is the E2E suite's to find).
"""

import json
import sys

import pytest
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_detspec.auditing import request_fuzz
from sglang_detspec.sglang_plugin import request_rules
from test_request_seeds import ACTIVE, generate, hooked, model_with_tokenizer, served, server_args  # noqa: F401

register_cpu_ci(est_time=60, suite="detspec-unit-cpu")

MODEL = request_fuzz.Model(vocab=4096, context_len=4096, name="m")


def test_the_same_seed_gives_the_same_cases():
    a, b = (request_fuzz.fuzz_cases(7, 400, MODEL) for _ in range(2))
    assert [c.payload() for c in a] == [c.payload() for c in b]
    other = request_fuzz.fuzz_cases(8, 400, MODEL)
    drawn = len(request_fuzz.KNOWN_CRASHES)
    assert sum(x.payload() != y.payload() for x, y in zip(a[drawn:], other[drawn:])) > 300


def test_one_servers_share_covers_25_fields_and_three_endpoints():
    cases = request_fuzz.fuzz_cases(2026, 1100, MODEL)
    covered = request_fuzz.coverage(cases)
    assert covered["endpoints"] == sorted(request_fuzz.ENDPOINTS)
    assert len(covered["fields"]) >= 25, covered["fields"]
    for endpoint in request_fuzz.ENDPOINTS:  # the drawn cases take turns; the fixed ones are mostly /generate's
        assert sum(c.endpoint == endpoint for c in cases) >= 330
    mutations = {c.mutation.split(":")[0] for c in cases}
    assert {"value", "unknown_field", "nested", "missing", "null", "malformed_json", "one_bad_of_2", "shorter",
            "longer"} <= mutations
    # Grammar cases of all three classes: satisfiable (200), the unsatisfiable limit, malformed.
    grammar = [c for c in cases if c.field.rsplit(".", 1)[-1] in request_fuzz.GRAMMARS]
    assert {c.expect for c in grammar} >= {200, None}
    assert {c.limit for c in grammar} >= {None, "grammar_unsatisfiable"}
    # Every rule of the plugin's table is exercised by some /generate case (the batch rule: by each of its lists).
    fields = {c.field.removeprefix("batch:") for c in cases if c.endpoint == "/generate"}
    assert {rule.field for rule in request_rules.RULES} - {"batch"} <= fields
    assert set(request_rules.PER_REQUEST_LISTS) <= fields


def test_known_crash_inputs_lead_every_list_with_their_status():
    names = request_fuzz.KNOWN_CRASHES
    assert "top_logprobs_num_1e6" in names and len(set(names)) == len(names)
    for seed in (0, 1):
        cases = request_fuzz.fuzz_cases(seed, len(names) + 5, MODEL)
        assert [c.known for c in cases[:len(names)]] == list(names)
        assert all(c.known is None for c in cases[len(names):])
    first = request_fuzz.fuzz_cases(0, len(names), MODEL)[0]
    assert first.endpoint == "/generate" and first.expect == 400
    assert json.loads(first.payload()) == {"input_ids": [5, 6], "return_logprob": True, "top_logprobs_num": 1000000,
                                           "sampling_params": {"max_new_tokens": 4, "temperature": 1.0}}
    with pytest.raises(ValueError, match=f"count must be at least {len(names)}"):
        request_fuzz.fuzz_cases(0, len(names) - 1, MODEL)


def test_every_per_request_batch_list_comes_short_and_long_after_the_known_inputs():
    assert list(request_fuzz.BATCH_LISTS) == list(request_rules.PER_REQUEST_LISTS)
    known = len(request_fuzz.KNOWN_CRASHES)
    cases = request_fuzz.fuzz_cases(5, 400, MODEL)[known:known + 2 * len(request_fuzz.BATCH_LISTS)]
    assert [(c.field, c.mutation.split(":")[0]) for c in cases] == [
        (f"batch:{name}", change) for name in request_fuzz.BATCH_LISTS for change in ("shorter", "longer")]
    for case in cases:
        body, name = case.body, case.field.removeprefix("batch:")
        size = len(body["input_ids"])
        assert case.endpoint == "/generate" and case.expect == 400 and size >= 2
        assert len(body[name]) in (size - 1, size + 1) and len(body["sampling_params"]) >= 1


def test_the_checker_passes_a_5xx_only_for_a_documented_limits_own_answer():
    abort = '{"object":"error","message":"Grammar accept_token failed: Tokens not accepted: 0"}'
    grammar = request_fuzz.Case(0, "/generate", "sampling_params.regex", "value", {}, limit="grammar_unsatisfiable")
    assert request_fuzz.limit_answer(grammar, 500, abort) == "grammar_unsatisfiable"
    assert not request_fuzz.failed(grammar, 500, abort) and not request_fuzz.failed(grammar, 200, "")
    assert request_fuzz.failed(grammar, 500, "Internal Server Error")  # another 5xx is still a failure
    assert request_fuzz.failed(grammar, None, "ConnectionError")
    plain = request_fuzz.Case(1, "/generate", "sampling_params.regex", "value", {}, expect=200)
    assert request_fuzz.failed(plain, 500, abort) and request_fuzz.failed(plain, 400, "")
    assert not request_fuzz.failed(plain, 200, "")
    chat = request_fuzz.Case(2, "/v1/chat/completions", "body", "json_list", "[]", raw=True)
    assert request_fuzz.limit_answer(chat, 500, "AttributeError") == "chat_body_not_an_object"
    assert set(request_fuzz.LIMITS) == {"chat_body_not_an_object", "grammar_unsatisfiable"}


@pytest.fixture(scope="module")
def tiny_grammar_backend(tmp_path_factory):
    """SGLang's xgrammar backend over the test models' word-level tokenizer (scripts/make_tiny_models.py)."""
    import importlib.util
    from pathlib import Path

    from sglang.srt.constrained.xgrammar_backend import XGrammarGrammarBackend
    from transformers import AutoTokenizer

    script = Path(__file__).resolve().parents[3] / "scripts" / "make_tiny_models.py"
    spec = importlib.util.spec_from_file_location("make_tiny_models", script)
    tiny = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tiny)
    folder = tmp_path_factory.mktemp("tiny_tokenizer")
    tiny.write_tokenizer(str(folder))
    eos = tiny.SPECIAL_TOKENS.index("</s>")
    return XGrammarGrammarBackend(AutoTokenizer.from_pretrained(folder), tiny.VOCAB, [eos]), tiny.VOCAB


def first_tokens(backend, vocab: int, field: str, grammar: str) -> list[int] | None:
    """The token ids the grammar admits first, as SGLang's backend masks them; None: SGLang refuses it."""
    import torch
    from sglang.srt.constrained.base_grammar_backend import InvalidGrammarObject

    dispatch = {"regex": backend.dispatch_regex, "ebnf": backend.dispatch_ebnf, "json_schema": backend.dispatch_json,
                "structural_tag": backend.dispatch_structural_tag}[field]
    try:
        compiled = dispatch(grammar)
    except Exception:  # the structural-tag parser raises where the others return an invalid object
        return None
    if compiled is None or isinstance(compiled, InvalidGrammarObject):
        return None
    mask = compiled.allocate_vocab_mask(vocab, 1, "cpu")
    compiled.fill_vocab_mask(mask, 0)
    logits = torch.zeros(1, vocab)
    compiled.apply_vocab_mask(logits, mask)
    return torch.nonzero(torch.isfinite(logits[0])).flatten().tolist()


@pytest.mark.parametrize("field", sorted(request_fuzz.GRAMMARS))
def test_grammar_classes_match_sglangs_backend_on_the_test_vocabulary(tiny_grammar_backend, field):
    """Good grammars admit a first token; unsatisfiable ones compile and admit none (SGLang then aborts
    the request: the documented limit); malformed strings do not compile."""
    backend, vocab = tiny_grammar_backend
    table = request_fuzz.GRAMMARS[field]
    for grammar in table.good:
        assert first_tokens(backend, vocab, field, grammar), (field, grammar)
    for grammar in table.unsatisfiable:
        assert first_tokens(backend, vocab, field, grammar) == [], (field, grammar)
    for grammar in table.bad:
        if isinstance(grammar, str) and len(grammar) < 1000:
            assert first_tokens(backend, vocab, field, grammar) is None, (field, grammar)


def test_bodies_are_json_unless_raw_and_bounded():
    cases = request_fuzz.fuzz_cases(3, 1100, MODEL)
    for case in cases:
        if not case.raw:
            assert json.loads(case.payload()) == case.body
        assert len(case.payload()) <= 3 * 1024 * 1024
        assert case.summary()["body_bytes"] == len(case.payload())
    assert sum(len(c.payload()) for c in cases) < 64 * 1024 * 1024


SERVED = request_fuzz.Model(vocab=1000, context_len=2048, name="m")  # the model of test_request_seeds.served
KNOWN_GENERATE = [c for c in request_fuzz.fuzz_cases(0, len(request_fuzz.KNOWN_CRASHES), SERVED)
                  if c.endpoint == "/generate"]  # the OpenAI ones: test_request_validation.py, SGLang's handlers


@pytest.mark.parametrize("case", KNOWN_GENERATE, ids=lambda c: c.known)
def test_known_generate_inputs_get_their_answer_from_the_rules(served, bag, case):
    """Each known ``/generate`` input through SGLang's TokenizerManager: refused before the scheduler, or
    sent with top_k clamped."""
    from sglang.srt.managers.io_struct import GenerateReqInput

    bag(ACTIVE)
    body = json.loads(case.payload())
    GenerateReqInput(**body)  # a body SGLang's request class takes as it is
    if case.expect == 400:
        with pytest.raises(ValueError, match="error code: "):
            generate(served, **body)
        assert served.sent == []
    else:
        generate(served, **body)
        assert served.sent and served.sent[-1].sampling_params.top_k == request_rules.TOP_K_ALL


@pytest.fixture
def http_app(served, model_with_tokenizer):
    """SGLang's own FastAPI app of the HTTP server, wired as its lifespan wires it, over the ``served``
    TokenizerManager (stand-in scheduler: every admitted request finishes at once) and the chatml template."""
    from sglang.srt.entrypoints import http_server
    from sglang.srt.entrypoints.openai.serving_completions import OpenAIServingCompletion
    from sglang.srt.parser.template_manager import TemplateManager

    templates = TemplateManager()
    templates.load_chat_template(served.manager, "chatml", model_with_tokenizer)
    http_server.set_global_state(http_server._GlobalState(
        tokenizer_manager=served.manager, template_manager=templates, scheduler_info={}))
    http_server.app.state.openai_serving_completion = OpenAIServingCompletion(served.manager, templates)
    http_server.app.state.openai_serving_chat = served.manager.serving_chat_class(served.manager, templates)
    yield http_server.app
    http_server.set_global_state(None)
    del http_server.app.state.openai_serving_completion, http_server.app.state.openai_serving_chat


def test_sglangs_http_app_answers_every_case_below_500(served, bag, http_app):
    """600 cases through SGLang's real HTTP app and request path (not its scheduler, which the E2E suite
    runs): every answer below 500 except the documented known limits; the known inputs get their status."""
    import httpx

    bag(ACTIVE)
    cases = request_fuzz.fuzz_cases(2026, 600, SERVED)

    async def send_all():
        answers = []
        transport = httpx.ASGITransport(app=http_app)
        async with httpx.AsyncClient(transport=transport, base_url="http://fuzz", timeout=60) as client:
            for case in cases:
                try:
                    response = await client.post(case.endpoint, content=case.payload().encode(),
                                                 headers={"Content-Type": "application/json"})
                    answers.append((response.status_code, response.text[:200]))
                except Exception as exc:  # what the server's ASGI runner answers with HTTP 500
                    answers.append((500, f"{type(exc).__name__}: {exc}"[:200]))
        return answers

    answers = served.run(send_all(), timeout=600)
    wrong = [(c.summary(), status, text) for c, (status, text) in zip(cases, answers)
             if request_fuzz.failed(c, status, text)]
    assert not wrong, wrong[:5]
    assert {status for status, _ in answers} >= {200, 400}
    chat_limit = [status for c, (status, _) in zip(cases, answers)
                  if request_fuzz.known_limit(c) == request_fuzz.CHAT_BODY_LIMIT]
    assert chat_limit and all(status >= 500 for status in chat_limit)  # still SGLang's answer
    # Every batch list of the wrong length is refused for its length, by the plugin's rule or SGLang's own.
    lengths = [(c.field, text) for c, (_, text) in zip(cases, answers) if c.mutation.startswith(("shorter", "longer"))]
    assert len(lengths) == 2 * len(request_fuzz.BATCH_LISTS)
    by_rule = {field for field, text in lengths if "batch_length_mismatch" in text}
    assert by_rule == {f"batch:{name}" for name in request_fuzz.BATCH_LISTS}, [x for x in lengths if x[0] not in by_rule]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
