"""Bad requests get a clear error before the scheduler; a missing hook target stops start-up.

Request validation goes through SGLang's own ``TokenizerManager.generate_request``
(the ``served`` of ``test_request_seeds.py``, model vocabulary 1000, context
2048), the path of ``/generate`` and ``Engine.generate``, and through SGLang's
own ``/v1/completions`` and ``/v1/chat/completions`` handlers: every rule of
``request_rules.RULES`` (token ids outside the vocabulary, ``n``, logprob
fields, ``top_k``, ``min_new_tokens``, stop ids, logit bias, grammars, number
types) refuses a bad value with a ``ValueError`` naming the field, value and
bound and carrying the rule's code (SGLang's HTTP server answers it with 400),
and the request never reaches the scheduler; ``top_k`` above 2**30 is clamped. The hook table: every
required target resolves in the installed SGLang and is wrapped after
``load_plugins``; a target that is missing or unpatched is named, with the
SGLang version, by the start-up check and by ``detspec serve --dry-run``.
"""

import json
import re
import sys
from pathlib import Path

import pytest
from sglang.test.ci.ci_register import register_cpu_ci

from sglang_detspec import sglang_plugin
from sglang_detspec.config import DetSpecConfig
from sglang_detspec.sglang_plugin import input_hook, request_rules
from test_request_seeds import ACTIVE, generate, hooked, model_with_tokenizer, served, server_args  # noqa: F401

register_cpu_ci(est_time=60, suite="detspec-unit-cpu")

SAMPLED = {"temperature": 1.0, "max_new_tokens": 4, "sampling_seed": 3}


@pytest.mark.parametrize("input_ids, message", [
    ([5000, 7], "input_ids[0] = 5000 is outside the model's vocabulary: token ids must be in [0, 1000)"),
    ([1, -1], "input_ids[1] = -1 is outside the model's vocabulary: token ids must be in [0, 1000)"),
    ([1, 2, 1000], "input_ids[2] = 1000 is outside"),
    ([1, 2.0], "input_ids[1] must be an integer token id in [0, 1000), got 2.0"),
    ([True, 2], "input_ids[0] must be an integer token id in [0, 1000), got True"),
])
def test_out_of_vocabulary_and_non_integer_ids_are_refused(served, bag, input_ids, message):
    bag(ACTIVE)
    with pytest.raises(ValueError, match=re.escape(message)):
        generate(served, input_ids=input_ids, sampling_params=dict(SAMPLED))
    assert served.sent == []  # nothing reached the scheduler


def test_batched_and_parallel_requests_are_checked_per_request(served, bag):
    bag(ACTIVE)
    with pytest.raises(ValueError, match=re.escape("input_ids[1] = 4096 is outside")):
        generate(served, input_ids=[[1, 2], [3, 4096]], sampling_params=[dict(SAMPLED), dict(SAMPLED)])
    with pytest.raises(ValueError, match=re.escape("input_ids[0] = -5 is outside")):
        generate(served, input_ids=[-5, 2], sampling_params={**SAMPLED, "n": 3})
    outs = generate(served, input_ids=[[1, 2], [3, 999]], sampling_params=[dict(SAMPLED), dict(SAMPLED)])
    assert len(outs) == 2  # ids at the bounds pass


@pytest.mark.parametrize("n", [0, -1, 1.5, "2", True, None, request_rules.MAX_N + 1, 10**6])
def test_n_outside_its_range_or_not_an_integer_is_refused(served, bag, n):
    bag(ACTIVE)
    message = f"n must be an integer in [1, {request_rules.MAX_N}] (samples per prompt), got {n!r}"
    with pytest.raises(ValueError, match=re.escape(message)) as caught:
        generate(served, input_ids=[1, 2], sampling_params={**SAMPLED, "n": n})
    assert caught.value.code == "n_out_of_range" and served.sent == []


def test_only_runs_that_are_ours_are_checked(served, bag):
    for inactive in (DetSpecConfig(source="server_args"),  # no --enable-deterministic-inference
                     DetSpecConfig(deterministic=True, disabled=True, source="server_args")):  # DISABLE=1
        bag(inactive)  # SGLang's own path, untouched
        served.sent.clear()
        generate(served, input_ids=[1000], sampling_params=dict(SAMPLED))
        assert len(served.sent) == 1


def test_multimodal_requests_and_text_vocabularies_are_left_to_sglang(served, bag):
    from types import SimpleNamespace

    from sglang.srt.managers.io_struct import GenerateReqInput

    bag(ACTIVE)
    calls = []
    text_model = SimpleNamespace(vocab_size=16512, hf_text_config=SimpleNamespace(vocab_size=168064))
    assert request_rules.embedding_rows(text_model) == 168064
    with_image = GenerateReqInput(input_ids=[128256, 5], image_data=["img"], sampling_params={})
    input_hook.validate_request(lambda *a: calls.append(a), served.manager, with_image, [128256, 5])
    assert len(calls) == 1  # placeholder ids beyond the vocabulary: SGLang's processors own them


def test_check_input_ids_accepts_tensors_and_empty():
    torch = pytest.importorskip("torch")
    request_rules.check_input_ids(torch.tensor([0, 999]), 1000)
    request_rules.check_input_ids([], 1000)
    with pytest.raises(ValueError, match=re.escape("input_ids[1] = 1000")):
        request_rules.check_input_ids(torch.tensor([0, 1000]), 1000)


def test_an_empty_prompt_is_refused_alone_and_in_a_batch(served, bag):
    # An empty prompt in a batch ended an H200 tree server: the last-position gather's device-side assert.
    bag(ACTIVE)
    with pytest.raises(ValueError, match="input_ids cannot be empty"):  # SGLang refuses a single one itself
        generate(served, input_ids=[], sampling_params=dict(SAMPLED))
    assert served.sent == []
    for ids in ([[5, 6], []], [[], [5, 6], [7]]):  # but not an element of a batch
        with pytest.raises(ValueError, match=re.escape("input_ids must hold at least one token")) as caught:
            generate(served, input_ids=ids, sampling_params=[dict(SAMPLED) for _ in ids])
        assert caught.value.code == "input_ids_empty" and served.sent == []


# -- the rules of request_rules.RULES, through SGLang's request path ----------------------


def test_the_known_killer_is_refused_naming_field_value_and_bound(served, bag):
    # top_logprobs_num past the vocabulary: logprobs.topk(max_k) raised in the scheduler and the server died.
    bag(ACTIVE)
    with pytest.raises(ValueError) as caught:
        generate(served, input_ids=[5, 6], return_logprob=True, top_logprobs_num=1000000,
                 sampling_params={"max_new_tokens": 4, "temperature": 1.0})
    message = str(caught.value)
    assert "top_logprobs_num" in message and "[0, 1000]" in message and "got 1000000" in message
    assert message.endswith("(error code: top_logprobs_num_out_of_range)")
    assert caught.value.code == "top_logprobs_num_out_of_range" and served.sent == []


BIG_GRAMMAR = "a" * (request_rules.MAX_GRAMMAR_BYTES + 1)


@pytest.mark.parametrize("fields, params, code, words", [
    ({"top_logprobs_num": -1, "return_logprob": True}, {}, "top_logprobs_num_out_of_range", "got -1"),
    ({"top_logprobs_num": 1001, "return_logprob": True}, {}, "top_logprobs_num_out_of_range", "[0, 1000]"),
    # Without return_logprob too: the scheduler takes max(top_logprobs_num) over every request of a logprob batch.
    ({"top_logprobs_num": 5000}, {}, "top_logprobs_num_out_of_range", "got 5000"),
    ({"token_ids_logprob": [3, 1000], "return_logprob": True}, {}, "token_ids_logprob_out_of_vocabulary",
     "token_ids_logprob[1] must be a token id in [0, 1000), got 1000"),
    ({"token_ids_logprob": [-1], "return_logprob": True}, {}, "token_ids_logprob_out_of_vocabulary", "got -1"),
    ({"logprob_start_len": -2, "return_logprob": True}, {}, "logprob_start_len_out_of_range", "[-1, 2]"),
    ({"logprob_start_len": 3, "return_logprob": True}, {}, "logprob_start_len_out_of_range", "got 3"),
    ({}, {"min_new_tokens": 2**40, "max_new_tokens": None}, "min_new_tokens_out_of_range", "[0, 2048]"),
    ({}, {"stop_token_ids": [7, 1000]}, "stop_token_ids_out_of_vocabulary", "[0, 1000), got 1000"),
    ({}, {"stop_token_ids": [-3], "min_new_tokens": 2}, "stop_token_ids_out_of_vocabulary", "got -3"),
    ({}, {"logit_bias": {"5": "x"}}, "logit_bias_invalid", "must be a finite number in float32's range"),
    ({}, {"logit_bias": {"5": float("inf")}}, "logit_bias_invalid", "got inf"),
    ({}, {"logit_bias": {"5": 1e308}}, "logit_bias_invalid", "[-3.402823e+38, 3.402823e+38], got 1e+308"),
    ({}, {"logit_bias": {"1000": 1.0}}, "logit_bias_invalid", "keys must be token ids in [0, 1000), got '1000'"),
    ({}, {"temperature": "hot"}, "sampling_param_not_a_number", "sampling_params.temperature must be a number"),
    ({}, {"top_p": [0.5]}, "sampling_param_not_a_number", "sampling_params.top_p"),
    ({}, {"top_k": 2.5}, "top_k_not_integer", "sampling_params.top_k must be an integer"),
    ({}, {"regex": BIG_GRAMMAR}, "grammar_too_large", f"at most {request_rules.MAX_GRAMMAR_BYTES} bytes"),
    ({}, {"json_schema": {"type": "object"}}, "grammar_invalid", "sampling_params.json_schema must be a string"),
])
def test_each_rule_refuses_with_its_code(served, bag, fields, params, code, words):
    bag(ACTIVE)
    with pytest.raises(ValueError, match=re.escape(words)) as caught:
        generate(served, input_ids=[5, 6], sampling_params={**SAMPLED, **params}, **fields)
    assert caught.value.code == code and str(caught.value).endswith(f"(error code: {code})")
    assert served.sent == []


def test_values_at_the_bounds_pass(served, bag):
    bag(ACTIVE)
    outs = generate(served, input_ids=[5, 6], return_logprob=True, top_logprobs_num=1000, logprob_start_len=2,
                    token_ids_logprob=[0, 999],
                    sampling_params={**SAMPLED, "min_new_tokens": 2, "stop_token_ids": [0, 999],
                                     "logit_bias": {"999": -100.0}, "n": 2})
    assert len(outs) == 2 and all(t.top_logprobs_num == 1000 for t in served.sent)


def test_top_k_above_the_whole_vocabulary_is_clamped(served, bag):
    # SGLang packs top_k into an int32 tensor; anything >= 2**30 already means the whole vocabulary.
    bag(ACTIVE)
    generate(served, input_ids=[5, 6], sampling_params={**SAMPLED, "top_k": 2**40})
    assert served.sent[-1].sampling_params.top_k == request_rules.TOP_K_ALL
    generate(served, input_ids=[5, 6], sampling_params={**SAMPLED, "top_k": 7})
    assert served.sent[-1].sampling_params.top_k == 7


def test_a_batch_with_one_bad_request_is_refused_whole(served, bag):
    # One request without logprobs asks for a huge top_logprobs_num, the other asks for logprobs:
    # in one scheduler batch the first one's number would size the second one's topk.
    bag(ACTIVE)
    with pytest.raises(ValueError, match="top_logprobs_num") as caught:
        generate(served, input_ids=[[1, 2], [3, 4]], return_logprob=[False, True], top_logprobs_num=[10**6, 2],
                 sampling_params=[dict(SAMPLED), dict(SAMPLED)])
    assert caught.value.code == "top_logprobs_num_out_of_range" and served.sent == []
    with pytest.raises(ValueError, match="stop_token_ids"):
        generate(served, input_ids=[[1, 2], [3, 4]],
                 sampling_params=[dict(SAMPLED), {**SAMPLED, "stop_token_ids": [5000], "min_new_tokens": 1}])
    assert served.sent == []


@pytest.mark.parametrize("fields, code, words", [
    # SGLang indexes a batch's lists per request: a short one raised IndexError (HTTP 500).
    ({"input_ids": [[1, 2], [3, 4]], "sampling_params": [dict(SAMPLED)]}, "batch_length_mismatch",
     "sampling_params must give one entry per request of the batch (2), got a list of 1"),
    ({"input_ids": [[1, 2], [3, 4]], "sampling_params": dict(SAMPLED), "top_logprobs_num": [1, 2, 3]},
     "batch_length_mismatch", "top_logprobs_num must give one entry per request of the batch (2)"),
    ({"input_ids": [1, 2], "sampling_params": []}, "batch_length_mismatch", "(1), got a list of 0"),
    ({"input_ids": [[1, 2]], "sampling_params": [5]}, "batch_length_mismatch", "sampling_params[0] must be an object"),
    # The rid is a dict key in the tokenizer manager: a list raised TypeError (HTTP 500).
    ({"input_ids": [1, 2], "sampling_params": dict(SAMPLED), "rid": []}, "rid_not_a_string", "rid must be a string"),
    ({"input_ids": [[1, 2], [3]], "sampling_params": dict(SAMPLED), "rid": ["a", 5]}, "rid_not_a_string", "got 5"),
])
def test_request_shapes_sglang_indexes_are_refused(served, bag, fields, code, words):
    bag(ACTIVE)
    with pytest.raises(ValueError, match=re.escape(words)) as caught:
        generate(served, **fields)
    assert caught.value.code == code and served.sent == []


def test_engine_generate_raises_in_the_callers_process(served, bag):
    """``sglang.Engine.generate`` (SGLang's own method, on an Engine whose tokenizer manager is ``served``'s)
    raises the rule's ValueError where it is called, before anything is sent."""
    import asyncio

    from sglang.srt.entrypoints.engine import Engine

    bag(ACTIVE)
    engine = object.__new__(Engine)  # SGLang's constructor would launch a scheduler; generate needs these two
    engine.tokenizer_manager, engine.loop = served.manager, asyncio.new_event_loop()
    served.sent.clear()
    try:
        for kwargs, code in (({"return_logprob": True, "top_logprobs_num": 10**6}, "top_logprobs_num_out_of_range"),
                             ({"sampling_params": {**SAMPLED, "top_k": 3.5}}, "top_k_not_integer"),
                             ({"sampling_params": {**SAMPLED, "logit_bias": {"3": "up"}}}, "logit_bias_invalid")):
            with pytest.raises(ValueError) as caught:
                engine.generate(input_ids=[5, 6], **{"sampling_params": dict(SAMPLED), **kwargs})
            assert caught.value.code == code
    finally:
        engine.loop.close()
    assert served.sent == []


def test_rules_leave_sglang_alone_when_not_ours(served, bag):
    bag(DetSpecConfig(source="server_args"))  # no --enable-deterministic-inference: SGLang's own path
    generate(served, input_ids=[5, 6], sampling_params={**SAMPLED, "top_k": 2**40, "stop_token_ids": [5000]})
    assert served.sent[-1].sampling_params.top_k == 2**40


def openai_error(served, serving_cls, request):
    """SGLang's own OpenAI handler for ``request``: ``(HTTP status, error message)`` of its answer."""
    adapted, processed = serving_cls._convert_to_internal_request(request)
    served.sent.clear()
    response = served.run(serving_cls._handle_non_streaming_request(adapted, processed, None))
    body = json.loads(response.body)
    return response.status_code, body.get("message") or str(body)


def test_openai_logprobs_fields_are_refused_with_400(served, bag, model_with_tokenizer):
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest
    from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat
    from sglang.srt.entrypoints.openai.serving_completions import OpenAIServingCompletion
    from sglang.srt.parser.template_manager import TemplateManager

    bag(ACTIVE)
    completions = OpenAIServingCompletion(served.manager, TemplateManager())
    status, message = openai_error(served, completions, CompletionRequest(
        model="m", prompt=[1, 2, 3], max_tokens=4, logprobs=10**6))
    assert status == 400 and "logprobs" in message and "got 1000000" in message
    assert "top_logprobs_num_out_of_range" in message and served.sent == []
    status, message = openai_error(served, completions, CompletionRequest(
        model="m", prompt=[1, 2, 3], max_tokens=4, stop_token_ids=[4000], min_tokens=2))
    assert status == 400 and "stop_token_ids" in message and served.sent == []

    templates = TemplateManager()
    templates.load_chat_template(served.manager, "chatml", model_with_tokenizer)
    chat = OpenAIServingChat(served.manager, templates)
    status, message = openai_error(served, chat, ChatCompletionRequest(
        model="m", messages=[{"role": "user", "content": "t5 t6"}], max_tokens=4, logprobs=True,
        top_logprobs=10**6))
    assert status == 400 and "top_logprobs" in message and "got 1000000" in message and served.sent == []


def test_docs_list_every_rule():
    doc = (Path(__file__).resolve().parents[3] / "docs" / "request_fields.md").read_text()
    for rule in request_rules.RULES:
        assert f"`{rule.field}`" in doc and all(f"`{code}`" in doc for code in rule.codes), rule.field


# -- the hook table ---------------------------------------------------------------


def test_every_required_target_resolves_and_is_wrapped(hooked):
    rows = sglang_plugin.hook_table()
    required = [r for r in rows if not r.absent_ok and r.kind in sglang_plugin.REGISTRY_KINDS]
    assert required and all(sglang_plugin._resolve(r.target) is not None for r in required)
    assert sglang_plugin.hook_problems() == []


def fake_table(monkeypatch, *extra):
    rows = sglang_plugin.hook_table()
    monkeypatch.setattr(sglang_plugin, "hook_table", lambda: [*rows, *extra])


def test_a_missing_or_unpatched_target_is_named_with_the_sglang_version(hooked, monkeypatch, bag):
    missing = sglang_plugin.Hook("sglang.srt.speculative.spec_utils.fast_sample_renamed", print, "AROUND")
    unpatched = sglang_plugin.Hook("sglang.srt.speculative.spec_utils.select_top_k_tokens", print, "AROUND")
    optional = sglang_plugin.Hook("sglang.srt.speculative.spec_utils.gone", print, "AROUND", "optional")
    fake_table(monkeypatch, missing, unpatched, optional)
    problems = sglang_plugin.hook_problems()
    assert problems == [
        "sglang.srt.speculative.spec_utils.fast_sample_renamed is not found in SGLang 0.5.23",
        "sglang.srt.speculative.spec_utils.select_top_k_tokens (SGLang 0.5.23) was not patched by SGLang's "
        "hook registry",
    ]
    bag(DetSpecConfig(deterministic=True, source="server_args"))
    with pytest.raises(RuntimeError, match="fast_sample_renamed is not found in SGLang 0.5.23"):
        sglang_plugin.check_hooks_in_place(None, None)
    bag(DetSpecConfig(source="server_args"))  # not ours: SGLang's own code runs anyway
    assert sglang_plugin.check_hooks_in_place(None, None) is None


def test_serve_dry_run_reports_a_missing_target(hooked, monkeypatch, model_dir):
    from sglang_detspec.cli import serve

    fake_table(monkeypatch, sglang_plugin.Hook("sglang.srt.layers.sampler.no_such_sampler", print, "AROUND"))
    _, problems = serve.startup_check(["--model-path", model_dir, "--enable-deterministic-inference"], {})
    assert "sglang.srt.layers.sampler.no_such_sampler is not found in SGLang 0.5.23" in problems


def test_docs_list_every_hooked_symbol():
    doc = (Path(__file__).resolve().parents[3] / "docs" / "plugin.md").read_text()
    for row in sglang_plugin.hook_table():
        owner_and_name = ".".join(row.target.rsplit(".", 2)[-2:])  # e.g. TokenizerManager._validate_one_request
        assert owner_and_name in doc, row.target


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))


def test_seed_refusals_carry_stable_codes():
    """Every sampling_seed refusal names the field and ends with a stable code the audit client matches."""
    from sglang_detspec.sglang_plugin.request_hook import SEED_RANGE_CODE, SEED_TYPE_CODE, check_sampling_seed
    from sglang_detspec.sglang_plugin.request_rules import RequestRuleError

    for bad, code in ((-1, SEED_RANGE_CODE), (2**64, SEED_RANGE_CODE), (2.0**64, SEED_RANGE_CODE),
                      ("7", SEED_TYPE_CODE), (True, SEED_TYPE_CODE), (1.5, SEED_TYPE_CODE)):
        with pytest.raises(RequestRuleError) as info:
            check_sampling_seed(bad)
        assert info.value.code == code and info.value.field == "sampling_seed"
        assert str(info.value).startswith("sampling_seed must be") and str(info.value).endswith(f"(error code: {code})")
